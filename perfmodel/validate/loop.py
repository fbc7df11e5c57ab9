"""Measure real training steps, predict them, report the error.

    from perfmodel.validate import validate_measured, validate_runs
    results, bad = validate_measured("examples/measured_sample.csv")   # rows someone measured
    results = validate_runs(work_dir="val", quick=True)                 # calibrate, fit, train, predict
    print(summarize(results))   # median / max absolute percentage error, interval coverage

``validate_runs`` runs ``python -m calibration.train`` in subprocesses (one
process, and DDP under ``torch.distributed.run``) so perfmodel itself needs no
torch; without a profile it first calibrates this host (``calibration.compute``
and ``calibration.collectives``), describes it (:mod:`perfmodel.validate.host`)
and fits a profile. Error is (predicted - measured) / measured of the metric the
row measured; coverage is the fraction of measured steps inside
``Prediction.interval``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.core.errors import InvalidInputError, PerfModelError
from perfmodel.validate.measured import BadRow, Case, read_measured
from perfmodel.fit.build import build_profile
from perfmodel.fit.comm import fit_collectives
from perfmodel.fit.overhead import fit_ddp_overhead
from perfmodel.fit.tables import read_compute_table
from perfmodel.hardware import list_gpus
from perfmodel.predict import predict
from perfmodel.profiles.profile import Profile
from perfmodel.validate import host
from perfmodel.validate.launch import failure_line
from perfmodel.validate.host import HOST_FILES, Host, OtherLoad  # noqa: F401 (loop.Host: the public name)

# gradient all-reduces follow compute that has swept the caches: time them so (8x a core's L2 here)
COLD_BYTES = "32MiB"
# memory-bound ops of a training step (perfmodel.workload.kernels) that the quick grid measures at one shape
STEP_OPS = ("layernorm", "rmsnorm", "gelu", "swiglu", "residual_add", "rope", "cross_entropy",
            "embedding", "copy", "add", "scale", "sum", "adamw", "sgd", "sdpa", "train_step")


@dataclass(frozen=True)
class Run:
    """One training configuration to measure: model fields, batch, processes, sharding."""

    label: str
    model: dict
    micro_batch: int
    procs: int = 1
    global_batch: int | None = None
    zero: int = 0
    fsdp: str | None = None
    recompute: str = "none"


_TINY_GPT = {"layers": 2, "hidden": 128, "heads": 4, "seq": 64, "vocab": 1024}
_TINY_LLAMA = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "seq": 64, "vocab": 1024,
               "activation": "swiglu", "norm": "rmsnorm", "bias": False, "position": "rotary"}
_SMALL_GPT = {"layers": 4, "hidden": 256, "heads": 4, "seq": 128, "vocab": 2048}
QUICK_RUNS = (
    Run("tiny-gpt", _TINY_GPT, 4), Run("tiny-gpt", _TINY_GPT, 4, procs=2),
    Run("tiny-llama", _TINY_LLAMA, 4), Run("tiny-llama", _TINY_LLAMA, 4, procs=2),
    Run("small-gpt", _SMALL_GPT, 2), Run("small-gpt", _SMALL_GPT, 2, procs=2),
)
CPU_RUNS = QUICK_RUNS + (
    Run("tiny-gpt", _TINY_GPT, 4, global_batch=16), Run("small-gpt", _SMALL_GPT, 4, procs=2, global_batch=16),
    Run("small-gpt", _SMALL_GPT, 4, recompute="full"), Run("small-gpt", _SMALL_GPT, 2, procs=2, fsdp="full"),
    Run("gpt-6l-384", {"layers": 6, "hidden": 384, "heads": 6, "seq": 256, "vocab": 4096}, 2),
)
# Tiny DDP steps calibration times on a CPU host (not the validation models): one gradient bucket
# (0.5 MB), two (1.5 MB), two (5.3 MB); fit/overhead.fit_ddp_overhead turns them into a per-bucket cost.
DDP_CALIBRATION_RUNS = (
    Run("ddp-calibration", {"layers": 2, "hidden": 64, "heads": 2, "seq": 32, "vocab": 512}, 2, procs=2),
    Run("ddp-calibration", {"layers": 3, "hidden": 96, "heads": 4, "seq": 40, "vocab": 512}, 2, procs=2),
    Run("ddp-calibration", {"layers": 4, "hidden": 160, "heads": 4, "seq": 48, "vocab": 512}, 2, procs=2),
)
_GPT2_SMALL = {"layers": 12, "hidden": 768, "heads": 12, "seq": 1024, "vocab": 50304}
_GPT_1B3 = {"layers": 24, "hidden": 2048, "heads": 16, "seq": 2048, "vocab": 50304}
_LLAMA_1B = {"layers": 16, "hidden": 2048, "heads": 16, "kv_heads": 4, "seq": 2048, "vocab": 32000,
             "activation": "swiglu", "norm": "rmsnorm", "bias": False, "position": "rotary"}
# The first three are the configurations of the H200 development steps (train_dev.jsonl); the rest
# were never looked at while the cost model was built: other sizes, an unpadded vocabulary
# (misaligned lm-head GEMMs), recomputation, gradient accumulation, a Llama-style block.
GPU_RUNS = (
    Run("gpt2-small", _GPT2_SMALL, 8), Run("gpt2-small", _GPT2_SMALL, 32), Run("gpt-1.3b", _GPT_1B3, 4),
    Run("llama-like-1b", _LLAMA_1B, 4),
    Run("gpt2-small-v50257", {**_GPT2_SMALL, "vocab": 50257}, 8),
    Run("gpt2-small", _GPT2_SMALL, 16, recompute="selective"),
    Run("gpt2-medium", {"layers": 24, "hidden": 1024, "heads": 16, "seq": 1024, "vocab": 50304}, 16),
    Run("gpt-1.3b", _GPT_1B3, 8, recompute="full"),
    Run("gpt-2.7b", {"layers": 32, "hidden": 2560, "heads": 32, "seq": 2048, "vocab": 50304}, 4),
    Run("llama-like-1b", _LLAMA_1B, 4, global_batch=16),
)


# --- subprocesses --------------------------------------------------------------------------------


def _launcher(procs: int) -> list[str]:
    if procs == 1:
        return [sys.executable, "-m"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}", "-m"]


def _call(cmd: list[str], threads: int, what: str, timeout_s: float = 900.0) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    try:
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise PerfModelError(f"{what} did not finish within {timeout_s:.0f} s: {' '.join(cmd)}") from None


def _checked(cmd, threads, what) -> str:
    out = _call(cmd, threads, what)
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-5:]
        raise PerfModelError(f"{what} failed (exit {out.returncode}): {' '.join(cmd)}\n  " + "\n  ".join(tail))
    return out.stdout


def train_command(run: Run, out_csv: Path, *, gpu: str, device: str, steps: int, warmup: int,
                  profile: str | None = None) -> list[str]:
    """The command line that measures ``run`` into ``out_csv`` (its row names ``gpu`` and ``profile``)."""
    args = ["calibration.train", "--model", run.label, "--micro-batch", str(run.micro_batch),
            "--device", device, "--steps", str(steps), "--warmup", str(warmup), "--gpu", gpu,
            "--out", str(out_csv), "--source", "perfmodel validate (calibration.train)"]
    args += ["--profile", profile] if profile else []
    for key, value in run.model.items():
        args += [f"--{key.replace('_', '-')}", str(value).lower() if isinstance(value, bool) else str(value)]
    if run.global_batch:
        args += ["--global-batch", str(run.global_batch)]
    if run.zero:
        args += ["--zero", str(run.zero)]
    if run.fsdp:
        args += ["--fsdp", run.fsdp]
    if run.recompute != "none":
        args += ["--recompute", run.recompute]
    return _launcher(run.procs) + args


def measure_runs(runs, out_csv: str | Path, *, target, device: str = "cpu", threads: int = 1,
                 steps: int = 10, warmup: int = 3, log=print) -> list[str]:
    """Train and time every run (one row each in ``out_csv``); returns the failures, one line each.

    ``target(run)`` gives the (gpu, profile) the run's row names: what it is predicted on.
    """
    failures = []
    for run in runs:
        gpu, profile = target(run)
        cmd = train_command(run, Path(out_csv), gpu=gpu, device=device, steps=steps, warmup=warmup,
                            profile=profile)
        before = Path(out_csv).read_bytes() if Path(out_csv).exists() else None
        out = _call(cmd, threads, f"training {run.label}")
        if out.returncode != 0 and run.procs > 1:  # torchrun's standalone rendezvous can fail once on a busy host
            log(f"{run.label} procs={run.procs}: exit {out.returncode} ({failure_line(out)}); launching it again")
            _restore(Path(out_csv), before)  # a rank that failed after rank 0 wrote its row: one row per run
            out = _call(cmd, threads, f"training {run.label}")
        if out.returncode != 0:
            failures.append(f"{run.label} procs={run.procs}: exit {out.returncode}: {failure_line(out)}")
        else:
            log(out.stdout.strip().splitlines()[-1])
    return failures


def _restore(path: Path, content: bytes | None) -> None:
    """``path`` as it was before a failed attempt (absent if it was)."""
    if content is None:
        path.unlink(missing_ok=True)
    else:
        path.write_bytes(content)


# --- calibrating this host ----------------------------------------------------------------------


def _compute_commands(out: Path, quick: bool, budget_s: float | None) -> list[list[str]]:
    """calibration.compute runs into ``out``: the quick grid, then the CPU grid of a step's ops."""
    base = [sys.executable, "-m", "calibration.compute", "--device", "cpu", "--out", str(out), "--no-progress"]
    budget = ["--budget", str(budget_s)] if budget_s else []
    if quick:  # the quick grid measures each memory-bound op at one shape: too few to fit
        return [base + ["--quick"], base + ["--ops", ",".join(STEP_OPS)] + budget]
    return [base + budget]


