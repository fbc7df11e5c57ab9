"""Host seconds a training engine adds to each step beside the kernels: the DeepSpeed engine.

DeepSpeed 0.16.4 runs Python for every parameter tensor in every micro-step and once more per
optimizer step: ZeRO-1/2 register a gradient hook per parameter
(``zero/stage_1_and_2.py``: ``reduce_independent_p_g_buckets_and_remove_grads`` copies each
gradient into the reduce bucket, ``reduce_ipg_grads`` reduces it; ZeRO-2 also
``copy_grads_in_partition`` every micro-step), and ``step`` checks for overflow, takes the
gradient norm and updates the flat fp32 partition (``has_overflow``, ``get_grad_norm_direct``,
``unscale_and_clip_grads``); ``engine.py`` wraps forward, backward and step with its timers and
gradient-accumulation bookkeeping. ``calibration/deepspeed_host.py`` measures the difference
against a plain PyTorch loop on tiny GPT-shaped blocks (perfmodel/data/deepspeed-host-2026-12-01,
one process, ``DS_ACCELERATOR=cpu``); ``fit.engine_host.fit_deepspeed_host`` reproduces the
coefficients below (non-negative least squares, extra = a + b · tensors · micro-steps).

Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed f4157be) also stops the host once per micro-batch:
the pipeline engine's ``LoadMicroBatch`` (DeepSpeed 0.16.4 ``runtime/pipe/engine.py``
``_exec_load_micro_batch`` -> ``_next_batch`` -> ``batch_fn``) runs ``pretrain_gpt.get_batch_pipe``, whose
``tensor_parallel.broadcast_data`` copies the batch sizes back with ``sizes_cuda.cpu()``
(``megatron/core/tensor_parallel/data.py``), a device-to-host copy that waits for every queued kernel.
The host therefore starts each micro-batch with an empty queue: the ops it issues before the forward's
first kernel (``batch_ops``) leave the GPU idle, and the engine's hooks after a backward hide only
behind the part of that backward the GPU still has queued when the host has issued it
(``backward_slack_s``), none where the host sets the pace. Within each micro-batch's forward,
``ParallelTransformerLayer.forward`` (``megatron/model/transformer.py``) builds ``moe_loss`` and
``mlp_bias`` with ``torch.tensor(0.0, device=...)`` in every layer, even without experts: a blocking
host-to-device copy, which ATen's ``copy_kernel_cuda`` runs as ``memcpy_and_sync`` (cudaMemcpyAsync then
cudaStreamSynchronize; pytorch/pytorch#120996 shows ``torch.tensor(x, device=cuda)`` synchronising), so
the GPU idles twice per layer while the host builds the tensor and issues the next kernel
(``layer_sync_time``). Under full recomputation ``ParallelTransformer._checkpointed_forward`` runs each
layer's ``forward`` again inside ``tensor_parallel.checkpoint``'s backward (``custom(l, l +
checkpoint_num_layers)``), so those waits come twice per micro-batch; selective recomputation re-runs only
the attention core (``checkpoint_core_attention``), not the layer's ``forward`` (``layer_forwards``).
"""

from __future__ import annotations

import numpy as np

from perfmodel.costs.host import HostCosts
from perfmodel.workload.stacks import stack

# ZeRO stage -> (seconds per optimizer step, seconds per parameter tensor per micro-step)
DEEPSPEED_HOST_S = {0: (0.0, 4.185e-05), 1: (1.091e-02, 1.490e-06), 2: (0.0, 1.810e-04)}

# Ops the host issues per micro-batch between the ``.cpu()`` wait and the forward's first kernel, counted
# in Megatron-DeepSpeed f4157be and DeepSpeed 0.16.4: broadcast_data (sizes to the GPU, broadcast, back to
# the host; cat, to the GPU, broadcast), get_batch_pipe (two ``contiguous`` shifts of the tokens),
# get_ltor_masks_and_position_ids (ones, tril, ones for the loss mask, arange, ``< 0.5``),
# _exec_load_micro_batch (three ``clone``) and _exec_forward_pass (three ``clone`` of the inputs).
BATCH_OPS = 19
LAYER_SYNCS = 2  # torch.tensor(0.0, device=...) per ParallelTransformerLayer.forward: moe_loss, mlp_bias


