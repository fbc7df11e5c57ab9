"""What bandwidth buys: the WAN bandwidth or the inner steps that reach a compute utilisation, and cost.

    import perfmodel as pm
    bw = pm.required_wan_bandwidth(model, sites, strategy, target=0.9)   # bytes/s
    h = pm.inner_steps_for(model, sites, strategy, target=0.95)          # DiLoCo's H
    plan = pm.plan_multisite(model, sites, strategy, steps=100_000)       # time and cost per site

Both inverse questions root-find over :func:`perfmodel.analysis.multisite.price`, the same
function that predicts (the sites' own steps are priced once: the WAN does not change them).
:func:`diloco_bandwidth_closed_form` is the closed form of plain DiLoCo on a bandwidth-latency
WAN, which the root-find must agree with (tests hold them equal).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from perfmodel.core.lazy import scipy_optimize

from perfmodel.analysis.multisite import (
    MultiSiteStrategy,
    as_multisite_strategy,
    predict_multisite,
    price,
    site_steps,
)
from perfmodel.core.errors import InfeasibleError, InvalidInputError
from perfmodel.hardware.sites import MultiCluster, WanLink, multi_cluster
from perfmodel.core.checks import check_int, check_positive
from perfmodel.workload.presets import as_model
from perfmodel.analysis.transient.plan import plan_training

BANDWIDTH_BOUNDS = (1e3, 1e15)  # bytes/s searched: 8 kb/s to 8 Pb/s
HINTS = {"diloco": "more inner_steps or overlap_steps would help",
         "sync": "fewer, larger messages (bucket_mib, micro_batch) or sync='diloco' would help"}


def _target(target) -> float:
    value = check_positive("target", target)
    if value >= 1.0:
        raise InvalidInputError(f"'target' compute utilisation must be a fraction in (0, 1): got {target!r}")
    return value


def _setup(model, sites, strategy, profile, changes):
    """(model, sites, strategy, the sites' own steps or None for pipelines across sites)."""
    multi = sites if isinstance(sites, MultiCluster) else multi_cluster(sites)
    model = as_model(model)
    s = as_multisite_strategy(strategy, changes)
    return model, multi, s, (site_steps(model, multi, s, profile) if s.across == "dp" else None)


def _utilisation(model, multi, s, steps, profile) -> float:
    """Compute utilisation from the sites' own steps (priced once), or, for pipelines across sites,
    from the whole pipeline priced again (its WAN sends sit inside the step)."""
    if steps is None:
        return predict_multisite(model, multi, s, profile=profile).compute_utilization
    return price(model, multi, s, steps).compute_utilization


def _slowest_latency(multi: MultiCluster) -> float:
    return max(multi.link(a, b).latency_s for i, a in enumerate(multi.names) for b in multi.names[i + 1:])


def required_wan_bandwidth(model, sites, strategy=None, target: float = 0.9, *, profile=None,
                           **changes) -> float:
    """WAN bandwidth (bytes/s per site, per direction) at which compute utilisation reaches ``target``.

    Every pair of sites gets the same bandwidth and the slowest pair's latency; a measured WAN
    curve does not apply at other bandwidths and is set aside. Raises InfeasibleError when the
    latency alone keeps utilisation below the target.
    """
    target = _target(target)
    model, multi, s, steps = _setup(model, sites, strategy, profile, changes)
    latency = _slowest_latency(multi)

    def gap(log_bw):
        wan = WanLink(math.exp(log_bw), latency, None, "bandwidth searched")
        return _utilisation(model, multi.with_wan(wan), s, steps, profile) - target

    lo, hi = (math.log(b) for b in BANDWIDTH_BOUNDS)
    if gap(hi) < 0:
        reached = gap(hi) + target
        raise InfeasibleError(f"compute utilisation {target:.0%} is out of reach at any bandwidth: with "
                              f"latency {latency * 1e3:.3g} ms it reaches {reached:.1%} at most "
                              f"({HINTS[s.sync]})")
    if gap(lo) >= 0:
        return BANDWIDTH_BOUNDS[0]
    return float(math.exp(scipy_optimize.brentq(gap, lo, hi, xtol=1e-9, rtol=1e-10)))


def diloco_bandwidth_closed_form(inner_s: float, wan_bytes: float, n_sites: int, latency_s: float,
                                 inner_steps: int, target: float, in_site_s: float = 0.0) -> float:
    """Plain DiLoCo's WAN bandwidth for utilisation ``target`` (ring over the sites, no overlap).

    ``c = H t / (H t + n λ + S 2(n-1)/n / B + g)`` (one outer all-reduce of S bytes: NCCL's
    ring latency n λ, perfmodel.parallel.fabric.datasheet_entry; busbw factor, nccl-tests PERFORMANCE.md;
    g the in-site all-gather), solved for B. Infinite when the latency alone uses the budget.
    """
    budget = inner_steps * inner_s * (1.0 / target - 1.0) - n_sites * latency_s - in_site_s
    factor = 2.0 * (n_sites - 1) / n_sites
    return wan_bytes * factor / budget if budget > 0 else math.inf


def inner_steps_for(model, sites, strategy=None, target: float = 0.9, *, profile=None,
                    max_steps: int = 1_000_000, **changes) -> int:
    """The fewest inner steps H for which DiLoCo reaches compute utilisation ``target`` at the sites' WAN.

    Utilisation grows with H (the same sync spread over more steps), so an integer bisection
    over :func:`perfmodel.analysis.multisite.price` finds it.
    """
    target = _target(target)
    max_steps = check_int("max_steps", max_steps)
    model, multi, s, steps = _setup(model, sites, strategy, profile, changes)
    if s.sync != "diloco":
        raise InvalidInputError(f"'inner_steps' is DiLoCo's: use sync='diloco' (got sync={s.sync!r})")

    def reached(h: int) -> bool:
        return _utilisation(model, multi, s.replace(inner_steps=h), steps, profile) >= target

    lo = max(s.streaming_fragments, s.overlap_steps + 1)
    if reached(lo):
        return lo
    hi = lo
    while not reached(hi):
        if hi >= max_steps:
            raise InfeasibleError(f"compute utilisation {target:.0%} needs more than max_steps={max_steps} "
                                  "inner steps at this WAN")
        lo, hi = hi, min(2 * hi, max_steps)
    while hi - lo > 1:  # reached(hi) and not reached(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reached(mid) else (mid, hi)
    return hi


def plan_multisite(model, sites, strategy=None, steps: int = 1, *, prices=None, profile=None,
                   trials: int = 2000, seed: int = 0, **changes) -> pd.DataFrame:
    """Time and cost of ``steps`` inner steps on every site, on-demand and on transient servers.

    Calls :func:`perfmodel.analysis.transient.plan.plan_training` once per site with the run's wall time
    per step (every site waits for the WAN and the slowest site), each with its own provider,
    region and, where the site gives ``price_usd_per_gpu_hour``, its on-demand price. The
    ``all sites`` rows add the costs and take the longest time: revocations are simulated per
    site, not their coupling (a revoked site stalls a synchronous run; DiLoCo's others go on).
    """
    steps = check_int("steps", steps)
    multi = sites if isinstance(sites, MultiCluster) else multi_cluster(sites)
    model = as_model(model)
    pred = predict_multisite(model, multi, strategy, profile=profile, **changes)
    frames = []
    for site in multi.sites:
        rows = plan_training(model, site.cluster, None, steps, prices=prices, provider=site.provider,
                             region=site.region, step_time_s=pred.step_time, trials=trials, seed=seed)
        if site.price_usd_per_gpu_hour is not None:
            od = rows["scenario"] == "on-demand"
            cost = site.price_usd_per_gpu_hour * site.cluster.n_gpus * rows.loc[od, "expected_time_s"] / 3600.0
            rows.loc[od, ["expected_cost_usd", "on_demand_cost_usd"]] = np.column_stack([cost, cost])
            rows["on_demand_cost_usd"] = float(cost.iloc[0])
            spot = ~od
            rows.loc[spot, "savings_pct"] = 100.0 * (1.0 - rows.loc[spot, "expected_cost_usd"] / float(cost.iloc[0]))
        rows.insert(0, "site", site.name)
        frames.append(rows)
    per_site = pd.concat(frames, ignore_index=True)
    total = per_site.groupby("scenario", sort=False).agg(
        expected_time_s=("expected_time_s", "max"), expected_cost_usd=("expected_cost_usd", "sum"),
        on_demand_cost_usd=("on_demand_cost_usd", "sum"), workers=("workers", "sum")).reset_index()
    total.insert(0, "site", "all sites")
    total["savings_pct"] = 100.0 * (1.0 - total["expected_cost_usd"] / total["on_demand_cost_usd"])
    out = pd.concat([per_site, total], ignore_index=True)
    out["compute_utilization"] = pred.compute_utilization
    out["step_time_s"] = pred.step_time
    return out


__all__ = ["MultiSiteStrategy", "diloco_bandwidth_closed_form", "inner_steps_for", "plan_multisite",
           "required_wan_bandwidth"]
