"""Co-located processes: kernel classes and real training steps, alone and together, each side's slowdown.

Run::

    # kernel classes (compute: GEMM, memory: large copy, launch: tiny-op storm) in pairs and threes
    python -m calibration.interference kernels --out interference/kernels.csv --cycles 5
    # training processes (calibration.train's module and step) in mixes of two and three
    python -m calibration.interference train --out interference/train.csv --cycles 5
    # on a host shared with other users: keep only cycles with at most one other active session,
    # odd cycles in reverse order (each alone, then together) so a drift of the load cancels
    python -m calibration.interference train --out interference/train.csv --cycles 5 \
        --max-other-sessions 1 --attempts 4 --alternate
    # only some mixes (here the kernel triples)
    python -m calibration.interference kernels --out interference/triples.csv --cycles 8 \
        --mixes compute+compute+compute memory+memory+memory launch+launch+launch
    # on a GPU: the same mixes as processes (time-sliced by the driver), then as CUDA streams of one
    # process (concurrent, as under MPS); calibration/single_gpu_interference.sh runs both and fits them
    python -m calibration.interference kernels --device cuda --out interference/kernels-processes.csv \
        --phase 0.4 --guard 0.1 --cycles 4
    python -m calibration.interference kernels --streams --out interference/kernels-streams.csv \
        --phase 0.3 --guard 0.05 --cycles 4

Every process runs with one torch thread (``torch.set_num_threads(1)``, ``OMP_NUM_THREADS=1``):
oversubscribed OpenMP thread pools spin and make co-located timings meaningless. The processes of
a mix build and warm up, report ready, then follow one clock started when all are: each cycle is a phase with all of them iterating,
then one phase per job with only that job iterating (the others sleep). A job's slowdown in a
cycle is its mean iteration time in the shared phase over its mean in its solo phase, seconds
apart, so the drift of the host's other load largely cancels; the parent samples ``/proc/stat``
procs_running in every phase, so the other runnable threads on each side are recorded too, and
scans /proc ``SCANS`` times a phase for the other sessions with runnable work and their runnable
processes (``sessions_*``, ``tasks_*``); ``--max-other-sessions`` drops the cycles that saw more
and runs the mix again until ``--cycles`` clean ones are kept (``--attempts`` runs at most). Mean
iteration times, not medians: an iteration shorter than the scheduler's slice is rarely
preempted, and only the mean sees the time spent waiting for a core; each iteration is timed from
the end of the one before it (``worker``), so a wait that begins between two iterations counts.
Cycles are the repeats.
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

from calibration import gpu_interference

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
           "slowdown", "cpu_slowdown", "other_alone", "other_together", "sessions_alone", "sessions_together",
           "tasks_alone", "tasks_together", "iterations", "device", "harness")
SCANS = 4  # scans of /proc per phase for the other sessions (about 6 ms of CPU each)


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
    from perfmodel import Strategy
    from perfmodel.workload.model import transformer

    job = dict(TRAIN_JOBS[name])
    s = Strategy(micro_batch=job.pop("micro_batch"), precision="fp32")
    model = transformer(**job)
    torch.manual_seed(0)
    net = build_module(model, "none")
    ctx = {"rank": 0, "world": 1, "device": "cpu"}
    return make_step(net, make_optimizer(net, s, ctx), s, model, ctx, 0)


def phase_of(t: float, start_at: float, phase_s: float, n_jobs: int, alternate: bool = False) -> tuple[int, int, float]:
    """(cycle, phase, seconds into it) at time ``t``: each cycle is phase 0 (all jobs) then phase
    k + 1 (job k alone) for every job k; ``alternate``: odd cycles run that order backwards (each
    job alone, last first, then all together), so a drift of the host's load that makes one side
    of a cycle slower makes the other side slower in the next (an ABBA order cancels a linear drift)."""
    i = int((t - start_at) // phase_s)
    cycle, phase = i // (n_jobs + 1), i % (n_jobs + 1)
    if alternate and cycle % 2:
        phase = n_jobs - phase
    return cycle, phase, (t - start_at) - i * phase_s


def worker(kind: str, what: str, start_at: float | None, phase_s: float, cycles: int, slot: int, n_jobs: int,
           guard_s: float, alternate: bool = False, device: str = "cpu") -> list[dict]:
    """Warm up, say "ready" and (``start_at`` None) read the start time from stdin, then follow the
    cycle from it: iterate in phase 0 and in its own solo phase,
    sleep in the others' solo phases. Per (cycle, phase) it reports wall and CPU seconds and the
    count of the iterations that started ``guard_s`` after the phase began and ended inside it
    (a process going to sleep finishes its iteration first: the guard keeps that overlap out),
    each iteration timed from the end of the last one in its phase (``device`` "cuda": the GPU's
    kernel classes, training steps stay on the CPU)."""
    import torch

    torch.set_num_threads(1)
    if what != "kernel":
        fn = _train_step(kind)
    else:  # on a GPU its own sizes, each iteration synchronised (calibration.gpu_interference)
        fn = _kernel(kind) if device == "cpu" else gpu_interference.cuda_kernel(kind)
    for _ in range(3):
        fn()
    if start_at is None:  # the parent starts the clock once every process of the mix is warm
        print("ready", flush=True)
        start_at = float(sys.stdin.readline())
    end = start_at + cycles * (n_jobs + 1) * phase_s
    sums: dict = {}
    mark = None  # (cycle, phase), wall and CPU clocks at the end of the last iteration
    while (now := time.time()) < end:
        if now < start_at:
            time.sleep(min(start_at - now, 0.01))
            continue
        cycle, phase, into = phase_of(now, start_at, phase_s, n_jobs, alternate)
        if phase not in (0, slot + 1):
            mark = None
            time.sleep(min(phase_s - into, 0.01))
            continue
        # chained: an iteration is timed from the end of the one before it in the same phase, so a
        # wait for a core between two iterations counts (reading the CPU clock runs the scheduler's
        # update_curr, which can end the slice there: Linux kernel/sched/core.c task_sched_runtime,
        # kernel/sched/fair.c update_curr -> update_deadline; timed alone, such a wait fell
        # outside both clocks of every short iteration)
        t0, c0 = mark[1:] if mark and mark[0] == (cycle, phase) else (time.perf_counter(), time.process_time())
        fn()
        t1 = time.perf_counter()
        c1 = time.process_time()
        mark = ((cycle, phase), t1, c1)
        wall, cpu = t1 - t0, c1 - c0
        if into >= guard_s and into + wall <= phase_s:
            acc = sums.setdefault((cycle, phase), [0.0, 0.0, 0])
            acc[0], acc[1], acc[2] = acc[0] + wall, acc[1] + cpu, acc[2] + 1
    return [{"cycle": c, "phase": ph, "wall_s": w, "cpu_s": u, "n": n} for (c, ph), (w, u, n) in sorted(sums.items())]


def _other_load(own: int) -> tuple[int, int]:
    """(sessions, processes) other than ``own`` running or runnable: under the kernel's autogroup
    scheduling (``/proc/sys/kernel/sched_autogroup_enabled``) each such session gets an equal share
    of the cores, whatever its number of processes; the processes say how many of those sessions
    spread over several cores (the load balancer can move a one-process session off ours, not a
    session that holds every core)."""
    active: dict = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "R" and int(fields[3]) != own:
            active[int(fields[3])] = active.get(int(fields[3]), 0) + 1
    return len(active), sum(active.values())


def runnable_threads(start_at: float, phase_s: float, cycles: int, n_jobs: int, period_s: float = 0.1,
                     alternate: bool = False) -> dict:
    """Per (cycle, phase): mean /proc/stat ``procs_running`` less this sampling process, and the
    mean count of other sessions with runnable work and of their runnable processes (``SCANS``
    scans a phase: a scan of /proc costs about 6 ms of this session's own share)."""
    end = start_at + cycles * (n_jobs + 1) * phase_s
    running: dict = {}
    sessions: dict = {}
    own = os.getsid(0)
    while (now := time.time()) < end:
        if now >= start_at:
            with open("/proc/stat") as f:
                line = next((x for x in f if x.startswith("procs_running")), "procs_running 1")
            cycle, phase, into = phase_of(now, start_at, phase_s, n_jobs, alternate)
            running.setdefault((cycle, phase), []).append(int(line.split()[1]) - 1)
            scans = sessions.setdefault((cycle, phase), [])
            if len(scans) < SCANS and into >= phase_s * (len(scans) + 1) / (SCANS + 1):
                scans.append(_other_load(own))
        time.sleep(period_s)
    out = {}
    for k, v in running.items():
        scans = np.asarray(sessions.get(k) or [(0, 0)], float)
        out[k] = (float(np.mean(v)), float(scans[:, 0].mean()), float(scans[:, 1].mean()))
    return out


# --- the parent --------------------------------------------------------------------------------


def run_mix(kinds, what: str, *, phase_s: float, cycles: int, setup_s: float, guard_s: float,
            alternate: bool = False, device: str = "cpu") -> list[dict]:
    """One process per entry of ``kinds`` through the cycles (started ``setup_s`` after the last one
    reports ready; ``alternate``: odd cycles in the reverse order, ``phase_of``); one row per (job, cycle)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    n = len(kinds)
    procs = [subprocess.Popen([sys.executable, "-m", "calibration.interference", "worker", "--kind", k,
                               "--what", what, "--phase", str(phase_s), "--cycles", str(cycles), "--slot", str(i),
                               "--jobs", str(n), "--guard", str(guard_s)] + ["--alternate"] * alternate
                              + ["--device", device] * (device != "cpu"), env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, k in enumerate(kinds)]
    for p in procs:
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"worker failed before its first phase: {p.stderr.read().strip().splitlines()[-1:]}")
    start_at = time.time() + setup_s
    for p in procs:
        p.stdin.write(f"{start_at!r}\n")
        p.stdin.flush()
    running = runnable_threads(start_at, phase_s, cycles, n, alternate=alternate)
    label = gpu_interference.device_name() if device == "cuda" else device
    rows = []
    for slot, (k, p) in enumerate(zip(kinds, procs)):
        stdout, stderr = p.communicate(timeout=setup_s + cycles * (n + 1) * phase_s + 300)
        stdout = stdout.strip().splitlines()[-1:] or ["[]"]
        if p.returncode != 0:
            raise RuntimeError(f"worker failed ({p.returncode}): {stderr.strip().splitlines()[-1:]}")
        got = {(r["cycle"], r["phase"]): r for r in json.loads(stdout[0])}
        for c in range(cycles):
            both, alone = got.get((c, 0)), got.get((c, slot + 1))
            if not both or not alone or not both["n"] or not alone["n"]:
                continue  # no whole iteration inside a phase: nothing to compare this cycle
            wall_t, wall_a = both["wall_s"] / both["n"], alone["wall_s"] / alone["n"]
            cpu_t, cpu_a = both["cpu_s"] / both["n"], alone["cpu_s"] / alone["n"]
            # the host's other runnable threads: all but the mix's n (together) or this job (alone)
            rows.append({"mix": "+".join(kinds), "job": k, "slot": slot, "repeat": c,
                         "wall_alone_s": wall_a, "wall_together_s": wall_t, "cpu_alone_s": cpu_a,
                         "cpu_together_s": cpu_t, "slowdown": wall_t / wall_a, "cpu_slowdown": cpu_t / cpu_a,
                         "other_alone": round(max(running.get((c, slot + 1), (1.0, 0, 0))[0] - 1.0, 0.0), 3),
                         "other_together": round(max(running.get((c, 0), (n, 0, 0))[0] - n, 0.0), 3),
                         "sessions_alone": round(running.get((c, slot + 1), (0, 0.0, 0.0))[1], 3),
                         "sessions_together": round(running.get((c, 0), (0, 0.0, 0.0))[1], 3),
                         "tasks_alone": round(running.get((c, slot + 1), (0, 0.0, 0.0))[2], 3),
                         "tasks_together": round(running.get((c, 0), (0, 0.0, 0.0))[2], 3),
                         "iterations": both["n"], "device": label, "harness": "processes"})
    return rows


def loaded_cycles(rows: list[dict], max_sessions: float | None) -> set:
    """Cycles of one mix in which any phase counted more than ``max_sessions`` other sessions on
    average (None: none is loaded): the whole cycle goes, both sides of every job."""
    if max_sessions is None:
        return set()
    return {r["repeat"] for r in rows if max(r["sessions_alone"], r["sessions_together"]) > max_sessions}


def measure(mixes, what: str, *, phase_s: float, cycles: int, setup_s: float, guard_s: float,
            max_sessions: float | None = None, attempts: int = 1, alternate: bool = False, log=print,
            device: str = "cpu", streams: bool = False) -> list[dict]:
    """Every mix of two or more jobs through ``cycles`` cycles; rows per job and cycle. With
    ``max_sessions``, cycles whose phases saw more other sessions are dropped and the mix run again
    (up to ``attempts`` runs) until ``cycles`` clean cycles are kept; repeats number the kept ones.
    ``device`` "cuda": the GPU's kernel classes; ``streams``: each mix in one process, one CUDA
    stream per class (``calibration.gpu_interference.measure_streams``) instead of processes."""
    rows = []
    for mix in mixes:
        if len(mix) < 2:
            continue
        kept: list = []
        for attempt in range(attempts):
            got = (_stream_rows(mix, phase_s, cycles, guard_s, alternate) if streams else
                   run_mix(mix, what, phase_s=phase_s, cycles=cycles, setup_s=setup_s, guard_s=guard_s,
                           alternate=alternate, device=device))
            drop = loaded_cycles(got, max_sessions)
            clean = sorted({r["repeat"] for r in got} - drop)[:cycles - len({r["repeat"] for r in kept})]
            base = len({r["repeat"] for r in kept})
            kept += [{**r, "repeat": base + clean.index(r["repeat"])} for r in got if r["repeat"] in clean]
            if drop:
                log(f"{'+'.join(mix)}: run {attempt + 1} dropped {len(drop)} cycles with over {max_sessions:g} "
                    "other sessions")
            if len({r["repeat"] for r in kept}) >= cycles:
                break
        rows += kept
        for slot, k in enumerate(mix):
            mine = [r for r in kept if r["slot"] == slot]
            med = float(np.median([r["slowdown"] for r in mine])) if mine else float("nan")
            cpu = float(np.median([r["cpu_slowdown"] for r in mine])) if mine else float("nan")
            log(f"{'+'.join(mix)}: {k} x{med:.3f} wall, x{cpu:.3f} cpu over {len(mine)} cycles")
    return rows


def _stream_rows(mix, phase_s: float, cycles: int, guard_s: float, alternate: bool) -> list[dict]:
    name = gpu_interference.device_name()
    return [{**r, "device": name, "harness": "streams"}
            for r in gpu_interference.measure_streams(mix, phase_s=phase_s, cycles=cycles, guard_s=guard_s,
                                                      alternate=alternate)]


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
    p.add_argument("--phase", type=float, default=None, help="seconds per phase (kernels 1, train 2)")
    p.add_argument("--cycles", type=int, default=5, help="cycles per mix (each: all together, then each alone)")
    p.add_argument("--setup", type=float, default=0.5, help="seconds between the last process ready and the first cycle")
    p.add_argument("--guard", type=float, default=None, help="seconds at each phase start left unmeasured")
    p.add_argument("--max-other-sessions", type=float, default=None,
                   help="drop cycles whose phases saw more other sessions with runnable work (default: keep all)")
    p.add_argument("--attempts", type=int, default=1, help="runs of a mix to gather --cycles clean cycles")
    p.add_argument("--alternate", action="store_true",
                   help="odd cycles run their phases in reverse order (each alone, then together): ABBA")
    p.add_argument("--mixes", nargs="+", default=None,
                   help="only these mixes, each as its jobs joined by '+' (e.g. compute+compute+compute)")
    p.add_argument("--kind", default=None)
    p.add_argument("--what", default="kernel", choices=["kernel", "train"])
    p.add_argument("--slot", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where the kernel classes run (cuda: bf16 8192^3 GEMM, 1 GiB copy, tiny-kernel storm)")
    p.add_argument("--streams", action="store_true",
                   help="kernels on a GPU: each mix in one process, one CUDA stream per class (implies --device cuda)")
    args = p.parse_args(argv)
    device = "cuda" if args.streams else args.device
    if device == "cuda" and args.command != "worker":
        if args.command == "train":
            p.error("--device cuda / --streams apply to 'kernels' only")
        try:
            gpu_interference.require_cuda()
        except RuntimeError as e:
            p.exit(2, f"{p.prog}: {e}\n")
    train = args.command == "train" or (args.command == "worker" and args.what == "train")
    phase = args.phase or (2.0 if train else 1.0)
    guard = args.guard if args.guard is not None else (0.4 if train else 0.15)
    if args.command == "worker":
        print(json.dumps(worker(args.kind, args.what, None, phase, args.cycles, args.slot, args.jobs, guard,
                                args.alternate, device)))
        return 0
    if not args.out:
        p.error("--out is required")
    known = KERNEL_MIXES if args.command == "kernels" else TRAIN_MIXES
    mixes = known if args.mixes is None else [tuple(m.split("+")) for m in args.mixes]
    unknown = [m for m in mixes if m not in known]
    if unknown:
        p.error(f"unknown mixes {['+'.join(m) for m in unknown]} (valid: {', '.join('+'.join(m) for m in known)})")
    what = "kernel" if args.command == "kernels" else "train"
    if what == "train":
        jobs = Path(args.out).with_name("jobs.json")  # the jobs' models and micro-batches, for predicting them
        jobs.parent.mkdir(parents=True, exist_ok=True)
        jobs.write_text(json.dumps({k: {**v, "precision": "fp32", "threads": 1} for k, v in TRAIN_JOBS.items()},
                                   indent=1) + "\n")
    rows = []
    for mix in mixes:  # written after every mix: an interrupted run keeps every mix it finished
        rows += measure([mix], what, phase_s=phase, cycles=args.cycles, setup_s=args.setup, guard_s=guard,
                        max_sessions=args.max_other_sessions, attempts=args.attempts, alternate=args.alternate,
                        device=device, streams=args.streams)
        write(args.out, rows, COLUMNS)
    write(args.out, rows, COLUMNS)
    print(f"{len(rows)} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
