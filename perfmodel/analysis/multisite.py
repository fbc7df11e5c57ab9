"""Training across datacenters: synchronous data parallelism, pipelines, DiLoCo and Streaming DiLoCo.

    import perfmodel as pm
    sites = pm.multi_cluster([pm.cluster("dgx-h100", nodes=8)] * 2, wan=pm.wan_link("10Gb/s", "40ms"))
    s = pm.MultiSiteStrategy(pm.Strategy(dp=64, micro_batch=4), sync="diloco", inner_steps=100,
                             outer_precision="int8")
    p = pm.predict_multisite(pm.preset("llama-3-8b"), sites, s)
    p.compute_utilization, p.tokens_per_second, p.outer_sync_s

Placement: tensor, context and expert groups and, by default, pipeline stages stay inside a
site (each site runs its own ``Strategy``, priced by :func:`perfmodel.predict`); data-parallel
replicas span the sites, or with ``across="pp"`` the pipeline stages do (one ``Strategy`` for
the whole pipeline, every site the same hardware). Every time comes from the pricing functions
of the single-site model and :mod:`perfmodel.costs.wan`; this module only composes them.

Algorithms:

* ``sync="sync"``: one synchronous step; the gradients' all-reduce (DDP buckets) runs over three
  levels and overlaps the last backward as in a datacenter (PyTorch DDP, Li et al. 2020).
* ``sync="diloco"``: DiLoCo (Douillard et al. 2023, arXiv:2311.08105, Algorithm 1): each site
  takes ``inner_steps`` = H steps on its own, then the sites all-reduce their pseudo-gradients
  (the change of the parameters), quantised to ``outer_precision`` on the wire, and apply an
  outer Nesterov step. Wall time of H steps: ``H t_inner + t_outer``.
* ``streaming_fragments`` = F > 1: Streaming DiLoCo (Douillard et al. 2025, arXiv:2501.18512,
  §2.2-2.3): the model is cut into F fragments, each synchronised every H steps, staggered H/F
  apart, each sync overlapping ``overlap_steps`` = τ inner steps. Per H steps each fragment
  exposes ``max(0, t_frag - τ t_inner)``, and the WAN cannot carry more than it can:
  ``period = max(H t_inner + F max(0, t_frag - τ t_inner), F t_frag)``.

``compute_utilization`` is the share of wall time spent in the sites' own steps (their kernels
and in-site communication) rather than waiting for the WAN or a slower site, as in Streaming
DiLoCo's simulations (§3.3), averaged over GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from perfmodel.workload.stacks.composer import run_strategy
from perfmodel.costs import memory as mem, stack_memory
from perfmodel.costs.comm import datasheet_entry, hierarchical_time, lookup_entry
from perfmodel.costs.wan import SITE_ALGORITHMS, ring_edges, three_level_time, wan_time
from perfmodel.core.errors import InvalidInputError, UnsupportedError
from perfmodel.hardware.common import FrozenMap
from perfmodel.hardware.sites import MultiCluster, multi_cluster
from perfmodel.parallel.strategy import Strategy
from perfmodel.core.checks import check_choice, check_int
from perfmodel.hardware.node import Cluster
from perfmodel.parallel.config import StepConfig, bucket_bytes
from perfmodel.parallel.data import DDP_FIRST_BUCKET_BYTES, _overlapped, _split, ddp_bucket_passes
from perfmodel.parallel.fabric import cluster_collectives
from perfmodel.parallel.pipeline import p2p_time
from perfmodel.parallel.placement import expert_grid, layout
from perfmodel.parallel.wire import activation_bytes, wire_bytes
from perfmodel.predict import default_profile, predict
from perfmodel.profiles.profile import load_profile
from perfmodel.costs.compute import copy_pricer
from perfmodel.workload.presets import as_model

SYNCS = ("sync", "diloco")
ACROSS = ("dp", "pp")
# bytes per element on the wire; fp4 packs two values per byte (Streaming DiLoCo §2.3: E3M0)
OUTER_PRECISION_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0, "fp4": 0.5}
OUTER_STATE_BYTES = 8.0  # DiLoCo keeps fp32 outer parameters and an fp32 Nesterov momentum per parameter


@dataclass(frozen=True)
class MultiSiteStrategy:
    """How a run spans sites: each site's inner strategy, the algorithm over the WAN."""

    site: Strategy | Mapping[str, Strategy] | None = None  # None: data parallel over each site's GPUs
    sync: str = "sync"              # "sync": every step; "diloco": every inner_steps steps
    inner_steps: int = 1            # H (DiLoCo: 500 in Douillard et al. 2023)
    outer_precision: str = "fp32"   # wire format of the pseudo-gradients
    streaming_fragments: int = 1    # F > 1: Streaming DiLoCo
    overlap_steps: int = 0          # τ: inner steps a fragment's sync may overlap
    across: str = "dp"              # "dp": replicas span sites; "pp": pipeline stages do
    algorithm: str = "ring"         # over the sites: "ring" or "tree"
    # a sync also overlaps the backward pass of the step that produced it, layer by layer (the
    # assumption of Streaming DiLoCo's simulator, §3.1); False: it starts after the inner step
    # ends, as an outer step computed after the inner optimizer's step does
    overlap_backward: bool = False

    def __post_init__(self):
        check_choice("sync", self.sync, SYNCS)
        check_choice("across", self.across, ACROSS)
        check_choice("algorithm", self.algorithm, SITE_ALGORITHMS)
        check_choice("outer_precision", self.outer_precision, OUTER_PRECISION_BYTES)
        object.__setattr__(self, "inner_steps", check_int("inner_steps", self.inner_steps))
        object.__setattr__(self, "streaming_fragments", check_int("streaming_fragments", self.streaming_fragments))
        object.__setattr__(self, "overlap_steps", check_int("overlap_steps", self.overlap_steps, minimum=0))
        if not isinstance(self.overlap_backward, bool):
            raise InvalidInputError(f"'overlap_backward' must be True or False: got {self.overlap_backward!r}")
        if isinstance(self.site, Mapping):
            object.__setattr__(self, "site", FrozenMap(self.site))
        sites = self.site.values() if isinstance(self.site, Mapping) else [self.site]
        for s in sites:
            if s is not None and not isinstance(s, Strategy):
                raise InvalidInputError(f"'site' must be a perfmodel.Strategy or a {{site: Strategy}} mapping: got {s!r}")
        if self.sync == "sync" and (self.inner_steps > 1 or self.streaming_fragments > 1 or self.overlap_steps):
            raise InvalidInputError("'inner_steps', 'streaming_fragments' and 'overlap_steps' need sync='diloco' "
                                    f"(got sync='sync', inner_steps={self.inner_steps}, "
                                    f"streaming_fragments={self.streaming_fragments}, overlap_steps={self.overlap_steps})")
        if self.overlap_steps >= self.inner_steps and self.sync == "diloco":
            raise InvalidInputError(f"'overlap_steps'={self.overlap_steps} must be < inner_steps={self.inner_steps} "
                                    "(a sync must land before the fragment's next one starts)")
        if self.streaming_fragments > self.inner_steps:
            raise InvalidInputError(f"'streaming_fragments'={self.streaming_fragments} must be <= inner_steps="
                                    f"{self.inner_steps} (one fragment sync per inner step at most)")
        if self.across == "pp" and self.sync != "sync":
            raise UnsupportedError("pipeline stages across sites are priced for sync='sync' only: "
                                   "DiLoCo needs a whole model replica in each site")

    def replace(self, **changes) -> MultiSiteStrategy:
        from dataclasses import replace

        return replace(self, **changes)


