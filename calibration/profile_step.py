"""Where a real training step's GPU time goes: per-kernel totals from ``torch.profiler``.

Takes the arguments of ``calibration.train`` (one process), times ``--steps``
steps without the profiler, then profiles ``--profiled`` more and writes one row
per GPU kernel name: calls and GPU seconds per step, beside the step's measured
time and the GPU's busy time. ``--validation-runs`` does this for every GPU run
of ``perfmodel validate`` in one process::

    python -m calibration.profile_step --model gpt2-small --micro-batch 8 --out kernels.csv
    python -m calibration.profile_step --validation-runs --out kernels.csv

The rows let a cost model be checked class by class against the step it
predicts (GEMM, attention, norms, ...), not only in total. On a CPU
(``--device cpu``) the rows are aten ops and ``gpu_s_per_step`` their self
time on the CPU.
"""

from __future__ import annotations

import argparse
import csv
import gc
import sys
from pathlib import Path

import numpy as np
import torch

from calibration import train
from perfmodel import Strategy

COLUMNS = ("label", "micro_batch", "global_batch", "recompute", "kernel", "calls_per_step",
           "gpu_s_per_step", "step_s", "gpu_busy_s_per_step", "device", "torch")


def _kernel_events(prof, gpu: bool):
    """(name, microseconds) of every GPU kernel the profiler saw (on the CPU: every aten op's self time)."""
    if not gpu:
        for e in prof.events():
            if e.name.startswith("aten::") and e.self_cpu_time_total > 0:
                yield e.name, e.self_cpu_time_total
        return
    cuda = torch.autograd.DeviceType.CUDA
    for e in prof.events():
        if getattr(e, "device_type", None) == cuda:
            yield e.name, e.time_range.elapsed_us()


def profile_one(args, profiled: int) -> list[dict]:
    model = train.model_from_args(args)
    ctx = train.setup(args.device)
    gpu = ctx["device"].startswith("cuda")
    strategy = Strategy(dp=1, micro_batch=args.micro_batch, global_batch=args.global_batch,
                        recompute=args.recompute, precision=train.default_precision(args.precision, ctx["device"]))
    torch.manual_seed(args.seed)
    with torch.device(ctx["device"]):
        net = train.build_module(model, strategy.recompute)
    opt = train.make_optimizer(net, strategy, ctx)
    step = train.make_step(net, opt, strategy, model, ctx, args.seed)
    times = train.time_steps(step, args.steps, args.warmup, ctx)
    from torch.profiler import ProfilerActivity, profile

    sync = torch.cuda.synchronize if gpu else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])) as prof:
        for _ in range(profiled):
            step()
        sync()
    totals: dict[str, list[float]] = {}
    for name, us in _kernel_events(prof, gpu):
        calls_us = totals.setdefault(name, [0, 0.0])
        calls_us[0] += 1
        calls_us[1] += us
    busy = sum(us for _, us in totals.values()) / 1e6 / profiled
    step_s = float(np.median(times))
    rows = [{"label": args.model or model.name, "micro_batch": args.micro_batch,
             "global_batch": strategy.batch, "recompute": args.recompute, "kernel": name,
             "calls_per_step": calls / profiled, "gpu_s_per_step": us / 1e6 / profiled, "step_s": step_s,
             "gpu_busy_s_per_step": busy, "device": train._gpu_name(ctx["device"]), "torch": torch.__version__}
            for name, (calls, us) in sorted(totals.items(), key=lambda kv: -kv[1][1])]
    print(f"{rows[0]['label'] if rows else args.model}: mb={args.micro_batch} {args.recompute}: "
          f"step {step_s * 1e3:.2f} ms, GPU busy {busy * 1e3:.2f} ms, {len(rows)} kernel names")
    del net, opt, step
    gc.collect()
    if gpu:
        torch.cuda.empty_cache()
    return rows


def _validation_argvs(out: str) -> list[list[str]]:
    from perfmodel.validate.loop import GPU_RUNS, train_command

    argvs = []
    for run in GPU_RUNS:
        cmd = train_command(run, Path(out), gpu="gpu", device="cuda", steps=10, warmup=3)
        argvs.append(cmd[cmd.index("calibration.train") + 1:])
    return argvs


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m calibration.profile_step", add_help=False)
    p.add_argument("--validation-runs", action="store_true")
    p.add_argument("--profiled", type=int, default=3, help="profiled steps")
    p.add_argument("--out", required=True, help="CSV to write (one row per kernel name and run)")
    own, rest = p.parse_known_args(argv)
    argvs = _validation_argvs(own.out) if own.validation_runs else [[*rest, "--out", own.out]]
    new = True
    for one in argvs:
        args = train.parse_args(one)
        try:
            rows = profile_one(args, own.profiled)
        except (RuntimeError, ValueError) as exc:  # an OOM in one run does not lose the others
            print(f"{args.model}: failed: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
            continue
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w" if new else "a", newline="") as f:
            writer = csv.DictWriter(f, COLUMNS)
            if new:
                writer.writeheader()
            writer.writerows(rows)
        new = False
    return 0


if __name__ == "__main__":
    sys.exit(main())
