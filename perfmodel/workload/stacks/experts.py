"""Grouped expert GEMMs: whether a stack runs a MoE layer's routed experts as one grouped GEMM per linear.

torchtitan v0.2.2 ``torchtitan/models/moe/moe.py``: ``MoEArgs.use_grouped_mm = True`` runs
``_run_experts_grouped_mm``, three ``torch._grouped_mm`` calls (w1, w3, w2) over every local expert's tokens at
once, and one SiLU-and-product over all of them; each expert's tokens are padded to a multiple of
``TOKEN_GROUP_ALIGN_SIZE_M = 8`` (``moe/utils.py``; not priced: under 8 rows per expert). Its model args turn it
off below SM90 ("grouped mm, which is only supported on SM90 or later", ``models/deepseek_v3/model/args.py``),
where ``_run_experts_for_loop`` runs one matmul per expert. Megatron-LM core_r0.9: ``--moe-grouped-gemm``
(``megatron/training/arguments.py``, store_true) selects ``GroupedMLP``/``TEGroupedMLP`` in
``gpt_layer_specs.py``; left off, ``SequentialMLP`` runs one MLP per local expert. The other stacks' model code
(Hugging Face's MoE blocks, Megatron-DeepSpeed's MoE) loops over the experts.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from perfmodel.core.checks import check_flag
from perfmodel.core.errors import UnsupportedError

# stack -> (its default, the lowest CUDA compute capability that runs it; None: any)
GROUPED_EXPERTS = {"torchtitan": (True, 9.0), "megatron": (False, None)}
EXPERT_PREFIX = "moe.expert."  # the routed experts' kernels (workload/kernels.py Builder.moe)


def check_grouped_experts(value, framework: str) -> bool | None:
    """``Strategy.grouped_experts``: None (the stack's default) or a bool its stack takes."""
    if value is None:
        return None
    value = check_flag("grouped_experts", value)
    if value and framework not in GROUPED_EXPERTS:
        raise UnsupportedError(f"'grouped_experts'=True does not apply to framework={framework!r}: its model code "
                               f"loops over the experts; stacks that take it: {', '.join(GROUPED_EXPERTS)}")
    return value


def grouped_experts(value: bool | None, framework: str, capability: float | None, gpu: str = "") -> bool:
    """Whether the experts run grouped: ``value`` where given, else the stack's default on this GPU
    (``capability``: its CUDA compute capability, None when unknown: taken to run the default)."""
    default, lowest = GROUPED_EXPERTS.get(framework, (False, None))
    runs = lowest is None or capability is None or capability >= lowest
    if value and not runs:
        raise UnsupportedError(f"'grouped_experts'=True under framework={framework!r} needs compute capability "
                               f"{lowest:.1f} or newer (its torch._grouped_mm path): {gpu or 'this GPU'} is "
                               f"{capability:.1f}, where {framework} runs one matmul per expert "
                               "(grouped_experts=False)")
    return bool(default and runs) if value is None else bool(value)


def group_expert_kernels(kernels: list, local_experts) -> list:
    """The routed experts' kernels as grouped ones: each of the ``local_experts`` per-expert launches becomes one
    launch over all their rows (a GEMM's m, a memory-bound kernel's elements and rows); a weight gradient, whose
    inner dimension is one expert's tokens, stacks the experts' outputs (m x local_experts). FLOPs and bytes are
    unchanged; the launches and the per-launch shapes are what a grouped GEMM changes."""
    g = local_experts
    out = []
    for k in kernels:
        if not k.name.startswith(EXPERT_PREFIX):
            out.append(k)
            continue
        size = dict(k.size)
        if k.cls == "gemm":
            size["m"] = np.multiply(size["m"], g)
        else:
            size["x"] = np.multiply(size["x"], g)
            if "rows" in size:
                size["rows"] = np.multiply(size["rows"], g)
        out.append(replace(k, size=size, count=np.divide(k.count, g), flops=np.multiply(k.flops, g)))
    return out
