"""``predict(model, cluster, strategy)``: one configuration's step time, throughput and memory."""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from functools import cache

import numpy as np

from perfmodel import step as compose
from perfmodel.core.checks import check_positive
from perfmodel.core.errors import InvalidInputError, UnsupportedError
from perfmodel.core.frozen import FrozenDict
from perfmodel.core.memo import ChainMemo, IdentityMemo
from perfmodel.interval import DEFAULT_LEVEL, bounds, check_level, memory_bounds
from perfmodel.parallel.config import StepConfig
from perfmodel.hardware.build import generic_fabric_caveats, part_of_node
from perfmodel.hardware.node import Cluster
from perfmodel.parallel.fabric import cluster_collectives, parameter_server_links
from perfmodel.parallel.paths import priced_paths
from perfmodel.parallel.ps_async import AsyncPS, async_ps, server_count, server_spec
from perfmodel.workload.variables import model_variables
from perfmodel.profiles.origin import profile_origin
from perfmodel.costs.cnn import cnn_caveats
from perfmodel.workload.stack import window_caveats
from perfmodel.workload.stacks.composer import fc_type_caveats, run_strategy
from perfmodel.costs import memory as mem_costs, stack_memory
from perfmodel.profiles.profile import Profile, list_profiles, load_profile
from perfmodel.parallel.strategy import Strategy, check_against, fill_dp
from perfmodel.workload.presets import as_model
from perfmodel.workload.kernels import gemm_dtype
from perfmodel.hardware import as_cluster
from perfmodel.profiles.datasheet import REFERENCE_PROFILE, datasheet_profile

BREAKDOWN_KEYS = ("forward", "backward", "optimizer", "host_overhead", "tp_comm", "dp_comm",
                  "pipeline_bubble", "p2p")
BOTTLENECK_WORDS = {
    "forward": "compute (forward kernels)", "backward": "compute (backward kernels)",
    "optimizer": "optimizer step (memory bandwidth)", "host_overhead": "host: eager kernel-launch overhead",
    "tp_comm": "tensor- and context-parallel communication", "dp_comm": "data-parallel communication",
    "pipeline_bubble": "pipeline bubble", "p2p": "pipeline point-to-point sends",
}


INTERVAL_KIND = "conformal: calibrated on measured steps, by regime (docs/accuracy.md)"


