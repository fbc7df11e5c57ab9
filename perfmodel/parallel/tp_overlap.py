"""Tensor-parallel communication overlapped with the GEMMs it feeds: Transformer Engine userbuffers
(Megatron-Core ``--tp-comm-overlap``) and torchtitan's asynchronous tensor parallelism.

Transformer Engine (``transformer_engine/pytorch/module/base.py``, ``initialize_ub``,
``get_default_config``; NVIDIA/TransformerEngine fecb10b) overlaps each sequence-parallel
all-gather or reduce-scatter with the GEMM beside it, by one of three methods:

* ``ring_exchange`` (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad): the GEMM in tp chunks, each
  computed while the next chunk arrives over the copy engines (``num_sm = 1``, ``use_ce``);
* ``pipeline`` (proj_fprop, fc2_fprop): the GEMM in ``num_splits = 4`` chunks, each chunk's
  reduce-scatter running beside the next chunk on ``num_sm = 16`` SMs taken from the GEMM
  (``set_sm_margin``); the last chunk's stays exposed;
* ``bulk`` (qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad): the whole collective beside the whole
  GEMM, also on 16 SMs.

torchtitan ``enable_async_tensor_parallel`` (Inductor micro-pipelining with
``torch.distributed._symmetric_memory`` ``fused_all_gather_matmul`` /
``fused_matmul_reduce_scatter``) decomposes every all-gather + matmul and matmul +
reduce-scatter into tp chunks moved by the copy engines: ``ring_exchange`` for all of them. Its
backward has no re-gather (torchtitan v0.2.2 ``apply_tp``: the gathered input is saved), so four
pairs: the all-gathers of dy with proj/fc2 dgrad, the reduce-scatters of dx with qkv/fc1 dgrad.
"""

from __future__ import annotations

import numpy as np

UB_SMS = 16           # TE get_default_config: num_sm of the pipeline and bulk methods
UB_PIPELINE_SPLITS = 4  # TE get_default_config: num_splits of the pipeline method


def ring_exchange(comm_s, gemm_s, tp):
    """Exposed seconds of a collective split into tp − 1 transfers, each beside a 1/tp GEMM chunk."""
    tp = np.asarray(tp, float)
    return np.maximum(comm_s - gemm_s * (tp - 1.0) / tp, 0.0)


def slowed(gemm_s, sms):
    """A GEMM's seconds on ``sms`` − UB_SMS SMs (the communication kernels hold the rest)."""
    return gemm_s * sms / max(sms - UB_SMS, 1)


def pipeline(comm_s, gemm_s, sms):
    """Exposed seconds of TE's pipelined reduce-scatter (the last of 4 chunks waits), SM loss included."""
    g = slowed(gemm_s, sms)
    rest = (UB_PIPELINE_SPLITS - 1.0) / UB_PIPELINE_SPLITS
    return comm_s / UB_PIPELINE_SPLITS + np.maximum(comm_s * rest - g * rest, 0.0) + (g - gemm_s)


def bulk(comm_s, gemm_s, sms):
    """Exposed seconds of a collective beside a whole GEMM on 16 SMs, SM loss included."""
    g = slowed(gemm_s, sms)
    return np.maximum(comm_s - g, 0.0) + (g - gemm_s)


def overlapped_layer(ag_s, rs_s, gemms: dict, tp, sms, *, method="userbuffers"):
    """(forward, backward) exposed tensor-parallel seconds of one block under sequence parallelism.

    ``gemms``: seconds of each linear's GEMMs, keys ``qkv``, ``proj``, ``fc1``, ``fc2`` with
    suffixes ``""`` (forward), ``".dgrad"``, ``".wgrad"``. Forward: all-gathers before qkv and
    fc1, reduce-scatters after proj and fc2; backward: the all-gathers of dy before proj and fc2
    dgrad, the re-gathered inputs beside qkv and fc1 dgrad, the input-gradient reduce-scatters
    beside qkv and fc1 wgrad (the six collectives of ``step.tp_comm_times`` without overlap).
    """
    def g(name):
        return gemms[name]

    if method == "async":
        ring = [(ag_s, "qkv"), (rs_s, "proj"), (ag_s, "fc1"), (rs_s, "fc2")]
        # no re-gather (DTensor saved the gathered input); each input gradient's reduce-scatter is
        # fused with the dgrad matmul that produces it (fused_matmul_reduce_scatter)
        back = [(ag_s, "proj.dgrad"), (rs_s, "qkv.dgrad"), (ag_s, "fc2.dgrad"), (rs_s, "fc1.dgrad")]
        fwd = sum(ring_exchange(c, g(n), tp) for c, n in ring)
        return fwd, sum(ring_exchange(c, g(n), tp) for c, n in back)
    fwd = (ring_exchange(ag_s, g("qkv"), tp) + pipeline(rs_s, g("proj"), sms)
           + ring_exchange(ag_s, g("fc1"), tp) + pipeline(rs_s, g("fc2"), sms))
    bwd = (ring_exchange(ag_s, g("proj.dgrad"), tp) + bulk(ag_s, g("qkv.dgrad"), sms) + bulk(rs_s, g("qkv.wgrad"), sms)
           + ring_exchange(ag_s, g("fc2.dgrad"), tp) + bulk(ag_s, g("fc1.dgrad"), sms) + bulk(rs_s, g("fc1.wgrad"), sms))
    return fwd, bwd
