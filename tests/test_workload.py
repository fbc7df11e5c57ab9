"""Transformer workloads: parameter and FLOP counts against torch, presets, validation."""

import dataclasses
import math

import pytest

import perfmodel as pm
from perfmodel.costs.memory import layer_activation_bytes
from perfmodel.workload.kernels import layer_kernels
from perfmodel.workload.presets import preset_info

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional


class Block(nn.Module):
    """A pre-norm block written the way the predictor describes one (GPT or Llama style)."""

    def __init__(self, m, dense=False):
        super().__init__()
        h, d = m.hidden, m.head_dim
        self.dense = m.experts == 1 or dense  # a MoE model's dense_layers first blocks have one MLP (DeepSeek-V3)
        norm = nn.LayerNorm if m.norm == "layernorm" else nn.RMSNorm
        kw = {"bias": m.bias} if m.norm == "layernorm" else {}
        self.m = m
        self.ln1, self.ln2 = norm(h, **kw), norm(h, **kw)
        if m.kv_lora_rank:  # DeepSeek's latent attention (transformers DeepseekV3Attention), rotary left out
            qk = m.heads * (d + m.rope_head_dim)
            self.q = (nn.Sequential(nn.Linear(h, m.q_lora_rank, bias=False), nn.RMSNorm(m.q_lora_rank),
                                    nn.Linear(m.q_lora_rank, qk, bias=False)) if m.q_lora_rank
                      else nn.Linear(h, qk, bias=False))
            self.kv_a = nn.Linear(h, m.kv_lora_rank + m.rope_head_dim, bias=False)
            self.kv_norm = nn.RMSNorm(m.kv_lora_rank)
            self.kv_b = nn.Linear(m.kv_lora_rank, m.heads * (d + m.v_dim), bias=False)
        else:
            self.qkv = nn.Linear(h, m.attn_width + 2 * m.kv_heads * d, bias=m.bias)
        self.proj = nn.Linear(m.attn_width, h, bias=m.bias)
        # Qwen3's q_norm / k_norm: one RMSNorm over each head's head_dim (transformers modeling_qwen3.py)
        self.q_norm, self.k_norm = {"none": (nn.Identity(), nn.Identity()), "head": (nn.RMSNorm(d), nn.RMSNorm(d)),
                                    "full": (nn.RMSNorm([m.heads, d]), nn.RMSNorm([m.kv_heads, d]))}[m.qk_norm]
        if self.dense:
            self.mlp = MLP(m, m.ffn_hidden if m.experts == 1 else m.dense_ffn)
        else:  # a router, the routed experts and, where the model has one, a shared expert with its gate
            self.router = nn.Linear(h, m.experts, bias=m.bias)  # gpt-oss: a bias per expert
            self.experts = nn.ModuleList(MLP(m, m.ffn_hidden) for _ in range(m.experts))
            self.shared = MLP(m, m.shared_ffn) if m.shared_ffn else None
            self.shared_gate = nn.Linear(h, 1, bias=False) if m.shared_gate else None

    def latent(self, x):
        """q, k, v (batch, heads, tokens, width) of latent attention: k's rotary part shared by the heads."""
        m, (B, T, _) = self.m, x.shape
        d, dr = m.head_dim, m.rope_head_dim
        q = self.q(x).view(B, T, m.heads, d + dr).transpose(1, 2)
        latent, k_pe = self.kv_a(x).split([m.kv_lora_rank, dr], dim=-1)
        k_nope, v = self.kv_b(self.kv_norm(latent)).view(B, T, m.heads, d + m.v_dim).split([d, m.v_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.view(B, T, 1, dr).expand(B, T, m.heads, dr)], dim=-1)
        return q, k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x):
        m = self.m
        B, T, h = x.shape
        if m.kv_lora_rank:
            y = F.scaled_dot_product_attention(*self.latent(self.ln1(x)), is_causal=m.causal)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, m.attn_width))
            return x + (self.mlp(self.ln2(x)) if self.dense else self.moe(self.ln2(x).view(B * T, h)).view(B, T, h))
        q, k, v = self.qkv(self.ln1(x)).split([m.attn_width, m.kv_heads * m.head_dim, m.kv_heads * m.head_dim], dim=-1)
        q = self.q_norm(q.view(B, T, m.heads, m.head_dim)).transpose(1, 2)
        k = self.k_norm(k.view(B, T, m.kv_heads, m.head_dim)).transpose(1, 2)
        v = v.view(B, T, m.kv_heads, m.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=m.causal, enable_gqa=m.kv_heads != m.heads)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, m.attn_width))
        return x + (self.mlp(self.ln2(x)) if self.dense else self.moe(self.ln2(x).view(B * T, h)).view(B, T, h))

    def moe(self, x):
        """Top-k routing made balanced (token i to experts i·k … i·k + k − 1 mod experts), so every expert sees
        tokens·k/experts tokens, as the predictor assumes; Qwen2-MoE's shared expert and gate on every token."""
        m, n = self.m, x.shape[0]
        weights = self.router(x).softmax(-1)
        slots = (torch.arange(n * m.experts_per_token) % m.experts).view(n, m.experts_per_token)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token = (slots == e).nonzero(as_tuple=True)[0].to(x.device)  # routing on the host: x may be on meta
            out = out.index_add(0, token, expert(x[token]) * weights[token, e, None])
        if self.shared is not None:
            shared = self.shared(x)
            out = out + (torch.sigmoid(self.shared_gate(x)) * shared if self.shared_gate is not None else shared)
        return out


