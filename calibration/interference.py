"""Co-located processes: kernel classes and real training steps, alone and together, each side's slowdown.

Run::

    # kernel classes (compute: GEMM, memory: large copy, launch: tiny-op storm), alone, in pairs, in threes
    python -m calibration.interference kernels --out interference/kernels.csv --seconds 3 --repeats 3
    # training processes (calibration.train's module and step) alone and in mixes of two and three
    python -m calibration.interference train --out interference/train.csv --seconds 6 --repeats 3

Every process runs with one torch thread (``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=1``):
oversubscribed OpenMP thread pools spin and make co-located timings meaningless. The processes
of one run build and warm up first, then all measure in the same wall-clock window
(``--seconds`` long, starting at a common instant), so they overlap for the whole measurement; a
process reports its iterations per second (kernels) or its median step (training) inside the window.
A run alone is measured next to each run together (same repeat), so slow drifts of the host's
other load cancel in the slowdown; medians over repeats are what the fit and the check use.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

KERNEL_KINDS = ("compute", "memory", "launch")
KERNEL_MIXES = (("compute",), ("memory",), ("launch",), ("compute", "compute"), ("compute", "memory"),
                ("compute", "launch"), ("memory", "memory"), ("memory", "launch"), ("launch", "launch"),
                ("compute", "compute", "compute"), ("memory", "memory", "memory"), ("launch", "launch", "launch"))
# three training jobs whose steps lean on different classes (GEMMs; memory-bound loss over a wide
# vocabulary; dispatch of many tiny ops)
TRAIN_JOBS = {
    "gemm": {"layers": 2, "hidden": 192, "heads": 4, "seq": 64, "vocab": 256, "micro_batch": 8},
    "wide-vocab": {"layers": 1, "hidden": 32, "heads": 2, "seq": 64, "vocab": 8192, "micro_batch": 4},
    "tiny": {"layers": 4, "hidden": 32, "heads": 2, "seq": 16, "vocab": 128, "micro_batch": 1},
}
TRAIN_MIXES = (("gemm", "gemm"), ("gemm", "wide-vocab"), ("gemm", "tiny"), ("wide-vocab", "tiny"),
               ("wide-vocab", "wide-vocab"), ("tiny", "tiny"), ("gemm", "gemm", "gemm"),
               ("gemm", "wide-vocab", "tiny"))
COLUMNS = ("mix", "job", "slot", "repeat", "wall_alone_s", "wall_together_s", "cpu_alone_s", "cpu_together_s",
           "slowdown", "cpu_slowdown", "other_alone", "other_together", "iterations")


# --- inside one process -------------------------------------------------------------------------


def _kernel(kind: str):
    import torch

    if kind == "compute":  # 384^3 fp32 GEMM: operands in cache, bound by the core's FLOP/s
        a, b = torch.randn(384, 384), torch.randn(384, 384)
        return lambda: torch.mm(a, b)
    if kind == "memory":   # 32 MiB copy: beyond the caches, bound by DRAM bandwidth
        src, dst = torch.randn(8 * 2**20), torch.empty(8 * 2**20)
        return lambda: dst.copy_(src)
    x = torch.ones(16)     # launch: a tiny add, bound by the dispatcher

    def storm():
        for _ in range(50):
            x.add_(1.0)
    return storm


def _train_step(name: str):
    import torch

    from calibration.torch_model import build_module
    from calibration.train import make_optimizer, make_step
    from perfmodel.strategy import Strategy
    from perfmodel.workload.model import transformer

    job = dict(TRAIN_JOBS[name])
    s = Strategy(micro_batch=job.pop("micro_batch"), precision="fp32")
    model = transformer(**job)
    torch.manual_seed(0)
    net = build_module(model, "none")
    ctx = {"rank": 0, "world": 1, "device": "cpu"}
    return make_step(net, make_optimizer(net, s, ctx), s, model, ctx, 0)


def worker(kind: str, what: str, start_at: float, seconds: float) -> dict:
    """Warm up, wait for ``start_at``, then time ``kind`` until ``start_at + seconds``: median wall and
    CPU seconds per iteration (CPU: this process's own, whatever else the host runs)."""
    import torch

    torch.set_num_threads(1)
    fn = _kernel(kind) if what == "kernel" else _train_step(kind)
    for _ in range(3):
        fn()
    while time.time() < start_at:
        time.sleep(0.005)
    end = start_at + seconds
    wall, cpu = [], []
    while True:
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        if time.time() >= end:
            break
    return {"wall_s": float(np.median(wall)), "cpu_s": float(np.median(cpu)), "n": len(wall)}


def runnable_threads(start_at: float, seconds: float, period_s: float = 0.05) -> float:
    """Mean of /proc/stat ``procs_running`` over the window (this sampling process included)."""
    while time.time() < start_at:
        time.sleep(0.005)
    samples = []
    while time.time() < start_at + seconds:
        with open("/proc/stat") as f:
            line = next((x for x in f if x.startswith("procs_running")), "procs_running 0")
        samples.append(int(line.split()[1]))
        time.sleep(period_s)
    return float(np.mean(samples)) if samples else 0.0


# --- the parent --------------------------------------------------------------------------------


def run_mix(kinds, what: str, seconds: float, setup_s: float) -> tuple[list[dict], float]:
    """Start one process per entry of ``kinds``; their reports (in order) and the other runnable
    threads on the host during the window (``procs_running`` less these processes and the sampler)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    start_at = time.time() + setup_s
    procs = [subprocess.Popen([sys.executable, "-m", "calibration.interference", "worker", "--kind", k,
                               "--what", what, "--start-at", repr(start_at), "--seconds", str(seconds)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in kinds]
    running = runnable_threads(start_at + 0.2, seconds - 0.4)
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=setup_s + seconds + 300)
        if p.returncode != 0:
            raise RuntimeError(f"worker failed ({p.returncode}): {stderr.strip().splitlines()[-1:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out, max(running - len(kinds) - 1.0, 0.0)


def measure(mixes, what: str, *, seconds: float, repeats: int, setup_s: float, log=print) -> list[dict]:
    """Each mix together next to each of its members alone, ``repeats`` times."""
    rows = []
    for rep in range(repeats):
        for mix in mixes:
            if len(mix) == 1:
                continue
            alone = {k: run_mix([k], what, seconds, setup_s) for k in sorted(set(mix))}
            together, other = run_mix(mix, what, seconds, setup_s)
            for slot, (k, r) in enumerate(zip(mix, together)):
                a, other_alone = alone[k][0][0], alone[k][1]
                rows.append({"mix": "+".join(mix), "job": k, "slot": slot, "repeat": rep,
                             "wall_alone_s": a["wall_s"], "wall_together_s": r["wall_s"],
                             "cpu_alone_s": a["cpu_s"], "cpu_together_s": r["cpu_s"],
                             "slowdown": r["wall_s"] / a["wall_s"], "cpu_slowdown": r["cpu_s"] / a["cpu_s"],
                             "other_alone": round(other_alone, 3), "other_together": round(other, 3),
                             "iterations": r["n"]})
                log(f"repeat {rep} {'+'.join(mix)}: {k} x{rows[-1]['slowdown']:.3f} wall, "
                    f"x{rows[-1]['cpu_slowdown']:.3f} cpu, other load {other_alone:.2f} -> {other:.2f}")
    return rows


def write(path, rows, columns) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        w.writerows(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m calibration.interference", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=["kernels", "train", "worker"])
    p.add_argument("--out", default=None)
    p.add_argument("--seconds", type=float, default=3.0, help="measurement window per run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--setup", type=float, default=None, help="seconds to build and warm up before the window")
    p.add_argument("--kind", default=None)
    p.add_argument("--what", default="kernel", choices=["kernel", "train"])
    p.add_argument("--start-at", type=float, default=0.0)
    args = p.parse_args(argv)
    if args.command == "worker":
        print(json.dumps(worker(args.kind, args.what, args.start_at, args.seconds)))
        return 0
    if not args.out:
        p.error("--out is required")
    if args.command == "kernels":
        rows = measure(KERNEL_MIXES, "kernel", seconds=args.seconds, repeats=args.repeats,
                       setup_s=args.setup or 4.0)
        write(args.out, rows, COLUMNS)
    else:
        jobs = Path(args.out).with_name("jobs.json")  # the jobs' models and micro-batches, for predicting them
        jobs.parent.mkdir(parents=True, exist_ok=True)
        jobs.write_text(json.dumps({k: {**v, "precision": "fp32", "threads": 1} for k, v in TRAIN_JOBS.items()},
                                   indent=1) + "\n")
        rows = measure(TRAIN_MIXES, "train", seconds=args.seconds, repeats=args.repeats, setup_s=args.setup or 8.0)
        write(args.out, rows, COLUMNS)
    print(f"{len(rows)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
