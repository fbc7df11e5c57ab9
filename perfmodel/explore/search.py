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
from perfmodel.explore.chunks import CHUNK, RESULTS, Job, Ranking
from perfmodel.explore.pruning import price_jobs
from perfmodel.explore.space import FSDP_CHOICES, REASONS, enumerate_space
from perfmodel.explore.stack_options import (TRANSFORMER_FRAMEWORKS, check_frameworks, default_frameworks, layouts,
                                             job_specs, job_zeros, runs_ring, searched_fields)
from perfmodel.explore.ties import mark_ties
from perfmodel.interval import DEFAULT_LEVEL, check_level
from perfmodel.predict import BOTTLENECK_WORDS, BREAKDOWN_KEYS, check_headroom, default_profile, profile_for
from perfmodel.parallel.looped_bfs import LOOPED_BFS
from perfmodel.parallel.strategy import CHUNKED_SCHEDULES, OPTIMIZERS, PLACEMENTS, SCHEDULES, TP_COMM_OVERLAPS, Strategy
from perfmodel.core.checks import check_choice, check_flag, check_int, check_positive, check_size
from perfmodel.workload.presets import as_model
from perfmodel.workload import stacks
from perfmodel.workload.kernels import PRECISIONS, RECOMPUTE, gemm_dtype  # noqa: F401 (RECOMPUTE re-exported)
from perfmodel.workload.stacks.checkpointing import check_recompute
from perfmodel.workload.stacks.composer import run_strategy, runs_no_fp8
from perfmodel.workload.stacks.context import default_attention
from perfmodel.hardware import as_cluster

# sortable columns: True where larger is better
SORT_COLUMNS = {"tokens_per_second": True, "samples_per_second": True, "tflops_per_gpu": True, "mfu": True,
                "step_time": False, "peak_memory": False, **dict.fromkeys(BREAKDOWN_KEYS, False)}
COST_COLUMNS = {"usd_per_million_tokens": False, "usd_per_hour": False}
LEAD = ("cluster", "gpus", "dp", "tp", "pp", "virtual_stages", "schedule", "micro_batch", "micro_batches",
        "global_batch", "zero", "bucket_mib", "recompute", "sequence_parallel", "precision")
# Strategy fields search holds fixed: the software stack, the context- and expert-parallel sizes
STACK_FIELDS = {"framework": str, "attention": str, "tp_overlap": bool, "dp_overlap": bool, "cp": int, "ep": int,
                "compile": bool, "offload_layers": int,
                "tp_comm_overlap": lambda v: v if isinstance(v, str) and v else None}  # a row holds "" for none
# Strategy fields search does not vary that ``search(fixed=...)`` holds for every candidate (a row has them as
# columns then), each with how a table cell reads back (None where a cell holds None or NaN)
_NAME = lambda v: v if isinstance(v, str) and v else None  # noqa: E731
_FLAG = lambda v: None if v is None or v != v else bool(v)  # noqa: E731
FIXED_FIELDS = {"grad_reduce_fp32": _FLAG, "optimizer_states": _NAME, "fp8_params": bool, "float8_recipe": _NAME,
                "norm_kernels": str, "loss": _NAME, "cp_comm": _NAME, "memory_format": str, "fc_type": _NAME,
                "expandable_segments": _FLAG, "grouped_experts": _FLAG,
                "etp": lambda v: None if v is None or v != v else int(v)}  # Megatron-Core's folded experts
FIXED_FLAGS = tuple(name for name, cast in FIXED_FIELDS.items() if cast in (bool, _FLAG))  # true or false


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


FRAMEWORK_CHOICES = TRANSFORMER_FRAMEWORKS  # the default frameworks of a transformer (stack_options.py)
# DDP / ZeRO-1/2 gradient buckets the default space tries (MiB): torch DDP's bucket_cap_mb default (25)
# and larger ones, toward Megatron-Core's default of 40M parameters (160 MB of fp32 gradients, ~153 MiB)
BUCKET_CHOICES = (25.0, 100.0, 400.0)
CP_CHOICES = (1, 2, 4, 8, 16)  # context-parallel sizes the default space tries (those the GPUs and sequence allow)
EP_CHOICES = (1, 2, 4, 8, 16, 32, 64)  # expert-parallel sizes tried for a MoE model (those dividing its experts)


