"""Breadth-first looped pipelines as torch.distributed.pipelining runs them (torch 2.13 ``ScheduleLoopedBFS``).

Lamy-Poirier 2023 ("Breadth-First Pipeline Parallelism", arXiv 2211.05953) loops each rank over v model chunks
as interleaved 1F1B does, but breadth first: rank r runs the forwards of every micro-batch through its first
chunk, then through its second, ..., then every backward, last chunk first (torch's
``ScheduleLoopedBFS._calculate_single_rank_operations``; torchtitan names it ``"LoopedBFS"`` in
``parallelism.pipeline_parallel_schedule``). Run with a chunk's forward f and backward b as durations (the
order of every rank, each action when its rank is free and its input has arrived), the step is

    m·v·(f + b) + (p − 1)(f + b) + (v − 1)·max(p − m, 0)·(f + b)

with m micro-batches on p ranks (``tests/test_looped_bfs.py`` runs torch's orders for random p, m, v, f, b and
checks it exactly): interleaved 1F1B's step where m >= p, and where m < p each of the v − 1 later chunk passes
waits p − m slots for its first input, in the forwards and again in the backwards. Every rank holds all m·v
chunk forwards before its first backward: m micro-batches of its layers, as GPipe. Same time, more memory: where
interleaved 1F1B runs, it is never slower, so search does not try this schedule.
"""

from __future__ import annotations

import numpy as np

from perfmodel.core.errors import InvalidInputError
from perfmodel.parallel.zero_bubble import check_torch_pipelining

LOOPED_BFS = "looped-bfs"
TORCH_NAME = "ScheduleLoopedBFS"


def late_chunk_waits(pp, micro_batches, virtual_stages):
    """Slots of a stage's chunk work (a chunk's f + b each) that the v − 1 later chunk passes wait for their first
    input when there are fewer micro-batches than ranks: (v − 1)·max(p − m, 0) (numbers or arrays)."""
    return (np.asarray(virtual_stages, float) - 1.0) * np.maximum(np.asarray(pp, float) - micro_batches, 0.0)


def check_looped_bfs(schedule: str, framework: str, pp: int, virtual_stages: int) -> None:
    """torch's breadth-first schedule: its own pipelining (torchtitan, plain PyTorch), pp > 1, v >= 2 chunks."""
    if schedule != LOOPED_BFS:
        return
    name = check_torch_pipelining(schedule, TORCH_NAME, framework)
    if pp < 2 or virtual_stages < 2:
        raise InvalidInputError(f"{name} needs pp > 1 and model chunks in a loop: virtual_stages >= 2 (got pp={pp}, "
                                f"virtual_stages={virtual_stages}; one chunk per rank is schedule='gpipe')")
