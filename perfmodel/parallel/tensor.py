"""Tensor parallelism (Megatron-LM, torchtitan's DTensor plan): the all-reduces, gathers and reduce-scatters
on the critical path, per stack (docs/distributed.md, docs/stacks.md)."""

from __future__ import annotations

import numpy as np

from perfmodel.core.algebra import pick
from perfmodel.costs.comm import hierarchical_time
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.data import overlapped_cost
from perfmodel.parallel.pipeline import PhaseTimes
from perfmodel.parallel.tp_overlap import overlapped_layer, ub_config
from perfmodel.parallel.wire import activation_bytes
from perfmodel.workload.stacks import stack
from perfmodel.workload.stacks.checkpointing import checkpointed_share

_UB_GEMMS = tuple(f"{n}{s}" for n in ("qkv", "proj", "fc1", "fc2") for s in ("", ".dgrad", ".wgrad"))


def sp_regathers(framework) -> int:
    """All-gathers a sequence-parallel block repeats in backward to rebuild the column-parallel GEMMs'
    inputs for their weight gradients (``Stack.tp_regathers``).

    Megatron-LM (``tensor_parallel/layers.py`` ``LinearWithGradAccumulationAndAsyncCommunication``,
    Korthikanti et al. 2022 §4.2.2) saves the sequence-sharded input and gathers it again: 2 per
    block (qkv, fc1). torchtitan v0.2.2 (``models/llama3/infra/parallelize.py`` ``apply_tp``:
    ``PrepareModuleInput(Shard(1) -> Replicate())`` before attention and the feed-forward) gathers
    once in a DTensor redistribute whose output autograd saves for wq/wk/wv and w1/w3: none.
    """
    return stack(framework).tp_regathers


def tp_comm_times(model, coll, lay, c: StepConfig, *, precision, recompute, hidden_by=0.0, gemms=None,
                  sms=132, slowdown=0.0) -> PhaseTimes:
    """Tensor-parallel seconds per micro-batch on the critical path: per layer fwd/bwd, embedding, head.

    Megatron-LM (Shoeybi et al. 2019, §3): the attention and the MLP each end in an
    all-reduce of b·s·h (the g operator) and each start with one in backward (f), so
    2 forward + 2 backward per layer. Sequence parallelism (Korthikanti et al. 2022,
    §4.2.2) turns each all-reduce into an all-gather + reduce-scatter of the same
    b·s·h (same bus bytes). Full recompute re-runs the forward ones in backward.
    The vocabulary-parallel embedding all-reduces (SP: reduce-scatters) its output;
    the LM head's input gradient is all-reduced (SP: the input is all-gathered
    forward and its gradient reduce-scattered backward). With sequence parallelism
    the column-parallel layers keep their input sharded and gather it again in
    backward for the weight gradient (Korthikanti et al. 2022, §4.2.2).

    ``tp_overlap`` (Megatron-LM ``LinearWithGradAccumulationAndAsyncCommunication``):
    in backward the input-gradient all-reduce (SP: its reduce-scatter) runs while the
    weight-gradient GEMM computes, and the SP re-gather while the input-gradient GEMM
    computes; a weight-gradient GEMM takes as long as the layer's forward GEMMs
    (``hidden_by``: a layer's forward GPU seconds), so each hides behind up to one
    forward's worth of compute. Only the gradient of the forward reduce-scatter (an
    all-gather) stays exposed under SP. The GEMMs beside those NCCL kernels run ``slowdown``
    slower while both run (``overlapped_cost``; Lee et al. 2025).

    torchtitan's DTensor plan (``sp_regathers``) saves the gathered inputs: under SP its
    backward is the 2 all-gathers of dy and the 2 reduce-scatters of dx, no re-gather. A plan that
    gives each column-parallel linear its own ``ColwiseParallel(input_layouts=Shard(1))``
    (``Stack.tp_input_gathers``: KempnerForge's q, k, v, gate and up) gathers the block's input once
    per linear forward and reduce-scatters each linear's input gradient backward.

    ``c.tp_comm_overlap`` (TE userbuffers, torchtitan async TP) overlaps the SP collectives
    with the linears' GEMMs chunk by chunk (``perfmodel.parallel.tp_overlap``); ``gemms``: the
    ``ComputeTimes`` holding those GEMMs' seconds, ``sms``: the GPU's SMs (SMs per GEMM: ``ub_config``).
    """
    act = activation_bytes(model, c, precision)
    rpn, nodes = lay["tp"]
    ar = hierarchical_time(coll, "all_reduce", act, rpn, nodes, algorithm="ring")
    rs = hierarchical_time(coll, "reduce_scatter", act, rpn, nodes, algorithm="ring")
    ag = hierarchical_time(coll, "all_gather", act, rpn, nodes, algorithm="ring")
    on = c.tp > 1
    sp = np.asarray(c.sequence_parallel, bool)
    gathers = stack(c.framework).tp_input_gathers  # SP: the block input's gathers forward, their RS backward
    fwd = pick(on, pick(sp, gathers * ag + 2 * rs, 2 * ar), 0.0)
    hidden_by = np.asarray(hidden_by, float)
    regather = sp_regathers(c.framework) * ag
    plain = pick(sp, 2 * ag + gathers * rs + regather, 2 * ar)
    overlapped = pick(sp, 2 * ag + overlapped_cost(2 * rs + regather, 2 * hidden_by, slowdown),
                          overlapped_cost(2 * ar, hidden_by, slowdown))
    bwd = pick(on, pick(np.asarray(c.tp_overlap, bool), overlapped, plain), 0.0)
    if c.tp_comm_overlap and gemms is not None:
        ub_f, ub_b = _overlapped(model, c, gemms, ag, rs, sms)
        fwd, bwd = pick(on & sp, ub_f, fwd), pick(on & sp, ub_b, bwd)
    routed = _routed_experts(model, c, coll, lay, act, fwd, bwd)  # the routed experts' half, then a shared one's
    fwd, bwd = (x + _shared_expert_seconds(model, on, sp, ag, rs, ar) for x in routed)
    bwd = bwd + fwd * checkpointed_share(recompute)  # a checkpointed block's forward collectives run again
    # the embedding's reduce-scatter (no SP: all-reduce) and, under SP, its gradient's all-gather back
    # (Megatron: reduce_scatter_to_sequence_parallel_region's backward; DTensor: Shard(1) -> Replicate)
    return PhaseTimes(layer_f=fwd, layer_b=bwd, embed_f=pick(on, pick(sp, rs, ar), 0.0), embed_b=pick(on & sp, ag, 0.0),
                      head_f=pick(on, pick(sp, ag, 0.0) + loss_time(model, coll, lay, c), 0.0),
                      head_b=pick(on, pick(sp, rs, ar), 0.0))


