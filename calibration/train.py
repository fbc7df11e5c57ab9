"""Time real training steps of a transformer described exactly as the predictor describes it.

Run::

    # one process: a GPU (bf16 autocast) when visible, else the CPU (fp32)
    python -m calibration.train --model gpt2-small --micro-batch 8 --steps 10 --out runs.csv
    python -m calibration.train --layers 2 --hidden 128 --heads 4 --seq 64 --vocab 1024 \\
        --micro-batch 4 --device cpu --out runs.csv
    # data parallel (DDP) over 2 processes: gloo on CPUs, NCCL on GPUs
    torchrun --standalone --nproc-per-node 2 -m calibration.train --layers 2 --hidden 128 \\
        --heads 4 --seq 64 --vocab 1024 --micro-batch 4 --out runs.csv
    # sharded: FSDP (fully_shard) with --fsdp full (ZeRO-3) or --zero 2; --zero 1 shards AdamW state
    torchrun --nproc-per-node 8 -m calibration.train --model gpt-1.3b --fsdp full --out runs.csv

A step is what the predictor calls a step: ``zero_grad(set_to_none=True)``,
forward + backward of every micro-batch (gradient accumulation when
``--global-batch`` > dp × micro-batch), ``optimizer.step()``. ``--warmup``
steps are run first, then ``--steps`` are timed one by one (CUDA events on a
GPU, ``perf_counter`` on the CPU; in a distributed run the slowest rank's time
of each step). One row per run is appended to ``--out`` in the measured-CSV
schema of ``perfmodel.validate.measured`` (median step time) plus the spread
columns; ``perfmodel validate --measured runs.csv`` predicts and compares them.
Peak memory: ``torch.cuda.max_memory_allocated`` on a GPU; on the CPU the
growth of the process's peak RSS over the run (``memory_kind`` says which).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import resource
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from calibration.env import dist_env
from calibration.torch_model import build_module
from perfmodel.errors import InvalidInputError, PerfModelError, UnsupportedError
from perfmodel import Strategy
from perfmodel.validate.measured import COLUMNS, MODEL_FIELDS, RUN_COLUMNS

OUT_COLUMNS = COLUMNS + RUN_COLUMNS


# --- the command line --------------------------------------------------------------------------


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low not in ("true", "false", "1", "0"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return low in ("true", "1")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m calibration.train", description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="preset name (fields below override it) or a label")
    for name in ("layers", "hidden", "heads", "seq", "vocab", "kv-heads", "ffn-hidden"):
        p.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--activation", default=None, choices=["gelu", "swiglu", "relu"])
    p.add_argument("--norm", default=None, choices=["layernorm", "rmsnorm"])
    p.add_argument("--position", default=None, choices=["learned", "rotary", "none"])
    for name in ("bias", "tied-embeddings", "causal"):
        p.add_argument(f"--{name}", type=_bool, default=None, metavar="true|false")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--global-batch", type=int, default=None, help="default dp × micro-batch")
    p.add_argument("--zero", type=int, default=0, choices=range(4))
    p.add_argument("--fsdp", default=None, choices=["full", "hybrid"])
    p.add_argument("--recompute", default="none", choices=["none", "selective", "full"])
    p.add_argument("--precision", default=None, help="default bf16-mixed on a GPU, fp32 on the CPU")
    p.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    p.add_argument("--bucket-mib", type=float, default=25.0, help="DDP bucket size in MiB (torch's bucket_cap_mb, default 25)")
    p.add_argument("--steps", type=int, default=10, help="timed steps (median reported)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when visible)")
    p.add_argument("--gpu", default=None, help="what to write in the 'gpu' column (a catalog name or TOML)")
    p.add_argument("--profile", default=None, help="what to write in the 'profile' column (to predict the row with)")
    p.add_argument("--source", default="calibration.train", help="the 'source' column")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="CSV to append the row to")
    return p.parse_args(argv)


def model_from_args(args):
    """The ``pm.transformer`` the arguments describe (preset, then field overrides), read as a CSV row is."""
    from perfmodel.validate.measured import model_of

    row = {f: str(getattr(args, f)) for f in MODEL_FIELDS if getattr(args, f, None) is not None}
    return model_of({**row, "model": args.model or ""})


# --- processes, devices, wrapping ---------------------------------------------------------------


def setup(device_arg: str | None) -> dict:
    """Start the process group under a launcher; return rank, world, device and backend."""
    env = dist_env()
    gpu = torch.cuda.is_available() if device_arg in (None, "") else device_arg.startswith("cuda")
    if gpu and not torch.cuda.is_available():
        raise UnsupportedError(f"--device {device_arg}: no CUDA GPU visible to torch {torch.__version__}")
    world = env.world_size if env else 1
    local = env.local_rank if env else 0
    device = f"cuda:{local % torch.cuda.device_count()}" if gpu else "cpu"
    backend = "nccl" if gpu else "gloo"
    if gpu:
        torch.cuda.set_device(device)
    hosts = [socket.gethostname()]
    if world > 1:
        for key, value in (("MASTER_ADDR", env.master_addr), ("MASTER_PORT", str(env.master_port)),
                           ("RANK", str(env.rank)), ("WORLD_SIZE", str(world))):
            os.environ.setdefault(key, value)
        dist.init_process_group(backend, rank=env.rank, world_size=world)
        hosts = [None] * world
        dist.all_gather_object(hosts, socket.gethostname())
    return {"rank": env.rank if env else 0, "world": world, "device": device,
            "backend": backend if world > 1 else "", "nodes": len(set(hosts)),
            "per_node": env.local_world_size if env else 1}


def default_precision(precision: str | None, device: str) -> str:
    """The precision asked for, else bf16 autocast on a GPU and fp32 on the CPU."""
    return precision or ("bf16-mixed" if device.startswith("cuda") else "fp32")


def check_request(strategy: Strategy, device: str, world: int) -> None:
    if strategy.dp != world:
        raise InvalidInputError(f"dp={strategy.dp} must equal the number of processes {world}")
    if device == "cpu" and strategy.precision not in ("fp32", "bf16-mixed"):
        raise UnsupportedError(f"precision {strategy.precision!r} needs a GPU; on the CPU use fp32")
    if strategy.precision == "fp8-mixed":
        raise UnsupportedError("fp8-mixed training is not implemented here (use bf16-mixed)")
    if device == "cpu" and strategy.precision == "tf32":
        raise UnsupportedError("tf32 is a CUDA math mode; on the CPU use fp32")


def wrap(net, strategy: Strategy, ctx: dict):
    """DDP, FSDP (``fully_shard``) or nothing, as the strategy says."""
    if ctx["world"] == 1:
        return net
    shard = strategy.shard
    if shard >= 2:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        dev = "cuda" if ctx["device"].startswith("cuda") else "cpu"
        if strategy.fsdp == "hybrid":  # replicate across nodes, shard inside each (HSDP)
            mesh = init_device_mesh(dev, (ctx["nodes"], ctx["per_node"]), mesh_dim_names=("replicate", "shard"))
        else:
            mesh = init_device_mesh(dev, (ctx["world"],))
        low = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(strategy.precision)
        policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32 if low else None)
        reshard = shard == 3  # ZeRO-2 keeps gathered parameters from forward to backward
        for block in net.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        fully_shard(net, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
        return net
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [torch.device(ctx["device"]).index] if ctx["device"].startswith("cuda") else None
    return DDP(net, device_ids=ids, bucket_cap_mb=strategy.bucket_mib)  # torch counts it in MiB


def make_optimizer(net, strategy: Strategy, ctx: dict):
    """Fused AdamW (or SGD with momentum); ZeRO-1 shards its state over the ranks."""
    cls = torch.optim.AdamW if strategy.optimizer == "adamw" else torch.optim.SGD
    kwargs = {"lr": 1e-4, "fused": True}
    if strategy.optimizer == "sgd":
        kwargs["momentum"] = 0.9
    if strategy.shard == 1 and ctx["world"] > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(net.parameters(), optimizer_class=cls, **kwargs)
    return cls(net.parameters(), **kwargs)


def _autocast(strategy: Strategy, device: str):
    low = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(strategy.precision)
    if low is None:
        return contextlib.nullcontext
    kind = "cuda" if device.startswith("cuda") else "cpu"
    return lambda: torch.autocast(kind, dtype=low)


def _no_sync(net, last: bool):
    """Skip the gradient reduction of all micro-batches but the last (DDP, FSDP)."""
    if hasattr(net, "no_sync") and not last:
        return net.no_sync()
    if hasattr(net, "set_requires_gradient_sync"):
        net.set_requires_gradient_sync(last)
    return contextlib.nullcontext()


def make_step(net, opt, strategy: Strategy, model, ctx: dict, seed: int):
    """The zero-argument training step and the data it runs on."""
    gen = torch.Generator().manual_seed(seed + ctx["rank"])
    shape = (strategy.micro_batches, strategy.micro_batch, model.seq)
    tokens = torch.randint(0, model.vocab, shape, generator=gen).to(ctx["device"])
    targets = torch.randint(0, model.vocab, shape, generator=gen).to(ctx["device"])
    autocast = _autocast(strategy, ctx["device"])
    scaler = torch.amp.GradScaler("cuda") if strategy.precision == "fp16-mixed" else None
    m = strategy.micro_batches

    def step():
        opt.zero_grad(set_to_none=True)
        for i in range(m):
            with _no_sync(net, i == m - 1):
                with autocast():
                    loss = net(tokens[i], targets[i]) / m
                (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
    return step


# --- timing and memory --------------------------------------------------------------------------


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def time_steps(step, steps: int, warmup: int, ctx: dict) -> list[float]:
    """Seconds of each timed step (the slowest rank's, in a distributed run)."""
    gpu = ctx["device"].startswith("cuda")
    for _ in range(warmup):
        step()
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        if ctx["world"] > 1:
            dist.barrier()
        if gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)  # elapsed_time is in milliseconds
        else:
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    if ctx["world"] > 1:
        t = torch.tensor(times, dtype=torch.float64, device=ctx["device"])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times = t.tolist()
    return times


