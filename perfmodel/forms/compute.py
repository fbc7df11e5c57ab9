"""Closed forms for compute kernels (numpy body + sympy twin; forms/base.py).

GEMM (``gemm_smooth``; ``gemm_two``, ``gemm_two_levels`` and ``gemm_tiles`` below)
    t = max(t_cpu, t0 + 2mnk / (R · q(m, n) · k/(k + k_half)) / a(n, k), bytes / bw)
    q = tile-wave efficiency: tiles = ⌈m/TM⌉⌈n/TN⌉ on ``sms`` SMs run in
    ⌈tiles/sms⌉ waves (NVIDIA, "Matrix Multiplication Background User's Guide",
    wave quantization); ``gemm_smooth`` uses m/(m+m_half)·n/(n+n_half) instead.
    a = alignment: ``p8`` when n or k is not a multiple of 8 (tensor cores need
    16-byte aligned rows; cuBLAS falls back to slower kernels), ``p16`` when a
    multiple of 8 but not of 16; m does not matter (H200 data).
    t_cpu = the eager per-call floor: a back-to-back microbenchmark measures
    max(GPU time, CPU issue time) (the launch queue drains otherwise).
    ``gemm_two`` fits aligned and misaligned rows as two kernel families;
    ``gemm_tiles`` prices an aligned GEMM as the fastest of several tile shapes
    and split-K factors, each quantised into waves on the SMs, and (one under-half wave of tiles)
    stream-K over all SMs (Osama et al. 2023).
Memory-bound (``mem_affine``): t = max(t_cpu, t0 + x·beta), x = elements,
    beta = bytes per element / bandwidth (roofline, Williams et al. 2009).
Attention: :mod:`perfmodel.forms.attention`.
Per-parameter (``per_param``): t = t0 + params·beta (fused AdamW, SGD).
CNN classes (``scaled_ref``): t = max(t_cpu, t0 + c · t_ref), t_ref = the implicit GEMM
    or the bytes moved at the measured copy bandwidth (perfmodel/costs/cnn.py).
"""

from __future__ import annotations

import math

import numpy as np
from perfmodel.core.lazy import sympy as sp  # imported on first symbolic use

from perfmodel.forms.base import Form

_DEFINED: list[Form] = []


def _define(form: Form) -> Form:
    _DEFINED.append(form)
    return form


def _align_bytes(x, elem_bytes):
    """Largest power of two (bytes, capped at 32) dividing a row of ``x`` elements."""
    b = np.asarray(x * elem_bytes, dtype=np.int64)
    low = b & -b  # lowest set bit
    return np.minimum(np.where(b > 0, low, 32), 32)


def _align_factor(p, n, k):
    # cuBLAS picks kernels by operand alignment: 16-byte aligned rows (8 bf16 elements,
    # 4 tf32) reach the tensor-core peak; 8-, 4- and 2-byte alignment fall to slower kernels.
    an, ak = _align_bytes(n, p["elem_bytes"]), _align_bytes(k, p["elem_bytes"])
    a = np.minimum(an, ak)
    factor = np.select([a >= 32, a >= 16, a >= 8, a >= 4], [1.0, p["p16"], p["p8"], p["p4"]], p["p2"])
    return factor * np.where((an < 16) & (ak < 16), p["p_both"], 1.0)


def _sym_align(p, n, k):
    """Sympy twin of ``_align_factor``: a Piecewise on the byte alignment of n and k rows."""
    eb = p["elem_bytes"]

    def at_least(x, b):
        return sp.Eq(sp.Mod(x * eb, b), 0)

    both_mis = sp.And(sp.Not(at_least(n, 16)), sp.Not(at_least(k, 16)))
    level = sp.Piecewise(
        (1, sp.And(at_least(n, 32), at_least(k, 32))),
        (p["p16"], sp.And(at_least(n, 16), at_least(k, 16))),
        (p["p8"], sp.And(at_least(n, 8), at_least(k, 8))),
        (p["p4"], sp.And(at_least(n, 4), at_least(k, 4))),
        (p["p2"], True),
    )
    return level * sp.Piecewise((p["p_both"], both_mis), (1, True))


