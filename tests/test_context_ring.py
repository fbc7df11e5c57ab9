"""Ring attention as each stack's code runs it: per-step chunk kernels, merges, K/V traffic, the kernel."""

import dataclasses
import json

import pytest

import perfmodel as pm
from perfmodel.cli import main
from perfmodel.costs.comm import hierarchical_time
from perfmodel.parallel import context, placement
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.pipeline import sendrecv_time
from perfmodel.predict import cluster_collectives, default_profile
from perfmodel.validate.published import read_published
from perfmodel.workload import kernels as steps
from perfmodel.workload.stacks.context import TE_ALLGATHER, TE_RING, TORCH_RING, ring_plan


def _llama(seq):  # Llama 3 8B shapes: 32 heads, 8 K/V heads, head_dim 128
    return dataclasses.replace(pm.preset("llama-3-8b"), seq=seq)


@pytest.mark.parametrize("cp", [2, 4])
def test_chunk_kernels_and_merge_bytes_by_hand(cp):
    """s = 8192: a rank holds 8192/cp tokens; each of the cp − 1 later steps is two non-causal
    (8192/2cp)² blocks; torch's merges move 32.5 B per output element and 4 B per K/V element per step
    (plus 12 B once) forward, 10 B and 22 B per step backward."""
    local = _llama(8192 // cp)
    fwd, bwd = steps.layer_kernels(local, 1, precision="bf16-mixed")
    ring = context.ring_attention(fwd + bwd, cp, causal=True, plan=TORCH_RING)
    blocks = [k for k in ring if k.cls == "sdpa"]
    assert [k.size["seq"] for k in blocks] == [4096 / cp, 4096 / cp]
    assert [float(k.count) for k in blocks] == [2.0 * (cp - 1)] * 2
    n = 32 * (8192 / cp) * 128      # output elements b·heads·(s/cp)·d
    n_kv = 8 * (8192 / cp) * 128    # one of K, V
    merge_f, merge_b = (k for k in ring if k.cls == "copy")
    assert merge_f.size["x"] * 8 == pytest.approx((cp - 1) * (32.5 * n + 2 * 4.0 * n_kv) + 12.0 * n)
    assert merge_b.size["x"] * 8 == pytest.approx((cp - 1) * (10.0 * n + 2 * 22.0 * n_kv))
    te = context.ring_attention(fwd, cp, causal=True, plan=TE_RING)
    assert [k.size["x"] * 8 for k in te if k.cls == "copy"] == [pytest.approx((cp - 1) * 6.0 * n)]


@pytest.mark.parametrize("cp", [2, 4])
def test_torch_ring_traffic_by_hand(cp):
    """torch's ring: forward all-gathers cp K/V chunks (2·b·(s/cp)·kv_heads·d bf16 each) behind the
    own causal block; backward gathers again and permutes the fp32 dK/dV cp times, the last exposed."""
    cl = pm.cluster("dgx-h100", nodes=1)
    coll = cluster_collectives(cl, default_profile(cl))
    local = _llama(8192 // cp)
    c = dataclasses.replace(StepConfig.from_strategy(pm.Strategy(micro_batch=1)), cp=cp)
    lay = placement.layout(1, 1, 1, 8, cp=cp)
    kv = 2 * (8192 / cp) * 8 * 128 * 2
    gather = hierarchical_time(coll, "all_gather", cp * kv, *lay["cp"], algorithm="ring")
    grad = sendrecv_time(coll, "intra", 2 * kv)   # fp32 dK/dV: twice the bf16 bytes
    quick = (0.0, 0.0, 0.0, 0.0)                  # blocks hide nothing
    got = context.cp_comm_times(local, coll, lay, c, precision="bf16-mixed", recompute="none", ring_gpu_s=quick)
    assert got.layer_f == pytest.approx(gather)
    assert got.layer_b == pytest.approx(gather + (cp - 2) * grad + grad)
    slow = (1.0, 1.0, 1.0, 1.0)                   # one-second blocks hide all but the last permute
    hid = context.cp_comm_times(local, coll, lay, c, precision="bf16-mixed", recompute="none", ring_gpu_s=slow)
    assert (hid.layer_f, hid.layer_b) == (0.0, pytest.approx(grad))
    again = context.cp_comm_times(local, coll, lay, c, precision="bf16-mixed", recompute="full", ring_gpu_s=quick)
    assert again.layer_b == pytest.approx(got.layer_b + got.layer_f)  # full recompute gathers again


def test_kernel_chosen_under_cp_per_stack():
    """torch's context parallelism calls flash/efficient SDPA (priced as FlashAttention-2); Megatron's
    ring runs Transformer Engine's fused attention, the profile's own; a named kernel is kept."""
    assert ring_plan("torchtitan") is TORCH_RING and ring_plan("megatron") is TE_RING
    assert pm.Strategy(framework="torchtitan", cp=2).attention == "flash2"
    assert pm.Strategy(framework="torchtitan").attention == "flash"
    assert pm.Strategy(framework="megatron", cp=2).attention == "flash"
    assert pm.Strategy(framework="torchtitan", cp=2, attention="flash").attention == "flash"
    assert pm.Strategy(framework="torchtitan", cp=2).is_default("attention")


@pytest.mark.parametrize("cp", [2, 4])
def test_te_all_gather_traffic_by_hand(cp):
    """Transformer Engine's all-gather CP (--cp-comm-type all_gather): forward gathers cp K/V chunks before any
    block, so no block hides it; backward gathers again and reduce-scatters the 16-bit dK/dV (same bytes)."""
    cl = pm.cluster("dgx-h100", nodes=cp)
    coll = cluster_collectives(cl, default_profile(cl))
    local = _llama(8192 // cp)
    s = pm.Strategy(framework="megatron", micro_batch=1, tp=8, cp=cp, cp_comm="all_gather")
    c = StepConfig.from_strategy(s)
    lay = placement.layout(1, 8, 1, 8, cp=cp)      # tp fills a node: the cp ranks are on cp nodes
    kv = 2 * (8192 / cp) * (8 / 8) * 128 * 2          # K and V of the rank's tokens, one K/V head per tp rank
    gather = hierarchical_time(coll, "all_gather", cp * kv, *lay["cp"], algorithm="ring")
    scatter = hierarchical_time(coll, "reduce_scatter", cp * kv, *lay["cp"], algorithm="ring")
    for blocks in ((0.0, 0.0, 0.0, 0.0), (1.0, 1.0, 1.0, 1.0)):  # however long the blocks, nothing is hidden
        got = context.cp_comm_times(local, coll, lay, c, precision="bf16-mixed", recompute="none", ring_gpu_s=blocks)
        assert (got.layer_f, got.layer_b) == (pytest.approx(gather), pytest.approx(gather + scatter))
    again = context.cp_comm_times(local, coll, lay, c, precision="bf16-mixed", recompute="selective",
                                  ring_gpu_s=(1.0, 1.0, 1.0, 1.0))
    assert again.layer_b == pytest.approx(2 * gather + scatter)  # the recomputed attention core gathers again
    p2p = context.cp_comm_times(local, coll, lay, dataclasses.replace(c, cp_comm="p2p"), precision="bf16-mixed",
                                recompute="none", ring_gpu_s=(1.0, 1.0, 1.0, 1.0))
    assert (p2p.layer_f, p2p.layer_b) == (0.0, 0.0)  # the p2p ring's sends hide behind one-second blocks


def test_te_all_gather_merge_bytes_by_hand():
    """TE's all-gather CP: index_select of the gathered K/V (4 B per K/V element per chunk) and one 4 B copy of
    the output forward; 20 B per K/V element per chunk backward (index_selects, zeros, adds, copies)."""
    cp = 4
    fwd, bwd = steps.layer_kernels(_llama(8192 // cp), 1, precision="bf16-mixed")
    n = 32 * (8192 / cp) * 128
    n_kv = 8 * (8192 / cp) * 128
    merge_f, merge_b = (k for k in context.ring_attention(fwd + bwd, cp, causal=True, plan=TE_ALLGATHER)
                        if k.cls == "copy")
    assert merge_f.size["x"] * 8 == pytest.approx((cp - 1) * 2 * 4.0 * n_kv + 4.0 * n)
    assert merge_b.size["x"] * 8 == pytest.approx((cp - 1) * 2 * 20.0 * n_kv)


def test_cp_comm_per_stack_and_its_errors():
    """cp_comm names the K/V exchange each stack's code offers; others are refused with the ones it takes."""
    assert ring_plan("megatron", "all_gather") is TE_ALLGATHER and ring_plan("megatron", "p2p") is TE_RING
    assert ring_plan("torchtitan", "all_gather") is TORCH_RING
    assert ring_plan("torchtitan", "all_to_all").rotate == "p2p"   # torch _AllToAllRotater: one permute a step
    with pytest.raises(pm.errors.UnsupportedError, match="framework='torchtitan': its context parallelism "
                                                          "exchanges K/V by all_gather, all_to_all"):
        pm.Strategy(framework="torchtitan", cp=2, cp_comm="p2p")
    with pytest.raises(pm.errors.PerfModelError, match="unknown cp_comm 'ring'"):
        pm.Strategy(framework="megatron", cp=2, cp_comm="ring")
    with pytest.raises(pm.errors.InvalidInputError, match="it needs cp > 1"):
        pm.Strategy(framework="megatron", cp_comm="all_gather")


def test_llama3_all_gather_row_is_slower_than_its_p2p_ring():
    """Llama 3 405B at 128K (Llama Team 2024 §3.3.2: K/V all-gathered, the gather exposed): the exposed
    collectives make the step slower than the p2p ring's, which hides its sends behind the blocks."""
    case = next(c for c in read_published() if c.label == "llama3-405B-16384-cp16")
    assert case.strategy.cp_comm == "all_gather"
    gather = pm.predict(case.model, case.cluster, case.strategy)
    ring = pm.predict(case.model, case.cluster, case.strategy.replace(cp_comm="p2p"))
    assert gather.step_time > ring.step_time
    assert gather.breakdown["tp_comm"] > ring.breakdown["tp_comm"]


def test_cli_cp_comm(capsys):
    """`perfmodel predict --cp-comm all_gather` prices Transformer Engine's all-gather CP: slower than its p2p
    ring, whose sends hide behind the blocks; a K/V exchange the stack lacks exits with the message."""
    args = ["predict", "--model", "llama-3-8b", "--gpu", "h100-sxm5-80gb", "--nodes", "2", "--gpus-per-node", "8",
            "--tp", "8", "--cp", "2", "--seq", "16384", "--framework", "megatron", "--micro-batch", "1", "--json"]
    steps_s = {}
    for comm in ("p2p", "all_gather"):
        assert main([*args, "--cp-comm", comm]) == 0
        steps_s[comm] = json.loads(capsys.readouterr().out)["step_time"]
    assert steps_s["all_gather"] > steps_s["p2p"]
    assert main([*args[:-4], "torchtitan", "--micro-batch", "1", "--cp-comm", "p2p"]) != 0
    assert "exchanges K/V by all_gather, all_to_all" in capsys.readouterr().err