def run(model, strategy: Strategy, ctx: dict, *, steps: int, warmup: int, seed: int = 0) -> dict:
    """Build, wrap and time ``model`` under ``strategy``; the measured columns of the row."""
    if steps < 1 or warmup < 0:
        raise InvalidInputError(f"'steps' must be >= 1 and 'warmup' >= 0: got {steps}, {warmup}")
    torch.manual_seed(seed)
    rss0 = _rss_bytes()
    with torch.device(ctx["device"]):  # initialise on the device: a CPU init of 1e9 params takes seconds
        net = build_module(model, strategy.recompute)
    net = wrap(net, strategy, ctx)
    opt = make_optimizer(net, strategy, ctx)
    if strategy.precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    times = np.asarray(time_steps(make_step(net, opt, strategy, model, ctx, seed), steps, warmup, ctx))
    gpu = ctx["device"].startswith("cuda")
    peak = torch.cuda.max_memory_allocated() if gpu else max(_peak_rss_bytes() - rss0, 0)
    if ctx["world"] > 1:
        t = torch.tensor([float(peak)], dtype=torch.float64, device=ctx["device"])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        peak = t.item()
    median = float(np.median(times))
    return {"step_time_s": median, "tokens_per_second": strategy.batch * model.seq / median,
            "step_time_min_s": float(times.min()), "step_time_p10_s": float(np.percentile(times, 10)),
            "step_time_p90_s": float(np.percentile(times, 90)), "step_time_max_s": float(times.max()),
            "steps": steps, "warmup": warmup, "peak_memory_bytes": float(peak),
            "memory_kind": "cuda-max-allocated" if gpu else "rss-growth"}