def _gemm_parts(p, m, n, k, q):
    flops = 2.0 * m * n * k
    rate = p["R"] * q * k / (k + p["k_half"]) * _align_factor(p, n, k)
    bytes_moved = p["elem_bytes"] * (m * k + k * n + m * n)
    return np.maximum(p["t0"] + flops / rate, bytes_moved / p["bw"])


def gemm_smooth_gpu(p, m, n, k):
    q = m / (m + p["m_half"]) * n / (n + p["n_half"])
    return _gemm_parts(p, m, n, k, q)


def _sym_gemm(p, m, n, k, q):
    flops = 2 * m * n * k
    rate = p["R"] * q * k / (k + p["k_half"]) * _sym_align(p, n, k)
    bytes_moved = p["elem_bytes"] * (m * k + k * n + m * n)
    return sp.Max(p["t_cpu"], sp.Max(p["t0"] + flops / rate, bytes_moved / p["bw"]))


GEMM_COMMON = ("R", "k_half", "t0", "t_cpu", "p16", "p8", "p4", "p2", "p_both", "bw", "elem_bytes")

_define(Form(
    "gemm_smooth", ("m", "n", "k"), (*GEMM_COMMON, "m_half", "n_half"),
    lambda p, m, n, k: np.maximum(p["t_cpu"], gemm_smooth_gpu(p, m, n, k)),
    lambda p, m, n, k: _sym_gemm(p, m, n, k, m / (m + p["m_half"]) * n / (n + p["n_half"])),
    "GEMM with smooth size saturation in m, n, k and an alignment penalty",
))

def gemm_two_gpu(p, m, n, k):
    """Aligned and misaligned GEMMs as two kernel families, each with its own rate and saturation;
    with ``p4``/``p2`` (``gemm_two_levels``) 4- and 2-byte aligned rows run below 8-byte ones."""
    an, ak = _align_bytes(n, p["elem_bytes"]), _align_bytes(k, p["elem_bytes"])
    a = np.minimum(an, ak)
    q = m / (m + p["m_half"]) * n / (n + p["n_half"]) * k / (k + p["k_half"])
    q_mis = m * n / (m * n + p["mn_half_mis"]) * k / (k + p["k_half_mis"])
    level = np.where(a >= 8, 1.0, np.where(a >= 4, p.get("p4", 1.0), p.get("p2", 1.0)))  # np.select's values
    rate = np.where(a >= 16, p["R"] * q * np.where(a >= 32, 1.0, p["p16"]), p["R_mis"] * q_mis * level)
    flops = 2.0 * m * n * k
    bytes_moved = p["elem_bytes"] * (m * k + k * n + m * n)
    return np.maximum(p["t0"] + flops / rate, bytes_moved / p["bw"])


def _sym_gemm_two(p, m, n, k):
    eb = p["elem_bytes"]

    def aligned(b):
        return sp.And(sp.Eq(sp.Mod(n * eb, b), 0), sp.Eq(sp.Mod(k * eb, b), 0))

    q = m / (m + p["m_half"]) * n / (n + p["n_half"]) * k / (k + p["k_half"])
    q_mis = m * n / (m * n + p["mn_half_mis"]) * k / (k + p["k_half_mis"])
    r_mis = p["R_mis"] * q_mis
    rate = sp.Piecewise((p["R"] * q, aligned(32)), (p["R"] * q * p["p16"], aligned(16)), (r_mis, aligned(8)),
                        (r_mis * p.get("p4", 1), aligned(4)), (r_mis * p.get("p2", 1), True))
    bytes_moved = eb * (m * k + k * n + m * n)
    return sp.Max(p["t_cpu"], sp.Max(p["t0"] + 2 * m * n * k / rate, bytes_moved / p["bw"]))


GEMM_TWO = ("R", "k_half", "m_half", "n_half", "p16", "R_mis", "k_half_mis", "mn_half_mis", "t0", "t_cpu", "bw",
            "elem_bytes")
