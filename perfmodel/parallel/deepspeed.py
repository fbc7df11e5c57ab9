"""The DeepSpeed pipeline engine and its BF16 optimizer as DeepSpeed 0.16.4 runs them (Megatron-DeepSpeed).

Megatron-DeepSpeed (microsoft/Megatron-DeepSpeed f4157be, ``megatron/model/gpt_model.py``) trains
``GPTModelPipe``, a ``PipelineModule``, unless ``--no-pipeline-parallel`` is given, so pp = 1 runs the
pipeline engine too. What that code does differently from Megatron-LM, per step (DeepSpeed v0.16.4,
e2dc3ee; docs/stacks.md derives each term):

- ``runtime/pipe/schedule.py`` ``TrainSchedule``: 1F1B without interleaving, 2(m + p − 1) steps, the
  bubble of ``pipeline.schedule_seconds`` with v = 1;
- ``runtime/pipe/p2p.py``: ``dist.send``/``dist.recv``, one blocking call per tensor (the compute
  stream waits for each), activations and their gradients split over the tensor group
  (``pipe_partitioned``/``grad_partitioned``, on by default) with a meta tensor before each part, and
  the full tensor gathered again where it is used (``PartitionedTensor.full``): ``p2p_seconds``;
- ``runtime/pipe/engine.py`` ``_exec_reduce_tied_grads`` then ``_exec_reduce_grads``: after the last
  backward, the tied embedding's gradient all-reduced between the first and the last stage, then
  every gradient all-reduced over the data-parallel group in the 16-bit ``communication_data_type``,
  nothing overlapped: ``reduce_seconds``;
- ``runtime/bf16_optimizer.py``: fp32 gradient buffers the 16-bit gradients are added into after
  every micro-batch's backward (``update_hp_grads``), zeroed after the step (``clear_hp_grads``),
  and under ZeRO-1 the updated 16-bit partitions all-gathered (``update_lp_params``):
  ``accumulation_seconds`` and ``reduce_seconds``.

Under ZeRO-3 (pp = 1), beside ``parallel.data.zero3_time``'s collectives: the recomputed forward's
re-gathers and early ZeRO-3's per-rank host work (DeepSpeed v0.3.13 ``runtime/zero``):
``zero3_engine_seconds``.
"""

from __future__ import annotations

import numpy as np

from perfmodel.core.errors import UnsupportedError
from perfmodel.costs.comm import hierarchical_time
from perfmodel.costs.compute import kernel_time
from perfmodel.costs.engine_host import engine_host_time
from perfmodel.costs.host import HostCosts
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.data import overlapped_cost, ring_pricer
from perfmodel.parallel.pipeline import sendrecv_time
from perfmodel.parallel.placement import pipeline_crossings
from perfmodel.parallel.wire import activation_bytes
from perfmodel.workload.ops import mem as mem_kernel
from perfmodel.workload.stacks import stack

META_BYTES = 8.0 * 8      # PartitionedTensor.to_meta(): a handful of int64s (rank count, shape, offsets)
DS_MAX_REUSE = 1e9        # stage3_max_reuse_distance default, elements (v0.3.13 stage3.py, v0.16.4 zero/config.py)


def check_pipeline_engine(framework: str, *, pp: int, zero: int, schedule: str) -> None:
    """Raise where the DeepSpeed pipeline engine refuses a configuration (deepspeed/runtime/pipe)."""
    if stack(framework).engine != "deepspeed":
        return
    if schedule != "1f1b":
        raise UnsupportedError(f"schedule={schedule!r} does not apply to framework='deepspeed': DeepSpeed's "
                               "pipeline engine runs TrainSchedule (1F1B, no interleaving; runtime/pipe/schedule.py): "
                               "use schedule='1f1b'")
    if pp > 1 and zero >= 2:
        raise UnsupportedError(f"zero={zero} with pp={pp} does not apply to framework='deepspeed': "
                               "\"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism\" "
                               "(runtime/pipe/engine.py); use zero 0 or 1, or pp=1")


def transfers_per_micro_batch(pp, index):
    """Blocking p2p transfers a stage waits for per micro-batch: an activation and a gradient
    received and sent across each neighbouring boundary (``TrainSchedule``: RecvActivation,
    SendActivation, RecvGrad, SendGrad), so 4 on a middle stage, 2 on the first and the last, none at pp = 1."""
    pp, index = np.asarray(pp, float), np.asarray(index, float)
    return 2.0 * ((index > 0).astype(float) + (index < pp - 1).astype(float))


