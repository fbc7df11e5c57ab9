"""Transformers from a Hugging Face ``config.json``, read as plain JSON (no ``transformers`` import).

    import perfmodel as pm
    m = pm.from_hf_config("path/to/config.json")        # or a folder holding one, or a dict
    m = pm.from_hf_config(cfg_dict, seq=4096)           # training context other than the config's

Supported ``model_type`` values and how each maps onto :func:`perfmodel.transformer`
are in :data:`FAMILIES`; approximations (parallel attention/MLP, partial rotary,
Qwen2's QKV-only biases, Falcon's single layer norm) are listed in docs/workloads.md.
They change parameter counts by well under 0.1% and kernel lists slightly.
"""

from __future__ import annotations

from pathlib import Path

from perfmodel.core.checks import check_int, check_positive, read_json_file
from perfmodel.core.errors import InvalidInputError, UnsupportedError, unknown_name
from perfmodel.workload.model import Transformer, transformer

# q/k norms by family: Qwen3's over each head (transformers modeling_qwen3.py ``Qwen3Attention``), OLMo 2's over
# the whole q and k (modeling_olmo2.py ``Olmo2Attention``: RMSNorm(heads · head_dim), RMSNorm(kv_heads · head_dim))
# OLMoE's likewise (modeling_olmoe.py ``OlmoeAttention``: RMSNorm(hidden_size), RMSNorm(kv_heads · head_dim))
# Gemma 3's per head (modeling_gemma3.py ``Gemma3Attention``: q_norm, k_norm of head_dim)
QK_NORM_OF = {"qwen3": "head", "qwen3_moe": "head", "olmo2": "full", "olmoe": "full", "gemma3_text": "head"}
GATED = {"silu", "swish", "gelu", "gelu_pytorch_tanh", "gelu_new"}  # gated (SwiGLU-shaped) MLP in Llama-style models
WINDOWED = {"mistral", "mixtral", "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma2", "gemma3_text",
            "gpt_oss"}
LAYER_TYPES = {"sliding_attention", "full_attention"}


def _need(cfg: dict, family: str, *keys) -> list:
    """Values of required keys; each key may be a tuple of aliases (first found wins)."""
    values, missing = [], []
    for key in keys:
        names = key if isinstance(key, tuple) else (key,)
        name = next((n for n in names if cfg.get(n) is not None), None)
        if name is None:
            missing.append(" or ".join(names))
            continue
        values.append(check_int(name, cfg[name]))  # every required key is a count: refuse "4", [0] or 2.5 here
    if missing:
        raise InvalidInputError(f"config of model_type {family!r} lacks required keys: {', '.join(missing)}")
    return values


def _head_dim(cfg: dict):
    """The config's ``head_dim`` (None where it gives none: hidden / heads)."""
    return None if cfg.get("head_dim") is None else check_int("head_dim", cfg["head_dim"])