@dataclass(frozen=True)
class Prediction:
    """Predicted step of one configuration. Times in seconds, memory in bytes."""

    model: str
    cluster: str
    strategy: Strategy
    profile: str
    step_time: float
    breakdown: dict
    tokens_per_second: float
    samples_per_second: float
    tflops_per_gpu: float
    mfu: float
    peak_memory: float
    memory: dict
    memory_capacity: float
    fits: bool
    over_capacity: float
    bottleneck: str
    model_flops: float
    interval: tuple = field(default=(np.nan, np.nan))  # step-time bounds holding the step with interval_level
    interval_level: float = DEFAULT_LEVEL
    interval_regime: str = ""  # the calibrated regime the bounds come from (docs/accuracy.md)
    # what the caching allocator holds at the peak (torch.cuda.max_memory_reserved); peak_memory is
    # what tensors hold (max_memory_allocated); the difference is fragmentation
    reserved_memory: float = float("nan")
    # what ``interval`` is, in words the outputs print beside it
    interval_kind: str = INTERVAL_KIND
    profile_origin: str = ""            # measured (fitted to tables) or datasheet-derived, in words
    ps: AsyncPS | None = None           # asynchronous parameter servers: rates, bottleneck, staleness
    # peak-memory bounds (bytes) at interval_level, calibrated on measured memory (docs/accuracy.md)
    memory_interval: tuple = field(default=(np.nan, np.nan))
    memory_interval_regime: str = ""
    caveats: tuple = ()                 # what the prediction priced without a measurement, in words
    # the moment of the step that sets peak_memory, one of costs.memory.PEAK_MOMENTS (docs/memory.md)
    peak_moment: str = ""
    # how much longer the step's kernels run than one device's: the slowest of its GPUs sets a synchronous
    # step's pace (parallel/stragglers.py, docs/distributed.md); 0 on one GPU and for asynchronous workers
    slowest_device_lag: float = 0.0
    # the fraction of each GPU's memory the plan was asked to leave free: ``fits`` and ``over_capacity``
    # are measured against memory_capacity x (1 - memory_headroom)
    memory_headroom: float = 0.0

    @classmethod
    def of(cls, values: dict) -> Prediction:
        """The record of ``values``, one per field: the same as ``Prediction(**values)`` without the
        frozen ``__init__``'s ``object.__setattr__`` per field (a repeated ``predict`` builds one per call)."""
        if values.keys() != _FIELD_NAMES:
            return cls(**values)  # a missing or unknown field: the constructor's own error
        record = object.__new__(cls)
        record.__dict__.update(values)
        return record

    def __repr__(self) -> str:
        mem = f"{self.peak_memory / 2**30:.1f} GiB of {self.memory_capacity / 2**30:.0f} GiB"
        rate = (f"{self.samples_per_second:,.0f} samples/s" if self.tokens_per_second == self.samples_per_second
                else f"{self.tokens_per_second:,.0f} tok/s")
        return (f"Prediction({self.model} on {self.cluster}: step {self.step_time * 1e3:.2f} ms, "
                f"{rate}, {self.tflops_per_gpu:.0f} TFLOP/s/GPU, "
                f"MFU {self.mfu:.1%}, memory {mem}{'' if self.fits else ' (DOES NOT FIT)'})")

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in ("model", "cluster", "profile", "step_time", "tokens_per_second",
                                              "samples_per_second", "tflops_per_gpu", "mfu", "peak_memory",
                                              "memory_capacity", "fits", "over_capacity", "bottleneck",
                                              "model_flops", "reserved_memory")}
        out["interval"] = list(self.interval)
        out["interval_level"], out["interval_regime"] = self.interval_level, self.interval_regime
        out["interval_kind"] = self.interval_kind
        out["profile_origin"] = self.profile_origin
        out["memory_interval"], out["memory_interval_regime"] = list(self.memory_interval), self.memory_interval_regime
        out["caveats"] = list(self.caveats)
        out["peak_moment"] = self.peak_moment
        out["slowest_device_lag"] = self.slowest_device_lag
        out["memory_headroom"] = self.memory_headroom
        out["breakdown"] = dict(self.breakdown)
        out["memory"] = dict(self.memory)
        out["strategy"] = {k: v for k, v in self.strategy.__dict__.items()}
        if self.ps is not None:
            out["ps"] = asdict(self.ps)
        return out


_FIELD_NAMES = {f.name for f in fields(Prediction)}


def default_profile(cluster) -> Profile:
    """The bundled profile of the cluster's GPU (fitted where measured, datasheet-scaled otherwise); a GPU
    described in a TOML of one's own gets the measured reference profile scaled by its datasheet figures,
    named '<gpu> (datasheet)' so the prediction says so."""
    if cluster.gpu.name in list_profiles():
        return _bundled_profile(cluster.gpu.name)
    return _datasheet_profile(cluster.gpu)


@cache
def _bundled_profile(name: str) -> Profile:
    """A bundled profile by name, loaded once (the package's files do not change while it runs)."""
    return load_profile(name)


@cache
def _datasheet_profile(gpu) -> Profile:
    """The reference profile scaled to ``gpu``'s datasheet, once per GPU (sweeps price it many times)."""
    return datasheet_profile(gpu, load_profile(REFERENCE_PROFILE))


_COLLECTIVES = IdentityMemo(256)
_SAME_CLUSTER = ChainMemo(256)  # the same cluster object: no hash of its description
# a Strategy checked against (model, cluster) with dp filled, and its StepConfig, by value: the step's
# memo keys read the StepConfig by identity
_CHECKED = ChainMemo(1024)
# a Prediction's numbers from the step's quantities (by identity) and the strategy fields they read
_NUMBERS = ChainMemo(1024)


