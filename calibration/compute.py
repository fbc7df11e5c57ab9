"""Measure one device's kernels into ``compute.csv`` (GPU when present, CPU otherwise).

Run::

    python -m calibration.compute --out calib/h200                  # full grid, a few minutes on one GPU
    python -m calibration.compute --out /tmp/calib --quick          # small grid, < 1 min on 2 CPU cores
    python -m calibration.compute --out calib/h200 --budget 120     # stop cleanly after 120 s
    python -m calibration.compute --out calib/cpu --device cpu --dtypes fp32,bf16

Rerunning the same command into the same folder continues where it stopped:
finished rows are never measured twice, and Ctrl-C or a crash loses only the
row being measured. See docs/calibration.md for the schema and the method.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
try:
    from tqdm import tqdm
except ModuleNotFoundError:  # installed with torch by perfmodel's calibration extra
    raise SystemExit("calibration needs tqdm, which is not installed: pip install 'perfmodel[torch]'") from None

from calibration import grids
from calibration.env import available_memory_bytes, device_name, machine_metadata
from calibration.cnn_ops import CNN_BUILDERS
from calibration.ops import BUILDERS as OP_BUILDERS, copies_for
from calibration.tables import COMPUTE_COLUMNS, COMPUTE_KEY_COLUMNS, TableWriter, update_metadata
from calibration.timing import Plan, measure
from perfmodel.errors import PerfModelError, unknown_name

BUILDERS = {**OP_BUILDERS, **CNN_BUILDERS}  # every op a case can name


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0: got {text!r}")
    return value

KNOWN_DTYPES = ("bf16", "fp16", "fp32", "tf32", "fp8")
KNOWN_TIMINGS = ("eager", "graph")
FULL_PLAN = Plan(max_reps=10, min_reps=3, case_budget_s=0.15, cooldown=1.0)
QUICK_PLAN = Plan(max_reps=3, min_reps=3, case_budget_s=0.02, warmup=1)


class UsageError(PerfModelError):
    """A request this machine cannot serve; main() prints it and exits 2."""


@dataclass
class Summary:
    planned: int = 0
    already_done: int = 0
    written: int = 0
    failed: list[str] = field(default_factory=list)
    stopped_by_budget: bool = False
    stopped_by_capture: str = ""  # the graph case whose failed capture ended the run


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m calibration.compute", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output folder (compute.csv, metadata.json)")
    p.add_argument("--quick", action="store_true", help="small grid for tests (< 1 min on 2 CPU cores)")
    p.add_argument("--budget", type=_positive_seconds, default=None, metavar="SECONDS",
                   help="stop cleanly once this many seconds have passed (rows so far are kept)")
    p.add_argument("--dtypes", default=None,
                   help="GEMM precisions, comma-separated from bf16,fp16,fp32,tf32,fp8 "
                        "(default: bf16,fp16,tf32,fp32[,fp8] on a GPU, fp32 on the CPU)")
    p.add_argument("--timing", default=None, help="eager,graph (default: both on a GPU, eager on the CPU)")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when visible)")
    p.add_argument("--ops", default=None, help=f"only these ops, comma-separated ({', '.join(BUILDERS)})")
    p.add_argument("--force-mix", action="store_true",
                   help="write into a folder measured on another machine")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p.parse_args(argv)


def _split(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def resolve_device(arg: str | None) -> str:
    """'cuda:N' when a GPU is asked for (or visible and nothing asked), else 'cpu'."""
    if arg in (None, ""):
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if arg == "cpu":
        return "cpu"
    if arg.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError(f"--device {arg}: no CUDA GPU is visible to torch {torch.__version__}; "
                             "use --device cpu")
        return arg if ":" in arg else "cuda:0"
    raise unknown_name("device", arg, ["cpu", "cuda", "cuda:N"])


def _fp8_ok(device: str) -> bool:
    return device.startswith("cuda") and torch.cuda.get_device_capability(device) >= (8, 9)


def resolve_dtypes(arg: str | None, device: str) -> tuple[str, ...]:
    gpu = device.startswith("cuda")
    if arg is None:
        default = ["bf16", "fp16", "tf32", "fp32"] + (["fp8"] if _fp8_ok(device) else [])
        return tuple(default) if gpu else ("fp32",)
    dtypes = _split(arg)
    for d in dtypes:
        if d not in KNOWN_DTYPES:
            raise unknown_name("dtype", d, KNOWN_DTYPES)
    if not gpu and "fp8" in dtypes:
        raise UsageError("fp8 matmuls need a CUDA GPU of compute capability 8.9 or newer; "
                         "on the CPU use --dtypes bf16 (or fp32)")
    if not gpu and "tf32" in dtypes:
        raise UsageError("tf32 is a CUDA math mode; on the CPU use --dtypes fp32")
    if gpu and "fp8" in dtypes and not _fp8_ok(device):
        cc = ".".join(map(str, torch.cuda.get_device_capability(device)))
        raise UsageError(f"fp8 matmuls need compute capability 8.9 or newer (this GPU: {cc}); "
                         "use --dtypes bf16")
    if not dtypes:
        raise UsageError("--dtypes is empty; name at least one of " + ", ".join(KNOWN_DTYPES))
    return tuple(dict.fromkeys(dtypes))


def resolve_timings(arg: str | None, device: str) -> tuple[str, ...]:
    gpu = device.startswith("cuda")
    if arg is None:
        return ("eager", "graph") if gpu else ("eager",)
    timings = _split(arg)
    for t in timings:
        if t not in KNOWN_TIMINGS:
            raise unknown_name("timing", t, KNOWN_TIMINGS)
    if "graph" in timings and not gpu:
        raise UsageError("CUDA graphs (--timing graph) need a GPU; on the CPU use --timing eager")
    return tuple(dict.fromkeys(timings)) or ("eager",)


def resolve_ops(arg: str | None) -> frozenset[str] | None:
    if arg is None:
        return None
    ops = _split(arg)
    if not ops:
        raise UsageError(f"'--ops' names no op: got {arg!r} (valid: {', '.join(BUILDERS)})")
    for op in ops:
        if op not in BUILDERS:
            raise unknown_name("op", op, BUILDERS)
    return frozenset(ops)


def memory_limit(device: str) -> float:
    """Bytes the grid may use: free GPU memory, or half the host's available memory."""
    if device.startswith("cuda"):
        return 0.9 * torch.cuda.mem_get_info(torch.device(device))[0]
    available = available_memory_bytes()
    return 0.5 * available if available else float("inf")


