"""``search``: rank every valid parallel configuration of a model on a cluster.

The space (``space.enumerate_space``, one per software stack and context-parallel
size) is priced in vectorised calls of ``compose.evaluate`` per categorical
combination (precision × recompute), a chunk of its factored grid at a time and never
configuration by configuration (``chunks.py``), so a search and ``predict`` run the
same arithmetic and agree exactly. Configurations that do not fit in GPU memory are
dropped and counted; the rest are ranked by throughput, or by cost when prices
are given.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import time
from collections.abc import Iterable, Mapping
from itertools import product

import numpy as np
import pandas as pd

from perfmodel.core.errors import InfeasibleError, InvalidInputError, PerfModelError, UnsupportedError, unknown_name
from perfmodel.explore.chunks import CHUNK, RESULTS, Job, Ranking, price_jobs
from perfmodel.explore.space import FSDP_CHOICES, REASONS, enumerate_space
from perfmodel.explore.ties import mark_ties
from perfmodel.interval import DEFAULT_LEVEL, check_level
from perfmodel.predict import BOTTLENECK_WORDS, BREAKDOWN_KEYS, default_profile, profile_for
from perfmodel.parallel.strategy import OPTIMIZERS, PLACEMENTS, Strategy, check_against
from perfmodel.core.checks import check_choice, check_flag, check_int, check_positive
from perfmodel.workload.presets import as_model
from perfmodel.workload import stacks
from perfmodel.workload.kernels import PRECISIONS, RECOMPUTE, gemm_dtype  # noqa: F401 (RECOMPUTE re-exported)
from perfmodel.workload.stacks.checkpointing import check_recompute
from perfmodel.hardware import as_cluster

# sortable columns: True where larger is better
SORT_COLUMNS = {"tokens_per_second": True, "samples_per_second": True, "tflops_per_gpu": True, "mfu": True,
                "step_time": False, "peak_memory": False, **dict.fromkeys(BREAKDOWN_KEYS, False)}
COST_COLUMNS = {"usd_per_million_tokens": False, "usd_per_hour": False}
LEAD = ("cluster", "gpus", "dp", "tp", "pp", "virtual_stages", "schedule", "micro_batch", "micro_batches",
        "global_batch", "zero", "bucket_mib", "recompute", "sequence_parallel", "precision")
# Strategy fields search holds fixed: the software stack, the context- and expert-parallel sizes
STACK_FIELDS = {"framework": str, "attention": str, "tp_overlap": bool, "dp_overlap": bool, "cp": int, "ep": int}


def _clusters(cluster) -> list:
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
# DDP / ZeRO-1/2 gradient buckets the default space tries (MiB): torch DDP's bucket_cap_mb default (25)
# and larger ones, toward Megatron-Core's default of 40M parameters (160 MB of fp32 gradients, ~153 MiB)
BUCKET_CHOICES = (25.0, 100.0, 400.0)
CP_CHOICES = (1, 2, 4, 8, 16)  # context-parallel sizes the default space tries (those the GPUs and sequence allow)
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
    def overlap(fw, name, plain):  # the overlap switches are Megatron-LM's; PyTorch has ``plain`` only
        choices = st[name]
        return choices if fw == "megatron" or len(choices) == 1 else tuple(c for c in choices if c == plain)

    return [{"framework": fw, "attention": st["attention"], "tp_overlap": overlap(fw, "tp_overlap", False),
             "dp_overlap": overlap(fw, "dp_overlap", True), "cp": cp, "ep": st["ep"], "compile": st["compile"]} for cp in cps for fw in st["framework"]]


def _buckets(bucket_mib) -> tuple:
    """The bucket sizes to try (MiB), each checked as ``Strategy.bucket_mib`` checks it."""
    values = _values("bucket_mib", bucket_mib, lambda n, v: check_positive(n, v))
    for v in values:
        Strategy(bucket_mib=v)
    return values


def _choices(value, kind) -> tuple:
    """A search option as a tuple of choices: one value (of ``kind``) or a sequence of them."""
    return (value,) if isinstance(value, kind) else tuple(value)


def _values(name: str, value, check) -> tuple:
    """One value or a list of them (a string is one value), each passed through ``check``."""
    if isinstance(value, (str, bytes, numbers.Number)) or value is None or not isinstance(value, Iterable):
        value = (value,)
    return tuple(check(name, v) for v in value)


def _options(precision, recompute, zero, optimizer, placement, stack):
    frameworks = _choices(stack["framework"], str)
    specs = [stacks.stack(fw) for fw in frameworks]
    if recompute is None:  # the policies the frameworks have (docs/stacks.md)
        recompute = tuple(dict.fromkeys(p for spec in specs for p in spec.searched))
    if specs and all(spec.sharding in ("fsdp1", "fsdp2") for spec in specs):  # FSDP stacks shard everything
        zero = 3
    precision = _values("precision", precision, lambda n, v: v)
    recompute = _values("recompute", recompute, lambda n, v: v)
    zero = _values("zero", zero, lambda n, v: check_int(n, v, minimum=0))
    sequence_parallel = _values("sequence_parallel", stack.pop("sequence_parallel"), check_flag)
    cp_fixed = isinstance(stack["cp"], int)
    stack = {**stack, "framework": _choices(stack["framework"], str), "tp_overlap": _choices(stack["tp_overlap"], bool),
             "dp_overlap": _values("dp_overlap", stack["dp_overlap"], check_flag),
             "cp": _choices(stack["cp"], int)}
    for name in ("framework", "tp_overlap", "dp_overlap", "cp"):
        if not stack[name]:
            raise InvalidInputError(f"{name!r} must list at least one value: got an empty list")
    for name, values, valid in (("precision", precision, PRECISIONS), ("recompute", recompute, RECOMPUTE)):
        if not values:
            raise InvalidInputError(f"{name!r} must list at least one value: got an empty list")
        for v in values:
            check_choice(name, v, valid) if name == "precision" else check_recompute(v)
            if name == "recompute":
                for spec in specs:
                    stacks.check_stack_options(spec.name, recompute=v, compile=stack.get("compile", False))
    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_choice("placement", placement, PLACEMENTS)
    # the fields search holds fixed, checked by Strategy (which names a bad one); the space replaces dp
    if not cp_fixed:  # a list of cp sizes keeps those the stack can run (context parallelism needs flash
        # attention; with expert parallelism the layout places ep inside dp, so cp stays 1 unless asked for)
        stack["cp"] = tuple(cp for cp in stack["cp"] if check_int("cp", cp) == 1
                            or (stack["attention"] == "flash" and stack["ep"] == 1))
    for fw, cp, overlap in product(stack["framework"], stack["cp"], stack["tp_overlap"]):
        one = {**stack, "framework": fw, "cp": check_int("cp", cp), "tp_overlap": overlap,
               "dp_overlap": stack["dp_overlap"][0]}
        base = Strategy(dp=stack["ep"], optimizer=optimizer, placement=placement, **one)
    return {"precision": precision, "recompute": recompute, "zero": zero, "optimizer": optimizer,
            "placement": placement, "stack": stack, "base": base, "cp_fixed": cp_fixed,
            "sequence_parallel": sequence_parallel}


def _check_graph(model, opts) -> None:
    """A traced graph's own limits on the stack search holds fixed (data parallel only: the default
    cp choices shrink to 1)."""
    if hasattr(model, "check_strategy"):
        if not opts["cp_fixed"]:
            opts["stack"]["cp"] = (1,)
        model.check_strategy(dataclasses.replace(opts["base"], cp=opts["stack"]["cp"][0]))


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
    fsdp = row.get("fsdp")
    stack["fsdp"] = fsdp if isinstance(fsdp, str) else None  # a table cell may hold NaN for None
    bucket = row.get("bucket_mib")  # a compare or sweep row may hold the Strategy's default (None, NaN)
    if bucket is not None and bucket == bucket:
        stack["bucket_mib"] = float(bucket)
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


def _sort_column(sort_by, prices) -> tuple[str, bool]:
    """The sort column (default: tokens/s, or $ per million tokens when ``prices`` are given) and
    whether larger is better in it."""
    valid = {**SORT_COLUMNS, **(COST_COLUMNS if prices is not None else {})}
    sort_by = sort_by or ("usd_per_million_tokens" if prices is not None else "tokens_per_second")
    if sort_by not in valid:
        raise unknown_name("sort column", sort_by, valid)
    return sort_by, valid[sort_by]


def _jobs(model, cluster, global_batch, opts, limits, profile, prices):
    """(jobs, rejected counts, counts per rule, capacity notes): one job per cluster and stack, its space
    enumerated (``limits``: the keyword arguments of ``enumerate_space`` search passes through)."""
    combos = len(opts["precision"]) * len(opts["recompute"])
    rejected, detail, capacity, jobs = dict.fromkeys(REASONS, 0), {}, [], []
    for cl in _clusters(cluster):
        _check_precisions(cl, opts["precision"])
        prof = default_profile(cl) if profile is None else profile_for(cl, profile)
        price = price_per_gpu_hour(prices, cl) * cl.n_gpus if prices is not None else None
        capacity.append(f"{cl.gpu.mem_bytes / 2**30:.0f} GiB on {cl.name}")
        stacks = _stacks(model, cl, opts)
        for stack in stacks:
            space_of = functools.partial(
                enumerate_space, model, cl.n_gpus // stack["cp"], cl.gpus_per_node, global_batch, zero=opts["zero"],
                sequence_parallel=opts["sequence_parallel"], cp=stack["cp"], tp_overlap=stack["tp_overlap"],
                dp_overlap=stack["dp_overlap"],
                **limits)
            space = space_of(empty_ok=len(stacks) > 1)
            if stack is stacks[-1] and not len(space) and not any(len(j.space) for j in jobs):
                space_of()  # every layout emptied: the error of the last one names the rule
            for k in ("divisibility", "batch"):
                rejected[k] += space.rejected[k] * combos
            for k, v in space.detail.items():
                detail[k] = detail.get(k, 0) + v * combos
            jobs.append(Job(len(jobs), cl, prof, price, stack, space))
    return jobs, rejected, detail, capacity


def search(model, cluster, global_batch: int, *, top_k: int = 10, sort_by: str | None = None, prices=None,
           profile=None, max_micro_batch: int = 8, max_virtual_stages: int = 8,
           recompute=None, zero=(0, 1, 2, 3), fsdp=FSDP_CHOICES,
           sequence_parallel=(False, True),
           precision=("bf16-mixed",), optimizer: str = "adamw", placement: str = "tp-pp-dp",
           max_tp_nodes: int = 1, framework=FRAMEWORK_CHOICES, attention: str = "flash", tp_overlap=(False, True),
           dp_overlap=(True, False), cp=CP_CHOICES, ep: int = 1, bucket_mib=BUCKET_CHOICES, chunk: int = CHUNK,
           workers: int | None = 1, level: float = DEFAULT_LEVEL, compile: bool = False) -> pd.DataFrame:
    """The ``top_k`` fastest (or cheapest) configurations that fit, best first.

    ``recompute`` defaults to the checkpointing policies the frameworks have (docs/stacks.md);
    under FSDP frameworks (torchtitan, fsdp1) ``zero`` is 3. ``compile`` (torch.compile)
    holds for every configuration.

    ``zero`` lists the ZeRO stages and ``fsdp`` the PyTorch FSDP modes (None, "full",
    "hybrid") the space tries for sharding (an FSDP row shows zero=3). ``framework``,
    ``attention``, ``tp_overlap`` and ``dp_overlap`` describe the software stack
    (``pm.Strategy`` fields); ``framework``, ``tp_overlap`` and ``dp_overlap`` may list
    choices (the default: both frameworks, Megatron-LM's overlapped tensor-parallel
    communication and gradient reduction each on or off; plain PyTorch has neither switch,
    so it is searched with its own behaviour unless one value is asked for). ``bucket_mib``
    lists the DDP / ZeRO-1/2 gradient buckets tried (MiB; ZeRO-3 and FSDP rows, which
    bucket nothing, take the first). ``cp``, the context-parallel size, is one value
    or a list of them (dp × tp × pp then fill GPUs / cp; sizes the GPUs or the
    sequence cannot take are left out); ``ep``, the expert-parallel size, is one value
    (configurations whose dp × cp it does not divide are rejected). The space is priced
    ``chunk`` grid cells at a time, keeping only the ``top_k`` best: memory stays
    bounded whatever its size. ``workers`` > 1 shares a large space among that many forked
    processes (None: the CPUs this process may use), with results identical to one; the
    default prices in this process (forking is unsafe beside threads, and on a busy
    machine a second process gained nothing: docs/explore.md).

    ``cluster`` is a Cluster, a name, or a list of them (each searched whole).
    ``sort_by`` defaults to "tokens_per_second", or "usd_per_million_tokens" when
    ``prices`` ($/GPU-hour: a number, or a mapping keyed by cluster, node or GPU
    name) are given. The result's ``attrs`` hold "rejected" (configurations per
    reason: divisibility, batch, memory), "rejected_detail" (per rule),
    "evaluated", "feasible" and "seconds".

    Each row carries its step-time interval at ``level`` (``step_time_low``/``step_time_high``);
    ``tie`` marks the rows whose interval of the sort column overlaps the first's, and
    ``attrs["ties"]`` counts them: the model cannot rank those (docs/accuracy.md).
    """
    t0 = time.perf_counter()
    top_k = check_int("top_k", top_k)
    model = as_model(model)
    opts = _options(precision, recompute, zero, optimizer, placement,
                    {"framework": framework, "attention": attention, "tp_overlap": tp_overlap, "dp_overlap": dp_overlap,
                     "cp": cp, "ep": ep, "sequence_parallel": sequence_parallel, "compile": compile})
    _check_graph(model, opts)
    opts["level"] = check_level(level)
    sort_by, larger_is_better = _sort_column(sort_by, prices)
    limits = {"max_micro_batch": max_micro_batch, "max_virtual_stages": max_virtual_stages,
              "max_tp_nodes": max_tp_nodes, "ep": ep, "fsdp": fsdp, "bucket_mib": _buckets(bucket_mib)}
    jobs, rejected, detail, capacity = _jobs(model, cluster, global_batch, opts, limits, profile, prices)
    best = price_jobs(jobs, model, opts, Ranking(top_k, sort_by, larger_is_better), chunk=chunk, workers=workers)
    if best.rows is None:
        raise InfeasibleError(_memory_message(best.closest, best.evaluated, " / ".join(capacity), opts))
    return _ranked_table(best, rejected, detail, int(global_batch), sort_by, t0)


def _ranked_table(best, rejected: dict, detail, global_batch: int, sort_by: str, t0: float) -> pd.DataFrame:
    """The kept rows as ``search`` returns them, best first, ties marked, the counts in ``attrs``."""
    rejected["memory"] = best.evaluated - best.feasible
    rows = best.rows
    rows.pop("order")
    df = mark_ties(_table(rows, np.arange(rows["dp"].size), global_batch), 0, sort_by)
    df.attrs.update(rejected=rejected, rejected_detail=detail, evaluated=best.evaluated, feasible=best.feasible,
                    sort_by=sort_by, seconds=time.perf_counter() - t0)
    return df