def _collectives(cluster, prof: Profile) -> dict:
    """``cluster_collectives`` once per (cluster, profile): one mapping whose identity keys the
    collective memo of perfmodel/costs/comm.py (callers read it, never change it)."""
    return _SAME_CLUSTER((prof, cluster), "collectives", lambda: _equal_cluster_collectives(cluster, prof))


def _equal_cluster_collectives(cluster, prof: Profile) -> dict:
    coll = _COLLECTIVES.get(prof, cluster)  # an equal cluster built again shares the mapping
    if coll is None:
        coll = cluster_collectives(cluster, prof)
        _COLLECTIVES.put(prof, cluster, coll)
    return coll


def profile_for(cluster, profile) -> Profile:
    """``profile`` loaded; a warning when it was measured on another GPU than the cluster's (its kernel
    times are that GPU's: a deliberate what-if, or a mistake)."""
    prof = load_profile(profile)
    if prof.gpu != cluster.gpu.name:
        warnings.warn(f"profile {prof.name!r} describes {prof.gpu}, not this cluster's {cluster.gpu.name}: "
                      "kernel times are that GPU's", UserWarning, stacklevel=3)
    return prof


def check_strategy(model, cluster, s: Strategy) -> None:
    """Raise a clear error when the strategy cannot run this model on this cluster."""
    if hasattr(model, "check_strategy"):  # workloads with their own limits (a traced graph: data parallel only)
        model.check_strategy(s)
    check_against(model, cluster.n_gpus, s)
    if gemm_dtype(s.precision) not in cluster.gpu.peak_flops:
        fp8 = (" (float8 training: framework 'megatron' with Transformer Engine, 'torchtitan' with torchao, "
               "on a GPU with fp8 tensor cores)") if s.precision == "fp8-mixed" else ""
        raise UnsupportedError(f"{cluster.gpu.name} has no {gemm_dtype(s.precision)} support "
                               f"(supported: {', '.join(sorted(cluster.gpu.peak_flops))}); choose another "
                               f"precision{fp8}")


def check_headroom(value) -> float:
    """``memory_headroom`` checked: the fraction of each GPU's memory a plan must leave free, 0 <= h < 1."""
    h = check_positive("memory_headroom", value, allow_zero=True)
    if h >= 1.0:
        raise InvalidInputError(f"'memory_headroom' is the fraction of GPU memory to leave free, 0 <= h < 1 "
                                f"(e.g. 0.1 for 10%): got {value!r}")
    return h


def finish(model, cluster, s_batch, out: dict, precision: str, recompute: str, n_gpus, headroom: float = 0.0):
    """Throughput, FLOP rates, MFU and capacity from ``compose.evaluate``'s arrays; a plan fits when what it
    needs leaves ``headroom`` (a fraction) of the GPU's memory free."""
    step = out["step_time"]
    tokens = s_batch * model.seq
    # kernel FLOPs are per GPU of a tensor (and context) group: × tp × cp for the whole model,
    # × micro-batches per step
    scale = out["tp"] * out.get("cp", 1.0) * s_batch / out["micro_batch"]
    # Narayanan et al. 2021 eq. 3 convention (compose.step_flops): model FLOPs for MFU (PaLM,
    # Chowdhery et al. 2022), executed FLOPs (recomputation included) for TFLOP/s per GPU
    model_flops = out["model_flops_mb"] * scale
    hw_flops = out["hw_flops_mb"] * scale
    peak = _SAME_CLUSTER((cluster,), ("peak", precision), lambda: cluster.gpu.peak(gemm_dtype(precision)))
    capacity = cluster.gpu.mem_bytes
    # caching allocator: what it holds (reserved >= allocated) and what it needs before an OOM, per stack
    reserved = out.get("reserved_memory", stack_memory.reserved_bytes(out["peak_memory"]))
    need = out.get("required_memory", reserved) + mem_costs.CUDA_CONTEXT_BYTES
    budget = capacity * (1.0 - headroom)
    return {
        "tokens_per_second": tokens / step, "samples_per_second": s_batch / step,
        "tflops_per_gpu": hw_flops / step / n_gpus / 1e12, "mfu": model_flops / step / n_gpus / peak,
        "model_flops": model_flops, "fits": need <= budget, "over_capacity": np.maximum(need - budget, 0.0),
        "memory_capacity": capacity, "reserved_memory": reserved,
    }