def layer_tensors(model) -> int:
    """Parameter tensors of one Megatron-LM block: two norms (weight, + bias for LayerNorm), the
    fused QKV, the projection, fc1 (gate and up fused) and fc2 weights, + their biases."""
    norms = 2 * (2 if getattr(model, "norm", "layernorm") == "layernorm" else 1)
    return norms + 4 + (4 if getattr(model, "bias", True) else 0)


def stage_tensors(model, layers, embed, head):
    """Parameter tensors of a pipeline stage holding ``layers`` blocks (and the embedding / the head)."""
    emb = 1 + (1 if getattr(model, "position", "learned") == "learned" else 0)
    final_norm = 2 if getattr(model, "norm", "layernorm") == "layernorm" else 1
    out = final_norm + (0 if getattr(model, "tied_embeddings", False) else 1)
    return np.asarray(layers, float) * layer_tensors(model) + np.where(embed, emb, 0.0) + np.where(head, out, 0.0)


def batch_sync_time(cpu_per_kernel_s, loads):
    """Host seconds per micro-batch the GPU waits after ``broadcast_data``'s ``.cpu()``: ``BATCH_OPS``
    launches at ``cpu_per_kernel_s`` each, on a stage that loads micro-batches (``loads``: the first and
    the last pipeline stage, as ``TrainSchedule`` issues ``LoadMicroBatch`` only there)."""
    return np.where(loads, BATCH_OPS * cpu_per_kernel_s, 0.0)


def layer_sync_time(cpu_per_kernel_s, layers):
    """GPU-idle seconds per micro-batch forward of ``layers`` Megatron-DeepSpeed blocks: at each of a
    block's ``LAYER_SYNCS`` waits, two launches' host seconds (the tensor built, the next kernel issued)."""
    return np.asarray(layers, float) * LAYER_SYNCS * 2.0 * cpu_per_kernel_s


def layer_forwards(recompute) -> float:
    """How many times each micro-batch runs a Megatron-DeepSpeed block's ``forward``: twice under full
    recomputation (the checkpointed forward is re-run in backward), once otherwise."""
    return 2.0 if recompute == "full" else 1.0


def deepspeed_host_time(zero, tensors, micro_batches, backward_slack_s):
    """Exposed engine seconds per step: the per-step part whole (fp16's ``has_overflow`` and
    BF16_Optimizer's ``assert all_groups_norm > 0.`` wait for the GPU), and per micro-step the hooks'
    b · tensors beyond the backward GPU seconds still queued when the host has issued the backward
    (``backward_slack_s`` per micro-batch: wall − host seconds, 0 when the host sets the pace).

    ZeRO-3 is priced with stage 2's hooks (its per-parameter work is at least that; not measured).
    """
    zero = np.asarray(zero)
    step_s = np.where(zero >= 1, np.where(zero >= 2, DEEPSPEED_HOST_S[2][0], DEEPSPEED_HOST_S[1][0]),
                      DEEPSPEED_HOST_S[0][0])
    per = np.where(zero >= 1, np.where(zero >= 2, DEEPSPEED_HOST_S[2][1], DEEPSPEED_HOST_S[1][1]),
                   DEEPSPEED_HOST_S[0][1])
    hooks = per * np.asarray(tensors, float)
    return step_s + micro_batches * np.maximum(hooks - backward_slack_s, 0.0)


def engine_host_time(profile, model, c, sts, backward_slack_s, recompute="none"):
    """The training engine's exposed host seconds per step, the slowest stage's (DeepSpeed only);
    ``c`` is the StepConfig priced, ``sts`` its pipeline stages, ``backward_slack_s`` each stage's
    backward GPU seconds per micro-batch still queued when its host has issued them, ``recompute`` the
    checkpointing policy (full re-runs each block's forward and its waits: ``layer_forwards``)."""
    if stack(c.framework).engine != "deepspeed":
        return 0.0
    cpu = HostCosts.of(profile).cpu_per_kernel_s
    forwards = layer_forwards(recompute)
    worst = 0.0
    for st, slack in zip(sts, backward_slack_s):
        syncs = batch_sync_time(cpu, np.logical_or(st.embed, st.head)) + forwards * layer_sync_time(cpu, st.layers)
        this = deepspeed_host_time(c.shard_stage, stage_tensors(model, st.layers, st.embed, st.head),
                                   c.micro_batches, slack) + c.micro_batches * syncs
        worst = np.maximum(worst, np.where(st.valid, this, 0.0))
    return worst