def expert_choices(model, ep):
    """``search``'s ``ep`` as given (one size, or a list), or where None the default: 1 for a dense model, the
    ``EP_CHOICES`` dividing a MoE model's experts (the GPUs are checked per cluster, ``stack_options.layouts``)."""
    if ep is not None:
        return ep
    experts = getattr(model, "experts", 1)
    return tuple(e for e in EP_CHOICES if experts % e == 0) if experts > 1 else 1


def _stack_of(opts, fw: str, cp: int, ep: int) -> dict:
    """The stack fields search holds fixed for framework ``fw`` at context- and expert-parallel sizes ``cp``, ``ep``."""
    st = opts["stack"]

    def overlap(name, plain):  # the overlap switches are Megatron-LM's; PyTorch has ``plain`` only
        choices = st[name]
        return choices if fw == "megatron" or len(choices) == 1 else tuple(c for c in choices if c == plain)

    return {"framework": fw, "attention": st["attention"] or default_attention(fw, cp),  # None: its own (its ring's)
            "tp_overlap": overlap("tp_overlap", False),
            "dp_overlap": overlap("dp_overlap", True), "cp": cp, "ep": ep}


def _fixed(fixed) -> dict:
    """``search(fixed=...)`` as a dict of ``FIXED_FIELDS`` (their values are checked by each job's Strategy)."""
    if fixed is None:
        return {}
    if not isinstance(fixed, dict):
        raise InvalidInputError(f"'fixed' must be a dict of Strategy fields: got {type(fixed).__name__}")
    for name in fixed:
        if name not in FIXED_FIELDS:
            raise unknown_name("fixed field", name, FIXED_FIELDS)
    out = dict(fixed)
    if out.get("etp") is not None:  # a size the space's rules compute with ("1" as the command line gives it)
        text = str(out["etp"]).strip()
        out["etp"] = check_size("etp", int(text) if text.isdigit() else out["etp"], limit="tp")
    return out


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
    """The search options checked; precision, recompute, framework, compile and offload_layers stay
    None where left to the stacks (``stack_options.job_specs`` fills them per framework and GPU)."""
    frameworks = check_frameworks(stack["framework"])
    if frameworks and all(stacks.stack(fw).sharding in ("fsdp1", "fsdp2") for fw in frameworks):
        zero = 3  # FSDP stacks shard everything (a mix of stacks: per stack, in _jobs)
    if precision is not None:
        precision = _values("precision", precision, lambda n, v: check_choice(n, v, PRECISIONS))
    if recompute is not None:
        recompute = _values("recompute", recompute, lambda n, v: check_recompute(v) or v)
    for name, values in (("precision", precision), ("recompute", recompute)):
        if values is not None and not values:
            raise InvalidInputError(f"{name!r} must list at least one value: got an empty list")
    offload = stack.pop("offload_layers")
    if offload is not None:
        offload = _values("offload_layers", offload, lambda n, v: check_int(n, v, minimum=0))
    schedules = stack.pop("schedule", None)
    if schedules is not None:
        schedules = _values("schedule", schedules, _check_chunked_schedule)
    overlaps = stack.pop("tp_comm_overlap", None)
    if overlaps is not None:
        overlaps = _values("tp_comm_overlap", overlaps,
                           lambda n, v: v if v in (None, "") else check_choice(n, v, tuple(TP_COMM_OVERLAPS)))
    zero = _values("zero", zero, lambda n, v: check_int(n, v, minimum=0))
    sequence_parallel = _values("sequence_parallel", stack.pop("sequence_parallel"), check_flag)
    cp_fixed, ep_fixed = isinstance(stack["cp"], int), isinstance(stack["ep"], int)
    stack = {**stack, "framework": frameworks, "tp_overlap": _choices(stack["tp_overlap"], bool),
             "dp_overlap": _values("dp_overlap", stack["dp_overlap"], check_flag),
             "cp": _choices(stack["cp"], int), "ep": _values("ep", stack["ep"], check_int),
             "offload_layers": offload, "tp_comm_overlap": overlaps,
             "schedule": schedules}
    for name in ("tp_overlap", "dp_overlap", "cp", "ep"):
        if not stack[name]:
            raise InvalidInputError(f"{name!r} must list at least one value: got an empty list")
    check_choice("optimizer", optimizer, OPTIMIZERS)
    check_choice("placement", placement, PLACEMENTS)
    # the fields search holds fixed, checked by Strategy (which names a bad one); the space replaces dp
    # context parallelism needs an attention that runs a ring: the one asked for, else each stack's own
    ring = [fw for fw in frameworks or ("megatron",) if runs_ring(fw, stack["attention"])]
    if not cp_fixed:  # a list of cp sizes keeps those the stacks can run (with expert parallelism the layout
        # places ep inside dp, so cp stays 1 unless asked for)
        stack["cp"] = tuple(cp for cp in stack["cp"] if check_int("cp", cp) == 1 or (ring and 1 in stack["ep"]))
    for cp, overlap, ep in product(stack["cp"], stack["tp_overlap"], stack["ep"]):
        base = Strategy(dp=ep, optimizer=optimizer, placement=placement,
                        framework=(ring if cp > 1 and ring else frameworks or ("megatron",))[-1],
                        attention=stack["attention"], cp=check_int("cp", cp), ep=ep, tp_overlap=overlap,
                        dp_overlap=stack["dp_overlap"][0])
    return {"precision": precision, "recompute": recompute, "zero": zero, "optimizer": optimizer,
            "placement": placement, "stack": stack, "base": base, "cp_fixed": cp_fixed, "ep_fixed": ep_fixed,
            "sequence_parallel": sequence_parallel}


