"""Tensor-parallel collectives per block as each stack issues them, hand-worked.

Collectives run at a constant bus bandwidth B with no latency unless a test says otherwise,
so t = S · factor(n) / B (nccl-tests doc/PERFORMANCE.md): at tp = 4 an all-gather or a
reduce-scatter of S bytes takes 0.75 S / B and an all-reduce 1.5 S / B.
"""

import dataclasses

import pytest

import perfmodel as pm
from perfmodel.costs.comm import datasheet_entry
from perfmodel.parallel.fabric import cluster_collectives
from perfmodel.parallel import tensor, tp_overlap
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.placement import layout
from perfmodel.predict import default_profile

B = 100e9
M = pm.transformer(2, 4096, 32, 2048, 32000)  # b=1, s=2048, h=4096, bf16: S = 16,777,216 B per hidden state
S = 1 * 2048 * 4096 * 2
AG = 0.75 * S / B  # = RS at tp 4
LAY = layout(1, 4, 1, 8)


def flat(alpha_s=0.0):
    return {"intra": {"all_reduce": datasheet_entry(B, alpha_s, source="test")},
            "inter": {"all_reduce": datasheet_entry(B, alpha_s, source="test")}}


def cfg(**kw):
    return dataclasses.replace(StepConfig.from_strategy(pm.Strategy(micro_batch=1)), **kw)


def times(recompute="none", coll=None, **kw):
    return tensor.tp_comm_times(M, coll or flat(), LAY, cfg(tp=4, sequence_parallel=True, **kw),
                                precision="bf16-mixed", recompute=recompute)


def test_megatron_sequence_parallel_block_issues_four_forward_six_backward():
    t = times(framework="megatron")
    # forward: all-gather before qkv and fc1, reduce-scatter after proj and fc2
    assert float(t.layer_f) == pytest.approx(4 * AG)
    # backward: all-gathers of dy (proj, fc2), reduce-scatters of dx (qkv, fc1), and the
    # re-gathered qkv/fc1 inputs for their weight gradients (layers.py, Korthikanti §4.2.2)
    assert float(t.layer_b) == pytest.approx(6 * AG)
    assert tensor.sp_regathers("megatron") == 2


def test_torchtitan_dtensor_block_has_no_regather():
    # apply_tp: PrepareModuleInput(Shard(1) -> Replicate()) once before attention and the
    # feed-forward; autograd saves its output, so backward is 2 all-gathers + 2 reduce-scatters
    t = times(framework="torchtitan")
    assert float(t.layer_f) == pytest.approx(4 * AG)
    assert float(t.layer_b) == pytest.approx(4 * AG)
    assert tensor.sp_regathers("torchtitan") == 0
    # full activation checkpointing re-runs the forward's four
    assert float(times("full", framework="torchtitan").layer_b) == pytest.approx(8 * AG)


def test_loss_parallel_adds_three_latency_bound_all_reduces():
    alpha = 20e-6
    t = times(coll=flat(alpha), framework="torchtitan")
    one_ar = alpha + 1.5 * 2048 * 4 / B  # b·s fp32 values: 8 KiB, the latency is all of it but 0.1 µs
    gather = alpha + 0.75 * S / B        # the final norm's output gathered before the output layer
    assert float(t.head_f) == pytest.approx(gather + 3 * one_ar)
    assert 3 * one_ar == pytest.approx(3 * alpha, rel=0.01)
    # the embedding: its reduce-scatter forward and its gradient's all-gather backward
    assert float(t.embed_f) == pytest.approx(gather) and float(t.embed_b) == pytest.approx(gather)


def test_overlapped_backward_pays_the_gemm_slowdown_beside_nccl():
    # Megatron async TP: 2 RS + 2 re-gathers (6 AG-times... here 4 · AG) hidden behind the
    # weight-gradient GEMMs (2 × hidden_by); the GEMMs run 18.9% slower while both run
    hidden = 3 * AG
    c = cfg(tp=4, sequence_parallel=True, framework="megatron", tp_overlap=True)
    plain = tensor.tp_comm_times(M, flat(), LAY, c, precision="bf16-mixed", recompute="none", hidden_by=hidden)
    slowed = tensor.tp_comm_times(M, flat(), LAY, c, precision="bf16-mixed", recompute="none", hidden_by=hidden,
                                  slowdown=0.189)
    assert float(plain.layer_b) == pytest.approx(2 * AG)  # the dy all-gathers stay exposed; 4 AG hide in 6 AG
    assert float(slowed.layer_b) == pytest.approx(2 * AG + 0.189 * 4 * AG)
    # with less compute than communication, the rest is exposed and the slowdown covers the window
    short = tensor.tp_comm_times(M, flat(), LAY, c, precision="bf16-mixed", recompute="none", hidden_by=AG,
                                 slowdown=0.189)
    assert float(short.layer_b) == pytest.approx(2 * AG + (4 * AG - 2 * AG) + 0.189 * 2 * AG)


def test_async_tp_backward_pairs_each_collective_with_its_dgrad():
    gemms = {f"{n}{s}": 1.0 for n in ("qkv", "proj", "fc1", "fc2") for s in ("", ".dgrad", ".wgrad")}
    gemms["qkv.dgrad"] = 0.0  # nothing hides the dx reduce-scatter of qkv
    _, bwd = tp_overlap.overlapped_layer(4.0, 4.0, gemms, 4, 132, method="async")
    # four ring exchanges, each hiding 3/4 of a 1 s GEMM: 3 × (4 − 0.75) + 4
    assert float(bwd) == pytest.approx(3 * 3.25 + 4.0)


def test_nvls_fitted_node_gathers_at_the_ring_busbw():
    # the H100 profile's intra all-reduce is fitted under NVLink SHARP; the sequence-parallel
    # all-gathers and reduce-scatters ride the ring at 370/480 of it (fabric.py, nccl-tests#212)
    c = pm.cluster("dgx-h100")
    coll = cluster_collectives(c, default_profile(c))["intra"]
    ar, ag = coll["all_reduce"]["params"], coll["all_gather"]["params"]
    assert ag["busbw_bytes_per_s"] / ar["busbw_bytes_per_s"] == pytest.approx(370 / 480, rel=0.01)
    assert coll["reduce_scatter"]["params"] == ag
