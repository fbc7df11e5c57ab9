"""Kernel classes on a CUDA GPU, and two CUDA streams in one process, alone and together.

``cuda_kernel(kind)``: the GPU's kernel classes, sized to its units (compute: a bf16 8192^3 GEMM,
about 1.1 TFLOP, enough CTAs to fill every SM; memory: a 1 GiB copy, far beyond any L2; launch:
a storm of 50 tiny adds, bound by the host's issue rate). Each iteration ends with
``torch.cuda.synchronize()``, so its wall time is the kernels' (the process harness of
``calibration.interference`` then times them as it times CPU ones; between processes the
driver time-slices by default).

``measure_streams``: each class of a mix on its own CUDA stream of one process, the MPS-like
concurrent regime without an MPS daemon. A phase enqueues about ``phase_s`` seconds of each
stream's iterations (interleaved on the one host thread by their solo times, so every stream's
queue front stays at the same predicted time) with a CUDA event after each; the events' device
times give each iteration's end. A stream's mean iteration time counts the iterations that start
``guard_s`` after the phase began and end before the first stream of the phase runs dry (so all
of the mix overlap for all of it). Each cycle: all streams together, then each alone; the rows
are those of the process harness (``slowdown`` = together / alone), ``harness`` "streams".
"""

from __future__ import annotations

import numpy as np

GEMM_N = 8192              # bf16 GEMM side: 2 * 8192^3 = 1.1 TFLOP, 64 x 32 tiles of 128 x 256 fill 132 SMs
COPY_BYTES = 2**30         # 1 GiB: 20x an H100/H200's 50 MiB L2
STORM = 50                 # tiny kernels per launch-storm iteration
SIZING = 10                # iterations timed alone to size a phase's enqueued work


def require_cuda():
    """torch with a usable CUDA device, or a clear error saying why not."""
    try:
        import torch
    except ImportError:
        raise RuntimeError("--device cuda needs torch (pip install torch)") from None
    if not torch.cuda.is_available():
        raise RuntimeError(f"--device cuda needs a CUDA GPU: torch {torch.__version__} reports none "
                           f"(torch.version.cuda={torch.version.cuda}); use --device cpu")
    return torch


