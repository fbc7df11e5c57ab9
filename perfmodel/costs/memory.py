"""Peak memory of one GPU during a training step, term by term.

Accounts what ``torch.cuda.max_memory_allocated`` sees for eager PyTorch under
autocast with fp32 master weights (the H200 measurements match it within ~1%):

* weights: fp32 master copy, 4 B/param (÷ data-parallel size under ZeRO-3);
* bf16 weight copies autocast caches for the step, 2 B per GEMM weight;
* optimizer states: AdamW 8 B/param (two fp32 moments), SGD momentum 4 B/param
  (÷ dp from ZeRO-1 on; Rajbhandari et al. 2020, Table 1);
* gradients: fp32, 4 B/param (÷ dp from ZeRO-2 on), present from the middle of
  backward (``zero_grad(set_to_none=True)`` frees them every step), or all
  step long when gradients accumulate over micro-batches;
* activations saved for backward per layer and token (see ``layer_activation_bytes``;
  Korthikanti et al. 2022 derive the same quantities for Megatron layers);
* the loss: cross-entropy backward holds the fp32 log-softmax output, its
  incoming gradient and its result at once: 3 × tokens × vocab × 4 B.

The peak is the larger of the moment loss backward starts (all activations
alive) and the end of backward (all gradients alive).
"""

from __future__ import annotations

import numpy as np

from perfmodel.workload.step import is_mixed
from perfmodel.workload.model import Transformer

ALLOCATOR_RESERVE = 0.05       # caching-allocator fragmentation, kept free when judging fit
CUDA_CONTEXT_BYTES = 0.5 * 2**30  # CUDA context + cuBLAS/cuDNN workspaces, outside the allocator


def layer_activation_bytes(model: Transformer, *, tp=1, sp=False, precision="bf16-mixed",
                           recompute="none"):
    """Bytes saved for backward per token by one block (per GPU, tensor-parallel aware)."""
    if not isinstance(model, Transformer):  # other workloads count their own saved tensors
        return model.activation_bytes_per_token(tp=tp, sp=sp, precision=precision, recompute=recompute)
    h, f = model.hidden, model.ffn_hidden
    tp = np.asarray(tp, float)
    sp_div = np.where(np.asarray(sp, bool), tp, 1.0)       # norms/residuals split by sequence parallelism
    if recompute == "full":  # only the block input survives (fp32 residual stream)
        return 4.0 * h / sp_div
    lo = 2.0 if is_mixed(precision) else 4.0
    stats = 8.0 if model.norm == "layernorm" else 4.0
    norm_inputs = 2 * (4.0 * h + stats) / sp_div               # two fp32 norm inputs (+ mean/rstd)
    casts = 2 * 2.0 * h / sp_div if is_mixed(precision) else 0.0  # bf16 copies feeding QKV and MLP
    heads, kv = model.heads / tp, model.kv_heads / tp
    qkv = lo * (heads + 2 * kv) * model.head_dim               # QKV output, kept by attention
    rope = lo * (heads + kv) * model.head_dim if model.position == "rotary" else 0.0
    attn_out = lo * h / tp + 4.0 * heads                       # output + fp32 log-sum-exp
    mlp_tensors = 4 if model.activation == "swiglu" else 2     # gate, up, silu, product | fc1 out, act out
    mlp = lo * mlp_tensors * f / tp
    if model.experts > 1:
        mlp = mlp * model.experts_per_token + lo * h * model.experts_per_token  # expert inputs (permuted)
    return norm_inputs + casts + qkv + rope + attn_out + mlp


def static_bytes(params, gemm_params, *, precision="bf16-mixed", optimizer="adamw", zero=0, dp=1):
    """Weights, autocast weight copies, optimizer states and gradients (bytes, per GPU)."""
    dp = np.asarray(dp, float)
    zero = np.asarray(zero)
    weights = 4.0 * params / np.where(zero >= 3, dp, 1.0)
    copies = 2.0 * gemm_params / np.where(zero >= 3, dp, 1.0) if is_mixed(precision) else 0.0 * params
    opt_per_param = 8.0 if optimizer == "adamw" else 4.0
    optimizer_states = opt_per_param * params / np.where(zero >= 1, dp, 1.0)
    grads = 4.0 * params / np.where(zero >= 2, dp, 1.0)
    return {"weights": weights, "weight_copies": copies, "optimizer": optimizer_states, "gradients": grads}


def peak_bytes(terms: dict, activations, loss, grads_during_forward) -> np.ndarray:
    """Peak over the step: loss-backward start vs end of backward."""
    base = terms["weights"] + terms["optimizer"]
    at_loss = base + terms["weight_copies"] + activations + loss + np.where(grads_during_forward, terms["gradients"], 0.0)
    at_end = base + terms["gradients"] + terms["weight_copies"] * 0.0
    return np.maximum(at_loss, at_end)