class MLP(nn.Module):
    def __init__(self, m, width):
        super().__init__()
        self.swiglu = m.activation == "swiglu"
        self.fc1 = nn.Linear(m.hidden, 2 * width if self.swiglu else width, bias=m.bias)
        self.fc2 = nn.Linear(width, m.hidden, bias=m.bias)

    def forward(self, x):
        a = self.fc1(x)
        if self.swiglu:
            g, u = a.chunk(2, dim=-1)
            return self.fc2(F.silu(g) * u)
        return self.fc2(F.gelu(a))


class Net(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m
        self.tok = nn.Embedding(m.vocab, m.hidden)
        self.pos = nn.Embedding(m.seq, m.hidden) if m.position == "learned" else None
        self.blocks = nn.ModuleList(Block(m, dense=i < m.dense_layers) for i in range(m.layers))
        norm = nn.LayerNorm if m.norm == "layernorm" else nn.RMSNorm
        self.ln_f = norm(m.hidden, **({"bias": m.bias} if m.norm == "layernorm" else {}))
        self.head = nn.Linear(m.hidden, m.vocab, bias=False)
        if m.tied_embeddings:
            self.head.weight = self.tok.weight

    def forward(self, idx):
        x = self.tok(idx)
        if self.pos is not None:
            x = x + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


CASES = {
    "gpt": dict(layers=2, hidden=64, heads=4, seq=32, vocab=96),
    "gpt-tied-nobias": dict(layers=2, hidden=64, heads=4, seq=32, vocab=96, tied_embeddings=True, bias=False),
    "llama-gqa": dict(layers=3, hidden=64, heads=8, kv_heads=2, seq=16, vocab=80, activation="swiglu",
                      norm="rmsnorm", bias=False, position="rotary", ffn_hidden=96),
    # heads · head_dim above hidden, per-head q/k norms (Qwen3-4B's shape in small)
    "qwen3-wide-heads": dict(layers=2, hidden=40, heads=8, kv_heads=2, head_dim=16, seq=16, vocab=80,
                             activation="swiglu", norm="rmsnorm", bias=False, position="rotary", ffn_hidden=96,
                             qk_norm="head"),
    # OLMo 2's norms over the whole q and k (OLMo-core attention.py: q_norm of d_model, k_norm of kv_heads·head_dim)
    "olmo2-full-qk-norm": dict(layers=2, hidden=64, heads=4, kv_heads=2, seq=16, vocab=80, activation="swiglu",
                               norm="rmsnorm", bias=False, position="rotary", ffn_hidden=96, qk_norm="full"),
    # routed experts (Mixtral-like) and Qwen2-MoE's shared expert with its sigmoid gate beside them
    "moe": dict(layers=2, hidden=32, heads=4, seq=16, vocab=80, activation="swiglu", norm="rmsnorm", bias=False,
                position="rotary", ffn_hidden=24, experts=4, experts_per_token=2),
    "moe-shared-gated": dict(layers=2, hidden=32, heads=4, seq=16, vocab=80, activation="swiglu", norm="rmsnorm",
                             bias=False, position="rotary", ffn_hidden=24, experts=4, experts_per_token=2,
                             shared_ffn=40, shared_gate=True),
    "moe-shared-gelu-bias": dict(layers=2, hidden=32, heads=4, seq=16, vocab=80, ffn_hidden=24, experts=4,
                                 experts_per_token=1, shared_ffn=48),
    # DeepSeek-V3's layout in small: a dense first block of its own width, then routed and shared experts
    "moe-dense-first": dict(layers=3, hidden=32, heads=4, seq=16, vocab=80, activation="swiglu", norm="rmsnorm",
                            bias=False, position="rotary", ffn_hidden=24, experts=4, experts_per_token=2,
                            shared_ffn=40, dense_layers=1, dense_ffn=72),
    # DeepSeek-V3's attention in small: q and K/V latents, q·k wider than v (head_dim + rope_head_dim vs v_head_dim)
    "mla-moe-dense-first": dict(layers=3, hidden=32, heads=4, seq=16, vocab=80, activation="swiglu", norm="rmsnorm",
                                bias=False, position="rotary", ffn_hidden=24, experts=4, experts_per_token=2,
                                shared_ffn=24, dense_layers=1, dense_ffn=72, head_dim=16, kv_lora_rank=12,
                                q_lora_rank=20, rope_head_dim=8, v_head_dim=12),
    # DeepSeek-V2-Lite's: q projected directly
    "mla-direct-q": dict(layers=2, hidden=32, heads=4, seq=16, vocab=80, activation="swiglu", norm="rmsnorm",
                         bias=False, position="rotary", ffn_hidden=48, head_dim=8, kv_lora_rank=16, rope_head_dim=4),
    "gemma-narrow-hidden": dict(layers=2, hidden=48, heads=4, head_dim=32, seq=16, vocab=80, activation="swiglu",
                                norm="rmsnorm", bias=False, position="rotary", ffn_hidden=64, tied_embeddings=True),
}


@pytest.mark.parametrize("name", CASES)
def test_params_and_flops_match_torch(name):
    from torch.utils.flop_counter import FlopCounterMode

    m = pm.transformer(**CASES[name])
    with torch.device("meta"):
        net = Net(m)
    assert m.params == sum(p.numel() for p in net.parameters())
    batch = 3
    idx = torch.zeros(batch, m.seq, dtype=torch.long, device="meta")
    with FlopCounterMode(display=False) as counter:
        logits = net(idx)
        F.cross_entropy(logits.float().view(-1, m.vocab), idx.view(-1)).backward()
    # on the meta device SDPA runs the math path: its backward is 2 bmm per forward bmm
    ours = m.flops_per_step(batch, attention_backward=2.0)
    assert ours == pytest.approx(counter.get_total_flops(), rel=0.01)


TRANSFORMER_PRESETS = [n for n in pm.list_presets() if isinstance(pm.preset(n), pm.Transformer)]


@pytest.mark.parametrize("name", TRANSFORMER_PRESETS)
def test_presets_match_published_parameter_counts(name):
    info = preset_info(name)
    assert pm.preset(name).params == pytest.approx(info["published_params"], rel=0.01)
    assert info["source"]


def test_gpt2_small_exact_and_mixtral_active():
    assert pm.preset("gpt2-small").params == 124_439_808
    mix = pm.preset("mixtral-8x7b")
    assert mix.active_params == pytest.approx(12.9e9, rel=0.01)


def test_gpt_flops_closed_form():
    """6·N·tokens-style check by hand: 24·L·h²·(1 + s/6h) + 6·V·h per token fwd+bwd ×3 (Narayanan)."""
    m = pm.transformer(layers=4, hidden=256, heads=4, seq=128, vocab=512)
    b = 2
    tokens = b * m.seq
    dense = 3 * 2 * tokens * (m.layers * 12 * m.hidden**2 + m.vocab * m.hidden)
    attn = 3 * m.layers * 4 * b * m.seq**2 * m.hidden
    assert m.flops_per_step(b, attention_backward=2.0) == pytest.approx(dense + attn, rel=1e-12)


@pytest.mark.parametrize("kwargs, message", [
    (dict(hidden=100, heads=12), "'heads' must divide hidden=100: got 12"),
    (dict(heads=12, kv_heads=5), "'kv_heads' must divide heads=12: got 5"),
    (dict(layers=0), "'layers' must be an integer >= 1: got 0"),
    (dict(layers=2.5), "'layers' must be an integer >= 1: got 2.5"),
    (dict(activation="swish"), "unknown activation 'swish'"),
    (dict(norm="batchnorm"), "known: layernorm, rmsnorm"),
    (dict(experts=2, experts_per_token=3), "'experts_per_token' must be <= experts=2: got 3"),
    (dict(qk_norm="yes"), "unknown qk_norm 'yes'"),
])
def test_bad_input_names_the_field(kwargs, message):
    kind = pm.InvalidInputError if "unknown" not in message and "known" not in message else pm.UnknownNameError
    with pytest.raises(kind) as err:
        pm.transformer(**kwargs)
    assert message in str(err.value)
    with pytest.raises(kind) as err:  # the dataclass checks itself too: pm.Transformer(...) is no way around
        pm.Transformer(**{**dict(kv_heads=kwargs.get("heads", 12)), **kwargs})
    assert message in str(err.value)


def test_an_explicit_head_dim_sets_the_attention_width():
    """heads · head_dim wide queries and attention output, priced in the QKV and projection GEMMs, the saved
    attention output and, with qk_norm, two norm kernels per pass over q and k."""
    base = dict(layers=2, hidden=2560, heads=32, kv_heads=8, seq=1024, vocab=1000, activation="swiglu",
                norm="rmsnorm", bias=False, position="rotary", ffn_hidden=9728)
    tied = pm.transformer(**base)
    wide = pm.transformer(**base, head_dim=128)
    assert (tied.head_dim, tied.attn_width, wide.head_dim, wide.attn_width) == (80, 2560, 128, 4096)
    # the tied width written out is the tied model, however the model was made
    assert pm.transformer(**base, head_dim=80) == tied == dataclasses.replace(tied, explicit_head_dim=80)
    fwd, _ = layer_kernels(wide, 1, tp=2)
    proj = next(k for k in fwd if k.name == "attn.proj")
    assert proj.flops == 2 * 1024 * (4096 / 2) * 2560  # tokens × heads·head_dim / tp × hidden
    assert not any("_norm" in k.name for k in fwd)
    normed = wide.with_(qk_norm="head")
    fwd_n, bwd_n = layer_kernels(normed, 1, tp=2)
    names = {k.name: k for k in fwd_n + bwd_n}
    assert names["attn.q_norm"].size["x"] == 1024 * 16 * 128 and names["attn.k_norm.bwd"].size["x"] == 1024 * 4 * 128
    kw = dict(tp=1, sp=False, precision="bf16-mixed", recompute="none")
    # the attention output, q k v and the rotary outputs (eager PyTorch saves them), 2 B each, 48 wider per head
    grown = 2 * (4096 - 2560) + 2 * (32 + 2 * 8) * 48 + 2 * (32 + 8) * 48
    assert layer_activation_bytes(wide, **kw) - layer_activation_bytes(tied, **kw) == grown
    assert layer_activation_bytes(normed, **kw) - layer_activation_bytes(wide, **kw) == 2 * 40 * 128 + 4 * 40
    whole = wide.with_(qk_norm="full")  # OLMo 2: one row per token for q and one for k
    q_norm = next(k for k in layer_kernels(whole, 1, tp=2)[0] if k.name == "attn.q_norm")
    assert (q_norm.size["x"], q_norm.size["rows"]) == (1024 * 16 * 128, 1024)
    assert layer_activation_bytes(whole, **kw) - layer_activation_bytes(wide, **kw) == 2 * 40 * 128 + 4 * 2
    assert whole.layer_params()["norms"] - wide.layer_params()["norms"] == 4096 + 8 * 128
    assert normed.with_(hidden=3072).head_dim == 128  # an explicit head width stays when hidden changes
    with pytest.raises(pm.InvalidInputError, match="'head_dim' must be an integer >= 1: got 0"):
        pm.transformer(**base, head_dim=0)


def test_sizes_beyond_any_model_and_unknown_fields_are_refused():
    with pytest.raises(pm.InvalidInputError, match="'hidden' must be an integer between 1 and 1,048,576"):
        pm.transformer(hidden=10**20, heads=1)
    with pytest.raises(pm.InvalidInputError, match=r"'layers' must be an integer between 1 and 100,000: got 1000"):
        pm.transformer(layers=10**400)
    with pytest.raises(pm.UnknownNameError, match="unknown model field 'colour'"):
        pm.preset("gpt2-small", colour=1)


def test_unknown_preset_lists_known_and_closest():
    with pytest.raises(pm.UnknownNameError) as err:
        pm.preset("llama-3-7b")
    assert "did you mean 'llama-3-8b'" in str(err.value) or "did you mean" in str(err.value)
    assert "gpt2-small" in str(err.value)


def test_default_ffn_for_swiglu_follows_llama():
    m = pm.transformer(hidden=4096, heads=32, activation="swiglu")
    assert m.ffn_hidden == 11008  # Llama-2-7b
    assert math.isclose(pm.transformer().ffn_hidden, 3072)
