"""Fit a GPU's interference tables to its co-located kernel-class runs, one per sharing mode.

Run (rows from ``calibration.interference kernels --device cuda`` and ``--streams``)::

    python -m perfmodel.fit.gpu_interference OUT/interference --gpu H200 [--write]

Rows of the process harness (``harness`` "processes": the driver time-slices separate
processes) fit the ``"time-slice"`` table; rows of two or three CUDA streams in one process
(``"streams"``: kernels run concurrently, as under MPS) fit the ``"mps"`` table. Each row is
predicted by the sharing model itself (``perfmodel.analysis.contention.solve_sharing``) as
``predict_shared`` prices a GPU job: a compute or memory iteration is one second of device time
of its class, a launch storm is host time (free: on a GPU ``predict_shared`` counts launch as
time the device waits), so a storm neither queues nor slows the others in the model and its own
rows measure how far that holds. Parameters: time-slice, the switch loss (one slot, so the class
coefficients never act: k ready jobs take k (1 + switch) each); mps, the four compute/memory
coefficients I(a, b) (all jobs run at once: a class-a job beside class-b jobs takes
1 + sum_b I(a, b)). Bounded least squares on log slowdowns (scipy ``least_squares``, soft-L1).
CV error: leave one repeat out, refit, predict it; median |relative error|. ``--write`` bundles
each table where ``predict_shared`` finds it (``perfmodel.analysis.interference.gpu_table_path``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.core.entry import run_command
from perfmodel.analysis.contention import solve_sharing
from perfmodel.analysis.interference import CLASSES, GPU_MODES, InterferenceTable, gpu_table_path
from perfmodel.core.errors import InvalidInputError, PerfModelError
from perfmodel.core.lazy import scipy_optimize
from perfmodel.fit.interference import (MAX_COEFFICIENT, MAX_SWITCH, InterferenceFit, held_error, read_rows,
                                        repeat_out)
from perfmodel.hardware import as_cluster
from perfmodel.hardware.common import FrozenMap

HARNESS_MODE = {"processes": "time-slice", "streams": "mps"}
MPS_KEYS = ("compute|compute", "compute|memory", "memory|compute", "memory|memory")


def job_parts(kind: str) -> tuple[list[float], float]:
    """(device seconds by class, free seconds) of one iteration of class ``kind`` as a GPU job."""
    if kind not in CLASSES:
        raise InvalidInputError(f"kernel class {kind!r} unknown (valid: {', '.join(CLASSES)})")
    if kind == "launch":
        return [0.0] * len(CLASSES), 1.0
    return [1.0 if c == kind else 0.0 for c in CLASSES], 0.0


def _table(x, mode: str, name: str = "fit") -> InterferenceTable:
    if mode == "time-slice":
        return InterferenceTable(name, FrozenMap({}), float(x[0]))
    return InterferenceTable(name, FrozenMap(dict(zip(MPS_KEYS, map(float, x)))), 0.0)


def gpu_slowdown(table: InterferenceTable, mix, slot: int, mode: str) -> float:
    """Predicted slowdown of job ``slot`` of ``mix`` (kernel classes) sharing a GPU under ``mode``."""
    parts = [job_parts(k) for k in mix]
    seconds, free = [p[0] for p in parts], [p[1] for p in parts]
    slots = 1.0 if mode == "time-slice" else float(len(mix))
    switch = table.switch_fraction if mode == "time-slice" else 0.0
    together = solve_sharing(seconds, free, table, slots, switch)
    alone = solve_sharing([seconds[slot]], [free[slot]], table, slots, switch)
    return float(together[slot] / alone[0])


def _predict(table, rows: pd.DataFrame, mode: str) -> np.ndarray:
    # the repeats of a (mix, slot) share one prediction: solved once each
    keys = list(zip(rows["mix"].astype(str), rows["slot"].astype(int)))
    once = {k: gpu_slowdown(table, k[0].split("+"), k[1], mode) for k in dict.fromkeys(keys)}
    return np.array([once[k] for k in keys])


def _fit_params(rows: pd.DataFrame, mode: str) -> np.ndarray:
    measured = np.log(rows["slowdown"].to_numpy(float))
    n = 1 if mode == "time-slice" else len(MPS_KEYS)
    upper = np.full(n, MAX_SWITCH if mode == "time-slice" else MAX_COEFFICIENT)

    def residual(x):
        return np.log(_predict(_table(x, mode), rows, mode)) - measured

    return scipy_optimize.least_squares(residual, np.full(n, 0.05), bounds=(np.zeros(n), upper), loss="soft_l1",
                                        f_scale=0.05, ftol=1e-6, xtol=1e-6, gtol=1e-6).x


def fit_gpu_interference(rows, gpu: str, mode: str, *, cv: bool = True, source: str = "") -> InterferenceFit:
    """Fit ``mode``'s table ("time-slice" or "mps") of GPU ``gpu`` (a catalogue name) to kernel-class
    rows (a DataFrame or CSV path); ``cv=False``: no leave-one-repeat-out refits (CV error NaN)."""
    if mode not in GPU_MODES:
        raise InvalidInputError(f"mode {mode!r} unknown (valid: {', '.join(GPU_MODES)})")
    name = as_cluster(gpu).gpu.name
    rows = read_rows(rows) if not isinstance(rows, pd.DataFrame) else rows.copy()
    rows = rows[rows["mix"].astype(str).str.contains(r"\+")].reset_index(drop=True)
    informative = rows["mix"].astype(str).str.split("+").map(lambda m: any(k != "launch" for k in m))
    need = 2 if mode == "time-slice" else len(MPS_KEYS) + 1
    if int(informative.sum()) < need:
        raise InvalidInputError(f"{int(informative.sum())} rows of mixes with a compute or memory job cannot fit "
                                f"the {mode} table (needs {need})")
    x = _fit_params(rows, mode)
    held, repeats = repeat_out(rows, lambda part: _fit_params(part, mode),
                               lambda xr, part: _predict(_table(xr, mode), part, mode), cv)
    measured = rows["slowdown"].to_numpy(float)
    rows["predicted"] = _predict(_table(x, mode), rows, mode)
    rows["error"] = rows["predicted"] / measured - 1.0
    cv_error = held_error(held, measured)
    device_only = ~rows["mix"].astype(str).str.contains("launch").to_numpy()  # mixes the model prices as device time
    cv_device = held_error(held, measured, device_only) if device_only.any() else float("nan")
    cv_device = None if np.isnan(cv_device) else cv_device
    devices = sorted(set(map(str, rows["device"]))) if "device" in rows.columns else []
    fitted = _table(x, mode)
    table = InterferenceTable(f"{name}/{mode} (measured)", fitted.coefficients, fitted.switch_fraction,
                              cv_error if np.isfinite(cv_error) else None, len(rows),
                              source or "fitted to co-located kernel-class runs on the GPU",
                              FrozenMap({"gpu": name, "mode": mode, "devices": ", ".join(devices), "repeats": len(repeats),
                                         "launch": "host time (free), not fitted",
                                         "cv_error_without_launch": cv_device,
                                         "method": "least squares on log slowdowns, leave-one-repeat-out CV"}))
    return InterferenceFit(table, rows, cv_error)


def fit_folder(paths, gpu: str, *, cv: bool = True) -> dict:
    """{mode: fit} of every CSV under ``paths`` (files or folders), rows split by their ``harness``
    column (absent: "processes"); a mode whose rows cannot fit its table maps to the reason (a
    str), so a run cut short still bundles the other mode."""
    files = [f for p in map(Path, paths) for f in (sorted(p.glob("*.csv")) if p.is_dir() else [p])]
    if not files:
        raise InvalidInputError(f"no CSV files in {', '.join(map(str, paths))}")
    frames = []
    for f in files:
        rows = read_rows(f)
        rows["harness"] = rows["harness"] if "harness" in rows.columns else "processes"
        frames.append(rows)
    rows = pd.concat(frames, ignore_index=True)
    unknown = sorted(set(rows["harness"].astype(str)) - set(HARNESS_MODE))
    if unknown:
        raise InvalidInputError(f"'harness' values {unknown} unknown (valid: {', '.join(HARNESS_MODE)})")
    as_cluster(gpu)  # an unknown GPU is refused for every mode at once
    fits: dict = {}
    for h, part in rows.groupby("harness"):
        try:
            fits[HARNESS_MODE[h]] = fit_gpu_interference(part, gpu, HARNESS_MODE[h], cv=cv,
                                                         source=f"fitted to {', '.join(f.name for f in files)}")
        except InvalidInputError as e:
            fits[HARNESS_MODE[h]] = str(e)
    return fits


def report(fit: InterferenceFit) -> str:
    """Per mix and job: median measured and predicted slowdown, and the median |error|."""
    without = fit.table.meta.get("cv_error_without_launch")
    lines = [repr(fit) + ("" if without is None else f"; without launch storms {without:.1%}")]
    for (mix, job), g in fit.rows.groupby(["mix", "job"], sort=False):
        lines.append(f"  {mix:<26} {job:<8} measured x{g['slowdown'].median():.3f}  predicted "
                     f"x{g['predicted'].median():.3f}  |error| {g['error'].abs().median():.1%}  ({len(g)} rows)")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m perfmodel.fit.gpu_interference", description=__doc__.split("\n")[0])
    p.add_argument("paths", nargs="+", help="CSV files or folders of calibration.interference kernels rows")
    p.add_argument("--gpu", required=True, help="the GPU the rows were measured on (a catalogue name, e.g. H200)")
    p.add_argument("--write", action="store_true", help="bundle each table where predict_shared reads it")
    p.add_argument("--out", default=None, help="folder to write the tables to instead of the bundled data")
    args = p.parse_args(argv)
    try:
        fits = fit_folder(args.paths, args.gpu)
    except (PerfModelError, OSError) as e:
        p.exit(2, f"{p.prog}: {e}\n")
    for mode, fit in fits.items():
        if isinstance(fit, str):
            print(f"{mode}: not fitted: {fit}")
            continue
        print(report(fit))
        if args.write or args.out:
            path = gpu_table_path(fit.table.meta["gpu"], mode, args.out)
            path.parent.mkdir(parents=True, exist_ok=True)
            fit.table.save(path)
            print(f"  -> {path}")
    return 0 if any(not isinstance(f, str) for f in fits.values()) else 1


if __name__ == "__main__":
    raise SystemExit(run_command(main))
