"""Synchronous data parallelism over workers of different GPU types.

Each worker is one single-GPU node. Its compute time for a given share of the
batch is :func:`perfmodel.predict` of the model on one GPU of its type
(``dp=1``), so every per-type cost comes from the core model. Gradients are
exchanged once per step by PyTorch DDP as ``predict`` prices it
(``parallel.data.dp_comm_time``: bucketed ring all-reduce overlapping backward)
over the fabric of the slowest NIC, or by parameter servers
(``parallel.data.ps_time``). On identical workers the step is ``predict``'s.
Two ways to split the batch are priced:

* ``equal``: every worker takes ``strategy.micro_batch`` samples; the step
  waits for the slowest worker.
* ``proportional``: the global batch is split in proportion to each worker's
  predicted speed (integer shares, refined once at the chosen shares).

Pipeline stages on different GPU types: :func:`balance_pipeline` gives each
stage the layer count that minimises the slowest stage (:func:`balance_layers`).

See docs/heterogeneous.md for the formulas and their limits.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from dataclasses import replace

from perfmodel.workload.stacks.composer import run_strategy
from perfmodel.core.checks import LIMITS, check_choice, check_int, check_size
from perfmodel.analysis.hetero_async import mixed_async
from perfmodel.core.errors import InvalidInputError, UnsupportedError
from perfmodel.hardware import cluster as make_cluster, load_link
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.data import ps_time
from perfmodel.parallel.fabric import cluster_collectives
from perfmodel.parallel.pipeline import schedule_seconds
from perfmodel.parallel.strategy import Strategy
from perfmodel.parallel.stragglers import device_spread, paced_growth
from perfmodel.predict import default_profile, predict, profile_for
from perfmodel.profiles.profile import load_profile
from perfmodel.step import compute_times, evaluate
from perfmodel.workload.kernels import gemm_dtype
from perfmodel.workload.model import Transformer
from perfmodel.workload.presets import as_model
from perfmodel.interval import check_level, uncalibrated_bounds

GRAD_BYTES = 4.0  # fp32 gradients and weights on the wire (PyTorch DDP / PS keep fp32 master copies)
MODES = ("both", "equal", "proportional")


def _workers(workers) -> list[tuple[str, int]]:
    """``[(gpu name, count), ...]`` checked: non-empty, counts >= 1, names unique."""
    items = list(workers.items()) if isinstance(workers, Mapping) else workers
    if isinstance(items, str) or not hasattr(items, "__iter__"):
        raise InvalidInputError(f"'workers' must be a list of (gpu, count) pairs or a dict: got {workers!r}")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, (tuple, list)) or len(item) != 2 or not isinstance(item[0], str):
            raise InvalidInputError(f"'workers[{i}]' must be a (gpu name, count) pair: got {item!r}")
        out.append((item[0], check_size(f"workers[{item[0]!r}] count", item[1], limit="mixed_workers")))
    if not out:
        raise InvalidInputError("'workers' must list at least one (gpu, count) group: got none")
    if sum(c for _, c in out) > LIMITS["mixed_workers"]:
        raise InvalidInputError(f"'workers' counts add up to {sum(c for _, c in out):,}, above the "
                                f"{LIMITS['mixed_workers']:,} workers a mixed cluster may have")
    names = [g for g, _ in out]
    if len(set(names)) != len(names):
        raise InvalidInputError(f"'workers' names each GPU type once (merge the counts): got {names}")
    return out


def _profiles(profile, names):
    if profile is None or isinstance(profile, Mapping):
        given = dict(profile or {})
        extra = set(given) - set(names)
        if extra:
            raise InvalidInputError(f"'profile' names GPU types that are not workers: {sorted(extra)} "
                                    f"(workers: {names})")
        return {g: given.get(g) for g in names}
    if len(names) > 1:
        raise InvalidInputError("'profile' must be a dict {gpu: profile} when workers mix GPU types: "
                                f"got {profile!r} for {names}")
    return {names[0]: profile}


class _Type:
    """One GPU type: its single-GPU cluster and caches of predicted step times by batch."""

    def __init__(self, model, gpu, count, strategy, profile, level=0.9):

        self.gpu, self.count, self.model, self.profile, self.level = gpu, count, model, profile, level
        self.cluster = make_cluster(gpu)  # raises UnknownNameError listing the known GPUs
        self.strategy = strategy.replace(dp=1, tp=1, pp=1, global_batch=None, ps_servers=0, zero=0, fsdp=None,
                                         ps_async=False, ps_placement=None)
        self._cache = {}
        self._exchange = {}

    def resolved_profile(self, cluster):

        return default_profile(cluster) if self.profile is None else profile_for(cluster, self.profile)

    def exchange(self, batch: int, workers: int, coll) -> float:
        """Exposed seconds of DDP's gradient exchange among ``workers`` one-GPU nodes over the
        collectives ``coll``, overlapping this type's backward at ``batch`` (``step.evaluate``)."""

        key = (batch, workers)
        if key not in self._exchange:
            cl = make_cluster(self.gpu, nodes=workers)
            s = run_strategy(self.strategy.replace(dp=workers, micro_batch=int(batch)))  # the kernels it runs
            out = evaluate(self.model, cl, self.resolved_profile(cl), coll, StepConfig.from_strategy(s),
                           precision=s.precision, recompute=s.recompute, optimizer=s.optimizer,
                           placement=s.placement)
            self._exchange[key] = float(out["dp_comm"])
        return self._exchange[key]

    def predict(self, batch: int):

        if batch not in self._cache:
            s = self.strategy.replace(micro_batch=int(batch))
            self._cache[batch] = predict(self.model, self.cluster, s, profile=self.profile, level=self.level)
        return self._cache[batch]

    def time(self, batch: int) -> float:
        """A step of this type's slowest worker of ``count`` (``parallel/stragglers.py``; one GPU's
        prediction otherwise, as ``predict`` prices a step on ``count`` GPUs of one type)."""
        if batch == 0:
            return 0.0
        p = self.predict(batch)
        b = p.breakdown
        return float(p.step_time + paced_growth(b["forward"] + b["backward"], b["host_overhead"], b["optimizer"],
                                                self.count, device_spread(self.cluster)))

    def speed(self, batch: int) -> float:
        return batch / self.time(batch)