@dataclass(frozen=True)
class MultiSitePrediction:
    """A run over sites. Times in seconds; ``step_time`` is the wall time per inner step."""

    model: str
    sites: str
    strategy: MultiSiteStrategy
    step_time: float
    period_s: float                 # wall time of H inner steps and their synchronisation
    compute_utilization: float
    tokens_per_second: float
    outer_sync_s: float             # one synchronisation over the WAN (one fragment when streaming)
    exposed_sync_s: float           # per period, the synchronisation time no computation hides
    wan_bytes_per_sync: float       # what one site sends into the WAN-level collective per sync
    mfu: float
    fits: bool
    inner_step_s: Mapping[str, float] = field(default_factory=FrozenMap)  # each site's own step
    predictions: tuple = ()         # the single-site predictions the run was priced from

    def __repr__(self) -> str:
        return (f"MultiSitePrediction({self.model} on {self.sites}, {self.strategy.sync}: step "
                f"{self.step_time * 1e3:.1f} ms, compute utilization {self.compute_utilization:.1%}, "
                f"{self.tokens_per_second:,.0f} tok/s, outer sync {self.outer_sync_s:.3g} s, MFU {self.mfu:.1%}"
                f"{'' if self.fits else ' (DOES NOT FIT)'})")


# --- the pieces every algorithm needs -------------------------------------------------------


