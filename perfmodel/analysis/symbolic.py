"""A predicted step time as a sympy expression in chosen free symbols.

    t = symbolic_step_time(pm.preset("gpt2-medium"), pm.cluster("dgx-a100-80gb"),
                           pm.Strategy(dp=8, micro_batch=8), free=("micro_batch", "dp"))
    b, dp = symbol("micro_batch"), symbol("dp")
    float(t.subs({b: 16, dp: 8}))            # equals pm.predict(...) for that configuration
    sympy.diff(t, b)

The expression comes from the pricing functions ``predict`` runs, on sympy
inputs: each kernel contributes its fitted closed form (the Profile's sympy
twin, ``costs.compute.kernel_time(symbolic=True)``); phases take
Max(Σ GPU, Σ CPU) with the profile's host terms (``costs.compute.phase_time``);
the pipeline formula, the optimizer and DDP's exposed bucketed all-reduce are
``parallel.pipeline.schedule_seconds``, ``step.optimizer_time`` and
``parallel.data.ddp_exposed``. Scope: pipeline size 1, no ZeRO sharding, no
parameter server (their discrete placement and schedule choices do not reduce
to one expression); free symbols among ``micro_batch``, ``dp`` and
``micro_batches``.
"""

from __future__ import annotations

import sympy as sp

from dataclasses import replace

from perfmodel.workload.stacks.composer import run_strategy
from perfmodel.core.algebra import maximum, to_sympy, where
from perfmodel.core.errors import InvalidInputError, UnsupportedError
from perfmodel.costs.comm import ring_formula
from perfmodel.costs.compute import kernel_time, phase_time
from perfmodel.costs.host import HostCosts
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.data import ddp_exposed
from perfmodel.hardware import as_cluster
from perfmodel.parallel.fabric import cluster_collectives
from perfmodel.parallel.pipeline import PhaseTimes, schedule_seconds, stages
from perfmodel.parallel.placement import layout
from perfmodel.parallel.strategy import Strategy, fill_dp
from perfmodel.parallel.stragglers import device_spread, paced_growth
from perfmodel.parallel.wire import wire_bytes
from perfmodel.predict import check_strategy, default_profile, profile_for
from perfmodel.step import bucket_costs, dp_backward_windows, kernel_lists, optimizer_time, param_counts
from perfmodel.workload.ops import Kernel
from perfmodel.workload.model import Transformer
from perfmodel.workload.presets import as_model
from perfmodel.workload.stacks import stack

FREE = ("micro_batch", "dp", "micro_batches")


def symbol(name: str) -> sp.Symbol:
    """The symbol used for a free variable (positive integer)."""
    return sp.Symbol(name, positive=True, integer=True)


def kernel_expr(profile, kern: Kernel) -> tuple[sp.Expr, float]:
    """(GPU seconds as an expression, CPU seconds) of one launch: ``costs.compute.kernel_time`` on sympy."""
    return kernel_time(profile, kern, symbolic=True)


def phase_expr(profile, kernels) -> sp.Expr:
    """Wall seconds of a phase as an expression: ``costs.compute.phase_time`` on sympy."""
    return phase_time(profile, kernels, symbolic=True)[0]