def _llama(cfg: dict, family: str) -> dict:
    """Llama, Mistral, Mixtral, Qwen2, Qwen3 (and their MoE models: ``_moe``), OLMoE, Gemma, Phi-3 (its
    fused gate_up_proj: the same GEMM) and OLMo 2 (its two norms on the branch outputs instead of their inputs:
    norms of the same size): RMSNorm, rotary, gated MLP, no biases; untied by default (Gemma: tied);
    ``head_dim`` where the config gives one (Gemma, Qwen3, Mistral-NeMo: heads · head_dim need not be hidden);
    the q/k norms of ``QK_NORM_OF``."""
    layers, hidden, heads, ffn, vocab = _need(cfg, family, "num_hidden_layers", "hidden_size", "num_attention_heads",
                                              "intermediate_size", "vocab_size")
    # Gemma's configs name the MLP's activation hidden_activation (transformers GemmaConfig), older ones hidden_act
    act = str(cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu")
    if act not in GATED:
        raise UnsupportedError(f"hidden_act={act!r} in a gated MLP is not modelled (known: {', '.join(sorted(GATED))})")
    out = dict(layers=layers, hidden=hidden, heads=heads, kv_heads=heads if cfg.get("num_key_value_heads") is None else cfg["num_key_value_heads"],
               ffn_hidden=ffn, vocab=vocab, seq=cfg.get("max_position_embeddings", 4096), activation="swiglu",
               norm="rmsnorm", bias=bool(cfg.get("attention_bias", False) and cfg.get("mlp_bias", False)),
               tied_embeddings=bool(cfg.get("tie_word_embeddings", family.startswith("gemma"))), position="rotary",
               head_dim=_head_dim(cfg), qk_norm=QK_NORM_OF.get(family, "none"))
    out.update(_window(cfg, family))
    out.update(_moe(cfg, family))
    return out


def _moe(cfg: dict, family: str) -> dict:
    """The experts of a MoE family: Mixtral's ``num_local_experts`` of intermediate_size; OLMoE's ``num_experts`` of
    intermediate_size; Qwen3-MoE's and Qwen2-MoE's ``num_experts`` of moe_intermediate_size, and Qwen2-MoE's shared
    expert of ``shared_expert_intermediate_size`` with its sigmoid gate (transformers ``modeling_qwen2_moe.py``
    ``Qwen2MoeSparseMoeBlock``: ``shared_expert``, ``shared_expert_gate`` = Linear(hidden, 1, bias=False))."""
    if family == "mixtral":
        return dict(zip(("experts", "experts_per_token"), _need(cfg, family, "num_local_experts", "num_experts_per_tok")))
    if family == "olmoe":
        return dict(zip(("experts", "experts_per_token"), _need(cfg, family, "num_experts", "num_experts_per_tok")))
    if family == "glm4_moe":
        return _glm4_moe(cfg, family)
    if family not in ("qwen3_moe", "qwen2_moe"):
        return {}
    out = dict(zip(("experts", "experts_per_token", "ffn_hidden"),
                   _need(cfg, family, "num_experts", "num_experts_per_tok", "moe_intermediate_size")))
    dense = _dense_layers(cfg, family)
    if dense:  # those blocks run Qwen2MoeMLP / Qwen3MoeMLP of intermediate_size
        out.update(dense_layers=dense, dense_ffn=_need(cfg, family, "intermediate_size")[0])
    if family == "qwen2_moe":
        out["shared_ffn"], out["shared_gate"] = _need(cfg, family, "shared_expert_intermediate_size")[0], True
    return out


def _window(cfg: dict, family: str) -> dict:
    """The sliding window (0: none) and the blocks that attend to the whole context instead (``global_layers``).
    A config's ``layer_types`` ("sliding_attention" / "full_attention" per block, transformers >= 4.53) decides where
    given; else each family's default (transformers' configuration files): Mistral's, Mixtral's and Phi-3's
    ``sliding_window`` on every block (null: none); Qwen's only with ``use_sliding_window``, on the blocks from
    ``max_window_layers`` on; Gemma 2's on every other block (block i when i + 1 is odd); Gemma 3's on all but
    every ``sliding_window_pattern``-th (default 6)."""
    qwen = family in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe")
    size = cfg.get("sliding_window")
    if size is None or (qwen and not cfg.get("use_sliding_window")) or family not in WINDOWED:
        return {"window": 0, "global_layers": 0}
    window, layers = check_int("sliding_window", size), check_int("num_hidden_layers", cfg["num_hidden_layers"])
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or not set(types) <= LAYER_TYPES:
            raise InvalidInputError(f"'layer_types' must list one of {sorted(LAYER_TYPES)} per block "
                                    f"({layers} blocks): got {types!r}")
        sliding = types.count("sliding_attention")
    elif qwen:
        sliding = max(layers - check_int("max_window_layers", cfg.get("max_window_layers", layers), minimum=0), 0)
    elif family == "gemma2":
        sliding = (layers + 1) // 2
    elif family == "gemma3_text":
        sliding = layers - layers // check_int("sliding_window_pattern", cfg.get("sliding_window_pattern", 6))
    else:
        sliding = layers
    return {"window": window if sliding else 0, "global_layers": layers - sliding if sliding else 0}


def _gpt_oss(cfg: dict, family: str) -> dict:
    """gpt-oss (transformers ``modeling_gpt_oss.py``): Llama-shaped blocks with biases on q, k, v and o
    (``attention_bias``), a learned sink logit per head (``GptOssAttention.sinks``), ``num_local_experts`` experts
    of intermediate_size with biases and a router with a bias per expert (``GptOssExperts``, ``GptOssTopKRouter``),
    a sliding window on every other block (``layer_types``). Its SwiGLU variant (clamped at ``swiglu_limit``,
    σ(1.702·x)) is priced as SwiGLU; the released checkpoints' MXFP4 experts are trained here in the step's
    precision."""
    out = _llama(cfg, family)
    experts, top = _need(cfg, family, "num_local_experts", ("num_experts_per_tok", "experts_per_token"))
    out.update(bias=True, attention_sinks=True, experts=experts, experts_per_token=top)
    return out


def _gemma(cfg: dict, family: str) -> dict:
    """Gemma 2 and Gemma 3 (text): Llama-shaped blocks with a norm on each branch's output too (transformers
    ``Gemma2DecoderLayer``: ``post_attention_layernorm``, ``post_feedforward_layernorm``), the sliding window on
    some blocks (``_window``), the logits capped at ``final_logit_softcapping`` (``Gemma2ForCausalLM``); Gemma 3's
    per-head q/k norms come from ``QK_NORM_OF``."""
    out = _llama(cfg, family)
    cap = cfg.get("final_logit_softcapping")
    out.update(post_norms=True, logit_softcap=0.0 if cap is None else check_positive("final_logit_softcapping", cap))
    return out


def _deepseek_moe(cfg: dict, family: str) -> dict:
    """The experts of DeepSeekMoE-style configs (DeepSeek-V2/V3, GLM-4.5): ``n_routed_experts`` of
    ``moe_intermediate_size`` (``num_experts_per_tok`` per token) beside ``n_shared_experts`` shared ones (one MLP of
    n_shared × that width, ``DeepseekV3MoE.shared_experts``), and a dense MLP of ``intermediate_size`` in block i
    unless i >= ``first_k_dense_replace`` and i % ``moe_layer_freq`` == 0 (transformers ``DeepseekV3DecoderLayer``;
    GLM-4.5 has no ``moe_layer_freq``: 1)."""
    layers, experts, top_k, width = _need(cfg, family, "num_hidden_layers", "n_routed_experts", "num_experts_per_tok",
                                          "moe_intermediate_size")
    first = check_int("first_k_dense_replace", cfg.get("first_k_dense_replace") or 0, minimum=0)
    freq = check_int("moe_layer_freq", cfg.get("moe_layer_freq") or 1)
    dense = sum(1 for i in range(layers) if not (i >= first and i % freq == 0))
    if dense >= layers:
        raise UnsupportedError(f"first_k_dense_replace={first}, moe_layer_freq={freq} of {layers} blocks: no block "
                               "has experts (describe the model as dense)")
    shared = check_int("n_shared_experts", cfg.get("n_shared_experts") or 0, minimum=0)
    return dict(experts=experts, experts_per_token=top_k, ffn_hidden=width, shared_ffn=shared * width,
                dense_layers=dense, dense_ffn=_need(cfg, family, "intermediate_size")[0] if dense else 0)


def _glm4_moe(cfg: dict, family: str) -> dict:
    """GLM-4.5's experts (transformers ``modeling_glm4_moe.py``: ``_deepseek_moe``) and per-head q/k norms where
    ``use_qk_norm``. Approximated: its q/k/v biases (``attention_bias``; none here, as for Qwen2) and its rotary
    embedding on ``partial_rotary_factor`` of each head (priced over the whole head, as GPT-NeoX's); not counted:
    the router's per-expert bias and the multi-token-prediction block the Hugging Face model does not build."""
    return dict(_deepseek_moe(cfg, family), qk_norm="head" if cfg.get("use_qk_norm") else "none", bias=False)


def _dense_layers(cfg: dict, family: str) -> int:
    """How many of Qwen3-MoE's and Qwen2-MoE's blocks run a dense MLP: block i does when i is in ``mlp_only_layers``
    or (i + 1) is not a multiple of ``decoder_sparse_step`` (transformers ``modeling_qwen3_moe.py``
    ``Qwen3MoeDecoderLayer``, ``modeling_qwen2_moe.py`` ``Qwen2MoeDecoderLayer``). Where they sit is not modelled:
    the step is priced per average block (docs/workloads.md)."""
    layers = _need(cfg, family, "num_hidden_layers")[0]
    only = cfg.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and 0 <= i < layers for i in only):
        raise InvalidInputError(f"'mlp_only_layers' must be a list of block indices from 0 to {layers - 1}: "
                                f"got {only!r}")
    step = check_int("decoder_sparse_step", cfg.get("decoder_sparse_step", 1))
    dense = sum(1 for i in range(layers) if i in only or (i + 1) % step)
    if dense >= layers:
        raise UnsupportedError(f"mlp_only_layers={only!r}, decoder_sparse_step={step}: no block has experts "
                               "(describe the model as dense)")
    return dense


