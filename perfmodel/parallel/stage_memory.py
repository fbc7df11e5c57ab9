"""Per-GPU memory of each pipeline stage and of the fullest one, for the configurations ``c``.

The terms come from ``costs/memory.py`` (model states, activations, the loss, the moments of the
step) and ``costs/stack_memory.py`` (what a stack adds, the caching allocator); the layer-forwards a
stage holds from ``parallel/pipeline.py``. docs/memory.md derives them.
"""

from __future__ import annotations

import numpy as np

from perfmodel.core.algebra import pick
from perfmodel.costs import memory as mem, stack_memory
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.expert import expert_shard_ranks
from perfmodel.parallel.pipeline import ParamCounts, Stage, in_flight, layer_batches
from perfmodel.parallel.wire import wire_bytes
from perfmodel.workload import kernels as steps
from perfmodel.workload.stacks import megatron_code

PREFETCH_UNITS = 2  # FSDP limit_all_gathers: the unit computing and the one being gathered


def vocab_multiple(framework):
    """Rows the framework pads its vocabulary to (Megatron-LM: ``steps.MEGATRON_VOCAB_MULTIPLE``)."""
    return steps.MEGATRON_VOCAB_MULTIPLE if megatron_code(framework) else 1


def activation_terms(model, c: StepConfig, *, precision, recompute, seq):
    """Per-token activation bytes of a layer (as run and without recompute), of the final norm
    and LM head input, of the loss (backward, forward), all for one micro-batch."""
    tp, framework = c.tp, c.framework
    tokens = c.micro_batch * seq
    lo = wire_bytes(precision, framework).activation
    kw = {"framework": framework} if framework != "pytorch" else {}
    if c.compile:
        kw["compiled"] = True
    if c.norm_kernels != "fused":
        kw["norm_kernels"] = c.norm_kernels
    act_layer = mem.layer_activation_bytes(model, tp=tp, sp=c.sequence_parallel, precision=precision,
                                           recompute=recompute, **kw)
    if c.attention == "unfused" and recompute == "none":
        # softmax output, dropout mask and output over b·heads·s² (Korthikanti et al. 2022, eq. 1: 5as²b)
        act_layer = act_layer + 5.0 * model.heads / tp * seq
    full_layer = mem.layer_activation_bytes(model, tp=tp, sp=c.sequence_parallel, precision=precision,
                                            recompute="none", **kw)
    final = tokens * (4.0 * model.hidden + 8.0 + (2.0 * model.hidden if lo == 2.0 else 0.0))
    logits = tokens * steps.vocab_shard(model.vocab, tp, vocab_multiple(framework))
    per_logit, per_logit_fwd = stack_memory.loss_bytes_per_logit(c.loss, lo, megatron=megatron_code(framework))
    chunked = stack_memory.chunked_loss_bytes(tokens, model.hidden, lo) if c.loss == "chunked" else 0.0
    # the tanh output softcapping saves (a chunked loss never holds the whole logits, capped or not)
    capped = lo * logits if getattr(model, "logit_softcap", 0.0) and c.loss != "chunked" else 0.0
    loss = per_logit * logits + chunked + capped         # eager: log-softmax output, its gradient, the result, fp32
    loss_fwd = per_logit_fwd * logits + chunked + capped  # eager: (bf16 logits +) fp32 cast + log-softmax output
    hole = stack_memory.loss_hole_bytes_per_logit(c.loss, lo, megatron=megatron_code(framework)) * logits
    return {"layer": act_layer, "full_layer": full_layer, "final": final, "loss": loss, "loss_fwd": loss_fwd,
            "loss_hole": hole}


