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
  incoming gradient and its result at once: 3 × tokens × vocab × 4 B;
* communication buffers (``comm_buffer_bytes``): DDP buckets, ZeRO buckets,
  FSDP gathered units.

Allocator fragmentation (``ALLOCATOR_RESERVE``) and the CUDA context are added
when judging whether a configuration fits. docs/memory.md compares the
activation accounting with Korthikanti et al. 2022.

The peak is the largest of the moments ``PEAK_MOMENTS`` names: the end of the forwards in flight,
the loss backward (all activations alive), a recomputed block and the end of backward (all
gradients alive, the optimizer step); ``peak_terms`` says which.
"""

from __future__ import annotations

import numpy as np

from perfmodel.core import algebra
from perfmodel.costs.optimizers import MOMENTS, moment_bytes
from perfmodel.workload.stacks.norms import composite_saved_bytes
from perfmodel.costs.stack_memory import op_sac_layer_bytes
from perfmodel.workload.kernels import is_mixed
from perfmodel.workload.model import Transformer
from perfmodel.workload.stacks import megatron_code, stack
from perfmodel.workload.stacks.checkpointing import checkpointed_share, every_k

DS_MAX_LIVE_PARAMETERS = 1e9  # DeepSpeed ZeRO-3 stage3_max_live_parameters default (elements)
DS_REDUCE_BUCKET = 5e8        # DeepSpeed reduce_bucket_size default (elements)
ALLOCATOR_RESERVE = 0.05       # caching-allocator fragmentation, kept free when judging fit
CUDA_CONTEXT_BYTES = 0.5 * 2**30  # CUDA context + cuBLAS/cuDNN workspaces, outside the allocator


def layer_activation_bytes(model: Transformer, *, tp=1, sp=False, precision="bf16-mixed",
                           recompute="none", framework="pytorch", compiled=False, norm_kernels="fused"):
    """Bytes saved for backward per token by one block (per GPU, tensor-parallel aware).

    pytorch (autocast over fp32 parameters): the residual stream and the norm
    inputs are fp32, and the 16-bit copies of the normed inputs that feed QKV and
    the MLP are saved too; FlashAttention keeps q, k, v, its output and the fp32
    log-sum-exp instead of the s² scores. megatron: the residual stream is 16-bit;
    RoPE multiplies by cos/sin tables that need no gradient, so it saves nothing
    (Megatron-LM ``apply_rotary_pos_emb``, fused or not); the fused bias-SwiGLU saves
    only its input (the fc1 output), so SwiGLU keeps three f-wide tensors; under
    fp8-mixed, Transformer Engine saves the fp8 cast of each GEMM input for the
    weight gradient (``_Linear.forward``: ``saved_inputmat = inputmat`` when fp8), so
    the normed inputs and the fc2 input take one byte, and the projection's fp8
    input is kept beside the attention output that FlashAttention keeps in 16 bits.
    docs/memory.md maps the terms onto Korthikanti et al. 2022, eq. 1.
    """
    if not isinstance(model, Transformer):  # other workloads count their own saved tensors
        return model.activation_bytes_per_token(tp=tp, sp=sp, precision=precision, recompute=recompute)
    if every_k(recompute) is not None:  # every k-th block checkpointed: the average block
        share = checkpointed_share(recompute)
        kw = {"tp": tp, "sp": sp, "precision": precision, "framework": framework, "compiled": compiled,
              "norm_kernels": norm_kernels}
        return share * layer_activation_bytes(model, recompute="full", **kw) \
            + (1.0 - share) * layer_activation_bytes(model, recompute="none", **kw)
    h, f = model.hidden, model.ffn_hidden
    tp = algebra.floats(tp)
    sp_div = algebra.pick(np.asarray(sp, bool), tp, 1.0)       # norms/residuals split by sequence parallelism
    lo = 2.0 if is_mixed(precision) else 4.0
    st = stack(framework)
    stream = lo if st.weights16 else 4.0                     # bytes per element of the residual stream
    if recompute == "full":  # only the block input survives
        return stream * h / sp_div
    if recompute == "selective-op":
        return op_sac_layer_bytes(model, tp=tp, sp=sp, lo=lo)
    megatron = framework == "megatron"
    gemm_in = 1.0 if megatron and precision == "fp8-mixed" else 2.0  # saved GEMM inputs (TE fp8: 1 byte)
    stats = 8.0 if model.norm == "layernorm" else 4.0
    norms = 4 if model.post_norms else 2                      # pre-norms (and Gemma's norms of the branch outputs)
    norm_inputs = norms * (stream * h + stats) / sp_div        # the norms' inputs (+ mean/rstd)
    if norm_kernels == "composite" and model.norm == "rmsnorm" and not compiled:  # stacks/norms.py: its fp32 copy
        norm_inputs = norms * (composite_saved_bytes(stream) * h + stats) / sp_div  # and normalized input
    casts = 2 * gemm_in * h / sp_div if is_mixed(precision) else 0.0  # normed inputs feeding QKV and MLP
    if compiled:  # Inductor's min-cut partitioner recomputes the normed inputs from x and rstd
        casts = 0.0
    rope_saved = model.position == "rotary" and st.rope_saves and not compiled
    attention = _attention_saved_bytes(model, tp, lo, gemm_in, rope_saved)
    mlp_kw = {"tp": tp, "lo": lo, "fc2_in": gemm_in if is_mixed(precision) else lo, "swiglu_saved": st.swiglu_saved,
              "compiled": compiled}
    mlp = _mlp_saved_bytes(model, f, **mlp_kw)
    if model.experts > 1:
        mlp = mlp * model.experts_per_token + lo * h * model.experts_per_token  # expert inputs (permuted)
    if model.shared_ffn:  # the shared expert on every token: its MLP's tensors and its input's 16-bit cast; a gate
        # also casts its input and keeps the shared output for the product's gradient
        mlp = mlp + _mlp_saved_bytes(model, model.shared_ffn, **mlp_kw) + (1 + model.shared_gate) * casts / 2 \
            + lo * h * model.shared_gate
    if model.dense_layers:  # the average block (workload/model.py moe_share)
        mlp = model.moe_share * mlp + (1 - model.moe_share) * _mlp_saved_bytes(model, model.dense_ffn, **mlp_kw)
    return norm_inputs + casts + attention + mlp


def _mlp_saved_bytes(model: Transformer, f, tp, lo: float, fc2_in: float, swiglu_saved: int, compiled: bool):
    """Bytes per token one MLP of width ``f`` saves: the fc1 output(s) and the fc2 input (eager SwiGLU keeps gate,
    up, silu and product, as many as the stack's ``swiglu_saved``; GELU the fc1 output and the activation's);
    compiled SwiGLU keeps gate and up (Inductor recomputes silu(gate)·up)."""
    if compiled and model.activation == "swiglu":
        return 2 * lo * f / tp
    fc1_tensors = swiglu_saved - 1 if model.activation == "swiglu" else 1
    return (lo * fc1_tensors + fc2_in) * f / tp


def _latent_saved_bytes(model: Transformer, heads, lo: float, gemm_in: float, rope_saved: bool):
    """Bytes per token latent attention saves (``workload/kernels.py`` ``latent_attention``): each latent as its
    RMSNorm's input and, normed, as the up projection's input, with an fp32 rstd; the concatenated q and k and
    v that attention keeps; the rotary outputs where the stack's RoPE saves them; the output with its fp32
    log-sum-exp (and under TE fp8 the projection's fp8 input)."""
    dn, dr, dv = model.head_dim, model.rope_head_dim, model.v_dim
    latents = sum(2 * lo * r + 4.0 for r in (model.q_lora_rank, model.kv_lora_rank) if r) + lo * dr
    qkv = lo * heads * (2 * (dn + dr) + dv)
    rope = lo * (heads + 1) * dr if rope_saved else 0.0
    out = lo * heads * dv + 4.0 * heads + (gemm_in * heads * dv if gemm_in < 2.0 else 0.0)
    return latents + qkv + rope + out


def _attention_saved_bytes(model: Transformer, tp, lo: float, gemm_in: float, rope_saved: bool):
    """Bytes per token the attention of one block saves: q, k, v (with ``qk_norm``, also the q/k norms' 16-bit
    inputs and an fp32 rstd per normed row: per head, or one each for q and k), the rotary outputs where the
    stack's RoPE saves them, the attention output (heads · head_dim wide) with FlashAttention's fp32
    log-sum-exp, and under TE fp8 the projection's fp8 input."""
    heads, kv, d = model.heads / tp, model.kv_heads / tp, model.head_dim
    if model.kv_lora_rank:  # latent attention: its latents and their norms, q, k and v of their own widths
        return _latent_saved_bytes(model, heads, lo, gemm_in, rope_saved)
    qkv = lo * (heads + 2 * kv) * d                            # QKV output, kept by attention
    if model.qk_norm != "none":
        qkv = qkv + lo * (heads + kv) * d + 4.0 * ((heads + kv) if model.qk_norm == "head" else 2.0)
    rope = lo * (heads + kv) * d if rope_saved else 0.0
    attn_out = lo * model.attn_width / tp + 4.0 * heads       # output + fp32 log-sum-exp
    if gemm_in < 2.0:
        attn_out = attn_out + gemm_in * model.attn_width / tp  # the projection's own fp8 input
    return qkv + rope + attn_out


def korthikanti_layer_bytes(seq, micro_batch, hidden, heads, *, tp=1, sp=False, recompute="none"):
    """Activation bytes of one Megatron-LM layer, Korthikanti et al. 2022, Table 2 (reference).

    16-bit activations, dropout masks, no FlashAttention (the 5·a·s²·b term is the
    softmax input, its output and its dropout). Kept as the published yardstick that
    ``layer_activation_bytes`` is compared with (docs/memory.md gives the mapping).
    """
    s, b, h, a = (algebra.floats(x) for x in (seq, micro_batch, hidden, heads))
    t = algebra.floats(tp)
    sp = np.asarray(sp, bool)
    sbh = s * b * h
    if recompute == "full":  # only the layer input is kept: 2·s·b·h
        return 2.0 * sbh
    attn_scores = 0.0 if recompute == "selective" else 5.0 * a * s / (h * t)
    replicated = algebra.pick(sp, 10.0 / t, 10.0)  # layer-norm inputs, dropout masks, QKV and fc1 inputs
    return sbh * (replicated + 24.0 / t + attn_scores)


def megatron_grad_bytes(precision="bf16-mixed", grad_reduce_fp32=None) -> float:
    """Bytes per element of Megatron-Core's contiguous gradient buffer (main_grad), which is also
    what its data-parallel reduction moves.

    ``DistributedDataParallelConfig.grad_reduce_in_fp32`` (core_r0.9.0
    distributed/param_and_grad_buffer.py: ``grad_dtype = torch.float if grad_reduce_in_fp32 else
    param_dtype``): Megatron-LM forces it for bf16 (arguments.py: "bfloat16 requires gradient
    accumulation and all-reduce to be done in fp32"), so None means fp32 under bf16 and fp8 and
    16-bit under fp16; NeMo's performance recipes turn it off (``grad_reduce_fp32=False``).
    """
    fp32 = precision != "fp16-mixed" if grad_reduce_fp32 is None else bool(grad_reduce_fp32)
    return 4.0 if fp32 else 2.0


def fp8_weight_bytes(precision="bf16-mixed", framework="pytorch") -> float:
    """Bytes per GEMM weight of the fp8 copies Transformer Engine keeps between steps.

    Under fp8 each TE linear quantizes its weight into a cached workspace, row-wise for the
    forward GEMM and column-wise (the transpose) for the input-gradient GEMM: 1 + 1 byte
    (TransformerEngine v2.1 pytorch/module/linear.py ``get_weight_workspace(cache_name="weight")``,
    ``set_usage(rowwise=True, columnwise=is_grad_enabled)``). Megatron-Core passes
    ``is_first_microbatch`` (core_r0.10.0 extensions/transformer_engine.py ``TELinear.forward``), so
    the cache is kept, not rebuilt per micro-batch. The LM head is Megatron's own linear: bf16.
    """
    return 2.0 if megatron_code(framework) and precision == "fp8-mixed" else 0.0


# How a Megatron-code stack's optimizer keeps its states (``Strategy.optimizer_states``): bytes per
# parameter of the main (master) copy and of each moment (AdamW two, SGD one)
OPTIMIZER_STATES = {
    # Megatron-Core DistributedOptimizer (core_r0.9.0 optimizer/distrib_optimizer.py: fp32 main params and
    # fp32 moments); Apex DistributedFusedAdam with store_params and dtype fp32
    "fp32": (4.0, 4.0),
    # Apex DistributedFusedAdam store_param_remainders (apex contrib/optimizers/distributed_fused_adam.py
    # @5159545: an int16 shard that rebuilds the fp32 main params from the bf16 ones, fp32 moments), which
    # NeMo sets for a bf16 model with fp32 optimizer states (NeMo v2.0.0 megatron_base_model.py
    # setup_optimization: store_param_remainders=True)
    "remainders": (2.0, 4.0),
    # the same optimizer with ``optim.dtype: bf16``: bf16 moments, no main copy (store_params=False when the
    # optimizer dtype is the model's); with fp8 parameters NeMo stores the main params too (bf16)
    "bf16": (0.0, 2.0),
}


def optimizer_state_bytes(optimizer="adamw", states=None, fp8_params=False) -> float:
    """Bytes per parameter of a Megatron-code optimizer's states (``OPTIMIZER_STATES``; None: "fp32").

    With fp8 parameters NeMo keeps a main copy in the optimizer's dtype (``store_params=True``), so the
    bf16 layout holds 2 bytes more; "remainders" is then not what runs (``Strategy`` refuses it)."""
    main, moment = OPTIMIZER_STATES["fp32" if states is None else states]
    if states == "bf16" and fp8_params:
        main = 2.0
    return main + moment * MOMENTS[optimizer]


def model_state_bytes(precision="bf16-mixed", optimizer="adamw", framework="pytorch",
                      grad_reduce_fp32=None, optimizer_states=None, fp8_params=False) -> dict[str, float]:
    """Bytes per parameter of weights, 16-bit weight copies, optimizer states and gradients.

    pytorch (autocast over fp32 parameters): 4 + 2 (per GEMM weight, cached by
    autocast) + 8 (AdamW moments) + 4 (fp32 .grad). megatron (Micikevicius et al.
    2018; Rajbhandari et al. 2020, §3.1 "K = 12"): 16-bit weights 2, optimizer
    fp32 master copy + moments 12 (``optimizer_state_bytes``: fewer under ``optimizer_states``),
    gradients ``megatron_grad_bytes`` (4: fp32 main_grad, 2: 16-bit).
    """
    opt = moment_bytes(optimizer)
    if megatron_code(framework) and is_mixed(precision):
        return {"weights": 2.0, "weight_copies": 0.0,
                "optimizer": optimizer_state_bytes(optimizer, optimizer_states, fp8_params),
                "gradients": megatron_grad_bytes(precision, grad_reduce_fp32)}
    return {"weights": 4.0, "weight_copies": 2.0 if is_mixed(precision) else 0.0, "optimizer": opt, "gradients": 4.0}


def fp8_param_bytes(precision="bf16-mixed", framework="pytorch", fp8_params=False) -> float:
    """16-bit bytes per GEMM weight a Megatron-code stack does not hold when its GEMM weights are fp8
    parameters (``Strategy.fp8_params``: Transformer Engine ``fp8_model_init``, as NeMo's ``fp8_params`` and
    Megatron-Core's ``--fp8-param-gather`` build the model; transformer_engine/pytorch/fp8.py): the fp8 value
    and its cached transpose are ``fp8_weight_bytes``, with no bf16 weight beside them."""
    return 2.0 if fp8_params and megatron_code(framework) and precision == "fp8-mixed" else 0.0


def static_bytes(params, gemm_params, *, precision="bf16-mixed", optimizer="adamw", zero=0, dp=1,
                 framework="pytorch", grad_reduce_fp32=None, optimizer_states=None, fp8_params=False):
    """Weights, autocast weight copies, optimizer states and gradients (bytes, per GPU).

    ``dp`` is the number of ranks sharding (the data-parallel size, or the node's
    share of it under FSDP hybrid sharding). Rajbhandari et al. 2020, §5: ZeRO-1
    shards optimizer states, ZeRO-2 also gradients, ZeRO-3 also parameters, so
    model states take (2 + 2 + 12)Ψ/N_d = 16Ψ/N_d under ZeRO-3 (fp16, megatron) and
    (4 + 4 + 8)Ψ/N_d under autocast. Under ZeRO-3 the 16-bit copies exist only for
    gathered units (``comm_buffer_bytes``).
    """
    dp = algebra.floats(dp)
    zero = np.asarray(zero)
    per = model_state_bytes(precision, optimizer, framework, grad_reduce_fp32, optimizer_states, fp8_params)
    weights = per["weights"] * params / algebra.pick(zero >= 3, dp, 1.0)
    copies = algebra.pick(zero >= 3, 0.0, per["weight_copies"] * gemm_params)
    optimizer_states = per["optimizer"] * params / algebra.pick(zero >= 1, dp, 1.0)
    grads = per["gradients"] * params / algebra.pick(zero >= 2, dp, 1.0)
    return {"weights": weights, "weight_copies": copies, "optimizer": optimizer_states, "gradients": grads}


def comm_buffer_bytes(params, unit_params, *, zero=0, dp=1, ps=0, bucket=25e6, lo=2.0, prefetch=2,
                      grad_bytes=4.0, framework="pytorch", fsdp=False):
    """Communication buffers per GPU (bytes).

    * DDP: flat bucket buffers holding a second copy of every gradient (PyTorch DDP
      with ``gradient_as_bucket_view=False``, the default; Li et al. 2020, §3.2);
      Megatron-LM reduces its contiguous main_grad buffer in place: none;
    * ZeRO-1/2: one bucket of gradients being reduce-scattered (DeepSpeed
      ``reduce_bucket_size``); Megatron-style sharded gradients (``zero=2`` under a Megatron stack,
      Llama 3's FSDP: fp32 gradients reduce-scattered per micro-batch, Llama Team 2024 §3.3.2) hold
      at least one block's unsharded fp32 gradient until its reduce-scatter, which runs beside the
      next chunks: ``grad_bytes`` × ``unit_params`` if larger than the bucket;
    * PyTorch FSDP: ``prefetch`` gathered units in 16 bits plus the unsharded
      gradient of the unit being reduce-scattered (Zhao et al. 2023, §3.3,
      limit_all_gathers);
    * DeepSpeed ZeRO-3: gathered parameters up to stage3_max_live_parameters and
      one reduce bucket (DeepSpeed config defaults 1e9 and 5e8 elements);
    * one rank, or a parameter server: none.
    """
    zero = np.asarray(zero)
    grads = grad_bytes * algebra.floats(params)
    ddp = grads if framework == "pytorch" else 0.0 * grads
    zero12 = np.minimum(algebra.floats(bucket), grads)
    if megatron_code(framework):  # a block's unsharded gradient awaiting its per-micro-batch reduce-scatter
        zero12 = algebra.pick(zero == 2, np.maximum(zero12, grad_bytes * algebra.floats(unit_params)), zero12)
    unit = algebra.floats(unit_params)
    deepspeed = lo * (np.minimum(prefetch * unit, DS_MAX_LIVE_PARAMETERS) + np.minimum(unit, DS_REDUCE_BUCKET))
    zero3 = algebra.pick(np.asarray(fsdp, bool), (prefetch + 1) * lo * unit, deepspeed)
    out = algebra.pick(zero >= 3, zero3, algebra.pick(zero >= 1, zero12, ddp))
    return algebra.pick((np.asarray(dp) > 1) & (np.asarray(ps) == 0), out, 0.0)


# The moments of a step whose live bytes compete for the peak, in the order ``peak_terms`` ranks ties.
PEAK_MOMENTS = (
    "forward_end",     # the last forward in flight: the end of a pipeline stage's warm-up, the loss forward
    "loss_backward",   # the cross-entropy backward: every activation and the loss's backward working set
    "optimizer_step",  # the end of backward: every gradient, which the optimizer step reads
    "recompute",       # a checkpointed block rebuilt during backward (last: with nothing rebuilt it ties another)
)


def peak_terms(terms: dict, activations, loss, grads_during_forward, *, cache=None, loss_forward=None,
               transient=0.0) -> tuple[np.ndarray, dict, np.ndarray]:
    """Peak over the step, the terms alive at it (they sum to the peak) and its moment (an index of
    ``PEAK_MOMENTS``; where two moments hold as many bytes, the earlier in that order).

    ``terms["weight_copies"]`` are the 16-bit copies alive at the loss backward (those autograd
    saved); ``cache`` those alive during the forward (autocast caches every cast weight until its
    context exits; default: the same). ``loss`` is the cross-entropy backward's working set,
    ``loss_forward`` its forward's (bf16 logits, their fp32 cast and the log-softmax output: 10 B
    per logit against backward's 12). ``transient`` is what a recomputed layer adds during
    backward (its activations and casts).
    """
    zero = np.zeros(np.broadcast(activations, loss, terms["weights"]).shape)
    grads = terms["gradients"] + zero
    acts = activations + zero
    grads_fwd = algebra.pick(grads_during_forward, grads, 0.0)
    cache = terms["weight_copies"] if cache is None else cache
    loss_forward = loss if loss_forward is None else loss_forward
    acts_win = acts >= grads
    moments = [  # in the order of PEAK_MOMENTS
        {"weight_copies": cache, "activations": acts, "loss": loss_forward, "gradients": grads_fwd},
        {"weight_copies": terms["weight_copies"], "activations": acts, "loss": loss, "gradients": grads_fwd},
        {"gradients": grads},
        {"activations": algebra.pick(acts_win, acts, 0.0), "gradients": algebra.pick(acts_win, 0.0, grads),
         "recompute": transient},
    ]
    keys = ("weight_copies", "activations", "loss", "gradients", "recompute")
    moments = [{k: m.get(k, 0.0) + zero for k in keys} for m in moments]
    totals = [sum(m.values()) for m in moments]
    base = {k: terms[k] + zero for k in ("weights", "fp8_weights", "optimizer") if k in terms}
    base["comm_buffers"] = terms.get("comm_buffers", 0.0) + zero
    if zero.ndim == 0 and not any(np.isnan(totals)):  # one configuration: argmax's first largest, on numbers
        pick = np.intp(max(range(len(totals)), key=totals.__getitem__))
        alive = {**base, **{k: moments[pick][k] for k in keys}}
        return sum(alive.values()), alive, pick
    pick = np.argmax(np.stack(totals), axis=0)
    alive = {**base, **{k: np.choose(pick, [m[k] for m in moments]) for k in keys}}
    return sum(alive.values()), alive, pick


def peak_bytes(terms: dict, activations, loss, grads_during_forward, **kw) -> np.ndarray:
    """Peak bytes over the step (see ``peak_terms``)."""
    return peak_terms(terms, activations, loss, grads_during_forward, **kw)[0]
