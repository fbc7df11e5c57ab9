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

NeMo's performance recipes (NVIDIA/NeMo v2.1.0, ``nemo/collections/llm/recipes/tp_overlap_configs/
userbuffers.py``, passed by ``llama3_70b.py`` / ``gpt3_175b.py`` ``pretrain_performance_optimizations``)
replace those defaults with hand-tuned H100 tables: the bulk overlaps on 2–24 SMs without an SM
margin (``set_sm_margin=False``: the GEMM keeps every SM and shares them only while the collective
runs), the pipelined ones on 8–24 SMs (``tp_comm_overlap="userbuffers-nemo"``, ``NEMO_H100``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

UB_SMS = 16           # TE get_default_config: num_sm of the pipeline and bulk methods
UB_PIPELINE_SPLITS = 4  # TE get_default_config: num_splits of the pipeline method


@dataclass(frozen=True)
class UbOverlap:
    """One GEMM's userbuffers overlap as a TE ``ub_cfgs`` entry states it."""

    method: str          # "ring_exchange", "pipeline" or "bulk"
    num_sm: int = 1      # SMs of the communication kernel
    sm_margin: bool = False  # True: the GEMM runs on the other SMs throughout (``set_sm_margin``)
    splits: int = UB_PIPELINE_SPLITS


_RING, _TE_SPLIT = UbOverlap("ring_exchange"), UbOverlap("pipeline", UB_SMS, True)
_TE_BULK = UbOverlap("bulk", UB_SMS, True)
# TE get_default_config (fecb10b): ring exchange for the all-gather GEMMs, 16 SMs with margin otherwise
TE_DEFAULT = {"qkv": _RING, "fc1": _RING, "proj.dgrad": _RING, "fc2.dgrad": _RING, "proj": _TE_SPLIT,
              "fc2": _TE_SPLIT, "qkv.dgrad": _TE_BULK, "qkv.wgrad": _TE_BULK, "fc1.dgrad": _TE_BULK,
              "fc1.wgrad": _TE_BULK}


def _nemo(qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad, proj, fc2):
    """A NeMo H100 table: bulk SMs without margin (qkv/fc1 dgrad, wgrad), the proj/fc2 forward overlaps."""
    bulk = {k: UbOverlap("bulk", n, False) for k, n in
            (("qkv.dgrad", qkv_dgrad), ("qkv.wgrad", qkv_wgrad), ("fc1.dgrad", fc1_dgrad), ("fc1.wgrad", fc1_wgrad))}
    return {**TE_DEFAULT, **bulk, "proj": proj, "fc2": fc2}


# NeMo v2.1.0 tp_overlap_configs/userbuffers.py, H100 (bf16 and fp8 tables give the same SMs), by hidden size
NEMO_H100 = {
    8192: _nemo(4, 24, 2, 4, UbOverlap("pipeline", 24, True), UbOverlap("pipeline", 16, True)),   # h8192 tp4
    12288: _nemo(4, 4, 2, 4, UbOverlap("pipeline", 24, True), UbOverlap("ring_exchange", 1, True)),  # h12288 tp4
    16384: _nemo(2, 24, 2, 2, UbOverlap("pipeline", 24, True), UbOverlap("pipeline", 8, True)),   # h16384 tp8 cp2
    6144: _nemo(8, 16, 4, 16, UbOverlap("pipeline", 16, True), UbOverlap("pipeline", 24, True)),  # h6144 tp2
}


def ub_config(method: str, hidden: int) -> dict:
    """Per-GEMM overlaps of ``method``: NeMo's table for this hidden size under "userbuffers-nemo"
    (TE's defaults where NeMo has none, as its callback falls back), else TE's defaults."""
    return NEMO_H100.get(int(hidden), TE_DEFAULT) if method == "userbuffers-nemo" else TE_DEFAULT


def ring_exchange(comm_s, gemm_s, tp):
    """Exposed seconds of a collective split into tp − 1 transfers, each beside a 1/tp GEMM chunk."""
    tp = np.asarray(tp, float)
    return np.maximum(comm_s - gemm_s * (tp - 1.0) / tp, 0.0)


def slowed(gemm_s, sms, num_sm=UB_SMS):
    """A GEMM's seconds on ``sms`` − ``num_sm`` SMs (the communication kernels hold the rest)."""
    return gemm_s * sms / max(sms - num_sm, 1)


def shared(comm_s, gemm_s, sms, num_sm):
    """A GEMM's seconds on every SM but ``num_sm`` of them for as long as the collective runs beside it
    (``set_sm_margin=False``: the communication kernel takes its SMs only while it is resident)."""
    beside = np.minimum(comm_s, gemm_s)
    return gemm_s + beside * num_sm / max(sms - num_sm, 1)


def pipeline(comm_s, gemm_s, sms, num_sm=UB_SMS, splits=UB_PIPELINE_SPLITS, chunked_s=None):
    """Exposed seconds of TE's pipelined reduce-scatter (the last of the chunks waits), SM loss included;
    ``chunked_s``: the GEMM's seconds as its ``splits`` chunk GEMMs (None: as the whole one)."""
    g = slowed(gemm_s if chunked_s is None else chunked_s, sms, num_sm)
    rest = (splits - 1.0) / splits
    return comm_s / splits + np.maximum(comm_s * rest - g * rest, 0.0) + (g - gemm_s)


def bulk(comm_s, gemm_s, sms, num_sm=UB_SMS, sm_margin=True):
    """Exposed seconds of a collective beside a whole GEMM on ``num_sm`` SMs, SM loss included."""
    g = slowed(gemm_s, sms, num_sm) if sm_margin else shared(comm_s, gemm_s, sms, num_sm)
    return np.maximum(comm_s - g, 0.0) + (g - gemm_s)


def exposed(comm_s, gemm_s, o: UbOverlap, tp, sms, chunks=None):
    """Exposed seconds of one collective beside its GEMM under the overlap ``o``; ``chunks``: the GEMM's
    seconds run as chunks, ``{"ring": tp chunks of its tokens, "split": o.splits of its outputs}`` (None: as
    the whole GEMM), the time beyond the whole GEMM's counted as exposed."""
    chunks = chunks or {}
    if o.method == "pipeline":
        return pipeline(comm_s, gemm_s, sms, o.num_sm, o.splits, chunks.get("split"))
    if o.method == "bulk":
        return bulk(comm_s, gemm_s, sms, o.num_sm, o.sm_margin)
    ring = chunks.get("ring", gemm_s)
    g = slowed(ring, sms, o.num_sm) if o.sm_margin else ring  # ring exchange: copy engines
    return ring_exchange(comm_s, g, tp) + (g - gemm_s)


def overlapped_layer(ag_s, rs_s, gemms: dict, tp, sms, *, method="userbuffers", config=None, chunks=None):
    """(forward, backward) exposed tensor-parallel seconds of one block under sequence parallelism.

    ``gemms``: seconds of each linear's GEMMs, keys ``qkv``, ``proj``, ``fc1``, ``fc2`` with
    suffixes ``""`` (forward), ``".dgrad"``, ``".wgrad"``. Forward: all-gathers before qkv and
    fc1, reduce-scatters after proj and fc2; backward: the all-gathers of dy before proj and fc2
    dgrad, the re-gathered inputs beside qkv and fc1 dgrad, the input-gradient reduce-scatters
    beside qkv and fc1 wgrad (the six collectives of ``step.tp_comm_times`` without overlap).
    ``config``: each GEMM's ``UbOverlap`` (``ub_config``; TE's defaults when None). ``chunks``: name ->
    the GEMM's seconds as chunk GEMMs (``exposed``; None: priced as the whole GEMMs).
    """
    def g(name):
        return gemms[name]

    def c_of(name):
        return (chunks or {}).get(name)

    if method == "async":
        ring = [(ag_s, "qkv"), (rs_s, "proj"), (ag_s, "fc1"), (rs_s, "fc2")]
        # no re-gather (DTensor saved the gathered input); each input gradient's reduce-scatter is
        # fused with the dgrad matmul that produces it (fused_matmul_reduce_scatter)
        back = [(ag_s, "proj.dgrad"), (rs_s, "qkv.dgrad"), (ag_s, "fc2.dgrad"), (rs_s, "fc1.dgrad")]
        fwd = sum(exposed(c, g(n), _RING, tp, sms, c_of(n)) for c, n in ring)
        return fwd, sum(exposed(c, g(n), _RING, tp, sms, c_of(n)) for c, n in back)
    cfg = TE_DEFAULT if config is None else config
    pairs_f = (("qkv", ag_s), ("proj", rs_s), ("fc1", ag_s), ("fc2", rs_s))
    pairs_b = (("proj.dgrad", ag_s), ("qkv.dgrad", ag_s), ("qkv.wgrad", rs_s),
               ("fc2.dgrad", ag_s), ("fc1.dgrad", ag_s), ("fc1.wgrad", rs_s))
    fwd = sum(exposed(c, g(n), cfg[n], tp, sms, c_of(n)) for n, c in pairs_f)
    return fwd, sum(exposed(c, g(n), cfg[n], tp, sms, c_of(n)) for n, c in pairs_b)
