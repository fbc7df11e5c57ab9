"""Measure collectives (NCCL on GPUs, gloo on CPUs) into ``collectives.csv``.

Run one process per GPU under a launcher::

    torchrun --nproc-per-node 8 -m calibration.collectives --out calib/dgx-h100
    # several nodes (the same command on every node):
    torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m calibration.collectives --out calib/cluster
    # SLURM (MASTER_ADDR is taken from the node list when unset):
    srun --nodes 4 --ntasks-per-node 8 python -m calibration.collectives --out calib/cluster
    # two CPU processes over gloo, as the tests do:
    torchrun --nproc-per-node 2 -m calibration.collectives --quick --out /tmp/coll
    # across datacenters: one launch per site, all joined to one rendezvous, each naming its site;
    # the cross-site scope times one rank per site (its all_reduce rows are a WAN curve):
    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-endpoint HOST:29500 \\
        -m calibration.collectives --site us-east --scopes cross-site --out calib/wan
    # or turn an iperf3 report (and a ping summary) into a [wan] table, no launcher needed:
    python -m calibration.collectives --iperf iperf.txt --ping ping.txt --out calib/wan

Measured: all_reduce, all_gather (all_gather_into_tensor), reduce_scatter
(reduce_scatter_tensor), broadcast, all_to_all (all_to_all_single) and a ring
of send/recv, over power-of-two sizes (``--sizes 1KiB:1GiB``), on the whole
world, inside each node, across nodes (one rank per node, every rail at once)
and on sub-groups of 2, 4, ... consecutive ranks. ``size_bytes`` is S as
nccl-tests doc/PERFORMANCE.md defines it; busbw uses its factors. Rank 0
writes the table (rows fsync'ed one by one; a rerun skips finished rows).
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import socket
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
try:
    from tqdm import tqdm
except ModuleNotFoundError:  # installed with torch by perfmodel's calibration extra
    raise SystemExit("calibration needs tqdm, which is not installed: pip install 'perfmodel[torch]'") from None

from calibration.env import DistEnv, available_memory_bytes, dist_env, machine_metadata
from calibration.grids import geometric
from calibration.tables import (
    COLLECTIVE_COLUMNS,
    COLLECTIVE_KEY_COLUMNS,
    TableWriter,
    format_value,
    update_metadata,
)
from perfmodel.errors import PerfModelError, unknown_name
from perfmodel.core.choices import COLLECTIVES
from perfmodel.fit.nccl_tests import busbw_factor
from perfmodel.core.units import parse_bytes

SCOPES = ("world", "intra", "inter", "subgroup", "cross-site")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TARGET_BATCH_S = 2e-3  # a timed batch of back-to-back collectives lasts at least 2 ms
MAX_ITERS = 50
COLD_REPS = 15  # single calls (--cold) are noisier than batches: more of them


@dataclass(frozen=True)
class Case:
    """One measurement, known to every rank in the same order."""

    scope: str
    collective: str
    size_bytes: int  # S as nccl-tests reports it
    groups: tuple[tuple[int, ...], ...]  # groups measured at the same time (global ranks); rank 0's first


@dataclass(frozen=True)
class Layout:
    """Ranks, their hosts and the process groups of each scope."""

    rank: int
    world_size: int
    hosts: tuple[str, ...]  # host of each rank
    sites: tuple = ()  # site of each rank (--site), empty when not given

    @property
    def nodes(self) -> list[str]:
        return list(dict.fromkeys(self.hosts))

    def node_ranks(self) -> list[tuple[int, ...]]:
        return [tuple(r for r, h in enumerate(self.hosts) if h == node) for node in self.nodes]

    def scope_groups(self, scope: str) -> list[tuple[tuple[int, ...], ...]]:
        """For ``scope``, a list of group sets; the groups of one set run at the same time."""
        per_node = self.node_ranks()
        if scope == "world":
            return [(tuple(range(self.world_size)),)]
        if scope == "cross-site":  # the first rank of each named site
            firsts: dict = {}
            for r, site in enumerate(self.sites):
                if site:
                    firsts.setdefault(site, r)
            return [(tuple(firsts.values()),)] if len(firsts) > 1 else []
        if scope == "intra":
            return [tuple(per_node)] if len(per_node) > 1 and min(map(len, per_node)) > 1 else []
        if scope == "inter":
            rails = min(map(len, per_node))
            return [tuple(tuple(node[j] for node in per_node) for j in range(rails))] if len(per_node) > 1 else []
        sizes = [g for g in geometric(2, self.world_size // 2) if len(per_node) == 1 or g != len(per_node[0])]
        return [(tuple(range(g)),) for g in sizes]

    def span(self, members: tuple[int, ...]) -> tuple[int, int | None]:
        """(nodes, ranks per node) a group covers; ranks per node None when uneven."""
        counts = {}
        for r in members:
            counts[self.hosts[r]] = counts.get(self.hosts[r], 0) + 1
        per = set(counts.values())
        return len(counts), (per.pop() if len(per) == 1 else None)


def parse_sizes(text: str) -> list[int]:
    """'1KiB:1GiB' -> powers of two from 1 KiB to 1 GiB; '1MiB' -> [1 MiB]."""
    lo_text, _, hi_text = text.partition(":")
    lo = int(parse_bytes(lo_text, "--sizes"))
    hi = int(parse_bytes(hi_text or lo_text, "--sizes"))
    if lo < 1 or hi < lo:
        raise PerfModelError(f"'--sizes' must be LOW:HIGH with 1 <= LOW <= HIGH: got {text!r}")
    return geometric(lo, hi)


def _cold_bytes(text: str) -> int:
    try:
        return int(parse_bytes(text, "--cold"))
    except PerfModelError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="torchrun ... -m calibration.collectives", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output folder (collectives.csv, metadata.json)")
    p.add_argument("--quick", action="store_true", help="a few small sizes (for tests)")
    p.add_argument("--sizes", default=None,
                   help="LOW:HIGH sizes, powers of two (default 1KiB:1GiB on GPUs, 1KiB:64MiB on CPUs)")
    p.add_argument("--collectives", default=None, help=f"comma-separated subset of {', '.join(COLLECTIVES)}")
    p.add_argument("--scopes", default=None, help=f"comma-separated subset of {', '.join(SCOPES)}")
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="element type (default fp32)")
    p.add_argument("--cold", default=None, metavar="SIZE", type=_cold_bytes,
                   help="time single calls, each after every rank writes SIZE bytes (e.g. 32MiB) as a training "
                        "step's compute does before its gradient all-reduce: caches cold (default: "
                        "back-to-back calls)")
    p.add_argument("--force-mix", action="store_true", help="write into a folder measured on other machines")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--site", default=os.environ.get("PERFMODEL_SITE"),
                   help="name of this process's datacenter, for the cross-site scope (default $PERFMODEL_SITE)")
    p.add_argument("--iperf", default=None, metavar="FILE",
                   help="write wan.toml from an iperf3 report (text or --json) instead of measuring")
    p.add_argument("--ping", default=None, metavar="FILE", help="with --iperf: a ping summary for the latency")
    p.add_argument("--latency", default=None, help="with --iperf: the one-way latency, e.g. 35ms")
    return p.parse_args(argv)


def _subset(text: str | None, known: tuple[str, ...], what: str) -> tuple[str, ...]:
    if text is None:
        return known
    chosen = tuple(t.strip() for t in text.split(",") if t.strip())
    for t in chosen:
        if t not in known:
            raise unknown_name(what, t, known)
    return chosen


def launch_hint(argv: list[str]) -> str:
    """The message shown when no launcher started this process."""
    gpus = torch.cuda.device_count()
    command = shlex.join(["torchrun", "--nproc-per-node", str(gpus or 2), "-m", "calibration.collectives", *argv])
    return (
        "calibration.collectives needs one process per device, started by torchrun or srun "
        "(no RANK/WORLD_SIZE or SLURM_PROCID/SLURM_NTASKS in the environment). Run:\n"
        f"  {command}\n"
        "Several nodes: add --nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:29500 and run it on "
        "every node; under SLURM: srun --ntasks-per-node G python -m calibration.collectives ..."
    )


# --- process groups and buffers --------------------------------------------------------------


def _init(env: DistEnv) -> tuple[str, str]:
    """Start the process group; return (backend, device)."""
    gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if gpu:
        torch.cuda.set_device(env.local_rank % torch.cuda.device_count())
    backend, device = ("nccl", f"cuda:{torch.cuda.current_device()}") if gpu else ("gloo", "cpu")
    for key, value in (("MASTER_ADDR", env.master_addr), ("MASTER_PORT", str(env.master_port)),
                       ("RANK", str(env.rank)), ("WORLD_SIZE", str(env.world_size))):
        os.environ.setdefault(key, value)
    dist.init_process_group(backend, rank=env.rank, world_size=env.world_size)
    return backend, device


SPLIT = ("all_gather", "reduce_scatter", "all_to_all")  # S is split into one chunk per rank


def exact_size(coll: str, n: int, size: int, elem_bytes: int) -> int:
    """The S actually moved for a requested ``size``: whole elements, whole chunks per rank."""
    if coll in SPLIT:
        return size // (n * elem_bytes) * n * elem_bytes  # nccl-tests truncates count/nranks likewise
    return size // elem_bytes * elem_bytes


def _run_collective(coll: str, members: tuple[int, ...], group, size: int, dtype, device: str, api: str):
    """A zero-argument call doing ``coll`` once on S = ``size`` bytes (ranks ``members``)."""
    n, e = len(members), torch.tensor([], dtype=dtype).element_size()
    rank = dist.get_rank()
    chunk = exact_size(coll, n, size, e) // e // (n if coll in SPLIT else 1)
    full = torch.ones(chunk * (n if coll in SPLIT else 1), dtype=dtype, device=device)
    part = torch.ones(chunk, dtype=dtype, device=device)
    if coll == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if coll == "broadcast":
        return lambda: dist.broadcast(full, src=members[0], group=group)
    if coll == "all_gather":
        if api != "all_gather":  # all_gather_single / all_gather_into_tensor: one flat output
            return partial(getattr(dist, api), full, part, group=group)
        outs = list(full.chunk(n))
        return lambda: dist.all_gather(outs, part, group=group)
    if coll == "reduce_scatter":
        if api != "reduce_scatter":  # reduce_scatter_single / reduce_scatter_tensor: one flat input
            return partial(getattr(dist, api), part, full, group=group)
        ins = list(full.chunk(n))
        return lambda: dist.reduce_scatter(part, ins, group=group)
    if coll == "all_to_all":
        out = torch.empty_like(full)
        if api == "all_to_all_single":
            return lambda: dist.all_to_all_single(out, full, group=group)
        ins, outs = list(full.chunk(n)), list(out.chunk(n))
        return lambda: dist.all_to_all(outs, ins, group=group)
    recv = torch.empty_like(full)  # sendrecv: a ring, each rank sends S to the next
    i = members.index(rank)
    nxt, prv = members[(i + 1) % n], members[(i - 1) % n]

    def ring():
        ops = [dist.P2POp(dist.isend, full, nxt, group), dist.P2POp(dist.irecv, recv, prv, group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return ring


APIS = {  # preferred call first (torch >= 2.13 renames the flat-tensor ones); gloo lacks some
    "all_reduce": ("all_reduce",), "broadcast": ("broadcast",), "sendrecv": ("batch_isend_irecv",),
    "all_gather": ("all_gather_single", "all_gather_into_tensor", "all_gather"),
    "reduce_scatter": ("reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter"),
    "all_to_all": ("all_to_all_single", "all_to_all"),
}


def probe_apis(collectives, dtype, device: str, world) -> dict[str, str | None]:
    """The first API of each collective that works on this backend (None: unsupported)."""
    members = tuple(range(dist.get_world_size()))
    chosen = {}
    for coll in collectives:
        chosen[coll] = None
        for api in (a for a in APIS[coll] if hasattr(dist, a)):
            try:
                fn = _run_collective(coll, members, world, 64 * len(members), dtype, device, api)
                fn()
                _sync(device)
                chosen[coll] = api
                break
            except (RuntimeError, NotImplementedError, ValueError):
                continue
    return chosen


# --- timing ------------------------------------------------------------------------------------


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _barrier(group, device: str) -> None:
    if device.startswith("cuda"):
        dist.barrier(group=group, device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier(group=group)


def _world_reduce(values: list[float], device: str, op=dist.ReduceOp.SUM) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return t.tolist()


def _time_batch(fn, iters: int, device: str) -> float:
    """Seconds per call of ``iters`` back-to-back calls (CUDA events on GPUs)."""
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters  # elapsed_time is in milliseconds
    import time
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def time_case(fn, group, device: str, *, warmup: int, reps: int, evict=None) -> tuple[float, float, int]:
    """(mean over ranks of the median, of the min) seconds per call, and the calls per batch.

    Every rank of the world calls this in step; ranks outside the measured
    groups pass ``fn=None`` and only join the agreement on batch size and the
    averaging (nccl-tests reports the time averaged over ranks too). With
    ``evict`` (a call that writes a buffer larger than the caches) every rep is
    one call after ``evict()`` and a barrier: the collective as a training step
    issues it, after compute, rather than back to back with itself.
    """
    one = 0.0
    if fn is not None:
        for _ in range(warmup):
            fn()
        _sync(device)
        _barrier(group, device)
        one = _time_batch(fn, 1, device)
    one = _world_reduce([one], device, dist.ReduceOp.MAX)[0]
    iters = 1 if evict else max(1, min(MAX_ITERS, math.ceil(TARGET_BATCH_S / max(one, 1e-9))))
    stats = [0.0, 0.0, 0.0]
    if fn is not None:
        per_call = []
        for _ in range(reps):
            if evict:
                evict()
                _sync(device)
            _barrier(group, device)
            per_call.append(_time_batch(fn, iters, device))
        per_call.sort()
        stats = [per_call[len(per_call) // 2], per_call[0], 1.0]
    total = _world_reduce(stats, device)
    return total[0] / total[2], total[1] / total[2], iters


# --- the run ---------------------------------------------------------------------------------


def plan_cases(layout: Layout, scopes, apis: dict, sizes: list[int]) -> list[Case]:
    """Every measurement, in the same order on every rank."""
    cases = []
    for scope in scopes:
        for groups in layout.scope_groups(scope):
            if len(groups[0]) < 2:
                continue
            for coll, api in apis.items():
                if api is not None:
                    cases += [Case(scope, coll, s, groups) for s in sizes]
    return cases


def _memory_cap(device: str, local_world_size: int) -> float:
    """The largest S every rank can hold (a collective needs up to ~3 S of buffers)."""
    if device.startswith("cuda"):
        free = torch.cuda.mem_get_info()[0]
    else:
        free = (available_memory_bytes() or float(2**40)) / max(1, local_world_size)
    return _world_reduce([free / 4], device, dist.ReduceOp.MIN)[0]


def row_of(case: Case, layout: Layout, backend: str, dtype_name: str) -> dict:
    """The key columns of ``case`` (its measured columns are added after timing)."""
    members = case.groups[0]
    nodes, per_node = layout.span(members)
    e = torch.tensor([], dtype=DTYPES[dtype_name]).element_size()
    return {"collective": case.collective, "backend": backend, "scope": case.scope,
            "group_size": len(members), "nodes": nodes, "ranks_per_node": per_node,
            "size_bytes": exact_size(case.collective, len(members), case.size_bytes, e),
            "dtype": dtype_name, "world_size": layout.world_size}


def _open_table(out: Path, meta: dict, force_mix: bool, keys: list[tuple]) -> tuple[object, list[bool]]:
    """(writer, done flags) on rank 0; raises PerfModelError when the folder is another machine's."""
    update_metadata(out, meta, force_mix=force_mix)
    writer = TableWriter(out / "collectives.csv", COLLECTIVE_COLUMNS, COLLECTIVE_KEY_COLUMNS)
    return writer, [k in writer.done for k in keys]


