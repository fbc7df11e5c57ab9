"""Predicted against measured slowdowns of co-located CPU training processes.

Run (from a checkout)::

    python -m perfmodel.validate.interference perfmodel/data/cpu-interference-2026-12-01
    # the set timed chained, its table's class coefficients from the quiet kernel pairs
    python -m perfmodel.validate.interference perfmodel/data/cpu-interference-2026-12-02-chained \
        --kernels perfmodel/data/cpu-interference-2026-12-01-quiet/kernels.csv

The interference table is fitted on the CPU times of the folder's kernel-class runs
(``kernels.csv``) only; it is checked on the training runs (``train.csv``), in CPU time and in wall
time (the latter adds each side's share of the cores, ``perfmodel.fit.interference.host_slots``): each job's step is split into classes by its own
prediction on the host's profile (``host-profile.json``, fitted to the folder's ``host/``
calibration tables), and each row's slowdown is predicted with the background load measured
in its two runs. Error: per job of each mix, the median over repeats of predicted / measured - 1.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.core.entry import run_command
from perfmodel.analysis.interference import CLASSES
from perfmodel.core.errors import InvalidInputError
from perfmodel.analysis.load import job_load
from perfmodel.fit.build import build_profile
from perfmodel.fit.interference import (COLUMN, fit_balance, fit_interference, host_slots, predicted_slowdown,
                                        read_rows, row_foreign, row_sides)
from perfmodel.fit.tables import read_compute_table
from perfmodel.hardware.common import FrozenMap
from perfmodel.hardware import cluster
from perfmodel.parallel.strategy import Strategy
from perfmodel.profiles.profile import load_profile
from perfmodel.validate import host
from perfmodel.workload.model import transformer

BASELINE = {"wall": "k jobs, each k times slower", "cpu": "no interference"}
SLOTS = 2  # cores of the host the bundled set was measured on, one torch thread per process


def build_host(folder) -> None:
    """Describe the host (``cpu-host.toml``) and fit its profile (``host-profile.json``) from the
    calibration tables in ``folder/host`` (``calibration.compute --device cpu``, one thread)."""
    folder = Path(folder)
    table = read_compute_table(folder / "host")
    meta = json.loads((folder / "host" / "metadata.json").read_text())
    gpu = host.write_host_gpu(folder / "cpu-host.toml", table, meta, 1)
    fitted, _ = build_profile([folder / "host"], gpu=str(gpu), name=gpu.stem)
    host.complete_profile(fitted, table, gpu).save(folder / "host-profile.json")


def job_seconds(folder: Path) -> dict[str, list[float]]:
    """Device seconds per class of each training job, from its prediction on the host profile."""
    jobs = json.loads((folder / "jobs.json").read_text())
    profile = load_profile(folder / "host-profile.json")
    host = cluster(str(folder / "cpu-host.toml"))
    out = {}
    for name, spec in jobs.items():
        fields = {k: v for k, v in spec.items() if k not in ("micro_batch", "precision", "threads")}
        s = Strategy(micro_batch=spec["micro_batch"], precision=spec["precision"])
        load = job_load((transformer(**fields), s, name), host, profile, launch_on_device=True)
        out[name] = [float(load.seconds[c]) for c in CLASSES]
    return out


def check(folder, table=None, metric: str = "wall") -> tuple[pd.DataFrame, float]:
    """(rows with 'predicted' and 'error', median |error| over per-job medians) of ``train.csv``;
    ``metric``: "wall" (step time) or "cpu" (CPU time per step: interference without waits)."""
    folder = Path(folder)
    if not (folder / "train.csv").is_file():
        raise InvalidInputError(f"{folder} holds no train.csv (measure it with python -m calibration.interference train)")
    table = table or fit_table(folder, cv=False).table
    seconds = job_seconds(folder)
    rows = read_rows(folder / "train.csv")
    balance = float(table.meta.get("balance", 0.0))  # fitted with the table, on the kernel rows' CPU shares
    pred = [predicted_slowdown(table, [seconds[j] for j in r.mix.split("+")], int(r.slot),
                               row_sides(r, SLOTS, metric, balance), metric=metric, cores=SLOTS,
                               foreign=row_foreign(r))
            for r in rows.itertuples()]
    rows["predicted"] = pred
    per_job = rows.groupby(["mix", "slot", "job"], as_index=False)[["slowdown", "cpu_slowdown", "predicted"]].median()
    per_job["error"] = per_job["predicted"] / per_job[COLUMN[metric]] - 1.0
    # the simplest rule to beat: each job k times slower among k (wall), not slower at all (CPU time)
    per_job["baseline"] = per_job["mix"].str.count(r"\+") + 1.0 if metric == "wall" else 1.0
    # and on a host of SLOTS cores with no one else: k jobs share them, each max(1, k / cores) slower
    per_job["cores_rule"] = np.maximum(1.0, per_job["baseline"] / SLOTS) if metric == "wall" else 1.0
    return per_job, float(np.median(np.abs(per_job["error"])))


def fit_table(folder, kernels=None, cv: bool = True, others: bool = False):
    """The interference fit of ``folder/kernels.csv``; ``kernels``: fit the class coefficients on
    those kernel rows instead (a cleaner set taken on the same host) and keep the load balance of
    the folder's own kernel rows: the balance belongs to the other users' load while the folder was
    measured (docs/contention.md), the coefficients to the host. A folder without kernel rows of
    its own (its kernel run kept no cycle) keeps the balance of ``kernels``."""
    own = Path(folder) / "kernels.csv"
    if kernels is None and not own.is_file():
        raise InvalidInputError(f"{folder} holds no kernels.csv: give the kernel rows of the same host to fit the "
                                "table on (--kernels PATH)")
    fit = fit_interference(kernels or own, slots=SLOTS, metric="cpu", cv=cv, others=others)
    if kernels is None or not own.is_file():  # no kernel rows of its own: the kernel set's balance stands
        return fit
    balance, error = fit_balance(read_rows(own), float(SLOTS))
    meta = {**fit.table.meta, "balance": balance, "balance_share_error": error if np.isfinite(error) else None,
            "balance_rows": own.name}
    return replace(fit, table=replace(fit.table, meta=FrozenMap(meta)))


def per_mix(rows: pd.DataFrame) -> dict:
    """Median |error| of each mix's jobs."""
    return rows.groupby("mix")["error"].apply(lambda e: float(np.median(np.abs(e)))).to_dict()


