"""Primitive cost functions, checked by hand."""

import numpy as np
import pytest

from perfmodel.costs.compute import kernel_time, phase_time
from perfmodel.forms.registry import get_form
from perfmodel.profiles.profile import Profile
from perfmodel.workload.ops import Kernel, gemm, linear, mem

HAND = Profile("hand", "h200-sxm-141gb", compute={
    # 2 µs + elements × 1 ps (4 bytes at 4 TB/s)
    "layernorm:fp32:fwd": {"form": "mem_affine", "params": {"t0": 2e-6, "beta": 1e-12, "t_cpu": 0.0}},
    "gelu:bf16:fwd": {"form": "mem_affine", "params": {"t0": 1e-6, "beta": 5e-13, "t_cpu": 2e-5}},
    "gemm:bf16": {"form": "gemm_smooth", "params": {
        "R": 1e15, "k_half": 0.0, "m_half": 0.0, "n_half": 0.0, "t0": 0.0, "t_cpu": 1e-5, "p16": 1.0, "p8": 0.5,
        "p4": 0.25, "p2": 0.2, "p_both": 1.0, "bw": 1e30, "elem_bytes": 2.0}},
    "adamw:fused": {"form": "per_param", "params": {"t0": 1e-4, "beta": 1e-11}},
}, host={"cpu_per_kernel_s": 1.5e-5})


def test_memory_bound_kernel_by_hand():
    g, c = kernel_time(HAND, mem("ln", "layernorm", "fwd", 1_000_000))
    assert g == pytest.approx(2e-6 + 1e-6)         # 2 µs + 1e6 × 1 ps
    assert c == pytest.approx(1.5e-5)              # graph-fitted class: host launch cost


def test_gemm_rate_and_alignment_by_hand():
    # 4096³ at 1 PFLOP/s with no saturation: 2·4096³ / 1e15 = 137.4 µs
    g, c = kernel_time(HAND, gemm("mm", "fwd", 4096, 4096, 4096))
    assert g == pytest.approx(2 * 4096**3 / 1e15)
    assert c == pytest.approx(1e-5)
    # n = 4092: rows 8184 bytes, aligned to 8 bytes only -> p8 = 0.5, twice the time
    g_mis, _ = kernel_time(HAND, gemm("mm", "fwd", 4096, 4092, 4096))
    assert g_mis == pytest.approx(2 * 4096 * 4092 * 4096 / 0.5e15)
    # m does not matter
    g_m, _ = kernel_time(HAND, gemm("mm", "fwd", 4095, 4096, 4096))
    assert g_m == pytest.approx(2 * 4095 * 4096**2 / 1e15)


def test_linear_layout_puts_the_vocabulary_in_the_right_place():
    fwd, bwd = linear("head", 8192, 768, 50257)
    shapes = [(k.size["m"], k.size["n"], k.size["k"]) for k in fwd + bwd]
    assert shapes == [(8192, 50257, 768), (8192, 768, 50257), (50257, 768, 8192)]  # fwd, dgrad, wgrad


def test_phase_is_max_of_gpu_and_cpu_sums():
    tiny = [mem("a", "layernorm", "fwd", 10, count=100)]     # 100 × 2 µs GPU, 100 × 15 µs CPU
    wall, gpu, cpu = phase_time(HAND, tiny)
    assert gpu == pytest.approx(100 * (2e-6 + 1e-11))
    assert cpu == pytest.approx(100 * 1.5e-5)
    assert wall == pytest.approx(cpu)                       # launch-bound
    big = [mem("b", "layernorm", "fwd", 1e9)]               # 1 ms GPU vs 15 µs CPU
    assert phase_time(HAND, big)[0] == pytest.approx(2e-6 + 1e-3)


def test_dtype_scaling_of_memory_classes():
    # a bf16 layernorm priced from the fp32 curve moves half the bytes per element
    g, _ = kernel_time(HAND, mem("ln", "layernorm", "fwd", 1_000_000, dtype="bf16"))
    assert g == pytest.approx(2e-6 + 0.5e-6)


def test_optimizer_by_hand_and_sgd_ratio():
    g, _ = kernel_time(HAND, Kernel("opt", "adamw", "opt", {"params": 1e9}))
    assert g == pytest.approx(1e-4 + 1e-2)
    s, _ = kernel_time(HAND, Kernel("opt", "sgd", "opt", {"params": 1e9}))
    assert s == pytest.approx(1e-4 + 1e-2 * 20 / 28)


def test_kernel_sizes_broadcast():
    g, _ = kernel_time(HAND, gemm("mm", "fwd", np.array([1024, 2048, 4096]), 4096, 4096))
    assert g.shape == (3,)
    assert np.all(np.diff(g) > 0)