def _run_side_by_side(folders: list[Path], quick: bool, budget_s, threads: int, log) -> None:
    """The same calibration in every folder, one process per folder, all at once."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    for stage in range(len(_compute_commands(folders[0], quick, budget_s))):
        procs = [subprocess.Popen(_compute_commands(f, quick, budget_s)[stage], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for f in folders]
        for f, proc in zip(folders, procs):
            out, err = proc.communicate()
            if proc.returncode != 0:
                raise PerfModelError(f"calibration.compute into {f} failed (exit {proc.returncode}): "
                                     + " ".join((err or out).strip().splitlines()[-3:]))
            log(out.strip())


def _fit(folder: Path, table: pd.DataFrame, gpu_toml: Path, out: Path):
    """The lone profile: fitted to ``folder`` (its compute table is ``table``), completed, saved."""
    fitted, _ = build_profile([folder], gpu=str(gpu_toml), name=gpu_toml.stem)
    profile = host.complete_profile(fitted, table, gpu_toml)
    profile.save(out)
    return profile


def _shared_profile(profile, alone: pd.DataFrame, shared: list[pd.DataFrame], collectives: pd.DataFrame,
                    shared_gpu: Path, source: str):
    """The host's profile for processes side by side: the forms fitted alone, every op scaled by the
    measured side-by-side factor, and the gloo link fitted to the collectives measured together."""
    factor = host.side_by_side_factor(alone, shared)
    coll = fit_collectives(collectives, source=f"measured: {source}")
    meta = {**profile.meta, "fitted_from": [*profile.meta.get("fitted_from", []), source]}
    return Profile(shared_gpu.stem, shared_gpu.stem, copy.deepcopy(profile.compute), coll,
                   {**profile.host, **factor}, meta)


def _ddp_overhead(profile, out_csv: Path, node: Path, procs: int, threads: int, log) -> dict:
    """Time the tiny DDP calibration steps (once: a rerun reuses ``out_csv``) and fit the per-bucket cost."""
    if not out_csv.exists():
        runs = [replace(r, procs=procs) for r in DDP_CALIBRATION_RUNS]
        failures = measure_runs(runs, out_csv, target=lambda run: (str(node.resolve()), None), threads=threads,
                                steps=20, warmup=3, log=log)
        if failures:
            raise PerfModelError("DDP calibration steps failed: " + "; ".join(failures))
    cases, _ = read_measured(out_csv)
    return fit_ddp_overhead(profile, cases)


def calibrate_host(work_dir: str | Path, *, threads: int = 1, procs: int = 2, quick: bool = True,
                   budget_s: float | None = None, log=print) -> Host:
    """Measure this CPU host alone, with ``procs`` processes side by side, its gloo all-reduce and
    tiny DDP steps; fit the lone profile and derive the side-by-side one from it."""
    work = Path(work_dir)
    solo = work / "tables"
    for cmd in _compute_commands(solo, quick, budget_s):
        log(_checked(cmd, threads, "calibration.compute").strip())
    shared = [work / f"tables-shared-{i}" for i in range(procs)]
    _run_side_by_side(shared, quick, budget_s, threads, log)
    coll = _launcher(procs) + ["calibration.collectives", "--out", str(shared[0]), "--collectives", "all_reduce",
                               "--scopes", "world", "--sizes", "4KiB:16MiB" if quick else "1KiB:256MiB",
                               "--cold", COLD_BYTES, "--no-progress"]
    log(_checked(coll, threads, "calibration.collectives").strip())
    files = {k: work / v for k, v in HOST_FILES.items()}
    meta = json.loads((solo / "metadata.json").read_text())

    alone, side_by_side = read_compute_table(solo), [read_compute_table(f) for f in shared]
    collectives = pd.read_csv(shared[0] / "collectives.csv")
    host.write_host_gpu(files["gpu"], alone, meta, threads)
    shared_gpu = host.write_host_gpu(work / "cpu-host-shared.toml", side_by_side[0], meta, threads,
                                     note=f"; measured with {procs} processes computing at once")
    host.write_host_node(files["node"], shared_gpu, host.loopback_link(collectives), procs)
    profile = _fit(solo, alone, files["gpu"], files["profile"])
    together = _shared_profile(profile, alone, side_by_side, collectives, shared_gpu, shared[0].name)
    together = replace(together, host={**together.host, **_ddp_overhead(together, shared[0] / "ddp_steps.csv",
                                                                          files["node"], procs, threads, log)})
    together.save(files["shared_profile"])
    notes = (f"host: {meta.get('cpu_model', 'unknown CPU')}, {meta.get('cpu_count', '?')} CPUs",)
    notes += tuple(f"few-point estimate (fewer than 4 points to fit): {k}" for k in profile.meta["few_point_classes"])
    notes += tuple(f"alias: {k} = gemm:fp32 (no bf16 on this host)" for k in profile.meta["aliased_classes"])
    return Host(**files, notes=notes)


# --- predicting and comparing -------------------------------------------------------------------


def _predicted(p, metric: str) -> tuple[float, float, float]:
    """(predicted value, interval low, interval high) of ``metric``."""
    lo, hi = p.interval
    if metric == "step_time_s":
        return p.step_time, lo, hi
    value = p.tokens_per_second if metric == "tokens_per_second" else p.tflops_per_gpu
    return value, value * p.step_time / hi, value * p.step_time / lo  # rates scale as 1 / step


def compare_case(case: Case, profile=None) -> dict:
    """One result row: measured, predicted, error and whether the interval holds the measurement."""
    s = case.strategy
    row = {"line": case.line, "model": case.label, "gpu": case.cluster.gpu.name, "gpus": case.cluster.n_gpus,
           "dp": s.dp, "tp": s.tp, "pp": s.pp, "micro_batch": s.micro_batch, "global_batch": s.batch,
           "zero": s.shard, "recompute": s.recompute, "precision": s.precision, "metric": case.metric,
           "measured": case.measured, "source": case.source}
    p = predict(case.model, case.cluster, s, profile=case.profile or profile)
    value, lo, hi = _predicted(p, case.metric)
    row.update(predicted=value, error_pct=100 * (value - case.measured) / case.measured, interval_lo=lo,
               interval_hi=hi, inside=bool(lo <= case.measured <= hi), predicted_step_s=p.step_time,
               bottleneck=p.bottleneck, profile=p.profile, interval_level=p.interval_level,
               regime=p.interval_regime)
    if case.peak_memory_bytes and case.extra.get("memory_kind", "cuda-max-allocated") == "cuda-max-allocated":
        row.update(measured_memory_bytes=case.peak_memory_bytes, predicted_memory_bytes=p.peak_memory,
                   memory_error_pct=100 * (p.peak_memory - case.peak_memory_bytes) / case.peak_memory_bytes)
    for key in ("step_time_min_s", "step_time_p90_s"):
        if key in case.extra:
            row[key] = float(case.extra[key])
    return row


def compare(cases, profile=None) -> tuple[pd.DataFrame, list[BadRow]]:
    """Predict every case; a case the predictor refuses becomes a BadRow with its reason."""
    rows, bad = [], []
    for case in cases:
        try:
            rows.append(compare_case(case, profile))
        except PerfModelError as exc:
            bad.append(BadRow(case.line, f"cannot predict: {exc}"))
    return pd.DataFrame(rows), bad


def summarize(results: pd.DataFrame) -> dict:
    """Count, median and max absolute percentage error, and interval coverage."""
    if results.empty:
        return {"rows": 0, "median_abs_error_pct": float("nan"), "max_abs_error_pct": float("nan"),
                "coverage": float("nan")}
    err = results["error_pct"].abs()
    return {"rows": int(len(results)), "median_abs_error_pct": float(err.median()),
            "max_abs_error_pct": float(err.max()), "coverage": float(results["inside"].mean()),
            "coverage_by_regime": coverage_by_regime(results)}


def coverage_by_regime(results: pd.DataFrame) -> dict:
    """Per interval regime: rows, the fraction inside their interval, and the median half-width (%)."""
    if "regime" not in results.columns:
        return {}
    regime = results["regime"].astype(str).str.split(":").str[0]  # "uncalibrated: reason" counts as one
    half = 50 * (results["interval_hi"] - results["interval_lo"]) / results["predicted"]
    return {name: {"rows": int(mask.sum()), "coverage": float(results.loc[mask, "inside"].mean()),
                   "median_half_width_pct": float(half[mask].median())}
            for name in sorted(regime.unique()) for mask in [regime == name]}


def _fmt(metric: str, value: float) -> str:
    if metric == "step_time_s":
        return f"{value * 1e3:.2f} ms"
    return f"{value:,.0f} tok/s" if metric == "tokens_per_second" else f"{value:.1f} TFLOP/s"


def results_table(results: pd.DataFrame) -> str:
    """A plain-text table of measured vs predicted, one line per row, and the summary."""
    head = (f"{'line':>4}  {'model':<24} {'gpu':<16} {'dp':>4} {'tp':>2} {'pp':>2} {'mb':>3} {'gb':>5}  "
            f"{'measured':>14} {'predicted':>14} {'error':>8}  {'in interval':<11}  {'memory error':>12}")
    lines = [head, "-" * len(head)]
    for r in results.to_dict("records"):
        mem = r.get("memory_error_pct")
        mem = f"{mem:+.1f}%" if mem is not None and np.isfinite(mem) else ""
        lines.append(f"{r['line']:>4}  {str(r['model'])[:24]:<24} {str(r['gpu'])[:16]:<16} {r['dp']:>4} {r['tp']:>2} "
                     f"{r['pp']:>2} {r['micro_batch']:>3} {r['global_batch']:>5}  {_fmt(r['metric'], r['measured']):>14} "
                     f"{_fmt(r['metric'], r['predicted']):>14} {r['error_pct']:>+7.1f}%  "
                     f"{'yes' if r['inside'] else 'no':<11}  {mem:>12}")
    s = summarize(results)
    if not s["rows"]:
        lines.append("0 rows: nothing to compare (every row was skipped; see the reasons above)")
        return "\n".join(lines)
    level = results["interval_level"].iloc[0] if "interval_level" in results.columns else float("nan")
    lines.append(f"{s['rows']} rows: median |error| {s['median_abs_error_pct']:.1f}%, max |error| "
                 f"{s['max_abs_error_pct']:.1f}%, interval coverage {s['coverage']:.0%} (stated level {level:.0%})")
    for name, r in s["coverage_by_regime"].items():
        lines.append(f"  {name:<24} {r['rows']:>4} rows  coverage {r['coverage']:.0%}  "
                     f"median half-width {r['median_half_width_pct']:.1f}%")
    return "\n".join(lines)


# --- the two entry points -------------------------------------------------------------------------


def validate_measured(path: str | Path, profile=None) -> tuple[pd.DataFrame, list[BadRow]]:
    """Predict every row of a measured CSV; (results, bad rows with line numbers and reasons)."""
    cases, bad = read_measured(path)
    results, refused = compare(cases, profile)
    return results, sorted(bad + refused, key=lambda b: b.line)


def _device() -> str:
    try:
        import torch
    except ModuleNotFoundError:
        raise InvalidInputError("validating with real runs needs torch (pip install torch)") from None
    return "cuda" if torch.cuda.is_available() else "cpu"


def _runs(runs, device: str, quick: bool) -> list[Run]:
    if runs is not None:
        return list(runs)
    if device == "cpu":
        return list(QUICK_RUNS if quick else CPU_RUNS)
    return [r for r in (GPU_RUNS[:2] if quick else GPU_RUNS) if r.procs <= _cuda_count()]


@dataclass(frozen=True)
class Validation:
    """What ``validate_runs`` found: per-row results, rows it could not use, notes, and the machine's load.

    ``other_load``: share of the CPUs other processes used meanwhile (None where
    unknown); timings taken beside other work say little about the predictor.
    ``drift``: on a CPU host, how much longer (+) or shorter (-) its calibration's
    tiny training steps took when re-timed just before and just after the runs, the
    larger move of the two (``host.speed_drift``; None on a GPU): a host whose speed
    moved is not the host that was calibrated.
    """

    results: pd.DataFrame
    bad: list
    notes: tuple
    other_load: float | None
    work_dir: Path
    drift: float | None = None


def _speed_drift(tables: Path, work: Path, threads: int, when: str) -> float:
    """Re-time the calibration's tiny training steps (about 5 s) and compare with ``tables``."""
    again = work / f"tables-again-{when}"
    shutil.rmtree(again, ignore_errors=True)  # a folder already there would be resumed, not re-timed
    _checked(_compute_commands(again, True, None)[0] + ["--ops", "train_step"], threads, "calibration.compute")
    return host.speed_drift(read_compute_table(tables), read_compute_table(again))