def _label(case: dict) -> str:
    shape = ",".join(f"{k}={case[k]}" for k in COMPUTE_KEY_COLUMNS[4:] if case.get(k) not in (None, ""))
    return f"{case['op']} {case['phase']} {case['timing']} {case['dtype']} {shape}"


def measure_case(case: dict, device: str, plan: Plan, l2_bytes: int | None, clock=None) -> dict:
    """Build, time and release one case; the row to write (``start_s`` = ``clock()`` at its first call)."""
    bench = BUILDERS[case["op"]](case, device, copies_for(case, device, l2_bytes))
    start_s = clock() if clock else None
    with bench.context():
        t = measure(bench.calls, device, case["timing"], plan)
    del bench
    return {**case, "time_s": t.median_s, "time_min_s": t.min_s, "time_p90_s": t.p90_s,
            "reps": t.reps, "inner": t.inner, "start_s": None if start_s is None else round(start_s, 4),
            "busy_s": t.busy_s(plan.warmup)}


def _release(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def run(req: grids.Request, out_dir: str | Path, plan: Plan, *, budget_s: float | None = None,
        force_mix: bool = False, progress: bool = True, flags: dict | None = None) -> Summary:
    """Measure every case of ``req`` not yet in ``out_dir/compute.csv``; append each row durably."""
    out = Path(out_dir)
    update_metadata(out, machine_metadata(req.device, flags=flags), force_mix=force_mix)
    writer = TableWriter(out / "compute.csv", COMPUTE_COLUMNS, COMPUTE_KEY_COLUMNS)
    planned = grids.cases(req)
    skip = _capture_failures(out)
    todo = [c for c in planned if writer.key(c) not in writer.done and _key_text(writer.key(c)) not in skip]
    summary = Summary(planned=len(planned), already_done=len(planned) - len(todo))
    name = device_name(req.device)
    l2 = getattr(torch.cuda.get_device_properties(req.device), "L2_cache_size", None) if req.gpu else None
    torch.manual_seed(0)
    start = time.monotonic()
    busy = 0.0  # seconds the previous case kept the GPU busy: the next one idles in proportion first
    bar = tqdm(todo, desc="compute", unit="case", disable=not progress, dynamic_ncols=True)
    for case in bar:
        if budget_s is not None and time.monotonic() - start > budget_s:
            summary.stopped_by_budget = True
            break
        bar.set_postfix_str(_label(case)[:60], refresh=False)
        if req.gpu and busy > 0:
            time.sleep(plan.idle_before(busy))
        try:
            row = measure_case(case, req.device, plan, l2, clock=lambda: time.monotonic() - start)
            busy = row.pop("busy_s", 0.0)
        except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:  # OOM is a RuntimeError
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            summary.failed.append(f"{_label(case)}: {first[:160]}")
            if case["timing"] == "graph":  # a failed capture can leave the CUDA context unusable
                with open(out / CAPTURE_FAILURES, "a") as f:  # (its RNG refuses later calls):
                    f.write(_key_text(writer.key(case)) + "\n")  # stop; a rerun skips this case
                summary.stopped_by_capture = _label(case)
                break
            _release(req.device)
            continue
        writer.append({**row, "device": name})
        summary.written += 1
        if case["op"] in ("adamw", "sgd", "h2d", "d2h") or "cross_entropy" in case["op"]:
            _release(req.device)
    bar.close()
    return summary


CAPTURE_FAILURES = "graph_capture_failures.txt"


def _key_text(key: tuple) -> str:
    return ",".join(map(str, key))


def _capture_failures(out: Path) -> set[str]:
    """Keys of graph cases whose capture failed in an earlier run (skipped from then on)."""
    path = out / CAPTURE_FAILURES
    return set(path.read_text().split()) if path.exists() else set()


def _report(summary: Summary, out: Path, budget_s: float | None) -> None:
    print(f"compute.csv: {summary.written} rows written, {summary.already_done} already there, "
          f"{len(summary.failed)} failed, of {summary.planned} planned -> {out / 'compute.csv'}")
    for line in summary.failed[:20]:
        print(f"  failed: {line}", file=sys.stderr)
    if summary.stopped_by_capture:
        print(f"stopped: capturing '{summary.stopped_by_capture}' in a CUDA graph failed, which can leave "
              f"this process unable to run more cases; rerun the same command to continue (that case is "
              f"skipped from now on, listed in {out / CAPTURE_FAILURES})")
    if summary.stopped_by_budget:
        print(f"stopped after the {budget_s:g} s budget; rerun the same command to continue "
              "(finished rows are skipped)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        device = resolve_device(args.device)
        req = grids.Request(device=device, dtypes=resolve_dtypes(args.dtypes, device),
                            timings=resolve_timings(args.timing, device), quick=args.quick,
                            ops=resolve_ops(args.ops), mem_limit_bytes=memory_limit(device))
        flags = {"quick": args.quick, "budget_s": args.budget, "dtypes": list(req.dtypes),
                 "timings": list(req.timings)}
        summary = run(req, args.out, QUICK_PLAN if args.quick else FULL_PLAN, budget_s=args.budget,
                      force_mix=args.force_mix, progress=not args.no_progress, flags=flags)
    except PerfModelError as exc:
        print(f"calibration.compute: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: finished rows are kept; rerun the same command to continue",
              file=sys.stderr)
        return 130
    _report(summary, Path(args.out), args.budget)
    return 0


if __name__ == "__main__":
    sys.exit(main())
