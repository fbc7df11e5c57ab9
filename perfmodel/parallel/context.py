"""Context parallelism (ring attention): the ring's attention blocks and merges, and the K/V exchange.

What each stack's ring does (kernel, rotation, merges) is stack data: ``perfmodel.workload.stacks.context``.
"""

from __future__ import annotations

import numpy as np

from perfmodel.costs.comm import hierarchical_time
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.pipeline import PhaseTimes, sendrecv_time
from perfmodel.parallel.wire import wire_bytes
from perfmodel.workload.ops import Kernel, mem as mem_kernel
from perfmodel.workload.stacks.context import RingPlan, ring_plan


def ring_attention(kernels, cp: int, causal: bool, plan: RingPlan | None = None) -> list[Kernel]:
    """The attention blocks (and merges) a context-parallel rank runs beyond its own causal block.

    Head-tail load balancing (torch ``_HeadTailLoadBalancer``, Transformer Engine
    ``AttnFuncWithCPAndKVP2P``): the sequence is cut into 2·cp chunks, rank i holding chunks i and
    2·cp − 1 − i. Step 0 is the rank's own causal block over its s/cp tokens (the layer's kernel);
    each of the cp − 1 later steps is non-causal over s/cp queries × s/(2cp) keys or s/(2cp)
    queries × s/cp keys: priced as two non-causal (s/2cp)² blocks (the same tiles and query rows).
    Without a causal mask each step is one whole s/cp block. FLOPs keep the full-s² convention
    (a block's count doubles its executed FLOPs when causal), so a rank's attention FLOPs are 1/cp
    of the sequence's. ``plan``: adds that implementation's output merges as memory-bound kernels.
    """
    out = []
    for k in kernels:
        if k.cls != "sdpa" or cp <= 1:
            continue
        seq = np.asarray(k.size["seq"], float)
        half = seq / 2.0 if causal else seq
        blocks = 2.0 if causal else 1.0
        share = 0.5 if causal else 1.0  # executed / full-convention FLOPs of the rank's own block
        flops = np.multiply(k.flops, (half / seq) ** 2 / share)
        out.append(Kernel(k.name + ".ring", k.cls, k.phase, {**k.size, "seq": half, "causal": 0.0},
                          np.multiply(k.count, (cp - 1) * blocks), flops, k.variant, k.dtype))
        if plan is not None:
            out.extend(ring_merges(k, cp, plan))
    return out


def ring_kernels(lf, lb, cp: int, causal: bool, framework: str, cp_comm: str | None = None) -> tuple:
    """(the ring's later steps forward, backward; the rank's own attention blocks forward, backward)
    of a layer whose kernels are ``lf``, ``lb``, as ``framework``'s ring with K/V exchange ``cp_comm``
    runs them (``ring_plan``)."""
    if cp <= 1:
        return [], [], [], []
    plan = ring_plan(framework, cp_comm)
    return (ring_attention(lf, cp, causal, plan), ring_attention(lb, cp, causal, plan),
            [k for k in lf if k.cls == "sdpa"], [k for k in lb if k.cls == "sdpa"])


def ring_merges(k: Kernel, cp: int, plan: RingPlan) -> list[Kernel]:
    """The merges of one ring pass of ``k`` (forward or backward), priced as fp32 copies (8 B per element).

    N = b·heads·(s/cp)·d output elements, N_kv = b·kv_heads·(s/cp)·d per K and V; bytes per element
    per step after the first: ``plan.merge_*`` (workload/stacks/context.py derives them from the code).
    """
    n_out = np.multiply(np.multiply(k.size["batch"], k.size["heads"]), k.size["seq"]) * k.size["head_dim"]
    n_kv = np.multiply(np.multiply(k.size["batch"], k.size["kv_heads"]), k.size["seq"]) * k.size["head_dim"]
    fwd = k.variant.rsplit(".", 1)[-1] == "fwd"
    per_step = (plan.merge_fwd * n_out + 2.0 * plan.merge_fwd_kv * n_kv) if fwd else \
        (plan.merge_bwd * n_out + 2.0 * plan.merge_bwd_kv * n_kv)
    once = plan.merge_once * n_out if fwd else 0.0
    moved = (cp - 1) * per_step + once
    if not np.any(np.asarray(moved) > 0):
        return []
    return [mem_kernel(k.name + ".ring_merge", "copy", k.phase, np.divide(moved, 8.0), count=k.count,
                       variant="fwd")]