def _deepseek(cfg: dict, family: str) -> dict:
    """DeepSeek-V2 and -V3 (transformers ``modeling_deepseek_v3.py``; V2's modeling file on the Hub): multi-head
    latent attention (``q_lora_rank``, null in V2-Lite: q projected directly; ``kv_lora_rank``; per head
    ``qk_nope_head_dim`` + ``qk_rope_head_dim`` for q and k, ``v_head_dim`` for v) and the experts of
    ``_deepseek_moe``. Not modelled: V3's
    per-expert ``e_score_correction_bias`` (n_routed_experts per MoE block) and the multi-token-prediction
    module (``num_nextn_predict_layers``), which the Hugging Face model does not build."""
    if cfg.get("attention_bias"):
        raise UnsupportedError("attention_bias=true in latent attention is not modelled (DeepSeek's are false)")
    layers, hidden, heads, vocab, kv_rank, nope, rope, v = _need(
        cfg, family, "num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "kv_lora_rank",
        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    return dict(layers=layers, hidden=hidden, heads=heads, kv_heads=heads, vocab=vocab,
                seq=cfg.get("max_position_embeddings", 4096), activation="swiglu", norm="rmsnorm", bias=False,
                tied_embeddings=bool(cfg.get("tie_word_embeddings", False)), position="rotary", head_dim=nope,
                kv_lora_rank=kv_rank, q_lora_rank=check_int("q_lora_rank", cfg.get("q_lora_rank") or 0, minimum=0),
                rope_head_dim=rope, v_head_dim=v, **_deepseek_moe(cfg, family))


def _gpt2(cfg: dict, family: str) -> dict:
    """GPT-2: learned positions, pre-LayerNorm, GELU MLP of n_inner (4h), biases, tied head."""
    layers, hidden, heads, vocab = _need(cfg, family, ("n_layer", "num_hidden_layers"), ("n_embd", "hidden_size"),
                                         ("n_head", "num_attention_heads"), "vocab_size")
    return dict(layers=layers, hidden=hidden, heads=heads, vocab=vocab, ffn_hidden=cfg.get("n_inner") or 4 * hidden,
                seq=cfg.get("n_positions", cfg.get("n_ctx", 1024)), activation="gelu", norm="layernorm", bias=True,
                tied_embeddings=True, position="learned")


def _neox(cfg: dict, family: str) -> dict:
    """GPT-NeoX / Pythia: rotary on a fraction of head dims, parallel residual, biases, untied head."""
    layers, hidden, heads, ffn, vocab = _need(cfg, family, "num_hidden_layers", "hidden_size", "num_attention_heads",
                                              "intermediate_size", "vocab_size")
    return dict(layers=layers, hidden=hidden, heads=heads, ffn_hidden=ffn, vocab=vocab,
                seq=cfg.get("max_position_embeddings", 2048), activation="gelu", norm="layernorm",
                bias=bool(cfg.get("attention_bias", True)), tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                position="rotary")


def _falcon(cfg: dict, family: str) -> dict:
    """Falcon: multi-query (7B) or grouped (new decoder) attention, parallel attention/MLP, no linear biases."""
    layers, hidden, heads, vocab = _need(cfg, family, ("num_hidden_layers", "n_layer"), "hidden_size",
                                         ("num_attention_heads", "n_head"), "vocab_size")
    if cfg.get("new_decoder_architecture"):
        kv = heads if cfg.get("num_kv_heads") is None else cfg["num_kv_heads"]
    else:
        kv = 1 if cfg.get("multi_query", True) else heads
    return dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv, vocab=vocab,
                ffn_hidden=cfg.get("ffn_hidden_size") or 4 * hidden, seq=cfg.get("max_position_embeddings", 2048),
                activation="gelu", norm="layernorm", bias=bool(cfg.get("bias", False)),
                tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
                position="none" if cfg.get("alibi") else "rotary")


