"""``search``: rank every valid parallel configuration of a model on a cluster.

The space (``space.enumerate_space``) is priced in one vectorised call of
``compose.evaluate`` per categorical combination (precision × recompute), never
configuration by configuration, so a search and ``predict`` run the same
arithmetic and agree exactly. Configurations that do not fit in GPU memory are
dropped and counted; the rest are ranked by throughput, or by cost when prices
are given.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from itertools import product

import numpy as np
import pandas as pd

from perfmodel import step as compose
from perfmodel.core.errors import InfeasibleError, InvalidInputError, UnsupportedError, unknown_name
from perfmodel.explore.space import NUMERIC, REASONS, Space, enumerate_space
from perfmodel.parallel.fabric import cluster_collectives
from perfmodel.predict import BOTTLENECK_WORDS, BREAKDOWN_KEYS, default_profile, finish, profile_for
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


def _evaluate(model, cl, space: Space, prof, opts) -> dict:
    """Every configuration of ``space`` under each (precision, recompute): flat arrays."""
    coll = cluster_collectives(cl, prof)
    # fields search does not vary (DDP bucket, no parameter server...) as one Strategy has them
    c = space.step_config(opts["base"])
    n = len(space)
    parts = []
    for precision, recompute in product(opts["precision"], opts["recompute"]):
        out = compose.evaluate(model, cl, prof, coll, c, precision=precision, recompute=recompute,
                               optimizer=opts["optimizer"], placement=opts["placement"])
        out["micro_batch"] = c.micro_batch
        derived = finish(model, cl, space.global_batch, out, precision, recompute, cl.n_gpus)
        cols = {k: space.arrays[k] for k in NUMERIC}
        cols["precision"] = np.full(n, precision, dtype=object)
        cols["recompute"] = np.full(n, recompute, dtype=object)
        for k, v in opts["stack"].items():  # the software stack, cp and ep, the same for every row
            cols[k] = np.full(n, v, dtype=object if isinstance(v, str) else type(v))
        merged = {**out, **derived}
        for k in (*RESULTS, *BREAKDOWN_KEYS):
            cols[k] = np.broadcast_to(merged[k], (n,))
        for k, v in out["memory"].items():
            cols["mem_" + k] = np.broadcast_to(v, (n,))
        parts.append(cols)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _options(precision, recompute, zero, optimizer, placement, stack):
    precision = (precision,) if isinstance(precision, str) else tuple(precision)
    recompute = (recompute,) if isinstance(recompute, str) else tuple(recompute)
    zero = (zero,) if isinstance(zero, int) else tuple(zero)
    for name, values, valid in (("precision", precision, PRECISIONS), ("recompute", recompute, RECOMPUTE)):
        if not values:
            raise InvalidInputError(f"{name!r} must list at least one value: got an empty list")
        for v in values:
            check_choice(name, v, valid)
    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_choice("placement", placement, PLACEMENTS)
    # the fields search holds fixed, checked by Strategy (which names a bad one); the space replaces dp
    base = Strategy(dp=stack["ep"], optimizer=optimizer, placement=placement, **stack)
    return {"precision": precision, "recompute": recompute, "zero": zero, "optimizer": optimizer,
            "placement": placement, "stack": stack, "base": base}


def _check_precisions(cl, precisions) -> None:
    missing = [p for p in precisions if gemm_dtype(p) not in cl.gpu.peak_flops]
    if missing:
        raise UnsupportedError(f"{cl.gpu.name} has no {', '.join(gemm_dtype(p) for p in missing)} support "
                               f"(supported: {', '.join(sorted(cl.gpu.peak_flops))}); drop {missing} from 'precision'")


def _sort_order(cols: dict, sort_by: str, valid: dict) -> np.ndarray:
    if sort_by not in valid:
        raise unknown_name("sort column", sort_by, valid)
    key = cols[sort_by].astype(float)
    key = -key if valid[sort_by] else key
    # ties: less memory first, then enumeration order (stable)
    return np.lexsort((np.arange(key.size), cols["peak_memory"], key))


def _memory_message(cols, capacity_note, opts) -> str:
    i = int(np.argmin(cols["over_capacity"]))
    need = (cols["memory_capacity"][i] + cols["over_capacity"][i]) / 2**30
    at = ", ".join(f"{k}={_plain(cols[k][i])}" for k in ("dp", "tp", "pp", "micro_batch", "zero", "recompute"))
    tips = ["more GPUs or GPUs with more memory"]
    tips += [] if 3 in opts["zero"] else ["zero=3"]
    tips += [] if "full" in opts["recompute"] else ["recompute='full'"]
    return (f"no configuration fits in memory: all {cols['fits'].size:,} that pass the divisibility and batch "
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
           max_tp_nodes: int = 1, framework: str = "pytorch", attention: str = "flash", tp_overlap: bool = False,
           dp_overlap: bool = True, cp: int = 1, ep: int = 1) -> pd.DataFrame:
    """The ``top_k`` fastest (or cheapest) configurations that fit, best first.

    ``framework``, ``attention``, ``tp_overlap`` and ``dp_overlap`` describe the
    software stack (``pm.Strategy`` fields) and hold for every configuration, as
    do the context-parallel size ``cp`` (dp × tp × pp then fill GPUs / cp) and the
    expert-parallel size ``ep`` (configurations whose dp × cp it does not divide are rejected).

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
    rejected, detail, chunks, capacity = dict.fromkeys(REASONS, 0), {}, [], []
    for cl in _clusters(cluster):
        _check_precisions(cl, opts["precision"])
        if cl.n_gpus % cp:
            raise InvalidInputError(f"'cp'={cp} must divide the GPU count {cl.n_gpus} of {cl.name}")
        if cp > 1 or ep > 1:  # the sequence (2·cp chunks) and expert rules, once, on the simplest layout
            check_against(model, cl.n_gpus, Strategy(dp=cl.n_gpus // cp, cp=cp, ep=ep, micro_batch=1))
        space = enumerate_space(model, cl.n_gpus // cp, cl.gpus_per_node, global_batch, max_micro_batch=max_micro_batch,
                                max_virtual_stages=max_virtual_stages, zero=opts["zero"],
                                sequence_parallel=sequence_parallel, max_tp_nodes=max_tp_nodes, cp=cp, ep=ep)
        for k in ("divisibility", "batch"):
            rejected[k] += space.rejected[k] * combos
        for k, v in space.detail.items():
            detail[k] = detail.get(k, 0) + v * combos
        prof = default_profile(cl) if profile is None else profile_for(cl, profile)
        cols = _evaluate(model, cl, space, prof, opts)
        n = cols["dp"].size
        cols["cluster_name"] = np.full(n, cl.name, dtype=object)
        cols["gpus"] = np.full(n, cl.n_gpus)
        if prices is not None:
            cols["usd_per_hour"] = np.full(n, price_per_gpu_hour(prices, cl) * cl.n_gpus)
            cols["usd_per_million_tokens"] = cols["usd_per_hour"] / 3600.0 / cols["tokens_per_second"] * 1e6
        chunks.append(cols)
        capacity.append(f"{cl.gpu.mem_bytes / 2**30:.0f} GiB on {cl.name}")
    cols = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    fits = cols["fits"].astype(bool)
    rejected["memory"] = int((~fits).sum())
    if not fits.any():
        raise InfeasibleError(_memory_message(cols, " / ".join(capacity), opts))
    feasible = {k: v[fits] for k, v in cols.items()}
    order = _sort_order(feasible, sort_by, valid)[:top_k]
    df = _table(feasible, order, int(global_batch))
    df.attrs.update(rejected=rejected, rejected_detail=detail, evaluated=int(fits.size), feasible=int(fits.sum()),
                    sort_by=sort_by, seconds=time.perf_counter() - t0)
    return df