def validate_runs(work_dir: str | Path, *, profile=None, gpu=None, quick: bool = True, threads: int = 1,
                  procs: int = 2, steps: int = 10, warmup: int = 3, runs=None, log=print) -> Validation:
    """Calibrate (unless given a profile), train and time the configured runs, predict them.

    On the CPU, without ``profile`` the host is calibrated into ``work_dir``;
    with one, it names a calibrated host folder (or its profile.json). On a GPU
    the runs are predicted with ``profile`` (default: the bundled one of ``gpu``,
    default the catalog GPU torch reports).
    """
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    device = _device()
    with OtherLoad() as calibrating:
        if device == "cpu":
            machine = Host.from_folder(profile) if profile else calibrate_host(work, threads=threads,
                                                                               procs=procs, quick=quick, log=log)
            notes, tables = machine.notes, machine.profile.parent / "tables"

            def target(run):
                if run.procs == 1:
                    return str(machine.gpu.resolve()), str(machine.profile.resolve())
                return str(machine.node.resolve()), str(machine.shared_profile.resolve())
        else:
            name, notes = gpu or _cuda_gpu_name(), ()

            def target(run):
                return name, profile
    # re-timed just before and just after the runs (a calibrated folder copied without its tables cannot be)
    drifts = device == "cpu" and (tables / "compute.csv").is_file()
    before = _speed_drift(tables, work, threads, "before") if drifts else None
    with OtherLoad() as running:
        out_csv = work / "measured.csv"
        failures = measure_runs(_runs(runs, device, quick), out_csv, target=target, device=device,
                                threads=threads, steps=steps, warmup=warmup, log=log)
    after = _speed_drift(tables, work, threads, "after") if drifts else None
    drift = max(before, after, key=abs) if drifts else None
    notes = notes + tuple(f"run failed: {f}" for f in failures)
    # the busier phase counts: a burst while calibrating skews the fits as much as one while training
    # (a phase under 1 s, e.g. loading a calibrated host, is too short for /proc/stat's 10 ms ticks)
    loads = [x.fraction for x in (calibrating, running) if x.fraction is not None and x.wall >= 1.0]
    other_load = max(loads) if loads else None
    if other_load is not None:
        notes += (f"other processes used up to {other_load:.0%} of this machine's CPU time meanwhile "
                  f"(calibration {_share(calibrating.fraction)}, runs {_share(running.fraction)})",)
    if drifts:
        notes += ("the calibration's tiny training steps re-timed ran " + " and ".join(
            f"{abs(d):.0%} {'slower' if d > 0 else 'faster'} {when} the runs"
            for d, when in ((before, "before"), (after, "after"))) + " than when calibrated",)
    results, bad = validate_measured(out_csv) if out_csv.exists() else (pd.DataFrame(), [])
    return Validation(results, bad, notes, other_load, work, drift)


def _share(fraction) -> str:
    return "unknown" if fraction is None else f"{fraction:.0%}"


def _cuda_gpu_name() -> str:
    import torch

    name = torch.cuda.get_device_name(0).lower().replace(" ", "-")
    found = [g for g in list_gpus() if g.split("-")[0] in name]
    if len(found) != 1:
        raise InvalidInputError(f"cannot tell which catalog GPU {name!r} is: pass --gpu NAME")
    return found[0]


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count()

