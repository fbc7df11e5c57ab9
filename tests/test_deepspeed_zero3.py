"""framework="deepspeed", zero=3: one all-gather per block weight, the recomputed forward's re-gathers and
the per-rank copies of tensor-list collectives (DeepSpeed v0.3.13 / v0.16.4 stage3; docs/stacks.md)."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.costs.comm import datasheet_entry
from perfmodel.parallel import data
from perfmodel.parallel import deepspeed as ds
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.pipeline import Stage

B = 100e9
COLL = {level: {"all_reduce": datasheet_entry(B, 0.0, source="test")} for level in ("intra", "inter")}
LAY = {"dp": (8, 4)}  # 32 ranks: 8 per node on 4 nodes
PROFILE = SimpleNamespace(host={"cpu_per_kernel_s": 1e-5})


def model(hidden=12288):
    return pm.Transformer(layers=4, hidden=hidden, heads=32, kv_heads=32, ffn_hidden=4 * hidden, seq=2048)


def cfg(**kw):
    s = pm.Strategy(micro_batch=1, dp=32, zero=3, framework="deepspeed", dp_overlap=False)
    return dataclasses.replace(StepConfig.from_strategy(s), **kw)


def work(layer_f=0.1):
    times = SimpleNamespace(layer_f=layer_f)
    return SimpleNamespace(stages=(Stage(4.0, 0.0, True, True, True),), times=times)


def gather(elements):
    return 2.0 * elements * 31 / 32 / B  # a ring all-gather of 16-bit elements over 32 ranks, no latency


def test_block_weights_and_reuse():
    h = 12288
    w = ds.block_weights(model(h))
    assert w == [3 * h * h, h * h, 4 * h * h, 4 * h * h] and len(w) == data.DS_BLOCK_GATHERS
    # fc2 is used again right after its recomputed forward; fc1 waits for fc2's forward and backward
    # (2 * 4h^2 = 1.2e9 elements > stage3_max_reuse_distance 1e9), so it is released and gathered again
    assert ds.kept_for_backward(w) == [False, False, False, True]
    # at hidden 8192 fc1's distance (8h^2 = 5.4e8) is under it, the projection's (16h^2 = 1.07e9) is not
    assert ds.kept_for_backward(ds.block_weights(model(8192))) == [False, False, True, True]


def test_full_recompute_regathers_the_released_weights():
    m, c = model(), cfg()
    none = ds.zero3_engine_seconds(PROFILE, COLL, LAY, c, work(), m, "none")
    full = ds.zero3_engine_seconds(PROFILE, COLL, LAY, c, work(), m, "full")
    h = 12288
    regather = gather(3 * h * h) + gather(h * h) + gather(4 * h * h)  # all but fc2
    # per weight: each gather's 32 views (its 32 copies hide behind a gather longer than them), and the
    # reduce-scatter's 32 views and 32 copies; 4 blocks at 1e-5 s per host op
    ops = lambda per_block: 4 * per_block * 32 * 1e-5  # noqa: E731
    assert gather(h * h) > 32 * 1e-5
    assert none == pytest.approx(ops(4 * (2 + 2)))  # a gather forward and one backward
    assert full == pytest.approx(4 * regather + ops(3 * (3 + 2) + (2 + 2)))  # fc2 is gathered twice


def test_copies_beyond_a_short_gather_are_exposed():
    m, c = model(256), cfg()
    w = ds.block_weights(m)
    copies = 32 * 1e-5
    assert all(gather(x) < copies for x in w)  # 32 copy launches take longer than each gather
    beyond = sum(copies - gather(x) for x in w)
    full = ds.zero3_engine_seconds(PROFILE, COLL, LAY, c, work(), m, "full")
    assert all(ds.kept_for_backward(w))  # a small block: nothing gathered again
    assert full == pytest.approx(4 * (2 * beyond + 4 * (2 + 2) * copies))


def test_overlapping_zero3_hides_regathers_and_has_no_list_copies():
    m = model()
    c = cfg(dp_overlap=np.asarray(True))
    assert ds.zero3_engine_seconds(PROFILE, COLL, LAY, c, work(layer_f=10.0), m, "full") == pytest.approx(0.0)
    h = 12288
    regather = gather(8 * h * h)
    assert ds.zero3_engine_seconds(PROFILE, COLL, LAY, c, work(layer_f=0.0), m, "full") == pytest.approx(4 * regather)


def test_only_deepspeed_zero3_pays():
    m = model()
    assert ds.zero3_engine_seconds(PROFILE, COLL, LAY, cfg(shard_stage=np.asarray(1)), work(), m, "full") == 0.0
    assert ds.zero3_engine_seconds(PROFILE, COLL, LAY, cfg(framework="megatron"), work(), m, "full") == 0.0


def test_zero3_launch_cost_grows_with_the_ranks():
    # tensor-list collectives copy once per rank: the step grows with dp at a fixed per-GPU batch
    m = pm.Transformer(layers=8, hidden=4096, heads=32, kv_heads=32, ffn_hidden=16384, seq=2048)
    steps = []
    for nodes in (4, 16):
        cluster = pm.cluster("dgx-a100-80gb", nodes=nodes)
        s = pm.Strategy(dp=8 * nodes, micro_batch=1, zero=3, framework="deepspeed", dp_overlap=False, recompute="full")
        steps.append(pm.predict(m, cluster, s).breakdown["dp_comm"])
    cpu = pm.load_profile("a100-sxm4-80gb").host["cpu_per_kernel_s"]
    # 8 blocks x 4 weights x (2 gathers' views + the reduce-scatter's views and copies) x 96 more ranks
    # (at hidden 4096 every weight is kept from its recomputed forward)
    assert steps[1] - steps[0] >= 8 * 4 * (2 + 2) * 96 * cpu