def ps_exchange_s(params, workers, servers, server_bw_bytes_per_s, worker_bw_bytes_per_s,
                  latency_s=0.0, grad_bytes=GRAD_BYTES):
    """Push gradients then pull weights through parameter servers, no overlap with compute:
    ``parallel.data.ps_time`` (Li et al. 2014) with no backward to hide the push behind."""

    c = replace(StepConfig.from_strategy(Strategy()), dp=workers, ps_servers=servers)
    links = {"server": server_bw_bytes_per_s, "worker": worker_bw_bytes_per_s, "latency": latency_s}
    return ps_time(c, params, 0.0, links, grad_bytes)


def _transformer(model):
    """A transformer, or the bundled one by name: stages split layers, which a traced graph does not have."""

    model = as_model(model)
    if not isinstance(model, Transformer):
        raise InvalidInputError(f"a pipeline splits a transformer's layers; {getattr(model, 'name', model)!r} is not "
                                "one (pm.transformer, pm.preset of a transformer, pm.from_hf_config)")
    return model


def _flat_numbers(name: str, values, *, positive: bool) -> np.ndarray:
    """A flat, non-empty array of finite numbers > 0 (or >= 0): seconds or speeds, one per stage or worker."""
    try:
        arr = np.asarray(values, float)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name!r} must be a list of numbers, one per stage or worker: got {values!r}") from None
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidInputError(f"{name!r} must be a non-empty flat list of numbers: got {values!r}")
    bad = ~np.isfinite(arr) | (arr < 0) | ((arr == 0) & positive)
    if bad.any():
        raise InvalidInputError(f"{name!r} must hold finite numbers {'> 0' if positive else '>= 0'}: "
                                f"got {float(arr[bad][0])!r}")
    return arr


def split_batch(total: int, speeds) -> np.ndarray:
    """Integer shares of ``total`` proportional to ``speeds`` (largest remainder), summing to ``total``."""
    total = check_int("total", total, minimum=0)
    speeds = _flat_numbers("speeds", speeds, positive=True)
    exact = total * speeds / speeds.sum()
    shares = np.floor(exact).astype(int)
    order = np.argsort(-(exact - shares), kind="stable")
    shares[order[: total - shares.sum()]] += 1
    return shares


