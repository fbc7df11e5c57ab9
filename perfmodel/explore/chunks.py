"""Price a search space in bounded memory: chunks of configurations, the best rows kept, processes shared.

``search`` hands over one ``Job`` per (cluster, software stack, context-parallel size): its space
of numeric configurations, held as a factored grid (``space.Factored``). Each job is priced on
whole grid rows, ``chunk`` grid cells at a time, under every (precision, recompute) with
``step.evaluate`` (the code ``predict`` runs), and only the
``top_k`` best feasible rows, the counts and the configuration nearest to fitting are kept.
Large searches share the jobs among processes (``pruning.price_jobs``; fork: nothing to re-import);
rows carry their enumeration order, so the ranking (ties: less memory, then enumeration order) is
the same however the jobs were shared. A job's ``Floor`` bounds its steps from below before it is priced.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

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
from perfmodel.parallel.paths import placement_path, priced_paths, schedule_path
from perfmodel.parallel.pipeline import Stage
from perfmodel.parallel.stragglers import device_spread
from perfmodel.parallel.wire import wire_bytes
from perfmodel.predict import BREAKDOWN_KEYS, finish
from perfmodel.workload import stacks

CHUNK = 65_536  # grid cells priced per call: a default space's largest job (47,376 cells) in one call, a few MB of columns
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


def chunks(model, job: Job, opts, chunk: int, eager=None, floor=None):
    """Column dicts of ``chunk`` grid cells of the job's space at a time, under its precision and recompute.

    Each part is priced on its factored grid (``space.Factored``: a term is computed on the axes it
    depends on) and its valid cells are read out in enumeration order: the same arithmetic on the
    same numbers as pricing the flat configurations one by one. ``eager`` names the result columns read
    out for every configuration (None: all); the others come from ``Columns.rest``. ``floor``: the
    job's ``Floor``, whose pieces (``step.step_quantities``' ``known``) are not priced again.
    """
    cl, space, prof, stack = job.cluster, job.space, job.profile, job.stack
    coll = _collectives(cl, prof)
    parts = _parts(space, chunk)
    configs, known = _configs(job, parts), {} if floor is None else floor.known_pieces()
    for precision, recompute in ((job.spec.precision, job.spec.recompute),):
        for i, ((part, numeric), c) in enumerate(zip(parts, configs)):
            c, pieces = known.get(i, (c, None))
            out = compose.evaluate(model, cl, prof, coll, c, precision=precision, recompute=recompute,
                                   optimizer=opts["optimizer"], placement=opts["placement"], known=pieces)
            out["micro_batch"] = c.micro_batch
            # elementwise on the grid, as on its configurations
            grid = {**out, **finish(model, cl, space.global_batch, out, precision, recompute, cl.n_gpus,
                                    opts.get("memory_headroom", 0.0))}
            grid.update({"mem_" + k: v for k, v in out["memory"].items()})
            names = [*RESULTS, *BREAKDOWN_KEYS, *("mem_" + k for k in out["memory"])]
            now = names if eager is None else [k for k in names if k in eager]
            m = numeric["dp"].size
            cols = Columns({**numeric, **{k: np.broadcast_to(part.flat(grid[k]), (m,)) for k in now}},
                           functools.partial(_later_columns, part, grid, [k for k in names if k not in now]))
            yield cols, functools.partial(_row_columns, model, cl, prof, precision, recompute, stack, opts["level"],
                                          priced_paths(job.base, model, prof.gpu))


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
    exposed data-parallel seconds added (computed once, when asked for). The pieces are the calls
    ``step.step_quantities`` makes on the same configurations: pricing the job reads them
    (``known_pieces``) instead of making those calls again."""

    def __init__(self, model, job: Job, opts, chunk: int, shared: dict | None = None):
        self.job, self.coll, self._exact = job, _collectives(job.cluster, job.profile), None
        parts = _parts(job.space, chunk)
        self.pieces = [(i, part, numeric, c, *_shared_pieces(shared, model, job, self.coll, c, opts, i))
                       for i, ((part, numeric), c) in enumerate(zip(parts, _configs(job, parts))) if numeric["dp"].size]
        self.low = _lowest((part, numeric, pipe) for _, part, numeric, _, pipe, _ in self.pieces)

    @property
    def known(self) -> bool:
        return self._exact is not None

    def exact(self) -> dict:
        if self._exact is None:
            self._exact = _lowest((part, numeric, pipe + _first_stage_exposed(self.job, self.coll, c, pieces))
                                  for _, part, numeric, c, pipe, pieces in self.pieces)
        return self._exact

    def known_pieces(self) -> dict:
        """Part index -> (its configurations, the pieces ``step.step_quantities`` takes as ``known``)."""
        return {i: (c, pieces) for i, _, _, c, _, pieces in self.pieces}


def _lowest(parts) -> dict:
    """The least of each part's seconds (per configuration), over all and over those at pp = 1."""
    floor = {"all": np.inf, "pp1": np.inf}
    for part, numeric, seconds in parts:
        low = np.broadcast_to(part.flat(seconds), numeric["dp"].shape)
        floor["all"] = min(floor["all"], float(low.min()))
        pp1 = low[numeric["pp"] == 1]
        floor["pp1"] = min(floor["pp1"], float(pp1.min()) if pp1.size else np.inf)
    return floor


def _shared_pieces(shared: dict | None, model, job: Job, coll, c: StepConfig, opts, part: int):
    """``_pipeline_pieces`` of a job's part, computed once per search (``shared``, keyed by ``_pipeline_key``) for
    the jobs that differ only in fields their pipeline does not read; each job gets its own dict of them (its
    data-parallel seconds are added to it later)."""
    if shared is None:
        return _pipeline_pieces(model, job, coll, c, opts)
    key = _pipeline_key(job, part)
    if key not in shared:
        shared[key] = _pipeline_pieces(model, job, coll, c, opts)
    pipe, pieces = shared[key]
    return pipe, dict(pieces)


