"""from_hf_config: published parameter counts of sixteen public configs, mapping details, errors."""

import dataclasses
import json
from pathlib import Path

import pytest

import perfmodel as pm
from perfmodel.workload.hf import FAMILIES, from_hf_config

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
# published parameter counts; sources in tests/fixtures/hf/README.md
PUBLISHED = {
    "llama-2-7b-hf": 6_738_415_616, "meta-llama-3-8b": 8_030_261_248, "mistral-7b-v0.1": 7_241_732_096,
    "mixtral-8x7b-v0.1": 46_702_792_704, "qwen2-7b": 7_615_616_512, "gpt2": 124_439_808,
    "pythia-1.4b": 1_414_647_808, "falcon-7b": 6_921_720_704, "bert-base-uncased": 110_000_000,
    "mpt-7b": 6_649_286_656, "qwen3-4b": 4_022_468_096, "gemma-7b": 8_537_680_896,
    "mistral-nemo-base-2407": 12_247_782_400, "phi-3-mini-4k-instruct": 3_821_079_552,
    "olmo-2-1124-7b": 7_298_617_344, "qwen3-30b-a3b": 30_532_122_624,
    "qwen1.5-moe-a2.7b-chat": 14_300_000_000, "olmoe-1b-7b-0924": 6_900_000_000,
    "deepseek-v3": 671_000_000_000, "deepseek-v2-lite": 15_700_000_000, "glm-4.5-air": 106_000_000_000,
    "gemma-2-2b": 2_614_341_888, "gemma-2-9b": 9_241_705_984, "gemma-2-27b": 27_227_128_320,
    "gemma-3-1b-it": 999_885_952, "gpt-oss-120b": 116_830_000_000, "gpt-oss-20b": 20_910_000_000,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_within_one_percent(name):
    m = from_hf_config(FIXTURES / f"{name}.json")
    assert isinstance(m, pm.Transformer)
    assert m.params == pytest.approx(PUBLISHED[name], rel=0.01)


def test_exact_where_the_architecture_is_expressible():
    for name in ("llama-2-7b-hf", "meta-llama-3-8b", "mistral-7b-v0.1", "mixtral-8x7b-v0.1", "gpt2", "pythia-1.4b", "mpt-7b",
                 "qwen3-4b", "gemma-7b", "mistral-nemo-base-2407",
                 "phi-3-mini-4k-instruct", "olmo-2-1124-7b",
                 "qwen3-30b-a3b", "gemma-2-2b", "gemma-2-9b", "gemma-2-27b", "gemma-3-1b-it"):
        assert from_hf_config(FIXTURES / f"{name}.json").params == PUBLISHED[name]


def test_field_mapping():
    llama3 = from_hf_config(FIXTURES / "meta-llama-3-8b.json")
    assert (llama3.kv_heads, llama3.ffn_hidden, llama3.activation, llama3.norm, llama3.position, llama3.seq) == (
        8, 14336, "swiglu", "rmsnorm", "rotary", 8192)
    mixtral = from_hf_config(FIXTURES / "mixtral-8x7b-v0.1.json")
    assert (mixtral.experts, mixtral.experts_per_token) == (8, 2)
    assert mixtral.active_params == pytest.approx(12.9e9, rel=0.01)  # Jiang et al. 2024: 12.9B active
    falcon = from_hf_config(FIXTURES / "falcon-7b.json")
    assert (falcon.kv_heads, falcon.head_dim, falcon.tied_embeddings, falcon.bias) == (1, 64, True, False)
    bert = from_hf_config(FIXTURES / "bert-base-uncased.json")
    assert (bert.arch, bert.causal, bert.position) == ("encoder", False, "learned")
    gpt2 = from_hf_config(FIXTURES / "gpt2.json")
    assert gpt2.params == pm.preset("gpt2-small").params
    assert from_hf_config(FIXTURES / "llama-2-7b-hf.json").params == pm.preset("llama-2-7b").params


def test_inputs_dict_folder_seq_and_name(tmp_path):
    cfg = json.loads((FIXTURES / "meta-llama-3-8b.json").read_text())
    assert from_hf_config(cfg, seq=4096).seq == 4096
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = from_hf_config(tmp_path, name="llama3")
    assert m.name == "llama3" and m.params == PUBLISHED["meta-llama-3-8b"]
    assert from_hf_config({**cfg, "_name_or_path": "meta-llama/Meta-Llama-3-8B"}).name == "meta-llama/Meta-Llama-3-8B"
    falcon_old = {k: v for k, v in json.loads((FIXTURES / "falcon-7b.json").read_text()).items()
                  if k not in ("num_attention_heads", "num_hidden_layers")}
    assert from_hf_config({**falcon_old, "n_head": 71, "n_layer": 32}).params == from_hf_config(
        FIXTURES / "falcon-7b.json").params  # the original RW config key names
    assert pm.from_hf_config is from_hf_config


def test_unknown_model_type_lists_supported():
    with pytest.raises(pm.UnknownNameError) as info:
        from_hf_config({"model_type": "t5", "d_model": 512})
    msg = str(info.value)
    assert msg.startswith("unknown model_type 't5'")
    assert all(family in msg for family in FAMILIES)
    with pytest.raises(pm.InvalidInputError, match="config has no 'model_type' \\(supported: bert, deepseek_v2, deepseek_v3, falcon, gemma, gemma2, "
                       "gemma3_text, glm4_moe"):
        from_hf_config({"hidden_size": 8})


def test_missing_keys_are_named():
    cfg = json.loads((FIXTURES / "llama-2-7b-hf.json").read_text())
    del cfg["hidden_size"], cfg["vocab_size"]
    with pytest.raises(pm.InvalidInputError,
                       match="config of model_type 'llama' lacks required keys: hidden_size, vocab_size"):
        from_hf_config(cfg)
    with pytest.raises(pm.InvalidInputError, match="lacks required keys: n_layer or num_hidden_layers"):
        from_hf_config({"model_type": "gpt2", "n_embd": 768, "n_head": 12, "vocab_size": 50257})


def test_unsupported_shapes_and_bad_files(tmp_path):
    cfg = json.loads((FIXTURES / "mistral-7b-v0.1.json").read_text())
    with pytest.raises(pm.InvalidInputError, match="'head_dim' must be"):
        from_hf_config({**cfg, "head_dim": "128"})
    with pytest.raises(pm.InvalidInputError, match="does not exist"):
        from_hf_config(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(pm.InvalidInputError, match="not valid JSON"):
        from_hf_config(bad)
    with pytest.raises(pm.InvalidInputError, match="'config' must be a dict or a path"):
        from_hf_config(42)


def test_mpt_mapping_follows_mptconfig():
    mpt = from_hf_config(FIXTURES / "mpt-7b.json")
    # ALiBi turns learned positions off (configuration_mpt.py _validate_config); no_bias drops every bias
    assert (mpt.position, mpt.bias, mpt.tied_embeddings, mpt.activation, mpt.ffn_hidden, mpt.norm) == (
        "none", False, True, "gelu", 16384, "layernorm")
    assert dataclasses.replace(mpt, name="mpt-7b") == pm.preset("mpt-7b")
    cfg = json.loads((FIXTURES / "mpt-7b.json").read_text())
    learned = from_hf_config({**cfg, "attn_config": {"alibi": False}, "no_bias": False})
    assert learned.position == "learned" and learned.bias
    assert learned.params - mpt.params == 2048 * 4096 + 32 * (3 * 4096 + 4096 + 16384 + 4096 + 2 * 4096) + 4096
    gqa = from_hf_config({**cfg, "attn_config": {"attn_type": "grouped_query_attention", "kv_n_heads": 8},
                          "ffn_config": {"ffn_type": "mptglu", "ffn_hidden_size": 11008}})
    assert (gqa.kv_heads, gqa.activation, gqa.ffn_hidden) == (8, "swiglu", 11008)
    for ratio in ("4", None, float("nan"), {}):  # found by random configs: a bare TypeError or ValueError before
        with pytest.raises(pm.InvalidInputError, match="'expansion_ratio' must be a finite number"):
            from_hf_config({**cfg, "expansion_ratio": ratio})
    with pytest.raises(pm.UnsupportedError, match="attn_type='cross_attention' is not modelled"):
        from_hf_config({**cfg, "attn_config": {"attn_type": "cross_attention"}})
    with pytest.raises(pm.InvalidInputError, match="'attn_config' and 'ffn_config' of an MPT config"):
        from_hf_config({**cfg, "attn_config": [1]})


def test_head_dim_apart_from_hidden_and_qk_norms():
    """Gemma (16 heads of 256 over hidden 3072), Qwen3-4B and Mistral-NeMo (32 heads of 128 over 2560 and 5120):
    q and the attention output are heads · head_dim wide; Qwen3 normalises q and k per head."""
    gemma = from_hf_config(FIXTURES / "gemma-7b.json")
    assert (gemma.head_dim, gemma.attn_width, gemma.tied_embeddings, gemma.qk_norm) == (256, 4096, True, "none")
    # Gemma Team 2024 (arXiv:2403.08295) Table 2: 7,751,248,896 non-embedding parameters
    assert gemma.params - gemma.embedding_params == 7_751_248_896
    qwen3 = from_hf_config(FIXTURES / "qwen3-4b.json")
    assert (qwen3.head_dim, qwen3.attn_width, qwen3.qkv_out, qwen3.qk_norm) == (128, 4096, 6144, "head")
    assert qwen3.layer_params()["norms"] == 2 * 2560 + 2 * 128
    moe = from_hf_config(FIXTURES / "qwen3-30b-a3b.json")
    assert (moe.experts, moe.experts_per_token, moe.ffn_hidden, moe.qk_norm) == (128, 8, 768, "head")
    assert moe.active_params == 3_353_032_704  # the model card: 3.3B activated
    cfg = json.loads((FIXTURES / "qwen3-30b-a3b.json").read_text())
    # Qwen3MoeDecoderLayer: a block in mlp_only_layers runs Qwen3MoeMLP of intermediate_size instead of the experts
    mixed = from_hf_config({**cfg, "mlp_only_layers": [0, 1]})
    assert (mixed.dense_layers, mixed.dense_ffn) == (2, 6144)
    assert moe.params - mixed.params == 2 * (128 * 3 * 2048 * 768 + 2048 * 128 - 3 * 2048 * 6144)
    with pytest.raises(pm.InvalidInputError, match="'mlp_only_layers' must be a list of block indices from 0 to 47"):
        from_hf_config({**cfg, "mlp_only_layers": [48]})
    with pytest.raises(pm.UnsupportedError, match="model_type 'gemma3' is not modelled: a vision encoder"):
        from_hf_config({"model_type": "gemma3", "text_config": {}})
    olmo2 = from_hf_config(FIXTURES / "olmo-2-1124-7b.json")
    assert olmo2.qk_norm == "full" and olmo2.layer_params()["norms"] == 2 * 4096 + 4096 + 4096
    mistral = json.loads((FIXTURES / "mistral-7b-v0.1.json").read_text())
    tied = from_hf_config({**mistral, "head_dim": 128})  # hidden / heads written out: the same model
    assert tied == from_hf_config(mistral) and tied.explicit_head_dim is None
    wide = from_hf_config({**mistral, "head_dim": 160})
    assert wide.params - tied.params == 32 * (4096 * (32 + 2 * 8) * 32 + 32 * 32 * 4096)


def test_shared_experts_and_olmoe():
    """Qwen2-MoE: 60 routed experts of 1408 (4 per token) beside a gated shared expert of 5632 on every token;
    OLMoE: 64 experts of 1024, 8 per token, q/k norms over the whole q and k. Active counts: the model card's
    2.7B activated (Qwen1.5-MoE-A2.7B) and the OLMoE paper's 1.3B active (Muennighoff et al. 2024)."""
    qwen = from_hf_config(FIXTURES / "qwen1.5-moe-a2.7b-chat.json")
    assert (qwen.experts, qwen.experts_per_token, qwen.ffn_hidden, qwen.shared_ffn, qwen.shared_gate) == \
        (60, 4, 1408, 5632, True)
    assert qwen.shared_params == 3 * 2048 * 5632 + 2048
    assert qwen.active_params == pytest.approx(2.7e9, rel=0.01)
    olmoe = from_hf_config(FIXTURES / "olmoe-1b-7b-0924.json")
    assert (olmoe.experts, olmoe.experts_per_token, olmoe.ffn_hidden, olmoe.qk_norm, olmoe.shared_ffn) == \
        (64, 8, 1024, "full", 0)
    assert olmoe.active_params == pytest.approx(1.3e9, rel=0.02)
    cfg = json.loads((FIXTURES / "qwen1.5-moe-a2.7b-chat.json").read_text())
    # decoder_sparse_step 2: blocks 1, 3, 5, ... have experts (the (i + 1) % step == 0 ones), the rest one MLP
    assert from_hf_config({**cfg, "decoder_sparse_step": 2}).dense_layers == 12
    with pytest.raises(pm.UnsupportedError, match="no block has experts"):
        from_hf_config({**cfg, "decoder_sparse_step": 25})
    with pytest.raises(pm.InvalidInputError, match="shared_expert_intermediate_size"):
        from_hf_config({k: v for k, v in cfg.items() if k != "shared_expert_intermediate_size"})


def test_deepseek_latent_attention_shared_experts_and_dense_first_blocks():
    """DeepSeek-V3: 671B parameters, 37B activated (its report, §1; the Hub's 685B adds the 14B multi-token-
    prediction module); V2-Lite: 15.7B, 2.4B activated (DeepSeek-V2 report, appendix B), the embedding left out of
    its active count as here 2.45B. Each from its parts: latent attention, 3 and 1 dense first blocks."""
    v3 = from_hf_config(FIXTURES / "deepseek-v3.json")
    assert (v3.kv_lora_rank, v3.q_lora_rank, v3.head_dim, v3.rope_head_dim, v3.v_dim) == (512, 1536, 128, 64, 128)
    assert (v3.experts, v3.experts_per_token, v3.shared_ffn, v3.dense_layers, v3.dense_ffn) == (256, 8, 2048, 3, 18432)
    attention = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert v3.layer_params()["attention"] == attention and v3.layer_params()["norms"] == 2 * 7168 + 1536 + 512
    assert v3.params == 671_026_404_352 and v3.active_params == pytest.approx(37.5e9, rel=0.01)
    lite = from_hf_config(FIXTURES / "deepseek-v2-lite.json")
    assert (lite.q_lora_rank, lite.shared_ffn, lite.dense_layers) == (0, 2 * 1408, 1)
    assert lite.params == 15_706_484_224
    assert lite.active_params - lite.embedding_params == pytest.approx(2.4e9, rel=0.03)
    cfg = json.loads((FIXTURES / "deepseek-v2-lite.json").read_text())
    assert from_hf_config({**cfg, "first_k_dense_replace": 0}).dense_layers == 0
    assert from_hf_config({**cfg, "moe_layer_freq": 2}).dense_layers == 14  # blocks 1, 3, ... and block 0
    with pytest.raises(pm.UnsupportedError, match="attention_bias=true in latent attention is not modelled"):
        from_hf_config({**cfg, "attention_bias": True})
    with pytest.raises(pm.InvalidInputError, match="lacks required keys: kv_lora_rank"):
        from_hf_config({k: v for k, v in cfg.items() if k != "kv_lora_rank"})


def test_glm_4_5_air_dense_first_block_and_shared_expert():
    """GLM-4.5-Air: 106B total, 12B activated (the model card), here 106,851,586,048 and 12.18B without the
    embedding and the head: 96 heads of 128 over hidden 4096 (8 KV heads), 128 experts of 1408 (8 per token) and
    one shared, a dense first block of 10944; its q/k/v biases (14,336 per block) are not modelled."""
    air = from_hf_config(FIXTURES / "glm-4.5-air.json")
    assert (air.heads, air.kv_heads, air.head_dim, air.experts, air.experts_per_token) == (96, 8, 128, 128, 8)
    assert (air.shared_ffn, air.dense_layers, air.dense_ffn, air.qk_norm, air.bias) == (1408, 1, 10944, "none", False)
    assert air.params == 106_851_586_048
    assert air.active_params - air.embedding_params - air.head_params == pytest.approx(12e9, rel=0.02)
    cfg = json.loads((FIXTURES / "glm-4.5-air.json").read_text())
    assert from_hf_config({**cfg, "use_qk_norm": True}).qk_norm == "head"
    with pytest.raises(pm.UnsupportedError, match="no block has experts"):
        from_hf_config({**cfg, "first_k_dense_replace": 46})