for _name, _params, _doc in (
        ("gemm_two", GEMM_TWO, "aligned and misaligned GEMM kernel families with separate rates and saturation"),
        ("gemm_two_levels", (*GEMM_TWO, "p4", "p2"),
         "as gemm_two, misaligned rows 4- and 2-byte aligned at their own fraction of the 8-byte rate")):
    _define(Form(
        _name, ("m", "n", "k"), _params,
        lambda p, m, n, k: np.maximum(p["t_cpu"], gemm_two_gpu(p, m, n, k)),
        _sym_gemm_two, _doc,
    ))

# Output tiles a Hopper cuBLAS/CUTLASS kernel may use (rows x columns of C per thread block);
# the 128x256 family is the fastest per FLOP, smaller tiles run at a fitted fraction (e16, e8, e4
# by tile area) but waste less on partial tiles and fill more SMs.
GEMM_TILE_SHAPES = ((128, 256), (256, 128), (128, 128), (64, 256), (256, 64), (64, 128), (128, 64), (64, 64))
GEMM_SPLITS = (1, 2, 4)
MIS_TILE = 128  # misaligned (non-TMA) kernels: C padded to 128x128 tiles


def _float_ceil(x):
    """``np.ceil`` of a Python float, as a float (the same value, without numpy's per-call cost)."""
    return float(math.ceil(x))


def _tile_terms(p, m, n, k, sym=False):
    """(tile shape, split) -> time of the aligned kernel: ⌈tiles·s/SMs⌉ waves of one tile's
    2·TM·TN·(k/s) FLOPs at the per-SM rate; split-K adds a reduction of s fp32 partial C
    (written and read: 8·m·n·s bytes) and its launch (CUTLASS split-K, "parallel reduction").
    Each tile shape also has its stream-K term (``_stream_k``)."""
    ceil = sp.ceiling if sym else _float_ceil if type(m) is float else np.ceil
    out = []
    for tm, tn in GEMM_TILE_SHAPES:
        area = tm * tn
        e = 1 if area == 32768 else p[{16384: "e16", 8192: "e8", 4096: "e4"}[area]]
        for s in GEMM_SPLITS:
            ks = k / s
            waves = ceil(ceil(m / tm) * ceil(n / tn) * s / p["sms"])
            t = waves * 2 * tm * tn * ks / (p["R"] / p["sms"] * e * ks / (ks + p["k_half"]))
            if s > 1:
                t = t + p["t_split"] + 8 * m * n * s / p["bw"]
            out.append(t)
        out.append(_stream_k(p, m, n, k, tm, tn, e, ceil, sym))
    return out


# Stream-K (Osama et al., PPoPP 2023), as CUTLASS v4.7 schedules it on sm90
# (include/cutlass/gemm/kernel/tile_scheduler_params.h, PersistentTileSchedulerSm90StreamKParams):
# a stream-K unit takes at least 8 k-tiles (``min_iters_per_sk_unit_``) of 128 bytes of K each.
STREAM_K_MIN_ITERS = 8
STREAM_K_TILE_BYTES = 128


def _stream_k(p, m, n, k, tm, tn, e, ceil, sym):
    """Time of one tile shape under stream-K: when fewer than half the SMs hold an output tile
    (CUTLASS's heuristic: a tail wave under half full is stream-K, here the only wave), the
    tiles·k reduction steps are spread evenly over units = min(SMs, ⌊tiles·k / (8·BK)⌋) persistent
    CTAs, each a K range of tiles·k/units; the partial fp32 tiles (8·TM·TN bytes per unit, written
    and read) are reduced in the kernel at split-K's fixed cost ``t_split``. Infinite elsewhere
    (data-parallel tiles: the split terms price them), and where ``stream_k`` is 0 (fp32 without
    tensor cores: SIMT kernels, which that scheduler does not serve; absent means 1)."""
    if not p.get("stream_k", 1.0):
        return sp.oo if sym else math.inf if type(m) is float else np.full(np.broadcast(m, n, k).shape, np.inf)
    tiles = ceil(m / tm) * ceil(n / tn)
    k_min = STREAM_K_MIN_ITERS * STREAM_K_TILE_BYTES / p["elem_bytes"]  # elements of K per unit at least
    if sym:
        units = _sym_min(p["sms"], sp.floor(tiles * k / k_min))
        return sp.Piecewise((_stream_k_time(p, tiles, k, tm, tn, e, units), sp.And(2 * tiles < p["sms"], units > tiles)),
                            (sp.oo, True))
    if type(m) is float:  # one GEMM on Python floats (``_gemm_tiles_one``)
        units = min(p["sms"], math.floor(tiles * k / k_min))
        return _stream_k_time(p, tiles, k, tm, tn, e, units) if 2 * tiles < p["sms"] and units > tiles else math.inf
    units = np.minimum(p["sms"], np.floor(tiles * k / k_min))
    applies = (2 * tiles < p["sms"]) & (units > tiles)
    return np.where(applies, _stream_k_time(p, tiles, k, tm, tn, e, np.maximum(units, 1.0)), np.inf)


