"""Training on transient (spot / preemptible) cloud servers.

Revocation models per GPU type and region, checkpoint intervals
(Young 1974, Daly 2006), the expected time to train under revocations in
closed form and its distribution by Monte Carlo, GPU prices, and a planner
that compares on-demand with spot time and cost::

    from perfmodel.analysis.transient import plan_training
    plan = plan_training(model, cluster, strategy, steps=100_000, step_time_s=0.5)

See docs/transient.md for the model, its formulas and their sources.
"""

from perfmodel.analysis.transient.checkpoint import (
    checkpoint_time_s,
    expected_revocations,
    expected_time,
    expected_time_async,
    young_daly_interval,
)
from perfmodel.analysis.transient.montecarlo import Simulation, cluster_mtbf_s, simulate, simulate_time
from perfmodel.analysis.transient.plan import cluster_workers, default_checkpoint_bytes, plan_training
from perfmodel.analysis.transient.prices import cost_usd, load_prices
from perfmodel.analysis.transient.revocation import (
    Exponential,
    PiecewiseHazard,
    Weibull,
    load_revocation,
    mtbf_from_monthly_interruption,
    revocation_model,
)

__all__ = [
    "Exponential",
    "PiecewiseHazard",
    "Simulation",
    "Weibull",
    "checkpoint_time_s",
    "cluster_mtbf_s",
    "cluster_workers",
    "cost_usd",
    "default_checkpoint_bytes",
    "expected_revocations",
    "expected_time",
    "expected_time_async",
    "load_prices",
    "load_revocation",
    "mtbf_from_monthly_interruption",
    "plan_training",
    "revocation_model",
    "simulate",
    "simulate_time",
    "young_daly_interval",
]