def predict(model, cluster=None, strategy: Strategy | None = None, *, profile=None,
            level: float = DEFAULT_LEVEL, memory_headroom: float = 0.0) -> Prediction:
    """Predict one training step of ``model`` on ``cluster`` under ``strategy``.

    ``interval`` holds the measured step with probability ``level`` in its calibrated regime
    (docs/accuracy.md). ``fits`` asks the plan to leave ``memory_headroom`` (a fraction, default 0) of
    each GPU's memory free; ``over_capacity`` is measured against that budget.
    """
    level = check_level(level)
    headroom = check_headroom(memory_headroom)

    cluster = as_cluster(cluster)
    model = as_model(model)
    s = strategy or Strategy()
    if not isinstance(s, Strategy):
        raise InvalidInputError(f"'strategy' must be a perfmodel.Strategy: got {type(s).__name__}")
    s, c = _CHECKED((model, cluster), s, lambda: _checked(model, cluster, s))
    prof = _SAME_CLUSTER((cluster,), "profile", lambda: default_profile(cluster)) if profile is None \
        else profile_for(cluster, profile)
    if s.ps_async:
        return async_prediction(model, cluster, s, prof, level, headroom)
    coll = _collectives(cluster, prof)
    run = run_strategy(s)  # the kernels it runs (Composer's amp_fp8 over torch linears: bf16 GEMMs)
    out = compose.step_quantities(model, cluster, prof, coll, c, precision=run.precision, recompute=s.recompute,
                                  optimizer=s.optimizer, placement=s.placement)
    got = _NUMBERS((prof, cluster, model, out),
                   (s.batch, s.micro_batch, run.precision, s.recompute, s.framework, s.attention, level, headroom),
                   lambda: _numbers(model, cluster, prof, run, out, level, headroom))
    return Prediction.of({**got, "strategy": s, "breakdown": dict(got["breakdown"]), "memory": dict(got["memory"]),
                          "caveats": got["caveats"] + fc_type_caveats(s) + generic_fabric_caveats(cluster)
                          + window_caveats(model, s)})


def _checked(model, cluster, s: Strategy) -> tuple:
    """(``s`` with dp filled, the StepConfig of the step it runs), or a clear error when it cannot run here."""
    s = fill_dp(s, cluster.n_gpus)  # dp=None (the default): GPUs / (tp × pp × cp), as the CLI
    check_strategy(model, cluster, s)
    return s, None if s.ps_async else StepConfig.from_strategy(run_strategy(s))