def _stream_k_time(p, tiles, k, tm, tn, e, units):
    """One stream-K unit's K range (tiles·k/units) at the per-SM rate, plus the in-kernel fixup."""
    ku = tiles * k / units
    return (2 * tm * tn * ku / (p["R"] / p["sms"] * e * ku / (ku + p["k_half"])) + p["t_split"]
            + 8 * tm * tn * units / p["bw"])


_TILE_M = np.array([tm for tm, _ in GEMM_TILE_SHAPES])
_TILE_N = np.array([tn for _, tn in GEMM_TILE_SHAPES])
_TILE_AREA_PARAM = {16384: "e16", 8192: "e8", 4096: "e4"}


def _fastest_tile_terms(p, m, n, k):
    """``min(_tile_terms(p, m, n, k))`` of arrays: every (tile shape, split) term and each shape's
    stream-K term at once, the tile shapes and splits along two leading axes (the same operations on
    the same numbers per element, in a few numpy calls instead of ten per term)."""
    lead = (1,) * np.broadcast(m, n, k).ndim
    tm, tn = _TILE_M.reshape(-1, 1, *lead), _TILE_N.reshape(-1, 1, *lead)
    e = np.array([1.0 if tm_ * tn_ == 32768 else p[_TILE_AREA_PARAM[tm_ * tn_]]
                  for tm_, tn_ in GEMM_TILE_SHAPES]).reshape(-1, 1, *lead)
    s = np.array(GEMM_SPLITS).reshape(1, -1, *lead)
    ks = k / s
    tiles = np.ceil(m / tm) * np.ceil(n / tn)  # (shapes, 1, ...)
    waves = np.ceil(tiles * s / p["sms"])
    t = waves * 2 * tm * tn * ks / (p["R"] / p["sms"] * e * ks / (ks + p["k_half"]))
    t = np.where(s > 1, t + p["t_split"] + 8 * m * n * s / p["bw"], t)
    fastest = t.min(axis=(0, 1))
    if not p.get("stream_k", 1.0):  # SIMT kernels: no stream-K term (``_stream_k``)
        return fastest
    tm, tn, e, tiles = tm[:, 0], tn[:, 0], e[:, 0], tiles[:, 0]
    units = np.minimum(p["sms"], np.floor(tiles * k / (STREAM_K_MIN_ITERS * STREAM_K_TILE_BYTES / p["elem_bytes"])))
    applies = (2 * tiles < p["sms"]) & (units > tiles)
    stream = np.where(applies, _stream_k_time(p, tiles, k, tm, tn, e, np.maximum(units, 1.0)), np.inf)
    return np.minimum(fastest, stream.min(axis=0))