@dataclass(frozen=True)
class SiteStep:
    """One site's own step, priced once (the WAN does not change it)."""

    name: str
    strategy: Strategy
    prediction: object
    collectives: Mapping
    dp_layout: tuple
    gpus: int
    profile: object = None


def _site_strategy(strategy: MultiSiteStrategy, site) -> Strategy:
    given = strategy.site
    if isinstance(given, Mapping):
        if site.name not in given:
            raise InvalidInputError(f"'site' strategies must name every site: {site.name!r} is missing "
                                    f"(given: {', '.join(given)})")
        return given[site.name]
    return given if given is not None else Strategy(dp=site.cluster.n_gpus)


def _site_profile(profile, site):
    if isinstance(profile, Mapping):
        return profile.get(site.name)
    return profile


def site_steps(model, multi: MultiCluster, strategy: MultiSiteStrategy, profile=None) -> tuple[SiteStep, ...]:
    """Each site's own step, from :func:`perfmodel.predict` (its kernels, in-site communication)."""
    for given, what in ((profile, "profile"), (strategy.site, "site")):
        unknown = sorted(set(given) - set(multi.names)) if isinstance(given, Mapping) else []
        if unknown:
            raise InvalidInputError(f"{what!r} names sites that are not in {multi.name!r}: {unknown} "
                                    f"(sites: {', '.join(multi.names)})")
    out = []
    for site in multi.sites:
        s = _site_strategy(strategy, site)
        given = _site_profile(profile, site)
        p = predict(model, site.cluster, s, profile=given)
        prof = default_profile(site.cluster) if given is None else load_profile(given)
        lay = layout(s.dp, s.tp, s.pp, site.cluster.gpus_per_node, s.placement, cp=s.cp, ep=s.ep,
                     etp=expert_grid(s.framework, s.ep, s.tp, s.etp))
        out.append(SiteStep(site.name, s, p, cluster_collectives(site.cluster, prof),
                            tuple(float(v) for v in lay["dp_cp"]), site.cluster.n_gpus, prof))
    return tuple(out)


def _params_per_rank(model, s: Strategy) -> float:
    """Parameters one rank holds (and reduces): the model over its tensor x pipeline shards."""
    return float(model.params) / (s.tp * s.pp)


def _grad_bytes(s: Strategy) -> float:
    return wire_bytes(s.precision, s.framework).grad


def _gpu_weighted(values, steps) -> float:
    gpus = np.array([st.gpus for st in steps], float)
    return float(np.dot(values, gpus) / gpus.sum())


def _mfu(steps, step_time: float) -> float:
    """Model FLOPs of all sites per wall second over their peak (each site's own mfu gives its peak)."""
    flops = sum(st.prediction.model_flops for st in steps)
    peak = sum(st.prediction.model_flops / (st.prediction.step_time * st.prediction.mfu)
               for st in steps if st.prediction.mfu > 0)
    return flops / step_time / peak if peak > 0 else 0.0


def _tokens(model, steps) -> float:
    return float(sum(st.strategy.batch for st in steps) * getattr(model, "seq", 1))


# --- synchronous data parallelism across sites ---------------------------------------------------