def _pipeline_key(job: Job, part: int) -> tuple:
    """What a part's pipeline pieces depend on: its space, cluster, profile and job, less the searched stack fields
    only data-parallel seconds and memory read (the gradients' reduction dtype; fp8 parameters under Transformer
    Engine, whose kernels do not change with them: workload/stack.py float8_gemm)."""
    te = stacks.stack(job.spec.framework).float8 == "te"
    kept = tuple((n, v) for n, v in job.spec.extras if n != "grad_reduce_fp32" and not (n == "fp8_params" and te))
    return (id(job.space), part, id(job.cluster), id(job.profile), replace(job.spec, extras=kept, family=(), root=False))


def _pipeline_pieces(model, job: Job, coll, c: StepConfig, opts):
    """(the pipeline's seconds (``step._critical_path`` at the slowest GPU's pace, ``step.slowest_pace``;
    less the host seconds inside it under an engine, ``pipeline_floor``), the pieces the first stage's
    data-parallel seconds need), per configuration."""
    cl, prof, spec = job.cluster, job.profile, job.spec
    lay, lay_dp, sts, p = compose._shape(model, c, cl.gpus_per_node, opts["placement"])
    local = replace(model, seq=model.seq // c.cp) if c.cp > 1 else model
    t = compose.compute_times(local, prof, c, precision=spec.precision, recompute=spec.recompute)
    sms = getattr(getattr(cl, "gpu", None), "sm_count", 132)
    critical = compose._critical_path(model, local, coll, lay, c, t, sts, spec.precision, spec.recompute, sms,
                                      (prof, cl, p))
    pipe, _, _, parts, _ = compose.slowest_pace(c, critical[2], critical[3], critical[4], device_spread(cl))
    pipe = pipe - (parts["host_overhead"] if stacks.stack(c.framework).engine is not None else 0.0)
    return pipe, {"shape": (lay, lay_dp, sts, p), "compute": t, "critical": critical}


def _first_stage_exposed(job: Job, coll, c: StepConfig, pieces: dict):
    """The first stage's exposed data-parallel seconds (``step._exposed``'s ``dp_comm_time`` over that
    stage alone), not below zero, per configuration; its value before that kept in ``pieces``
    (``first_dp``: ``dp_comm_time`` takes it)."""
    (_, lay_dp, sts, p), timed = pieces["shape"], pieces["critical"][1]
    prof, precision = job.profile, job.spec.precision
    dpc = replace(c, dp=c.dp * c.cp)
    work = DataParallelWork(p, tuple(sts), timed, compose.dp_backward_windows(prof, timed, sts),
                            wire_bytes(precision, dpc.framework, dpc.grad_reduce_fp32),
                            HostCosts.of(prof).overlap_compute_slowdown)
    first = pieces["first_dp"] = _stage_exposed(coll, lay_dp, dpc, work, sts[0], work.backward_s[0],
                                                parameter_server_links(job.cluster), compose.bucket_costs(prof))
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


def _row_columns(model, cl, prof, precision, recompute, stack, level, paths: dict, rows: dict) -> dict:
    """The columns a chunk's kept ``rows`` add: the software stack (the same for every row of the
    chunk) and the step-time bounds at the search's level with their regime (perfmodel.interval), under
    the job's pricing ``paths`` (``parallel/paths.py``) with each row's schedule and placement.
    Computed only for the rows a ranking keeps, not for every configuration priced."""
    n = rows["dp"].size
    cols = {"precision": np.full(n, precision, dtype=object), "recompute": np.full(n, recompute, dtype=object)}
    for k, v in stack.items():  # the software stack, cp and ep
        if k not in ("tp_overlap", "dp_overlap"):  # numeric columns
            cols[k] = np.full(n, v, dtype=object if v is None or isinstance(v, str) else type(v))
    tp, pp, dp, v = (np.broadcast_to(rows[k], (n,)).tolist() for k in ("tp", "pp", "dp", "virtual_stages"))
    kinds = np.array([(schedule_path(p, c, stack["schedule"]), placement_path(paths["placement"], t, p, d))
                      for t, p, d, c in zip(tp, pp, dp, v)], dtype=object).reshape(n, 2)
    low, high, regime = np.empty(n), np.empty(n), np.empty(n, dtype=object)
    for sch, place in set(map(tuple, kinds.tolist())):  # a few kinds of row: one interval call each
        mask = (kinds[:, 0] == sch) & (kinds[:, 1] == place)
        iv = bounds(rows["step_time"][mask], {k: rows[k][mask] for k in BREAKDOWN_KEYS}, profile=prof, cluster=cl,
                    model=model, framework=stack["framework"], attention=stack["attention"], precision=precision,
                    level=level, paths={**paths, "schedule": sch, "placement": place})
        low[mask], high[mask], regime[mask] = iv.low, iv.high, iv.regime
    cols.update({"step_time_low": low, "step_time_high": high, "interval_level": np.full(n, level),
                 "interval_regime": regime})
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


def price_job(job: Job, model, opts, ranking: Ranking, chunk: int, floor=None) -> Best:
    """Every configuration of one job, chunk by chunk (with its ``Floor``'s pieces); the best rows and the counts."""
    best = Best(ranking, offset=job.index * ORDER_STRIDE, engine=stacks.stack(job.spec.framework).engine is not None)
    eager = ("step_time", "host_overhead", "over_capacity", "fits", "peak_memory", "tokens_per_second", ranking.sort_by)
    for cols, extra in chunks(model, job, opts, chunk, eager, floor):
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