def gemm_tiles_gpu(p, m, n, k):
    """Aligned GEMMs: the fastest of the tile shapes and split-K factors (cuBLAS's heuristic picks
    per shape); misaligned ones: ``gemm_two``'s second family on C padded to 128x128 tiles."""
    one = np.ndim(m) == 0 and np.ndim(n) == 0 and np.ndim(k) == 0  # one GEMM: its 32 terms on Python floats
    if one and m > 0 and n > 0 and k > 0:
        return _gemm_tiles_one(p, float(m), float(n), float(k))
    an, ak = _align_bytes(n, p["elem_bytes"]), _align_bytes(k, p["elem_bytes"])
    a = np.minimum(an, ak)
    aligned, t_al, t_mis = a >= 16, None, None
    # arrays (an empty GEMM too: numpy's inf, not a ZeroDivisionError); a family no element takes is not priced
    if aligned.any():
        t_al = _fastest_tile_terms(p, m, n, k) / np.where(a >= 32, 1.0, p["p16"])
    if not aligned.all():  # misaligned rows: C padded to 128x128 tiles, the 8-byte rate scaled by alignment
        mp, np_ = np.ceil(m / MIS_TILE) * MIS_TILE, np.ceil(n / MIS_TILE) * MIS_TILE
        q_mis = mp * np_ / (mp * np_ + p["mn_half_mis"]) * k / (k + p["k_half_mis"])
        t_mis = 2.0 * mp * np_ * k / (p["R_mis"] * q_mis * np.where(a >= 8, 1.0, np.where(a >= 4, p["p4"], p["p2"])))
    t = t_al if t_mis is None else t_mis if t_al is None else np.where(aligned, t_al, t_mis)
    bytes_moved = p["elem_bytes"] * (m * k + k * n + m * n)
    return np.maximum(p["t0"] + t, bytes_moved / p["bw"])


def _row_align_one(elements: float, elem_bytes) -> int:
    """``_align_bytes`` of one row length."""
    b = int(elements * elem_bytes)
    return min(b & -b if b > 0 else 32, 32)


def _gemm_tiles_one(p, m: float, n: float, k: float):
    """``gemm_tiles_gpu`` of one GEMM of positive sizes on Python floats: the same operations in the
    same order (a cold prediction prices hundreds of them one by one)."""
    a = min(_row_align_one(n, p["elem_bytes"]), _row_align_one(k, p["elem_bytes"]))
    t_al = _fastest_tile_one(p, m, n, k) / (1.0 if a >= 32 else p["p16"])
    mp, np_ = _float_ceil(m / MIS_TILE) * MIS_TILE, _float_ceil(n / MIS_TILE) * MIS_TILE
    q_mis = mp * np_ / (mp * np_ + p["mn_half_mis"]) * k / (k + p["k_half_mis"])
    level = 1.0 if a >= 8 else p["p4"] if a >= 4 else p["p2"]
    t_mis = 2.0 * mp * np_ * k / (p["R_mis"] * q_mis * level)
    bytes_moved = p["elem_bytes"] * (m * k + k * n + m * n)
    return np.float64(max(p["t0"] + (t_al if a >= 16 else t_mis), bytes_moved / p["bw"]))


def _fastest_tile_one(p, m: float, n: float, k: float) -> float:
    """``min(_tile_terms(p, m, n, k))`` of one GEMM on floats: the same operations, each tile shape's factors once."""
    sms, k_half, bw, t_split, per_sm, split_bytes = p["sms"], p["k_half"], p["bw"], p["t_split"], p["R"] / p["sms"], 8 * m * n
    stream_k, k_min = p.get("stream_k", 1.0), STREAM_K_MIN_ITERS * STREAM_K_TILE_BYTES / p["elem_bytes"]
    best = None  # as min() over the terms in order: the first, then each one below it
    for tm, tn in GEMM_TILE_SHAPES:
        area = tm * tn
        e = 1 if area == 32768 else p[_TILE_AREA_PARAM[area]]
        tiles = float(math.ceil(m / tm)) * float(math.ceil(n / tn))
        rate = per_sm * e
        for s in GEMM_SPLITS:
            ks = k / s
            waves = float(math.ceil(tiles * s / sms))
            t = waves * 2 * tm * tn * ks / (rate * ks / (ks + k_half))
            if s > 1:
                t = t + t_split + split_bytes * s / bw
            best = t if best is None or t < best else best
        if stream_k:
            units = min(sms, math.floor(tiles * k / k_min))
            if 2 * tiles < sms and units > tiles:
                t = _stream_k_time(p, tiles, k, tm, tn, e, units)
                best = t if t < best else best
    return best


def _sym_min(*terms):
    """``sympy.Min`` of the tile terms, left unsimplified while sizes are symbols: sympy's pairwise
    elimination of redundant arguments (``Min._find_localzeros``) takes minutes over 32 terms, and
    substituting numbers evaluates the minimum anyway."""
    return _lazy(sp.Min, [t for t in terms if t is not sp.oo])