def gathers_per_micro_batch(pp, index):
    """Tensor-group all-gathers of b·s·h per micro-batch under ``pipe_partitioned``: the received
    activation before forward (not on the first stage), and before backward the stage's own output,
    kept only as its part, and the received gradient (not on the last stage)."""
    pp, index = np.asarray(pp, float), np.asarray(index, float)
    return (index > 0).astype(float) + 2.0 * (index < pp - 1).astype(float)


def p2p_seconds(coll, lay, c: StepConfig, act_bytes, sts):
    """Point-to-point seconds per step on the slowest stage's critical path, plus the fill and the drain.

    Each of a stage's ``transfers_per_micro_batch`` sends 1/t of b·s·h (``act_bytes``) after a meta
    tensor when tp = t > 1 (the whole tensor, no meta, when t = 1), and the stage all-gathers
    ``gathers_per_micro_batch`` tensors over its tensor group; the fill and the drain cross every
    boundary once each way (as ``pipeline.p2p_time``).
    """
    split = c.tp > 1
    crossings = pipeline_crossings(lay["pp"])
    boundaries = np.maximum(c.pp - 1.0, 0.0)
    one = {}
    for level in ("intra", "inter"):
        meta = np.where(split, sendrecv_time(coll, level, META_BYTES), 0.0)
        one[level] = sendrecv_time(coll, level, act_bytes / c.tp) + meta
    hop = np.where(crossings > 0, one["inter"], one["intra"])
    gather = np.where(split, hierarchical_time(coll, "all_gather", act_bytes, *lay["tp"], algorithm="ring"), 0.0)
    worst = 0.0
    for st in sts:
        this = transfers_per_micro_batch(c.pp, st.index) * hop + gathers_per_micro_batch(c.pp, st.index) * gather
        worst = np.maximum(worst, np.where(st.valid, this, 0.0))
    fill = crossings * one["inter"] + (boundaries - crossings) * one["intra"] + boundaries * gather
    return np.where(c.pp > 1, c.micro_batches * worst + 2.0 * fill, 0.0)


def bf16_optimizer(c: StepConfig, precision) -> np.ndarray:
    """Whether DeepSpeed wraps the optimizer in BF16_Optimizer: bf16 with ZeRO 0 or 1 and fp32 gradient
    accumulation, the default ``grad_accum_dtype`` (engine.py ``_do_optimizer_sanity_check``)."""
    return np.asarray((precision == "bf16-mixed") & (np.asarray(c.shard_stage) <= 1))


def tied_seconds(coll, lay, c: StepConfig, model, embed_params, precision):
    """``_exec_reduce_tied_grads``: the tied embedding's gradient (fp32 ``_hp_grad`` under BF16_Optimizer,
    else 16-bit) all-reduced between the first and the last stage, when the embedding is tied and pp > 1."""
    if not getattr(model, "tied_embeddings", False):
        return 0.0
    elem = np.where(bf16_optimizer(c, precision), 4.0, 2.0)
    across = pipeline_crossings(lay["pp"]) > 0
    nbytes = embed_params / c.tp * elem
    t = np.where(across, hierarchical_time(coll, "all_reduce", nbytes, 1, 2, algorithm="ring"),
                 hierarchical_time(coll, "all_reduce", nbytes, 2, 1, algorithm="ring"))
    return np.where(c.pp > 1, t, 0.0)


