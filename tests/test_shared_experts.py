"""Shared experts beside the routed ones (Qwen2-MoE, DeepSeekMoE): kernels, parameters, memory, communication."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel import step as compose
from perfmodel.costs.memory import layer_activation_bytes
from perfmodel.explore import strategy_of
from perfmodel.workload.kernels import layer_kernels

H100 = pm.cluster("dgx-h100", nodes=1)
BASE = dict(layers=4, hidden=1024, heads=8, seq=1024, vocab=32000, activation="swiglu", norm="rmsnorm", bias=False,
            position="rotary", ffn_hidden=512, experts=8, experts_per_token=2)
ROUTED = pm.transformer(**BASE)
SHARED = pm.transformer(**BASE, shared_ffn=2048, shared_gate=True)


@pytest.mark.parametrize("kwargs, message", [
    (dict(shared_ffn=1024), "'shared_ffn'=1024 is a shared expert beside routed ones: it needs experts > 1"),
    (dict(experts=4, shared_ffn=-1), "shared_ffn"),
    (dict(experts=4, shared_gate=True), "'shared_gate'=True gates a shared expert: it needs shared_ffn > 0"),
    (dict(experts=4, shared_ffn=64, shared_gate="yes"), "'shared_gate' must be True or False"),
])
def test_bad_shared_experts_name_the_field(kwargs, message):
    with pytest.raises(pm.InvalidInputError, match=message):
        pm.transformer(layers=2, hidden=64, heads=4, **kwargs)


def _gemm_flops(kernels, prefix):
    return sum(k.flops * k.count for k in kernels if k.cls == "gemm" and k.name.startswith(prefix))


def test_the_shared_expert_runs_every_token_and_is_not_split_by_expert_parallelism():
    tokens = 2 * SHARED.seq
    for ep in (1, 4):
        fwd, bwd = layer_kernels(SHARED, 2, ep=ep)
        # fc1 (gate and up) and fc2 over every local token, whatever ep holds of the routed experts
        assert _gemm_flops(fwd, "moe.shared.") == pytest.approx(2 * tokens * 3 * 1024 * 2048)
        assert _gemm_flops(bwd, "moe.shared.") == pytest.approx(2 * _gemm_flops(fwd, "moe.shared."))
        assert _gemm_flops(fwd, "moe.shared_gate") == pytest.approx(2 * tokens * 1024)
        # the routed experts' work per rank stays tokens · top_k of the whole group (balanced routing)
        assert _gemm_flops(fwd, "moe.expert.") == pytest.approx(2 * tokens * 2 * 3 * 1024 * 512)
    routed_names = {k.name for k in layer_kernels(ROUTED, 2)[0]}
    assert not any(n.startswith("moe.shared") for n in routed_names)


def test_expert_parallelism_shards_the_routed_experts_only():
    for ep in (1, 2, 8):
        shared, routed = compose.param_counts(SHARED, ep=ep), compose.param_counts(ROUTED, ep=ep)
        assert shared.expert_layer == pytest.approx(routed.expert_layer)  # 8/ep experts of 3·1024·512
        assert shared.expert_layer == pytest.approx(8 / ep * 3 * 1024 * 512)
        assert shared.layer - routed.layer == pytest.approx(SHARED.shared_params)
        assert shared.gemm_layer - routed.gemm_layer == pytest.approx(3 * 1024 * 2048 + 1024)
    assert SHARED.active_params - ROUTED.active_params == SHARED.layers * SHARED.shared_params


def test_the_shared_expert_saves_its_mlp_its_input_cast_and_its_gated_output():
    kw = dict(precision="bf16-mixed", framework="pytorch")
    extra = layer_activation_bytes(SHARED, **kw) - layer_activation_bytes(ROUTED, **kw)
    # eager SwiGLU keeps gate, up, silu and product (swiglu_saved 4: three tensors + the fc2 input), the shared
    # expert's and the gate's 16-bit input casts, the shared output the gate multiplies
    assert extra == pytest.approx(2 * 4 * 2048 + 2 * (2 * 1024) + 2 * 1024)
    assert layer_activation_bytes(SHARED, recompute="full", **kw) == layer_activation_bytes(ROUTED, recompute="full", **kw)


def test_a_shared_expert_adds_its_own_tensor_parallel_collectives():
    def exposed(model, tp):
        p = pm.predict(model, H100, pm.Strategy(tp=tp, dp=8 // tp, micro_batch=1, framework="megatron",
                                                 sequence_parallel=tp > 1))
        return p.breakdown["tp_comm"]
    assert exposed(SHARED, 1) == exposed(ROUTED, 1) == 0.0
    assert exposed(SHARED, 4) > exposed(ROUTED, 4) > 0.0


@pytest.mark.parametrize("framework", ["megatron", "pytorch", "torchtitan"])
def test_search_rows_of_a_shared_expert_model_are_what_predict_says(framework):
    top = pm.search(SHARED, H100, 16, top_k=3, framework=framework, max_micro_batch=2, max_virtual_stages=2)
    for _, row in top.iterrows():
        p = pm.predict(SHARED, H100, strategy_of(row))
        np.testing.assert_allclose([row["step_time"], row["peak_memory"]], [p.step_time, p.peak_memory], rtol=1e-9)


def test_a_shared_expert_costs_time_and_memory():
    s = pm.Strategy(dp=8, micro_batch=2)
    with_shared, routed = pm.predict(SHARED, H100, s), pm.predict(ROUTED, H100, s)
    assert with_shared.step_time > routed.step_time
    assert with_shared.peak_memory > routed.peak_memory
    assert np.isfinite(with_shared.mfu) and 0 < with_shared.mfu < 1


def test_search_tries_expert_parallel_sizes_for_a_moe_model():
    from perfmodel.explore.search import expert_choices
    assert expert_choices(pm.preset("llama-3-8b"), None) == 1
    assert expert_choices(SHARED, None) == (1, 2, 4, 8)
    assert expert_choices(pm.transformer(layers=2, hidden=64, heads=4, experts=60, experts_per_token=4), None) == (1, 2, 4)
    kw = dict(top_k=40, framework="megatron", precision="bf16-mixed", max_micro_batch=2, max_virtual_stages=2)
    default = pm.search(SHARED, H100, 16, **kw)
    assert default["ep"].max() > 1  # the default space holds the expert-parallel layouts
    for _, row in default.head(3).iterrows():
        p = pm.predict(SHARED, H100, strategy_of(row))
        np.testing.assert_allclose([row["step_time"], row["peak_memory"]], [p.step_time, p.peak_memory], rtol=1e-9)
    assert set(pm.search(SHARED, H100, 16, ep=1, **kw)["ep"]) == {1}
    assert set(pm.search(SHARED, H100, 16, ep=[2, 4], **kw)["ep"]) <= {2, 4}
    with pytest.raises(pm.InvalidInputError, match="'ep'=3 must divide"):
        pm.search(SHARED, H100, 16, ep=3, **kw)


def test_an_expert_parallel_list_a_dense_model_cannot_take_says_why():
    with pytest.raises(pm.InvalidInputError, match="needs a mixture-of-experts model"):
        pm.search("llama-3-8b", H100, 16, ep=[2, 4], top_k=1, max_micro_batch=1)
