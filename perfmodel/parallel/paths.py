"""The pricing paths a strategy takes beyond its stack's kernels: what its interval needs a validation row to have run.

A stack key (``perfmodel.interval.stack_key``: framework, attention kernel, fp8 or not) names the kernels a step
runs. Some options pick another timing model for a large part of the step on top of them: a pipeline schedule's
bubble and memory (``parallel/pipeline.py``, ``parallel/zero_bubble.py``), parameter servers' rounds, activation
offload's copies over PCIe (``workload/stacks/offload.py``), a tensor-parallel overlap, a context-parallel K/V
exchange (``workload/stacks/context.py``), the order ranks are placed in (``parallel/placement.py``), an fp8 scaling
recipe's casts (``workload/stacks/float8.py``), a MoE step's routed experts grouped or looped
(``workload/stacks/experts.py``) and laid out on a folded expert grid (``Strategy.etp``); and three block forms the model may take, latent attention, a MoE model's
dense blocks priced per average block, and a sliding window shorter than the sequence (on every block or on all but
``global_layers``, per average block: ``workload/model.py``). Each is one entry of :func:`priced_paths`; the calibration table
records the values its validation rows ran (``validated_paths``), and a step taking a value none ran is labelled
uncalibrated (``perfmodel.interval.uncalibrated_reason``), whatever its stack. ``OFF``: the option does not act
on the step (no pipeline, one parallel group, no fp8 ...).
"""

from __future__ import annotations

from perfmodel.hardware import compute_capability
from perfmodel.workload.stacks import stack
from perfmodel.workload.stacks.context import cp_exchange
from perfmodel.workload.stacks.experts import grouped_experts
from perfmodel.workload.stacks.float8 import float8_recipe

OFF = "off"
PATHS = ("schedule", "parameter_servers", "activation_offload", "tp_comm_overlap", "cp_comm", "placement",
         "float8_recipe", "experts_gemm", "expert_grid", "latent_attention", "dense_blocks", "sliding_window")


def schedule_path(pp: int, virtual_stages: int, schedule: str) -> str:
    """The pipeline schedule a step runs: ``OFF`` without a pipeline, 1F1B at one chunk per rank (as search
    prices it) unless it is GPipe."""
    if pp <= 1:
        return OFF
    return schedule if virtual_stages > 1 or schedule == "gpipe" else "1f1b"


def placement_path(placement: str, tp: int, pp: int, dp: int) -> str:
    """The rank order a step is placed in where it matters (two parallel groups or more), else ``OFF``."""
    return placement if (tp > 1) + (pp > 1) + (dp > 1) >= 2 else OFF


def experts_gemm_path(s, model, gpu: str) -> str:
    """How a MoE step runs its routed experts on ``gpu`` (the profile's): "grouped" or "loop"; ``OFF`` for a
    dense model or none given."""
    if model is None or getattr(model, "experts", 1) <= 1:
        return OFF
    return "grouped" if grouped_experts(s.grouped_experts, s.framework, compute_capability(gpu), gpu) else "loop"


def expert_grid_path(s, model) -> str:
    """Where a MoE step's experts split: "folded" over etp ranks other than tp (Megatron-Core's parallel folding,
    ``Strategy.etp``), "tp" otherwise; ``OFF`` for a dense model or none given."""
    if model is None or getattr(model, "experts", 1) <= 1:
        return OFF
    return "folded" if s.etp is not None and s.etp != s.tp else "tp"


def priced_paths(s, model=None, gpu: str = "") -> dict:
    """Each of ``PATHS`` as ``Strategy`` ``s`` takes it (a name per path; ``s.dp`` None counts as 1); ``model`` and
    ``gpu`` (the profile's) decide the experts' path."""
    recipe = OFF
    if s.precision == "fp8-mixed":
        kind = stack(s.framework).float8  # torchao's and Transformer Engine's recipes share names ("tensorwise")
        recipe = f"{kind}:{float8_recipe(kind, s.float8_recipe, s.framework, s.precision, s.fp8_params)}"
    return {"schedule": schedule_path(s.pp, s.virtual_stages, s.schedule),
            "parameter_servers": ("async" if s.ps_async else "sync") if s.ps_servers else OFF,
            "activation_offload": "on" if s.offload_layers else OFF,
            "tp_comm_overlap": s.tp_comm_overlap or OFF,
            "cp_comm": cp_exchange(s.framework, s.cp_comm) if s.cp > 1 else OFF,
            "placement": placement_path(s.placement, s.tp, s.pp, s.dp or 1),
            "float8_recipe": recipe, "experts_gemm": experts_gemm_path(s, model, gpu),
            "expert_grid": expert_grid_path(s, model),
            "latent_attention": "on" if getattr(model, "kv_lora_rank", 0) else OFF,
            "dense_blocks": "on" if getattr(model, "dense_layers", 0) else OFF,
            "sliding_window": "on" if 0 < getattr(model, "window", 0) < getattr(model, "seq", 0) else OFF}
