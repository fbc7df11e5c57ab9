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

import functools
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from itertools import product, repeat

import numpy as np

from perfmodel import step as compose
from perfmodel.explore.space import NUMERIC, Space
from perfmodel.parallel.config import MIB, StepConfig
from perfmodel.interval import bounds
from perfmodel.parallel.fabric import cluster_collectives
from perfmodel.predict import BREAKDOWN_KEYS, finish

CHUNK = 32_768  # grid cells priced per call: enough to amortise numpy's per-call cost, a few MB of columns
PARALLEL_MIN = 20_000  # configurations below which a process pool costs more than it saves
RESULTS = ("step_time", "tokens_per_second", "samples_per_second", "tflops_per_gpu", "mfu", "peak_memory",
           "memory_capacity", "fits", "over_capacity")
ORDER_STRIDE = 2**40  # enumeration order = job index × stride + row within the job


@dataclass(frozen=True)
class Job:
    """One space to price: its index (enumeration order), cluster, profile, $/hour and stack."""

    index: int
    cluster: object
    profile: object
    usd_per_hour: float | None
    stack: dict
    space: Space


@dataclass(frozen=True)
class Ranking:
    top_k: int
    sort_by: str
    larger_is_better: bool


def _parts(space: Space, chunk: int) -> list:
    """(grid rows, their configurations' flat columns) of ``chunk`` grid cells or fewer at a time."""
    grid = space.grid()
    per_row = max(1, int(np.prod(grid.mask.shape[1:])))
    step = max(1, chunk // per_row)
    parts = []
    for lo in range(0, grid.mask.shape[0], step):
        part = grid.rows(lo, lo + step)
        parts.append((part, {k: part.flat(part.columns[k]) for k in NUMERIC}))
    return parts


def _flat_outputs(part, out: dict) -> dict:
    """``step.evaluate``'s arrays (shaped like the grid) at the part's configurations, one entry each."""
    flat = {k: part.flat(v) for k, v in out.items() if k != "memory"}
    flat["memory"] = {k: part.flat(v) for k, v in out["memory"].items()}
    return flat


def chunks(model, cl, space: Space, prof, opts, stack: dict, chunk: int):
    """Column dicts of ``chunk`` grid cells of ``space`` at a time, under each (precision, recompute).

    Each part is priced on its factored grid (``space.Factored``: a term is computed on the axes it
    depends on) and its valid cells are read out in enumeration order: the same arithmetic on the
    same numbers as pricing the flat configurations one by one.
    """
    coll = cluster_collectives(cl, prof)
    parts = _parts(space, chunk)
    # fields search does not vary (DDP bucket, no parameter server...) as one Strategy has them
    shared = {"framework": stack["framework"], "attention": stack["attention"], "cp": stack["cp"], "ep": stack["ep"]}
    configs = [replace(StepConfig.from_space(part.columns, opts["base"]), **shared,
                       bucket_bytes=part.columns["bucket_mib"] * MIB, dp_overlap=part.columns["dp_overlap"])
               for part, _ in parts]
    for precision, recompute in product(opts["precision"], opts["recompute"]):
        for (part, numeric), c in zip(parts, configs):
            out = compose.evaluate(model, cl, prof, coll, c, precision=precision, recompute=recompute,
                                   optimizer=opts["optimizer"], placement=opts["placement"])
            out["micro_batch"] = c.micro_batch
            out = _flat_outputs(part, out)
            derived = finish(model, cl, space.global_batch, out, precision, recompute, cl.n_gpus)
            m = numeric["dp"].size
            cols = dict(numeric)
            merged = {**out, **derived}
            for k in (*RESULTS, *BREAKDOWN_KEYS):
                cols[k] = np.broadcast_to(merged[k], (m,))
            for k, v in out["memory"].items():
                cols["mem_" + k] = np.broadcast_to(v, (m,))
            yield cols, functools.partial(_row_columns, model, cl, prof, precision, recompute, stack, opts["level"])


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

    def __init__(self, ranking: Ranking, offset: int = 0):
        self.ranking, self.offset = ranking, offset
        self.rows: dict | None = None
        self.closest: dict | None = None  # the configuration nearest to fitting, for the error message
        self.evaluated = self.feasible = 0

    def add(self, cols: dict, extra=None) -> None:
        """One chunk's priced columns; ``extra(rows)`` gives the columns of the rows kept (``_row_columns``)."""
        n = cols["dp"].size
        cols["order"] = np.arange(self.offset + self.evaluated, self.offset + self.evaluated + n)
        self.evaluated += n
        i = int(np.argmin(cols["over_capacity"]))
        self._closest(_with(extra, {k: v[i:i + 1] for k, v in cols.items()}))
        fits = np.flatnonzero(np.asarray(cols["fits"], bool))
        self.feasible += int(fits.size)
        if fits.size:  # the chunk's own top_k first (the ranking is a total order), ranked on its key columns
            r = self.ranking
            best = fits[self._best({k: np.asarray(cols[k])[fits] for k in {r.sort_by, "peak_memory", "order"}})]
            self._keep(_with(extra, {k: np.asarray(v)[best] for k, v in cols.items()}))

    def merge(self, other: Best) -> None:
        self.evaluated += other.evaluated
        self.feasible += other.feasible
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


def _with(extra, rows: dict) -> dict:
    """``rows`` with the columns ``extra`` gives them (none when it is None)."""
    return rows if extra is None else {**rows, **extra(rows)}


def price_job(job: Job, model, opts, ranking: Ranking, chunk: int) -> Best:
    """Every configuration of one job, chunk by chunk; the best rows and the counts."""
    best = Best(ranking, offset=job.index * ORDER_STRIDE)
    cl = job.cluster
    for cols, extra in chunks(model, cl, job.space, job.profile, opts, job.stack, chunk):
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
    """All jobs priced (in ``workers`` processes when worth it) and their best rows merged."""
    combos = len(opts["precision"]) * len(opts["recompute"])
    n = _worker_count(workers, jobs, combos)
    args = (repeat(model), repeat(opts), repeat(ranking), repeat(chunk))
    if n == 1:
        results = list(map(price_job, jobs, *args))
    else:
        big_first = sorted(jobs, key=lambda j: -len(j.space))  # the longest jobs start first: even finish
        with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("fork")) as pool:
            results = list(pool.map(price_job, big_first, *args))
    best = Best(ranking)
    for r in sorted(results, key=lambda b: b.offset):
        best.merge(r)
    return best
