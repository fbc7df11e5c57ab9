"""Plan a training run on transient servers: time, its spread, cost vs on-demand.

The unit of revocation is a *worker*: one server (a node and all its GPUs).
``cluster`` is read through the attributes below, so any object (or mapping)
that has them works:

* ``worker_gpus`` — optional sequence of GPU names, one per worker; each
  worker's revocation model and price follow its own GPU type; the step time
  of a mixed cluster comes from ``perfmodel.analysis.hetero.predict_mixed``, passed
  as ``step_time_s``;
* otherwise ``nodes`` (or ``num_nodes``, ``workers``; default 1) workers of
  GPU ``gpu`` (a name, or an object with ``.name``; or ``node.gpu``);
* ``gpus_per_node`` (or ``gpus_per_worker``; default 1) GPUs per worker.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.core.errors import InvalidInputError
from perfmodel.analysis.transient._tables import bundled
from perfmodel.analysis.transient.checkpoint import (
    checkpoint_time_s,
    expected_time,
    expected_time_async,
    young_daly_interval,
)
from perfmodel.analysis.transient.montecarlo import cluster_mtbf_s, simulate, worker_models
from perfmodel.analysis.transient.prices import SECONDS_PER_HOUR, load_prices, select_row
from perfmodel.analysis.transient.revocation import load_revocation, revocation_model
from perfmodel.core.checks import check_int, check_positive
from perfmodel.workload.presets import as_model
from perfmodel.interval import check_level
from perfmodel.predict import predict

BYTES_PER_PARAM = 12  # fp32 weights + two fp32 Adam moments (Kingma & Ba 2015)
COLUMNS = ["scenario", "gpu", "workers", "interval_s", "expected_time_s", "p50_s", "p90_s",
           "p99_s", "expected_cost_usd", "on_demand_cost_usd", "savings_pct",
           "revocations_expected", "mode", "provider", "region", "closed_form_time_s",
           "expected_time_low_s", "expected_time_high_s", "expected_cost_low_usd", "expected_cost_high_usd",
           "interval_level", "interval_regime"]


def _get(obj, *names, default=None):
    for name in names:
        value = obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)
        if value is not None:
            return value
    return default


def _gpu_name(gpu) -> str:
    return gpu if isinstance(gpu, str) else str(_get(gpu, "name", default=gpu))


def cluster_workers(cluster) -> tuple[list[str], int]:
    """(GPU name of each worker, GPUs per worker) read from ``cluster`` (module docstring)."""
    if cluster is None:
        raise InvalidInputError("'cluster' must describe at least one worker: got None")
    per = check_int("cluster.gpus_per_node", _get(cluster, "gpus_per_node", "gpus_per_worker",
                                                  default=1))
    listed = _get(cluster, "worker_gpus")
    if listed is not None:
        if isinstance(listed, str) or not isinstance(listed, Sequence) or len(listed) == 0:
            raise InvalidInputError("'cluster.worker_gpus' must list one GPU name per worker "
                                    f"(at least one): got {listed!r}")
        return [_gpu_name(g) for g in listed], per
    nodes = _get(cluster, "nodes", "num_nodes", "workers", default=1)
    if isinstance(nodes, bool) or not isinstance(nodes, (int, np.integer)) or nodes < 1:
        raise InvalidInputError(f"'cluster.nodes' (workers) must be an integer >= 1: got {nodes!r}")
    gpu = _get(cluster, "gpu") or _get(_get(cluster, "node", default={}), "gpu")
    if gpu is None:
        raise InvalidInputError("'cluster' must name its GPU ('gpu', 'node.gpu' or "
                                "'worker_gpus'): got none")
    return [_gpu_name(gpu)] * int(nodes), per


def default_checkpoint_bytes(model) -> float:
    """Weights + optimizer state of ``model``: 12 bytes per parameter (fp32 + Adam)."""
    params = _get(model, "params") if model is not None else None
    if callable(params):
        params = params()
    if params is None:
        raise InvalidInputError("'checkpoint_bytes' is required when the model has no 'params' "
                                f"attribute: got model={model!r}")
    return BYTES_PER_PARAM * check_positive("model.params", float(params))


def _table(value, loader, what: str):
    if value is None:
        return loader()
    if isinstance(value, pd.DataFrame):
        return value
    if isinstance(value, (str, Path)):
        return loader(value)
    raise InvalidInputError(f"{what!r} must be None, a DataFrame or a TOML path: got {value!r}")


def _restart_params(table: pd.DataFrame, gpu, provider, region):
    """(replacement wait, restart, storage bandwidth) for a GPU; bundled defaults otherwise."""
    try:
        row = select_row(table, gpu, provider, region, what="revocation")
        return row["replacement_wait_s"], row["restart_s"], row["storage_bw_bytes_per_s"]
    except InvalidInputError:
        d = bundled("revocation.toml")["defaults"]
        return d["replacement_wait_s"], d["restart_s"], d["storage_bw_bytes_per_s"]


def _resolve_revocation(revocation, gpus, provider, region):
    """Per-worker lifetime models and the revocation table for restart parameters."""
    if revocation is None or isinstance(revocation, (pd.DataFrame, str, Path)):
        table = _table(revocation, load_revocation, "revocation")
        by_type = {g: revocation_model(select_row(table, g, provider, region, what="revocation"))
                   for g in set(gpus)}
        return [by_type[g] for g in gpus], table
    return worker_models(revocation, len(gpus)), load_revocation()


def _spot_scenarios(checkpoint_s: float, mtbf_s: float, interval_s) -> list[tuple[str, str, float]]:
    """(scenario, mode, checkpoint interval) of each spot run: Daly's interval, the exact optimum,
    the given one (if any), and the asynchronous parameter server at Daly's interval."""
    daly = young_daly_interval(checkpoint_s, mtbf_s, method="daly")
    runs = [("spot sync, Daly interval", "sync", daly),
            ("spot sync, optimal interval", "sync", young_daly_interval(checkpoint_s, mtbf_s, method="exact"))]
    if interval_s is not None:
        runs.append(("spot sync, given interval", "sync", check_positive("interval_s", interval_s)))
    runs.append(("spot async (parameter server)", "async", daly))
    return runs


