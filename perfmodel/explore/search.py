"""``search``: rank every valid parallel configuration of a model on a cluster.

The space (``space.enumerate_space``) is priced in one vectorised call of
``compose.evaluate`` per categorical combination (precision × recompute), never
configuration by configuration, so a search and ``predict`` run the same
arithmetic and agree exactly. Configurations that do not fit in GPU memory are
dropped and counted; the rest are ranked by throughput, or by cost when prices
are given.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from itertools import product

import numpy as np
import pandas as pd

from perfmodel import step as compose
from perfmodel.core.errors import InfeasibleError, InvalidInputError, PerfModelError, UnsupportedError, unknown_name
from perfmodel.explore.space import NUMERIC, REASONS, Space, enumerate_space
from perfmodel.parallel.fabric import cluster_collectives
from perfmodel.predict import BOTTLENECK_WORDS, BREAKDOWN_KEYS, config_arrays, default_profile, finish, profile_for
from perfmodel.parallel.strategy import OPTIMIZERS, PLACEMENTS, Strategy, check_against
from perfmodel.core.checks import check_choice, check_int, check_positive
from perfmodel.workload.presets import as_model
from perfmodel.workload.kernels import PRECISIONS, RECOMPUTE, gemm_dtype

# sortable columns: True where larger is better
SORT_COLUMNS = {"tokens_per_second": True, "samples_per_second": True, "tflops_per_gpu": True, "mfu": True,
                "step_time": False, "peak_memory": False, **dict.fromkeys(BREAKDOWN_KEYS, False)}
COST_COLUMNS = {"usd_per_million_tokens": False, "usd_per_hour": False}
LEAD = ("cluster", "gpus", "dp", "tp", "pp", "virtual_stages", "schedule", "micro_batch", "micro_batches",
        "global_batch", "zero", "recompute", "sequence_parallel", "precision")
RESULTS = ("step_time", "tokens_per_second", "samples_per_second", "tflops_per_gpu", "mfu", "peak_memory",
           "memory_capacity", "fits", "over_capacity")
# Strategy fields search holds fixed: the software stack, the context- and expert-parallel sizes
STACK_FIELDS = {"framework": str, "attention": str, "tp_overlap": bool, "dp_overlap": bool, "cp": int, "ep": int}


def _clusters(cluster) -> list:
    from perfmodel.hardware import as_cluster

    items = cluster if isinstance(cluster, (list, tuple)) else [cluster]
    if not items:
        raise InvalidInputError("'cluster' must name at least one cluster: got an empty list")
    return [as_cluster(c) for c in items]


def price_per_gpu_hour(prices, cluster) -> float:
    """$/GPU-hour of ``cluster`` from a number or a mapping keyed by cluster, node or GPU name."""
    if isinstance(prices, (int, float)) and not isinstance(prices, bool):
        return check_positive("prices", prices)
    if not isinstance(prices, Mapping):
        raise InvalidInputError(f"'prices' must be $ per GPU-hour, or a mapping of them by cluster, node or GPU "
                                f"name: got {prices!r}")
    for key in (cluster.name, cluster.node.name, cluster.gpu.name):
        if key in prices:
            return check_positive(f"prices[{key!r}]", prices[key])
    raise unknown_name(f"price for cluster {cluster.name!r}; price key", cluster.gpu.name, prices)


FRAMEWORK_CHOICES = ("pytorch", "megatron")
CP_CHOICES = (1, 2, 4, 8, 16)  # context-parallel sizes the default space tries (those the GPUs and sequence allow)
CHUNK = 32_768  # configurations priced per call: enough to amortise numpy's per-call cost, few MB of columns


def _chunks(model, cl, space: Space, prof, opts, stack: dict, chunk: int):
    """Column dicts of ``chunk`` configurations of ``space`` at a time, under each (precision, recompute)."""
    coll = cluster_collectives(cl, prof)
    base = config_arrays(opts["base"])
    full = space.compose_arrays()
    n = len(space)
    for precision, recompute in product(opts["precision"], opts["recompute"]):
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            c = {**base, **{k: v[lo:hi] for k, v in full.items()}, "framework": stack["framework"],
                 "attention": stack["attention"], "dp_overlap": np.bool_(stack["dp_overlap"]),
                 "cp": stack["cp"], "ep": stack["ep"]}
            out = compose.evaluate(model, cl, prof, coll, c, precision=precision, recompute=recompute,
                                   optimizer=opts["optimizer"], placement=opts["placement"])
            out["micro_batch"] = c["micro_batch"]
            derived = finish(model, cl, space.global_batch, out, precision, recompute, cl.n_gpus)
            m = hi - lo
            cols = {k: space.arrays[k][lo:hi] for k in NUMERIC}
            cols["precision"] = np.full(m, precision, dtype=object)
            cols["recompute"] = np.full(m, recompute, dtype=object)
            for k, v in stack.items():  # the software stack, cp and ep, the same for every row of the chunk
                if k != "tp_overlap":
                    cols[k] = np.full(m, v, dtype=object if isinstance(v, str) else type(v))
            merged = {**out, **derived}
            for k in (*RESULTS, *BREAKDOWN_KEYS):
                cols[k] = np.broadcast_to(merged[k], (m,))
            for k, v in out["memory"].items():
                cols["mem_" + k] = np.broadcast_to(v, (m,))
            yield cols


def _stacks(model, cl, opts) -> list[dict]:
    """The (framework, cp) combinations to price on ``cl``, each with the stack fields search holds fixed.

    A tuple of ``cp`` values keeps those the cluster and model allow (cp divides the GPUs, the sequence
    splits into 2 × cp chunks), as the space keeps only the tp that divide the GPUs; a single value
    that does not fit is an error.
    """
    st = opts["stack"]
    cps = []
    for cp in st["cp"]:
        if cl.n_gpus % cp:
            if opts["cp_fixed"]:
                raise InvalidInputError(f"'cp'={cp} must divide the GPU count {cl.n_gpus} of {cl.name}")
            continue
        if cp > 1 or st["ep"] > 1:  # the sequence (2·cp chunks) and expert rules, once, on the simplest layout
            try:
                check_against(model, cl.n_gpus, Strategy(dp=cl.n_gpus // cp, cp=cp, ep=st["ep"], micro_batch=1))
            except PerfModelError:
                if opts["cp_fixed"] or cp == 1:
                    raise
                continue
        cps.append(cp)
    def overlap(fw):  # the asynchronous tensor-parallel communication is Megatron-LM's
        choices = st["tp_overlap"]
        return choices if fw == "megatron" or len(choices) == 1 else tuple(c for c in choices if not c)

    return [{"framework": fw, "attention": st["attention"], "tp_overlap": overlap(fw),
             "dp_overlap": st["dp_overlap"], "cp": cp, "ep": st["ep"]} for cp in cps for fw in st["framework"]]


class _Best:
    """The ``top_k`` best feasible rows seen so far, with counts, in bounded memory."""

    def __init__(self, top_k: int, sort_by: str, larger_is_better: bool):
        self.top_k, self.sort_by, self.sign = top_k, sort_by, -1.0 if larger_is_better else 1.0
        self.rows: dict | None = None
        self.closest: dict | None = None  # the configuration nearest to fitting, for the error message
        self.evaluated = self.feasible = 0

    def add(self, cols: dict) -> None:
        n = cols["dp"].size
        cols["order"] = np.arange(self.evaluated, self.evaluated + n)
        self.evaluated += n
        i = int(np.argmin(cols["over_capacity"]))
        if self.closest is None or cols["over_capacity"][i] < self.closest["over_capacity"][0]:
            self.closest = {k: v[i:i + 1] for k, v in cols.items()}
        fits = np.asarray(cols["fits"], bool)
        self.feasible += int(fits.sum())
        if not fits.any():
            return
        keep = {k: np.asarray(v)[fits] for k, v in cols.items()}
        if self.rows is not None:
            keep = {k: np.concatenate([self.rows[k], keep[k]]) for k in self.rows}
        order = self._order(keep)[:self.top_k]
        self.rows = {k: v[order] for k, v in keep.items()}

    def _order(self, cols) -> np.ndarray:
        # ties: less memory first, then enumeration order (stable)
        return np.lexsort((cols["order"], cols["peak_memory"], self.sign * cols[self.sort_by].astype(float)))


def _choices(value, kind) -> tuple:
    """A search option as a tuple of choices: one value (of ``kind``) or a sequence of them."""
    return (value,) if isinstance(value, kind) else tuple(value)


def _options(precision, recompute, zero, optimizer, placement, stack):
    precision = (precision,) if isinstance(precision, str) else tuple(precision)
    recompute = (recompute,) if isinstance(recompute, str) else tuple(recompute)
    zero = (zero,) if isinstance(zero, int) else tuple(zero)
    cp_fixed = isinstance(stack["cp"], int)
    stack = {**stack, "framework": _choices(stack["framework"], str), "tp_overlap": _choices(stack["tp_overlap"], bool),
             "cp": _choices(stack["cp"], int)}
    for name in ("framework", "tp_overlap", "cp"):
        if not stack[name]:
            raise InvalidInputError(f"{name!r} must list at least one value: got an empty list")
    for name, values, valid in (("precision", precision, PRECISIONS), ("recompute", recompute, RECOMPUTE)):
        if not values:
            raise InvalidInputError(f"{name!r} must list at least one value: got an empty list")
        for v in values:
            check_choice(name, v, valid)
    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_choice("placement", placement, PLACEMENTS)
    # the fields search holds fixed, checked by Strategy (which names a bad one); the space replaces dp
    if not cp_fixed:  # a list of cp sizes keeps those the stack can run (context parallelism needs flash
        # attention; with expert parallelism the layout places ep inside dp, so cp stays 1 unless asked for)
        stack["cp"] = tuple(cp for cp in stack["cp"] if check_int("cp", cp) == 1
                            or (stack["attention"] == "flash" and stack["ep"] == 1))
    for fw, cp, overlap in product(stack["framework"], stack["cp"], stack["tp_overlap"]):
        one = {**stack, "framework": fw, "cp": check_int("cp", cp), "tp_overlap": overlap}
        base = Strategy(dp=stack["ep"], optimizer=optimizer, placement=placement, **one)
    return {"precision": precision, "recompute": recompute, "zero": zero, "optimizer": optimizer,
            "placement": placement, "stack": stack, "base": base, "cp_fixed": cp_fixed}


def _check_precisions(cl, precisions) -> None:
    missing = [p for p in precisions if gemm_dtype(p) not in cl.gpu.peak_flops]
    if missing:
        raise UnsupportedError(f"{cl.gpu.name} has no {', '.join(gemm_dtype(p) for p in missing)} support "
                               f"(supported: {', '.join(sorted(cl.gpu.peak_flops))}); drop {missing} from 'precision'")


def _memory_message(cols, evaluated, capacity_note, opts) -> str:
    i = 0
    need = (cols["memory_capacity"][i] + cols["over_capacity"][i]) / 2**30
    at = ", ".join(f"{k}={_plain(cols[k][i])}" for k in ("dp", "tp", "pp", "micro_batch", "zero", "recompute"))
    tips = ["more GPUs or GPUs with more memory"]
    tips += [] if 3 in opts["zero"] else ["zero=3"]
    tips += [] if "full" in opts["recompute"] else ["recompute='full'"]
    return (f"no configuration fits in memory: all {evaluated:,} that pass the divisibility and batch "
            f"rules need more than {capacity_note}; the smallest needs {need:.1f} GiB per GPU ({at}); "
            f"try {' or '.join(tips)}")


def _plain(x):
    return x.item() if hasattr(x, "item") else x


def strategy_of(row, *, optimizer: str = "adamw", placement: str = "tp-pp-dp") -> Strategy:
    """The ``Strategy`` of one search (or compare/sweep) row, for ``pm.predict``."""
    v = int(row["virtual_stages"])
    defaults = Strategy()
    stack = {k: cast(row.get(k, getattr(defaults, k))) for k, cast in STACK_FIELDS.items()}
    return Strategy(dp=int(row["dp"]), tp=int(row["tp"]), pp=int(row["pp"]), micro_batch=int(row["micro_batch"]),
                    global_batch=int(row["global_batch"]), zero=int(row["zero"]), recompute=str(row["recompute"]),
                    precision=str(row["precision"]), optimizer=optimizer, placement=placement,
                    schedule="interleaved" if v > 1 else "1f1b", virtual_stages=v,
                    sequence_parallel=bool(row["sequence_parallel"]), **stack)


def _table(cols: dict, idx: np.ndarray, global_batch: int) -> pd.DataFrame:
    """The rows ``idx`` of the flat arrays as a DataFrame, with schedule and bottleneck filled in."""
    top = {k: v[idx] for k, v in cols.items()}
    top["cluster"] = top.pop("cluster_name")
    top["global_batch"] = np.full(idx.size, global_batch)
    top["schedule"] = np.where(top["virtual_stages"] > 1, "interleaved", "1f1b")
    top["fits"] = top["fits"].astype(bool)
    words = np.array([BOTTLENECK_WORDS[k] for k in BREAKDOWN_KEYS], dtype=object)
    top["bottleneck"] = words[np.argmax(np.stack([top[k] for k in BREAKDOWN_KEYS]), axis=0)]
    first = [k for k in (*LEAD, *RESULTS, "bottleneck", *COST_COLUMNS, *BREAKDOWN_KEYS) if k in top]
    return pd.DataFrame({k: top[k] for k in first + sorted(set(top) - set(first))})


def search(model, cluster, global_batch: int, *, top_k: int = 10, sort_by: str | None = None, prices=None,
           profile=None, max_micro_batch: int = 8, max_virtual_stages: int = 8,
           recompute=("none", "selective", "full"), zero=(0, 1, 2, 3), sequence_parallel=(False, True),
           precision=("bf16-mixed",), optimizer: str = "adamw", placement: str = "tp-pp-dp",
           max_tp_nodes: int = 1, framework=FRAMEWORK_CHOICES, attention: str = "flash", tp_overlap=(False, True),
           dp_overlap: bool = True, cp=CP_CHOICES, ep: int = 1, chunk: int = CHUNK) -> pd.DataFrame:
    """The ``top_k`` fastest (or cheapest) configurations that fit, best first.

    ``framework``, ``attention``, ``tp_overlap`` and ``dp_overlap`` describe the
    software stack (``pm.Strategy`` fields); ``framework`` and ``tp_overlap`` may list
    choices (the default: both frameworks, Megatron-LM's overlapped tensor-parallel
    communication on or off; plain PyTorch has no such overlap, so it is searched
    without it unless asked for alone). ``cp``, the context-parallel size, is one value
    or a list of them (dp × tp × pp then fill GPUs / cp; sizes the GPUs or the
    sequence cannot take are left out); ``ep``, the expert-parallel size, is one value
    (configurations whose dp × cp it does not divide are rejected). The space is priced
    ``chunk`` configurations at a time, keeping only the ``top_k`` best: memory stays
    bounded whatever its size.

    ``cluster`` is a Cluster, a name, or a list of them (each searched whole).
    ``sort_by`` defaults to "tokens_per_second", or "usd_per_million_tokens" when
    ``prices`` ($/GPU-hour: a number, or a mapping keyed by cluster, node or GPU
    name) are given. The result's ``attrs`` hold "rejected" (configurations per
    reason: divisibility, batch, memory), "rejected_detail" (per rule),
    "evaluated", "feasible" and "seconds".
    """
    t0 = time.perf_counter()
    top_k = check_int("top_k", top_k)
    model = as_model(model)
    opts = _options(precision, recompute, zero, optimizer, placement,
                    {"framework": framework, "attention": attention, "tp_overlap": tp_overlap, "dp_overlap": dp_overlap,
                     "cp": cp, "ep": ep})
    valid = {**SORT_COLUMNS, **(COST_COLUMNS if prices is not None else {})}
    sort_by = sort_by or ("usd_per_million_tokens" if prices is not None else "tokens_per_second")
    if sort_by not in valid:
        raise unknown_name("sort column", sort_by, valid)
    combos = len(opts["precision"]) * len(opts["recompute"])
    rejected, detail, capacity = dict.fromkeys(REASONS, 0), {}, []
    best = _Best(top_k, sort_by, valid[sort_by])
    any_space = False
    for cl in _clusters(cluster):
        _check_precisions(cl, opts["precision"])
        prof = default_profile(cl) if profile is None else profile_for(cl, profile)
        price = price_per_gpu_hour(prices, cl) * cl.n_gpus if prices is not None else None
        capacity.append(f"{cl.gpu.mem_bytes / 2**30:.0f} GiB on {cl.name}")
        stacks = _stacks(model, cl, opts)
        for stack in stacks:
            space_of = functools.partial(
                enumerate_space, model, cl.n_gpus // stack["cp"], cl.gpus_per_node, global_batch,
                max_micro_batch=max_micro_batch, max_virtual_stages=max_virtual_stages, zero=opts["zero"],
                sequence_parallel=sequence_parallel, max_tp_nodes=max_tp_nodes, cp=stack["cp"], ep=ep,
                tp_overlap=stack["tp_overlap"])
            space = space_of(empty_ok=len(stacks) > 1)
            if not len(space) and stack is stacks[-1] and not any_space:
                space_of()  # every layout emptied: the error of the last one names the rule
            any_space = any_space or len(space) > 0
            for k in ("divisibility", "batch"):
                rejected[k] += space.rejected[k] * combos
            for k, v in space.detail.items():
                detail[k] = detail.get(k, 0) + v * combos
            for cols in _chunks(model, cl, space, prof, opts, stack, chunk):
                n = cols["dp"].size
                cols["cluster_name"] = np.full(n, cl.name, dtype=object)
                cols["gpus"] = np.full(n, cl.n_gpus)
                if price is not None:
                    cols["usd_per_hour"] = np.full(n, price)
                    cols["usd_per_million_tokens"] = price / 3600.0 / cols["tokens_per_second"] * 1e6
                best.add(cols)
    rejected["memory"] = best.evaluated - best.feasible
    if best.rows is None:
        raise InfeasibleError(_memory_message(best.closest, best.evaluated, " / ".join(capacity), opts))
    rows = best.rows
    rows.pop("order")
    df = _table(rows, np.arange(rows["dp"].size), int(global_batch))
    df.attrs.update(rejected=rejected, rejected_detail=detail, evaluated=best.evaluated, feasible=best.feasible,
                    sort_by=sort_by, seconds=time.perf_counter() - t0)
    return df
