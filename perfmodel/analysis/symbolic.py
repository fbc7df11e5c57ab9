"""A predicted step time as a sympy expression in chosen free symbols.

    t = symbolic_step_time(pm.preset("gpt2-medium"), pm.cluster("dgx-a100-80gb"),
                           pm.Strategy(dp=8, micro_batch=8), free=("micro_batch", "dp"))
    b, dp = symbol("micro_batch"), symbol("dp")
    float(t.subs({b: 16, dp: 8}))            # equals pm.predict(...) for that configuration
    sympy.diff(t, b)

Each kernel contributes its fitted closed form (the Profile's sympy twin);
phases take Max(Σ GPU, Σ CPU); data parallelism adds DDP's exposed bucketed
all-reduce. Scope: pipeline size 1, no ZeRO sharding, no parameter server
(their discrete placement and schedule choices do not reduce to one
expression); free symbols among ``micro_batch``, ``dp`` and ``micro_batches``.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from perfmodel.costs.comm import formula as comm_formula, lookup_entry
from perfmodel.costs.compute import _optimizer_entry, gemm_key
from perfmodel.parallel.data import DDP_BUCKET_PASSES, DDP_FIRST_BUCKET_BYTES
from perfmodel.core.errors import InvalidInputError, PerfModelError, UnsupportedError
from perfmodel.parallel.fabric import cluster_collectives
from perfmodel.forms.registry import get_form
from perfmodel.parallel.placement import layout
from perfmodel.predict import check_strategy, default_profile, profile_for
from perfmodel.workload import kernels as steps
from perfmodel.workload.ops import Kernel, aligned_view, mem as mem_kernel
from perfmodel.workload.model import Transformer
from perfmodel.workload.presets import as_model
from perfmodel.workload.stack import adapt_kernels

FREE = ("micro_batch", "dp", "micro_batches")


def symbol(name: str) -> sp.Symbol:
    """The symbol used for a free variable (positive integer)."""
    return sp.Symbol(name, positive=True, integer=True)


def _s(value):
    if isinstance(value, np.ndarray):
        value = value.item()
    if isinstance(value, (np.floating, np.integer, float, int)):
        return sp.Float(float(value))
    return value


def kernel_expr(profile, kern: Kernel) -> tuple[sp.Expr, float]:
    """(GPU seconds as an expression, CPU seconds) of one launch — the twin of costs.compute.kernel_time."""
    cls = kern.cls
    if cls == "gemm":
        entry, size = profile.entry(gemm_key(profile, kern.dtype)), aligned_view(kern)
    elif cls == "sdpa":
        entry = profile.entry(f"sdpa:{kern.variant}")
        size = {k: v for k, v in kern.size.items() if k != "kv_heads"}
    elif cls in ("adamw", "sgd"):
        entry, scale = _optimizer_entry(profile, cls)
        size = {"params": _s(kern.size["params"]) * scale}
    else:
        entry, factor = profile.mem_entry(cls, kern.dtype, kern.variant)
        form = get_form(entry["form"])
        size = {v: kern.size[v] for v in form.variables}
        size["x"] = _s(size["x"]) * factor
    form = get_form(entry["form"])
    gpu = form.expression({**entry["params"], "t_cpu": 0.0}, **{k: _s(v) for k, v in size.items()})
    floor = entry["params"].get("t_cpu", 0.0)
    cpu = floor if floor > 0 else profile.host.get("cpu_per_kernel_s", 1.5e-5)
    return gpu, cpu


def phase_expr(profile, kernels) -> sp.Expr:
    """The twin of ``costs.compute.phase_time`` (wall time only)."""
    priced = [(*kernel_expr(profile, k), _s(k.count)) for k in kernels]
    if profile.host.get("serial"):
        return sum((sp.Max(g, c) * n for g, c, n in priced), sp.Integer(0))
    gpu = sum((g * n for g, _, n in priced), sp.Integer(0))
    cpu = sum((c * n for _, c, n in priced), sp.Integer(0))
    return sp.Max(gpu, cpu)


SYMBOLIC_PRECISIONS = ("bf16-mixed", "fp8-mixed")  # where it agrees with pm.predict (tests/test_symbolic.py)


def symbolic_step_time(model, cluster, strategy, *, free=("micro_batch",), profile=None) -> sp.Expr:
    """Step time of ``strategy`` with the fields named in ``free`` left as symbols."""
    from perfmodel.hardware import as_cluster
    from perfmodel.parallel.strategy import Strategy, fill_dp

    if isinstance(free, str):
        free = (free,)
    if not isinstance(free, (tuple, list, set, frozenset)):
        raise InvalidInputError(f"'free' must be a tuple of field names among {', '.join(FREE)}: got {free!r}")
    cluster = as_cluster(cluster)
    if not isinstance(strategy, Strategy):
        raise InvalidInputError(f"'strategy' must be a pm.Strategy: got {strategy!r}")
    strategy = fill_dp(strategy, cluster.n_gpus)
    unknown = [f for f in free if f not in FREE]
    if unknown:
        raise UnsupportedError(f"cannot leave {unknown} free (free symbols supported: {', '.join(FREE)})")
    if strategy.pp > 1 or strategy.shard or strategy.ps_servers:
        raise UnsupportedError("symbolic step times cover pp=1 without ZeRO/FSDP or parameter servers "
                               f"(got pp={strategy.pp}, zero={strategy.shard}, ps_servers={strategy.ps_servers})")
    if strategy.tp > 1 or strategy.cp > 1 or strategy.ep > 1:
        raise UnsupportedError("symbolic step times do not cover tensor, context or expert parallelism yet "
                               f"(use tp=1, cp=1, ep=1; got tp={strategy.tp}, cp={strategy.cp}, ep={strategy.ep})")
    if strategy.framework != "pytorch":  # 16-bit weights change the optimizer and the gradient bytes too
        raise UnsupportedError(f"symbolic step times cover framework='pytorch' (got framework={strategy.framework!r})")
    if strategy.precision not in SYMBOLIC_PRECISIONS:  # fp16's loss scaling, fp32/tf32 attention paths: not yet
        raise UnsupportedError(f"symbolic step times cover precision {' or '.join(map(repr, SYMBOLIC_PRECISIONS))} "
                               f"(got {strategy.precision!r}); use pm.predict for it")
    model = as_model(model)
    if not isinstance(model, Transformer):
        raise UnsupportedError(f"symbolic step times cover transformers (pm.transformer, pm.preset of one); "
                               f"{getattr(model, 'name', model)!r} is a traced graph: use pm.predict")
    check_strategy(model, cluster, strategy)
    prof = default_profile(cluster) if profile is None else profile_for(cluster, profile)
    b = symbol("micro_batch") if "micro_batch" in free else strategy.micro_batch
    dp = symbol("dp") if "dp" in free else strategy.dp
    m = symbol("micro_batches") if "micro_batches" in free else strategy.micro_batches
    kw = {"tp": strategy.tp, "sp": strategy.sequence_parallel, "precision": strategy.precision}
    stack = {"precision": strategy.precision, "attention": strategy.attention}
    lf, lb = (adapt_kernels(ks, **stack) for ks in steps.layer_kernels(model, b, recompute=strategy.recompute, **kw))
    ef, eb = steps.embedding_kernels(model, b, tp=strategy.tp, precision=strategy.precision)
    hf, hb = steps.head_kernels(model, b, **kw)
    per_mb = model.layers * (phase_expr(prof, lf) + phase_expr(prof, lb))
    per_mb += phase_expr(prof, ef) + phase_expr(prof, eb) + phase_expr(prof, hf) + phase_expr(prof, hb)
    params = float(model.params)
    opt = [Kernel("optimizer", strategy.optimizer, "opt", {"params": params}, 1, 0.0, "fwd", "fp32")]
    total = m * per_mb + kernel_expr(prof, opt[0])[0]
    accumulate = Kernel("grad_accumulate", "add", "opt", {"x": params}, 1, 0.0, "fwd", "fp32")
    total += (m - 1) * kernel_expr(prof, accumulate)[0]
    backward = model.layers * phase_expr(prof, lb) + phase_expr(prof, eb) + phase_expr(prof, hb)
    return total + _ddp_expr(cluster, prof, strategy, dp, params, backward)


def _ddp_expr(cluster, prof, strategy, dp, params, backward):
    """DDP as ``data_parallel.ddp_time`` prices it: bucketed all-reduce of fp32 gradients (the first
    bucket 1 MiB), all but the last bucket hidden behind backward once the first bucket's share of it
    has run, plus the reducer's passes over the buckets (``ddp_bucket_passes``)."""
    if dp == 1:
        return sp.Integer(0)
    coll = cluster_collectives(cluster, prof)
    rpn, nodes = layout(strategy.dp, 1, 1, cluster.gpus_per_node)["dp"]
    rpn, nodes = float(rpn), float(nodes)
    grads = params * 4.0
    head = min(float(DDP_FIRST_BUCKET_BYTES), grads)
    rest = grads - head
    size = min(strategy.bucket_mb * 1e6, max(rest, 1.0))
    full = float(np.floor(rest / size))
    rem = rest - full * size

    def ar(nbytes):  # hierarchical_time(..., algorithm="ring")
        nbytes = sp.Float(max(nbytes, 1.0))
        if nodes == 1:
            return comm_formula(lookup_entry(coll, "intra", "all_reduce"), "all_reduce", size=nbytes, n=dp)
        if rpn == 1:
            return comm_formula(lookup_entry(coll, "inter", "all_reduce"), "all_reduce", size=nbytes, n=dp)
        intra = comm_formula(lookup_entry(coll, "intra", "all_reduce"), "all_reduce", size=nbytes, n=dp)
        inter = comm_formula(lookup_entry(coll, "inter", "all_reduce"), "all_reduce", size=nbytes / rpn, n=dp)
        return sp.Max(intra, inter)

    t_head = ar(head) if head > 0 else sp.Integer(0)
    t_bucket = ar(size) if full > 0 else sp.Integer(0)
    t_rem = ar(rem) if rem > 0 else sp.Integer(0)
    last = t_rem if rem > 0 else t_bucket if full > 0 else t_head
    everything = t_head + sp.Float(full) * t_bucket + t_rem
    share = (head if head > 0 else size) / max(grads, 1.0)
    window = backward * (1 - share) if strategy.dp_overlap else sp.Integer(0)
    exposed = sp.Max(last, everything - window)
    try:
        prof.mem_entry("copy", "fp32", "fwd")
    except PerfModelError:  # a profile without the copy class prices no passes (as predict does)
        return exposed
    copy = mem_kernel("ddp.bucket_copy", "copy", "fwd", params, variant="fwd")
    return exposed + DDP_BUCKET_PASSES.get(strategy.framework, 3) * kernel_expr(prof, copy)[0]