def _bert(cfg: dict, family: str) -> dict:
    """BERT: post-LN encoder, learned positions + 2 token types, GELU, biases, MLM head tied to the embedding."""
    layers, hidden, heads, ffn, vocab = _need(cfg, family, "num_hidden_layers", "hidden_size", "num_attention_heads",
                                              "intermediate_size", "vocab_size")
    if cfg.get("type_vocab_size", 2) != 2:
        raise UnsupportedError(f"type_vocab_size={cfg['type_vocab_size']}: perfmodel.transformer models BERT's 2 token types")
    return dict(layers=layers, hidden=hidden, heads=heads, ffn_hidden=ffn, vocab=vocab,
                seq=cfg.get("max_position_embeddings", 512), activation="gelu", norm="layernorm", bias=True,
                tied_embeddings=True, position="learned", arch="encoder", causal=False)


def _mpt(cfg: dict, family: str) -> dict:
    """MPT (llm-foundry ``MPTConfig``, mosaicml/llm-foundry 8c8dd48 models/mpt/configuration_mpt.py): pre-LayerNorm,
    a GELU MLP of expansion_ratio·d_model (``ffn_config.ffn_type`` "mptglu": gated), biases unless ``no_bias``,
    tied head; learned positions unless ALiBi or RoPE (the config turns ``learned_pos_emb`` off for either)."""
    layers, hidden, heads, vocab = _need(cfg, family, "n_layers", "d_model", "n_heads", "vocab_size")
    attn, ffn = cfg.get("attn_config") or {}, cfg.get("ffn_config") or {}
    if not isinstance(attn, dict) or not isinstance(ffn, dict):
        raise InvalidInputError("'attn_config' and 'ffn_config' of an MPT config must be JSON objects")
    kind = attn.get("attn_type", "multihead_attention")
    kv = {"multihead_attention": heads, "multiquery_attention": 1}.get(kind)
    if kind == "grouped_query_attention":
        kv = check_int("kv_n_heads", attn.get("kv_n_heads", heads))
    if kv is None:
        raise UnsupportedError(f"attn_type={kind!r} is not modelled (known: multihead_attention, "
                               "multiquery_attention, grouped_query_attention)")
    ratio = check_positive("expansion_ratio", cfg.get("expansion_ratio", 4))
    ffn_hidden = ffn.get("ffn_hidden_size") or int(hidden * ratio)  # ffn.py resolve_ffn_hidden_size
    position = "rotary" if attn.get("rope") else "none" if attn.get("alibi") else \
        "learned" if cfg.get("learned_pos_emb", True) else "none"
    return dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv, vocab=vocab,
                ffn_hidden=check_int("ffn_hidden_size", ffn_hidden), seq=cfg.get("max_seq_len", 2048),
                activation="swiglu" if ffn.get("ffn_type") == "mptglu" else "gelu",
                norm="rmsnorm" if "rmsnorm" in str(cfg.get("norm_type", "")) else "layernorm",
                bias=not bool(cfg.get("no_bias", False)), tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
                position=position, head_dim=_head_dim(cfg))


