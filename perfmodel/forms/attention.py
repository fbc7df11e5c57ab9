"""Closed forms for attention kernels (numpy body + sympy twin; forms/base.py).

``sdpa_flash``: FlashAttention-2 (Dao 2023) time = t0 + F / (R · s/(s+s_half) · d_eff),
F = 4·b·heads·s²·d, halved when causal (the masked half is skipped). ``sdpa_tiles`` counts T×T
blocks instead: n = ⌈s/T⌉, n² tiles (n(n+1)/2 + p_diag·n when causal) per (batch, head), plus the
tail of the longest program (n tiles on one SM); ``sdpa_tiles64`` pads head dims to 64, and
``sdpa_tiles64_falling`` lets the rate fall with head dim (FlashAttention-1, flash-attn's Triton kernel).
"""

from __future__ import annotations

from functools import partial

import numpy as np
from perfmodel.core.lazy import sympy as sp  # imported on first symbolic use

from perfmodel.forms.base import Form

FORMS: list[Form] = []


def _sdpa_eff(p, seq, head_dim, step=32.0):
    # FlashAttention-2 instantiates kernels for head_dim in steps of 32 (64, 96, 128, ...); the
    # cuDNN attention PyTorch picks on Hopper behaves as if padded to steps of 64 (head_dim 80 and
    # 96 cost about what 128 does on an H200); a dim not a multiple of 8 falls back to a slower path.
    d_pad = np.ceil(head_dim / step) * step
    d_eff = head_dim / d_pad * d_pad / (d_pad + p["d_half"])
    mis = np.where(np.mod(head_dim, 8) != 0, p["p_mis"], 1.0)
    return seq / (seq + p["s_half"]) * d_eff * mis


def sdpa_flops(batch, heads, seq, head_dim, causal):
    """FLOPs the kernel actually executes: 4·b·heads·s²·d, about half when causal."""
    full = 4.0 * batch * heads * seq * seq * head_dim
    return np.where(np.asarray(causal, dtype=bool), 0.5 * full, full)


def _sdpa_time(p, batch, heads, seq, head_dim, causal, step=32.0):
    rate = p["R"] * _sdpa_eff(p, seq, head_dim, step) * np.where(np.asarray(causal) > 0, p["p_causal"], 1.0)
    # c_row: a cost per query row and head (loading Q, writing O and the log-sum-exp)
    return p["t0"] + p["c_row"] * batch * heads * seq + sdpa_flops(batch, heads, seq, head_dim, causal) / rate


def _sym_sdpa(p, batch, heads, seq, head_dim, causal, step):
    d_pad = sp.ceiling(head_dim / step) * step
    eff = seq / (seq + p["s_half"]) * head_dim / (d_pad + p["d_half"])
    eff = eff * sp.Piecewise((p["p_mis"], sp.Ne(sp.Mod(head_dim, 8), 0)), (1, True))
    flops = 4 * batch * heads * seq ** 2 * head_dim * (1 - sp.Rational(1, 2) * causal)
    rate = p["R"] * eff * (1 + (p["p_causal"] - 1) * causal)
    return sp.Max(p["t_cpu"], p["t0"] + p["c_row"] * batch * heads * seq + flops / rate)


def _head_dim_factor(d_pad, d_half, falling):
    # the rate's head-dim term: saturating, d/(d + d_half); or falling, 1 + d_half/d, where a kernel runs
    # large head dims slower per FLOP (FlashAttention-1 and flash-attn's Triton kernel at 128 against 64)
    return 1.0 + d_half / d_pad if falling else d_pad / (d_pad + d_half)


