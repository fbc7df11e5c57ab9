"""Price a search space in bounded memory: chunks of configurations, the best rows kept, processes shared.

``search`` hands over one ``Job`` per (cluster, software stack, context-parallel size): its space
of numeric configurations, held as a factored grid (``space.Factored``). Each job is priced on
whole grid rows, ``chunk`` grid cells at a time, under every (precision, recompute) with
``step.evaluate`` (the code ``predict`` runs), and only the
``top_k`` best feasible rows, the counts and the configuration nearest to fitting are kept.
Large searches share the jobs among processes (fork: nothing to re-import); rows carry their
enumeration order, so the ranking (ties: less memory, then enumeration order) is the same
however the jobs were shared.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from itertools import repeat

import numpy as np

from perfmodel import step as compose
from perfmodel.core.memo import IdentityMemo
from perfmodel.explore.space import NUMERIC, Space
from perfmodel.parallel.config import MIB, StepConfig
from perfmodel.interval import bounds
from perfmodel.costs.host import HostCosts
from perfmodel.parallel.data import DataParallelWork, _stage_exposed
from perfmodel.parallel.deepspeed import reduce_seconds
from perfmodel.parallel.fabric import cluster_collectives, parameter_server_links
from perfmodel.parallel.pipeline import Stage
from perfmodel.parallel.wire import wire_bytes
from perfmodel.predict import BREAKDOWN_KEYS, finish
from perfmodel.workload import stacks

CHUNK = 65_536  # grid cells priced per call: a default space's largest job (47,376 cells) in one call, a few MB of columns
PARALLEL_MIN = 20_000  # configurations below which a process pool costs more than it saves
RESULTS = ("step_time", "tokens_per_second", "samples_per_second", "tflops_per_gpu", "mfu", "peak_memory",
           "memory_capacity", "fits", "over_capacity")
ORDER_STRIDE = 2**40  # enumeration order = job index × stride + row within the job


@dataclass(frozen=True)
class Job:
    """One space to price: its index (enumeration order), cluster, profile, $/hour, the stack's
    columns, the space, its ``stack_options.JobSpec`` (precision, recompute, family) and the
    ``Strategy`` whose fields the space does not vary."""

    index: int
    cluster: object
    profile: object
    usd_per_hour: float | None
    stack: dict
    space: Space
    spec: object
    base: object


@dataclass(frozen=True)
class Ranking:
    top_k: int
    sort_by: str
    larger_is_better: bool
    per_step: tuple | None = None  # (samples, tokens) per step, for pruning jobs (price_jobs); None: no pruning


def _parts(space: Space, chunk: int) -> list:
    """(grid rows, their configurations' flat columns) of ``chunk`` grid cells or fewer at a time; kept
    with the space (derived from its frozen fields), so the jobs priced over it share them and the
    parts' cell indices."""
    kept = space.__dict__.setdefault("_parts", {})
    if chunk not in kept:
        kept[chunk] = _split(space, chunk)
    return kept[chunk]


def _split(space: Space, chunk: int) -> list:
    grid = space.grid()
    per_row = max(1, int(np.prod(grid.mask.shape[1:])))
    step = max(1, chunk // per_row)
    parts = []
    for lo in range(0, grid.mask.shape[0], step):
        part = grid.rows(lo, lo + step)
        parts.append((part, {k: part.flat(part.columns[k]) for k in NUMERIC}))
    return parts


class Columns(dict):
    """A chunk's columns, one entry per configuration; ``rest(cells)`` gives the other columns at those
    configurations only (the rows a ranking keeps: ``Best.add``)."""

    def __init__(self, columns: dict, rest=None):
        super().__init__(columns)
        self.rest = rest


def chunks(model, job: Job, opts, chunk: int, eager=None):
    """Column dicts of ``chunk`` grid cells of the job's space at a time, under its precision and recompute.

    Each part is priced on its factored grid (``space.Factored``: a term is computed on the axes it
    depends on) and its valid cells are read out in enumeration order: the same arithmetic on the
    same numbers as pricing the flat configurations one by one. ``eager`` names the result columns read
    out for every configuration (None: all); the others come from ``Columns.rest``.
    """
    cl, space, prof, stack = job.cluster, job.space, job.profile, job.stack
    coll = _collectives(cl, prof)
    parts = _parts(space, chunk)
    for precision, recompute in ((job.spec.precision, job.spec.recompute),):
        for (part, numeric), c in zip(parts, _configs(job, parts)):
            out = compose.evaluate(model, cl, prof, coll, c, precision=precision, recompute=recompute,
                                   optimizer=opts["optimizer"], placement=opts["placement"])
            out["micro_batch"] = c.micro_batch
            # elementwise on the grid, as on its configurations
            grid = {**out, **finish(model, cl, space.global_batch, out, precision, recompute, cl.n_gpus)}
            grid.update({"mem_" + k: v for k, v in out["memory"].items()})
            names = [*RESULTS, *BREAKDOWN_KEYS, *("mem_" + k for k in out["memory"])]
            now = names if eager is None else [k for k in names if k in eager]
            m = numeric["dp"].size
            cols = Columns({**numeric, **{k: np.broadcast_to(part.flat(grid[k]), (m,)) for k in now}},
                           functools.partial(_later_columns, part, grid, [k for k in names if k not in now]))
            yield cols, functools.partial(_row_columns, model, cl, prof, precision, recompute, stack, opts["level"])


def _later_columns(part, grid: dict, names: list, cells: np.ndarray) -> dict:
    """The columns ``names`` of the grid's arrays at the part's configurations ``cells``."""
    return {k: np.broadcast_to(part.at(grid[k], cells), cells.shape) for k in names}


def _configs(job: Job, parts: list) -> list:
    """The parts' configurations as ``step.evaluate`` takes them: the fields search does not vary
    (framework, compile, offload, no parameter server...) as the job's Strategy has them."""
    return [replace(StepConfig.from_space(part.columns, job.base),
                    bucket_bytes=part.columns["bucket_mib"] * MIB, dp_overlap=part.columns["dp_overlap"])
            for part, _ in parts]


def pipeline_floor(model, job: Job, opts, chunk: int) -> dict:
    """The job's shortest pipeline seconds plus its first stage's exposed data-parallel seconds,
    over all its configurations and over those at pp = 1.

    ``step._assemble`` adds sends, exposed data-parallel, optimizer and engine seconds (none
    negative) to the pipeline's, and ``dp_comm_time`` takes the worst stage, the first (index 0,
    no drain slack) among them; so no configuration's step is shorter: a bound ``price_jobs`` can
    prune a whole job with before it prices the other stages' reductions and the memory. The
    pieces are priced by the calls ``step.step_quantities`` makes (tests/test_search_stacks.py
    holds the floor at pp = 1 equal to ``step.evaluate``'s pipeline + dp_comm there).

    A stack with an engine (DeepSpeed) bounds its family by its step less its host seconds
    (``Best.fastest``), so its floor bounds that: the pipeline less the host seconds inside it
    (``step._outputs``' ``host_overhead``; the engine's own host seconds are in both the step and
    what it subtracts), plus the first stage's reduction as the engine runs it (``_engine_exposed``).
    """
    return Floor(model, job, opts, chunk).exact()


class Floor:
    """A job's ``pipeline_floor`` in two steps from the same pieces: ``low``, the pipeline's seconds
    alone (no higher, and without any data-parallel pricing), then ``exact()``, with the first stage's
    exposed data-parallel seconds added (computed once, when asked for)."""

    def __init__(self, model, job: Job, opts, chunk: int):
        self.job, self.coll, self._exact = job, _collectives(job.cluster, job.profile), None
        parts = _parts(job.space, chunk)
        self.pieces = [(part, numeric, c, *_pipeline_pieces(model, job, self.coll, c, opts))
                       for (part, numeric), c in zip(parts, _configs(job, parts)) if numeric["dp"].size]
        self.low = _lowest((part, numeric, pipe) for part, numeric, _, pipe, _ in self.pieces)

    @property
    def known(self) -> bool:
        return self._exact is not None

    def exact(self) -> dict:
        if self._exact is None:
            self._exact = _lowest((part, numeric, pipe + _first_stage_exposed(self.job, self.coll, c, pieces))
                                  for part, numeric, c, pipe, pieces in self.pieces)
        return self._exact


def _lowest(parts) -> dict:
    """The least of each part's seconds (per configuration), over all and over those at pp = 1."""
    floor = {"all": np.inf, "pp1": np.inf}
    for part, numeric, seconds in parts:
        low = np.broadcast_to(part.flat(seconds), numeric["dp"].shape)
        floor["all"] = min(floor["all"], float(low.min()))
        pp1 = low[numeric["pp"] == 1]
        floor["pp1"] = min(floor["pp1"], float(pp1.min()) if pp1.size else np.inf)
    return floor


def _pipeline_pieces(model, job: Job, coll, c: StepConfig, opts):
    """(the pipeline's seconds (``step._critical_path``; less the host seconds inside it under an
    engine, ``pipeline_floor``), the pieces the first stage's data-parallel seconds need), per configuration."""
    cl, prof, spec = job.cluster, job.profile, job.spec
    lay, lay_dp, sts, p = compose._shape(model, c, cl.gpus_per_node, opts["placement"])
    local = replace(model, seq=model.seq // c.cp) if c.cp > 1 else model
    t = compose.compute_times(local, prof, c, precision=spec.precision, recompute=spec.recompute)
    sms = getattr(getattr(cl, "gpu", None), "sm_count", 132)
    _, timed, pipe, _, parts = compose._critical_path(model, local, coll, lay, c, t, sts, spec.precision,
                                                      spec.recompute, sms, (prof, cl, p))
    if stacks.stack(c.framework).engine is not None:
        pipe = pipe - parts["host_overhead"]
    return pipe, (lay_dp, sts, p, timed)


def _first_stage_exposed(job: Job, coll, c: StepConfig, pieces):
    """The first stage's exposed data-parallel seconds (``step._exposed``'s ``dp_comm_time`` over that
    stage alone), not below zero, per configuration."""
    (lay_dp, sts, p, timed), prof, precision = pieces, job.profile, job.spec.precision
    dpc = replace(c, dp=c.dp * c.cp)
    work = DataParallelWork(p, tuple(sts), timed, compose.dp_backward_windows(prof, timed, sts),
                            wire_bytes(precision, dpc.framework), HostCosts.of(prof).overlap_compute_slowdown)
    first = _stage_exposed(coll, lay_dp, dpc, work, sts[0], work.backward_s[0], parameter_server_links(job.cluster),
                           compose.bucket_costs(prof))
    if stacks.stack(c.framework).engine == "deepspeed":
        first = _engine_exposed(coll, lay_dp, c, dpc, sts[0], p, precision, first)
    return np.maximum(first, 0.0)


def _engine_exposed(coll, lay_dp, c: StepConfig, dpc: StepConfig, first: Stage, p, precision, megatron):
    """The first stage's exposed data-parallel seconds as DeepSpeed's pipeline engine runs them: under
    ZeRO 0 and 1 (no parameter server) its reduction after the last backward (``deepspeed.reduce_seconds``,
    no drain slack on the first stage: ``deepspeed.engine_exposed`` takes the worst stage), else
    Megatron-LM's (``megatron``)."""
    pipelined = (c.shard_stage <= 1) & (c.ps_servers == 0)
    reduce = reduce_seconds(coll, lay_dp, dpc, first.params(p, c.tp), precision)
    return np.where(first.valid, np.where(pipelined, reduce, megatron), 0.0)


_COLLECTIVES = IdentityMemo(16)


def _collectives(cl, prof) -> dict:
    """``cluster_collectives`` once per (cluster, profile) object: the mapping's identity keys the
    collective prices ``costs/comm.py`` keeps, so the jobs of one search share them."""
    hit = _COLLECTIVES.get(prof, id(cl))
    if hit is None or hit[0] is not cl:
        hit = (cl, cluster_collectives(cl, prof))
        _COLLECTIVES.put(prof, id(cl), hit)
    return hit[1]


def _row_columns(model, cl, prof, precision, recompute, stack, level, rows: dict) -> dict:
    """The columns a chunk's kept ``rows`` add: the software stack (the same for every row of the
    chunk) and the step-time bounds at the search's level with their regime (perfmodel.interval).
    Computed only for the rows a ranking keeps, not for every configuration priced."""
    n = rows["dp"].size
    cols = {"precision": np.full(n, precision, dtype=object), "recompute": np.full(n, recompute, dtype=object)}
    for k, v in stack.items():  # the software stack, cp and ep
        if k not in ("tp_overlap", "dp_overlap"):  # numeric columns
            cols[k] = np.full(n, v, dtype=object if isinstance(v, str) else type(v))
    iv = bounds(rows["step_time"], {k: rows[k] for k in BREAKDOWN_KEYS}, profile=prof, cluster=cl, model=model,
                framework=stack["framework"], attention=stack["attention"], precision=precision, level=level)
    cols.update({"step_time_low": np.broadcast_to(iv.low, (n,)), "step_time_high": np.broadcast_to(iv.high, (n,)),
                 "interval_level": np.full(n, iv.level), "interval_regime": np.broadcast_to(iv.regime, (n,))})
    return cols


class Best:
    """The ``top_k`` best feasible rows seen so far, with counts, in bounded memory."""

    def __init__(self, ranking: Ranking, offset: int = 0, engine: bool = False):
        self.ranking, self.offset, self.engine = ranking, offset, engine
        self.rows: dict | None = None
        self.closest: dict | None = None  # the configuration nearest to fitting, for the error message
        self.evaluated = self.feasible = self.pruned = 0
        # the shortest step priced, fitting or not (and at pp = 1); with an engine's host work (DeepSpeed),
        # which a longer backward hides, less the host seconds: a bound on the family's other jobs (price_jobs)
        self.fastest = {"all": np.inf, "pp1": np.inf}

    def add(self, cols: dict, extra=None) -> None:
        """One chunk's priced columns; ``extra(rows)`` gives the columns of the rows kept (``_row_columns``)."""
        n = cols["dp"].size
        cols["order"] = np.arange(self.offset + self.evaluated, self.offset + self.evaluated + n)
        self.evaluated += n
        if n:
            step = np.asarray(cols["step_time"]) - (np.asarray(cols["host_overhead"]) if self.engine else 0.0)
            self.fastest["all"] = min(self.fastest["all"], float(step.min()))
            pp1 = step[np.asarray(cols["pp"]) == 1]
            self.fastest["pp1"] = min(self.fastest["pp1"], float(pp1.min()) if pp1.size else np.inf)
        i = int(np.argmin(cols["over_capacity"]))
        self._closest(_with(extra, _rows(cols, np.arange(i, i + 1))))
        fits = np.flatnonzero(np.asarray(cols["fits"], bool))
        self.feasible += int(fits.size)
        if fits.size:  # the chunk's own top_k first (the ranking is a total order), ranked on its key columns
            r = self.ranking
            best = fits[self._best({k: np.asarray(cols[k])[fits] for k in {r.sort_by, "peak_memory", "order"}})]
            self._keep(_with(extra, _rows(cols, best)))

    def merge(self, other: Best) -> None:
        self.evaluated += other.evaluated
        self.feasible += other.feasible
        self.pruned += other.pruned
        if other.closest is not None:
            self._closest(other.closest)
        if other.rows is not None:
            self._keep(other.rows)

    def _closest(self, row: dict) -> None:
        if self.closest is None or (row["over_capacity"][0], row["order"][0]) < (
                self.closest["over_capacity"][0], self.closest["order"][0]):
            self.closest = row

    def _best(self, rows: dict) -> np.ndarray:
        """Indices of the ``top_k`` best of ``rows``, best first (ties: less memory, then enumeration order)."""
        r = self.ranking
        key = (-1.0 if r.larger_is_better else 1.0) * rows[r.sort_by].astype(float)
        return np.lexsort((rows["order"], rows["peak_memory"], key))[:r.top_k]

    def _keep(self, rows: dict) -> None:
        if self.rows is not None:
            rows = {k: np.concatenate([self.rows[k], rows[k]]) for k in self.rows}
        order = self._best(rows)
        self.rows = {k: v[order] for k, v in rows.items()}


def _rows(cols: dict, cells: np.ndarray) -> dict:
    """Every column of ``cols`` at ``cells`` (with those ``Columns.rest`` gives)."""
    rows = {k: np.asarray(v)[cells] for k, v in cols.items()}
    rest = getattr(cols, "rest", None)
    return rows if rest is None else {**rows, **rest(cells)}


def _with(extra, rows: dict) -> dict:
    """``rows`` with the columns ``extra`` gives them (none when it is None)."""
    return rows if extra is None else {**rows, **extra(rows)}


def price_job(job: Job, model, opts, ranking: Ranking, chunk: int) -> Best:
    """Every configuration of one job, chunk by chunk; the best rows and the counts."""
    best = Best(ranking, offset=job.index * ORDER_STRIDE, engine=stacks.stack(job.spec.framework).engine is not None)
    eager = ("step_time", "host_overhead", "over_capacity", "fits", "peak_memory", "tokens_per_second", ranking.sort_by)
    for cols, extra in chunks(model, job, opts, chunk, eager):
        if job.usd_per_hour is not None:  # a sort column: every row has it
            cols["usd_per_million_tokens"] = job.usd_per_hour / 3600.0 / cols["tokens_per_second"] * 1e6
        best.add(cols, functools.partial(_job_columns, job, extra))
    return best


def _job_columns(job: Job, extra, rows: dict) -> dict:
    """The kept rows' columns of their chunk (``extra``) and of their job: cluster, GPUs, $/hour."""
    n = rows["dp"].size
    cols = {**extra(rows), "cluster_name": np.full(n, job.cluster.name, dtype=object), "gpus": np.full(n, job.cluster.n_gpus)}
    if job.usd_per_hour is not None:
        cols["usd_per_hour"] = np.full(n, job.usd_per_hour)
    return cols


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
        floors = {j.index: Floor(model, j, opts, chunk) for j in first}
        _waves(RootQueue(first, floors), pool, best, results, model, opts, ranking, chunk)
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
        _waves(FamilyQueue(queue, rest, lambda j: Floor(model, j, opts, chunk)), pool, best, results, model, opts,
               ranking, chunk)
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


def _waves(queue, pool, best: Best, results: dict, model, opts, ranking, chunk) -> None:
    """Price the (job, bound) pairs ``queue`` hands out (ascending bound: an iterator, or a
    ``RootQueue``) ``WAVE`` jobs at a time, skipping those ``_prunable``."""
    take = queue.next if isinstance(queue, (RootQueue, FamilyQueue)) else (lambda _: next(queue, None))
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
        _wave(wave, pool, best, results, model, opts, ranking, chunk)


def _wave(jobs, pool, best: Best, results: dict, model, opts, ranking, chunk) -> None:
    args = (repeat(model), repeat(opts), repeat(ranking), repeat(chunk))
    if pool is None or len(jobs) < 2:
        done = list(map(price_job, jobs, *args))
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
