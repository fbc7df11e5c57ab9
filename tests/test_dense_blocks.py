"""Dense blocks in a mixture-of-experts model (DeepSeek-V3's first blocks, Qwen-MoE's mlp_only_layers)."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.explore import strategy_of
from perfmodel.step import param_counts
from perfmodel.workload.kernels import layer_kernels

H100 = pm.cluster("dgx-h100", nodes=1)
BASE = dict(layers=8, hidden=1024, heads=8, seq=1024, vocab=32000, activation="swiglu", norm="rmsnorm", bias=False,
            position="rotary", ffn_hidden=512, experts=16, experts_per_token=2, shared_ffn=512)
MOE = pm.transformer(**BASE)
MIXED = pm.transformer(**BASE, dense_layers=2, dense_ffn=4096)
DENSE_MLP = 3 * 1024 * 4096  # gate, up and down projections of the dense blocks


@pytest.mark.parametrize("kwargs, message", [
    (dict(layers=4, hidden=64, heads=4, dense_layers=1, dense_ffn=128),
     "'dense_layers'=1 are the dense blocks of a mixture-of-experts model: it needs experts > 1"),
    (dict(layers=4, hidden=64, heads=4, experts=4, dense_layers=1), "'dense_layers' and 'dense_ffn' go together"),
    (dict(layers=4, hidden=64, heads=4, experts=4, dense_ffn=128), "'dense_layers' and 'dense_ffn' go together"),
    (dict(layers=4, hidden=64, heads=4, experts=4, dense_layers=4, dense_ffn=128), "dense_layers"),
    (dict(layers=4, hidden=64, heads=4, experts=4, dense_layers=-1, dense_ffn=128), "dense_layers"),
])
def test_bad_dense_blocks_name_the_field(kwargs, message):
    with pytest.raises(pm.InvalidInputError, match=message):
        pm.transformer(**kwargs)


def test_parameters_count_each_block_as_it_is_and_the_average_block_adds_up():
    moe_mlp = MOE.layer_params()["mlp"]
    assert MOE.params - MIXED.params == 2 * (moe_mlp - DENSE_MLP)
    idle = (16 - 2) * 3 * 1024 * 512  # the experts a token does not use, in the 6 MoE blocks only
    assert MIXED.active_params == MIXED.params - 6 * idle
    for ep in (1, 4):  # the average block times the blocks is the model, each rank holding experts/ep of them
        p = param_counts(MIXED, ep=ep)
        experts = 6 * 16 * 3 * 1024 * 512
        assert p.layer * 8 + p.embed + p.head == pytest.approx(MIXED.params - experts * (1 - 1 / ep))
        assert p.expert_layer * 8 == pytest.approx(experts / ep)


def _gemm_flops(kernels, prefix=""):
    return sum(k.flops * k.count for k in kernels if k.cls == "gemm" and k.name.startswith(prefix))


def test_the_average_block_runs_the_experts_in_three_quarters_and_the_dense_mlp_in_a_quarter():
    tokens = 2 * 1024
    moe_f, _ = layer_kernels(MOE, 2)
    mixed_f, mixed_b = layer_kernels(MIXED, 2)
    assert _gemm_flops(mixed_f, "moe.") == pytest.approx(0.75 * _gemm_flops(moe_f, "moe."))
    assert _gemm_flops(mixed_f, "mlp.") == pytest.approx(0.25 * 2 * tokens * DENSE_MLP)
    assert _gemm_flops(mixed_f, "attn.") == pytest.approx(_gemm_flops(moe_f, "attn."))
    assert _gemm_flops(mixed_b) == pytest.approx(2 * _gemm_flops(mixed_f))


def test_only_the_moe_blocks_exchange_tokens_and_the_rest_is_priced():
    s = pm.Strategy(dp=8, ep=8, micro_batch=1, framework="megatron", zero=1)
    mixed, moe = pm.predict(MIXED, H100, s), pm.predict(MOE, H100, s)
    assert mixed.breakdown["tp_comm"] == pytest.approx(0.75 * moe.breakdown["tp_comm"])  # the all-to-alls
    assert np.isfinite(mixed.mfu) and 0 < mixed.mfu < 1 and mixed.peak_memory > 0
    # the dense MLP is wider than the 2 experts a token runs: the dense blocks compute more per token
    assert mixed.breakdown["forward"] > moe.breakdown["forward"]


@pytest.mark.parametrize("framework", ["megatron", "torchtitan"])
def test_search_rows_of_a_model_with_dense_blocks_are_what_predict_says(framework):
    top = pm.search(MIXED, H100, 16, top_k=3, framework=framework, max_micro_batch=2, max_virtual_stages=2)
    assert len(top)
    for _, row in top.iterrows():
        p = pm.predict(MIXED, H100, strategy_of(row))
        np.testing.assert_allclose([row["step_time"], row["peak_memory"]], [p.step_time, p.peak_memory], rtol=1e-9)


def test_with_and_the_toml_form_keep_the_dense_blocks(tmp_path):
    assert MIXED.with_(seq=2048).dense_layers == 2 and "dense_layers=2, dense_ffn=4096" in repr(MIXED)
    from perfmodel.workload.presets import model_from_toml

    path = tmp_path / "m.toml"
    path.write_text("\n".join(f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}".replace("'", '"')
                              for k, v in {**BASE, "dense_layers": 2, "dense_ffn": 4096}.items()))
    assert model_from_toml(path).params == MIXED.params


def test_no_validation_row_ran_dense_blocks_and_the_interval_says_so():
    s = pm.Strategy(dp=8, ep=8, micro_batch=1, framework="megatron", zero=1)
    small = dict(BASE, experts=8, shared_ffn=0)  # within the calibrated experts range (1-8)
    assert pm.predict(pm.transformer(**small, dense_layers=2, dense_ffn=4096), H100, s).interval_regime == \
        "uncalibrated: dense_blocks=on in no validation row"
    assert "dense_blocks" not in pm.predict(pm.transformer(**small), H100, s).interval_regime