def _sdpa_tiles_time(p, batch, heads, seq, head_dim, causal, step, falling=False):
    # FlashAttention-2 (Dao 2023, Alg. 1): each program owns one T-row query block and sweeps
    # the key blocks, skipping those above the diagonal when causal; diagonal blocks are
    # computed and masked (p_diag: their extra cost). The kernel ends with its longest
    # program, one full sweep of n blocks on one SM (the tail effect, k_tail).
    n = np.ceil(seq / p["T"])
    is_causal = np.asarray(causal) > 0
    tiles = np.where(is_causal, n * (n + 1) / 2 + n * p["p_diag"], n * n)
    d_pad = np.ceil(head_dim / step) * step
    rate = p["R"] * _head_dim_factor(d_pad, p["d_half"], falling) * np.where(np.mod(head_dim, 8) != 0,
                                                                           p["p_mis"], 1.0)
    tile_flops = 4.0 * p["T"] ** 2 * d_pad
    compute = (batch * heads * tiles + p["k_tail"] * n * p["sms"]) * tile_flops / rate
    return np.maximum(p["t_cpu"], p["t0"] + p["c_row"] * batch * heads * seq + compute)


def _sym_sdpa_tiles(p, batch, heads, seq, head_dim, causal, step, falling=False):
    n = sp.ceiling(seq / p["T"])
    tiles = n ** 2 * (1 - causal) + causal * (n * (n + 1) / 2 + n * p["p_diag"])
    d_pad = sp.ceiling(head_dim / step) * step
    rate = p["R"] * _head_dim_factor(d_pad, p["d_half"], falling) * sp.Piecewise(
        (p["p_mis"], sp.Ne(sp.Mod(head_dim, 8), 0)), (1, True))
    compute = (batch * heads * tiles + p["k_tail"] * n * p["sms"]) * 4 * p["T"] ** 2 * d_pad / rate
    return sp.Max(p["t_cpu"], p["t0"] + p["c_row"] * batch * heads * seq + compute)


def _flash_time(p, batch, heads, seq, head_dim, causal, step):
    return np.maximum(p["t_cpu"], _sdpa_time(p, batch, heads, seq, head_dim, causal, float(step)))


SDPA_FLASH = ("R", "s_half", "d_half", "p_mis", "p_causal", "c_row", "t0", "t_cpu")
SDPA_TILES = ("R", "d_half", "p_mis", "p_diag", "k_tail", "c_row", "t0", "t_cpu", "T", "sms")
for _name, _step, _params, _fn, _sym, _doc in (
        ("sdpa_flash", 32, SDPA_FLASH, _flash_time, _sym_sdpa,
         "FlashAttention-2: FLOPs over a rate saturating in sequence length and head dim; causal at its own rate"),
        ("sdpa_flash64", 64, SDPA_FLASH, _flash_time, _sym_sdpa,
         "as sdpa_flash with head_dim padded to a multiple of 64 (cuDNN attention on Hopper)"),
        ("sdpa_tiles", 32, SDPA_TILES, _sdpa_tiles_time, _sym_sdpa_tiles,
         "FlashAttention-2 by blocks: query-block x key-block tiles (causal skips those above the diagonal) "
         "plus the longest program's sweep"),
        ("sdpa_tiles64", 64, SDPA_TILES, _sdpa_tiles_time, _sym_sdpa_tiles,
         "as sdpa_tiles with head_dim padded to a multiple of 64 (cuDNN attention on Hopper)"),
        ("sdpa_tiles64_falling", 64, SDPA_TILES, partial(_sdpa_tiles_time, falling=True),
         partial(_sym_sdpa_tiles, falling=True),
         "as sdpa_tiles64 with a rate R·(1 + d_half/d) falling with head dim (FlashAttention-1, flash-attn's "
         "Triton kernel)")):
    FORMS.append(Form(
        _name, ("batch", "heads", "seq", "head_dim", "causal"), _params,
        lambda p, batch, heads, seq, head_dim, causal, step=_step, fn=_fn: fn(
            p, batch, heads, seq, head_dim, causal, step),
        lambda p, batch, heads, seq, head_dim, causal, step=_step, sym=_sym: sym(
            p, batch, heads, seq, head_dim, causal, step),
        _doc,
    ))
