"""Closed forms for compute kernels (numpy body + sympy twin, see fit/forms.py).

GEMM (``gemm_wave``, ``gemm_smooth``)
    t = max(t_cpu, t0 + 2mnk / (R · q(m, n) · k/(k + k_half)) / a(n, k), bytes / bw)
    q = tile-wave efficiency: tiles = ⌈m/TM⌉⌈n/TN⌉ on ``sms`` SMs run in
    ⌈tiles/sms⌉ waves (NVIDIA, "Matrix Multiplication Background User's Guide",
    wave quantization); ``gemm_smooth`` uses m/(m+m_half)·n/(n+n_half) instead.
    a = alignment: ``p8`` when n or k is not a multiple of 8 (tensor cores need
    16-byte aligned rows; cuBLAS falls back to slower kernels), ``p16`` when a
    multiple of 8 but not of 16; m does not matter (H200 data).
    t_cpu = the eager per-call floor: a back-to-back microbenchmark measures
    max(GPU time, CPU issue time) (the launch queue drains otherwise).
Memory-bound (``mem_affine``): t = max(t_cpu, t0 + x·beta), x = elements,
    beta = bytes per element / bandwidth (roofline, Williams et al. 2009).
Attention (``sdpa``): FlashAttention-2 (Dao 2023) time = t0 + F / (R · s/(s+s_half)
    · d_eff), F = 4·b·heads·s²·d, halved when causal (the masked half is skipped).
Per-parameter (``per_param``): t = t0 + params·beta (fused AdamW, SGD).
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from perfmodel.fit.forms import Form, register


def _align_factor(p, n, k):
    mis8 = (np.mod(n, 8) != 0) | (np.mod(k, 8) != 0)
    mis16 = ~mis8 & ((np.mod(n, 16) != 0) | (np.mod(k, 16) != 0))
    return np.where(mis8, p["p8"], np.where(mis16, p["p16"], 1.0))


def _sym_align(p, n, k):
    return sp.Piecewise(
        (p["p8"], sp.Or(sp.Ne(sp.Mod(n, 8), 0), sp.Ne(sp.Mod(k, 8), 0))),
        (p["p16"], sp.Or(sp.Ne(sp.Mod(n, 16), 0), sp.Ne(sp.Mod(k, 16), 0))),
        (1, True),
    )


def _gemm_parts(p, m, n, k, q):
    flops = 2.0 * m * n * k
    rate = p["R"] * q * k / (k + p["k_half"]) * _align_factor(p, n, k)
    bytes_moved = p["elem_bytes"] * (m * k + k * n + m * n)
    return np.maximum(p["t0"] + flops / rate, bytes_moved / p["bw"])


def _wave_q(p, m, n):
    tiles = np.ceil(m / p["TM"]) * np.ceil(n / p["TN"])
    waves = np.ceil(tiles / p["sms"])
    return tiles / (waves * p["sms"])


def gemm_wave_gpu(p, m, n, k):
    """GPU time of one GEMM without the CPU floor (used by the step model)."""
    return _gemm_parts(p, m, n, k, _wave_q(p, m, n))


def gemm_smooth_gpu(p, m, n, k):
    q = m / (m + p["m_half"]) * n / (n + p["n_half"])
    return _gemm_parts(p, m, n, k, q)


def _sym_gemm(p, m, n, k, q):
    flops = 2 * m * n * k
    rate = p["R"] * q * k / (k + p["k_half"]) * _sym_align(p, n, k)
    bytes_moved = p["elem_bytes"] * (m * k + k * n + m * n)
    return sp.Max(p["t_cpu"], sp.Max(p["t0"] + flops / rate, bytes_moved / p["bw"]))


GEMM_COMMON = ("R", "k_half", "t0", "t_cpu", "p8", "p16", "bw", "elem_bytes")

register(Form(
    "gemm_wave", ("m", "n", "k"), (*GEMM_COMMON, "TM", "TN", "sms"),
    lambda p, m, n, k: np.maximum(p["t_cpu"], gemm_wave_gpu(p, m, n, k)),
    lambda p, m, n, k: _sym_gemm(
        p, m, n, k,
        sp.ceiling(m / p["TM"]) * sp.ceiling(n / p["TN"])
        / (sp.ceiling(sp.ceiling(m / p["TM"]) * sp.ceiling(n / p["TN"]) / p["sms"]) * p["sms"])),
    "tile-wave quantised GEMM with K saturation and an alignment penalty",
))
register(Form(
    "gemm_smooth", ("m", "n", "k"), (*GEMM_COMMON, "m_half", "n_half"),
    lambda p, m, n, k: np.maximum(p["t_cpu"], gemm_smooth_gpu(p, m, n, k)),
    lambda p, m, n, k: _sym_gemm(p, m, n, k, m / (m + p["m_half"]) * n / (n + p["n_half"])),
    "GEMM with smooth size saturation in m, n, k and an alignment penalty",
))

register(Form(
    "mem_affine", ("x",), ("t0", "beta", "t_cpu"),
    lambda p, x: np.maximum(p["t_cpu"], p["t0"] + x * p["beta"]),
    lambda p, x: sp.Max(p["t_cpu"], p["t0"] + x * p["beta"]),
    "latency + elements × bytes-per-element / bandwidth",
))
register(Form(
    "mem_power", ("x",), ("t0", "beta", "gamma", "t_cpu"),
    lambda p, x: np.maximum(p["t_cpu"], p["t0"] + p["beta"] * x ** p["gamma"]),
    lambda p, x: sp.Max(p["t_cpu"], p["t0"] + p["beta"] * x ** p["gamma"]),
    "latency + a power law in size (bandwidth that still grows with size)",
))
register(Form(
    "mem_affine2", ("x", "y"), ("t0", "beta", "beta_y", "t_cpu"),
    lambda p, x, y: np.maximum(p["t_cpu"], p["t0"] + x * p["beta"] + y * p["beta_y"]),
    lambda p, x, y: sp.Max(p["t_cpu"], p["t0"] + x * p["beta"] + y * p["beta_y"]),
    "two-operand memory-bound kernel (embedding backward: tokens·h gathered, vocab·h zeroed)",
))


def _sdpa_eff(p, seq, head_dim):
    # FlashAttention-2 instantiates kernels for head_dim in steps of 32 (64, 96, 128, ...);
    # a dim not a multiple of 8 cannot use it at all (falls back to a slower path).
    d_pad = np.ceil(head_dim / 32.0) * 32.0
    d_eff = head_dim / d_pad * d_pad / (d_pad + p["d_half"])
    mis = np.where(np.mod(head_dim, 8) != 0, p["p_mis"], 1.0)
    return seq / (seq + p["s_half"]) * d_eff * mis


def sdpa_flops(batch, heads, seq, head_dim, causal):
    """FLOPs the kernel actually executes: 4·b·heads·s²·d, about half when causal."""
    full = 4.0 * batch * heads * seq * seq * head_dim
    return np.where(np.asarray(causal, dtype=bool), 0.5 * full, full)


register(Form(
    "sdpa_flash", ("batch", "heads", "seq", "head_dim", "causal"), ("R", "s_half", "d_half", "p_mis", "t0", "t_cpu"),
    lambda p, batch, heads, seq, head_dim, causal: np.maximum(
        p["t_cpu"], p["t0"] + sdpa_flops(batch, heads, seq, head_dim, causal) / (p["R"] * _sdpa_eff(p, seq, head_dim))),
    lambda p, batch, heads, seq, head_dim, causal: sp.Max(
        p["t_cpu"], p["t0"] + 4 * batch * heads * seq ** 2 * head_dim * (1 - causal / 2)
        / (p["R"] * seq / (seq + p["s_half"]) * head_dim / (sp.ceiling(head_dim / 32) * 32 + p["d_half"]))),
    "FlashAttention-2: FLOPs over a rate saturating in sequence length and head dim",
))

register(Form(
    "per_param", ("params",), ("t0", "beta"),
    lambda p, /, params: p["t0"] + params * p["beta"],
    lambda p, /, params: p["t0"] + params * p["beta"],
    "optimizer step: latency + parameters × bytes-per-parameter / bandwidth",
))