def _sync_reduce_s(model, multi, steps, algorithm) -> tuple[float, float, float]:
    """(exposed seconds, all buckets' seconds, bytes per site) of the gradients' three-level all-reduce.

    DDP buckets (1 MiB first, then ``bucket_mib``; Li et al. 2020 §3.2) each pay every level's
    latency; the tensor x pipeline shards' groups cross the WAN together.
    """
    s = steps[0].strategy
    for st in steps:
        if st.strategy.shard or st.strategy.ps_servers:
            raise UnsupportedError(f"synchronous data parallelism across sites is priced for DDP all-reduce: "
                                   f"site {st.name!r} uses zero={st.strategy.zero}, fsdp={st.strategy.fsdp!r}, "
                                   f"ps_servers={st.strategy.ps_servers} (use zero=0, fsdp=None, ps_servers=0)")
        if (st.strategy.tp, st.strategy.pp) != (s.tp, s.pp):
            raise InvalidInputError(f"every site must shard the model alike for synchronous data parallelism: "
                                    f"site {st.name!r} has tp={st.strategy.tp}, pp={st.strategy.pp}, "
                                    f"site {steps[0].name!r} tp={s.tp}, pp={s.pp}")
    total = _params_per_rank(model, s) * _grad_bytes(s)
    head, full, size, rem = (float(v) for v in _split(total, bucket_bytes(s, s.dp), DDP_FIRST_BUCKET_BYTES))
    colls = {st.name: st.collectives for st in steps}
    lays = {st.name: st.dp_layout for st in steps}

    def seconds(nbytes):
        if nbytes <= 0:
            return 0.0
        return float(three_level_time(multi, colls, "all_reduce", nbytes, lays, algorithm=algorithm,
                                      concurrent_groups=s.tp * s.pp))

    t_head, t_bucket, t_rem = seconds(head), seconds(size) if full > 0 else 0.0, seconds(rem)
    all_s = t_head + full * t_bucket + t_rem
    last = t_rem if rem > 0 else (t_bucket if full > 0 else t_head)
    share = (head if head > 0 else size) / max(total, 1.0)
    window = max(st.prediction.breakdown["backward"] / st.strategy.micro_batches
                 if st.strategy.dp_overlap else 0.0 for st in steps)
    exposed = float(_overlapped(all_s, last, share, window))
    return exposed, all_s, total * s.tp * s.pp


def _bucket_passes_s(model, st: SiteStep) -> float:
    """DDP's memory passes over its buckets (``perfmodel.parallel.data.ddp_bucket_passes``): the
    site's ``dp_comm`` held them with its in-site reduction, which the three-level one replaces."""
    copy_s = None if st.profile is None else copy_pricer(st.profile)
    if copy_s is None:  # a profile without a copy class: the passes are not priced, as in predict
        return 0.0
    return float(ddp_bucket_passes(copy_s, _params_per_rank(model, st.strategy), st.strategy.framework))


def _sync_dp(model, multi, strategy, steps) -> dict:
    exposed, all_s, wan_bytes = _sync_reduce_s(model, multi, steps, strategy.algorithm)
    own = np.array([st.prediction.step_time - st.prediction.breakdown["dp_comm"] + _bucket_passes_s(model, st)
                    for st in steps])
    step = float(own.max() + exposed)
    return {"period": step, "steps": 1, "outer": all_s, "exposed": step - float(own.max()),
            "busy": own, "wan_bytes": wan_bytes}


# --- pipeline stages across sites ----------------------------------------------------------------