def _ring_sends(model, coll, lay, c: StepConfig, plan: RingPlan, precision):
    """(seconds of one K/V send, of one K/V + dK/dV send, of the K/V all-gather, of one dK/dV send)."""
    lo = wire_bytes(precision).activation
    kv = 2.0 * c.micro_batch * model.seq * model.kv_heads / c.tp * model.attention_head_dim * lo
    grad = kv / lo * plan.grad_kv_bytes
    inter = np.asarray(lay["cp"][1]) > 1  # the ring leaves the node

    def send(size):
        return np.where(inter, sendrecv_time(coll, "inter", size), sendrecv_time(coll, "intra", size))

    gather = hierarchical_time(coll, "all_gather", c.cp * kv, *lay["cp"], algorithm="ring") \
        if plan.rotate.startswith("allgather") else 0.0
    return send(kv), send(kv + grad), gather, send(grad)


def _exposed_gather(model, coll, lay, c: StepConfig, plan: RingPlan, gather):
    """(forward, backward) seconds of an all-gather ring whose collectives no block hides (Transformer
    Engine ``AttnFuncWithCPAndKVAllGather``): the K/V gather before the blocks; backward gathers again
    and reduce-scatters the full-sequence dK/dV (nccl-tests S: the cp·(s/cp) K/V elements, 16-bit)."""
    grads = 2.0 * c.micro_batch * model.seq * model.kv_heads / c.tp * model.attention_head_dim * plan.grad_kv_bytes
    scatter = hierarchical_time(coll, "reduce_scatter", c.cp * grads, *lay["cp"], algorithm="ring")
    return gather, gather + scatter


def cp_comm_times(model, coll, lay, c: StepConfig, *, precision, recompute, ring_gpu_s, plan=None) -> PhaseTimes:
    """Context-parallel ring exchange per micro-batch and layer, the part no attention block hides.

    ``ring_gpu_s``: GPU seconds per layer of the ring's later steps (forward, backward) and,
    optionally, of the rank's own causal block (forward, backward); ``model`` holds the rank's
    s/cp tokens. "p2p" rings (Transformer Engine; Liu et al. 2023): each of the cp − 1 steps passes
    the K/V chunk (2·b·(s/cp)·kv_heads·d elements) beside one block; backward passes K/V and dK/dV.
    "allgather" rings (torch): forward gathers all K/V once, hidden by the own block only; backward
    gathers again and permutes the dK/dV accumulators cp times, each hidden by the next step's block
    and the last one exposed. "allgather-exposed" (TE's all-gather CP): ``_exposed_gather``. Under full or selective recomputation the forward ring runs again.
    """
    if c.cp <= 1:
        return PhaseTimes()
    plan = plan or ring_plan(c.framework, c.cp_comm)
    ring_f, ring_b, *own = ring_gpu_s
    own_f, own_b = own if own else (0.0, 0.0)
    n = c.cp - 1.0
    again = recompute in ("selective", "full")  # the attention core runs forward again in backward
    block_f = np.asarray(ring_f, float) / n
    block_b = (np.asarray(ring_b, float) - (ring_f if again else 0.0)) / n
    send, both, gather, grad = _ring_sends(model, coll, lay, c, plan, precision)
    if plan.rotate == "allgather-exposed":
        fwd, bwd = _exposed_gather(model, coll, lay, c, plan, gather)
    elif plan.rotate == "allgather":
        fwd = np.maximum(gather - np.asarray(own_f, float), 0.0)
        bwd = np.maximum(gather - (np.asarray(own_b, float) - (own_f if again else 0.0)), 0.0) \
            + (n - 1.0) * np.maximum(grad - block_b, 0.0) + grad
    else:
        fwd = n * np.maximum(send - block_f, 0.0)
        bwd = n * np.maximum(both - block_b, 0.0)
    return PhaseTimes(layer_f=fwd, layer_b=bwd + (fwd if again else 0.0))
