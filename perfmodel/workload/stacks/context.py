"""Context-parallel (ring) attention as each stack's code runs it: the kernel, the K/V rotation, the merges.

Three implementations are priced (``RING_PLANS``); ``ring_plan(framework, cp_comm)`` names the one a framework
uses (``Strategy.cp_comm``: the K/V exchange, ``CP_COMMS`` lists each stack's, its default first):

- ``"torch"``: ``torch.distributed.tensor.experimental.context_parallel`` (torch 2.13
  ``torch/distributed/tensor/experimental/_context_parallel/_attention.py``; torchtitan v0.2.2
  ``torchtitan/distributed/context_parallel.py`` applies it to every attention module).
  ``_templated_ring_attention`` runs cp SDPA calls per layer on the rank's s/cp tokens
  (head-tail load balancing, ``_HeadTailLoadBalancer``: step 0 causal on both local chunks, each
  later step non-causal on half the queries or half the keys) and merges each step's output
  with eager fp32 ops (``_SDPAMerger``, ``convert_to_f32=True``). K/V rotate by one all-gather
  issued before step 0 and waited at step 1 (torchtitan's default ``context_parallel_rotate_method
  = "allgather"``, ``_AllGatherRotater``); backward gathers K/V again and passes the fp32 dK/dV
  accumulators around the ring with all-to-all permutes (``dkv_rotater``, ``_RotateMethod.ALL_TO_ALL``),
  each waited one step later and the last one right after the loop.
- ``"te"``: Transformer Engine v2.1 ``AttnFuncWithCPAndKVP2P`` (``transformer_engine/pytorch/
  attention.py``, as Megatron-Core calls it): the same load-balanced steps, cuDNN fused attention
  each step (on two alternating streams), K/V passed by ``batch_isend_irecv`` while the step
  computes, the output corrected in the 16-bit output dtype by one fused kernel per step after the
  loop (``flash_attn_fwd_out_correction``); backward passes K/V and the 16-bit dK/dV together and
  adds each step's dQ and dK/dV in place.
- ``"te-all-gather"``: Transformer Engine v1.11 ``AttnFuncWithCPAndKVAllGather`` (Megatron-Core
  ``--cp-comm-type all_gather``; the scheme Llama 3 describes, Llama Team 2024 §3.3.2): K and V are
  all-gathered before any block ("KV all-gather between CP ranks is exposed", its docstring) and
  reordered by ``index_select``; each of the two local query chunks attends to the gathered keys up to
  its own end (the same executed work as the ring's steps); backward gathers K/V again, adds each
  chunk's dK/dV into full-sequence buffers and reduce-scatters them in the 16-bit dtype, exposed.
- torch's ``set_rotate_method("alltoall")`` (``_AllToAllRotater``): K/V permuted to the next rank each
  step, waited at the next step (priced as the p2p ring's per-step sends).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from perfmodel.core.checks import check_choice
from perfmodel.core.errors import InvalidInputError, UnsupportedError
from perfmodel.workload.stacks import stack


@dataclass(frozen=True)
class RingPlan:
    """How one implementation runs ring attention (bytes per element moved by its merges per ring step)."""

    name: str
    source: str
    rotate: str                 # "allgather": K/V gathered once per pass, waited at step 1; "p2p": one K/V chunk
    #                             per step; "allgather-exposed": gathered before any block (and dK/dV reduce-scattered)
    attention: str | None       # the SDPA backend the ring calls (None: the stack's own default)
    merge_fwd: float            # bytes per output element (b·heads·(s/cp)·d) per step after the first
    merge_fwd_kv: float         # bytes per K/V element (b·kv_heads·(s/cp)·d, K and V each) per step
    merge_once: float           # bytes per output element once per forward (the first cast, the last)
    merge_bwd: float            # bytes per dQ element per backward step
    merge_bwd_kv: float         # bytes per K/V element per backward step (dK/dV adds, the packed sends)
    grad_kv_bytes: float        # bytes per dK/dV element sent around the ring


# torch _SDPAMerger.step per non-first step, fp32 (N = output elements): out.to(fp32) 2 B in + 4 out,
# out - block_out 8 + 4, sigmoid(Δlse)·(…) 4 + 4 (the lse terms are N/d), out − … 8 + 4: 38 B; a
# "partial" step (second query half, about half the steps) does it on N/2 and torch.cat's the result
# back (8 B): 27 B; the mean of the two, 32.5 B. torch.cat of K and V for the send: 2 + 2 B per element.
# Backward per step: grad_query (fp32) += the step's bf16 dQ: 4 + 2 + 4 B; dK and dV likewise (10 B each
# K/V element), and torch.cat of the fp32 dK/dV for the permute (4 + 4) and of K/V for the gather (2 + 2).
TORCH_RING = RingPlan(
    "torch", "torch 2.13 torch/distributed/tensor/experimental/_context_parallel/_attention.py "
    "(_templated_ring_attention, _SDPAMerger, _AllGatherRotater); torchtitan v0.2.2 (73a0e69) "
    "torchtitan/distributed/context_parallel.py, config/job_config.py context_parallel_rotate_method",
    rotate="allgather", attention="flash2", merge_fwd=32.5, merge_fwd_kv=4.0, merge_once=12.0,
    merge_bwd=10.0, merge_bwd_kv=10.0 + 8.0 + 4.0, grad_kv_bytes=4.0)
# TE: after the steps, out (bf16) += out_step · exp(lse_step − lse) per step, one fused kernel (2 B read of
# out_step, 2 + 2 of out); backward dq.add_(dq_) and dkv.add_(dkv_) per step in the 16-bit dtype (2 + 2 + 2 B)
TE_RING = RingPlan(
    "te", "TransformerEngine v2.1 (450146a) transformer_engine/pytorch/attention.py AttnFuncWithCPAndKVP2P",
    rotate="p2p", attention=None, merge_fwd=6.0, merge_fwd_kv=0.0, merge_once=0.0,
    merge_bwd=6.0, merge_bwd_kv=6.0, grad_kv_bytes=2.0)
# TE v1.11 AttnFuncWithCPAndKVAllGather: forward index_select of the gathered K and V (2 B read + 2 written per
# gathered element, cp chunks: 4 B per local K/V element per step) and the copy of each chunk's output into out
# (2 + 2 B once); backward index_select of K/V again (4), the full-length dK/dV zeros (2), each chunk's add_
# (2 + 2 + 2), its movedim().contiguous() (2 + 2) and the index_select before the reduce-scatter (2 + 2): 20 B
TE_ALLGATHER = RingPlan(
    "te-all-gather", "TransformerEngine v1.11 transformer_engine/pytorch/attention.py AttnFuncWithCPAndKVAllGather "
    "(Megatron-Core --cp-comm-type all_gather); Llama Team 2024 (arXiv:2407.21783) Section 3.3.2",
    rotate="allgather-exposed", attention=None, merge_fwd=0.0, merge_fwd_kv=4.0, merge_once=4.0,
    merge_bwd=0.0, merge_bwd_kv=20.0, grad_kv_bytes=2.0)
RING_PLANS = {"torch": TORCH_RING, "te": TE_RING, "te-all-gather": TE_ALLGATHER}
# Strategy.cp_comm per ring implementation, the default first: Megatron-Core --cp-comm-type (p2p, all_gather);
# torch set_rotate_method ("allgather" default, "alltoall")
CP_COMMS = {"te": ("p2p", "all_gather"), "torch": ("all_gather", "all_to_all")}


def _ring_family(framework: str) -> str:
    return "te" if stack(framework).model_code == "megatron" else "torch"


def check_cp_comm(framework: str, cp_comm: str | None, cp: int) -> None:
    """Raise unless ``cp_comm`` (None: the default) is a K/V exchange ``framework``'s ring has."""
    if cp_comm is None:
        return
    takes = CP_COMMS[_ring_family(framework)]
    check_choice("cp_comm", cp_comm, tuple(dict.fromkeys(c for cs in CP_COMMS.values() for c in cs)))
    if cp_comm not in takes:
        raise UnsupportedError(f"cp_comm={cp_comm!r} does not apply to framework={framework!r}: its context "
                               f"parallelism exchanges K/V by {', '.join(takes)}")
    if cp <= 1:
        raise InvalidInputError(f"'cp_comm'={cp_comm!r} is the context-parallel K/V exchange: it needs cp > 1 "
                                f"(got cp={cp})")


def cp_exchange(framework: str, cp_comm: str | None = None) -> str:
    """The K/V exchange a framework's ring runs, named with its implementation: "te:p2p", "torch:all_gather", ...
    (``cp_comm`` None: the framework's default, ``CP_COMMS``)."""
    family = _ring_family(framework)
    return f"{family}:{cp_comm or CP_COMMS[family][0]}"


def ring_plan(framework: str, cp_comm: str | None = None) -> RingPlan:
    """The ring-attention implementation a framework's context parallelism runs with K/V exchange ``cp_comm``
    (None: the framework's default, ``CP_COMMS``)."""
    family = _ring_family(framework)
    comm = cp_comm or CP_COMMS[family][0]
    if family == "te":
        return TE_ALLGATHER if comm == "all_gather" else TE_RING
    return replace(TORCH_RING, rotate="p2p") if comm == "all_to_all" else TORCH_RING


def default_attention(framework: str, cp: int = 1) -> str:
    """The attention kernel a framework calls when the user names none: under context parallelism
    (cp > 1) the one its ring runs (``RingPlan.attention``), else the stack's own."""
    ring = ring_plan(framework).attention if cp > 1 else None
    return ring or stack(framework).default_attention