def test_forms_numpy_and_sympy_agree_on_a_hand_value():
    form = get_form("mem_affine")
    p = {"t0": 1e-6, "beta": 2e-12, "t_cpu": 0.0}
    assert float(form.evaluate(p, x=1e6)) == pytest.approx(3e-6)
    assert float(form.expression(p, x=1e6)) == pytest.approx(3e-6)


def test_attention_by_blocks_by_hand():
    """seq 256 in 128-row blocks: 4 tiles per head, 3 when causal (+ the two diagonal ones' masking)."""
    form = get_form("sdpa_tiles")
    p = {"R": 4 * 128**2 * 128 / 1e-6, "d_half": 0.0, "p_mis": 1.0, "p_diag": 0.25, "k_tail": 0.0,
         "c_row": 0.0, "t0": 0.0, "t_cpu": 0.0, "T": 128.0, "sms": 132.0}  # one tile = 1 µs
    args = {"batch": 2, "heads": 3, "seq": 256, "head_dim": 128}
    assert form.evaluate(p, **args, causal=0) == pytest.approx(2 * 3 * 4 * 1e-6)
    assert form.evaluate(p, **args, causal=1) == pytest.approx(2 * 3 * (3 + 2 * 0.25) * 1e-6)
    # the tail: the longest program sweeps n = 2 blocks on one of 132 SMs
    assert form.evaluate({**p, "k_tail": 1.0}, **args, causal=0) == pytest.approx((2 * 3 * 4 + 2 * 132) * 1e-6)
    # head_dim 80 runs as 96 (steps of 32) or 128 (sdpa_tiles64)
    assert form.evaluate(p, **{**args, "head_dim": 80}, causal=0) == pytest.approx(2 * 3 * 4 * 1e-6 * 96 / 128)
    assert get_form("sdpa_tiles64").evaluate(p, **{**args, "head_dim": 80}, causal=0) == pytest.approx(24e-6)


def test_gemm_tiles_prices_partial_tiles_and_split_k():
    """``gemm_tiles``: a misaligned n one past a 128 tile costs a tile row more than one short of it,
    and a GEMM too small to fill the SMs along m and n takes split-K over k."""
    from perfmodel.forms.compute import gemm_tiles_gpu

    p = {"R": 8e14, "k_half": 150.0, "e16": 0.9, "e8": 0.7, "e4": 0.5, "t_split": 2e-6, "p16": 0.95,
         "R_mis": 3e14, "k_half_mis": 200.0, "mn_half_mis": 4e5, "p4": 0.6, "p2": 0.5, "t0": 3e-6,
         "bw": 4e12, "elem_bytes": 2.0, "sms": 132.0}
    short, past = (float(gemm_tiles_gpu(p, 8192.0, n, 3072.0)) for n in (767.0, 769.0))
    assert past / short == pytest.approx(7 / 6, rel=0.02)  # 6 -> 7 tiles of 128 along n
    no_split = {**p, "t_split": 1.0}  # a split that costs a second: never chosen
    assert gemm_tiles_gpu(p, 128.0, 128.0, 65536.0) < 0.5 * gemm_tiles_gpu(no_split, 128.0, 128.0, 65536.0)


def test_one_gemm_on_floats_is_bitwise_the_array_path():
    """``gemm_tiles_gpu`` of one GEMM (Python floats) equals the same GEMM priced inside an array, bit
    for bit, over aligned and misaligned sizes of every alignment class and sizes of zero."""
    from perfmodel.forms.compute import gemm_tiles_gpu

    p = {"R": 8e14, "k_half": 150.0, "e16": 0.9, "e8": 0.7, "e4": 0.5, "t_split": 2e-6, "p16": 0.95,
         "R_mis": 3e14, "k_half_mis": 200.0, "mn_half_mis": 4e5, "p4": 0.6, "p2": 0.5, "t0": 3e-6,
         "bw": 4e12, "elem_bytes": 2.0, "sms": 132.0}
    rng = np.random.default_rng(3)
    sizes = np.concatenate([rng.integers(1, 70000, (300, 3)), [[0, 64, 64], [4096, 4095, 4096], [1, 1, 1],
                                                              [8192, 8190, 4097], [65536, 8, 2]]]).astype(float)
    m, n, k = sizes.T
    with np.errstate(divide="ignore", invalid="ignore"):  # as Form.evaluate calls it (a size of 0: 0/0)
        together = gemm_tiles_gpu(p, m, n, k)
        alone = [gemm_tiles_gpu(p, np.asarray(a), np.asarray(b), np.asarray(c)) for a, b, c in sizes]
    assert np.array_equal(np.asarray(alone, float), together, equal_nan=True)
