"""The closed forms on Python floats: each numpy body's twin with ``math`` and plain arithmetic.

A cold ``pm.predict`` prices a few thousand kernels and collectives one at a time; each numpy
call on a 0-d array costs microseconds, the same arithmetic on floats a fraction of that. Every
function below repeats its form's numpy body (perfmodel/forms/compute.py, perfmodel/forms/comm.py)
operation for operation, in the same order, so both give the same IEEE doubles; ``Form.evaluate``
falls back to the numpy body when a twin raises (a division by zero: numpy's inf) or gives no
finite float. tests/test_forms_scalar.py holds every registered form's twin equal to its body.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType

from perfmodel.forms.compute import _gemm_tiles_one, _row_align_one


def _max(a: float, b: float) -> float:
    """``np.maximum`` of two floats: NaN when either is NaN (so the caller falls back)."""
    return a if a >= b else b if b > a else math.nan


def _ceil(x: float) -> float:
    return float(math.ceil(x))


def _align_factor(p, n, k):
    an, ak = _row_align_one(n, p["elem_bytes"]), _row_align_one(k, p["elem_bytes"])
    a = min(an, ak)
    factor = 1.0 if a >= 32 else p["p16"] if a >= 16 else p["p8"] if a >= 8 else p["p4"] if a >= 4 else p["p2"]
    return factor * (p["p_both"] if an < 16 and ak < 16 else 1.0)


def gemm_smooth(p, m, n, k):
    q = m / (m + p["m_half"]) * n / (n + p["n_half"])
    rate = p["R"] * q * k / (k + p["k_half"]) * _align_factor(p, n, k)
    bytes_moved = p["elem_bytes"] * (m * k + k * n + m * n)
    return _max(p["t_cpu"], _max(p["t0"] + 2.0 * m * n * k / rate, bytes_moved / p["bw"]))


def gemm_two(p, m, n, k):
    a = min(_row_align_one(n, p["elem_bytes"]), _row_align_one(k, p["elem_bytes"]))
    if a >= 16:
        q = m / (m + p["m_half"]) * n / (n + p["n_half"]) * k / (k + p["k_half"])
        rate = p["R"] * q * (1.0 if a >= 32 else p["p16"])
    else:
        q_mis = m * n / (m * n + p["mn_half_mis"]) * k / (k + p["k_half_mis"])
        rate = p["R_mis"] * q_mis * (1.0 if a >= 8 else p.get("p4", 1.0) if a >= 4 else p.get("p2", 1.0))
    bytes_moved = p["elem_bytes"] * (m * k + k * n + m * n)
    return _max(p["t_cpu"], _max(p["t0"] + 2.0 * m * n * k / rate, bytes_moved / p["bw"]))


def gemm_tiles(p, m, n, k):
    if not (m > 0 and n > 0 and k > 0):
        raise ValueError("an empty GEMM: the numpy body's masks price it")
    return _max(p["t_cpu"], float(_gemm_tiles_one(p, m, n, k)))


def _rowlen_factor(p, x, rows):
    length = x / rows
    return 1 + p["r"] * length ** p["q"] / (length ** p["q"] + p["L_half"] ** p["q"])


def _sdpa_flash(step):
    def fn(p, batch, heads, seq, head_dim, causal):
        d_pad = _ceil(head_dim / step) * step
        d_eff = head_dim / d_pad * d_pad / (d_pad + p["d_half"])
        eff = seq / (seq + p["s_half"]) * d_eff * (p["p_mis"] if head_dim % 8 != 0 else 1.0)
        rate = p["R"] * eff * (p["p_causal"] if causal > 0 else 1.0)
        full = 4.0 * batch * heads * seq * seq * head_dim
        flops = 0.5 * full if causal != 0 else full
        return _max(p["t_cpu"], p["t0"] + p["c_row"] * batch * heads * seq + flops / rate)
    return fn


def _sdpa_tiles(step, falling=False):
    def fn(p, batch, heads, seq, head_dim, causal):
        n = _ceil(seq / p["T"])
        tiles = n * (n + 1) / 2 + n * p["p_diag"] if causal > 0 else n * n
        d_pad = _ceil(head_dim / step) * step
        d_term = 1.0 + p["d_half"] / d_pad if falling else d_pad / (d_pad + p["d_half"])
        rate = p["R"] * d_term * (p["p_mis"] if head_dim % 8 != 0 else 1.0)
        tile_flops = 4.0 * p["T"] ** 2 * d_pad
        compute = (batch * heads * tiles + p["k_tail"] * n * p["sms"]) * tile_flops / rate
        return _max(p["t_cpu"], p["t0"] + p["c_row"] * batch * heads * seq + compute)
    return fn


def _alpha(p, n):
    return p["alpha_s"] + p["alpha_rank_s"] * (n - 1)


def _logistic(p, size, n, factor):
    shape = p["half_size_bytes"] ** p["exponent"] * size ** (1 - p["exponent"])
    return _alpha(p, n) + factor * (size + shape) / p["busbw_bytes_per_s"]


SCALAR_FNS: Mapping[str, Callable] = MappingProxyType({
    "gemm_smooth": gemm_smooth,
    "gemm_two": gemm_two,
    "gemm_two_levels": gemm_two,
    "gemm_tiles": gemm_tiles,
    "mem_affine": lambda p, x: _max(p["t_cpu"], p["t0"] + x * p["beta"]),
    "mem_power": lambda p, x: _max(p["t_cpu"], p["t0"] + p["beta"] * x ** p["gamma"]),
    "mem_smoothmax": lambda p, x: _max(p["t_cpu"], (p["t0"] ** p["q"] + (x * p["beta"]) ** p["q"]) ** (1.0 / p["q"])),
    "mem_rows": lambda p, x, rows: _max(p["t_cpu"], p["t0"] + x * p["beta"] + rows * p["beta_row"]),
    "mem_rowlen": lambda p, x, rows: _max(p["t_cpu"], p["t0"] + x * p["beta"] * _rowlen_factor(p, x, rows)),
    "mem_affine2": lambda p, x, y: _max(p["t_cpu"], p["t0"] + x * p["beta"] + y * p["beta_y"]),
    "sdpa_flash": _sdpa_flash(32.0),
    "sdpa_flash64": _sdpa_flash(64.0),
    "sdpa_tiles": _sdpa_tiles(32),
    "sdpa_tiles64": _sdpa_tiles(64),
    "sdpa_tiles64_falling": _sdpa_tiles(64, falling=True),
    "per_param": lambda p, params: p["t0"] + params * p["beta"],
    "fp8_linear_extra": lambda p, mk, share: p["t0"] * share + p["a"] * mk,
    "scaled_ref": lambda p, t_ref: _max(p["t_cpu"], p["t0"] + p["c"] * t_ref),
    "scaled_ref_fill": lambda p, t_ref, fill: _max(p["t_cpu"], p["t0"] + p["c"] * t_ref * fill ** p["a"]),
    "comm_alpha_beta": lambda p, size, n, factor: _alpha(p, n) + size * factor / p["busbw_bytes_per_s"],
    "comm_logistic": _logistic,
})