def _check_chunked_schedule(name: str, value):
    """A schedule search may give the rows with virtual stages (v = 1 rows run 1F1B whatever is asked)."""
    if value == LOOPED_BFS:  # parallel/looped_bfs.py
        raise InvalidInputError(f"{name!r}={value!r} is not searched: it takes interleaved 1F1B's step time with "
                                "more memory (every micro-batch held), so where interleaved 1F1B runs (micro-batches a "
                                "multiple of pp) it is never slower; price a looped-bfs plan with pm.predict")
    if value not in CHUNKED_SCHEDULES and value in SCHEDULES:
        raise InvalidInputError(f"{name!r} picks the schedule of the rows with virtual stages "
                                f"({', '.join(CHUNKED_SCHEDULES)}); rows without them run 1f1b, so {value!r} "
                                f"is not a choice here: leave 'schedule' unset or name one of those")
    return check_choice(name, value, CHUNKED_SCHEDULES)


def _check_graph(model, opts) -> None:
    """A traced graph's own limits on the stack search holds fixed (data parallel only: the default
    cp choices shrink to 1)."""
    if hasattr(model, "check_strategy"):
        if not opts["cp_fixed"]:
            opts["stack"]["cp"] = (1,)
        for framework in opts["stack"]["framework"] or default_frameworks(model):  # each stack searched
            model.check_strategy(dataclasses.replace(opts["base"], cp=opts["stack"]["cp"][0], framework=framework))


def _check_precisions(cl, precisions) -> None:
    missing = [p for p in precisions if gemm_dtype(p) not in cl.gpu.peak_flops]
    if missing:
        raise UnsupportedError(f"{cl.gpu.name} has no {', '.join(gemm_dtype(p) for p in missing)} support "
                               f"(supported: {', '.join(sorted(cl.gpu.peak_flops))}); drop {missing} from 'precision'")


def _memory_message(cols, evaluated, capacity_note, opts) -> str:
    i = 0
    headroom = opts.get("memory_headroom", 0.0)
    need = (cols["memory_capacity"][i] * (1.0 - headroom) + cols["over_capacity"][i]) / 2**30
    at = ", ".join(f"{k}={_plain(cols[k][i])}" for k in ("dp", "tp", "pp", "micro_batch", "zero", "recompute"))
    tips = ["more GPUs or GPUs with more memory"]
    tips += [] if 3 in opts["zero"] else ["zero=3"]
    tips += [] if opts["recompute"] is None or "full" in opts["recompute"] else ["recompute='full'"]
    tips += ["a smaller memory_headroom"] if headroom > 0 else []
    kept = f" less the {headroom:.0%} memory_headroom" if headroom > 0 else ""
    return (f"no configuration fits in memory: all {evaluated:,} that pass the divisibility and batch "
            f"rules need more than {capacity_note}{kept}; the smallest needs {need:.1f} GiB per GPU ({at}); "
            f"try {' or '.join(tips)}")


def _plain(x):
    return x.item() if hasattr(x, "item") else x


