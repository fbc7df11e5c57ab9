"""FSDP2's copies on the compute stream around its collectives (torch _fully_shard: all-gather copy-out,
reduce-scatter copy-in), priced in fp32-copy units by hand."""

import dataclasses
from types import SimpleNamespace

import pytest

import perfmodel as pm
from perfmodel.core.memo import clear_memos
from perfmodel.costs.compute import copy_pricer
from perfmodel.parallel import data
from perfmodel.parallel.data import FSDP2_COPY_PASSES, fsdp2_copy_passes
from perfmodel.predict import default_profile


def test_passes_by_hand():
    # per micro-batch: two copy-outs (forward, backward) of 2 + 2 B and one copy-in of 2 + 4 B, over 8 B
    assert FSDP2_COPY_PASSES == pytest.approx((4 + 4 + 6) / 8)
    c = SimpleNamespace(framework="torchtitan", micro_batches=3)
    # 1e9 parameters, an fp32 copy at 1 ps per element: 3 x 1.75 x 1 ms
    assert fsdp2_copy_passes(lambda n: n * 1e-12, 1e9, c) == pytest.approx(3 * 1.75e-3)


def test_only_fsdp2_pays_them():
    for framework in ("fsdp1", "pytorch", "megatron"):
        assert fsdp2_copy_passes(lambda n: n, 1e9, SimpleNamespace(framework=framework, micro_batches=1)) == 0.0
    assert fsdp2_copy_passes(None, 1e9, SimpleNamespace(framework="torchtitan", micro_batches=1)) == 0.0


def test_torchtitan_step_carries_the_copies(monkeypatch):
    m = dataclasses.replace(pm.preset("llama-3-8b"), seq=2048)
    c = pm.cluster("dgx-h100")
    s = pm.Strategy(dp=8, micro_batch=1, framework="torchtitan", recompute="full")
    with_copies = pm.predict(m, c, s).breakdown["dp_comm"]
    monkeypatch.setattr(data, "FSDP2_COPY_PASSES", 0.0)
    clear_memos()
    without = pm.predict(m, c, s).breakdown["dp_comm"]
    clear_memos()
    # the whole model's parameters x 1.75 fp32 copies on the H100's copy class, one micro-batch
    expected = 1.75 * copy_pricer(default_profile(c))(m.params)
    assert with_copies - without == pytest.approx(expected, rel=0.02)
