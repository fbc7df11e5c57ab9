"""Activation CPU offload (``Strategy.offload_layers``): hand-worked copy times, memory and refusals."""

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import perfmodel as pm
from perfmodel.costs import memory as mem
from perfmodel.costs.offload import exposed_copy_seconds, host_copy_seconds, host_link, offloaded_bytes
from perfmodel.errors import InvalidInputError, UnsupportedError
from perfmodel.fit.host_copy import fit_host_copies
from perfmodel.hardware import load_link
from perfmodel.profiles.profile import load_profile
from perfmodel.workload.stacks.offload import layer_windows, overlap_layers

MODEL = pm.transformer(layers=4, hidden=512, heads=8, seq=256, vocab=8192)


@pytest.fixture(scope="module")
def h200():
    return pm.cluster("h200")


def test_window_map_is_transformer_engines():
    # TE v2.1 AsyncDoubleBufferGroupOffloadHandler: (L // k)(i + 1) − 1, the remainder spread over the first groups
    assert layer_windows(1, 4) == [3]
    assert layer_windows(2, 4) == [1, 3]
    assert layer_windows(2, 5) == [2, 4]
    assert layer_windows(3, 4) == [1, 2, 3]
    assert overlap_layers(2, 4) == [1, 2]
    assert overlap_layers(3, 4) == [1, 1, 1]


def test_windowed_exposure_hand_worked():
    # k = 2 of L = 4: group 0 overlaps 1 layer, group 1 two; copy 3 ms, layer 1 ms fwd / 2 ms bwd
    fwd, bwd = exposed_copy_seconds("megatron", 2, 4, 3e-3, 3e-3, 1e-3, 2e-3)
    assert fwd == pytest.approx((3 - 1) * 1e-3 + (3 - 2) * 1e-3)   # 3 ms
    assert bwd == pytest.approx((3 - 2) * 1e-3 + 0.0)              # 1 ms: group 1's reload hides
    # save_on_cpu copies on the compute stream: all of them are exposed
    assert exposed_copy_seconds("pytorch", 2, 4, 3e-3, 4e-3, 1e-3, 2e-3) == pytest.approx((6e-3, 8e-3))
    assert exposed_copy_seconds("megatron", 0, 4, 3e-3, 3e-3, 1e-3, 2e-3) == (0.0, 0.0)


def test_host_copy_uses_the_profiles_fit_else_the_link():
    profile = load_profile("h200-sxm-141gb")
    link = load_link("pcie5")
    bare = replace(profile, host={})
    # PCIe 5 x16 line rate 63.015 GB/s, 1 µs: 63.015 MB take 1 ms + 1 µs
    assert host_copy_seconds(bare, link, 63.015e6, "d2h") == pytest.approx(1e-3 + 1e-6)
    fitted = replace(profile, host={"d2h_latency_s": 3e-6, "d2h_s_per_byte": 2e-11})
    assert host_copy_seconds(fitted, link, 1e8, "d2h") == pytest.approx(3e-6 + 2e-3)
    assert host_link(pm.cluster("h200")).name == "pcie5"
    # the bundled H200 profile holds its measured pinned copies; a datasheet-scaled one does not keep them
    assert 1 / profile.host["d2h_s_per_byte"] == pytest.approx(54.8e9, rel=0.01)
    assert "d2h_s_per_byte" not in load_profile("a100-sxm4-80gb").host


def test_fit_recovers_a_known_line():
    size = np.array([2**20, 2**24, 2**28, 2**30], float)
    rows = pd.DataFrame({"op": "d2h", "dtype": "pinned", "bytes": size, "time_s": 4e-6 + size / 50e9})
    got = fit_host_copies(rows)
    assert got["d2h_latency_s"] == pytest.approx(4e-6, rel=1e-6)
    assert 1 / got["d2h_s_per_byte"] == pytest.approx(50e9, rel=1e-6)
    assert "h2d_latency_s" not in got


def test_offloaded_bytes_pytorch_takes_the_weight_casts():
    acts = offloaded_bytes(100.0, 10, 1000.0, 2, precision="bf16-mixed", framework="megatron")
    assert acts == pytest.approx(1000.0)
    # save_on_cpu also packs mm's saved 16-bit weight cast: 2 B × 1000 params / tp 2
    assert offloaded_bytes(100.0, 10, 1000.0, 2, precision="bf16-mixed", framework="pytorch") == \
        pytest.approx(1000.0 + 1000.0)


@pytest.mark.parametrize("framework", ["pytorch", "megatron"])
def test_memory_drops_by_the_offloaded_blocks(h200, framework):
    # 8 sequences: the loss backward stays the peak with two blocks offloaded (Megatron's loss: 6 B per logit)
    base = pm.predict(MODEL, h200, pm.Strategy(micro_batch=8, framework=framework))
    off = pm.predict(MODEL, h200, pm.Strategy(micro_batch=8, framework=framework, offload_layers=2))
    per_layer = 8 * MODEL.seq * mem.layer_activation_bytes(MODEL, framework=framework)
    assert base.memory["activations"] - off.memory["activations"] == pytest.approx(2 * per_layer)
    assert off.peak_memory < base.peak_memory
    if framework == "pytorch":  # two blocks' bf16 weight casts went to the host with them
        casts = 2 * 2.0 * (4 * 512 * 512 + 2 * 512 * 2048)
        assert base.memory["weight_copies"] - off.memory["weight_copies"] == pytest.approx(casts)


def test_step_time_adds_only_the_exposed_copies(h200):
    s = pm.Strategy(micro_batch=4, framework="pytorch")
    base = pm.predict(MODEL, h200, s)
    off = pm.predict(MODEL, h200, replace(s, offload_layers=1))
    nbytes = 4 * MODEL.seq * mem.layer_activation_bytes(MODEL) + 2.0 * (4 * 512 * 512 + 2 * 512 * 2048)
    prof = load_profile("h200-sxm-141gb")
    link = load_link("pcie5")
    copies = host_copy_seconds(prof, link, nbytes, "d2h") + host_copy_seconds(prof, link, nbytes, "h2d")
    assert off.step_time - base.step_time == pytest.approx(copies, rel=1e-6)
    assert off.breakdown["forward"] > base.breakdown["forward"]


def test_defaults_off_predictions_unchanged(h200):
    s = pm.Strategy(micro_batch=4, framework="megatron")
    assert pm.predict(MODEL, h200, s).step_time == pm.predict(MODEL, h200, replace(s, offload_layers=0)).step_time


@pytest.mark.parametrize("framework", ["torchtitan", "fsdp1", "deepspeed"])
def test_refused_for_stacks_without_it(framework):
    with pytest.raises(UnsupportedError, match=r"'offload_layers'=2 \(activation CPU offload\) does not apply to "
                                               rf"framework='{framework}'; stacks that take it: pytorch, megatron"):
        pm.Strategy(framework=framework, offload_layers=2)


def test_refused_with_pipeline_or_recompute_or_too_many_layers(h200):
    with pytest.raises(UnsupportedError, match="use pp=1"):
        pm.Strategy(framework="megatron", pp=2, offload_layers=1)
    with pytest.raises(UnsupportedError, match="use recompute='none'"):
        pm.Strategy(framework="megatron", recompute="selective", offload_layers=1)
    with pytest.raises(InvalidInputError, match=r"at most 3 for a model of 4 layers \(Megatron-Core"):
        pm.predict(MODEL, h200, pm.Strategy(framework="megatron", offload_layers=4))
    with pytest.raises(InvalidInputError, match="'offload_layers'"):
        pm.Strategy(offload_layers=-1)