def strategy_of(row, *, optimizer: str = "adamw", placement: str = "tp-pp-dp") -> Strategy:
    """The ``Strategy`` of one search (or compare/sweep) row, for ``pm.predict``."""
    v = int(row["virtual_stages"])
    defaults = Strategy()
    stack = {k: cast(row.get(k, getattr(defaults, k))) for k, cast in STACK_FIELDS.items()}
    stack.update({k: cast(row[k]) for k, cast in FIXED_FIELDS.items() if k in row})
    fsdp = row.get("fsdp")
    stack["fsdp"] = fsdp if isinstance(fsdp, str) else None  # a table cell may hold NaN for None
    bucket = row.get("bucket_mib")  # a compare or sweep row may hold the Strategy's default (None, NaN)
    if bucket is not None and bucket == bucket:
        stack["bucket_mib"] = float(bucket)
    return Strategy(dp=int(row["dp"]), tp=int(row["tp"]), pp=int(row["pp"]), micro_batch=int(row["micro_batch"]),
                    global_batch=int(row["global_batch"]), zero=int(row["zero"]), recompute=str(row["recompute"]),
                    precision=str(row["precision"]), optimizer=optimizer, placement=placement,
                    schedule=str(row.get("schedule", "interleaved")) if v > 1 else "1f1b", virtual_stages=v,
                    sequence_parallel=bool(row["sequence_parallel"]), **stack)


def _table(cols: dict, idx: np.ndarray, global_batch: int) -> pd.DataFrame:
    """The rows ``idx`` of the flat arrays as a DataFrame, with schedule and bottleneck filled in."""
    top = {k: v[idx] for k, v in cols.items()}
    top["cluster"] = top.pop("cluster_name")
    top["global_batch"] = np.full(idx.size, global_batch)
    top["schedule"] = np.where(top["virtual_stages"] > 1, top["schedule"], "1f1b")  # the job's chunked schedule
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


def _job_base(opts, spec, stack: dict, fixed: dict, zero: int) -> Strategy:
    """The ``Strategy`` of a job's fields search does not vary (the space sets dp, tp, pp, zero ... per row; an
    overlap job's tensor group and sequence parallelism, a zero-bubble job's stages, only validate it here)."""
    tpo, zb = bool(spec.tp_comm_overlap), spec.schedule != "interleaved"
    return Strategy(dp=spec.ep * (_etp(spec, fixed) or 1), optimizer=opts["optimizer"], placement=opts["placement"], zero=zero,
                    framework=spec.framework, attention=stack["attention"], cp=spec.cp, ep=spec.ep,
                    compile=spec.compile, offload_layers=spec.offload_layers, recompute=spec.recompute,
                    precision=spec.precision, tp=2 if tpo else 1, sequence_parallel=tpo,
                    tp_comm_overlap=spec.tp_comm_overlap or None, pp=2 if zb else 1,
                    schedule=spec.schedule if zb else "1f1b", virtual_stages=2 if zb else 1,
                    **dict(spec.extras), **fixed)


def _etp(spec, fixed: dict):
    """The expert tensor-parallel size a job holds: the one it searches (``spec.extras``), else ``fixed``'s (None: tp)."""
    return dict(spec.extras).get("etp", fixed.get("etp"))


def _job_space(spaces: dict, model, cl, global_batch, opts, limits, spec, stack: dict, zeros: tuple):
    """(the space of a job, enumerated once per distinct enumeration in ``spaces``; the call that enumerates it, where
    it is a plain space, whose error an empty search raises: it names the rules, else None). torchtitan and FSDP1
    share theirs, DeepSpeed's pipeline engine has its own; an overlap of tensor-parallel collectives needs them:
    tp > 1 with sequence parallelism."""
    tpo, zb = bool(spec.tp_comm_overlap), spec.schedule != "interleaved"
    folded = "etp" in dict(spec.extras)  # a searched etp: its rows at tp 1 are the default job's (etp = tp = 1)
    key = (zeros, spec.cp, stack["tp_overlap"], stack["dp_overlap"], 1 if spec.offload_layers else None,
           stacks.stack(spec.framework).engine == "deepspeed", tpo, spec.schedule, spec.ep,
           _etp(spec, opts.get("fixed", {})), folded)
    space_of = functools.partial(
        enumerate_space, model, cl.n_gpus // spec.cp, cl.gpus_per_node, global_batch, zero=zeros,
        sequence_parallel=(True,) if tpo else opts["sequence_parallel"], cp=spec.cp,
        tp_overlap=stack["tp_overlap"], dp_overlap=stack["dp_overlap"], max_pp=key[4],
        pipeline_engine=key[5], min_tp=2 if tpo or folded else 1, schedule=spec.schedule, etp=key[9],
        **{**limits, "ep": spec.ep})
    if key not in spaces:
        spaces[key] = space_of(empty_ok=True)
    return spaces[key], None if tpo or zb or folded else space_of


