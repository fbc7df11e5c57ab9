"""What one job asks of a shared device per step, by kernel class, from its own Prediction.

A step's device time splits into ``compute`` (GEMM and attention kernels: bound by SMs / cores),
``memory`` (elementwise, norms, losses, casts, optimizer: bound by bandwidth) and ``launch``
(the host issuing kernels while the device idles: ``breakdown["host_overhead"]``). The split of
forward + backward between compute and memory is the share of kernel time per class in the
job's own kernel list (``perfmodel.costs.compute.time_by_class``). Communication, pipeline
bubbles and other waits are ``free``: they need no share of the device.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.workload.stacks.composer import run_strategy
from perfmodel.costs import memory as mem, stack_memory
from perfmodel.costs.compute import time_by_class
from perfmodel.core.errors import InvalidInputError, PerfModelError
from perfmodel.hardware import tensor_core_dtypes
from perfmodel.hardware.common import FrozenMap
from perfmodel.predict import Prediction, default_profile, predict, profile_for
from perfmodel.parallel.strategy import Strategy
from perfmodel.workload import kernels as steps
from perfmodel.workload.presets import as_model
from perfmodel.workload.stack import adapt_kernels

COMPUTE_CLASSES = ("gemm", "sdpa", "conv2d", "conv")  # bound by the SMs (cores on a CPU) rather than bandwidth


@dataclass(frozen=True)
class JobLoad:
    """One job's step on a device: seconds per class, seconds that need no device, memory held."""

    name: str
    prediction: Prediction
    model: object
    seconds: FrozenMap          # class -> device seconds per step (compute, memory, launch)
    free_s: float               # seconds per step the job waits on something else (network, bubble)
    memory_bytes: float         # what the job's process holds: peak + allocator reserve + CUDA context
    class_source: str           # "kernel list" or "breakdown only" (no model to list kernels of)

    @property
    def step_s(self) -> float:
        return self.prediction.step_time


def as_job(item, cluster):
    """(model, Strategy, label) of a job given as a Prediction, a model, ``(model, strategy)`` or
    ``(model, strategy, label)``; the model is None for a Prediction of an unnamed workload."""
    if isinstance(item, Prediction):
        try:
            model = as_model(item.model)
        except PerfModelError:
            model = None
        return model, item.strategy, item.model, item
    if isinstance(item, tuple):
        if not 1 <= len(item) <= 3:
            raise InvalidInputError(f"a job must be (model, strategy) or (model, strategy, label): got {len(item)} items")
        model = as_model(item[0])
        s = item[1] if len(item) > 1 and item[1] is not None else Strategy(dp=cluster.n_gpus)
        label = item[2] if len(item) > 2 else getattr(model, "name", type(model).__name__)
    else:
        model, s = as_model(item), Strategy(dp=cluster.n_gpus)
        label = getattr(model, "name", type(model).__name__)
    if not isinstance(s, Strategy):
        raise InvalidInputError(f"a job's strategy must be a perfmodel.Strategy: got {type(s).__name__}")
    return model, s, str(label), None


def compute_share(model, s: Strategy, profile) -> float:
    """Fraction of one micro-batch's kernel time (forward + backward) in compute-bound classes."""
    s = run_strategy(s)  # the kernels it runs (workload/stacks/composer.py)
    fwd, bwd = steps.step_kernels(model, s.micro_batch, tp=s.tp, sp=s.sequence_parallel, precision=s.precision,
                                  recompute=s.recompute)
    kernels = adapt_kernels(fwd + bwd, precision=s.precision, framework=s.framework, attention=s.attention,
                            tensor_cores=tensor_core_dtypes(profile.gpu), memory_format=s.memory_format,
                            float8_recipe=s.float8_recipe or "", fp8_params=s.fp8_params)
    by_class = {k: float(np.sum(v)) for k, v in time_by_class(profile, kernels).items()}
    total = sum(by_class.values())
    if total <= 0:
        return 1.0
    return sum(v for k, v in by_class.items() if k in COMPUTE_CLASSES) / total


def job_load(item, cluster, profile=None, *, launch_on_device: bool = False) -> JobLoad:
    """The per-class load of one job on ``cluster`` (priced alone, with ``profile`` or the GPU's own)."""
    model, s, label, given = as_job(item, cluster)
    p = given if given is not None else predict(model, cluster, s, profile=profile)
    prof = default_profile(cluster) if profile is None else profile_for(cluster, profile)
    b = p.breakdown
    kernels = b["forward"] + b["backward"]
    share, source = (compute_share(model, s, prof), "kernel list") if model is not None else (1.0, "breakdown only")
    seconds = {"compute": kernels * share, "memory": kernels * (1 - share) + b["optimizer"],
               "launch": b["host_overhead"]}
    device = seconds["compute"] + seconds["memory"] + (seconds["launch"] if launch_on_device else 0.0)
    need = float(stack_memory.required_bytes(p.peak_memory, p.strategy.framework)) + mem.CUDA_CONTEXT_BYTES
    return JobLoad(label, p, model, FrozenMap(seconds), max(p.step_time - device, 0.0), float(need), source)