def _measure_all(cases, rows, done, handles, layout, args, device, apis, writer) -> int:
    dtype = DTYPES[args.dtype]
    bar = tqdm(total=len(cases) - sum(done), desc="collectives", unit="case",
               disable=layout.rank != 0 or args.no_progress, dynamic_ncols=True)
    written = 0
    reps = COLD_REPS if args.cold else (3 if args.quick else 5)
    evict = None
    if args.cold:
        scratch = torch.empty(args.cold // 4, dtype=torch.float32, device=device)
        evict = partial(scratch.fill_, 1.0)
    for case, row, skip in zip(cases, rows, done):
        if skip or row["size_bytes"] == 0:
            continue
        mine = next((g for g in case.groups if layout.rank in g), None)
        fn = None
        if mine is not None:
            fn = _run_collective(case.collective, mine, handles[mine], case.size_bytes, dtype, device,
                                 apis[case.collective])
        median_s, min_s, iters = time_case(fn, handles.get(mine), device, warmup=1 if args.quick else 3,
                                           reps=reps, evict=evict)
        del fn
        if layout.rank == 0:
            algbw = row["size_bytes"] / median_s / 1e9  # nccl-tests: algbw = S / t, GB = 1e9 bytes
            writer.append({**row, "time_s": median_s, "time_min_s": min_s, "algbw_GBps": algbw,
                           "busbw_GBps": algbw * float(busbw_factor(case.collective, row["group_size"])),
                           "reps": reps * iters})
            written += 1
            bar.update(1)
    bar.close()
    return written


def run(args: argparse.Namespace, env: DistEnv) -> int:
    backend, device = _init(env)
    hosts = [None] * env.world_size
    dist.all_gather_object(hosts, (socket.gethostname(), args.site))
    layout = Layout(env.rank, env.world_size, tuple(h for h, _ in hosts),
                    tuple(site for _, site in hosts) if any(site for _, site in hosts) else ())
    handles = {}
    scopes = _subset(args.scopes, SCOPES, "scope")
    for scope in scopes:  # every rank creates every group, in the same order
        for groups in layout.scope_groups(scope):
            for members in groups:
                if members not in handles:
                    whole = len(members) == env.world_size
                    handles[members] = dist.group.WORLD if whole else dist.new_group(list(members))
    dtype = DTYPES[args.dtype]
    apis = probe_apis(_subset(args.collectives, COLLECTIVES, "collective"), dtype, device, dist.group.WORLD)
    default = "1KiB:64KiB" if args.quick else ("1KiB:1GiB" if backend == "nccl" else "1KiB:64MiB")
    cap = _memory_cap(device, env.local_world_size)
    sizes = [s for s in parse_sizes(args.sizes or default) if s <= cap]
    if args.quick and args.sizes is None:
        sizes = sizes[::2]
    cases = plan_cases(layout, scopes, apis, sizes)
    rows = [row_of(c, layout, backend, args.dtype) for c in cases]
    status = [None, None]  # (error message, done flags) from rank 0
    writer = None
    if env.rank == 0:
        meta = machine_metadata(device, flags={
            "hosts": layout.nodes, "world_size": env.world_size, "nodes": len(layout.nodes),
            "ranks_per_node": layout.span(tuple(range(env.world_size)))[1], "backend": backend,
            "collective_apis": apis, "quick": args.quick, "sizes": [sizes[0], sizes[-1]] if sizes else [],
            "cold_bytes": args.cold or 0})
        try:
            writer, flags = _open_table(Path(args.out), meta, args.force_mix,
                                        [tuple(format_value(r.get(c)) for c in COLLECTIVE_KEY_COLUMNS) for r in rows])
            status = [None, flags]
        except PerfModelError as exc:
            status = [str(exc), None]
    dist.broadcast_object_list(status, src=0)
    if status[0] is not None:
        if env.rank == 0:
            print(f"calibration.collectives: error: {status[0]}", file=sys.stderr)
        return 2
    written = _measure_all(cases, rows, status[1], handles, layout, args, device, apis, writer)
    if env.rank == 0:
        skipped = [c for c, a in apis.items() if a is None]
        print(f"collectives.csv: {written} rows written, {sum(status[1])} already there, of {len(cases)} "
              f"planned -> {Path(args.out) / 'collectives.csv'}"
              + (f"; not supported by {backend}: {', '.join(skipped)}" if skipped else ""))
    return 0


def write_wan(args: argparse.Namespace) -> int:
    """``--iperf``: the [wan] table of a measured link, printed and written to OUT/wan.toml."""
    from perfmodel.hardware.sites import wan_from_iperf
    from perfmodel.core.checks import read_text_file

    ping = read_text_file(args.ping, field="--ping") if args.ping else None
    link = wan_from_iperf(read_text_file(args.iperf, field="--iperf"), latency=args.latency, ping=ping)
    text = (f"[wan]  # {link.source}: {Path(args.iperf).name}\n"
            f"bandwidth = \"{link.bw_bytes_per_s * 8 / 1e9:.6g}Gb/s\"\nlatency = \"{link.latency_s * 1e3:.6g}ms\"\n")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "wan.toml").write_text(text, encoding="utf-8")
    print(text, end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.iperf:
        try:
            return write_wan(args)
        except PerfModelError as exc:
            print(f"calibration.collectives: error: {exc}", file=sys.stderr)
            return 2
    env = dist_env()
    if env is None:
        print(launch_hint(argv), file=sys.stderr)
        return 2
    if env.world_size < 2:
        print("calibration.collectives needs at least 2 processes (torchrun --nproc-per-node 2 ...)",
              file=sys.stderr)
        return 2
    try:
        return run(args, env)
    except PerfModelError as exc:
        print(f"calibration.collectives: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if env.rank == 0:
            print("\ninterrupted: finished rows are kept; rerun the same command to continue",
                  file=sys.stderr)
        return 130
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
