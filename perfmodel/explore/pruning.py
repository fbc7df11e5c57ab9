"""Which jobs of a search to price, in what order: each bounded from below before it is priced,
and skipped when its bound cannot enter the top rows (``price_jobs``).

A root job (``stack_options.JobSpec.root``) is bounded by its ``chunks.Floor``; a job below it by
its root's shortest step, or its own floor where that is higher. Jobs go ``WAVE`` at a time, in
``workers`` processes when worth it; the waves, the table and the counts are the same however
many processes price them (docs/explore.md).
"""

from __future__ import annotations

import contextlib
import heapq
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from itertools import repeat

import numpy as np

from perfmodel.explore.chunks import CHUNK, ORDER_STRIDE, Best, Floor, Job, Ranking, price_job

PARALLEL_MIN = 20_000  # configurations below which a process pool costs more than it saves

def _worker_count(workers: int | None, jobs: list[Job], combos: int) -> int:
    if workers is not None:
        return max(1, min(int(workers), len(jobs)))
    if sum(len(j.space) for j in jobs) * combos < PARALLEL_MIN or "fork" not in multiprocessing.get_all_start_methods():
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cpus, len(jobs)))


def price_jobs(jobs: list[Job], model, opts, ranking: Ranking, *, chunk: int = CHUNK,
               workers: int | None = None) -> Best:
    """All jobs priced (in ``workers`` processes when worth it) and their best rows merged.

    With pruning (``ranking.per_step``) the jobs that bound others come first (``JobSpec.root``,
    and those of a family without a root), by their shortest pipeline (``pipeline_floor``, a lower
    bound on their steps); then the others, by their root's shortest step (a lower bound on theirs,
    configuration by configuration: ``stack_options``; the root's pipeline floor where the root
    was pruned). Both go ``WAVE`` at a time, each job skipped when its bound cannot enter the
    ``top_k`` rows priced so far (its configurations are counted as pruned). The waves are the same however many processes price
    them, and so are the table and the counts. A floor is computed in full only where the order or a
    pruning needs it (``RootQueue``).
    """
    n = _worker_count(workers, jobs, 1)
    best, results = Best(ranking), {}
    with _pool(n) as pool:
        if not ranking.per_step or ranking.sort_by not in PRUNABLE:  # nothing to bound: every job priced
            _wave(jobs, pool, best, results, model, opts, ranking, chunk)
            return best
        families = {j.spec.family + (j.cluster.name,): j.index for j in jobs if j.spec.root}
        first = [j for j in jobs if j.spec.root or j.spec.family + (j.cluster.name,) not in families]
        shared = {}  # pipeline pieces of jobs that differ only in what their data-parallel seconds read
        floors = {j.index: Floor(model, j, opts, chunk, shared) for j in first}
        _waves(RootQueue(first, floors), pool, best, results, model, opts, ranking, chunk, floors)
        started = {j.index for j in first}  # priced or pruned
        rest = {}
        for j in jobs:
            if j.index not in started:
                root = families[j.spec.family + (j.cluster.name,)]
                rest[j.index] = _family_bound(results.get(root), floors.get(root), j.spec.offload_layers)
        for j in jobs:  # below a pruned root: pruned wherever the order puts it (_family_bound)
            if rest.get(j.index, 0.0) is None:
                best.pruned += len(j.space)
        queue = sorted((j for j in jobs if rest.get(j.index) is not None), key=lambda j: (rest[j.index], j.index))
        _waves(FamilyQueue(queue, rest, lambda j: floors.setdefault(j.index, Floor(model, j, opts, chunk, shared))), pool,
               best, results, model, opts, ranking, chunk, floors)
    return best


class FamilyQueue:
    """The jobs below a root, in ascending order of their family's bound (``_family_bound``); a job
    that bound cannot prune is handed out with its own floor where that is higher (``Floor.low``,
    then ``Floor.exact``: a bound on each of its steps, as a root's), which may prune it (full
    recomputation adds a forward to every configuration of the root). The floor's compute times are
    the ones pricing then reads (``step.compute_times`` keeps them per row)."""

    def __init__(self, jobs: list[Job], bounds: dict, floor_of):
        self.jobs, self.bounds, self.floor_of = list(jobs), bounds, floor_of

    def next(self, best: Best):
        """(the next job, its bound), or None when every job was handed out."""
        if not self.jobs:
            return None
        job = self.jobs.pop(0)
        bound = self.bounds[job.index]
        if _prunable(best, bound, job, best.ranking) or not _full(best):
            return job, bound
        floor = self.floor_of(job)
        for own in (lambda: floor.low["all"], lambda: floor.exact()["all"]):
            bound = max(bound, own())
            if _prunable(best, bound, job, best.ranking):
                break
        return job, bound


def _family_bound(root: Best | None, floor: Floor | None, offload: int):
    """The bound of a job below its family's root: the root's shortest step (at pp = 1 for an offload
    job), or its floor where the root was pruned; None where that floor is not known: the root was
    pruned by a lower bound already (``RootQueue``), so the floor, at least as high and finite (the
    configurations are there), prunes this job too when its turn comes."""
    key = "pp1" if offload else "all"
    if root is not None:
        return root.fastest[key]
    if floor.known or not np.isfinite(floor.low[key]):  # no configuration at pp = 1: no bound, as the floor's
        return floor.exact()[key] if floor.known else floor.low[key]
    return None


