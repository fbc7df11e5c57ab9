"""The space of parallel configurations a search walks, and the rules that prune it.

A configuration is (dp, tp, pp, virtual stages, micro-batch, ZeRO stage,
sequence parallelism) for one global batch on ``n_gpus`` GPUs; recompute and
precision are categorical and multiply the space. The space is built as
numpy arrays (one entry per configuration), never configuration by
configuration. Rules, in the order they are applied (a configuration is
counted under the first rule it breaks):

* divisibility — tp divides heads and kv_heads (Megatron-LM splits whole
  heads, Shoeybi et al. 2019); pp <= layers; an interleaved schedule needs
  layers divisible by pp × virtual stages (Narayanan et al. 2021, §2.2);
  with expert parallelism, ep divides dp × cp and tp > 1 has sequence
  parallelism (Megatron-Core);
* batch — the global batch is a multiple of dp × micro-batch, and an
  interleaved schedule needs the micro-batches divisible by pp (Megatron-LM
  ``schedules.py`` asserts it);
* memory — checked after evaluation (``search``).

Configurations equal to another one are not enumerated at all: a ZeRO stage
with dp = 1 (nothing to shard), sequence parallelism or overlapped tensor-parallel
communication with tp = 1, virtual stages with pp = 1.

Besides the flat arrays, a space keeps its configurations factored (``Factored``): the
(dp, tp, pp, micro-batch, virtual stages) rows that survive the rules, times the sharding,
sequence-parallel and overlap axes, with a mask of the valid cells. Priced on that grid,
numpy broadcasting evaluates each term only on the axes it depends on (a collective on the
rows, a kernel on rows × sequence parallelism), and the mask's cells, read in C order, are
the flat configurations in their enumeration order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from perfmodel.core.errors import InfeasibleError, InvalidInputError
from perfmodel.parallel import zero_bubble
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.strategy import interleaves
from perfmodel.core.checks import LIMITS, check_int, check_positive, check_size, divisors
from perfmodel.workload.graph import GraphModel

REASONS = ("divisibility", "batch", "memory")
NUMERIC = ("dp", "tp", "pp", "virtual_stages", "micro_batch", "micro_batches", "zero", "fsdp", "sequence_parallel",
           "tp_overlap", "bucket_mib", "dp_overlap")
FSDP_CHOICES = (None, "full", "hybrid")


FACTORED_ROWS = ("dp", "tp", "pp", "virtual_stages", "micro_batch", "micro_batches")
# axes 1.. of the grid after the rows: sharding, sequence parallelism, tensor-parallel overlap, DDP/ZeRO
# bucket, data-parallel overlap
FACTORED_AXES = (("zero", "fsdp"), ("sequence_parallel",), ("tp_overlap",), ("bucket_mib",), ("dp_overlap",))


@dataclass(frozen=True)
class Factored:
    """A space's configurations as a grid (rows × sharding × sequence parallelism × overlap × bucket).

    ``columns`` maps each name of ``NUMERIC`` to an array that broadcasts to ``mask.shape``:
    the row fields have shape (R, 1, 1, 1, 1), those of axis i (``FACTORED_AXES``) size 1
    except along axis i. ``mask`` marks the cells that are configurations of the space.
    """

    columns: dict
    mask: np.ndarray

    def rows(self, lo: int, hi: int) -> Factored:
        """Rows ``lo`` to ``hi`` of the grid, with every cell of theirs."""
        n = self.mask.shape[0]
        cols = {k: v[lo:hi] if v.shape[0] == n else v for k, v in self.columns.items()}
        return Factored(columns=cols, mask=self.mask[lo:hi])

    def columns_flat(self) -> dict:
        """Each column at the valid cells, in order (as ``flat``, by the cells' indices along each axis)."""
        at = np.nonzero(self.mask)
        out = {}
        for k, v in self.columns.items():
            varying = [i for i, n in enumerate(v.shape) if n > 1]  # a column varies along one axis at most
            if not v.size:  # an empty space
                out[k] = np.empty(0, v.dtype)
            else:
                out[k] = v.reshape(-1)[at[varying[0]]] if varying else np.full(at[0].size, v.reshape(-1)[0], v.dtype)
        return out

    def flat(self, value) -> np.ndarray:
        """``value`` (an array that broadcasts to the grid, or a number) at the valid cells, in order.

        The same elements as ``np.broadcast_to(value, mask.shape)[mask]``, gathered from ``value``
        itself by the cells' flat indices into it (one per shape of value, kept with the grid)."""
        v = np.asarray(value)
        grid = self.mask.shape
        shape = (1,) * (len(grid) - v.ndim) + v.shape
        if len(shape) != len(grid) or any(n not in (1, g) for n, g in zip(shape, grid)):
            return np.broadcast_to(value, grid)[self.mask]  # not a grid-shaped value: numpy's own rules
        return v.reshape(-1)[self._index(shape)]

    def at(self, value, cells: np.ndarray) -> np.ndarray:
        """``flat(value)[cells]``, gathering only those of the valid cells (a ranking's kept rows)."""
        v = np.asarray(value)
        grid = self.mask.shape
        shape = (1,) * (len(grid) - v.ndim) + v.shape
        if len(shape) != len(grid) or any(n not in (1, g) for n, g in zip(shape, grid)):
            return self.flat(value)[cells]
        return v.reshape(-1)[self._index(shape)[cells]]

    def _index(self, shape: tuple) -> np.ndarray:
        """Flat indices into an array of ``shape`` (1 or the grid's size along each axis) of the valid cells."""
        cache = self.__dict__.setdefault("_indices", {})  # derived from the frozen fields, so safe to keep
        if shape not in cache:
            at = cache.get("cells")
            if at is None:
                at = cache["cells"] = np.nonzero(self.mask)
            index, stride = np.zeros(at[0].size, np.intp), 1
            for axis in reversed(range(len(shape))):
                if shape[axis] > 1:
                    index += at[axis] * stride
                stride *= shape[axis]
            cache[shape] = index
        return cache[shape]


@dataclass(frozen=True)
class Space:
    """Configurations that pass the divisibility and batch rules, and counts of the others.

    ``arrays`` maps each name of ``NUMERIC`` to an array with one entry per
    configuration. ``rejected`` and ``detail`` count configurations of the
    numeric grid (multiply by the categorical combinations for the total).
    """

    arrays: dict
    rejected: dict
    detail: dict
    n_gpus: int
    global_batch: int
    factored: Factored | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return int(self.arrays["dp"].size)

    def grid(self) -> Factored:
        """The configurations factored (``Factored``); a space built without one: one row each."""
        if self.factored is not None:
            return self.factored
        shape = (-1, *(1,) * len(FACTORED_AXES))
        cols = {k: np.asarray(v).reshape(shape) for k, v in self.arrays.items()}
        return Factored(columns=cols, mask=np.ones((len(self), *(1,) * len(FACTORED_AXES)), bool))

    def step_config(self, base) -> StepConfig:
        """The configurations as ``step.evaluate`` takes them, over the fields of ``base`` (a
        ``Strategy``) that search does not vary."""
        return StepConfig.from_space(self.arrays, base)


def tp_pp_pairs(n_gpus: int, max_tp: int, max_pp: int | None = None) -> np.ndarray:
    """Every (tp, pp) with tp × pp dividing ``n_gpus``, tp <= ``max_tp`` and pp <= ``max_pp``; shape (P, 2)."""
    most = LIMITS["pp"] if max_pp is None else min(max_pp, LIMITS["pp"])
    pairs = [(tp, pp) for tp in divisors(n_gpus) if tp <= max_tp for pp in divisors(n_gpus // tp) if pp <= most]
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


def _grid(n_gpus, global_batch, pairs, micro_batches, virtual, zero, sp, overlap=(0,), fsdp=(None,),
          bucket=(25.0,), dp_overlap=(True,)):
    """The candidate values as a broadcast grid (``Factored`` axes) and which cells are kept (no
    equivalent duplicates): rows (tp, pp) pair × micro-batch × virtual stages, then the axes.

    The sharding axis lists the ZeRO stages, then the FSDP modes (each shards like ZeRO-3).
    A bucket or data-parallel overlap other than the first is only tried where gradients are
    bucketed: dp > 1 and DDP or ZeRO-1/2 (ZeRO-3 and FSDP gather and reduce per unit).

    Which cells of a row are kept depends on the row through three flags only (pp = 1 with virtual
    stages, dp = 1, tp = 1), so the cells are returned per row class (``ROW_CLASSES``): (grid, each
    row's class, the kept cells of each class), the full mask being ``kept[classes]``.
    """
    sharding = [(z, None) for z in zero] + [(3, f) for f in fsdp if f is not None]
    p, mb, v = (x.reshape(-1, *(1,) * len(FACTORED_AXES)) for x in np.meshgrid(np.arange(len(pairs)), micro_batches, virtual,
                                                                  indexing="ij"))
    tp, pp = pairs[p, 0], pairs[p, 1]
    dp = n_gpus // (tp * pp)

    def axis(i, values):
        shape = [1] * (1 + len(FACTORED_AXES))
        shape[i] = -1
        return np.asarray(values).reshape(shape)

    k = axis(1, np.arange(len(sharding)))
    z = axis(1, np.array([z for z, _ in sharding], np.int64))
    s, o, b = axis(2, np.asarray(sp, int)), axis(3, np.asarray(overlap, int)), axis(4, np.arange(len(bucket)))
    d = axis(5, np.arange(len(dp_overlap)))
    classes = (((v > 1) & (pp == 1)) * 4 + (dp == 1) * 2 + (tp == 1)).reshape(-1)
    c = axis(0, np.arange(ROW_CLASSES))
    idle, one_dp, one_tp = (c & 4) > 0, (c & 2) > 0, (c & 1) > 0  # the row flags of each class
    keep = ~(idle | ((z > 0) & one_dp) | (((s > 0) | (o > 0)) & one_tp) | (((b > 0) | (d > 0)) & ((z >= 3) | one_dp)))
    if None not in fsdp:  # only FSDP asked for: the zero list does not apply
        keep &= k >= len(zero)
    keep = np.broadcast_to(keep, (ROW_CLASSES, len(sharding), len(sp), len(overlap), len(bucket), len(dp_overlap)))
    g = {"dp": dp, "tp": tp, "pp": pp, "virtual_stages": v, "micro_batch": mb, "zero": z,
         "fsdp": axis(1, np.array([f for _, f in sharding], dtype=object)),
         "sequence_parallel": s.astype(bool), "tp_overlap": o.astype(bool),
         "bucket_mib": axis(4, np.asarray(bucket, float)), "dp_overlap": axis(5, np.asarray(dp_overlap, bool)),
         "micro_batches": global_batch // (dp * mb)}
    return g, classes, keep


ROW_CLASSES = 8  # (pp = 1 with virtual stages, dp = 1, tp = 1): the row flags the kept cells depend on


def _rules(model, global_batch, g, cp=1, ep=1, pipeline_engine=False, schedule="interleaved", etp=None):
    """(reason, rule text, mask of configurations breaking it), in order of application."""
    heads, kv = getattr(model, "heads", None), getattr(model, "kv_heads", None)
    layers = model.layers
    tp, pp, v, dp, mb = g["tp"], g["pp"], g["virtual_stages"], g["dp"], g["micro_batch"]
    rules = []
    if isinstance(model, GraphModel):  # a traced graph is modelled data-parallel only
        rules.append(("divisibility", f"{model.name!r} is a traced graph: data parallelism only (tp = pp = 1, "
                      "no sequence parallelism)", (tp > 1) | (pp > 1) | (g["sequence_parallel"] != 0)))
    if heads is not None:
        rules.append(("divisibility", f"tp must divide heads={heads}", heads % tp != 0))
        rules.append(("divisibility", f"tp must divide kv_heads={kv}", kv % tp != 0))
    rules.append(("divisibility", f"pp must be <= layers={layers}", pp > layers))
    rules.append(("divisibility", f"interleaving needs layers={layers} (or layers + 2: embedding and loss counted "
                  "as layers) divisible by pp × virtual_stages", (v > 1) & ~interleaves(layers, pp * v)))
    if etp is not None:  # Megatron-Core's folded expert grid: ep × etp over a stage's tp × cp × dp ranks
        rules.append(("divisibility", f"ep × etp = {ep} × {etp} must divide tp × cp × dp", (tp * cp * dp) % (ep * etp) != 0))
    if ep > 1:  # expert-parallel ranks are data-parallel ranks; MoE with tp > 1 needs sequence parallelism
        if etp is None:
            rules.append(("divisibility", f"ep={ep} must divide dp × cp", (dp * cp) % ep != 0))
        rules.append(("divisibility", "expert parallelism with tp > 1 needs sequence parallelism",
                      (tp > 1) & (g["sequence_parallel"] == 0)))
    if pipeline_engine:  # parallel/deepspeed.py check_pipeline_engine: what DeepSpeed's PipelineEngine refuses
        rules.append(("divisibility", "DeepSpeed's pipeline engine: 1F1B without interleaving, zero 0 or 1 with pp > 1",
                      (v > 1) | ((pp > 1) & (g["zero"] >= 2))))
    if schedule != "interleaved":  # torch's zero-bubble schedules (parallel/zero_bubble.py): chunked stages only
        rules.append(("divisibility", f"schedule={schedule!r} needs pp > 1 and virtual_stages "
                      f"{'= 2' if schedule in zero_bubble.V_SHAPED else '>= 2'}",
                      ~zero_bubble.stages_ok(schedule, pp, v)))
    rules.append(("batch", f"global_batch={global_batch} must be a multiple of dp × micro_batch",
                  global_batch % (dp * mb) != 0))
    m = global_batch // (dp * mb)
    if schedule == "interleaved":
        rules.append(("batch", "interleaving needs micro-batches divisible by pp", (v > 1) & (m % pp != 0)))
    else:
        rules.append(("batch", f"schedule={schedule!r} is priced for the micro-batch counts of its form",
                      ~zero_bubble.batches_ok(schedule, m, pp)))
    return rules


def _check_options(name, values, valid=None) -> tuple:
    values = tuple(values)
    if not values:
        raise InvalidInputError(f"{name!r} must list at least one value: got an empty list")
    if valid is not None:
        bad = [x for x in values if x not in valid]
        if bad:
            raise InvalidInputError(f"{name!r} has invalid values {bad} (valid: {', '.join(map(str, valid))})")
    return values


def enumerate_space(model, n_gpus: int, gpus_per_node: int, global_batch: int, *, max_micro_batch: int = 8,
                    max_virtual_stages: int = 16, zero=(0, 1, 2, 3), sequence_parallel=(False, True),
                    max_tp_nodes: int = 1, cp: int = 1, ep: int = 1, tp_overlap=(False,),
                    fsdp=(None,), bucket_mib=(25.0,), dp_overlap=(True,), empty_ok: bool = False,
                    max_pp: int | None = None, pipeline_engine: bool = False, min_tp: int = 1,
                    schedule: str = "interleaved", etp: int | None = None) -> Space:
    """All configurations of ``model`` on ``n_gpus`` GPUs for ``global_batch`` that pass the rules.

    Micro-batches run 1..``max_micro_batch``, virtual stages 1..``max_virtual_stages`` (more than one: the
    ``schedule``, interleaved or zero-bubble, whose forms' rules apply); tensor groups span at most
    ``max_tp_nodes`` nodes (tp <= gpus_per_node × max_tp_nodes); ``tp_overlap`` lists the choices of Megatron-LM's asynchronous tensor-parallel communication (only with tp > 1), ``fsdp``
    the PyTorch FSDP modes tried beside the ZeRO stages (None: none; "hybrid" only on more than
    one node, where it differs from "full"), ``bucket_mib`` the DDP / ZeRO-1/2 gradient buckets (MiB, as
    ``Strategy.bucket_mib``; the first one only where nothing is bucketed) and ``dp_overlap`` whether the
    gradient reduction overlaps backward (Megatron-LM --overlap-grad-reduce; values after the first only
    where gradients are bucketed). ``max_pp`` bounds the pipeline size (1 for activation offload, which
    Megatron-Core refuses with pipelining); ``min_tp`` the tensor group (2 for an overlap of its collectives).
    ``cp`` and ``ep`` are the context- and expert-parallel sizes search holds fixed (``n_gpus`` is then GPUs / cp), ``etp``
    Megatron-Core's expert tensor-parallel size where held (None: each row's tp). Raises InfeasibleError naming the rule
    that removed the last configuration (unless ``empty_ok``: then the empty space comes back with its counts, for a
    search over several such spaces).
    """
    n_gpus, global_batch = check_size("n_gpus", n_gpus, limit="gpus"), check_size("global_batch", global_batch)
    max_micro_batch = check_size("max_micro_batch", max_micro_batch)
    max_virtual_stages = check_size("max_virtual_stages", max_virtual_stages)
    zero = _check_options("zero", zero, (0, 1, 2, 3))
    sequence_parallel = _check_options("sequence_parallel", sequence_parallel, (False, True))
    tp_overlap = _check_options("tp_overlap", tp_overlap, (False, True))
    dp_overlap = _check_options("dp_overlap", dp_overlap, (False, True))
    fsdp = _check_options("fsdp", fsdp, FSDP_CHOICES)
    bucket_mib = tuple(check_positive("bucket_mib", b) for b in _check_options("bucket_mib", bucket_mib))
    if n_gpus * cp <= gpus_per_node:  # one node: hybrid sharding is full sharding
        fsdp = tuple(f for f in fsdp if f != "hybrid") or (None,)
    max_tp = gpus_per_node * check_int("max_tp_nodes", max_tp_nodes)
    pairs = tp_pp_pairs(n_gpus, max_tp, max_pp)
    pairs = pairs[pairs[:, 0] >= min_tp]
    size = (len(pairs) * min(max_micro_batch, global_batch) * max_virtual_stages * len(zero) * len(sequence_parallel)
            * len(bucket_mib) * len(dp_overlap))
    if size > LIMITS["search_grid"]:  # each configuration holds ~10 numbers before the rules thin them out
        raise InvalidInputError(f"the search space of {size:,} configurations ({len(pairs)} (tp, pp) pairs × "
                                f"{min(max_micro_batch, global_batch)} micro-batches × {max_virtual_stages} virtual "
                                f"stages × {len(zero)} zero × {len(sequence_parallel)} sequence_parallel × "
                                f"{len(bucket_mib)} bucket_mib × {len(dp_overlap)} dp_overlap) is above "
                                f"{LIMITS['search_grid']:,}: lower max_micro_batch or max_virtual_stages")
    g, classes, kept = _grid(n_gpus, global_batch, pairs, np.arange(1, max_micro_batch + 1),
                             np.arange(1, max_virtual_stages + 1), np.array(zero), np.array(sequence_parallel, int),
                             np.array(tp_overlap, int), fsdp, bucket_mib, dp_overlap)
    alive = Alive(classes, kept)
    if not alive.any() and empty_ok:  # one of several spaces (a sharded stack on one rank): nothing to count
        return _empty_space(g, n_gpus, global_batch)
    if not alive.any():  # _grid drops zero > 0 without dp > 1, sequence parallelism without tp > 1, ...
        why = [f"zero={list(zero)} needs dp > 1 (add zero=0)"] if 0 not in zero else []
        why += ["sequence_parallel=True needs tp > 1 (add False)"] if False not in sequence_parallel else []
        raise InfeasibleError(f"no parallel configuration of {n_gpus} GPUs is left: {'; '.join(why) or 'none passed'}")
    rejected, detail = _apply_rules(model, global_batch, g, alive, cp, ep,
                                    None if empty_ok else (n_gpus, max_micro_batch), pipeline_engine, schedule, etp)
    rows, cells = alive.final()
    grid = _trimmed({k: v[rows] if v.shape[0] > 1 else v for k, v in g.items()}, cells)  # the rows left
    return Space(arrays=grid.columns_flat(), rejected=rejected, detail=detail, n_gpus=n_gpus,
                 global_batch=global_batch, factored=grid)


def _empty_space(g, n_gpus, global_batch) -> Space:
    grid = Factored(columns={k: np.asarray(g[k])[:0] for k in NUMERIC},
                    mask=np.zeros((0, *(1,) * len(FACTORED_AXES)), bool))
    return Space(arrays=grid.columns_flat(), rejected=dict.fromkeys(REASONS, 0), detail={}, n_gpus=n_gpus,
                 global_batch=global_batch, factored=grid)


class Alive:
    """The grid's cells still in the space while the rules run, without the full mask: each row's count
    of alive cells, and the cells of the rows still alive once a rule reads more than the rows (most
    rows fall to the row rules: the batch divides dp × micro-batch for few of them)."""

    def __init__(self, classes: np.ndarray, kept: np.ndarray):
        self.classes, self.kept = classes, kept
        self.rows = kept.reshape(ROW_CLASSES, -1).sum(axis=1)[classes]  # alive cells per row
        self.index, self.cells = None, None  # rows whose cells are held, and those cells

    def any(self) -> bool:
        return bool(self.rows.any())

    def total(self) -> int:
        return int(self.rows.sum())

    def remove_rows(self, bad: np.ndarray) -> None:
        self.rows = np.where(bad, 0, self.rows)
        if self.index is not None:
            self.cells &= ~bad[self.index].reshape(-1, *(1,) * (self.cells.ndim - 1))

    def held(self) -> np.ndarray:
        """The alive cells of the rows still alive (``index``), held from here on."""
        live = np.flatnonzero(self.rows > 0)
        if self.index is None:
            self.index, self.cells = live, self.kept[self.classes[live]]
        elif live.size != self.index.size:
            keep = self.rows[self.index] > 0
            self.index, self.cells = self.index[keep], self.cells[keep]
        return self.cells

    def at_held(self, mask) -> np.ndarray:
        """``mask`` (broadcasting to the whole grid) at the held rows' cells."""
        mask = np.asarray(mask)
        mask = mask.reshape((1,) * (self.cells.ndim - mask.ndim) + mask.shape)
        rows = mask[self.index] if mask.shape[0] > 1 else mask
        return np.broadcast_to(rows, self.cells.shape)

    def remove_cells(self, bad: np.ndarray) -> None:
        self.cells &= ~bad
        self.rows[self.index] = self.cells.reshape(self.index.size, -1).sum(axis=1)

    def final(self):
        """(the rows with alive cells, in order, and their cells)."""
        if self.index is None:
            live = np.flatnonzero(self.rows > 0)
            return live, self.kept[self.classes[live]]
        self.held()
        return self.index, self.cells


def _apply_rules(model, global_batch, g, alive: Alive, cp, ep, raise_empty, pipeline_engine=False,
                 schedule="interleaved", etp=None):
    """Remove from ``alive`` the cells each rule rejects, in order; (counts per reason, counts per rule).
    ``raise_empty`` (n_gpus, max_micro_batch): raise InfeasibleError when a rule empties the space.
    A rule on the rows alone (dp, tp, pp, micro-batch, virtual stages) is counted on each row's
    alive cells, not cell by cell (the same counts)."""
    rejected, detail = dict.fromkeys(REASONS, 0), {}
    ndim = 1 + len(FACTORED_AXES)
    for reason, text, bad in _rules(model, global_batch, g, cp, ep, pipeline_engine, schedule, etp):
        per_row = _row_rule(bad, ndim)
        if per_row is not None:
            per_row = np.broadcast_to(per_row, alive.rows.shape)
            n, left = int(alive.rows[per_row].sum()), alive.total()
        else:
            cells = alive.held()
            bad = alive.at_held(bad)
            n = int((cells & bad).sum())
            left = alive.total() if n else 0
        rejected[reason] += n
        if n:
            detail[text] = n
        if n and n == left and raise_empty:
            dps = sorted(set(np.asarray(g["dp"]).reshape(-1)[alive.rows > 0].tolist()))
            n_gpus, max_micro_batch = raise_empty
            raise InfeasibleError(_empty_message(reason, text, n_gpus, global_batch, dps, detail, max_micro_batch))
        if per_row is not None:
            alive.remove_rows(per_row)
        else:
            alive.remove_cells(bad)
    return rejected, detail


def _row_rule(bad, ndim: int):
    """A rule's mask as one flag per grid row when it reads the rows alone, else None."""
    bad = np.asarray(bad)
    return bad.reshape(-1) if bad.ndim == ndim and all(n == 1 for n in bad.shape[1:]) else None


def _trimmed(g: dict, alive: np.ndarray) -> Factored:
    """The grid without the rows and axis values that hold no configuration (a traced graph has no
    sequence-parallel cell, and pricing one would raise)."""
    cols = {k: g[k] for k in NUMERIC}
    for axis in range(alive.ndim):
        used = alive.any(axis=tuple(i for i in range(alive.ndim) if i != axis))
        alive = np.compress(used, alive, axis=axis)
        cols = {k: np.compress(used, v, axis=axis) if v.shape[axis] > 1 else v for k, v in cols.items()}
    return Factored(columns=cols, mask=alive)


def _empty_message(reason, text, n_gpus, global_batch, dps, detail, max_micro_batch) -> str:
    counts = "; ".join(f"{t}: {n:,} rejected" for t, n in detail.items())
    head = f"no parallel configuration of {n_gpus} GPUs is left after the {reason} rules (the last, '{text}', emptied it)"
    if reason == "batch":
        head += (f"; global_batch={global_batch} with micro_batch 1..{max_micro_batch} needs a dp that divides it"
                 f" (dp candidates: {', '.join(map(str, dps[:12]))}{'...' if len(dps) > 12 else ''})")
    return f"{head} [{counts}]"