def _on_demand_row(work_s: float, cost_usd: float) -> dict:
    """The on-demand scenario: no revocation, the work's time at the on-demand price."""
    return {"scenario": "on-demand", "interval_s": math.nan, "expected_time_s": work_s,
            "p50_s": work_s, "p90_s": work_s, "p99_s": work_s, "expected_cost_usd": cost_usd,
            "on_demand_cost_usd": cost_usd, "savings_pct": 0.0, "revocations_expected": 0.0,
            "mode": "-", "closed_form_time_s": work_s}


def _spot_row(name, sim, *, mode, work, prices_per_worker, gpw, wait_s, on_demand_cost, closed):
    times, counts = sim.times_s, sim.revocations
    price = np.asarray(prices_per_worker)  # $/GPU-h of each worker
    # GPU-time billed: every worker for the whole run, less the waits for replacements
    usd = (times[:, None] - wait_s * counts) * gpw * price / SECONDS_PER_HOUR
    cost = float(usd.sum(axis=1).mean())
    p50, p90, p99 = np.percentile(times, [50, 90, 99])
    return {"scenario": name, "interval_s": sim.interval_s, "expected_time_s": float(times.mean()),
            "p50_s": p50, "p90_s": p90, "p99_s": p99, "expected_cost_usd": cost,
            "on_demand_cost_usd": on_demand_cost,
            "savings_pct": 100.0 * (1.0 - cost / on_demand_cost) if on_demand_cost else math.nan,
            "revocations_expected": float(counts.sum(axis=1).mean()), "mode": mode,
            "closed_form_time_s": closed}


def _step_interval(model, cluster, strategy, step_time_s, profile=None, level=0.9, step_interval_s=None):
    """(step seconds, interval low / step, interval high / step, regime); a given step has no interval
    unless ``step_interval_s`` = (low, high) seconds comes with it."""
    level = check_level(level)
    if step_time_s is not None:
        step = check_positive("step_time_s", step_time_s)
        if step_interval_s is None:
            return step, math.nan, math.nan, "step time given"
        low, high = (check_positive("step_interval_s", v) for v in step_interval_s)
        if not low <= step <= high:
            raise InvalidInputError(f"'step_interval_s' must hold step_time_s={step:g}: got ({low:g}, {high:g})")
        return step, low / step, high / step, "step time and interval given"
    if step_interval_s is not None:
        raise InvalidInputError("'step_interval_s' needs 'step_time_s' (a predicted step brings its own interval)")

    p = predict(model, cluster, strategy, profile=profile, level=level)
    # asynchronous parameter servers: a step is one global update, 1 / the cluster's update rate
    seconds = p.step_time if p.ps is None else 1.0 / p.ps.updates_per_second
    step = check_positive("predicted step_time", float(seconds))
    return step, p.interval[0] / step, p.interval[1] / step, p.interval_regime


