"""framework="deepspeed": Megatron-LM layers under the DeepSpeed engine, whose host work is measured."""

from pathlib import Path

import pytest

import perfmodel as pm
from perfmodel.costs import engine_host
from perfmodel.core.errors import UnsupportedError
from perfmodel.explore import strategy_of
from perfmodel.fit.engine_host import fit_deepspeed_host

TABLE = Path(pm.__file__).parent / "data" / "deepspeed-host-2026-12-01" / "host.csv"


def test_coefficients_are_the_fit_of_the_bundled_measurements():
    fitted = fit_deepspeed_host(TABLE)
    for stage, (step_s, per_s) in engine_host.DEEPSPEED_HOST_S.items():
        assert fitted[stage][0] == pytest.approx(step_s, rel=1e-3, abs=1e-9)
        assert fitted[stage][1] == pytest.approx(per_s, rel=1e-3)


def test_engine_time_by_hand():
    # ZeRO-2: 181.0 us per tensor per micro-step; 100 tensors beside a 10 ms backward: 8.1 ms exposed, 4 times
    assert float(engine_host.deepspeed_host_time(2, 100, 4, 0.010)) == pytest.approx(4 * (100 * 1.810e-4 - 0.010))
    # ZeRO-1: 10.91 ms per step; 1.5 us per tensor hides behind any backward
    assert float(engine_host.deepspeed_host_time(1, 100, 4, 0.010)) == pytest.approx(1.091e-2)
    assert engine_host.layer_tensors(pm.transformer(layers=2, hidden=64, heads=4, seq=16, vocab=128)) == 12
    assert engine_host.layer_tensors(pm.preset("llama-3-8b")) == 6   # RMSNorm, no biases


def test_deepspeed_is_megatron_plus_its_engine_and_reduction():
    m = pm.transformer(layers=24, hidden=1024, heads=16, seq=1024, vocab=50304)
    c = pm.cluster("dgx-a100-80gb")
    kw = {"dp": 8, "micro_batch": 4, "global_batch": 128, "zero": 1, "precision": "fp16-mixed",
          "bucket_mib": 25.0}  # one bucket for both (Megatron-Core would take max(4e7, 1e6·dp) elements)
    meg = pm.predict(m, c, pm.Strategy(framework="megatron", **kw))
    ds = pm.predict(m, c, pm.Strategy(framework="deepspeed", **kw))
    # fp16 (no BF16_Optimizer passes): the engine's host work, and its reduction after the last backward
    # (parallel/deepspeed.py) in place of Megatron-LM's overlapped one
    reduce = ds.breakdown["dp_comm"] - meg.breakdown["dp_comm"]
    assert reduce > 0 and ds.breakdown["optimizer"] == pytest.approx(meg.breakdown["optimizer"], rel=1e-9)
    assert ds.step_time - meg.step_time == pytest.approx(1.091e-2 + reduce, rel=1e-6)
    assert ds.breakdown["host_overhead"] - meg.breakdown["host_overhead"] == pytest.approx(1.091e-2, rel=1e-6)
    assert ds.peak_memory == meg.peak_memory
    assert sum(ds.breakdown.values()) == pytest.approx(ds.step_time, rel=1e-6)


def test_options_deepspeed_lacks_are_refused():
    with pytest.raises(UnsupportedError, match="'compile'=True does not apply to framework='deepspeed'"):
        pm.Strategy(framework="deepspeed", compile=True)


def test_search_prices_the_engine_as_predict_does():
    m = pm.transformer(layers=12, hidden=1024, heads=16, seq=1024, vocab=50304)
    c = pm.cluster("dgx-a100-80gb")
    top = pm.search(m, c, 64, top_k=3, framework="deepspeed", cp=1, max_micro_batch=4, max_virtual_stages=1)
    for _, row in top.iterrows():
        s = strategy_of(row)
        assert s.framework == "deepspeed"
        assert row["step_time"] == pytest.approx(pm.predict(m, c, s).step_time, rel=1e-9)
