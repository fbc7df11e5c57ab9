"""Per-GPU memory terms that depend on the software stack: FSDP1/FSDP2 buffers, per-op checkpointing,
torch.compile's saved tensors, the fused loss and the caching allocator's reserve.

docs/stacks.md gives the source of each term in the frameworks' code.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.workload.stacks import gradient_reduce_bytes, stack
from perfmodel.workload.stacks.float8 import fp8_gathered
from perfmodel.costs.optimizers import moment_bytes
from perfmodel.core.errors import UnsupportedError

PARAM_BYTES = 2.0   # MixedPrecisionPolicy / MixedPrecision param_dtype=bf16: unsharded parameters
GRAD_BYTES = 2.0    # the unsharded gradient autograd writes, in param_dtype
ALLOCATOR_RESERVE = 0.05  # caching-allocator fragmentation: reserved / allocated - 1 (docs/memory.md)


def fsdp_model_states(params, shard_ranks, *, optimizer="adamw") -> dict:
    """Sharded fp32 parameters, fp32 gradients and optimizer states under FSDP mixed precision (bytes).

    FSDP2 (``_fsdp_param.py``: the sharded DTensor keeps the original fp32 dtype, the
    all-gather output is cast to ``param_dtype``) and FSDP1 (``flat_param._local_shard`` fp32,
    ``_mp_shard`` only during the all-gather): 4 B of weights, 4 B of gradient (the
    reduce-scattered shard, cast back to fp32) and the optimizer's 8 (AdamW, RMSprop with momentum) or 4 (SGD) bytes
    per parameter, all divided over the ranks sharding them. No cached 16-bit copies: the
    unsharded bf16 parameters are communication buffers (``fsdp_buffers``).
    """
    n = np.asarray(shard_ranks, float)
    opt = moment_bytes(optimizer)
    return {"weights": 4.0 * params / n, "weight_copies": 0.0 * params, "optimizer": opt * params / n,
            "gradients": 4.0 * params / n}


def fsdp_buffers(unit, kept_unsharded, *, reduce_bytes=4.0, prefetch=2, fp8_unit=0.0):
    """Unsharded parameters and gradients in flight (bytes), the larger of two moments.

    * around the loss: the modules kept unsharded after forward (``kept_unsharded`` parameters:
      torchtitan's ``fully_shard([norm, output], reshard_after_forward=False)``; FSDP1's root
      FlatParameter, which ``_post_forward_reshard`` never frees) plus ``prefetch`` blocks'
      16-bit parameters (the block computing and the one prefetched: FSDP2's implicit prefetch
      on its all-gather stream, FSDP1's ``limit_all_gathers`` rate limiter);
    * a block's backward: its parameters and the prefetched block's (16-bit), its unsharded
      16-bit gradient and the reduce-scatter input in ``reduce_dtype`` (FSDP2
      ``_fsdp_collectives.foreach_reduce``: ``reduce_scatter_input`` of the unsharded size).

    ``fp8_unit``: a block's parameters gathered in fp8 (torchao's float8 all-gather), one byte less each.
    """
    unit = np.asarray(unit, float)
    fp8 = prefetch * (PARAM_BYTES - 1.0) * np.asarray(fp8_unit, float)
    around_loss = PARAM_BYTES * (np.asarray(kept_unsharded, float) + prefetch * unit) - fp8
    block_backward = (PARAM_BYTES * prefetch + GRAD_BYTES + reduce_bytes) * unit - fp8
    return np.maximum(around_loss, block_backward)


def op_sac_layer_bytes(model, *, tp=1, sp=False, lo=2.0):
    """Bytes per token a block saves under torchtitan's per-op policy (``recompute="selective-op"``).

    The block input (the checkpoint's argument), the odd-numbered ``mm`` outputs of a Llama block
    (wq, wv, w1, w2: ``checkpointing._mm_sequence``), SDPA's output and fp32 log-sum-exp, and
    under sequence parallelism the reduce-scattered block output (``reduce_scatter_tensor``).
    """
    h, f, d = model.hidden, model.ffn_hidden, model.head_dim
    tp = np.asarray(tp, float)
    sp_div = np.where(np.asarray(sp, bool), tp, 1.0)
    heads, kv = model.heads / tp, model.kv_heads / tp
    block_in = lo * h / sp_div
    wq, wv = lo * heads * d, lo * kv * d
    w1 = lo * f / tp                              # the gate projection (w3 is recomputed)
    w2 = lo * h + np.where(np.asarray(sp, bool), lo * h / tp, 0.0)
    sdpa = lo * heads * d + 4.0 * heads
    if model.activation != "swiglu":              # one fc1 (saved, 1st mm of the MLP), fc2 recomputed
        w1, w2 = lo * f / tp, 0.0
    return block_in + wq + wv + w1 + w2 + sdpa


def loss_bytes_per_logit(loss: str = "eager", lo: float = 2.0, megatron: bool = False) -> tuple[float, float]:
    """(backward, forward) bytes per logit alive in the cross-entropy.

    Megatron-LM (``megatron=True``, its eager loss): ``vocab_parallel_cross_entropy`` (core_r0.9.0
    tensor_parallel/cross_entropy.py) casts the 16-bit logits to fp32 once, subtracts the max,
    exponentiates and normalises in place and saves that fp32 softmax; backward turns it into the
    gradient in place, which autograd casts back to the logits' dtype: 4 + lo bytes both ways.

    Eager: ``F.cross_entropy(logits.float())`` holds the fp32 log-softmax output, its gradient
    and the result in backward (12 B), the 16-bit logits, their fp32 cast and the log-softmax
    output in forward (10 B). Compiled (torchtitan compiles the loss, ``compile.components``
    holds "loss"): Inductor fuses the cast, log-softmax and NLL into reductions over the 16-bit
    logits, which it saves, and writes the 16-bit gradient directly: 2 + 2 B backward, 2 B forward.
    Chunked (``loss="chunked"``, see ``chunked_loss_bytes``): no logits tensor of the whole batch.
    """
    if loss == "chunked":
        return 0.0, 0.0
    if megatron and loss == "eager":
        return 4.0 + lo, 4.0 + lo
    if loss in ("compiled", "fused"):  # flash-attn's kernel (loss="fused") saves and writes the same
        return 2.0 * lo, lo
    return 12.0, 10.0 if lo == 2.0 else 8.0


def loss_hole_bytes_per_logit(loss: str = "eager", lo: float = 2.0, megatron: bool = False) -> float:
    """Bytes per logit the caching allocator holds free but reserved at the eager loss's backward.

    ``F.cross_entropy(logits.float())`` frees the 16-bit logits (lo B) once cast (torchtitan v0.2.2
    train.py ``del pred``; autograd keeps only the log-softmax output); in backward ``nll_loss_backward``
    (``zeros_like``) and ``log_softmax_backward`` each request a new fp32 block (4 B per logit). The
    allocator serves a request from the smallest cached block that fits (c10/cuda/CUDACachingAllocator.cpp
    ``get_free_block``: ``pool.blocks.lower_bound``), so the first takes the freed fp32 cast and the second
    maps new memory: the lo-byte block no request fits stays in ``max_memory_reserved``. It is a whole
    free block the allocator releases before it reports an OOM, so the required bytes do not include it.
    Megatron's loss works in place (no new block) and the compiled and fused losses keep no fp32 copy: 0.
    """
    return lo if loss == "eager" and not megatron and lo < 4.0 else 0.0


@dataclass(frozen=True)
class Allocator:
    """How a stack runs PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp, torch 2.4+).

    ``expandable``: launched with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``; before it
    reports an OOM the allocator frees cached memory and retries (``release_cached_blocks``), and an
    expandable segment unmaps the pages of its free blocks, so only the allocated bytes must fit;
    fixed segments can give back whole free segments only, not the free blocks split off inside
    segments that still hold tensors. ``held_units``: 16-bit gathered blocks a ``record_stream``
    keeps from reuse after they are freed.
    """

    expandable: bool
    held_units: float
    source: str


ALLOCATORS = {
    "pytorch": Allocator(False, 0.0, "torch defaults: fixed segments"),
    "megatron": Allocator(False, 0.0, "Megatron-LM core_v0.12.0 pretrain_gpt.py launch: fixed segments; gradients "
                          "reduced in place in the contiguous buffer; deallocate_pipeline_outputs=True"),
    "deepspeed": Allocator(False, 0.0, "DeepSpeed 0.16.4 launcher: fixed segments"),
    # torchtitan run_train.sh: PYTORCH_(CUDA_)ALLOC_CONF="expandable_segments:True"; FSDP2
    # (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py) frees with events, no record_stream
    "torchtitan": Allocator(True, 0.0, "pytorch/torchtitan run_train.sh; FSDP2 avoids record_stream"),
    "kempnerforge": Allocator(False, 0.0, "KempnerForge scripts/train.py launch (no allocator setting): fixed "
                              "segments; FSDP2 avoids record_stream"),
    # FSDP1 FlatParamHandle._free_unsharded_flat_param: _no_dispatch_record_stream(unsharded, current
    # stream): the block, allocated on the unshard stream, returns to that stream's pool only once the
    # compute stream has passed the free; the limiter (limit_all_gathers, PR #83917) bounds it to one unit
    "fsdp1": Allocator(False, 1.0, "torch 2.13 torch/distributed/fsdp/_flat_param.py _free_unsharded_flat_param"),
    "composer": Allocator(False, 1.0, "Composer's FSDP1 (no allocator setting in llm-foundry's launch): as fsdp1"),
    "tensorflow": Allocator(False, 0.0, "TensorFlow BFC allocator, priced as fixed segments"),
}


def check_expandable(framework: str) -> None:
    """Raise unless ``framework`` runs PyTorch's caching allocator (``Strategy.expandable_segments`` sets it)."""
    if stack(framework).sharding == "ps":
        takes = ", ".join(name for name in ALLOCATORS if stack(name).sharding != "ps")
        raise UnsupportedError(f"'expandable_segments' sets PyTorch's caching allocator: framework={framework!r} runs "
                               f"TensorFlow's BFC allocator; stacks that take it: {takes}")


