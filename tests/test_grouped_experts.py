"""Routed experts as grouped GEMMs (torchtitan's torch._grouped_mm, Megatron-Core's --moe-grouped-gemm)."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel import step as compose
from perfmodel.explore import strategy_of
from perfmodel.parallel.config import StepConfig
from perfmodel.workload.kernels import layer_kernels
from perfmodel.workload.stacks.experts import group_expert_kernels, grouped_experts

H100, A100 = pm.cluster("dgx-h100", nodes=1), pm.cluster("dgx-a100-80gb", nodes=1)
MOE = pm.transformer(layers=4, hidden=1024, heads=8, seq=1024, vocab=32000, activation="swiglu", norm="rmsnorm",
                     bias=False, position="rotary", ffn_hidden=512, experts=16, experts_per_token=2)


def _experts(kernels):
    return [k for k in kernels if k.name.startswith("moe.expert.")]


@pytest.mark.parametrize("recompute", ["none", "full", "every-2", "selective-op"])
def test_grouping_keeps_flops_and_bytes_and_makes_one_launch_per_linear(recompute):
    ep = 4
    local = MOE.experts // ep
    fwd, bwd = layer_kernels(MOE, 2, ep=ep, recompute=recompute)
    for looped in (fwd, bwd):
        grouped = group_expert_kernels(looped, local)
        assert len(grouped) == len(looped)
        assert [k.name for k in grouped] == [k.name for k in looped]  # the rest untouched, in order
        for a, b in zip(_experts(looped), _experts(grouped)):
            assert b.flops * b.count == pytest.approx(a.flops * a.count)  # the same work ...
            assert b.count == pytest.approx(a.count / local)  # ... in 1/local of the launches
            if a.cls == "gemm":  # every local expert's rows stacked: a weight gradient stacks its outputs
                assert (b.size["m"], b.size["n"], b.size["k"]) == (a.size["m"] * local, a.size["n"], a.size["k"])
            else:
                assert b.size["x"] == pytest.approx(a.size["x"] * local)
    tokens = 2 * MOE.seq * MOE.experts_per_token  # routed rows of the local experts (balanced routing)
    fc1 = next(k for k in group_expert_kernels(fwd, local) if k.name == "moe.expert.fc1")
    assert fc1.size["m"] == pytest.approx(tokens) and fc1.count == 1


def test_each_stack_runs_its_own_default_on_its_gpus():
    assert grouped_experts(None, "torchtitan", 9.0) and not grouped_experts(None, "torchtitan", 8.0)
    assert grouped_experts(None, "torchtitan", None)  # a GPU not in the catalog: the stack's default
    assert not grouped_experts(None, "megatron", 9.0) and grouped_experts(True, "megatron", 8.0)
    assert not grouped_experts(None, "pytorch", 9.0) and not grouped_experts(False, "torchtitan", 9.0)
    assert pm.hardware.compute_capability("h200") == 9.0 and pm.hardware.compute_capability("l4") == 8.9


def _layer_seconds(strategy, cluster=H100):
    c = StepConfig.from_strategy(strategy)
    prof = pm.load_profile(cluster.gpu.name)
    t = compose.compute_times(MOE, prof, c, precision=strategy.precision, recompute="none")
    return float(t.gpu.layer_f + t.gpu.layer_b)


def test_grouped_experts_run_faster_than_one_gemm_per_expert():
    base = dict(dp=8, ep=8, micro_batch=1, framework="torchtitan")
    default, grouped = _layer_seconds(pm.Strategy(**base)), _layer_seconds(pm.Strategy(**base, grouped_experts=True))
    looped = _layer_seconds(pm.Strategy(**base, grouped_experts=False))
    assert default == grouped < looped  # torchtitan groups them on an H100 unless told not to
    # below SM90 torchtitan falls back to its loop: the A100 default is the loop
    a100 = dict(base, framework="torchtitan")
    assert _layer_seconds(pm.Strategy(**a100), A100) == _layer_seconds(pm.Strategy(**a100, grouped_experts=False), A100)
    mega = dict(dp=8, ep=8, micro_batch=1, framework="megatron", zero=1)
    assert _layer_seconds(pm.Strategy(**mega)) == _layer_seconds(pm.Strategy(**mega, grouped_experts=False))
    assert _layer_seconds(pm.Strategy(**mega, grouped_experts=True)) < _layer_seconds(pm.Strategy(**mega))
    dense = pm.preset("llama-3-8b")  # no experts: nothing to group, the option does not act
    s = dict(dp=8, micro_batch=1, framework="torchtitan")
    assert (pm.predict(dense, H100, pm.Strategy(**s, grouped_experts=False)).step_time
            == pm.predict(dense, H100, pm.Strategy(**s)).step_time)


def test_options_that_do_not_apply_are_refused_naming_the_field():
    with pytest.raises(pm.UnsupportedError, match="'grouped_experts'=True does not apply to framework='pytorch'.*"
                                                  "stacks that take it: torchtitan, megatron"):
        pm.Strategy(grouped_experts=True)
    with pytest.raises(pm.InvalidInputError, match="'grouped_experts' must be True or False"):
        pm.Strategy(framework="megatron", grouped_experts="sometimes")
    with pytest.raises(pm.UnsupportedError, match="needs compute capability 9.0 or newer.*a100-sxm4-80gb is 8.0"):
        pm.predict(MOE, A100, pm.Strategy(dp=8, ep=8, framework="torchtitan", grouped_experts=True))


def test_the_interval_says_no_validation_row_ran_grouped_experts():
    grouped = pm.predict(MOE, H100, pm.Strategy(dp=8, ep=8, micro_batch=1, framework="megatron", zero=1,
                                                 grouped_experts=True))
    assert grouped.interval_regime.startswith("uncalibrated: experts_gemm=grouped in no validation row")
    looped = pm.predict(MOE, H100, pm.Strategy(dp=8, ep=8, micro_batch=1, framework="megatron", zero=1))
    assert "experts_gemm" not in looped.interval_regime


def test_search_holds_grouped_experts_and_its_rows_are_what_predict_says():
    kw = dict(top_k=3, framework="megatron", max_micro_batch=2, max_virtual_stages=2, ep=[4, 8])
    held = pm.search(MOE, H100, 16, fixed={"grouped_experts": True}, **kw)
    assert held["grouped_experts"].all()
    for _, row in held.iterrows():
        s = strategy_of(row)
        assert s.grouped_experts is True
        p = pm.predict(MOE, H100, s)
        np.testing.assert_allclose([row["step_time"], row["peak_memory"]], [p.step_time, p.peak_memory], rtol=1e-9)
    assert held["step_time"].min() < pm.search(MOE, H100, 16, fixed={"grouped_experts": False}, **kw)["step_time"].min()
    # the default space tries grouped GEMMs too (Megatron-LM's --moe-grouped-gemm), so it finds that plan
    assert pm.search(MOE, H100, 16, **kw)["step_time"].min() == pytest.approx(held["step_time"].min())


def test_the_cli_takes_experts_gemm(capsys):
    from perfmodel.cli import main

    args = ["predict", "--model", "mixtral-8x7b", "--gpu", "h100", "--nodes", "4", "--gpus-per-node", "8", "--framework", "megatron",
            "--ep", "8", "--zero", "1", "--micro-batch", "1", "--global-batch", "64", "--pp", "4"]
    assert main(args + ["--experts-gemm", "grouped"]) == 0
    assert "grouped_experts=True" in capsys.readouterr().out
