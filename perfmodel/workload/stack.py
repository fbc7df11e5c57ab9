"""The kernel list of a step as other software stacks run it (Megatron-LM, unfused attention).

``perfmodel.workload.kernels`` lists what eager PyTorch under autocast launches;
``adapt_kernels`` rewrites that list for 16-bit-weight frameworks and for
attention without FlashAttention. docs/distributed.md gives the sources.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from perfmodel.core.checks import check_choice
from perfmodel.core.units import DTYPE_BYTES
from perfmodel.workload import kernels as steps
from perfmodel.workload.ops import Kernel, gemm, mem as mem_kernel
from perfmodel.workload.stacks import FRAMEWORKS, stack  # noqa: F401 (FRAMEWORKS re-exported)
from perfmodel.workload.stacks.compile import fuse_memory_bound
from perfmodel.workload.stacks.float8 import torchao_float8
from perfmodel.workload.stacks.layout import nchw_transpose, transposes_conv
from perfmodel.workload.stacks.norms import composite_rmsnorm
# "flash": the profile's attention class as measured (PyTorch SDPA's pick; cuDNN attention on Hopper at
# torch 2.11, also Transformer Engine's fused attention); "flash2": FlashAttention-2 (flash-attn 2.x, or
# SDPA's FLASH_ATTENTION backend), priced by the profile's ``sdpa:fa2.*`` classes where it has them, else
# the profile's own; "flash3": FlashAttention-3 (flash-attn's hopper/ build), ``sdpa:fa3.*``, Hopper only;
# "cudnn": cuDNN's fused attention as published in 2024 (``sdpa:cudnn.*``, else the profile's own);
# "flash1": FlashAttention-1 (flash-attn 1.x, as MPT's attn_impl='flash' ran it before flash-attn 2), ``sdpa:fa1.*``;
# "triton": flash-attn's Triton kernel (flash_attn_triton.py; MPT's attn_impl='triton', llm-foundry before
# v0.7.0: llmfoundry/models/layers/flash_attn_triton.py copies it), ``sdpa:triton.*``; each priced where published
ATTENTIONS = ("flash", "flash2", "flash3", "cudnn", "flash1", "triton", "unfused")
FLASH2_VARIANT = "fa2"
# attention -> the profile's sdpa:<variant>.* classes
KERNEL_VARIANTS = {"flash2": FLASH2_VARIANT, "flash3": "fa3", "cudnn": "cudnn", "flash1": "fa1", "triton": "triton"}
# the kernels MPT's flash_attn_fn calls on unpadded q, k, v (flash-attn 1's flash_attn_unpadded_func, 2's
# flash_attn_varlen_func); its triton_flash_attn_fn takes them padded
UNPADDED_ATTENTIONS = ("flash1", "flash2")
# kernels a context-parallel ring does not call (torch's ring calls SDPA's backends, TE's its own attention)
NO_RING_ATTENTIONS = ("unfused", "flash1", "triton")
_RESIDUAL_STREAM = ("layernorm", "rmsnorm", "residual_add")
# kernels that skip the key blocks outside a sliding window: flash-attn 2 (``flash_attn_func(window_size=...)``,
# since v2.3) and 3; torch SDPA has no window argument (a model passes a mask, and the whole causal square runs)
WINDOWED_ATTENTIONS = ("flash2", "flash3")


def unfused_attention(k: Kernel) -> list[Kernel]:
    """The attention core without FlashAttention, as Megatron-LM ran it before 2023.

    Two batched GEMMs forward (scores Q·Kᵀ, context P·V; one launch each, priced as a
    GEMM whose m stacks the b·heads matrices), the fused scale-mask-softmax
    and dropout (p = 0.1, Megatron-LM default) over b·heads·s² 16-bit scores (2 B read +
    2 B written + a 1 B mask: 1.25x a scale kernel), four GEMMs backward and the
    softmax backward (reads y and dy, writes dx: 1.5x the forward's bytes). FLOPs:
    4·b·heads·s²·d forward, twice that backward (Narayanan et al. 2021, eq. 2 terms).
    """
    s, d = k.size["seq"], k.size["head_dim"]
    rows = np.multiply(np.multiply(k.size["batch"], k.size["heads"]), s)  # b·heads stacked s×· matrices
    scores = rows * s
    dt, ph, n, count = k.dtype, k.phase, k.name, k.count

    def probs(tag, cls, factor):  # the b·heads·s score rows of length s (row-wise forms use them)
        return mem_kernel(f"{n}.{tag}", cls, ph, scores * factor, rows=rows * factor, count=count, variant="fwd",
                          dtype=dt)

    def bmm(tag, n_, k_):
        return gemm(f"{n}.{tag}", ph, rows, n_, k_, count=count, dtype=dt)

    if k.variant == "fwd":
        return [bmm("scores", s, d), probs("softmax", "softmax", 1.0), probs("dropout", "scale", 1.25),
                bmm("context", d, s)]
    return [bmm("dprobs", s, d), bmm("dv", d, s), probs("dropout_bwd", "scale", 1.25),
            probs("softmax_bwd", "softmax", 1.5), bmm("dq", d, s), bmm("dk", d, s)]


def transformer_engine_fp8(k: Kernel, weight_cache: bool = True, recipe: str = "delayed") -> list[Kernel]:
    """A GEMM as Megatron-Core runs it under fp8 with Transformer Engine.

    Each linear layer quantizes the input it multiplies (forward, and the recomputed
    forward) and the output gradient (input-gradient GEMM) with a fused cast +
    transpose: it reads 2 bytes and writes the fp8 tensor and its transpose, 4 bytes
    per element in all, priced as a copy of half as many fp32 elements
    (``transformer_engine/pytorch/module/linear.py``: ``fp8_cast_transpose_fused``).
    The weight-gradient GEMM reuses those transposes. The output layer is Megatron's
    own ``ColumnParallelLinear``, outside Transformer Engine, so the LM head stays bf16.

    ``weight_cache`` False (a stack that calls TE's linears without ``is_first_microbatch``, ``Stack.te_weight_cache``):
    each forward, the recomputed one included, casts the weight again into its fp8 value and transpose
    (TransformerEngine v2.1 ``module/linear.py``: ``update_workspace = is_first_microbatch is None or ...``,
    ``cache_name=None``), the same 4 bytes per element as an activation's cast.

    ``recipe="tensorwise"`` (TE's current scaling) reads each tensor once more for its amax before the cast
    (TransformerEngine v2.5 ``pytorch/csrc/extensions/cast.cpp`` ``quantize_impl``: ``nvte_compute_amax``, then
    the scale, then the quantize kernel): 6 bytes per element where delayed scaling, whose amax comes from
    the history, moves 4.
    """
    if k.name.startswith("lm_head"):
        return [replace(k, dtype="bf16")]
    if k.name.endswith(".wgrad"):
        return [k]
    per = 0.75 if recipe == "tensorwise" else 0.5  # bytes per element as fp32 copies (8 B each)
    operand = np.multiply(k.size["m"], k.size["k"])  # the activation (forward) or dy (dgrad): tokens × K
    tag = ".fp8_grad_cast" if ".dgrad" in k.name else ".fp8_cast"
    cast = mem_kernel(k.name + tag, "copy", k.phase, np.multiply(operand, per), count=k.count, variant="fwd")
    if weight_cache or ".dgrad" in k.name:
        return [cast, k]
    weight = np.multiply(k.size["n"], k.size["k"])
    return [cast, mem_kernel(k.name + ".fp8_w_cast", "copy", k.phase, np.multiply(weight, per), count=k.count,
                             variant="fwd"), k]


def loss_kernel(k: Kernel) -> bool:
    """Whether ``k`` is one of the loss's kernels: the cast of the logits, the cross-entropy, the gradient's cast."""
    return k.cls == "cross_entropy" or k.name in ("logits.float", "logits.grad_cast")


def unpad_copies(k: Kernel) -> list[Kernel]:
    """What llm-foundry's MPT does around each flash-attn 2 call (llm-foundry 8c8dd48
    ``llmfoundry/models/layers/attention.py`` ``flash_attn_fn``, with flash-attn ``bert_padding``; flash-attn 1's
    ``flash_attn_unpadded_func`` the same way, 1ad53be, 2023-06): it gathers
    q, k and v to their unpadded rows (``index_first_axis``: a ``torch.gather``, 2 B read and 2 written per
    element) for ``flash_attn_varlen_func`` and scatters the output back (``pad_input``: ``torch.zeros``, 2 B,
    then an ``index_put``, 2 + 2 B), padding or not. Backward: the output gradient gathered (2 + 2 B), and each
    of q, k, v's gradients scattered into zeros (2 B, then 2 + 2). Priced as copies moving those bytes (an fp32
    copy moves 8 B per element), one per launch."""
    b, s, d = k.size["batch"], k.size["seq"], k.size["head_dim"]
    q = np.multiply(np.multiply(b, s), np.multiply(k.size["heads"], d))
    kv = np.multiply(np.multiply(b, s), np.multiply(k.size["kv_heads"], d))

    def copy(tag, elems, moved):
        return mem_kernel(f"{k.name}.{tag}", "copy", k.phase, np.multiply(elems, moved / 8.0), count=k.count,
                          variant="fwd")

    if k.variant.endswith("fwd"):
        return [copy("unpad_q", q, 4.0), copy("unpad_k", kv, 4.0), copy("unpad_v", kv, 4.0),
                copy("pad_zeros", q, 2.0), copy("pad_out", q, 4.0)]
    return [copy("pad_out.bwd", q, 4.0), *(copy(f"unpad_{x}.bwd_{op}", n, moved) for x, n in (("q", q), ("k", kv), ("v", kv))
                                          for op, moved in (("zeros", 2.0), ("scatter", 4.0)))]


def fused_loss(k: Kernel) -> list[Kernel]:
    """The cross-entropy as one fused kernel over the 16-bit logits (``loss`` "fused" or "compiled").

    flash-attn ``flash_attn/losses/cross_entropy.py`` (llm-foundry's ``fused_crossentropy``) and
    Inductor's fused log-softmax + NLL: forward reads the bf16 logits once (2 B per logit),
    backward reads them and writes the bf16 gradient (4 B); no fp32 copy, no separate casts.
    Priced as copies moving those bytes (an fp32 copy moves 8 B per element).
    """
    if k.name in ("logits.float", "logits.grad_cast"):
        return []
    moved = 2.0 if k.phase == "fwd" else 4.0
    return [mem_kernel(k.name + ".fused", "copy", k.phase, np.multiply(k.size["x"], moved / 8.0), count=k.count,
                       variant="fwd")]


def float8_gemm(k: Kernel, st, recipe: str = "", fp8_params=False) -> list[Kernel]:
    """An fp8 GEMM and its casts as stack ``st``'s float8 linears run it (``recipe`` "": their default)."""
    if st.float8 == "te":
        return transformer_engine_fp8(k, st.te_weight_cache, recipe or "delayed")
    return torchao_float8(k, recipe or "tensorwise", fp8_gather=bool(fp8_params))


def skips_window(attention: str, cp) -> bool:
    """Whether a sliding window shortens the attention: a kernel that skips the blocks outside it
    (``WINDOWED_ATTENTIONS``), not in a context-parallel ring (which runs each step's whole block)."""
    return attention in WINDOWED_ATTENTIONS and cp == 1


def windowed(k: Kernel, attention: str, cp=1) -> Kernel:
    """The attention kernel ``k`` without its ``window`` mark: where the window is skipped (``skips_window``), the
    same block work as causal attention over the window for b·(2s/W − 1) sequences: b·(s·W − W²/2) query-key
    pairs (each of the first W queries attends to those before it, each later one to W); else the full causal
    square (flash-attn ``flash_api.cpp``: the key blocks wholly left of the window are not loaded)."""
    if "window" not in k.size:
        return k
    size = dict(k.size)
    w = size.pop("window")
    if not skips_window(attention, cp):
        return replace(k, size=size)
    s = size["seq"]
    sequences = 2.0 * s / w - 1.0
    size.update(batch=np.multiply(size["batch"], sequences), seq=w)
    return replace(k, size=size, flops=k.flops * sequences * (w / s) ** 2)


def window_caveats(model, s) -> tuple:
    """What a sliding-window model's prediction priced as full causal attention, in words."""
    w, seq = getattr(model, "window", 0), getattr(model, "seq", 0)
    if not w or w >= seq or not getattr(model, "causal", True) or skips_window(s.attention, s.cp):
        return ()
    if s.cp > 1:
        return (f"sliding window {w} of {seq} tokens priced as full causal attention: the context-parallel ring "
                "runs every step's whole block",)
    return (f"sliding window {w} of {seq} tokens priced as full causal attention: attention={s.attention!r} "
            "skips no block outside the window (torch SDPA takes a mask); attention='flash2' or 'flash3' "
            "prices flash-attn's windowed kernel",)


def _attention(k: Kernel, attention: str, unpads: bool, cp=1) -> list[Kernel]:
    """An attention kernel as ``attention`` runs it (``unpads``: with MPT's copies around flash-attn 2; ``cp``: its
    context-parallel size, for a sliding window)."""
    k = windowed(k, attention, cp)
    if attention == "unfused":
        return unfused_attention(k)
    if attention in KERNEL_VARIANTS:
        k = replace(k, variant=f"{KERNEL_VARIANTS[attention]}.{k.variant}")
    return [*unpad_copies(k), k] if unpads else [k]


def adapt_kernels(kernels, *, precision, framework="pytorch", attention="flash", compiled=False, loss="eager",
                  tensor_cores=(), memory_format="channels_last", norm_kernels="fused", float8_recipe="",
                  fp8_params=False, cp=1):
    """The kernel list of a step as another software stack runs it.

    ``framework="megatron"`` (Megatron-LM / Megatron-DeepSpeed mixed precision, Micikevicius et al. 2018): the
    model's weights are 16-bit, so autocast's per-micro-batch weight and input casts disappear, and layer norms
    and residual adds run on 16-bit activations (fused LayerNorm, no fp32 residual stream).
    ``attention="unfused"``: the FlashAttention kernel becomes ``unfused_attention``; ``"flash2"``/``"flash3"``:
    it is priced as FlashAttention-2/-3 (variant ``fa2.fwd``, ...).
    ``precision="fp8-mixed"``: a stack's ``float8`` kernels, ``transformer_engine_fp8`` (Megatron-Core, FSDP1 as
    llm-foundry runs fp8) or ``torchao_float8`` (torchtitan), under ``float8_recipe`` ("": the stack's default) and,
    for torchao, ``fp8_params`` (its float8 all-gather); ``compiled``:
    Inductor's fused groups (``perfmodel.workload.stacks.compile``); ``torchtitan`` and ``fsdp1`` keep 16-bit
    parameters for compute too (FSDP ``param_dtype=bf16``).
    ``tensor_cores``: the dtypes the GPU's tensor cores take. Under ``precision="fp32"`` a stack with
    ``cudnn_tf32`` runs its convolutions as tf32 where they include tf32; ``memory_format="contiguous"``
    (NCHW) gives each dense or grouped convolution pass in one of them cuDNN's transposes (``stacks/layout.py``);
    ``norm_kernels="composite"`` runs an eager step's RMSNorms as their elementwise ops (``stacks/norms.py``);
    ``cp``: the context-parallel size, which decides whether a sliding window is skipped (``windowed``).
    """
    check_choice("framework", framework, FRAMEWORKS)
    check_choice("attention", attention, ATTENTIONS)
    mixed = steps.is_mixed(precision)
    low = steps.activation_dtype(precision)  # the residual stream: 16-bit under fp8 too (only GEMMs run fp8)
    out, st = [], stack(framework)
    weights16 = st.weights16
    float8 = st.float8 if precision == "fp8-mixed" else ""
    unpads = st.unpads_attention and attention in UNPADDED_ATTENTIONS  # MPT's flash-attn path (unpad_copies)
    tf32_convs = precision == "fp32" and st.cudnn_tf32 and "tf32" in tensor_cores
    transposes = tensor_cores if memory_format == "contiguous" else ()
    for k in kernels:
        if tf32_convs and k.cls == "conv" and k.dtype == "fp32":
            k = replace(k, dtype="tf32")
        if weights16 and mixed:
            if k.autocast:
                continue
            if k.cls in _RESIDUAL_STREAM and k.dtype == "fp32":
                k = replace(k, dtype=low)
        if norm_kernels == "composite" and not compiled and k.cls == "rmsnorm":
            out.extend(composite_rmsnorm(k, DTYPE_BYTES[k.dtype]))
            continue
        if loss != "eager" and loss_kernel(k):
            out.extend(fused_loss(k))
            continue
        if k.cls == "sdpa":
            out.extend(_attention(k, attention, unpads, cp))
            continue
        if float8 and k.cls == "gemm" and k.dtype == "fp8":
            out.extend(float8_gemm(k, st, float8_recipe, fp8_params))
            continue
        if transposes and transposes_conv(k, transposes):
            out.append(nchw_transpose(k, DTYPE_BYTES[k.dtype]))
        out.append(k)
    if not compiled:
        return out
    # a stack whose compile may take the loss in (torchtitan's compile.components) leaves it eager when told
    # loss="eager": the compiled region is the blocks (torchtitan 004b3148 train.py: loss_fn outside apply_compile)
    eager_loss = loss == "eager" and stack(framework).compiles_loss
    return fuse_memory_bound(out, keep=loss_kernel if eager_loss else None)