def _sym_max(*terms):
    """``sympy.Max``, unsimplified while sizes are symbols (``_sym_min``)."""
    return _lazy(sp.Max, terms)


def _lazy(func, terms):
    terms = [sp.sympify(t) for t in terms]
    return func(*terms) if all(t.is_number for t in terms) else func(*terms, evaluate=False)


def _sym_gemm_tiles(p, m, n, k):
    eb = p["elem_bytes"]

    def aligned(b):
        return sp.And(sp.Eq(sp.Mod(n * eb, b), 0), sp.Eq(sp.Mod(k * eb, b), 0))

    t_al = _sym_min(*_tile_terms(p, m, n, k, sym=True))
    mp, np_ = sp.ceiling(m / MIS_TILE) * MIS_TILE, sp.ceiling(n / MIS_TILE) * MIS_TILE
    q_mis = mp * np_ / (mp * np_ + p["mn_half_mis"]) * k / (k + p["k_half_mis"])
    t_mis = 2 * mp * np_ * k / (p["R_mis"] * q_mis)
    t = sp.Piecewise((t_al, aligned(32)), (t_al / p["p16"], aligned(16)), (t_mis, aligned(8)),
                     (t_mis / p["p4"], aligned(4)), (t_mis / p["p2"], True))
    bytes_moved = eb * (m * k + k * n + m * n)
    return _sym_max(p["t_cpu"], _sym_max(p["t0"] + t, bytes_moved / p["bw"]))


_define(Form(
    "gemm_tiles", ("m", "n", "k"),
    ("R", "k_half", "e16", "e8", "e4", "t_split", "p16", "R_mis", "k_half_mis", "mn_half_mis", "p4", "p2",
     "t0", "t_cpu", "bw", "elem_bytes", "sms"),
    lambda p, m, n, k: np.maximum(p["t_cpu"], gemm_tiles_gpu(p, m, n, k)),
    _sym_gemm_tiles,
    "fastest of several output-tile shapes and split-K factors (waves on the SMs); misaligned rows padded",
))

_define(Form(
    "mem_affine", ("x",), ("t0", "beta", "t_cpu"),
    lambda p, x: np.maximum(p["t_cpu"], p["t0"] + x * p["beta"]),
    lambda p, x: sp.Max(p["t_cpu"], p["t0"] + x * p["beta"]),
    "latency + elements × bytes-per-element / bandwidth",
))
_define(Form(
    "mem_power", ("x",), ("t0", "beta", "gamma", "t_cpu"),
    lambda p, x: np.maximum(p["t_cpu"], p["t0"] + p["beta"] * x ** p["gamma"]),
    lambda p, x: sp.Max(p["t_cpu"], p["t0"] + p["beta"] * x ** p["gamma"]),
    "latency + a power law in size (bandwidth that still grows with size)",
))
_define(Form(
    "mem_smoothmax", ("x",), ("t0", "beta", "q", "t_cpu"),
    lambda p, x: np.maximum(p["t_cpu"], (p["t0"] ** p["q"] + (x * p["beta"]) ** p["q"]) ** (1.0 / p["q"])),
    lambda p, x: sp.Max(p["t_cpu"], (p["t0"] ** p["q"] + (x * p["beta"]) ** p["q"]) ** (1 / p["q"])),
    "latency or bandwidth bound, whichever dominates, joined smoothly (q-norm of the two)",
))
_define(Form(
    "mem_rows", ("x", "rows"), ("t0", "beta", "beta_row", "t_cpu"),
    lambda p, x, rows: np.maximum(p["t_cpu"], p["t0"] + x * p["beta"] + rows * p["beta_row"]),
    lambda p, x, rows: sp.Max(p["t_cpu"], p["t0"] + x * p["beta"] + rows * p["beta_row"]),
    "row-wise kernel (norm, softmax, loss): bandwidth term plus a per-row reduction cost",
))
def _rowlen_factor(p, x, rows):
    """1 + r·L^q/(L^q + L_half^q), L = x/rows: long rows cost more per element (a row that no
    longer fits one block's registers is read in several passes, e.g. softmax's max, sum, write)."""
    length = x / rows
    return 1 + p["r"] * length ** p["q"] / (length ** p["q"] + p["L_half"] ** p["q"])