def stage_memory(model, c: StepConfig, st: Stage, p: ParamCounts, acts, shard_ranks, *, precision, recompute,
                  optimizer, seq):
    """(peak bytes, terms alive at the peak, the peak's moment: an index of ``mem.PEAK_MOMENTS``) of one stage."""
    tp, framework = c.tp, c.framework
    tokens = c.micro_batch * seq
    nb = wire_bytes(precision, framework, c.grad_reduce_fp32)
    # autocast caches each cast weight until its context exits (all layers during the forward);
    # under full recomputation autograd saves only the head's, and a recomputed layer casts again
    per_copy = mem.model_state_bytes(precision, optimizer, framework)["weight_copies"]
    tied_copy = p.embed if getattr(model, "tied_embeddings", False) else 0.0  # Megatron keeps it on the last stage
    head_params = pick(st.head, p.head + pick(c.pp > 1, tied_copy, 0.0), 0.0)
    params = (st.layers * p.layer + pick(st.embed, p.embed, 0.0) + head_params) / tp
    gemm = (st.layers * p.gemm_layer + pick(st.head, p.gemm_head, 0.0)) / tp
    expert = st.layers * p.expert_layer / tp  # sharded over the replicas holding the same experts
    states = dict(precision=precision, optimizer=optimizer, framework=framework, grad_reduce_fp32=c.grad_reduce_fp32,
                  optimizer_states=c.optimizer_states, fp8_params=c.fp8_params)
    dense = mem.static_bytes(params - expert, gemm - expert, zero=c.shard_stage, dp=shard_ranks, **states)
    experts = mem.static_bytes(expert, expert, zero=c.shard_stage,
                               dp=expert_shard_ranks(shard_ranks, c.ep, c.expert_fold), **states)
    terms = {k: dense[k] + experts[k] for k in dense}
    te_gemm = st.layers * p.gemm_layer / tp  # the blocks' GEMM weights: Transformer Engine's linears
    terms["fp8_weights"] = mem.fp8_weight_bytes(precision, framework) * te_gemm  # TE's cache, or the fp8 parameters
    terms["weights"] = terms["weights"] - mem.fp8_param_bytes(precision, framework, c.fp8_params) * te_gemm
    unit = np.maximum(p.layer, pick(st.embed, p.embed, 0.0)) / tp
    terms["comm_buffers"] = mem.comm_buffer_bytes(params, unit, zero=c.shard_stage, dp=c.dp, ps=c.ps_servers,
                                                  bucket=c.bucket_bytes, lo=nb.activation, prefetch=PREFETCH_UNITS,
                                                  grad_bytes=nb.grad, framework=framework, fsdp=c.fsdp)
    terms = stack_memory.stack_model_states(terms, framework, params, unit, shard_ranks, c, optimizer=optimizer,
                                            head=pick(st.head, p.head, 0.0) / tp,
                                            embed=pick(st.embed, p.embed, 0.0) / tp, gemm_unit=p.gemm_layer / tp)
    saved = tokens * acts["layer"] * (layer_batches(c, st) - c.offload_layers * in_flight(c, st.index))  # offloaded
    saved = saved + pick(st.head, acts["final"], 0.0) + pick(st.embed, tokens * 4.0 * model.hidden, 0.0)
    cache = terms["weight_copies"]
    transient = 0.0
    if recompute == "full":
        terms["weight_copies"] = pick(np.asarray(c.shard_stage) >= 3, 0.0,
                                          per_copy * pick(st.head, p.gemm_head, 0.0) / tp)
    if recompute == "full" or recompute == "selective-op" or recompute.startswith("every-"):
        # one block's forward is rebuilt in backward
        transient = pick(st.layers > 0, tokens * acts["full_layer"] + per_copy * p.gemm_layer / tp, 0.0)
    if c.offload_layers:  # the block reloaded in backward is in flight; save_on_cpu took the blocks' weight casts
        transient, terms["weight_copies"] = tokens * acts["layer"], cache - c.offload_layers * per_copy * p.gemm_layer / tp
    peak, terms, moment = mem.peak_terms(terms, saved, pick(st.head, acts["loss"], 0.0), c.micro_batches > 1,
                                 cache=cache, loss_forward=pick(st.head, acts["loss_fwd"], 0.0),
                                 transient=transient)
    return pick(st.valid, peak, 0.0), terms, moment


def memory_terms(model, lay, c: StepConfig, sts, p: ParamCounts, *, precision, recompute, optimizer, seq=None):
    """Peak bytes over the pipeline stages: (peak, terms of the fullest stage, reserved, required bytes,
    the moment of its peak: an index of ``mem.PEAK_MOMENTS``).

    ``p``: the parameter counts of ``param_counts``; ``seq``: a sequence's tokens on one rank (s/cp under cp).
    """
    seq = model.seq if seq is None else seq
    acts = activation_terms(model, c, precision=precision, recompute=recompute, seq=seq)
    rpn, _ = lay["dp"]
    shard_ranks = pick(c.hybrid, rpn, c.dp)
    best, best_terms, best_moment = None, None, None
    for st in sts:
        peak, terms, moment = stage_memory(model, c, st, p, acts, shard_ranks, precision=precision,
                                           recompute=recompute, optimizer=optimizer, seq=seq)
        better = True if best is None else peak > best
        best_terms = terms if best is None else {k: pick(better, terms[k], best_terms[k]) for k in terms}
        best_moment = moment if best is None else pick(better, moment, best_moment)
        best = peak if best is None else np.maximum(best, peak)
    return (best, best_terms, *stack_memory.allocator_bytes(best, c, p.layer / c.tp, free=freed_logits(
        acts, best_terms, best_moment)), best_moment)


def freed_logits(acts, terms, moment):
    """Free bytes the allocator holds reserved at the peak: the eager loss's freed 16-bit logits
    (``stack_memory.loss_hole_bytes_per_logit``), where the peak is the loss backward of a stage
    that computes the loss (``terms["loss"]`` > 0), else none."""
    at_loss = (np.asarray(moment) == mem.PEAK_MOMENTS.index("loss_backward")) & (np.asarray(terms["loss"]) > 0)
    return pick(at_loss, acts["loss_hole"], 0.0)
