"""``gemm_tiles``'s stream-K term: a GEMM with a small output and a long reduction (a convolution's
weight gradient) spreads its k loop over every SM; a GEMM that fills the SMs is priced as before."""

import math

import numpy as np
import pytest
import sympy as sp

from perfmodel.forms.compute import GEMM_SPLITS, GEMM_TILE_SHAPES, gemm_tiles_gpu
from perfmodel.forms.registry import get_form

P = {"R": 8e14, "k_half": 150.0, "e16": 0.9, "e8": 0.7, "e4": 0.5, "t_split": 2e-6, "p16": 0.95,
     "R_mis": 3e14, "k_half_mis": 200.0, "mn_half_mis": 4e5, "p4": 0.6, "p2": 0.5, "t0": 3e-6,
     "bw": 4e12, "elem_bytes": 2.0, "sms": 132.0, "t_cpu": 0.0}
EFF = {32768: 1.0, 16384: P["e16"], 8192: P["e8"], 4096: P["e4"]}


def test_wgrad_shaped_gemm_uses_more_sms_than_split_4_allows():
    """ResNet-50's first 1x1 weight gradient at batch 512 (256 x 64 outputs, k = 512·56·56): split-K over
    at most 4 ways keeps at most tiles·4 CTAs busy; the priced rate is well above that bound."""
    m, n, k = 256.0, 64.0, 512.0 * 56 * 56
    t = float(gemm_tiles_gpu(P, m, n, k))
    busy = max(EFF[tm * tn] * min(P["sms"], math.ceil(m / tm) * math.ceil(n / tn) * max(GEMM_SPLITS))
               for tm, tn in GEMM_TILE_SHAPES)  # SMs' worth of work split-K can keep busy
    rate, split_bound = 2 * m * n * k / t, P["R"] * busy / P["sms"]
    assert rate > 2.0 * split_bound
    assert rate < P["R"]


def test_stream_k_time_by_hand():
    """512 x 512 outputs, k = 2^18: 8 tiles of 128x256 (fewer than half of 132 SMs), units =
    min(132, ⌊8·2^18 / 512⌋) = 132, each a K range of 8·2^18/132; + t_split + 8·128·256·132 B / bw."""
    k = 2.0 ** 18
    ku = 8 * k / 132
    by_hand = 2 * 128 * 256 * (ku + 150.0) / (8e14 / 132) + 2e-6 + 8 * 128 * 256 * 132 / 4e12
    assert float(gemm_tiles_gpu(P, 512.0, 512.0, k)) == pytest.approx(P["t0"] + by_hand, rel=1e-12)


def test_large_square_gemm_is_data_parallel_as_before():
    """8192³: 2048 tiles of 128x256 in ⌈2048/132⌉ = 16 waves, no split and no stream-K."""
    k = 8192.0
    by_hand = 16 * 2 * 128 * 256 * (k + 150.0) / (8e14 / 132)
    assert float(gemm_tiles_gpu(P, 8192.0, 8192.0, k)) == pytest.approx(P["t0"] + by_hand, rel=1e-12)


def test_stream_k_needs_enough_k_per_unit():
    """A short reduction (k = 512: one unit's minimum of 8 k-tiles of 64 bf16) is not spread."""
    without = {**P, "t_split": 1.0}  # any split or stream-K term costs a second: only data-parallel tiles remain
    assert float(gemm_tiles_gpu(P, 128.0, 128.0, 512.0)) == float(gemm_tiles_gpu(without, 128.0, 128.0, 512.0))


def test_floats_arrays_and_sympy_agree_on_stream_k_shapes():
    form = get_form("gemm_tiles")
    sizes = np.array([[256, 64, 512 * 56 * 56], [64, 576, 256 * 28 * 28], [512, 512, 2 ** 18], [768, 768, 16384]], float)
    together = np.asarray(form.evaluate(P, m=sizes[:, 0], n=sizes[:, 1], k=sizes[:, 2]), float)
    for (m, n, k), t in zip(sizes, together):
        assert float(gemm_tiles_gpu(P, m, n, k)) == t
        symbolic = float(form.expression(P, m=sp.Integer(int(m)), n=sp.Integer(int(n)), k=sp.Integer(int(k))))
        assert symbolic == pytest.approx(t, rel=1e-9)


def test_stream_k_off_for_simt_kernels():
    """``stream_k`` = 0 (fp32 entries: SIMT kernels) prices the wgrad shape with the split terms only,
    as slow as split 4 allows; the fitter sets it from the dtype."""
    m, n, k = 256.0, 64.0, 512.0 * 56 * 56
    off = {**P, "stream_k": 0.0}
    slow = float(gemm_tiles_gpu(off, m, n, k))
    assert slow > 2.0 * float(gemm_tiles_gpu(P, m, n, k))
    assert float(gemm_tiles_gpu(off, np.array([m]), np.array([n]), np.array([k]))[0]) == slow
    form = get_form("gemm_tiles")
    assert float(form.expression(off, m=sp.Integer(256), n=sp.Integer(64), k=sp.Integer(int(k)))) == pytest.approx(slow)
