"""A torch module built from the same description the predictor prices (``pm.transformer``).

    import perfmodel as pm
    from calibration.torch_model import build_module
    net = build_module(pm.transformer(layers=2, hidden=128, heads=4, seq=64, vocab=1000))
    loss = net(tokens, targets)          # tokens, targets: (batch, seq) int64

GPT-style pre-norm decoder, as the H200 reference runs (perfmodel/data/
h200-2026-11-29/README.md): token embedding (+ learned position embedding),
``layers`` blocks ``x + proj(SDPA(split(qkv(norm1(x)))))`` then
``x + fc2(act(fc1(norm2(x))))``, final norm, untied head h -> vocab without bias
(tied to the token embedding when ``tied_embeddings``), loss = cross-entropy on
fp32 logits. Widths follow the description exactly (qkv out = h + 2 kv_heads
head_dim, SwiGLU's fc1 = 2 ffn_hidden), so ``parameter_count(net) == model.params``.
Rotary embedding is written in plain PyTorch (cat/mul), as in the reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from perfmodel.errors import UnsupportedError

RECOMPUTE = ("none", "selective", "full")


def _norm(model, width: int) -> nn.Module:
    if model.norm == "rmsnorm":
        return nn.RMSNorm(width)
    return nn.LayerNorm(width, bias=model.bias)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding (Su et al. 2021, RoFormer) on the last dim, half-split layout."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def _rotary_tables(seq: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)  # (seq, head_dim/2)
    angles = torch.cat((angles, angles), dim=-1)                      # (seq, head_dim)
    return angles.cos(), angles.sin()


class Attention(nn.Module):
    """Fused QKV projection, (grouped-query) SDPA, output projection."""

    def __init__(self, model, selective: bool):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = model.heads, model.kv_heads, model.head_dim
        self.causal, self.rotary, self.selective = model.causal, model.position == "rotary", selective
        self.qkv = nn.Linear(model.hidden, model.qkv_out, bias=model.bias)
        self.proj = nn.Linear(model.hidden, model.hidden, bias=model.bias)
        if self.rotary:
            cos, sin = _rotary_tables(model.seq, model.head_dim)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def _core(self, q, k, v):
        gqa = {"enable_gqa": True} if self.kv_heads != self.heads else {}
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, **gqa)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        kv = self.kv_heads * self.head_dim
        q, k, v = self.qkv(x).split((h, kv, kv), dim=-1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)      # (b, heads, s, d)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)   # (b, kv_heads, s, d)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rotary:
            cos, sin = self.cos[:s].to(q.dtype), self.sin[:s].to(q.dtype)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if self.selective and self.training:  # recompute the attention core only (Korthikanti et al. 2022)
            y = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            y = self._core(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.swiglu = model.activation == "swiglu"
        self.relu = model.activation == "relu"
        self.fc1 = nn.Linear(model.hidden, model.mlp_in_out, bias=model.bias)
        self.fc2 = nn.Linear(model.ffn_hidden, model.hidden, bias=model.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.fc1(x)
        if self.swiglu:  # Shazeer 2020: silu(gate) * up
            gate, up = a.chunk(2, dim=-1)
            a = F.silu(gate) * up
        else:
            a = F.relu(a) if self.relu else F.gelu(a)
        return self.fc2(a)


class Block(nn.Module):
    def __init__(self, model, recompute: str):
        super().__init__()
        self.norm1, self.norm2 = _norm(model, model.hidden), _norm(model, model.hidden)
        self.attn = Attention(model, selective=recompute == "selective")
        self.mlp = MLP(model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """The whole model; ``forward(tokens, targets)`` returns the mean cross-entropy loss."""

    def __init__(self, model, recompute: str = "none"):
        super().__init__()
        self.recompute = recompute
        self.tok = nn.Embedding(model.vocab, model.hidden)
        self.pos = nn.Embedding(model.seq, model.hidden) if model.position == "learned" else None
        self.blocks = nn.ModuleList(Block(model, recompute) for _ in range(model.layers))
        self.norm = _norm(model, model.hidden)
        self.head = nn.Linear(model.hidden, model.vocab, bias=False)
        if model.tied_embeddings:
            self.head.weight = self.tok.weight

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            if self.recompute == "full" and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def check_buildable(model) -> None:
    """Raise UnsupportedError for descriptions this module cannot build."""
    from perfmodel.workload.model import Transformer

    if not isinstance(model, Transformer):
        raise UnsupportedError(f"only pm.transformer descriptions are built here: got {type(model).__name__} "
                               f"{getattr(model, 'name', '')!r}")
    if model.arch != "decoder":
        raise UnsupportedError(f"only decoder transformers can be trained here: got arch={model.arch!r}")
    if model.experts > 1:
        raise UnsupportedError(f"mixture-of-experts layers are not built here: got experts={model.experts}")
    if model.position == "rotary" and model.head_dim % 2:
        raise UnsupportedError(f"rotary embedding needs an even head_dim: got {model.head_dim}")


def build_module(model, recompute: str = "none") -> GPT:
    """A :class:`GPT` for the ``pm.transformer`` description ``model`` (fp32 parameters)."""
    if recompute not in RECOMPUTE:
        raise UnsupportedError(f"'recompute' must be one of {', '.join(RECOMPUTE)}: got {recompute!r}")
    check_buildable(model)
    return GPT(model, recompute)


def parameter_count(module: nn.Module) -> int:
    """Distinct parameters (a tied weight counts once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())