def held_bytes(framework: str, unit):
    """Bytes a stack's ``record_stream`` keeps out of reuse: ``held_units`` 16-bit copies of one
    FSDP unit of ``unit`` parameters per GPU (FSDP1: one gathered FlatParameter)."""
    return ALLOCATORS[stack(framework).name].held_units * PARAM_BYTES * np.asarray(unit, float)


def reserved_bytes(allocated, framework: str = "pytorch", held=0.0, free=0.0):
    """What the caching allocator holds for a peak of ``allocated`` bytes (``max_memory_reserved``).

    reserved = allocated · (1 + 0.05) + held + free: split-block fragmentation (assumed 5%, as logged in
    runs with room to spare; expandable segments keep freed pages mapped too), the blocks a
    ``record_stream`` holds (``held_bytes``) and free blocks no request at the peak fits
    (``loss_hole_bytes_per_logit``).
    """
    return np.asarray(allocated, float) * (1.0 + ALLOCATOR_RESERVE) + held + free


def required_bytes(allocated, framework: str = "pytorch", held=0.0, expandable=None):
    """Bytes the allocator needs before it raises an OOM, for a peak of ``allocated`` bytes.

    Expandable segments: allocated + held (free pages are unmapped and the allocation retried);
    fixed segments: ``reserved_bytes`` (free blocks inside live segments cannot be given back).
    ``expandable``: ``Strategy.expandable_segments`` (None: the stack's launch, ``ALLOCATORS``).
    """
    if ALLOCATORS[stack(framework).name].expandable if expandable is None else expandable:
        return np.asarray(allocated, float) + held
    return reserved_bytes(allocated, framework, held)