def _jobs(model, cluster, global_batch, opts, limits, profile, prices):
    """(jobs, rejected counts, counts per rule, capacity notes): one job per cluster and
    ``stack_options.JobSpec``, its space enumerated (``limits``: the keyword arguments of
    ``enumerate_space`` search passes through; one space per framework, cp and pipeline bound)."""
    rejected, detail, capacity, jobs, refused = dict.fromkeys(REASONS, 0), {}, [], [], []
    fixed = opts.get("fixed", {})  # search(fixed=...): the Strategy fields every candidate holds
    choices = {k: opts[k] for k in ("precision", "recompute")}
    choices.update({k: opts["stack"][k] for k in ("framework", "compile", "offload_layers", "tp_comm_overlap",
                                                  "schedule", "attention")}, fixed=fixed)
    for cl in _clusters(cluster):
        if opts["precision"] is not None:
            _check_precisions(cl, opts["precision"])
        prof = default_profile(cl) if profile is None else profile_for(cl, profile)
        price = price_per_gpu_hour(prices, cl) * cl.n_gpus if prices is not None else None
        capacity.append(f"{cl.gpu.mem_bytes / 2**30:.0f} GiB on {cl.name}")
        specs = job_specs(model, cl, choices, layouts(model, cl, opts["stack"], opts["cp_fixed"], opts["ep_fixed"]))
        if not specs:
            asked = ", ".join(f"{k}={v!r}" for k, v in choices.items() if v is not None and k != "fixed")
            raise InvalidInputError(f"no framework of the search takes the options asked for together ({asked}): "
                                    "see docs/stacks.md for which stacks take each")
        spaces, shown, last = {}, searched_fields(specs), None  # the varied stack fields: a column in every row
        for spec in specs:
            stack = _stack_of(opts, spec.framework, spec.cp, spec.ep)
            fsdp_stack = stacks.stack(spec.framework).sharding in ("fsdp1", "fsdp2")
            zeros = (3,) if fsdp_stack else job_zeros(spec, opts["zero"], fixed)
            if opts["zero"] and not zeros:  # fp8 parameters under Megatron-Core, no distributed optimizer asked for
                continue
            if fixed.get("etp") is not None and spec.framework != "megatron":  # Megatron-Core's option only
                refused.append(f"fixed etp={fixed['etp']} is Megatron-Core's (got framework={spec.framework!r})")
                continue
            space, plain = _job_space(spaces, model, cl, global_batch, opts, limits, spec, stack, zeros)
            last = plain or last
            for k in ("divisibility", "batch"):
                rejected[k] += space.rejected[k]
            for k, v in space.detail.items():
                detail[k] = detail.get(k, 0) + v
            try:
                base = _job_base(opts, spec, stack, fixed, min(zeros))
            except PerfModelError as e:  # a fixed field this job's stack or precision does not take: not its job
                if not (fixed or spec.extras):
                    raise
                refused.append(str(e))
                continue
            if runs_no_fp8(base):  # Composer's amp_fp8 over torch linears runs bf16 (workload/stacks/composer.py)
                base, spec = run_strategy(base), dataclasses.replace(spec, precision="bf16-mixed")
            stack.update(compile=spec.compile, offload_layers=spec.offload_layers, tp_comm_overlap=spec.tp_comm_overlap,
                         schedule=spec.schedule, **{**shown, **dict(spec.extras), **fixed})
            jobs.append(Job(len(jobs), cl, prof, price, stack, space, spec, base))
    if not jobs and refused:
        raise InvalidInputError(f"no job of the search takes fixed={fixed!r}: {refused[0]}")
    if not any(len(j.space) for j in jobs):
        last()  # every layout emptied: the error of the last one names the rule
    return jobs, rejected, detail, capacity