def symbolic_step_time(model, cluster, strategy, *, free=("micro_batch",), profile=None) -> sp.Expr:
    """Step time of ``strategy`` with the fields named in ``free`` left as symbols."""
    if isinstance(free, str):
        free = (free,)
    if not isinstance(free, (tuple, list, set, frozenset)):
        raise InvalidInputError(f"'free' must be a tuple of field names among {', '.join(FREE)}: got {free!r}")
    cluster = as_cluster(cluster)
    if not isinstance(strategy, Strategy):
        raise InvalidInputError(f"'strategy' must be a pm.Strategy: got {strategy!r}")
    strategy = run_strategy(fill_dp(strategy, cluster.n_gpus))  # the kernels it runs (workload/stacks/composer.py)
    unknown = [f for f in free if f not in FREE]
    if unknown:
        raise UnsupportedError(f"cannot leave {unknown} free (free symbols supported: {', '.join(FREE)})")
    if strategy.pp > 1 or strategy.shard or strategy.ps_servers or strategy.ps_async:
        raise UnsupportedError("symbolic step times cover pp=1 without ZeRO/FSDP or parameter servers "
                               f"(got pp={strategy.pp}, zero={strategy.shard}, ps_servers={strategy.ps_servers})")
    if stack(strategy.framework).engine:  # its engine's host work and reduction (parallel/deepspeed.py)
        raise UnsupportedError(f"symbolic step times do not cover framework={strategy.framework!r} (its engine's "
                               "host work, p2p and reduction after the last backward): use pm.predict, or "
                               "framework='megatron'")
    if strategy.tp > 1 or strategy.cp > 1 or strategy.ep > 1 or strategy.expert_tp > 1:
        raise UnsupportedError("symbolic step times do not cover tensor, context or expert parallelism yet "
                               f"(use tp=1, cp=1, ep=1, etp unset or 1; got tp={strategy.tp}, cp={strategy.cp}, "
                               f"ep={strategy.ep}, etp={strategy.etp})")
    model = as_model(model)
    if not isinstance(model, Transformer):
        raise UnsupportedError(f"symbolic step times cover transformers (pm.transformer, pm.preset of one); "
                               f"{getattr(model, 'name', model)!r} is a traced graph: use pm.predict")
    check_strategy(model, cluster, strategy)
    prof = default_profile(cluster) if profile is None else profile_for(cluster, profile)
    symbols = {name: symbol(name) for name in free}
    c = replace(StepConfig.from_strategy(strategy), dp=symbols.get("dp", strategy.dp),
                micro_batch=symbols.get("micro_batch", strategy.micro_batch),
                micro_batches=symbols.get("micro_batches", strategy.micro_batches))
    return _step_expr(model, cluster, prof, c, strategy)


def _step_expr(model, cluster, prof, c: StepConfig, s) -> sp.Expr:
    """``step.evaluate``'s step time for one pipeline stage without sharding, from the same pieces."""
    parts, _ = kernel_lists(model, c, s.precision, s.recompute, prof.gpu)
    t = PhaseTimes(**{name: phase_expr(prof, ks) for name, ks in parts.items()})
    (st, *_) = stages(model, c)  # pp = 1: the first stage holds every layer, the embedding and the head
    per_mb = t.on(st)
    pipe = schedule_seconds(per_mb, per_mb, c.micro_batches)
    p = param_counts(model, c)
    params = st.params(p, c.tp)
    opt = optimizer_time(prof, c, params, 1.0, optimizer=s.optimizer, precision=s.precision)
    # the slowest data-parallel rank's kernels (step._assemble): what the exposed host time does not hide
    gpu = c.micro_batches * PhaseTimes(**{name: phase_time(prof, ks, symbolic=True)[1]
                                          for name, ks in parts.items()}).on(st)
    return pipe + opt + paced_growth(gpu, maximum(pipe - gpu, 0.0), opt, c.dp, device_spread(cluster)) \
        + _ddp_expr(cluster, prof, c, s, params, dp_backward_windows(prof, t, [st])[0])


def _ddp_expr(cluster, prof, c: StepConfig, s, params, backward):
    """DDP's exposed seconds as ``parallel.data.ddp_exposed`` prices them, each bucket's all-reduce
    by its sympy twin (``costs.comm.ring_formula``) so ``dp`` may stay a symbol."""
    if s.dp == 1:
        return sp.Integer(0)
    coll = cluster_collectives(cluster, prof)
    lay = layout(s.dp, 1, 1, cluster.gpus_per_node, s.placement)
    rpn, nodes = (float(x) for x in lay["dp"])

    def price(collective, nbytes):
        return ring_formula(coll, collective, to_sympy(nbytes), rpn, nodes, c.dp)

    window = where(c.dp_overlap, backward, 0.0)
    return to_sympy(ddp_exposed(coll, lay, c, params, window, wire_bytes(s.precision, c.framework),
                                bucket_costs(prof), price=price,
                                slowdown=HostCosts.of(prof).overlap_compute_slowdown))