def reduce_seconds(coll, lay_dp, c: StepConfig, params, precision):
    """Exposed data-parallel seconds of one stage after its last backward (ZeRO 0 and 1; nothing overlaps).

    The gradients leave in the 16-bit ``communication_data_type`` (engine.py: fp16 or bf16 when enabled):
    BF16_Optimizer and ZeRO-0 all-reduce them (``buffered_allreduce_fallback``: ``allreduce_no_retain`` groups
    tensors until 5·10⁸ elements, so BF16_Optimizer's flat fp32 buffer, one tensor per group, goes whole);
    fp16 ZeRO-1 reduce-scatters them (``stage_1_and_2.reduce_gradients``, ``reduce_scatter=True``). ZeRO-1
    then all-gathers the updated 16-bit parameters (``update_lp_params``, ``all_gather_dp_groups``).
    """
    rpn, nodes = lay_dp["dp"]
    price = ring_pricer(coll, rpn, nodes)
    nbytes = params * 2.0
    allreduce = price("all_reduce", np.maximum(nbytes, 1.0))
    scatter = price("reduce_scatter", np.maximum(nbytes, 1.0))
    reduce = np.where((c.shard_stage >= 1) & ~bf16_optimizer(c, precision), scatter, allreduce)
    gather = np.where(c.shard_stage >= 1, price("all_gather", np.maximum(nbytes, 1.0)), 0.0)
    return np.where(c.dp > 1, reduce + gather, 0.0)


def _pass(profile, cls, params):
    """Seconds of one memory-bound pass of class ``cls`` over ``params`` fp32 elements."""
    return kernel_time(profile, mem_kernel(f"ds.{cls}", cls, "opt", params, variant="fwd"))[0]


def accumulation_seconds(profile, c: StepConfig, params, precision):
    """BF16_Optimizer's passes over a stage's fp32 gradient buffers per step: after each micro-batch's
    backward ``hp_grad.add_(lp.grad.to(fp32))`` (a cast and an add); with dp > 1 the reduction's own
    (``allreduce_bucket``: flatten, cast to bf16, divide, cast back; ``allreduce_and_copy``: copy back);
    after the step one ``zero_`` (``clear_hp_grads``). The per-micro-batch pass runs inside the stage's
    ``BackwardPass`` (``_exec_backward_pass`` calls ``update_hp_grads``), before ``TrainSchedule`` sends the
    gradient back at its next step, so the drain carries it through the other p − 1 stages as well:
    m + p − 1 of them on the critical path, as 1F1B's (m + p − 1)(f + b)."""
    if precision != "bf16-mixed":
        return 0.0
    per_micro = _pass(profile, "cast_bf16_to_fp32", params) + _pass(profile, "add", params)
    reduce = 2.0 * _pass(profile, "copy", params) + _pass(profile, "cast_fp32_to_bf16", params) \
        + _pass(profile, "scale", params) + _pass(profile, "cast_bf16_to_fp32", params)
    on_path = c.micro_batches + np.maximum(np.asarray(c.pp, float) - 1.0, 0.0)
    passes = on_path * per_micro + np.where(c.dp > 1, reduce, 0.0) + _pass(profile, "scale", params)
    return np.where(bf16_optimizer(c, precision), passes, 0.0)


def engine_exposed(profile, coll, lay, lay_dp, c: StepConfig, dpc: StepConfig, work, model, priced, *, precision,
                   cpu, recompute="none"):
    """(p2p, exposed data-parallel, optimizer, engine host) seconds per step: ``priced`` (Megatron-LM's
    first three) unchanged for other stacks; for ``framework="deepspeed"`` the pipeline engine's p2p, and,
    under ZeRO 0 and 1, its reduction after the last backward and BF16_Optimizer's gradient passes, under
    ZeRO-3 ``zero3_engine_seconds`` beside ``zero3_time``'s collectives.
    ``cpu``: the host seconds issuing each part of one micro-batch (a ``PhaseTimes``, ``ComputeTimes.cpu``)."""
    p2p, dp_exposed, opt = priced
    slack = tuple(np.maximum(back - cpu.on(st, "b"), 0.0) for st, back in zip(work.stages, work.backward_s))
    host = engine_host_time(profile, model, c, work.stages, slack, recompute)
    if stack(c.framework).engine != "deepspeed":
        return p2p, dp_exposed, opt, host
    p2p = p2p_seconds(coll, lay, c, activation_bytes(model, c, precision), work.stages)
    reduce, extra = 0.0, 0.0
    for st, back in zip(work.stages, work.backward_s):
        params = st.params(work.params, c.tp)
        mine = reduce_seconds(coll, lay_dp, dpc, params, precision) \
            + np.where(np.logical_or(st.embed, st.head), tied_seconds(coll, lay, c, model, work.params.embed, precision), 0.0)
        slack = st.index * back  # stages after the first end their last backward earlier (the drain)
        reduce = np.maximum(reduce, np.where(st.valid, np.maximum(mine - slack, 0.0), 0.0))
        extra = np.maximum(extra, np.where(st.valid, accumulation_seconds(profile, c, params, precision), 0.0))
    pipelined = (c.shard_stage <= 1) & (c.ps_servers == 0)
    zero3 = zero3_engine_seconds(profile, coll, lay_dp, dpc, work, model, recompute)
    return p2p, np.where(pipelined, reduce, dp_exposed + zero3), opt + extra, host



