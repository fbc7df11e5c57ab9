"""Transformer workloads: description, parameter and FLOP counts.

``transformer(...)`` validates and returns a frozen :class:`Transformer`.
Which kernels one training step launches lives in :mod:`perfmodel.workload.kernels`.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.core.errors import InvalidInputError
from perfmodel.core.checks import check_choice, check_divides, check_int, check_positive
from perfmodel.workload import kernels

ACTIVATIONS = ("gelu", "swiglu", "relu")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rotary", "none")
ARCHS = ("decoder", "encoder")
QK_NORMS = ("none", "head", "full")  # norms of q and k: none, per head (Qwen3), over the whole width (OLMo 2)
# Bounds far above any model trained so far; they keep every count exact in 64-bit arithmetic
SIZE_LIMITS = {"layers": 100_000, "hidden": 2**20, "heads": 2**16, "seq": 2**30, "vocab": 2**30, "kv_heads": 2**16,
               "ffn_hidden": 2**23, "experts": 2**16, "experts_per_token": 2**16}
HEAD_DIM_LIMIT = 2**12  # far above any head width trained (Gemma's 256)


@dataclass(frozen=True)
class Transformer:
    """A GPT/Llama/BERT-style transformer, as data.

    Defaults mirror GPT-2 small. ``ffn_hidden`` defaults to 4·hidden for GELU
    and to Llama's 2/3·4·hidden rounded up to a multiple of 256 for SwiGLU.
    MoE layers replace the MLP by ``experts`` MLPs of which each token uses
    ``experts_per_token`` (Shazeer et al. 2017; Mixtral, Jiang et al. 2024).
    ``explicit_head_dim`` is the head width where it is not hidden / heads (Gemma: 16 heads of 256
    over hidden 3072; Qwen3-4B, Mistral-NeMo: heads · head_dim above hidden), None where it is;
    ``window`` > 0 is sliding-window attention: each query attends to itself and the window − 1 tokens before it
    (Mistral 7B v0.1: 4096; Phi-3-mini-4k: 2047), on every block but ``global_layers`` of them, which attend to the
    whole context (Gemma 2: every other block; Gemma 3: one in six); 0 is full causal attention everywhere.
    ``post_norms`` adds a norm on each branch's output before its residual add (Gemma 2 and 3: four per block).
    ``logit_softcap`` > 0 caps the logits as cap · tanh(logits / cap) (Gemma 2's ``final_logit_softcapping``).
    ``attention_sinks`` gives each head a learned logit every query's softmax includes (gpt-oss's ``sinks``).
    With ``bias`` a MoE router has a bias per expert too (gpt-oss's ``GptOssTopKRouter``).
    ``qk_norm`` normalises q and k before the rotary embedding: "head", one norm over each head's head_dim
    (Qwen3's ``q_norm``/``k_norm``); "full", one over all of q and one over all of k (OLMo 2, OLMo-core's
    ``qk_norm``); "none".
    ``shared_ffn`` > 0 (MoE only) is the width of a shared expert, an MLP of the block's activation that every
    token runs beside its routed experts, its output added to theirs (Qwen2-MoE's
    ``shared_expert_intermediate_size``; DeepSeekMoE's n_shared_experts × moe_intermediate_size, one MLP of that
    width in its code); ``shared_gate`` scales that output by sigmoid(x · w), w a hidden × 1 weight (Qwen2-MoE's
    ``shared_expert_gate``).
    ``dense_layers`` of a MoE model's blocks run one dense MLP of width ``dense_ffn`` instead of the experts
    (DeepSeek-V3's and GLM-4.5's ``first_k_dense_replace`` first blocks, Qwen-MoE's ``mlp_only_layers``); the
    parameter count is exact, the step is priced per average block (``moe_share``, docs/workloads.md).
    ``kv_lora_rank`` > 0 is multi-head latent attention (DeepSeek-V2, Liu et al. 2024 §2.1; transformers
    ``modeling_deepseek_v3.py`` ``DeepseekV3Attention``): K and V come up from a ``kv_lora_rank`` latent (normed),
    q from a ``q_lora_rank`` one (0: projected directly), each head's q and k carrying ``head_dim`` dimensions
    without position and ``rope_head_dim`` rotary ones (k's shared by the heads), v ``v_head_dim`` (0: head_dim).
    """

    layers: int = 12
    hidden: int = 768
    heads: int = 12
    seq: int = 1024
    vocab: int = 50304
    kv_heads: int = 12
    ffn_hidden: int = 3072
    activation: str = "gelu"
    norm: str = "layernorm"
    bias: bool = True
    tied_embeddings: bool = False
    position: str = "learned"
    causal: bool = True
    arch: str = "decoder"
    experts: int = 1
    experts_per_token: int = 1
    name: str = "transformer"
    explicit_head_dim: int | None = None
    qk_norm: str = "none"
    window: int = 0
    global_layers: int = 0
    post_norms: bool = False
    logit_softcap: float = 0.0
    attention_sinks: bool = False
    shared_ffn: int = 0
    shared_gate: bool = False
    dense_layers: int = 0
    dense_ffn: int = 0
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    rope_head_dim: int = 0
    v_head_dim: int = 0

    def __post_init__(self):
        """Every field checked with a message naming it, however the model was made."""
        for field, bound in SIZE_LIMITS.items():
            object.__setattr__(self, field, check_int(field, getattr(self, field), maximum=bound))
        if self.explicit_head_dim is not None:
            head_dim = check_int("head_dim", self.explicit_head_dim, maximum=HEAD_DIM_LIMIT)
            # the tied width written out is the tied model: one model, however it was written
            object.__setattr__(self, "explicit_head_dim", None if head_dim * self.heads == self.hidden else head_dim)
        if self.explicit_head_dim is None:
            check_divides("heads", self.heads, "hidden", self.hidden)
        if self.heads % self.kv_heads:
            valid = ", ".join(str(d) for d in range(1, self.heads + 1) if self.heads % d == 0)
            raise InvalidInputError(f"'kv_heads' must divide heads={self.heads}: got {self.kv_heads} (valid: {valid})")
        check_choice("activation", self.activation, ACTIVATIONS)
        check_choice("norm", self.norm, NORMS)
        check_choice("position", self.position, POSITIONS)
        check_choice("arch", self.arch, ARCHS)
        if self.experts_per_token > self.experts:
            raise InvalidInputError(
                f"'experts_per_token' must be <= experts={self.experts}: got {self.experts_per_token}")
        check_choice("qk_norm", self.qk_norm, QK_NORMS)
        self._check_window()
        object.__setattr__(self, "logit_softcap", check_positive("logit_softcap", self.logit_softcap, allow_zero=True))
        self._check_shared()
        self._check_latent()
        for flag in ("bias", "tied_embeddings", "causal", "post_norms", "attention_sinks"):
            if not isinstance(getattr(self, flag), bool):
                raise InvalidInputError(f"{flag!r} must be True or False: got {getattr(self, flag)!r}")
        object.__setattr__(self, "name", str(self.name))

    def _check_window(self) -> None:
        object.__setattr__(self, "window", check_int("window", self.window, minimum=0, maximum=SIZE_LIMITS["seq"]))
        full = check_int("global_layers", self.global_layers, minimum=0, maximum=max(self.layers - 1, 0))
        object.__setattr__(self, "global_layers", full)
        if full and not self.window:
            raise InvalidInputError(f"'global_layers'={full} are the blocks without the sliding window: it needs "
                                    "window > 0 (without a window every block attends to the whole context)")

    def _check_shared(self) -> None:
        shared = check_int("shared_ffn", self.shared_ffn, minimum=0, maximum=SIZE_LIMITS["ffn_hidden"])
        object.__setattr__(self, "shared_ffn", shared)
        if not isinstance(self.shared_gate, bool):
            raise InvalidInputError(f"'shared_gate' must be True or False: got {self.shared_gate!r}")
        if shared and self.experts == 1:
            raise InvalidInputError(f"'shared_ffn'={shared} is a shared expert beside routed ones: it needs experts > 1 "
                                    "(a dense model's MLP is ffn_hidden)")
        if self.shared_gate and not shared:
            raise InvalidInputError("'shared_gate'=True gates a shared expert: it needs shared_ffn > 0")
        dense = check_int("dense_layers", self.dense_layers, minimum=0, maximum=max(self.layers - 1, 0))
        width = check_int("dense_ffn", self.dense_ffn, minimum=0, maximum=SIZE_LIMITS["ffn_hidden"])
        object.__setattr__(self, "dense_layers", dense)
        object.__setattr__(self, "dense_ffn", width)
        if dense and self.experts == 1:
            raise InvalidInputError(f"'dense_layers'={dense} are the dense blocks of a mixture-of-experts model: it "
                                    "needs experts > 1 (a dense model's blocks are all dense)")
        if bool(dense) != bool(width):
            raise InvalidInputError(f"'dense_layers' and 'dense_ffn' go together (blocks with a dense MLP, and its "
                                    f"width): got dense_layers={dense}, dense_ffn={width}")

    def _check_latent(self) -> None:
        for name in ("kv_lora_rank", "q_lora_rank", "rope_head_dim", "v_head_dim"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), minimum=0, maximum=SIZE_LIMITS["hidden"]))
        given = [n for n in ("q_lora_rank", "rope_head_dim", "v_head_dim") if getattr(self, n)]
        if not self.kv_lora_rank:
            if given:
                raise InvalidInputError(f"{given[0]!r}={getattr(self, given[0])} belongs to multi-head latent "
                                        "attention: it needs kv_lora_rank > 0")
            return
        if self.kv_heads != self.heads or self.qk_norm != "none" or self.bias:
            raise InvalidInputError(f"multi-head latent attention (kv_lora_rank={self.kv_lora_rank}) has a key and a "
                                    "value per head, no q/k norms and no biases: it needs kv_heads = heads, "
                                    f"qk_norm='none', bias=False (got kv_heads={self.kv_heads}, heads={self.heads}, "
                                    f"qk_norm={self.qk_norm!r}, bias={self.bias})")

    # -- derived sizes ---------------------------------------------------
    @property
    def window_share(self) -> float:
        """The fraction of blocks whose attention runs within the sliding window (0 without one)."""
        return (self.layers - self.global_layers) / self.layers if self.window else 0.0

    @property
    def v_dim(self) -> int:
        """Each head's value width: v_head_dim under latent attention where given, else head_dim."""
        return self.v_head_dim or self.head_dim

    @property
    def attention_head_dim(self) -> float:
        """The head width attention is priced at: head_dim, or under latent attention the mean of q·k's
        (head_dim + rope_head_dim) and v's widths, which carries its FLOPs, 2·b·heads·s²·(d_qk + d_v)."""
        return (self.head_dim + self.rope_head_dim + self.v_dim) / 2 if self.kv_lora_rank else self.head_dim

    @property
    def attention_in_weights(self) -> int:
        """Weights of the attention's projections before its output projection: the fused QKV, or under latent
        attention q's (down, up or direct), the K/V down projection with k's rotary part, and the K/V up one."""
        if not self.kv_lora_rank:
            return self.hidden * self.qkv_out
        h, heads, qk = self.hidden, self.heads, self.head_dim + self.rope_head_dim
        q = h * self.q_lora_rank + self.q_lora_rank * heads * qk if self.q_lora_rank else h * heads * qk
        return q + h * (self.kv_lora_rank + self.rope_head_dim) + self.kv_lora_rank * heads * (self.head_dim + self.v_dim)

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads

    @property
    def attn_width(self) -> int:
        """Width of the attention output (and of the queries without latent attention): heads·head_dim, hidden
        unless head_dim is explicit; under latent attention heads·v_dim."""
        return self.heads * self.v_dim

    @property
    def qkv_out(self) -> int:
        """Output width of the fused QKV projection: heads·head_dim + 2·kv_heads·head_dim."""
        return self.attn_width + 2 * self.kv_heads * self.head_dim

    def _fc1_width(self, ffn: int) -> int:
        """Width of the first projection of an MLP of width ``ffn`` (gate and up both for SwiGLU)."""
        return 2 * ffn if self.activation == "swiglu" else ffn

    @property
    def mlp_in_out(self) -> int:
        """Width of the MLP's first projection (gate and up both for SwiGLU)."""
        return self._fc1_width(self.ffn_hidden)

    def mlp_weights(self, ffn: int) -> int:
        """Weight elements of one MLP of width ``ffn`` in this model's activation (0 for width 0)."""
        return self.hidden * self._fc1_width(ffn) + ffn * self.hidden

    def _mlp_params(self, ffn: int) -> int:
        """Parameters of one MLP of width ``ffn``: its weights and, with ``bias``, its two biases."""
        return self.mlp_weights(ffn) + int(self.bias) * (self._fc1_width(ffn) + self.hidden) if ffn else 0

    @property
    def shared_params(self) -> int:
        """Parameters of a block's shared expert and its gate (0 without one)."""
        return self._mlp_params(self.shared_ffn) + self.hidden * int(self.shared_gate)

    # -- parameters ------------------------------------------------------
    def _norm_params(self) -> int:
        # LayerNorm has a weight and (with bias) a bias; RMSNorm a weight only.
        return 2 * self.hidden if self.norm == "layernorm" and self.bias else self.hidden

    def layer_params(self) -> dict[str, int]:
        """Parameters of one block, by part (dense; MoE counts every expert)."""
        h, b = self.hidden, int(self.bias)
        attn = self.attention_in_weights + b * self.qkv_out + self.attn_width * h + b * h + self.heads * self.attention_sinks
        mlp_one = self._mlp_params(self.ffn_hidden)
        router = (h + b) * self.experts if self.experts > 1 else 0
        # a weight of head_dim each for q and k ("head"), or of q's and k's whole widths ("full")
        qk_norms = {"none": 0, "head": 2 * self.head_dim, "full": self.attn_width + self.kv_heads * self.head_dim}
        qk_norms = qk_norms[self.qk_norm]
        latent = self.q_lora_rank + self.kv_lora_rank  # latent attention's RMSNorms of its two latents
        return {"attention": attn, "mlp": mlp_one * self.experts + router + self.shared_params,
                "norms": (2 + 2 * self.post_norms) * self._norm_params() + qk_norms + latent}

    @property
    def embedding_params(self) -> int:
        pos = self.seq * self.hidden if self.position == "learned" else 0
        types = 2 * self.hidden if self.arch == "encoder" else 0
        emb_norm = self._norm_params() if self.arch == "encoder" else 0
        return self.vocab * self.hidden + pos + types + emb_norm

    @property
    def head_params(self) -> int:
        """Final norm, LM head (unless tied) and, for encoders, pooler + MLM transform."""
        h = self.hidden
        final_norm = self._norm_params() if self.arch == "decoder" else 0
        lm = 0 if self.tied_embeddings else self.vocab * h
        if self.arch == "encoder":  # BERT: pooler, MLM transform dense + LN, decoder bias
            return lm + (h * h + h) + (h * h + h) + self._norm_params() + self.vocab
        return final_norm + lm

    @property
    def moe_share(self) -> float:
        """The fraction of blocks whose MLP is the experts (1 for a dense model, whose MLP is its own)."""
        return (self.layers - self.dense_layers) / self.layers

    @property
    def dense_mlp_params(self) -> int:
        """Parameters of a dense block's MLP in a MoE model (0 without dense blocks)."""
        return self._mlp_params(self.dense_ffn) if self.dense_layers else 0

    @property
    def params(self) -> int:
        moe_mlp = self.layer_params()["mlp"]
        return (self.embedding_params + self.layers * sum(self.layer_params().values()) + self.head_params
                - self.dense_layers * (moe_mlp - self.dense_mlp_params))

    @property
    def active_params(self) -> int:
        """Parameters one token touches (MoE: only its experts)."""
        if self.experts == 1:
            return self.params
        idle = (self.experts - self.experts_per_token) * self._mlp_params(self.ffn_hidden)  # shared ones all run
        return self.params - idle * (self.layers - self.dense_layers)

    # -- FLOPs -----------------------------------------------------------
    def flops_per_step(self, batch: int, *, attention_backward: float = 2.5) -> float:
        """Training FLOPs of one step, counted as ``torch.utils.flop_counter`` does.

        GEMMs 2·m·n·k forward and twice that backward; attention 4·b·heads·s²·d
        forward (FlopCounterMode counts the full s² even when causal) and
        ``attention_backward`` × that backward: 2.5 for FlashAttention (its
        backward recomputes the scores: 5 GEMMs against 2), 2.0 for the math
        path (plain bmm, e.g. on the meta device or CPU).
        """
        fwd, bwd = kernels.step_kernels(self, batch, precision="bf16-mixed")
        total = sum(k.flops * k.count for k in fwd + bwd if k.cls == "gemm")
        attn = sum(k.flops * k.count for k in fwd if k.cls == "sdpa")
        return float(total + attn * (1 + attention_backward))

    # -- the kernels one step launches (perfmodel.workload.kernels builds them) ------------------
    def layer_kernels(self, micro_batch, *, tp=1, sp=False, precision="bf16-mixed", recompute="none", ep=1, etp=None):
        return kernels.transformer_layer_kernels(self, micro_batch, tp=tp, sp=sp, precision=precision,
                                                 recompute=recompute, ep=ep, etp=etp)

    def embedding_kernels(self, micro_batch, *, tp=1, precision="bf16-mixed", vocab_multiple=1):
        return kernels.transformer_embedding_kernels(self, micro_batch, tp=tp, precision=precision,
                                                     vocab_multiple=vocab_multiple)

    def head_kernels(self, micro_batch, *, tp=1, sp=False, precision="bf16-mixed", vocab_multiple=1):
        return kernels.transformer_head_kernels(self, micro_batch, tp=tp, sp=sp, precision=precision,
                                                vocab_multiple=vocab_multiple)

    def with_(self, **changes) -> Transformer:
        """The model with ``changes`` (``transformer``'s arguments); an explicit head_dim stays as it is."""
        fields = dict(self.__dict__)
        fields["head_dim"] = fields.pop("explicit_head_dim")
        return transformer(**{**fields, **changes})

    def __repr__(self) -> str:
        extra = f", head_dim={self.explicit_head_dim}" if self.explicit_head_dim else ""
        extra += f", qk_norm={self.qk_norm!r}" if self.qk_norm != "none" else ""
        extra += f", window={self.window}" if self.window else ""
        extra += f", global_layers={self.global_layers}" if self.global_layers else ""
        extra += ", post_norms=True" if self.post_norms else ""
        extra += f", logit_softcap={self.logit_softcap:g}" if self.logit_softcap else ""
        extra += ", attention_sinks=True" if self.attention_sinks else ""
        extra += f", experts={self.experts}, experts_per_token={self.experts_per_token}" if self.experts > 1 else ""
        extra += f", shared_ffn={self.shared_ffn}" if self.shared_ffn else ""
        extra += f", dense_layers={self.dense_layers}, dense_ffn={self.dense_ffn}" if self.dense_layers else ""
        extra += f", kv_lora_rank={self.kv_lora_rank}" if self.kv_lora_rank else ""
        return (f"Transformer(name={self.name!r}, layers={self.layers}, hidden={self.hidden}, "
                f"heads={self.heads}, kv_heads={self.kv_heads}{extra}, seq={self.seq}, vocab={self.vocab}, "
                f"params={self.params / 1e9:.3g}B)")


def _default_ffn(hidden: int, activation: str) -> int:
    if activation == "swiglu":  # Llama (Touvron et al. 2023): 2/3·4h rounded up to 256
        return 256 * ((int(2 * 4 * hidden / 3) + 255) // 256)
    return 4 * hidden


def transformer(layers: int = 12, hidden: int = 768, heads: int = 12, seq: int = 1024,
                vocab: int = 50304, kv_heads: int | None = None, ffn_hidden: int | None = None,
                activation: str = "gelu", norm: str = "layernorm", bias: bool = True,
                tied_embeddings: bool = False, position: str = "learned", causal: bool = True,
                arch: str = "decoder", experts: int = 1, experts_per_token: int = 1,
                name: str = "transformer", head_dim: int | None = None, qk_norm: str = "none",
                window: int = 0, shared_ffn: int = 0, shared_gate: bool = False, dense_layers: int = 0,
                dense_ffn: int = 0, kv_lora_rank: int = 0, q_lora_rank: int = 0, rope_head_dim: int = 0,
                v_head_dim: int = 0, global_layers: int = 0, post_norms: bool = False,
                logit_softcap: float = 0.0, attention_sinks: bool = False) -> Transformer:
    """Describe a transformer; every argument is validated with a message naming it.

    ``head_dim`` left out (or equal to hidden / heads) ties the head width to hidden / heads, which heads
    must then divide; given, the queries and the attention output are heads · head_dim wide.
    """
    kv_heads = heads if kv_heads is None else kv_heads
    if ffn_hidden is None:
        check_choice("activation", activation, ACTIVATIONS)
        ffn_hidden = _default_ffn(check_int("hidden", hidden, maximum=SIZE_LIMITS["hidden"]), activation)
    return Transformer(layers, hidden, heads, seq, vocab, kv_heads, ffn_hidden, activation, norm,
                       bias, tied_embeddings, position, causal, arch, experts, experts_per_token,
                       str(name), head_dim, qk_norm, window, global_layers, post_norms, logit_softcap,
                       attention_sinks, shared_ffn,
                       shared_gate, dense_layers, dense_ffn, kv_lora_rank, q_lora_rank, rope_head_dim, v_head_dim)