def cuda_kernel(kind: str, sync: bool = True, stream=None):
    """One iteration of class ``kind`` on the current GPU (``sync``: wait for it; ``stream``: enqueue there)."""
    torch = require_cuda()
    dev = torch.device("cuda")
    if kind == "compute":
        a = torch.randn(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)
        b = torch.randn(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)
        out = torch.empty(GEMM_N, GEMM_N, device=dev, dtype=torch.bfloat16)

        def body():
            torch.mm(a, b, out=out)
    elif kind == "memory":
        src = torch.empty(COPY_BYTES // 2, device=dev, dtype=torch.bfloat16).normal_()
        dst = torch.empty_like(src)

        def body():
            dst.copy_(src)
    elif kind == "launch":
        x = torch.ones(16, device=dev)

        def body():
            for _ in range(STORM):
                x.add_(1.0)
    else:
        raise ValueError(f"kernel class {kind!r} unknown (valid: compute, memory, launch)")

    def step():
        with torch.cuda.stream(stream if stream is not None else torch.cuda.current_stream()):
            body()
        if sync:
            torch.cuda.synchronize()
    return step


def interleave(solo_s, phase_s: float) -> list[int]:
    """The order to enqueue about ``phase_s`` seconds of each stream's iterations (``solo_s``: one
    iteration's seconds alone): always the stream whose enqueued work ends earliest, so the queue
    fronts advance together."""
    solo = [float(s) for s in solo_s]
    if not solo or min(solo) <= 0:
        raise ValueError(f"solo iteration times must be > 0: got {solo_s!r}")
    ahead = [0.0] * len(solo)
    order = []
    while min(ahead) < phase_s:
        i = int(np.argmin(ahead))
        order.append(i)
        ahead[i] += solo[i]
    return order


def window_means(ends, guard_s: float):
    """Per stream (mean iteration seconds, count) from each stream's iteration end times (seconds
    after the phase's start event): iterations chained from the end of the one before (the first
    from 0), counted where they start at or after ``guard_s`` and end by the earliest last end of
    any stream (the window in which every stream of the phase had work). (nan, 0) where none does."""
    window = min(e[-1] for e in ends) if all(len(e) for e in ends) else 0.0
    out = []
    for e in ends:
        starts = np.r_[0.0, np.asarray(e, float)[:-1]]
        keep = (starts >= guard_s) & (np.asarray(e, float) <= window + 1e-12)
        n = int(keep.sum())
        out.append((float((np.asarray(e, float)[keep] - starts[keep]).sum() / n) if n else float("nan"), n))
    return out


def _phase(torch, steps, streams, solo_s, phase_s: float, guard_s: float):
    """Run one phase of the streams ``steps`` (indices into them) and return ``window_means``."""
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    for s in streams:
        s.wait_event(start)
    events: list = [[] for _ in steps]
    for i in interleave(solo_s, phase_s):
        steps[i]()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(streams[i])
        events[i].append(ev)
    torch.cuda.synchronize()
    ends = [[start.elapsed_time(ev) / 1e3 for ev in evs] for evs in events]
    return window_means(ends, guard_s)


def measure_streams(mix, *, phase_s: float, cycles: int, guard_s: float, alternate: bool = False) -> list[dict]:
    """Rows of ``mix`` (classes) on one stream each, through ``cycles`` cycles (``alternate``:
    odd cycles each alone first, then together); the process harness's columns."""
    torch = require_cuda()
    streams = [torch.cuda.Stream() for _ in mix]
    steps = [cuda_kernel(k, sync=False, stream=s) for k, s in zip(mix, streams)]
    solo = []
    for step, stream in zip(steps, streams):  # warm up, then one iteration's seconds alone, to size the phases
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        t0 = torch.cuda.Event(enable_timing=True)
        t1 = torch.cuda.Event(enable_timing=True)
        t0.record(stream)
        for _ in range(SIZING):
            step()
        t1.record(stream)
        torch.cuda.synchronize()
        solo.append(max(t0.elapsed_time(t1) / (1e3 * SIZING), 1e-6))
    rows = []
    for c in range(cycles):
        order = ["all"] + list(range(len(mix)))
        together, alone = {}, {}
        for what in (order[::-1] if alternate and c % 2 else order):
            if what == "all":
                got = _phase(torch, steps, streams, solo, phase_s, guard_s)
                together = dict(enumerate(got))
            else:
                alone[what] = _phase(torch, [steps[what]], [streams[what]], [solo[what]], phase_s, guard_s)[0]
        rows += stream_rows(mix, c, together, alone)
    return rows


def stream_rows(mix, repeat: int, together: dict, alone: dict) -> list[dict]:
    """The harness's rows of one cycle from {slot: (mean s, count)} together and alone; a slot
    with no counted iteration on either side is left out."""
    rows = []
    for slot, kind in enumerate(mix):
        (wall_t, n_t), (wall_a, n_a) = together.get(slot, (np.nan, 0)), alone.get(slot, (np.nan, 0))
        if not n_t or not n_a:
            continue
        rows.append({"mix": "+".join(mix), "job": kind, "slot": slot, "repeat": repeat, "wall_alone_s": wall_a,
                     "wall_together_s": wall_t, "cpu_alone_s": float("nan"), "cpu_together_s": float("nan"),
                     "slowdown": wall_t / wall_a, "cpu_slowdown": float("nan"), "other_alone": 0.0,
                     "other_together": 0.0, "sessions_alone": float("nan"), "sessions_together": float("nan"),
                     "tasks_alone": float("nan"), "tasks_together": float("nan"), "iterations": n_t})
    return rows


def device_name() -> str:
    """The current CUDA device's name (for the rows' ``device`` column)."""
    return require_cuda().cuda.get_device_name(0)