def allocator_bytes(allocated, c, unit, free=0.0):
    """(reserved, required) bytes for a peak of ``allocated`` under ``StepConfig`` ``c``; ``unit``: one
    block's parameters per GPU, which FSDP1 gathers when data-parallel ranks shard them; ``free``: free
    blocks reserved at the peak that the allocator gives back before an OOM (reserved only)."""
    sharded = (np.asarray(c.dp) > 1) & (np.asarray(c.shard_stage) >= 3)
    held = np.where(sharded, held_bytes(c.framework, unit), 0.0)
    return (reserved_bytes(allocated, c.framework, held, free),
            required_bytes(allocated, c.framework, held, c.expandable_segments))


def stack_model_states(terms: dict, framework: str, params, unit, shard_ranks, c, *, optimizer="adamw",
                       head=0.0, embed=0.0, gemm_unit=0.0) -> dict:
    """The model-state terms of a stage as an FSDP stack keeps them (other stacks: ``terms`` as given).

    ``params``: the stage's parameters per GPU, ``unit``: one block's, ``head`` / ``embed``: the
    LM head's and the embedding's on this stage; ``c``: the ``StepConfig`` priced. torchtitan keeps ``[norm, output]`` unsharded
    after forward; FSDP1 the root FlatParameter (embedding and head, the blocks being wrapped).
    """
    st = stack(framework)
    if st.sharding not in ("fsdp1", "fsdp2"):
        return terms
    sharded = np.asarray(c.shard_stage) >= 3
    fsdp = fsdp_model_states(params, np.where(sharded, shard_ranks, 1.0), optimizer=optimizer)
    kept = head if st.sharding == "fsdp2" else np.add(head, embed)
    if st.sharding == "fsdp2":  # torchtitan with pipeline stages: reshard_after_forward = not pp_enabled,
        # so the stage's blocks stay unsharded from their first forward to their last backward
        kept = np.where(np.asarray(c.pp) > 1, params, kept)
    # fsdp="shard-grad-op" (FSDP1 SHARD_GRAD_OP, FSDP2 reshard_after_forward=False): the same
    kept = np.where(np.asarray(c.reshard, bool), kept, params)
    buffers = fsdp_buffers(unit, kept, reduce_bytes=gradient_reduce_bytes(framework, c.grad_reduce_fp32),
                           fp8_unit=fp8_gathered(c.fp8_params, framework, gemm_unit))
    # one rank: FSDP still casts into unsharded 16-bit parameters, one block at a time
    return {**terms, **fsdp, "comm_buffers": buffers + 0.0 * np.asarray(c.dp, float)}


def chunked_loss_bytes(tokens, hidden, lo=2.0):
    """Bytes a chunked linear + cross-entropy holds (Liger-Kernel ``LigerFusedLinearCrossEntropyFunction``).

    Liger (``liger_kernel/ops/fused_linear_cross_entropy.py``, v0.5) cuts the tokens into
    chunks of about T·h/V rows, so one chunk's logits (bf16, overwritten in place by their fp32
    gradient: 2 + 4 B) hold about T·h elements, and accumulates the input gradient (T·h, 16-bit)
    during forward: (6 + lo) · T · h bytes at most.
    """
    return (6.0 + lo) * np.multiply(tokens, hidden)