def _pp_across(model, multi, strategy, profile) -> tuple[dict, tuple]:
    """One pipeline whose stages are spread over the sites (tp-dp-pp order: consecutive stages share a site).

    The whole pipeline is priced on one cluster of all the sites' nodes; the site boundaries'
    sends then cost what the WAN charges instead of what the network between nodes charges:
    ``perfmodel.parallel.pipeline.p2p_time`` is called with both fabrics and the difference added.
    """
    nodes = {site.cluster.node for site in multi.sites}
    if len(nodes) != 1 or len({site.cluster.nodes for site in multi.sites}) != 1:
        raise UnsupportedError("pipeline stages across sites need the same node type and node count in every "
                               f"site: got {[site.cluster.name for site in multi.sites]}")
    if not isinstance(strategy.site, Strategy):
        raise InvalidInputError("across='pp' needs one Strategy for the whole pipeline in 'site' "
                                f"(pp a multiple of the {multi.n_sites} sites): got {strategy.site!r}")
    s = strategy.site.replace(placement="tp-dp-pp")
    if s.pp % multi.n_sites:
        raise InvalidInputError(f"across='pp': 'pp'={s.pp} must be a multiple of the number of sites {multi.n_sites}")
    whole = Cluster(nodes.pop(), nodes=sum(site.cluster.nodes for site in multi.sites), name=multi.name)
    p = predict(model, whole, s, profile=profile)
    coll = cluster_collectives(whole, default_profile(whole) if profile is None else load_profile(profile))
    links = [multi.link(a, b) for a, b in ring_edges(multi.names)[:multi.n_sites - 1]]
    flows = s.dp * s.tp  # every replica's tensor ranks send across the same boundary at once
    wan = datasheet_entry(min(k.bw_bytes_per_s for k in links) / flows, max(k.latency_s for k in links),
                          source="WAN between consecutive sites, shared by the boundary's sends")
    across_dc = {"intra": coll["intra"], "inter": {"sendrecv": lookup_entry(coll, "inter", "sendrecv")}}
    across_wan = {"intra": coll["intra"], "inter": {"sendrecv": wan}}
    tp_rpn = min(s.tp, whole.gpus_per_node)
    lay = {"pp": (np.float64(s.pp / multi.n_sites), np.float64(multi.n_sites)),
           "tp": (np.float64(tp_rpn), np.float64(s.tp / tp_rpn))}
    s = run_strategy(s)  # the kernels it runs (workload/stacks/composer.py)
    c = StepConfig.from_strategy(s)
    act = activation_bytes(model, c, s.precision)
    extra = max(float(p2p_time(across_wan, lay, c, act) - p2p_time(across_dc, lay, c, act)), 0.0)
    step = p.step_time + extra
    steps = (SiteStep(multi.name, s, p, coll, (1.0, 1.0), whole.n_gpus),)
    return ({"period": step, "steps": 1, "outer": extra, "exposed": extra,
             "busy": np.array([p.step_time]), "wan_bytes": 0.0}, steps)


# --- DiLoCo and Streaming DiLoCo -----------------------------------------------------------------


def outer_sync_s(model, multi, strategy: MultiSiteStrategy, steps) -> tuple[float, float]:
    """(seconds, bytes per site) of one outer synchronisation (one fragment when streaming).

    Replicas inside a site hold the same pseudo-gradient, so each of a site's ranks sends a
    distinct slice over the WAN (an all-reduce of the whole model's Ψ / F elements in
    ``outer_precision`` through the site's uplink), then the site all-gathers the averaged
    slices among its data-parallel replicas.
    """
    q = OUTER_PRECISION_BYTES[strategy.outer_precision]
    wan_bytes = float(model.params) * q / strategy.streaming_fragments
    t = float(wan_time(multi, "all_reduce", wan_bytes, algorithm=strategy.algorithm))
    gather = max(float(hierarchical_time(st.collectives, "all_gather",
                                         _params_per_rank(model, st.strategy) * q / strategy.streaming_fragments,
                                         *st.dp_layout, algorithm="ring")) for st in steps)
    return t + gather, wan_bytes


def diloco_period(inner_s: float, sync_s: float, strategy: MultiSiteStrategy,
                  backward_s: float = 0.0) -> tuple[float, float]:
    """(wall seconds of H inner steps with their syncs, the part of it no computation hides).

    A sync hides behind ``overlap_steps`` inner steps and, with ``overlap_backward``, behind
    the ``backward_s`` of the step whose gradients it sends (layer by layer, as DDP buckets do).
    """
    h, f, tau = strategy.inner_steps, strategy.streaming_fragments, strategy.overlap_steps
    hidden = tau * inner_s + (backward_s if strategy.overlap_backward else 0.0)
    exposed = f * max(0.0, sync_s - hidden)
    period = max(h * inner_s + exposed, f * sync_s)
    return period, period - h * inner_s


