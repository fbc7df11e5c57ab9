"""Closed forms of one collective on one fabric level, in nccl-tests terms (see costs/comm.py).

``factor`` is the nccl-tests bus-bandwidth factor of the collective and group
size (NVIDIA/nccl-tests doc/PERFORMANCE.md), so one entry serves every collective.
"""

from __future__ import annotations

from collections.abc import Callable

from perfmodel.forms.base import Form

# busbw = algbw * factor(n); works on numpy arrays and sympy symbols alike.
# Source: NVIDIA/nccl-tests doc/PERFORMANCE.md (sendrecv: point to point, factor 1).
BUSBW_FACTOR: dict[str, Callable] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,  # ring: 2(n-1) steps of S/n each
    "all_gather": lambda n: (n - 1) / n,  # S = sendcount * sizeof(dtype) * n
    "reduce_scatter": lambda n: (n - 1) / n,  # S = recvcount * sizeof(dtype) * n
    "broadcast": lambda n: 1 + 0 * n,  # every rank receives S once
    "all_to_all": lambda n: (n - 1) / n,  # S = bytes each rank sends in all
    "sendrecv": lambda n: 1 + 0 * n,  # S = bytes each rank sends
}



def _alpha(p, n):
    # latency grows with the ring's step count (Thakur, Rabenseifner & Gropp 2005): alpha + a_r (n-1)
    return p["alpha_s"] + p["alpha_rank_s"] * (n - 1)


def _alpha_beta_np(p, *, size, n, factor):
    return _alpha(p, n) + size * factor / p["busbw_bytes_per_s"]  # Hockney alpha-beta


def _logistic_np(p, *, size, n, factor):
    # busbw(S) = B / (1 + (S_half / S)^k): a logistic in log S, so S / busbw = (S + S_half^k S^(1-k)) / B
    shape = p["half_size_bytes"] ** p["exponent"] * size ** (1 - p["exponent"])
    return _alpha(p, n) + factor * (size + shape) / p["busbw_bytes_per_s"]


def _alpha_beta_sp(p, *, size, n, factor):
    return _alpha(p, n) + size * factor / p["busbw_bytes_per_s"]


def _logistic_sp(p, *, size, n, factor):
    busbw = p["busbw_bytes_per_s"] / (1 + (p["half_size_bytes"] / size) ** p["exponent"])
    return _alpha(p, n) + size * factor / busbw


_VARIABLES = ("size", "n", "factor")
_AB_PARAMS = ("alpha_s", "alpha_rank_s", "busbw_bytes_per_s")

ALPHA_BETA = Form(
    "comm_alpha_beta", _VARIABLES, _AB_PARAMS, _alpha_beta_np, _alpha_beta_sp,
    doc="t = alpha(n) + S factor(n) / B (constant bus bandwidth; Hockney 1994)",
)
LOGISTIC = Form(
    "comm_logistic", _VARIABLES, (*_AB_PARAMS, "half_size_bytes", "exponent"),
    _logistic_np, _logistic_sp,
    doc="t = alpha(n) + S factor(n) / busbw(S), busbw(S) = B / (1 + (S_half/S)^k)",
)
FORMS: tuple[Form, ...] = (ALPHA_BETA, LOGISTIC)


def collective_expression(form: Form, params, collective: str, *, size, n):
    """Sympy expression of one collective's time under ``form`` (valid for n >= 2 and S > 0)."""
    return form.expression(params, size=size, n=n, factor=BUSBW_FACTOR[collective](n))