FAMILIES = {"llama": _llama, "mistral": _llama, "mixtral": _llama, "qwen2": _llama, "qwen3": _llama,
            "qwen3_moe": _llama, "qwen2_moe": _llama, "olmoe": _llama, "glm4_moe": _llama, "gemma": _llama, "olmo2": _llama,
            "gemma2": _gemma, "gemma3_text": _gemma, "gpt_oss": _gpt_oss,
            "phi3": _llama, "gpt2": _gpt2, "deepseek_v2": _deepseek, "deepseek_v3": _deepseek,
            "gpt_neox": _neox, "falcon": _falcon, "bert": _bert,
            "mpt": _mpt}


# families close to a supported one by name whose blocks differ in what is priced (transformers' modeling files)
NOT_MODELLED = {
    "gemma3": "a vision encoder beside the language model (its text_config, model_type gemma3_text, is modelled: "
              "pm.from_hf_config(config['text_config']))",
    "llama4": "chunked attention and no positions on every fourth block (its interleaved dense and MoE blocks "
              "with a shared expert are: pm.transformer(dense_layers=..., shared_ffn=...))",
}


def read_config(path_or_dict) -> dict:
    """The config as a dict: from a dict, a ``config.json`` path, or a folder holding one."""
    if isinstance(path_or_dict, dict):
        return dict(path_or_dict)
    if not isinstance(path_or_dict, (str, Path)):
        raise InvalidInputError(f"'config' must be a dict or a path to config.json: got {type(path_or_dict).__name__}")
    path = Path(path_or_dict)
    if path.is_dir():
        path = path / "config.json"
    data = read_json_file(path, field="config", expect="a config.json or a folder with one")
    if not isinstance(data, dict):
        raise InvalidInputError(f"{path}: a config must be a JSON object")
    return data


def from_hf_config(path_or_dict, *, seq: int | None = None, name: str | None = None) -> Transformer:
    """A :class:`Transformer` from a Hugging Face config (dict, file or folder).

    ``seq`` overrides the training context (default: the config's maximum positions; for
    learned position embeddings that table's size is part of the parameter count).
    """
    cfg = read_config(path_or_dict)
    family = cfg.get("model_type")
    if family is None:
        raise InvalidInputError(f"config has no 'model_type' (supported: {', '.join(sorted(FAMILIES))})")
    if not isinstance(family, str):
        raise InvalidInputError(f"'model_type' must be a name (supported: {', '.join(sorted(FAMILIES))}): got {family!r}")
    if family in NOT_MODELLED:  # a known family: say what is missing, not which name is close
        raise UnsupportedError(f"model_type {family!r} is not modelled: {NOT_MODELLED[family]} (supported: "
                               f"{', '.join(sorted(FAMILIES))}; pm.transformer(...) describes an approximation)")
    if family not in FAMILIES:
        raise unknown_name("model_type", family, FAMILIES)
    fields = FAMILIES[family](cfg, family)
    if seq is not None:
        fields["seq"] = seq
    label = name or cfg.get("_name_or_path") or family
    return transformer(**fields, name=str(label))
