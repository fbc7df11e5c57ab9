"""How one operation is timed: batches of back-to-back calls, median over repeats.

GPU, eager: CUDA events around a batch of ``inner`` back-to-back calls, with
``inner`` chosen so a batch lasts at least ``target_batch_s`` (0.2 ms); the
time per call is the batch time / ``inner``. It includes whatever the host
adds between launches, as a training step in eager PyTorch does, so a tiny
kernel shows the per-launch cost. All events of all repeats are recorded
before one synchronisation.

GPU, graph: ``graph_calls`` calls captured in one CUDA graph and replayed;
time per call = replay time / ``graph_calls``: GPU time alone, launch gaps
removed.

CPU: ``time.perf_counter`` around the same batches.

Inputs are rotated among ``len(calls)`` copies (built by the caller when one
copy fits in the L2 cache) so a call does not find its operands cached by the
previous one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

TARGET_BATCH_S = 2e-4  # a timed batch lasts at least 0.2 ms
MAX_INNER = 4096
GRAPH_CALLS = 20


@dataclass(frozen=True)
class Timing:
    """Seconds per call over ``reps`` batches of ``inner`` calls."""

    median_s: float
    min_s: float
    p90_s: float
    reps: int
    inner: int

    def busy_s(self, warmup: int) -> float:
        """Seconds the measurement kept the device busy (warm-up, probe and timed calls)."""
        return self.median_s * (warmup + 1 + self.reps * self.inner)

    @classmethod
    def from_batches(cls, per_call_s: Sequence[float], inner: int) -> Timing:
        t = np.asarray(per_call_s, dtype=float)
        return cls(float(np.median(t)), float(t.min()), float(np.percentile(t, 90)), len(t), inner)


@dataclass(frozen=True)
class Plan:
    """How much timing one case gets."""

    max_reps: int = 10
    min_reps: int = 3
    case_budget_s: float = 0.15  # reps are cut so a case's batches take about this long
    target_batch_s: float = TARGET_BATCH_S
    warmup: int = 2
    # GPU: idle ``cooldown`` times the previous case's busy seconds (at most ``cooldown_max_s``) before
    # a case, so each row starts from a comparable power state: back-to-back tensor-core load meets
    # the board's power limit, and rows measured after heavy ones ran up to ~20% slower (H200 tables)
    cooldown: float = 0.0
    cooldown_max_s: float = 2.0

    def idle_before(self, previous_busy_s: float) -> float:
        """Seconds to idle before the next case after one that kept the device busy this long."""
        return min(self.cooldown_max_s, self.cooldown * max(previous_busy_s, 0.0))


def _reps(plan: Plan, batch_s: float) -> int:
    fit = int(plan.case_budget_s / max(batch_s, 1e-9))
    return max(plan.min_reps, min(plan.max_reps, fit))


def _inner(plan: Plan, call_s: float) -> int:
    return max(1, min(MAX_INNER, math.ceil(plan.target_batch_s / max(call_s, 1e-9))))


def time_cpu(calls: Sequence[Callable[[], object]], plan: Plan) -> Timing:
    """Median seconds per call with ``time.perf_counter`` (CPU tensors)."""
    n = len(calls)
    for i in range(max(plan.warmup, 1)):
        calls[i % n]()
    t0 = time.perf_counter()
    calls[0]()
    one = time.perf_counter() - t0
    inner = _inner(plan, one)
    per_call, i = [], 0
    for _ in range(_reps(plan, one * inner)):
        t0 = time.perf_counter()
        for _ in range(inner):
            calls[i % n]()
            i += 1
        per_call.append((time.perf_counter() - t0) / inner)
    return Timing.from_batches(per_call, inner)


def _events(count: int) -> list[tuple[torch.cuda.Event, torch.cuda.Event]]:
    return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(count)]


def _time_one_cuda(call: Callable[[], object]) -> float:
    start, end = _events(1)[0]
    start.record()
    call()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds


def time_cuda(calls: Sequence[Callable[[], object]], plan: Plan) -> Timing:
    """Median seconds per call from CUDA events around batches of eager calls."""
    n = len(calls)
    for i in range(max(plan.warmup, 1)):
        calls[i % n]()
    torch.cuda.synchronize()
    one = _time_one_cuda(calls[0])
    inner = _inner(plan, one)
    events, i = _events(_reps(plan, one * inner)), 0
    for start, end in events:
        start.record()
        for _ in range(inner):
            calls[i % n]()
            i += 1
        end.record()
    torch.cuda.synchronize()
    return Timing.from_batches([s.elapsed_time(e) / 1e3 / inner for s, e in events], inner)


def time_cuda_graph(calls: Sequence[Callable[[], object]], plan: Plan,
                    graph_calls: int = GRAPH_CALLS) -> Timing:
    """Median seconds per call inside a CUDA graph of ``graph_calls`` calls."""
    n = len(calls)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture (lazy init, workspaces)
        for i in range(max(plan.warmup, 1)):
            calls[i % n]()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(graph_calls):
            calls[i % n]()
    graph.replay()
    torch.cuda.synchronize()
    one = _time_one_cuda(graph.replay)
    inner = _inner(plan, one)
    events = _events(_reps(plan, one * inner))
    for start, end in events:
        start.record()
        for _ in range(inner):
            graph.replay()
        end.record()
    torch.cuda.synchronize()
    per_call = [s.elapsed_time(e) / 1e3 / inner / graph_calls for s, e in events]
    del graph
    return Timing.from_batches(per_call, inner * graph_calls)


def measure(calls: Sequence[Callable[[], object]], device: str, timing: str, plan: Plan) -> Timing:
    """Time ``calls`` (rotated) on ``device`` with ``timing`` 'eager' or 'graph'."""
    if timing == "graph":
        return time_cuda_graph(calls, plan)
    if device.startswith("cuda"):
        return time_cuda(calls, plan)
    return time_cpu(calls, plan)