def block_weights(model, tp=1) -> list:
    """Elements of a Megatron-LM block's gathered weights in forward order (fused QKV, projection, fc1,
    fc2) on one tensor-parallel rank: ``parallel.data.DS_BLOCK_GATHERS`` of them."""
    h = model.hidden
    return [model.attention_in_weights / tp, model.attn_width * h / tp, h * model.mlp_in_out / tp,
            model.ffn_hidden * h / tp]


def kept_for_backward(weights) -> list:
    """Whether ZeRO-3 keeps each weight gathered from its recomputed forward to its backward: the
    elements of the sub-modules traced in between (the later weights, forward then backward) under
    ``DS_MAX_REUSE`` (v0.3.13 stage3.py ``_keep_for_later``; v0.16.4 partitioned_param_coordinator.py
    ``__params_to_release``)."""
    return [2.0 * sum(weights[i + 1:]) < DS_MAX_REUSE for i in range(len(weights))]


def zero3_engine_seconds(profile, coll, lay_dp, c: StepConfig, work, model, recompute):
    """DeepSpeed ZeRO-3 seconds per step beside ``parallel.data.zero3_time`` (a gather forward, one
    backward and a reduce-scatter per weight), for the first stage's blocks:

    - under full recompute the recomputed forward's module hooks gather every block weight again
      (``pre_sub_module_forward_function`` -> ``fetch_sub_module``), and the backward then re-gathers
      only the weights not ``kept_for_backward``: the regathered weights' all-gathers, hidden behind
      the recomputed forward where the stack overlaps (``dp_overlap``);
    - ZeRO-3 of early 2021 (``dp_overlap`` False, v0.3.13 partition_parameters.py ``_allgather_param``
      and ``_reduce_scatter_gradient``) calls ``torch.distributed.all_gather`` and ``reduce_scatter`` with
      one tensor per rank, built by a Python loop of n ``narrow`` views before the call, and ProcessGroupNCCL
      (PyTorch 1.8 torch/lib/c10d/ProcessGroupNCCL.cpp) copies once per rank: ``allgather`` issues the n
      copies out of its flat buffer after the NCCL kernel, so they cost what they take beyond it;
      ``reduce_scatter`` copies the n inputs in before it, in full. Each view and each copy costs one
      host op (``cpu_per_kernel_s``); the device waits for them, as every fetch ends in
      ``torch.cuda.synchronize()``.
    """
    if stack(c.framework).engine != "deepspeed":
        return 0.0
    rpn, nodes = lay_dp["dp"]
    copies = np.asarray(c.dp, float) * HostCosts.of(profile).cpu_per_kernel_s
    weights = block_weights(model, c.tp)
    full = recompute == "full"
    regather, launches = 0.0, 0.0
    for w, keep in zip(weights, kept_for_backward(weights)):
        ag = hierarchical_time(coll, "all_gather", w * 2.0, rpn, nodes, algorithm="ring")
        again = full & ~np.asarray(keep, bool)  # gathered in the recomputed forward and again in the backward
        regather = regather + np.where(again, ag, 0.0)
        gathers = np.where(again, 3.0, 2.0)
        # a gather: the Python loop's n views before the NCCL kernel, then the n copies beyond it;
        # a reduce-scatter: the loop's n views and the n copies in, both before it
        launches = launches + gathers * (copies + np.maximum(copies - ag, 0.0)) + 2.0 * copies
    exposed = overlapped_cost(regather, np.where(c.dp_overlap, work.times.layer_f, 0.0)) \
        + np.where(c.dp_overlap, 0.0, launches)
    on = (c.shard_stage >= 3) & ~np.asarray(c.fsdp, bool) & (c.dp > 1)
    return np.where(on, c.micro_batches * work.stages[0].layers * exposed, 0.0)