def _comm(model, types, servers, server_node):
    """(exposed seconds of the exchange by (type, batch), description) of the gradient exchange."""

    n = sum(t.count for t in types)
    params = float(model.params)
    worst = min(types, key=lambda t: t.cluster.node.inter_bw_bytes_per_s)
    bw, lat = worst.cluster.node.inter_bw_bytes_per_s, worst.cluster.node.nic.latency_s
    if servers == 0:
        if n == 1:
            return (lambda t, b: 0.0), "none (one worker)"
        fabric = make_cluster(worst.gpu, nodes=n)
        coll = cluster_collectives(fabric, worst.resolved_profile(fabric))
        return (lambda t, b: t.exchange(b, n, coll)), f"DDP ring all-reduce, NIC of {worst.gpu}"
    if server_node is None:
        link = load_link("eth10")
        server_bw, lat = link.bw_bytes_per_s, max(lat, link.latency_s)
    else:
        node = load_link(server_node) if isinstance(server_node, str) else server_node
        server_bw = getattr(node, "inter_bw_bytes_per_s", None) or getattr(node, "bw_bytes_per_s", None)
        if server_bw is None:
            raise InvalidInputError("'server_node' must be a Node, a Link or a link name (e.g. 'eth25'): "
                                    f"got {server_node!r}")
    ps_s = float(ps_exchange_s(params, n, servers, server_bw, bw, lat))
    return (lambda t, b: ps_s), f"{servers} parameter server(s)"


def _row(policy, types, worker_shares, exchange, comm_kind, solo):
    """One policy's row; ``worker_shares``: per type, an array of each worker's samples.

    The step waits for the type whose compute plus exposed exchange ends last; ``comm_s`` is
    what the exchange adds to the slowest compute.
    """
    shares = [int(np.max(w)) for w in worker_shares]  # a type's slowest worker has the largest share
    times = [t.time(b) for t, b in zip(types, shares)]
    compute = max(times)
    step = max(s + exchange(t, b) for t, b, s in zip(types, shares, times) if b > 0)
    comm_s = step - compute
    batch = int(sum(np.sum(w) for w in worker_shares))
    row = {"policy": policy, "step_time_s": step, "samples_per_second": batch / step, "global_batch": batch,
           "compute_s": compute, "comm_s": comm_s, "comm": comm_kind,
           "slowest": types[int(np.argmax(times))].gpu,
           "efficiency": batch / step / solo,
           "fits": all(t.predict(b).fits for t, b in zip(types, shares) if b > 0)}
    for t, b, s in zip(types, shares, times):
        row[f"batch_{t.gpu}"], row[f"compute_s_{t.gpu}"] = int(b), s
    row.update(_interval(types, shares, comm_s))
    return row


def _interval(types, shares, comm_s) -> dict:
    """Step bounds: the slowest worker's interval (each type's own regime) plus the exchange, which no
    validation row checks, widened by the uncalibrated half-width."""
    preds = [t.predict(b) for t, b in zip(types, shares) if b > 0]
    level = types[0].level
    comm_lo, comm_hi = uncalibrated_bounds(comm_s, level)
    regimes = sorted({p.interval_regime for p in preds})
    return {"step_time_low_s": max(p.interval[0] for p in preds) + float(comm_lo),
            "step_time_high_s": max(p.interval[1] for p in preds) + float(comm_hi), "interval_level": level,
            "interval_regime": "; ".join(regimes) + ("; exchange uncalibrated" if comm_s > 0 else "")}