# --- the row ------------------------------------------------------------------------------------


def row_of(model, strategy: Strategy, ctx: dict, measured: dict, args) -> dict:
    row = {f: getattr(model, f) for f in MODEL_FIELDS}
    row.update(model=args.model or model.name, gpu=args.gpu or _gpu_name(ctx["device"]), profile=args.profile,
               nodes=ctx["nodes"], gpus_per_node=ctx["per_node"], source=args.source,
               device=ctx["device"].split(":")[0], backend=ctx["backend"], threads=torch.get_num_threads(),
               torch=torch.__version__, date=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    row.update({f: getattr(strategy, f) for f in ("dp", "tp", "pp", "micro_batch", "zero", "fsdp",
                                                  "recompute", "precision", "optimizer")})
    row["global_batch"] = strategy.batch
    row.update(measured)
    return row


def _gpu_name(device: str) -> str:
    """The catalog GPU whose name the CUDA device's name contains, else the device's name."""
    if not device.startswith("cuda"):
        return "cpu"
    from perfmodel.hardware import list_gpus

    name = torch.cuda.get_device_name(device).lower()
    found = [g for g in list_gpus() if g.split("-")[0] in name.replace(" ", "-")]
    return found[0] if len(found) == 1 else name


def append_row(path: str | Path, row: dict) -> None:
    """Append ``row`` to a CSV of OUT_COLUMNS, writing the header first when the file is new."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size:
        with open(path, newline="") as f:
            header = next(csv.reader(f), [])
        if tuple(header) != OUT_COLUMNS:
            raise InvalidInputError(f"{path} has other columns than calibration.train writes; "
                                    "write to another file")
    new = not path.exists() or path.stat().st_size == 0
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, OUT_COLUMNS, extrasaction="raise")
        if new:
            writer.writeheader()
        writer.writerow({k: "" if v is None else v for k, v in row.items()})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ctx = None
    try:
        model = model_from_args(args)
        ctx = setup(args.device)
        precision = default_precision(args.precision, ctx["device"])
        strategy = Strategy(dp=ctx["world"], micro_batch=args.micro_batch, global_batch=args.global_batch,
                            zero=args.zero, fsdp=args.fsdp, recompute=args.recompute, precision=precision,
                            optimizer=args.optimizer, bucket_mib=args.bucket_mib)
        check_request(strategy, ctx["device"], ctx["world"])
        measured = run(model, strategy, ctx, steps=args.steps, warmup=args.warmup, seed=args.seed)
        row = row_of(model, strategy, ctx, measured, args)
        if ctx["rank"] == 0:
            append_row(args.out, row)
            print(f"{row['model']}: dp={strategy.dp} micro_batch={strategy.micro_batch} {precision}: "
                  f"step {row['step_time_s'] * 1e3:.2f} ms (min {row['step_time_min_s'] * 1e3:.2f}, "
                  f"p90 {row['step_time_p90_s'] * 1e3:.2f}) over {args.steps} steps -> {args.out}")
        if dist.is_initialized():  # every rank done before any tears its process group down
            dist.barrier()
    except PerfModelError as exc:
        if ctx is None or ctx["rank"] == 0:
            print(f"calibration.train: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