_define(Form(
    "mem_rowlen", ("x", "rows"), ("t0", "beta", "r", "L_half", "q", "t_cpu"),
    lambda p, x, rows: np.maximum(p["t_cpu"], p["t0"] + x * p["beta"] * _rowlen_factor(p, x, rows)),
    lambda p, x, rows: sp.Max(p["t_cpu"], p["t0"] + x * p["beta"] * _rowlen_factor(p, x, rows)),
    "row-wise kernel whose cost per element grows with the row length (softmax over long rows)",
))
_define(Form(
    "mem_affine2", ("x", "y"), ("t0", "beta", "beta_y", "t_cpu"),
    lambda p, x, y: np.maximum(p["t_cpu"], p["t0"] + x * p["beta"] + y * p["beta_y"]),
    lambda p, x, y: sp.Max(p["t_cpu"], p["t0"] + x * p["beta"] + y * p["beta_y"]),
    "two-operand memory-bound kernel (embedding backward: tokens·h gathered, vocab·h zeroed)",
))


# torchao float8 linears (perfmodel/fit/published_float8.py): what a float8 linear's forward and backward take beyond
# its GEMMs and the casts' bytes, measured against bfloat16: a fixed time per linear, t0 (``share`` of it per GEMM),
# and a time per element of the linear's input (``mk``)
_define(Form(
    "fp8_linear_extra", ("mk", "share"), ("t0", "a"),
    lambda p, mk, share: p["t0"] * share + p["a"] * mk,
    lambda p, mk, share: p["t0"] * share + p["a"] * mk,
    "float8 linear beyond its GEMMs and cast bytes: fixed time per linear + time per input element",
))

_define(Form(
    "per_param", ("params",), ("t0", "beta"),
    lambda p, /, params: p["t0"] + params * p["beta"],
    lambda p, /, params: p["t0"] + params * p["beta"],
    "optimizer step: latency + parameters × bytes-per-parameter / bandwidth",
))

# CNN kernel classes (perfmodel/costs/cnn.py): a per-class correction of a reference time the
# profile already prices -- the implicit GEMM of a dense or grouped convolution (M = N·P·Q,
# N = K, K = C/g·R·S; Chetlur et al. 2014), or the measured copy-bandwidth time of the bytes a
# bandwidth-bound kernel moves (depthwise convolution, batch norm, activations, pooling; roofline)
_define(Form(
    "scaled_ref", ("t_ref",), ("t0", "c", "t_cpu"),
    lambda p, t_ref: np.maximum(p["t_cpu"], p["t0"] + p["c"] * t_ref),
    lambda p, t_ref: sp.Max(p["t_cpu"], p["t0"] + p["c"] * t_ref),
    "fitted per-class correction c of a reference time (implicit GEMM or bytes at copy bandwidth) + latency",
))

# ... and a convolution whose implicit GEMM has fewer output tiles than the GPU has SMs: fill = max(1, SMs / tiles)
# (perfmodel/costs/cnn.py output_fill). A plain GEMM fills the SMs by splitting its reduction; a cuDNN pass
# of few tiles (a weight gradient of few channels: m = Cout, n = C·R·S) fills them at a cost the GEMM fit does
# not see, fitted as a power a of the shortfall (a = 0: scaled_ref)
_define(Form(
    "scaled_ref_fill", ("t_ref", "fill"), ("t0", "c", "a", "t_cpu"),
    lambda p, t_ref, fill: np.maximum(p["t_cpu"], p["t0"] + p["c"] * t_ref * np.power(fill, p["a"])),
    lambda p, t_ref, fill: sp.Max(p["t_cpu"], p["t0"] + p["c"] * t_ref * fill ** p["a"]),
    "scaled_ref with the implicit GEMM's SM shortfall: t0 + c · t_ref · max(1, SMs / output tiles)^a",
))

FORMS: tuple[Form, ...] = tuple(_DEFINED)  # every compute form, in definition order