def _diloco(model, multi, strategy, steps) -> dict:
    own = np.array([st.prediction.step_time for st in steps])
    sync_s, wan_bytes = outer_sync_s(model, multi, strategy, steps)
    slowest = steps[int(own.argmax())]
    backward = slowest.prediction.breakdown["backward"] / slowest.strategy.micro_batches  # the last micro-batch's
    period, exposed = diloco_period(float(own.max()), sync_s, strategy, backward)
    return {"period": period, "steps": strategy.inner_steps, "outer": sync_s, "exposed": exposed,
            "busy": strategy.inner_steps * own, "wan_bytes": wan_bytes}


def _fits(model, strategy, steps) -> bool:
    extra = OUTER_STATE_BYTES if strategy.sync == "diloco" else 0.0
    for st in steps:
        p = st.prediction
        need = (stack_memory.required_bytes(p.peak_memory + extra * _params_per_rank(model, st.strategy),
                                            st.strategy.framework) + mem.CUDA_CONTEXT_BYTES)
        if need > p.memory_capacity:
            return False
    return True


def price(model, multi: MultiCluster, strategy: MultiSiteStrategy, steps) -> MultiSitePrediction:
    """The run's prediction from the sites' own steps (cheap: the inverse questions call it many times)."""
    if strategy.across == "pp":
        raise UnsupportedError("price() takes across='dp'; use predict_multisite for across='pp'")
    parts = _diloco(model, multi, strategy, steps) if strategy.sync == "diloco" else _sync_dp(
        model, multi, strategy, steps)
    return _prediction(model, multi, strategy, steps, parts)


def _prediction(model, multi, strategy, steps, parts) -> MultiSitePrediction:
    period, h = parts["period"], parts["steps"]
    step = period / h
    busy = np.minimum(np.asarray(parts["busy"], float) / period, 1.0)
    return MultiSitePrediction(
        model=getattr(model, "name", type(model).__name__), sites=multi.name, strategy=strategy,
        step_time=step, period_s=period, compute_utilization=_gpu_weighted(busy, steps),
        tokens_per_second=_tokens(model, steps) / step, outer_sync_s=float(parts["outer"]),
        exposed_sync_s=float(parts["exposed"]), wan_bytes_per_sync=float(parts["wan_bytes"]),
        mfu=_mfu(steps, step), fits=_fits(model, strategy, steps),
        inner_step_s=FrozenMap({st.name: float(st.prediction.step_time) for st in steps}),
        predictions=tuple(st.prediction for st in steps))


def as_multisite_strategy(strategy, changes) -> MultiSiteStrategy:
    """A MultiSiteStrategy from one, from a site Strategy (or mapping) plus keyword fields, or None."""
    if isinstance(strategy, MultiSiteStrategy):
        return strategy.replace(**changes) if changes else strategy
    if strategy is None or isinstance(strategy, (Strategy, Mapping)):
        return MultiSiteStrategy(site=strategy, **changes)
    raise InvalidInputError(f"'strategy' must be a MultiSiteStrategy or a perfmodel.Strategy: got {strategy!r}")


def predict_multisite(model, sites, strategy=None, *, profile=None, **changes) -> MultiSitePrediction:
    """Predict a run spanning the sites of ``sites`` (:func:`perfmodel.multi_cluster` or its TOML path).

    ``strategy``: a :class:`MultiSiteStrategy`, or a site :class:`~perfmodel.Strategy` with the
    algorithm's fields as keywords (``sync="diloco", inner_steps=100, outer_precision="int8"``).
    ``profile``: one profile for every site, or ``{site name: profile}``.
    """
    multi = sites if isinstance(sites, MultiCluster) else multi_cluster(sites)
    model = as_model(model)
    s = as_multisite_strategy(strategy, changes)
    if s.across == "pp":
        parts, steps = _pp_across(model, multi, s, profile)
        return _prediction(model, multi, s, steps, parts)
    return price(model, multi, s, site_steps(model, multi, s, profile))
