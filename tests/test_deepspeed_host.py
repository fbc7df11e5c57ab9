"""framework="deepspeed": Megatron-LM layers under the DeepSpeed engine, whose host work is measured."""

from pathlib import Path

import pytest

import perfmodel as pm
from perfmodel.costs import engine_host
from perfmodel.core.errors import UnsupportedError
from perfmodel.costs.host import HostCosts
from perfmodel.explore import strategy_of
from perfmodel.parallel.config import StepConfig
from perfmodel.step import compute_times
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


def test_syncs_by_hand():
    # 19 launches at 15 us after each micro-batch's wait, only where micro-batches are loaded
    assert float(engine_host.batch_sync_time(1.5e-5, True)) == pytest.approx(19 * 1.5e-5)
    assert float(engine_host.batch_sync_time(1.5e-5, False)) == 0.0
    # 12 blocks, 2 waits each, 2 launches the GPU waits for at each: 48 x 15 us = 0.72 ms per forward
    assert float(engine_host.layer_sync_time(1.5e-5, 12)) == pytest.approx(0.72e-3)


def test_hooks_hide_only_behind_the_backward_the_gpu_still_has_queued():
    # a step whose layers the host sets the pace of (tiny layers): the GPU runs their backward kernels
    # as soon as they are issued; BF16_Optimizer's per-tensor hooks after the backward hide only behind
    # what is still queued when the host is done (the embedding's backward, GPU-bound): wall - host seconds
    m = pm.transformer(layers=4, hidden=256, heads=4, seq=128, vocab=512)
    c = pm.cluster("a100-sxm4-80gb")
    profile = pm.load_profile("a100-sxm4-80gb")
    kw = {"dp": 1, "micro_batch": 1, "global_batch": 4, "zero": 0, "precision": "bf16-mixed",
          "attention": "flash"}  # the same kernels under both stacks (deepspeed's own default is unfused)
    meg = pm.predict(m, c, pm.Strategy(framework="megatron", **kw))
    s = pm.Strategy(framework="deepspeed", **kw)
    ds = pm.predict(m, c, s)
    t = compute_times(m, profile, StepConfig.from_strategy(s), precision="bf16-mixed", recompute="none")
    assert t.cpu.layer_b == pytest.approx(t.wall.layer_b)  # the layers are host-bound
    slack = 4 * (t.wall.layer_b - t.cpu.layer_b) + t.wall.embed_b - t.cpu.embed_b + t.wall.head_b - t.cpu.head_b
    hooks = engine_host.DEEPSPEED_HOST_S[0][1] * float(engine_host.stage_tensors(m, 4, True, True))
    assert 0 < slack < hooks
    sync = (engine_host.BATCH_OPS + 4 * 2 * 2) * HostCosts.of(profile).cpu_per_kernel_s
    assert ds.breakdown["host_overhead"] - meg.breakdown["host_overhead"] == pytest.approx(
        4 * (hooks - slack + sync), rel=1e-6)


def test_a_gpu_bound_backward_still_hides_the_hooks():
    m = pm.transformer(layers=24, hidden=2048, heads=16, seq=2048, vocab=50304)
    c = pm.cluster("dgx-a100-80gb")
    kw = {"dp": 8, "micro_batch": 4, "global_batch": 128, "zero": 0, "precision": "bf16-mixed", "attention": "flash"}
    meg = pm.predict(m, c, pm.Strategy(framework="megatron", **kw))
    ds = pm.predict(m, c, pm.Strategy(framework="deepspeed", **kw))
    sync = 4 * (engine_host.BATCH_OPS + 24 * 2 * 2) * HostCosts.of(pm.load_profile("a100-sxm4-80gb")).cpu_per_kernel_s
    assert ds.breakdown["host_overhead"] - meg.breakdown["host_overhead"] == pytest.approx(sync, rel=1e-6)


def test_full_recompute_runs_each_block_forward_and_its_waits_again():
    # Megatron-DeepSpeed f4157be: _checkpointed_forward re-runs ParallelTransformerLayer.forward (and its two
    # torch.tensor(0.0, device=...) waits) in backward; selective re-runs only the attention core
    m = pm.transformer(layers=24, hidden=2048, heads=16, seq=2048, vocab=50304)
    c = pm.cluster("dgx-a100-80gb")
    kw = {"dp": 8, "micro_batch": 4, "global_batch": 128, "zero": 0, "precision": "bf16-mixed", "attention": "flash"}
    cpu = HostCosts.of(pm.load_profile("a100-sxm4-80gb")).cpu_per_kernel_s

    def engine(recompute):
        meg = pm.predict(m, c, pm.Strategy(framework="megatron", recompute=recompute, **kw))
        ds = pm.predict(m, c, pm.Strategy(framework="deepspeed", recompute=recompute, **kw))
        return ds.breakdown["host_overhead"] - meg.breakdown["host_overhead"]

    once = 4 * (engine_host.BATCH_OPS + 24 * 2 * 2) * cpu
    assert engine("none") == pytest.approx(once, rel=1e-6)
    assert engine("selective") == pytest.approx(once, rel=1e-6)
    assert engine("full") == pytest.approx(once + 4 * 24 * 2 * 2 * cpu, rel=1e-6)
    assert engine_host.layer_forwards("full") == 2.0 and engine_host.layer_forwards("selective") == 1.0


def test_deepspeed_is_megatron_plus_its_engine_and_reduction():
    m = pm.transformer(layers=24, hidden=1024, heads=16, seq=1024, vocab=50304)
    c = pm.cluster("dgx-a100-80gb")
    kw = {"dp": 8, "micro_batch": 4, "global_batch": 128, "zero": 1, "precision": "fp16-mixed", "attention": "flash",
          "bucket_mib": 25.0}  # one bucket for both (Megatron-Core would take max(4e7, 1e6·dp) elements)
    meg = pm.predict(m, c, pm.Strategy(framework="megatron", **kw))
    ds = pm.predict(m, c, pm.Strategy(framework="deepspeed", **kw))
    # fp16 (no BF16_Optimizer passes): the engine's host work, and its reduction after the last backward
    # (parallel/deepspeed.py) in place of Megatron-LM's overlapped one
    reduce = ds.breakdown["dp_comm"] - meg.breakdown["dp_comm"]
    assert reduce > 0 and ds.breakdown["optimizer"] == pytest.approx(meg.breakdown["optimizer"], rel=1e-9)
    # + each of the 4 micro-batches' ops between broadcast_data's .cpu() and the first forward kernel,
    # and the GPU's idle launches around each block's two torch.tensor(0.0, device=...) waits (24 blocks)
    sync = 4 * (engine_host.BATCH_OPS + 24 * 2 * 2) * HostCosts.of(pm.load_profile("a100-sxm4-80gb")).cpu_per_kernel_s
    assert ds.step_time - meg.step_time == pytest.approx(1.091e-2 + sync + reduce, rel=1e-6)
    assert ds.breakdown["host_overhead"] - meg.breakdown["host_overhead"] == pytest.approx(1.091e-2 + sync, rel=1e-6)
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