def cleanliness(rows: pd.DataFrame) -> dict:
    """How far a measured set (kernel or training rows) was disturbed by other users' work: the
    other sessions with runnable work per phase (median, 90th percentile), cycles kept per mix
    (fewest, most), iterations per measured phase (median), how well the core-share model
    (``host_slots``, its balance fitted on these rows) describes their CPU shares (median |log
    error|), and each job's spread over cycles of its wall and CPU-time slowdowns (median over jobs
    of the median |log(x / median)|). The measures a set is chosen by, not its score."""
    sessions = np.r_[rows["sessions_alone"], rows["sessions_together"]].astype(float)
    cycles = rows.groupby("mix")["repeat"].nunique()
    jobs = rows.groupby(["mix", "slot"])

    def spread(column):
        return float(jobs[column].apply(lambda x: np.median(np.abs(np.log(x / np.median(x))))).median())

    return {"sessions_median": float(np.median(sessions)), "sessions_p90": float(np.percentile(sessions, 90)),
            "cycles_min": int(cycles.min()), "cycles_max": int(cycles.max()),
            "iterations_median": float(rows["iterations"].median()),
            "share_model_error": fit_balance(rows, float(SLOTS))[1],
            "wall_spread": spread("slowdown"), "cpu_spread": spread("cpu_slowdown")}


def share_parts(folder, table) -> pd.DataFrame:
    """Per job of ``train.csv``, its wall slowdown split as measured = CPU-time part x core-share part
    (share = CPU seconds / wall seconds per step, alone over together), each with the share
    ``host_slots`` gives it from the sessions counted on that side: where the wall error comes from."""
    rows = read_rows(Path(folder) / "train.csv")
    balance = float(table.meta.get("balance", 0.0))
    jobs = rows["mix"].str.count(r"\+").to_numpy() + 1
    rows["share_alone"] = rows["cpu_alone_s"] / rows["wall_alone_s"]
    rows["share_together"] = rows["cpu_together_s"] / rows["wall_together_s"]
    rows["model_alone"] = [host_slots(SLOTS, s, 1, balance) for s in rows["sessions_alone"]]
    rows["model_together"] = [host_slots(SLOTS, s, k, balance) / k for s, k in zip(rows["sessions_together"], jobs)]
    cols = ["share_alone", "model_alone", "share_together", "model_together", "slowdown", "cpu_slowdown"]
    out = rows.groupby(["mix", "slot", "job"], as_index=False)[cols].median()
    out["share_part"] = out["slowdown"] / out["cpu_slowdown"]
    out["model_share_part"] = out["model_alone"] / out["model_together"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m perfmodel.validate.interference", description=__doc__.split("\n")[0])
    p.add_argument("folder", help="a measured folder (kernels.csv, train.csv, jobs.json, host profile)")
    p.add_argument("--save-table", default=None, help="write the fitted interference table (JSON) here")
    p.add_argument("--build-host", action="store_true", help="first refit the host profile from folder/host")
    p.add_argument("--kernels", default=None,
                   help="fit the class coefficients on this kernels.csv (the load balance stays the folder's own)")
    p.add_argument("--others", action="store_true",
                   help="also fit a|other: other users' work slowing each class beside it")
    args = p.parse_args(argv)
    if args.build_host:
        build_host(args.folder)

    fit = fit_table(args.folder, args.kernels, others=args.others)
    print(fit)
    print("coefficients:", {k: round(v, 3) for k, v in fit.table.coefficients.items()},
          f"switch {fit.table.switch_fraction:.3f}, balance {fit.table.meta['balance']:.3f} "
          f"(median |log error| of the kernel rows' CPU shares {fit.table.meta['balance_share_error'] or float('nan'):.1%})")
    if args.save_table:
        fit.table.save(args.save_table)
    for metric in ("wall", "cpu"):
        rows, err = check(args.folder, fit.table, metric)
        print(rows.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        base, cores = (float(np.median(np.abs(rows[c] / rows[COLUMN[metric]] - 1.0))) for c in ("baseline", "cores_rule"))
        print(f"{metric}: median |error| of predicted slowdowns over {len(rows)} jobs in "
              f"{rows['mix'].nunique()} mixes: {err:.1%} (baseline {BASELINE[metric]}: {base:.1%}"
              + (f"; each max(1, k / {SLOTS}) slower: {cores:.1%})" if metric == "wall" else ")"))
        print(f"{metric} per mix:", ", ".join(f"{k} {v:.1%}" for k, v in per_mix(rows).items()))
    for name in ("kernels.csv", "train.csv"):  # what the choice of a set rests on (docs/contention.md)
        if (Path(args.folder) / name).is_file():
            clean = cleanliness(read_rows(Path(args.folder) / name))
            print(f"cleanliness of {name}:", ", ".join(f"{k} {v:.3g}" for k, v in clean.items()))
    parts = share_parts(args.folder, fit.table)
    print("wall slowdown = CPU-time part x core-share part (measured CPU share per side against host_slots):")
    print(parts.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