def predict_mixed(model, workers, strategy=None, *, servers=0, server_node=None, profile=None,
                  mode="both", level: float = 0.9) -> pd.DataFrame:
    """Step time and throughput of synchronous data parallelism over mixed GPU types (with
    ``strategy.ps_async``: asynchronous parameter servers, one "async" row; ``server_node`` may
    then be a ServerVM, whose vCPUs price the servers' CPU).

    ``workers``: ``[(gpu, count), ...]`` or ``{gpu: count}``, one GPU per worker
    node. ``strategy``: per-worker settings (``micro_batch`` is each worker's batch
    under the equal policy; precision, optimizer, recompute); its dp/tp/pp are
    ignored. ``servers`` > 0 exchanges gradients through that many parameter
    servers whose NIC is ``server_node``'s (a Node, a Link or a link name; default
    10 Gb/s Ethernet). ``profile``: None or ``{gpu: profile}``. ``mode``:
    "both", "equal" or "proportional" — which policies to report, one row each.
    Efficiency is throughput over the sum of the workers' solo throughputs at
    ``micro_batch`` (no communication). ``step_time_low_s``/``step_time_high_s``: the slowest
    type's interval at ``level`` plus the exchange widened as an uncalibrated term (docs/accuracy.md).
    """

    check_choice("mode", mode, MODES)
    servers = check_size("servers", servers, minimum=0, limit="ps_servers")
    strategy = Strategy(micro_batch=8) if strategy is None else strategy
    if not isinstance(strategy, Strategy):
        raise InvalidInputError(f"'strategy' must be a perfmodel.Strategy: got {type(strategy).__name__}")
    model = as_model(model)
    groups = _workers(workers)
    profs = _profiles(profile, [g for g, _ in groups])
    types = [_Type(model, g, c, strategy, profs[g], check_level(level)) for g, c in groups]
    if strategy.ps_async:  # asynchronous servers: one row, perfmodel/analysis/hetero_async.py
        return mixed_async(model, types, strategy, servers, server_node)
    exchange, kind = _comm(model, types, servers, server_node)
    mb = strategy.micro_batch
    solo = sum(t.count * t.speed(mb) for t in types)
    rows = []
    if mode in ("both", "equal"):
        rows.append(_row("equal", types, [np.full(t.count, mb) for t in types], exchange, kind, solo))
    if mode in ("both", "proportional"):
        rows.append(_row("proportional", types, _proportional(types, mb), exchange, kind, solo))
    return pd.DataFrame(rows)


def _proportional(types, mb) -> list[np.ndarray]:
    """Per-worker shares of the global batch ∝ speed, refined once at the first shares."""
    total = mb * sum(t.count for t in types)
    counts = [t.count for t in types]
    speeds = np.array([t.speed(mb) for t in types])
    for _ in range(2):  # first at the equal batch, then at the shares found (speed depends on batch)
        shares = np.split(split_batch(total, np.repeat(speeds, counts)), np.cumsum(counts)[:-1])
        speeds = np.array([t.speed(max(int(b.max()), 1)) for t, b in zip(types, shares)])
    return shares


# --- pipeline stages on different GPU types ---------------------------------------------------


def stage_costs(model, gpu: str, strategy, profile=None) -> tuple[float, float, float]:
    """(layer, embedding, head) forward + backward seconds of one micro-batch on one ``gpu``.

    Priced by the core cost model (:func:`perfmodel.step.compute_times`)
    under ``profile`` (default: the GPU's bundled profile, as ``pm.predict``), tp = 1.
    """

    model = _transformer(model)
    if not isinstance(strategy, Strategy):
        raise InvalidInputError(f"'strategy' must be a pm.Strategy: got {strategy!r}")
    if not isinstance(gpu, str):
        raise InvalidInputError(f"'gpu' must be a GPU name: got {gpu!r}")
    one = make_cluster(gpu)  # raises UnknownNameError listing the known GPUs
    spec = one.gpu
    if gemm_dtype(strategy.precision) not in spec.peak_flops:
        raise UnsupportedError(f"{gpu} has no {gemm_dtype(strategy.precision)} support (supported: "
                               f"{', '.join(sorted(spec.peak_flops))}); choose another precision")
    prof = default_profile(one) if profile is None else load_profile(profile)
    strategy = run_strategy(strategy)  # the kernels it runs (workload/stacks/composer.py)
    c = StepConfig.from_strategy(strategy.replace(
        dp=1, tp=1, pp=1, cp=1, ep=1, sequence_parallel=False, global_batch=None, stage_layers=None, zero=0,
        fsdp=None, ps_servers=0, schedule="1f1b", virtual_stages=1))
    t = compute_times(model, prof, c, precision=strategy.precision, recompute=strategy.recompute).wall
    return (float(t.layer_f + t.layer_b), float(t.embed_f + t.embed_b), float(t.head_f + t.head_b))


