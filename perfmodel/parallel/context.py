"""Context parallelism (ring attention): the extra attention blocks and the K/V ring exchange."""

from __future__ import annotations

import numpy as np

from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.pipeline import PhaseTimes, sendrecv_time
from perfmodel.parallel.wire import wire_bytes
from perfmodel.workload.ops import Kernel


def ring_attention(kernels, cp: int, causal: bool) -> list[Kernel]:
    """The attention blocks a context-parallel rank computes beyond its own (Liu et al. 2023, ring attention).

    With the sequence in 2·cp chunks, rank i holding chunks i and 2·cp − 1 − i (Megatron-Core's
    load balancing for causal masks), each rank's own q·kᵀ block is the local causal attention
    over s/cp tokens; each of the cp − 1 blocks it receives is half a full s/cp × s/cp block when
    causal, a whole one otherwise. FLOPs follow the full-s² convention, so a rank's attention
    FLOPs are 1/cp of the whole sequence's.
    """
    out = []
    for k in kernels:
        if k.cls != "sdpa" or cp <= 1:
            continue
        share = 0.5 if causal else 1.0
        out.append(Kernel(k.name + ".ring", k.cls, k.phase, {**k.size, "causal": 0.0},
                          np.multiply(k.count, (cp - 1) * share), np.divide(k.flops, share), k.variant, k.dtype))
    return out


def cp_comm_times(model, coll, lay, c: StepConfig, *, precision, recompute, ring_gpu_s) -> PhaseTimes:
    """Context-parallel ring exchange per micro-batch and layer, the part no attention block hides.

    Ring attention (Liu et al. 2023; Megatron-Core / Transformer Engine context parallelism):
    in forward each of the cp − 1 steps passes the rank's K and V chunk (2·b·(s/cp)·kv_heads·d
    elements) to the next rank while the current block computes; backward passes K, V and their
    gradients (twice the bytes) beside each backward block, after the recomputed forward ring
    when the attention core is recomputed. ``model`` holds the rank's s/cp tokens;
    ``ring_gpu_s``: GPU seconds of the ring's attention blocks per layer, (forward, backward).
    """
    if c.cp <= 1:
        return PhaseTimes()
    lo = wire_bytes(precision).activation
    kv = 2.0 * c.micro_batch * model.seq * model.kv_heads / c.tp * model.head_dim * lo
    inter = np.asarray(lay["cp"][1]) > 1  # the ring leaves the node
    send = np.where(inter, sendrecv_time(coll, "inter", kv), sendrecv_time(coll, "intra", kv))
    both = np.where(inter, sendrecv_time(coll, "inter", 2 * kv), sendrecv_time(coll, "intra", 2 * kv))
    n = c.cp - 1.0
    again = recompute in ("selective", "full")  # the attention core runs forward again in backward
    ring_f, ring_b = ring_gpu_s
    block_f = np.asarray(ring_f, float) / n
    block_b = (np.asarray(ring_b, float) - (ring_f if again else 0.0)) / n
    fwd = n * np.maximum(send - block_f, 0.0)
    return PhaseTimes(layer_f=fwd, layer_b=n * np.maximum(both - block_b, 0.0) + (fwd if again else 0.0))