def _plan_frame(out, gpus, provider, region, factors, level, regime) -> pd.DataFrame:
    """The scenarios' rows as the table ``plan_training`` returns, with the time and cost bounds
    (the expected ones scaled by the step interval's ``factors``, low and high)."""
    low_factor, high_factor = factors
    label = gpus[0] if len(set(gpus)) == 1 else "+".join(sorted(set(gpus)))
    frame = pd.DataFrame(out)
    frame["gpu"], frame["workers"] = label, len(gpus)
    frame["provider"], frame["region"] = provider, region
    frame["expected_time_low_s"] = frame["expected_time_s"] * low_factor
    frame["expected_time_high_s"] = frame["expected_time_s"] * high_factor
    frame["expected_cost_low_usd"] = frame["expected_cost_usd"] * low_factor
    frame["expected_cost_high_usd"] = frame["expected_cost_usd"] * high_factor
    frame["interval_level"], frame["interval_regime"] = level, regime
    return frame[COLUMNS]


def plan_training(model, cluster, strategy, steps: int, *, revocation=None, prices=None,
                  provider=None, region=None, step_time_s=None, checkpoint_bytes=None,
                  interval_s=None, trials=10000, seed=0, profile=None, level=0.9,
                  step_interval_s=None) -> pd.DataFrame:
    """Time and cost to train ``steps`` steps on-demand vs on transient servers.

    One row per scenario: ``on-demand``; ``spot sync, Daly interval`` (the
    default checkpoint interval); ``spot sync, optimal interval`` (the exact
    minimiser, :func:`~.checkpoint.young_daly_interval` ``method="exact"``);
    ``spot sync, given interval`` when ``interval_s`` is given; ``spot async
    (parameter server)`` at the default interval. Times from a seeded Monte
    Carlo of ``trials`` runs (:mod:`.montecarlo`); ``closed_form_time_s`` is
    the exponential closed form with the same mean time between revocations.

    ``revocation``: None (bundled table), a table from :func:`load_revocation`
    or a TOML path, a lifetime model, an MTBF in seconds, or one model per
    worker. ``prices``: None, a table from :func:`load_prices` or a TOML path.
    ``provider``/``region`` select rows (default: GCP, first region listed). ``profile``: the
    profile the step time is predicted with (default: the GPU's bundled one; unused with
    ``step_time_s``).

    ``expected_time_low_s``/``_high_s`` and the cost bounds scale the expected time and cost
    by the predicted step's interval at ``level`` (first order: revocations, checkpoints and
    restarts grow with the run's length); NaN with a given ``step_time_s`` unless ``step_interval_s``
    (its low and high seconds, e.g. ``predict_mixed``'s) comes with it (docs/accuracy.md).
    """
    steps = check_int("steps", steps)
    if isinstance(model, str):  # a preset by name; otherwise optional (step time and checkpoint bytes given)
        model = as_model(model)
    gpus, gpw = cluster_workers(cluster)
    step, low_factor, high_factor, regime = _step_interval(model, cluster, strategy, step_time_s, profile, level,
                                                           step_interval_s)
    work = steps * step
    price_table = _table(prices, load_prices, "prices")
    rows = {g: select_row(price_table, g, provider, region, what="prices") for g in set(gpus)}
    provider, region = rows[gpus[0]]["provider"], rows[gpus[0]]["region"]
    models, rev_table = _resolve_revocation(revocation, gpus, provider, region)
    wait, restart, bw = _restart_params(rev_table, gpus[0], provider, region)
    size = (default_checkpoint_bytes(model) if checkpoint_bytes is None
            else check_positive("checkpoint_bytes", checkpoint_bytes))
    delta = checkpoint_time_s(size, bw)
    down = wait + restart + delta  # restore reads the checkpoint back at the same bandwidth
    mtbf = cluster_mtbf_s(models)

    od_price = sum(rows[g]["on_demand_usd_per_gpu_hour"] for g in gpus) * gpw
    od_cost = work * od_price / SECONDS_PER_HOUR
    out = [_on_demand_row(work, od_cost)]
    spot = [rows[g]["spot_usd_per_gpu_hour"] for g in gpus]
    for name, mode, tau in _spot_scenarios(delta, mtbf, interval_s):
        sim = simulate(work, revocation=models, workers=len(models), checkpoint_s=delta,
                       restart_s=down, interval_s=tau, trials=trials, seed=seed, mode=mode)
        closed = (expected_time(work, mtbf_s=mtbf, checkpoint_s=delta, restart_s=down,
                                interval_s=tau) if mode == "sync" else
                  expected_time_async(work, mtbf_s=[m.mean_lifetime_s for m in models],
                                      checkpoint_s=delta, restart_s=down, interval_s=tau))
        out.append(_spot_row(name, sim, mode=mode, work=work, prices_per_worker=spot, gpw=gpw,
                             wait_s=wait, on_demand_cost=od_cost, closed=closed))
    return _plan_frame(out, gpus, provider, region, (low_factor, high_factor), level, regime)
