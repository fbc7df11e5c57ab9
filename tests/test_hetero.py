"""Mixed-GPU data parallelism: hand-worked steps, invariants on catalog GPUs, bad input."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.analysis import hetero
from perfmodel.core.errors import InvalidInputError, UnknownNameError, UnsupportedError
from perfmodel.analysis.hetero import (balance_layers, balance_pipeline, predict_mixed, ps_exchange_s, split_batch,
                                       stage_costs)

PER_SAMPLE_S = {"k80": 0.010, "v100": 0.004}  # made-up linear compute times for hand-worked cases
EXCHANGE_S = 1.3e-3  # made-up exposed gradient exchange, the same at every batch
FAKE_MODEL = SimpleNamespace(params=1e6, name="fake")


@pytest.fixture
def linear_compute(monkeypatch):
    def fake_predict(self, batch):
        t = PER_SAMPLE_S[self.gpu] * batch
        return SimpleNamespace(step_time=t, fits=True, interval=(0.9 * t, 1.1 * t), interval_regime="fake",
                               breakdown={"forward": t, "backward": 0.0, "optimizer": 0.0, "host_overhead": 0.0})

    monkeypatch.setattr(hetero._Type, "predict", fake_predict)
    monkeypatch.setattr(hetero._Type, "exchange", lambda self, batch, workers, coll: EXCHANGE_S)


def test_equal_and_proportional_by_hand(linear_compute):
    out = predict_mixed(FAKE_MODEL, [("k80", 1), ("v100", 1)], pm.Strategy(micro_batch=10)).set_index("policy")
    comm = EXCHANGE_S
    eq = out.loc["equal"]
    assert eq.comm_s == pytest.approx(comm)
    assert eq.compute_s == pytest.approx(0.1) and eq.slowest == "k80"  # 10 samples x 10 ms
    assert eq.step_time_s == pytest.approx(0.1 + comm)
    # speeds 100 and 250 samples/s: 20 x 100/350 = 5.71 -> 6, 14.29 -> 14; k80 6 x 10 ms = 60 ms
    pr = out.loc["proportional"]
    assert (pr.batch_k80, pr.batch_v100, pr.global_batch) == (6, 14, 20)
    assert pr.compute_s == pytest.approx(0.06) and pr.step_time_s == pytest.approx(0.06 + comm)
    # solo throughputs 100 + 250 = 350 samples/s
    assert pr.efficiency == pytest.approx(20 / (0.06 + comm) / 350)


def test_parameter_server_time_by_hand(linear_compute):
    out = predict_mixed(FAKE_MODEL, {"k80": 1, "v100": 1}, pm.Strategy(micro_batch=10), servers=1, mode="equal")
    # one 10 Gb/s server for 2 workers: 4e6 B x max(2/1.25e9, 1/3.125e9) = 6.4 ms + 10 us, twice
    assert out.comm_s.iloc[0] == pytest.approx(2 * (4e6 * 2 / 1.25e9 + 1e-5))
    assert ps_exchange_s(1e6, 8, 4, 1.25e9, 3.125e9) == pytest.approx(2 * 4e6 * 8 / (4 * 1.25e9))
    faster = predict_mixed(FAKE_MODEL, {"k80": 1, "v100": 1}, pm.Strategy(micro_batch=10), servers=1,
                           server_node="eth25", mode="equal")
    assert faster.comm_s.iloc[0] == pytest.approx(2 * (4e6 * 2 / 3.125e9 + 1e-5))
    with pytest.raises(InvalidInputError, match="'server_node' must be a Node, a Link"):
        predict_mixed(FAKE_MODEL, {"k80": 1}, pm.Strategy(), servers=1, server_node=3)
    # enough servers: the worker NIC bounds
    assert ps_exchange_s(1e6, 2, 8, 1.25e9, 3.125e9) == pytest.approx(2 * 4e6 / 3.125e9)


def test_split():
    shares = split_batch(10, [1.0, 1.0, 1.0])
    assert shares.sum() == 10 and sorted(shares) == [3, 3, 4]


@pytest.fixture(scope="module")
def mixed():
    return predict_mixed(pm.preset("resnet50"), [("k80", 4), ("p100", 2), ("v100", 2)],
                         pm.Strategy(micro_batch=32, precision="fp32")).set_index("policy")


def test_catalog_invariants(mixed):
    eq, pr = mixed.loc["equal"], mixed.loc["proportional"]
    assert eq.slowest == "k80" and eq.compute_s == pytest.approx(eq.compute_s_k80)
    assert eq.compute_s_k80 > eq.compute_s_p100 > eq.compute_s_v100
    assert pr.samples_per_second >= eq.samples_per_second
    assert pr.global_batch == eq.global_batch == 32 * 8
    assert pr.batch_k80 < 32 < pr.batch_v100
    assert 0 < eq.efficiency < pr.efficiency <= 1
    # proportional shares nearly equalise compute: within 10% of each other
    times = [pr.compute_s_k80, pr.compute_s_p100, pr.compute_s_v100]
    assert max(times) / min(times) < 1.1


def test_homogeneous_matches_predict():
    model, s = pm.preset("resnet50"), pm.Strategy(micro_batch=32, precision="fp32")
    out = predict_mixed(model, [("v100", 4)], s).set_index("policy")
    ref = pm.predict(model, pm.cluster("v100", nodes=4), s.replace(dp=4))
    assert out.loc["equal"].step_time_s == pytest.approx(out.loc["proportional"].step_time_s)
    # the core's data-parallel step: its compute, and its DDP exchange exposed beyond backward
    assert out.loc["equal"].step_time_s == pytest.approx(ref.step_time, rel=1e-9)
    assert out.loc["equal"].comm_s == pytest.approx(ref.breakdown["dp_comm"], rel=1e-9)


@pytest.mark.parametrize("workers, match", [
    ([], "'workers' must list at least one"),
    ({}, "'workers' must list at least one"),
    ([("v100", 0)], "workers\\['v100'\\] count"),
    ([("v100", -2)], "workers\\['v100'\\] count"),
    ([("v100", 1.5)], "workers\\['v100'\\] count"),
    (["v100"], "'workers\\[0\\]' must be a \\(gpu name, count\\) pair"),
    ([("v100", 1), ("v100", 2)], "names each GPU type once"),
    ("v100", "'workers' must be a list of \\(gpu, count\\) pairs or a dict"),
])
def test_bad_workers(workers, match):
    with pytest.raises(InvalidInputError, match=match):
        predict_mixed(FAKE_MODEL, workers, pm.Strategy())


def test_unknown_gpu_lists_known():
    with pytest.raises(UnknownNameError, match="unknown node or GPU 'z100'.*known: .*k80"):
        predict_mixed(FAKE_MODEL, [("z100", 2)], pm.Strategy())


def test_other_bad_arguments():
    with pytest.raises(UnknownNameError, match="unknown mode 'fastest'.*known: both, equal, proportional"):
        predict_mixed(FAKE_MODEL, [("v100", 1)], pm.Strategy(), mode="fastest")
    with pytest.raises(InvalidInputError, match="'servers'"):
        predict_mixed(FAKE_MODEL, [("v100", 1)], pm.Strategy(), servers=-1)
    with pytest.raises(InvalidInputError, match="'profile' must be a dict"):
        predict_mixed(FAKE_MODEL, [("v100", 1), ("k80", 1)], pm.Strategy(), profile="v100")
    with pytest.raises(InvalidInputError, match="'strategy' must be a perfmodel.Strategy"):
        predict_mixed(FAKE_MODEL, [("v100", 1)], {"micro_batch": 8})


def test_lazy_entry():
    assert pm.predict_mixed is predict_mixed
    assert np.isfinite(split_batch(7, [3.0, 1.0])).all()


# --- pipeline stages on different GPU types ---------------------------------------------------

FAKE_LAYER_S = {"h100": 1.0, "a100-sxm4-80gb": 2.0}  # made-up: the h100 exactly 2x faster per layer


@pytest.fixture
def fake_stage_costs(monkeypatch):
    monkeypatch.setattr(hetero, "stage_costs", lambda model, gpu, s, p=None: (FAKE_LAYER_S[gpu], 0.0, 0.0))


def test_balance_layers_by_hand():
    from perfmodel.analysis.hetero import balance_layers

    assert balance_layers([1.0, 2.0], 12).tolist() == [8, 4]  # 8 x 1 = 4 x 2 = 8 s
    assert balance_layers([1.0, 1.0, 1.0], 10).tolist() == [4, 3, 3]
    # stage 0 carries 3 s of embedding: 1+3, 2x2, 4x1 -> all 4 s
    assert balance_layers([1.0, 2.0, 1.0], 7, [3.0, 0.0, 0.0]).tolist() == [1, 2, 4]
    with pytest.raises(InvalidInputError, match=r"'layers' \(2\) must be at least the number of stages \(3\)"):
        balance_layers([1.0, 1.0, 1.0], 2)


def test_balance_pipeline_twice_as_fast_gets_two_thirds(fake_stage_costs):
    model = pm.preset("gpt2-small")  # 12 layers
    out = hetero.balance_pipeline(model, ["h100", "a100-sxm4-80gb"], pm.Strategy(micro_batch=4, global_batch=32))
    bal, even = out[out.split == "balanced"], out[out.split == "even"]
    assert bal.layers.tolist() == [8, 4] and bal.stage_time_s.tolist() == [8.0, 8.0]
    assert even.layers.tolist() == [6, 6] and even.stage_time_s.tolist() == [6.0, 12.0]
    # 1F1B with m = 32/4 = 8: balanced 8 x 8 + (16 - 8) = 72 s; even 8 x 12 + (18 - 12) = 102 s
    assert bal.step_time_s.iloc[0] == pytest.approx(72.0) and even.step_time_s.iloc[0] == pytest.approx(102.0)
    assert even.bottleneck.tolist() == [False, True]
    assert bal.speedup.iloc[0] == pytest.approx(102 / 72)


def test_balance_pipeline_catalog_invariants():
    model = pm.preset("gpt2-small")
    stages = ["t4", "a100-sxm4-80gb", "h100"]
    out = hetero.balance_pipeline(model, stages, pm.Strategy(micro_batch=4, global_batch=32, precision="fp16-mixed"))
    for _, part in out.groupby("split"):
        assert part.layers.sum() == model.layers and (part.layers >= 1).all()
        assert part.gpu.tolist() == stages and part.bottleneck.sum() == 1
    bal, even = out[out.split == "balanced"], out[out.split == "even"]
    assert bal.stage_time_s.max() <= even.stage_time_s.max() + 1e-12
    assert bal.step_time_s.iloc[0] <= even.step_time_s.iloc[0] + 1e-12
    per_layer = {g: hetero.stage_costs(model, g, pm.Strategy(micro_batch=4, precision="fp16-mixed"))[0]
                 for g in stages}
    assert per_layer["t4"] > per_layer["a100-sxm4-80gb"]  # the T4 is the slow stage: it gets the fewest layers
    assert bal.layers.iloc[0] == bal.layers.min()


def test_balance_pipeline_bad_input():
    model = pm.preset("gpt2-small")
    with pytest.raises(InvalidInputError, match="'stages' must be a non-empty list of GPU names"):
        hetero.balance_pipeline(model, "h100")
    with pytest.raises(UnknownNameError, match="known"):
        hetero.balance_pipeline(model, ["h100", "nosuchgpu"])
    with pytest.raises(UnsupportedError, match="t4 has no bf16 support"):
        hetero.balance_pipeline(model, ["t4", "h100"], pm.Strategy(micro_batch=4))
    with pytest.raises(InvalidInputError, match="'fake' is not one"):
        hetero.balance_pipeline(FAKE_MODEL, ["h100"])


@pytest.mark.parametrize("call, message", [
    (lambda: balance_layers([float("nan"), 2.0], 12), "'layer_s' must hold finite numbers > 0: got nan"),
    (lambda: balance_layers([1.0, 2.0], 12, fixed_s=[1.0, 2.0, 3.0]), "'fixed_s' must give one time per stage (2)"),
    (lambda: balance_layers([[1, 2], [3, 4]], 12), "'layer_s' must be a non-empty flat list"),
    (lambda: split_batch(10, [0, 0]), "'speeds' must hold finite numbers > 0: got 0.0"),
    (lambda: balance_pipeline("resnet50", ["a100", "h100"]), "'resnet50' is not one"),
    (lambda: stage_costs("gpt2-small", "h100", None), "'strategy' must be a pm.Strategy"),
])
def test_hetero_helpers_name_bad_input(call, message):
    with pytest.raises(pm.PerfModelError) as err:
        call()
    assert message in str(err.value)