def _numbers(model, cluster, prof: Profile, s: Strategy, quantities, level: float, headroom: float = 0.0) -> FrozenDict:
    """Every field of a Prediction but its strategy, from ``compose.step_quantities``' mapping."""
    n_gpus = cluster.n_gpus
    out = {**quantities, "micro_batch": float(s.micro_batch)}
    derived = finish(model, cluster, s.batch, out, s.precision, s.recompute, n_gpus, headroom)
    breakdown = {k: float(out[k]) for k in BREAKDOWN_KEYS}
    worst = max(breakdown, key=breakdown.get)
    memory = {k: float(v) for k, v in out["memory"].items()}
    step = float(out["step_time"])
    iv = bounds(step, breakdown, profile=prof, cluster=cluster, model=model, framework=s.framework,
                attention=s.attention, precision=s.precision, level=level, paths=priced_paths(s, model, prof.gpu))
    mem = memory_bounds(float(out["peak_memory"]), framework=s.framework, n_gpus=n_gpus, level=level)
    return FrozenDict(
        model=getattr(model, "name", type(model).__name__), cluster=cluster.name, profile=prof.name,
        step_time=step, breakdown=FrozenDict(breakdown), tokens_per_second=float(derived["tokens_per_second"]),
        samples_per_second=float(derived["samples_per_second"]), tflops_per_gpu=float(derived["tflops_per_gpu"]),
        mfu=float(derived["mfu"]), peak_memory=float(out["peak_memory"]), memory=FrozenDict(memory),
        memory_capacity=float(derived["memory_capacity"]), fits=bool(derived["fits"]),
        over_capacity=float(derived["over_capacity"]), bottleneck=BOTTLENECK_WORDS[worst],
        model_flops=float(derived["model_flops"]), interval=(iv.low, iv.high),
        interval_level=level, interval_regime=iv.regime,
        reserved_memory=float(derived["reserved_memory"]), interval_kind=INTERVAL_KIND,
        profile_origin=profile_origin(prof), ps=None, memory_interval=(mem.low, mem.high),
        memory_interval_regime=mem.regime, caveats=cnn_caveats(model, prof, s.precision),
        peak_moment=mem_costs.PEAK_MOMENTS[int(out["peak_moment"])],
        slowest_device_lag=float(out["slowest_device_lag"]), memory_headroom=headroom,
    )


ASYNC_REGIME = "uncalibrated: asynchronous parameter servers (no measured rows; the one-worker step's interval, scaled)"


def async_worker(cluster, s: Strategy) -> tuple:
    """(one GPU of ``cluster``, the strategy of one asynchronous worker): each worker's step runs alone, its
    update on the servers (``s.ps_async``; refused, as predict refuses it, without servers)."""
    server_count(s, cluster)
    one = Cluster(node=part_of_node(cluster.node, 1), nodes=1)
    return one, replace(s, dp=1, ps_servers=0, ps_async=False, ps_placement=None, global_batch=None)


def checked_step(model, cluster, s: Strategy) -> tuple:
    """(``s`` with dp filled, the StepConfig of the step it runs, the cluster it runs on) after the checks
    ``predict`` makes; an asynchronous parameter-server strategy is its one worker's step on one GPU."""
    s, c = _checked(model, cluster, s)
    if s.ps_async:
        cluster, s = async_worker(cluster, s)
        s, c = _checked(model, cluster, s)
    return s, c, cluster


def async_prediction(model, cluster, s: Strategy, prof: Profile, level: float, headroom: float = 0.0) -> Prediction:
    """Asynchronous parameter servers: one worker's step priced alone (one GPU, no data parallelism;
    the update runs on the servers, so no optimizer step), then the cluster of ``s.dp`` such workers
    and the servers (``perfmodel.parallel.ps_async.async_ps``). ``step_time`` is a worker's period
    between its updates; throughput is the cluster's; ``ps`` holds the rest."""
    one, alone = async_worker(cluster, s)
    solo = predict(model, one, alone, profile=prof, level=level, memory_headroom=headroom)
    compute = solo.step_time - solo.breakdown["optimizer"]
    ps = async_ps(compute_s=compute, backward_s=solo.breakdown["backward"], variables=model_variables(model),
                  workers=s.dp, servers=server_count(s, cluster), spec=server_spec(cluster),
                  worker_bw_bytes_per_s=parameter_server_links(cluster)["worker"], placement=s.variable_placement)
    period, scale = ps.worker_period_s, ps.worker_period_s / solo.step_time
    samples = s.dp * s.micro_batch / period
    return replace(solo, cluster=cluster.name, strategy=s, step_time=period,
                   breakdown={**solo.breakdown, "optimizer": 0.0, "dp_comm": period - compute},
                   tokens_per_second=samples * model.seq, samples_per_second=samples,
                   tflops_per_gpu=solo.tflops_per_gpu / scale, mfu=solo.mfu / scale, bottleneck=ps.bottleneck,
                   interval=(solo.interval[0] * scale, solo.interval[1] * scale), interval_regime=ASYNC_REGIME, ps=ps)

