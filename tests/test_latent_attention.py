"""Multi-head latent attention (DeepSeek-V2/V3): fields, kernels, saved bytes, whole steps."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.costs.memory import layer_activation_bytes
from perfmodel.explore import strategy_of
from perfmodel.workload.kernels import layer_kernels

H100 = pm.cluster("dgx-h100", nodes=1)
MLA = dict(layers=4, hidden=1024, heads=16, seq=2048, vocab=32000, activation="swiglu", norm="rmsnorm", bias=False,
           position="rotary", head_dim=128, kv_lora_rank=512, q_lora_rank=768, rope_head_dim=64, v_head_dim=128)
MODEL = pm.transformer(**MLA)


@pytest.mark.parametrize("kwargs, message", [
    (dict(q_lora_rank=64), "'q_lora_rank'=64 belongs to multi-head latent attention: it needs kv_lora_rank > 0"),
    (dict(v_head_dim=64), "'v_head_dim'=64 belongs to multi-head latent attention"),
    (dict(kv_lora_rank=64, kv_heads=2), "it needs kv_heads = heads"),
    (dict(kv_lora_rank=64, qk_norm="head"), "qk_norm='none'"),
    (dict(kv_lora_rank=64, bias=True), "bias=False"),
    (dict(kv_lora_rank=-1), "kv_lora_rank"),
])
def test_bad_latent_attention_names_the_field(kwargs, message):
    fields = dict(layers=2, hidden=64, heads=4, bias=False, **{k: v for k, v in kwargs.items() if k != "bias"})
    fields["bias"] = kwargs.get("bias", False)
    with pytest.raises(pm.InvalidInputError, match=message):
        pm.transformer(**fields)


def _flops(kernels, name):
    return sum(k.flops * k.count for k in kernels if k.name == name)


def test_the_projections_and_attention_run_each_width_and_tensor_parallelism_splits_only_the_heads():
    b, s, h = 2, 2048, 1024
    tokens = b * s
    for tp in (1, 4):
        fwd, _ = layer_kernels(MODEL, b, tp=tp)
        assert _flops(fwd, "attn.q_a") == pytest.approx(2 * tokens * h * 768)  # whole on every rank
        assert _flops(fwd, "attn.kv_a") == pytest.approx(2 * tokens * h * (512 + 64))
        assert _flops(fwd, "attn.q_b") == pytest.approx(2 * tokens * 768 * 16 * 192 / tp)
        assert _flops(fwd, "attn.kv_b") == pytest.approx(2 * tokens * 512 * 16 * 256 / tp)
        assert _flops(fwd, "attn.proj") == pytest.approx(2 * tokens * 16 * 128 * h / tp)
        # q·kᵀ over 192 dimensions, attention·v over 128 (FlopCounterMode's full s²)
        assert _flops(fwd, "attn.sdpa") == pytest.approx(2 * b * 16 / tp * s * s * (192 + 128))
    direct = pm.transformer(**{**MLA, "q_lora_rank": 0})
    fwd, _ = layer_kernels(direct, b)
    assert _flops(fwd, "attn.q") == pytest.approx(2 * tokens * h * 16 * 192) and not _flops(fwd, "attn.q_a")


def test_saved_bytes_follow_the_latent_and_value_widths():
    kw = dict(framework="megatron", precision="bf16-mixed")
    base = layer_activation_bytes(MODEL, **kw)
    # a latent is saved twice in 16 bits (its RMSNorm's input, the up projection's normed input)
    assert layer_activation_bytes(MODEL.with_(kv_lora_rank=1024), **kw) - base == pytest.approx(2 * 2 * 512)
    assert layer_activation_bytes(MODEL.with_(q_lora_rank=1024), **kw) - base == pytest.approx(2 * 2 * 256)
    # v and the attention output are heads · v_head_dim wide each (and the projection's input is the output)
    assert layer_activation_bytes(MODEL.with_(v_head_dim=192), **kw) - base == pytest.approx(2 * 2 * 16 * 64)
    # q and k are saved after the concatenation: heads · (head_dim + rope_head_dim) each
    wider = layer_activation_bytes(MODEL.with_(rope_head_dim=128), **kw) - base
    assert wider == pytest.approx(2 * 2 * 16 * 64 + 2 * 64)  # + k's shared rotary part in the K/V down output


@pytest.mark.parametrize("framework, fields", [
    ("megatron", dict(dp=4, tp=2, sequence_parallel=True, ep=4, zero=1)),
    ("megatron", dict(dp=4, cp=2, ep=4, zero=1)),
    ("torchtitan", dict(dp=8, ep=8)),
])
def test_deepseek_v2_lite_is_priced_and_search_agrees_with_predict(framework, fields):
    lite = pm.from_hf_config("tests/fixtures/hf/deepseek-v2-lite.json", seq=4096)
    s = pm.Strategy(framework=framework, micro_batch=1, global_batch=64, **fields)
    p = pm.predict(lite, H100, s)
    assert np.isfinite([p.step_time, p.peak_memory, p.mfu]).all() and 0 < p.mfu < 1
    top = pm.search(lite, H100, 64, top_k=2, framework=framework, max_micro_batch=2, max_virtual_stages=1)
    for _, row in top.iterrows():
        q = pm.predict(lite, H100, strategy_of(row))
        np.testing.assert_allclose([row["step_time"], row["peak_memory"]], [q.step_time, q.peak_memory], rtol=1e-9)


def test_no_validation_row_ran_latent_attention_and_the_interval_says_so():
    s = pm.Strategy(dp=8, micro_batch=1, framework="megatron", zero=1)
    p = pm.predict(MODEL, H100, s)
    assert p.interval_regime == "uncalibrated: latent_attention=on in no validation row"
    standard = pm.predict(pm.transformer(**{**MLA, "kv_lora_rank": 0, "q_lora_rank": 0, "rope_head_dim": 0,
                                            "v_head_dim": 0}), H100, s)
    assert "latent_attention" not in standard.interval_regime
