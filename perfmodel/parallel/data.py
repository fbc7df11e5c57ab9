"""Data-parallel communication: DDP buckets, ZeRO-1/2/3, FSDP (full, hybrid), parameter servers.

Each function returns the exposed seconds per step for arrays of configurations (``c``: a
``perfmodel.parallel.config.StepConfig``); docs/distributed.md derives every formula.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import numpy as np

from perfmodel.core.algebra import floats, is_symbolic, maximum, minimum, pick, where
from perfmodel.core.layout import rows_inner
from perfmodel.costs.comm import hierarchical_time
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.stacked import stacked_time
from perfmodel.parallel.pipeline import (ParamCounts, PhaseTimes, Stage, in_flight, pipeline_waits, prefetched_gather,
                                        slowed)
from perfmodel.parallel.wire import WireBytes
from perfmodel.workload.stacks import gradient_reduce_bytes, stack
from perfmodel.workload.stacks.float8 import fp8_gathered, gather_bytes_per_param

DS_PREFETCH_BUCKET = 5e7  # DeepSpeed ZeRO-3 stage3_prefetch_bucket_size default (elements per all-gather)
# DeepSpeed ZeRO-3 gathers each parameter of a Megatron-LM block above stage3_param_persistence_threshold
# (1e5 elements) by its own all-gather: the fused QKV, projection, fc1 and fc2 weights; biases and norms
# stay whole on every rank (v0.3.13 partition_parameters.py _allgather_param per parameter; v0.16.4
# partitioned_param_coordinator.py fetch_sub_module, one coalesced gather per sub-module)
DS_BLOCK_GATHERS = 4
DDP_FIRST_BUCKET_BYTES = 2**20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES: DDP's first bucket is 1 MiB


@dataclass(frozen=True)
class DataParallelWork:
    """What each pipeline stage's data-parallel group reduces, and the compute that can hide it.

    ``times``: seconds of one micro-batch by part, tensor-parallel communication included;
    ``backward_s[i]``: stage i's backward seconds per micro-batch that the reduction can overlap;
    ``overlap_slowdown``: the fraction by which that compute slows while the collectives run beside
    it (their kernels take SMs and memory bandwidth; ``overlapped_cost``).
    """

    params: ParamCounts
    stages: tuple[Stage, ...]
    times: PhaseTimes
    backward_s: tuple
    wire: WireBytes
    overlap_slowdown: float = 0.0


@dataclass(frozen=True)
class BucketCosts:
    """Host costs of DDP's gradient buckets beyond their collectives.

    ``copy_s(elements)`` prices one fp32 copy (DDP's passes over the buckets, see
    :func:`ddp_bucket_passes`; None: the profile has no copy class and none are priced);
    ``extra_s``: a host's measured cost per DDP bucket beyond them (a CPU host:
    ``host["ddp_bucket_extra_s"]``, perfmodel/fit/overhead.py).
    """

    copy_s: Callable | None = None
    extra_s: float = 0.0


def dp_collectives(zero: int, micro_batches: int = 1) -> list[tuple[str, int]]:
    """Data-parallel collectives of one step, as (collective, count), each over all Ψ elements.

    The bookkeeping behind ``ddp_time``, ``zero12_time`` and ``zero3_time``
    (Rajbhandari et al. 2020, §7): a ring all-reduce sends 2Ψ(n−1)/n per rank,
    reduce-scatter and all-gather Ψ(n−1)/n each.
    """
    m = micro_batches
    if zero >= 3:
        return [("all_gather", 2 * m), ("reduce_scatter", m)]
    if zero == 2:
        return [("reduce_scatter", m), ("all_gather", 1)]
    if zero == 1:
        return [("reduce_scatter", 1), ("all_gather", 1)]
    return [("all_reduce", 1)]


def _split(total, bucket, first=None):
    """(first bucket's bytes, full buckets, their bytes, remainder bytes) of ``total`` bytes in
    buckets of ``bucket``, the first capped at ``first`` (PyTorch DDP: 1 MiB) when given."""
    total = floats(total)
    head = np.minimum(total, first) if first is not None else np.zeros_like(total)
    rest = total - head
    size = np.minimum(bucket, np.maximum(rest, 1.0))
    full = np.floor(rest / size)
    return head, full, size, rest - full * size


def ring_pricer(coll, rpn, nodes):
    """``price(collective, nbytes)``: seconds of one ring collective over the group (``hierarchical_time``)."""
    def price(collective, nbytes):
        return hierarchical_time(coll, collective, nbytes, rpn, nodes, algorithm="ring")
    if np.ndim(rpn) or np.ndim(nodes):  # groups over a grid: a bucket list's sizes in one call
        price.stacked = lambda collective, sizes: stacked_time(coll, collective, sizes, rpn, nodes)
    return price


def _bucketed(price, collective, total, bucket, first=None):
    """(all buckets' seconds, last bucket's seconds, first bucket's share) for bytes in buckets.

    ``price(collective, nbytes)`` prices one bucket's collective (``ring_pricer``, or a sympy twin);
    ``first`` caps the first bucket (PyTorch DDP: 1 MiB, so communication starts early in backward).
    """
    return _bucket_lists(price, collective, [(total, bucket, first)])[0]


def _bucket_lists(price, collective, lists):
    """``[_bucketed(price, collective, total, bucket, first) for total, bucket, first in lists]``; with a
    ``ring_pricer`` every list's sizes are priced in one call (``stacked_time``)."""
    splits = [_split(total, bucket, first) for total, bucket, first in lists]

    def seconds(nbytes, present):
        t = price(collective, np.maximum(nbytes, 1.0))
        return where(present, t, 0.0) if is_symbolic(t) else t * present

    if hasattr(price, "stacked"):  # numbers
        flat = price.stacked(collective, [np.maximum(x, 1.0) for head, _, size, rem in splits for x in (head, size, rem)])
        times = [(flat[3 * i] * (head > 0), flat[3 * i + 1] * (full > 0), flat[3 * i + 2] * (rem > 0))
                 for i, (head, full, _, rem) in enumerate(splits)]
    else:
        times = [(seconds(head, head > 0), seconds(size, full > 0), seconds(rem, rem > 0))
                 for head, full, size, rem in splits]
    out = []
    for (total, _, _), (head, full, size, rem), (t_head, t_bucket, t_rem) in zip(lists, splits, times):
        last = where(rem > 0, t_rem, where(full > 0, t_bucket, t_head))
        share = pick(head > 0, head, size) / np.maximum(np.asarray(total, float), 1.0)
        out.append((t_head + full * t_bucket + t_rem, last, share))
    return out


def ddp_buckets(total_bytes, bucket):
    """How many buckets PyTorch DDP reduces: the first of 1 MiB, then ``bucket`` bytes each."""
    head, full, _, rem = _split(total_bytes, bucket, DDP_FIRST_BUCKET_BYTES)
    return (head > 0) + full + (rem > 0)


def overlapped_cost(comm_s, window_s, slowdown=0.0):
    """Seconds communication adds to a step when it runs beside ``window_s`` of compute: the
    part the compute cannot hide, plus the compute's own slowdown over the seconds both run,
    max(c - w, 0) + slowdown · min(c, w) (NCCL's kernels take SMs and memory bandwidth from the
    compute beside them; Lee et al. 2025, arXiv 2507.03114, measure the slowdown)."""
    return maximum(comm_s - window_s, 0.0) + slowdown * minimum(comm_s, window_s)


def _overlapped(all_s, last_s, first_share, window_s, slowdown=0.0):
    """Exposed seconds of bucketed communication issued while ``window_s`` of compute runs.

    PyTorch DDP (Li et al. 2020, VLDB, §3.2): a bucket leaves when its gradients are
    ready, so communication starts after the first bucket's share of backward and the
    last bucket always waits for the end of backward. ``slowdown``: see ``overlapped_cost``.
    """
    window = window_s * (1.0 - first_share)
    hidden = all_s - last_s  # every bucket but the last can run beside the backward
    return maximum(last_s, all_s - window) + slowdown * minimum(hidden, window)


def ddp_time(coll, lay, c: StepConfig, params, window_s, grad_bytes=4.0, *, price=None, slowdown=0.0):
    """PyTorch DDP: bucketed all-reduce of fp32 gradients, once per step (no_sync before).

    Gradient accumulation communicates only in the last micro-batch's backward
    (``DistributedDataParallel.no_sync``), so only that backward hides it.
    Volume: 2Ψ elements per rank (ring all-reduce; Rajbhandari et al. 2020, §7.1).
    ``price``: how one bucket's all-reduce is priced (default ``ring_pricer`` over ``lay["dp"]``).
    """
    price = price or ring_pricer(coll, *lay["dp"])
    whole = (params * grad_bytes, c.bucket_bytes, DDP_FIRST_BUCKET_BYTES)
    if not chunk_reduces(c):
        return _overlapped(*_bucketed(price, "all_reduce", *whole), window_s, slowdown)
    # Megatron-Core's DDP over its grad buffer: one buffer per model chunk, no 1 MiB first bucket
    buckets, chunk = _bucket_lists(price, "all_reduce", [whole, (params * grad_bytes / c.virtual_stages,
                                                                 c.bucket_bytes, None)])
    plain = _overlapped(*buckets, window_s, slowdown)
    return pick(c.virtual_stages > 1, chunked_exposed(*chunk, window_s, c, slowdown), plain)


# PyTorch DDP: copy each gradient into its bucket, divide by the world size, copy it back.
# Megatron-LM accumulates gradients in its contiguous buffer (main_grad) and only scales it.
# DeepSpeed (ZeRO-0) flattens each bucket, divides it and copies it back (engine.allreduce_bucket): 3.
DDP_BUCKET_PASSES = {"pytorch": 3, "megatron": 1, "deepspeed": 3}


def ddp_bucket_passes(copy_s, params, framework="pytorch"):
    """Seconds of DDP's memory passes over the gradients (PyTorch reducer, default
    ``gradient_as_bucket_view=False``: gradients are copied into flat buckets, the bucket is
    divided by the group size before its all-reduce, and the result is copied back into the
    gradients when backward finishes). ``copy_s(elements)`` prices one fp32 copy."""
    return DDP_BUCKET_PASSES.get(framework, 3) * copy_s(params)


def zero12_time(coll, lay, c: StepConfig, params, window_s, grad_bytes=4.0, param_bytes=4.0, slowdown=0.0, *,
                forward_s=0.0, index=0.0):
    """ZeRO-1/2: reduce-scatter gradients, update the shard, all-gather the parameters.

    Rajbhandari et al. 2020, §7.2.1: Ψ (reduce-scatter) + Ψ (all-gather) = the DDP
    volume. ZeRO-1 (Megatron-LM's distributed optimizer) accumulates full gradients and
    reduce-scatters once per step; ZeRO-2 keeps only its gradient shard, so it must
    reduce-scatter in every micro-batch's backward (``dp_collectives``). DeepSpeed waits for
    each micro-step's reduction (``stage_1_and_2.independent_gradient_partition_epilogue``
    synchronizes), so each hides only behind its own backward; ``framework="megatron"`` issues
    them asynchronously beside the rest of the step (``streamed_exposed``). The all-gather follows
    the optimizer. ``forward_s``/``index``: the stage's forward per micro-batch and its position,
    which set the compute after its first backward (``streamed_exposed``).
    """
    rpn, nodes = lay["dp"]
    price = ring_pricer(coll, rpn, nodes)
    pieces = _reduce_pieces(price, c, params * grad_bytes)  # the bucket lists, shared by the terms below
    once = _reduce_once(price, c, params * grad_bytes, window_s, slowdown, pieces)
    per_step = c.micro_batches * once
    if stack(c.framework).grad_buffer:
        total = pieces[0][0]
        tail = _reduce_once(price, c, params * grad_bytes, window_s, pieces=pieces)  # its slowdown: over all m
        per_step = streamed_exposed(tail, c.micro_batches * total, window_s, forward_s, c, index, slowdown)
    reduce = pick(c.shard_stage >= 2, per_step, once)
    gather, = stacked_time(coll, "all_gather", [params * param_bytes], rpn, nodes)
    if stack(c.framework).grad_buffer:
        gather = pick(c.shard_stage >= 2, prefetched_gather(gather, forward_s, c, index, slowdown), gather)
    return reduce + gather


def _reduce_pieces(price, c: StepConfig, nbytes):
    """(the whole gradients' reduce-scatter buckets, one model chunk's or None) (``_bucketed``)."""
    if not chunk_reduces(c):
        return _bucketed(price, "reduce_scatter", nbytes, c.bucket_bytes), None
    whole, chunk = _bucket_lists(price, "reduce_scatter", [(nbytes, c.bucket_bytes, None),
                                                           (nbytes / c.virtual_stages, c.bucket_bytes, None)])
    return whole, chunk


def _reduce_once(price, c: StepConfig, nbytes, window_s, slowdown=0.0, pieces=None):
    """Exposed seconds of one bucketed reduce-scatter of ``nbytes`` behind the last backward
    (``_overlapped``), per model chunk under Megatron's interleaved schedule (``chunked_exposed``).
    ``pieces``: ``_reduce_pieces`` of the same arguments where they were priced already."""
    whole, chunk = pieces or _reduce_pieces(price, c, nbytes)
    once = _overlapped(*whole, window_s, slowdown)
    if chunk is None:
        return once
    chunked = chunked_exposed(*chunk, window_s, c, slowdown)
    return pick(c.virtual_stages > 1, chunked, once)


def chunk_reduces(c: StepConfig) -> bool:
    """Whether gradients are reduced per model chunk of the interleaved schedule: Megatron-LM
    core_r0.9.0 (``schedules.forward_backward_pipelining_with_interleaving`` enables grad sync in
    each chunk's last micro-batch backward; ``DistributedDataParallel`` keeps one buffer per chunk)."""
    v = c.virtual_stages
    return stack(c.framework).grad_buffer and bool(v > 1 if type(v) in (int, float) else np.any(np.asarray(v) > 1))


def chunked_exposed(all_c, last_c, share_c, window_s, c: StepConfig, slowdown=0.0):
    """Exposed seconds of one reduction of a stage's v model chunks under the interleaved schedule.

    ``all_c``/``last_c``/``share_c``: one chunk's buckets (``_bucketed`` over 1/v of the
    gradients); ``window_s``: the stage's backward per micro-batch, w = window/v per chunk.
    Megatron-LM core_r0.9.0 runs the backwards of the last group of g = min(m, p) micro-batches
    chunk by chunk, last chunk first, and starts a chunk's buckets in its last backward, so
    chunk k leaves when k·g·w of backward remain. On one stream the reduction ends at
    max(chunk 0 behind its own backward, 2T_c − g·w, v·T_c − (v − 1)·g·w) after the backward
    (the FIFO finish max_k ((k+1)T_c − k·g·w) is linear in k). v = 1: ``_overlapped``.
    """
    v = np.maximum(c.virtual_stages, 1.0)
    w = window_s / v
    group = np.minimum(c.micro_batches, c.pp)
    own = _overlapped(all_c, last_c, share_c, w)
    queued = maximum(2.0 * all_c - group * w, v * all_c - (v - 1.0) * group * w)
    exposed = pick(v > 1, maximum(own, queued), own)
    return slowed(exposed, v * all_c, slowdown)


def streamed_exposed(last_s, total_s, backward_s, forward_s, c: StepConfig, index, slowdown=0.0):
    """Exposed seconds of per-micro-batch reductions issued asynchronously beside the whole step.

    Llama 3 (arXiv 2407.21783, §3.3.2): FSDP shards the gradients, reduce-scatters them in fp32
    and "can tolerate longer network latency by asynchronously ... reducing gradients". On one
    stream the m reductions (``total_s``) can use the compute that follows the stage's first
    backward: the forwards after its warm-up (``pipeline.in_flight`` of the m micro-batches run
    before it) and all backwards but the first chunk's, W = (m − warm)·f + (m − 1/v)·b; the last
    micro-batch's reduction (``last_s``) still follows the last backward: max(last, total − W).
    """
    m, v = c.micro_batches, np.maximum(c.virtual_stages, 1.0)
    warm = np.minimum(in_flight(c, index), m)
    window = (m - warm) * forward_s + (m - 1.0 / v) * backward_s + pipeline_waits(forward_s, c, index)
    exposed = maximum(last_s, total_s - window)
    return slowed(exposed, total_s, slowdown)


def _shard_group(lay, c):
    """(ranks_per_node, nodes) of the ZeRO-3 sharding group: the node's dp ranks when hybrid."""
    rpn, nodes = lay["dp"]
    return rpn, pick(c.hybrid, 1.0, nodes)


def fsdp_reduce_bytes(framework: str, lo: float, grad_reduce_fp32=None) -> float:
    """Bytes per gradient element an FSDP reduce-scatter moves: the stack's ``reduce_dtype``, or the one
    ``Strategy.grad_reduce_fp32`` names (``workload.stacks.gradient_reduce_bytes``).

    torchtitan v0.2.2 (``config/job_config.py``: ``mixed_precision_reduce = "float32"``; FSDP2
    ``_fsdp_collectives.foreach_reduce`` reduce-scatters in ``reduce_dtype``): 4 B, twice the bf16
    gather. FSDP1 ``MixedPrecision(param_dtype=bf16)`` without ``reduce_dtype`` reduces in
    ``param_dtype`` (``fully_sharded_data_parallel.py``), as accelerate and Composer set it: 2 B.
    Other stacks (DeepSpeed ZeRO-3, plain FSDP over autocast): the gather's ``lo``.
    """
    return gradient_reduce_bytes(framework, grad_reduce_fp32) if stack(framework).sharding in ("fsdp1", "fsdp2") else lo


def zero3_time(coll, lay, c: StepConfig, units, lo, starts_with_embedding, slowdown=0.0, fp8_gathered=0.0):
    """ZeRO-3 / FSDP: per-unit all-gathers (forward, backward) and reduce-scatters, per micro-batch.

    Rajbhandari et al. 2020, §7.2.2: all-gather Ψ forward, Ψ again backward,
    reduce-scatter Ψ: 3Ψ, 1.5x DDP. PyTorch FSDP (Zhao et al. 2023, §3.3) prefetches
    the next unit's all-gather behind the current unit's compute; in backward the
    gather and the previous unit's reduce-scatter share one stream. Only the first
    unit's gather (forward) and the last reduce-scatter (backward) cannot hide.
    HYBRID_SHARD shards inside the node and all-reduces each gradient shard across
    nodes (S/r on each rail). Parameters move in the low precision, gradients in the
    stack's reduce dtype (``fsdp_reduce_bytes``). Without no_sync this repeats
    for every micro-batch.

    PyTorch FSDP (``c.fsdp``) gathers a unit's flat parameter in one collective;
    DeepSpeed ZeRO-3 gathers a block's ``DS_BLOCK_GATHERS`` weights one collective each
    (each paying the collective's latency, which grows with the ring's n − 1 steps), the
    embedding and the head in one each.

    ``c.dp_overlap`` False: every gather and reduce-scatter waits for compute and compute for it, as in DeepSpeed
    ZeRO-3 before mid-2021 (its gather launch synchronized the device: DeepSpeed #1069, PR #1188): all exposed.

    ``units``: dict name -> (count, params per unit, forward s, backward s) for
    "layer", "embed", "head"; the embedding unit runs first when present. ``fp8_gathered``: a block's
    parameters gathered in fp8, 1 byte each (``workload/stacks/float8.fp8_gathered``).
    """
    rpn, nodes = _shard_group(lay, c)
    dp_rpn, dp_nodes = lay["dp"]
    hybrid = np.asarray(c.hybrid, bool) & (dp_nodes > 1)
    overlap = np.asarray(c.dp_overlap, bool)
    hide = pick(overlap, 1.0, 0.0)  # without overlap no compute hides a collective
    hidden = lambda s: rows_inner(hide * s)  # noqa: E731 (the compute beside a unit's collectives)
    fwd = bwd = 0.0
    ag, rs = {}, {}
    fsdp = np.asarray(c.fsdp, bool)
    reduce_lo = fsdp_reduce_bytes(c.framework, lo, c.grad_reduce_fp32)
    pieces = {name: pick(fsdp, 1.0, DS_BLOCK_GATHERS if name == "layer" else 1.0) for name in units}
    size = [units[name][1] * lo / pieces[name] for name in units]
    grads = [s * reduce_lo / lo for s in size]  # the reduce-scatter moves the reduce dtype (fsdp_reduce_bytes)
    size[0] = size[0] - np.multiply(fp8_gathered, lo - 1.0) / pieces["layer"]  # "layer" first: 1 B, not lo
    # each collective of all units in one call (``stacked_time``)
    gathers = stacked_time(coll, "all_gather", size, rpn, nodes)
    scatters = stacked_time(coll, "reduce_scatter", grads, rpn, nodes)
    across = stacked_time(coll, "all_reduce", [g / dp_rpn for g in grads], 1.0, dp_nodes, algorithm="hierarchical")
    shapes = []  # of the units this stage does not hold: 0 × finite seconds, not computed
    for i, (name, (count, _, f_s, b_s)) in enumerate(units.items()):
        ag[name] = pieces[name] * gathers[i]
        rs[name] = pieces[name] * (scatters[i] + pick(hybrid, across[i], 0.0))
        if np.ndim(count) == 0 and count == 0:
            shapes.append(np.broadcast_shapes(*(np.shape(x) for x in (ag[name], rs[name], hide, f_s, b_s))))
            continue
        fwd = fwd + count * overlapped_cost(ag[name], hidden(f_s), slowdown)
        bwd = bwd + count * overlapped_cost(ag[name] + rs[name], hidden(b_s), slowdown)
    # with prefetching, the first gather and the last reduce-scatter have no compute beside them;
    # without overlap they are already counted in full above
    first_gather = pick(starts_with_embedding, ag["embed"], ag["layer"])
    last_reduce = pick(starts_with_embedding, rs["embed"], rs["layer"])
    out = c.micro_batches * (hide * (first_gather + last_reduce) + fwd + bwd)
    shape = np.broadcast_shapes(np.shape(out), *shapes)
    return out if shape == np.shape(out) else np.broadcast_to(out, shape).copy()


def ps_time(c: StepConfig, params, window_s, links, grad_bytes=4.0):
    """Parameter server: workers push fp32 gradients, then pull fp32 weights.

    Li et al. 2014 (OSDI), synchronous: each of S servers holds 1/S of the weights, so
    it receives W·P/S bytes per step through its NICs; a worker sends its P bytes
    through its share of its node's NICs. One direction takes
    max(W·P/(S·B_server), P/B_worker) + latency. Pushes leave while backward runs (as
    DDP buckets); the pull waits for the update and is exposed. NICs are full duplex,
    so the push and pull directions do not share bandwidth.
    """
    workers, servers = c.dp, np.maximum(c.ps_servers, 1.0)
    size = params * grad_bytes
    one_way = size * np.maximum(workers / (servers * links["server"]), 1.0 / links["worker"]) + links["latency"]
    if c.ps_local_reduce:  # one push per machine through its NICs, after the GPUs' sum over PCIe
        one_way = size * np.maximum(workers / (links["gpus_per_node"] * servers * links["server"]),
                                    np.maximum(1.0 / links["node"], 1.0 / links["local"])) + links["latency"]
    share = np.minimum(1.0, c.bucket_bytes / np.maximum(size, 1.0))
    push = _overlapped(one_way, one_way * share, share, window_s)
    return push + one_way


# FSDP2 (torch _fully_shard, pytorch/pytorch 010ae4a8 _fsdp_collectives.py; 002a76fb _fsdp_param_group.py):
# on the compute stream, each unshard's ``foreach_all_gather_copy_out`` (split_with_sizes_copy: read the
# bf16 all-gather output, write the unsharded parameters, 2 + 2 B per element; in ``wait_for_unshard``,
# called by pre_forward and, after reshard_after_forward, again by pre_backward) and each backward's
# ``foreach_reduce`` copy-in (_chunk_cat of the bf16 gradients into the fp32 reduce_dtype buffer, 2 + 4 B,
# before ``reduce_scatter_stream.wait_stream(current_stream)``), in fp32-copy units of 8 B per element
FSDP2_COPY_PASSES = 2 * (2 + 2) / 8 + (2 + 4) / 8


def fsdp2_copy_passes(copy_s, params, c: StepConfig):
    """Seconds per step of FSDP2's copies on the compute stream around its collectives (one copy-out per
    unshard, forward and backward, and the reduce-scatter's copy-in; :data:`FSDP2_COPY_PASSES` fp32 copies
    of the rank's parameters per micro-batch). Zero for other stacks, or when ``copy_s`` is None."""
    if copy_s is None or stack(c.framework).sharding != "fsdp2":
        return 0.0
    return c.micro_batches * FSDP2_COPY_PASSES * copy_s(params)


def ddp_exposed(coll, lay, c: StepConfig, params, window_s, nb: WireBytes, buckets: BucketCosts, *, price=None,
                slowdown=0.0):
    """PyTorch DDP's exposed seconds: its bucketed all-reduce (``ddp_time``), a host's cost per
    bucket and the reducer's passes over the buckets (``ddp_bucket_passes``)."""
    return (ddp_time(coll, lay, c, params, window_s, nb.grad, price=price, slowdown=slowdown)
            + buckets.extra_s * ddp_buckets(params * nb.grad, c.bucket_bytes)
            + (0.0 if buckets.copy_s is None else ddp_bucket_passes(buckets.copy_s, params, c.framework)))


def _stage_exposed(coll, lay, c: StepConfig, work: DataParallelWork, st: Stage, backward, links,
                   buckets: BucketCosts):
    """Exposed data-parallel seconds of one stage's group, before the drain slack."""
    p, t, nb = work.params, work.times, work.wire
    window = rows_inner(pick(c.dp_overlap, backward, 0.0))  # compute the reduction can hide behind
    forward = pick(window > 0, t.on(st, "f"), 0.0)
    params = st.params(p, c.tp)
    units = {"layer": (st.layers, p.layer / c.tp, t.layer_f, t.layer_b),
             "embed": (pick(st.embed, 1.0, 0.0), p.embed / c.tp, t.embed_f, t.embed_b),
             "head": (pick(st.head, 1.0, 0.0), p.head / c.tp, t.head_f, t.head_b)}
    slow = work.overlap_slowdown
    shard = by_sharding(c, (lambda cc: ddp_exposed(coll, lay, cc, params, window, nb, buckets, slowdown=slow),
                            lambda cc: zero12_time(coll, lay, cc, params, window, nb.grad, gather_bytes_per_param(
                                nb.param, params, st.layers * p.gemm_layer / cc.tp, cc.fp8_params, cc.framework), slow,
                                forward_s=forward, index=st.index),
                            lambda cc: zero3_time(coll, lay, cc, units, nb.activation, st.embed, slow,
                                                  fp8_gathered=fp8_gathered(cc.fp8_params, cc.framework, p.gemm_layer / cc.tp))
                            + fsdp2_copy_passes(buckets.copy_s, params, cc)), (window, forward))
    if np.ndim(c.ps_servers) == 0 and not c.ps_servers > 0:  # no parameter server: its branch not priced
        shapes = [np.shape(x) for x in (shard, c.dp, c.bucket_bytes, params, backward, *links.values())]
        shape = np.broadcast_shapes(*shapes) if any(shapes) else ()  # all one number: ()
        out = shard if np.shape(shard) == shape else np.broadcast_to(shard, shape)
    else:
        out = pick(c.ps_servers > 0, ps_time(c, params, backward, links, nb.grad), shard)
    return pick((c.dp > 1) | (c.ps_servers > 0), out, 0.0)


def by_sharding(c: StepConfig, branches, others=()):
    """``pick(c.shard_stage >= 3, zero3(c), pick(c.shard_stage >= 1, zero12(c), ddp(c)))`` of
    ``branches`` (ddp, zero12, zero3: functions of a configuration); where the sharding stages lie along
    one axis in ascending order (a search grid, ``explore/space.py``) and nothing else given (the
    configuration's other fields, ``others``) varies along it, each branch is priced only on the
    stages it applies to: the same numbers per configuration, without the other branches' work. One
    configuration (``predict``) prices its own branch alone."""
    ddp, zero12, zero3 = branches
    z = np.asarray(c.shard_stage)
    if z.ndim == 0 and z.dtype.kind in "iubf" and not any(np.ndim(x) for x in others):
        one = np.asarray((zero3 if z >= 3 else zero12 if z >= 1 else ddp)(c))
        if one.ndim == 0:  # what np.where picks for it (the other branches' shapes would not widen it)
            return one
    axes = [i for i, n in enumerate(z.shape) if n > 1]
    if len(axes) != 1 or np.any(np.diff(z.reshape(-1)) < 0) or any(
            np.ndim(x) == z.ndim and np.shape(x)[axes[0]] > 1 for x in others):
        return pick(c.shard_stage >= 3, zero3(c), pick(c.shard_stage >= 1, zero12(c), ddp(c)))
    a, n = axes[0], z.shape[axes[0]]
    along = [f.name for f in fields(c) if isinstance(getattr(c, f.name), np.ndarray)
             and getattr(c, f.name).ndim == z.ndim and getattr(c, f.name).shape[a] == n]
    cuts = [0, int(np.searchsorted(z.reshape(-1), 1)), int(np.searchsorted(z.reshape(-1), 3)), n]
    parts = []
    for (lo, hi), price in zip(zip(cuts, cuts[1:]), branches):
        if hi > lo:
            index = (slice(None),) * a + (slice(lo, hi),)
            parts.append((index, np.asarray(price(replace(c, **{f: getattr(c, f)[index] for f in along})))))
    padded = [(1,) * (z.ndim - r.ndim) + r.shape for _, r in parts]
    shape = list(np.broadcast_shapes(*(tuple(1 if i == a else m for i, m in enumerate(p)) for p in padded),
                                     (1,) * z.ndim))
    shape[a] = n
    out = np.empty(shape)
    for index, r in parts:
        out[index] = r
    return out


def dp_comm_time(coll, lay, c: StepConfig, work: DataParallelWork, links, buckets: BucketCosts | None = None,
                 first=None):
    """Exposed data-parallel seconds per step (DDP, ZeRO-1/2/3, FSDP hybrid, parameter server).

    Each stage's data-parallel group communicates its own parameters; the step ends
    when the slowest finishes. A stage other than the first finishes its last backward
    earlier (by the drain of the stages before it), which hides part of its traffic.
    ``links``: the parameter-server links (``fabric.parameter_server_links``); ``first``: the first
    stage's ``_stage_exposed`` where it was priced already (a search's floor), else None.
    """
    buckets = BucketCosts() if buckets is None else buckets
    worst = 0.0
    for i, (st, backward) in enumerate(zip(work.stages, work.backward_s)):
        given = first is not None and i == 0
        out = first if given else _stage_exposed(coll, lay, c, work, st, backward, links, buckets)
        slack = st.index * backward  # the stages before it still drain their last backward
        exposed = np.maximum(out - pick(c.shard_stage >= 3, 0.0, slack), 0.0)
        worst = np.maximum(worst, pick(st.valid, exposed, 0.0))
    return worst