def _shared_expert_seconds(model, on, sp, ag, rs, ar):
    """A shared expert's collectives each way: it is a tensor-parallel MLP of its own (Megatron-Core
    ``SharedExpertMLP``), its input gathered and its output reduce-scattered (without SP, all-reduced) forward,
    their transposes backward, not overlapped; 0 without one."""
    if not getattr(model, "shared_ffn", 0):
        return 0.0
    return pick(on, pick(sp, ag + rs, ar), 0.0) * model.moe_share  # per average block: the MoE blocks have one


def _routed_experts(model, c: StepConfig, coll, lay, act, fwd, bwd):
    """(forward, backward) block collectives with a MoE block's routed experts as Megatron-Core runs them.

    A block's tensor-parallel collectives are half the attention's, half the MLP's. In a MoE block Megatron-Core's
    ``MoEAlltoAllTokenDispatcher`` (core_v0.12.0; core_r0.10.0 alike) keeps the rank's 1/tp sequence shard, sends
    its routed tokens by all-to-all over ep (``expert.ep_comm_times``), then gathers them over the etp ranks (tp
    unless set) and reduce-scatters the experts' outputs back: tokens/tp · top_k · etp vectors each way, none at
    etp = 1, and no userbuffers overlap (the experts are not TE's overlapped linears). Those replace the MLP half
    in the MoE blocks (a shared expert adds its own, ``_shared_expert_seconds``). The other stacks' MoE blocks are
    priced as their dense ones."""
    if getattr(model, "experts", 1) <= 1 or c.framework != "megatron":
        return fwd, bwd
    etp = c.expert_tp
    size = act * model.experts_per_token * etp / np.asarray(c.tp, float)
    pair = pick(etp > 1, hierarchical_time(coll, "all_gather", size, *lay["etp"], algorithm="ring")
                + hierarchical_time(coll, "reduce_scatter", size, *lay["etp"], algorithm="ring"), 0.0)
    share = model.moe_share
    return fwd - share * fwd / 2 + share * pair, bwd - share * bwd / 2 + share * pair


def _overlapped(model, c: StepConfig, gemms, ag, rs, sms):
    """(forward, backward) exposed seconds of a block's SP collectives under ``c.tp_comm_overlap``, its GEMMs'
    seconds whole and as chunk GEMMs read from ``gemms`` (``step._linear_gemm_times``)."""
    timed = dict(gemms.tp_gemms)
    chunks = {k: {"ring": timed[k + "@ring"], "split": timed[k + "@split"]} for k in _UB_GEMMS if k + "@ring" in timed}
    return overlapped_layer(ag, rs, {k: gemms.tp_gemm(k) for k in _UB_GEMMS}, c.tp, sms, method=c.tp_comm_overlap,
                            config=ub_config(c.tp_comm_overlap, model.hidden), chunks=chunks or None)


def loss_time(model, coll, lay, c: StepConfig):
    """Seconds of the loss's tensor-parallel collectives per micro-batch: ``loss_parallel_time`` where the
    stack keeps the logits vocabulary-sharded (``Stack.loss_parallel``), else the all-gather of the
    16-bit logits to every rank (KempnerForge 0c4eba1 ``apply_tensor_parallel``: the output head's
    ``ColwiseParallel(..., output_layouts=Replicate())``), whose loss then runs on the whole vocabulary."""
    if stack(c.framework).loss_parallel:
        return loss_parallel_time(model, coll, lay, c)
    rpn, nodes = lay["tp"]
    logits = c.micro_batch * model.seq * model.vocab * 2.0  # b·s·V bf16 gathered
    return hierarchical_time(coll, "all_gather", logits, rpn, nodes, algorithm="ring")


def loss_parallel_time(model, coll, lay, c: StepConfig):
    """Seconds of the loss's own collectives over vocabulary-sharded logits, per micro-batch.

    torchtitan v0.2.2 keeps the output layer's logits sharded (``Shard(-1)``; ``disable_loss_parallel``
    defaults to False, ``config/job_config.py``) and computes the loss under
    ``torch.distributed.tensor.parallel.loss_parallel``, whose forward all-reduces the row max, the
    sum of exponentials and the target logit (torch ``distributed/tensor/parallel/loss.py``): three
    all-reduces of b·s fp32 values, latency-bound; its backward is local. Megatron-Core
    core_v0.16.0 ``tensor_parallel/cross_entropy.py`` (``VocabParallelCrossEntropy``) does the same three.
    """
    rpn, nodes = lay["tp"]
    size = c.micro_batch * model.seq * 4.0  # one fp32 value per token
    return 3 * hierarchical_time(coll, "all_reduce", size, rpn, nodes, algorithm="ring")