class RootQueue:
    """The jobs ``price_jobs`` prices first, in ascending order of their floors (a job without one:
    -inf), ties in job order, each floor computed in full only when needed.

    Each ``Floor.low`` is no higher than its floor, so the next job is the one with the lowest
    exact floor once no lower bound of the others is below it; and a job whose lower bound is
    prunable now is pruned now (counted in ``best``): its floor would be when its turn came, since
    the top rows only improve."""

    def __init__(self, jobs: list[Job], floors: dict):
        self.floors, self.known = floors, []  # known: a heap of (floor, index, job)
        self.pending = sorted(jobs, key=lambda j: (self._low(j), j.index))

    def _low(self, job) -> float:
        return self.floors[job.index].low["all"] if job.index in self.floors else -np.inf

    def _exact(self, job) -> float:
        return self.floors[job.index].exact()["all"] if job.index in self.floors else -np.inf

    def next(self, best: Best):
        """(the next job, its floor), or None when every job was handed out or pruned."""
        kept = []
        for j in self.pending:
            if _prunable(best, self._low(j), j, best.ranking):
                best.pruned += len(j.space)
            else:
                kept.append(j)
        self.pending = kept
        while self.pending and (not self.known or (self._low(self.pending[0]), self.pending[0].index) <= self.known[0][:2]):
            j = self.pending.pop(0)
            heapq.heappush(self.known, (self._exact(j), j.index, j))
        if not self.known:
            return None
        floor, _, job = heapq.heappop(self.known)
        return job, floor


PRUNABLE = ("step_time", "tokens_per_second", "samples_per_second", "usd_per_million_tokens")  # a step bounds them
WAVE = 4  # jobs priced between two looks at the top rows (more: fewer looks, less pruning)


def _waves(queue, pool, best: Best, results: dict, model, opts, ranking, chunk, floors: dict) -> None:
    """Price the (job, bound) pairs ``queue`` hands out (ascending bound: a ``RootQueue`` or a
    ``FamilyQueue``) ``WAVE`` jobs at a time, skipping those ``_prunable``; ``floors``: the jobs'
    ``Floor`` where one was computed (``_wave``)."""
    take = queue.next
    more = True
    while more:
        wave = []
        while len(wave) < WAVE:
            got = take(best)
            if got is None:
                more = False
                break
            job, bound = got
            if _prunable(best, bound, job, ranking):
                best.pruned += len(job.space)
            else:
                wave.append(job)
        _wave(wave, pool, best, results, model, opts, ranking, chunk, floors)


def _wave(jobs, pool, best: Best, results: dict, model, opts, ranking, chunk, floors=None) -> None:
    """Price ``jobs`` (in ``pool`` when there is one and two jobs or more) and merge them into ``best``.
    In this process a job priced reads its floor's pieces (``floors``, released once priced: the
    root's result bounds its family from then on); a pool's workers price them again."""
    args = (repeat(model), repeat(opts), repeat(ranking), repeat(chunk))
    own = [(floors or {}).pop(j.index, None) for j in jobs]
    if pool is None or len(jobs) < 2:
        done = list(map(price_job, jobs, *args, own))
    else:
        big_first = sorted(jobs, key=lambda j: -len(j.space))  # the longest jobs start first: even finish
        done = list(pool.map(price_job, big_first, *args))
    for r in done:  # Best's ranking is a total order: the merge order does not matter
        results[r.offset // ORDER_STRIDE] = r
        best.merge(r)


@contextlib.contextmanager
def _pool(n: int):
    if n == 1:
        yield None
        return
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork")) as pool:
        yield pool


def _full(best: Best) -> bool:
    """Whether ``best`` holds its ``top_k`` rows (before that no bound prunes)."""
    return best.rows is not None and best.rows["dp"].size >= best.ranking.top_k


def _prunable(best: Best, step_s: float, job: Job, ranking: Ranking) -> bool:
    """Whether a configuration of ``job`` whose step is at least ``step_s`` would rank below the
    ``top_k`` rows of ``best`` (by more than 1e-9: rounding cannot put it back in)."""
    if best.rows is None or best.rows["dp"].size < ranking.top_k or not np.isfinite(step_s):
        return False
    samples, tokens = ranking.per_step
    tokens_per_s = tokens / step_s
    value = {"step_time": step_s, "tokens_per_second": tokens_per_s, "samples_per_second": samples / step_s,
             "usd_per_million_tokens": (job.usd_per_hour or 0.0) / 3600.0 / tokens_per_s * 1e6}.get(ranking.sort_by)
    if value is None or (ranking.sort_by == "usd_per_million_tokens" and job.usd_per_hour is None):
        return False
    last = float(best.rows[ranking.sort_by][-1])
    return value < last * (1 - 1e-9) if ranking.larger_is_better else value > last * (1 + 1e-9)