def search(model, cluster, global_batch: int, *, top_k: int = 10, sort_by: str | None = None, prices=None,
           profile=None, max_micro_batch: int = 8, max_virtual_stages: int = 16,
           recompute=None, zero=(0, 1, 2, 3), fsdp=FSDP_CHOICES,
           sequence_parallel=(False, True),
           precision=None, optimizer: str = "adamw", placement: str = "tp-pp-dp",
           max_tp_nodes: int = 1, framework=None, attention: str | None = None, tp_overlap=(False, True),
           dp_overlap=(True, False), cp=CP_CHOICES, ep=None, bucket_mib=BUCKET_CHOICES, chunk: int = CHUNK,
           workers: int | None = 1, level: float = DEFAULT_LEVEL, compile=None, offload_layers=None,
           tp_comm_overlap=None, schedule=None, prune: bool = True, fixed: dict | None = None,
           memory_headroom: float = 0.0) -> pd.DataFrame:
    """The ``top_k`` fastest (or cheapest) configurations that fit, best first.

    ``framework``, ``compile``, ``precision``, ``recompute``, ``offload_layers`` and ``tp_comm_overlap``
    left None take what the stacks have (``stack_options``: every framework that runs the model, compile
    where it compiles, fp8 where the GPU and the stack have it, activation offload at pp = 1, each stack's
    checkpointing policies and tensor-parallel overlap beside none); each may name one value or a list. Under FSDP
    frameworks (torchtitan, fsdp1) ``zero`` is 3.

    ``zero`` lists the ZeRO stages and ``fsdp`` the PyTorch FSDP modes (None, "full",
    "hybrid") the space tries for sharding (an FSDP row shows zero=3). ``attention``,
    ``tp_overlap`` and ``dp_overlap`` describe the software stack (``pm.Strategy`` fields; ``attention`` None: each
    framework's own kernel, as ``pm.Strategy`` takes it;
    the overlap switches are Megatron-LM's: plain PyTorch is searched with its own behaviour
    unless one value is asked for). ``bucket_mib`` lists the DDP / ZeRO-1/2 gradient buckets
    tried (MiB; ZeRO-3 and FSDP rows take the first). ``cp``, the context-parallel size, is
    one value or a list (sizes the GPUs or the sequence cannot take are left out); ``ep`` too
    (None: ``expert_choices``; several: cp > 1 only where cp is one value). The space is priced ``chunk`` grid cells at a
    time, keeping only the ``top_k`` best: memory stays bounded whatever its size; with
    ``prune`` a job whose family's root bounds it out of the top rows is not priced (the same
    table). ``workers`` > 1 shares the jobs among that many forked processes (None: the CPUs
    this process may use), with results identical to one (docs/explore.md).

    ``cluster`` is a Cluster, a name, or a list of them (each searched whole). ``sort_by`` defaults to
    "tokens_per_second", or "usd_per_million_tokens" when ``prices`` ($/GPU-hour: a number, or a mapping keyed by
    cluster, node or GPU name) are given. The result's ``attrs`` hold "rejected" (configurations per reason:
    divisibility, batch, memory), "rejected_detail" (per rule), "evaluated", "feasible", "pruned" and "seconds".

    ``fixed``: ``FIXED_FIELDS`` held for every candidate (docs/explore.md), e.g. ``{"grad_reduce_fp32": False}``.
    ``memory_headroom``: the fraction of each GPU's memory a plan must leave free to fit (default 0). Each row
    carries its step-time interval at ``level``; ``tie`` marks the rows whose interval of the sort column
    overlaps the first's (docs/accuracy.md)."""
    t0 = time.perf_counter()
    top_k = check_int("top_k", top_k)
    model = as_model(model)
    opts = _options(precision, recompute, zero, optimizer, placement,
                    {"framework": framework, "attention": attention, "tp_overlap": tp_overlap, "dp_overlap": dp_overlap,
                     "cp": cp, "ep": expert_choices(model, ep), "sequence_parallel": sequence_parallel, "compile": compile,
                     "offload_layers": offload_layers, "tp_comm_overlap": tp_comm_overlap, "schedule": schedule})
    _check_graph(model, opts)
    opts.update(level=check_level(level), fixed=_fixed(fixed), memory_headroom=check_headroom(memory_headroom))
    sort_by, larger_is_better = _sort_column(sort_by, prices)
    limits = {"max_micro_batch": max_micro_batch, "max_virtual_stages": max_virtual_stages,
              "max_tp_nodes": max_tp_nodes, "fsdp": fsdp, "bucket_mib": _buckets(bucket_mib)}
    jobs, rejected, detail, capacity = _jobs(model, cluster, global_batch, opts, limits, profile, prices)
    per_step = (int(global_batch), int(global_batch) * model.seq) if check_flag("prune", prune) else None
    ranking = Ranking(top_k, sort_by, larger_is_better, per_step)
    best = price_jobs(jobs, model, opts, ranking, chunk=chunk, workers=workers)
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
                    pruned=best.pruned, sort_by=sort_by, seconds=time.perf_counter() - t0)
    return df