def balance_layers(layer_s, layers: int, fixed_s=None) -> np.ndarray:
    """Integer layers per stage (each >= 1, summing to ``layers``) minimising the slowest stage.

    Stage i takes ``n_i · layer_s[i] + fixed_s[i]`` seconds. Exact dynamic
    programme over (stage, layers placed), O(S·L²); ties go to the split that
    puts more layers on earlier stages.
    """
    layer_s = _flat_numbers("layer_s", layer_s, positive=True)
    n_st = layer_s.size
    fixed = np.zeros(n_st) if fixed_s is None else _flat_numbers("fixed_s", fixed_s, positive=False)
    if fixed.size != n_st:
        raise InvalidInputError(f"'fixed_s' must give one time per stage ({n_st}): got {fixed.size}")
    layers = check_int("layers", layers)
    if layers < n_st:
        raise InvalidInputError(f"'layers' ({layers}) must be at least the number of stages ({n_st})")
    # best[i][k]: smallest max stage time of stages i.. holding k layers; choice[i][k]: layers on stage i
    best = np.full((n_st + 1, layers + 1), np.inf)
    choice = np.zeros((n_st + 1, layers + 1), int)
    best[n_st][0] = 0.0
    for i in range(n_st - 1, -1, -1):
        for k in range(n_st - i, layers + 1):
            n = np.arange(1, k - (n_st - i - 1) + 1)  # leave >= 1 layer for each later stage
            cost = np.maximum(n * layer_s[i] + fixed[i], best[i + 1][k - n])
            j = int(np.argmin(cost[::-1]))  # last minimum: most layers on this stage
            best[i][k], choice[i][k] = cost[::-1][j], n[::-1][j]
    out, k = [], layers
    for i in range(n_st):
        out.append(choice[i][k])
        k -= choice[i][k]
    return np.array(out)


def _even(layers, n_st):
    """Megatron-style even split; a remainder goes one layer each to the first stages."""
    base = np.full(n_st, layers // n_st)
    base[: layers % n_st] += 1
    return base


def balance_pipeline(model, stages, strategy=None, *, profile=None, micro_batches=None) -> pd.DataFrame:
    """Layers per pipeline stage when stage i runs on GPU type ``stages[i]``.

    Each stage's time per micro-batch is its layers' forward + backward time on
    its GPU type (:func:`stage_costs`), plus the embedding on stage 0 and the
    head on the last. Layer counts minimise the slowest stage
    (:func:`balance_layers`); the even split is reported beside it. Step time
    with ``m`` micro-batches (default ``strategy.micro_batches``) by the 1F1B
    formula m·max + (Σ − max) (``parallel.pipeline.schedule_seconds``: (p−1)
    bubble slots at each stage's own speed), without point-to-point transfers.

    One row per split ("balanced", "even") and stage: split, stage, gpu,
    layers, stage_time_s, bottleneck (the slowest stage), step_time_s,
    speedup (even step time over this split's).
    """

    strategy = Strategy(micro_batch=8) if strategy is None else strategy
    if not isinstance(strategy, Strategy):
        raise InvalidInputError(f"'strategy' must be a perfmodel.Strategy: got {type(strategy).__name__}")
    if isinstance(stages, str) or not isinstance(stages, (list, tuple)) or not stages or not all(
            isinstance(g, str) for g in stages):
        raise InvalidInputError(f"'stages' must be a non-empty list of GPU names, one per stage: got {stages!r}")
    model = _transformer(model)
    strategy = strategy.replace(dp=1) if strategy.dp is None else strategy  # one pipeline: dp 1 unless given
    m = check_int("micro_batches", strategy.micro_batches if micro_batches is None else micro_batches)
    types = list(dict.fromkeys(stages))
    profs = _profiles(profile, types)
    costs = {g: stage_costs(model, g, strategy, profs[g]) for g in types}
    per_layer = np.array([costs[g][0] for g in stages])
    fixed = np.zeros(len(stages))
    fixed[0] += costs[stages[0]][1]
    fixed[-1] += costs[stages[-1]][2]
    splits = {"balanced": balance_layers(per_layer, model.layers, fixed),
              "even": _even(model.layers, len(stages))}
    rows, steps = [], {}
    for name, counts in splits.items():
        times = counts * per_layer + fixed
        slow = int(np.argmax(times))
        steps[name] = float(schedule_seconds(times[slow], times.sum(), m))  # 1F1B: m·max + (Σ − max)
        rows += [{"split": name, "stage": i, "gpu": g, "layers": int(n), "stage_time_s": float(t),
                  "bottleneck": i == slow, "step_time_s": float(steps[name])}
                 for i, (g, n, t) in enumerate(zip(stages, counts, times))]
    out = pd.DataFrame(rows)
    out["speedup"] = steps["even"] / out["step_time_s"]
    return out
