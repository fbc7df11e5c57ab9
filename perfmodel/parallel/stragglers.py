"""The slowest GPU sets a synchronous step: devices of one model differ in speed, and every rank waits.

GPUs of one model and SKU do not run at one speed. At their power limit each die's power management
settles at its own clock (manufacturing variability), so a kernel takes longer on some devices than
on others, persistently. Sinha et al., "Not All GPUs Are Created Equal: Characterizing Variability in
Large-Scale, Accelerator-Rich Systems" (SC22, arXiv 2208.11035v3), measured over 90% of the GPUs of
five clusters (Summit, Vortex, Frontera, Longhorn, Corona) running SGEMM, ResNet-50, BERT, LAMMPS
and PageRank: "8% (max 22%) average performance variation". Their variation is the box plot's
whisker span over the median, (Q3 + 1.5 IQR − (Q1 − 1.5 IQR)) / Q2 = 4 IQR / median
(hal-uw/gpu_variability_sc22_artifact @bc84e72, ``plot_script/plot_aggregated.py``). For a normal
spread IQR = 1.349 σ, so σ = 8% / (4 × 1.349) = 1.48% of the median speed (:data:`FLEET_SPREAD`).

A synchronous step (data-parallel gradients, FSDP gathers, tensor-parallel collectives, pipeline
flushes) waits for its slowest rank, so its compute takes the expected maximum of ``n`` devices'
times, not one device's: 1 + σ · E[max of n standard normals] (what a launch-bound phase's host time
hid of it excepted: :func:`lagged_seconds`), the expectation by Blom's plotting
position Φ⁻¹((n − 0.375) / (n + 0.25)) (Blom 1958, *Statistical Estimates and Transformed
Beta-Variables*; 4.4% above the exact order statistic at n = 2, 0.7% at n = 8). A profile's curves
are one device's measurements, or published ones: the median device in expectation, so ``n`` = 1
adds nothing. Asynchronous workers do not wait for each other and take no lag.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from perfmodel.core.algebra import is_symbolic, maximum
from perfmodel.core.errors import InvalidInputError

FLEET_SPREAD = 0.08 / (4 * 1.349)  # σ of a device's speed over the fleet's median (module docstring)
BLOM_ALPHA = 0.375  # Blom 1958: E[k-th of n] ≈ Φ⁻¹((k − α) / (n − 2α + 1))


def expected_max_normal(n):
    """E[max of ``n`` independent standard normals] by Blom's approximation; 0 at n = 1.

    Works on numbers, numpy arrays (each distinct count computed once) and sympy expressions."""
    if is_symbolic(n):
        import sympy as sp

        return sp.sqrt(2) * sp.erfinv(2 * (n - BLOM_ALPHA) / (n + 1 - 2 * BLOM_ALPHA) - 1)
    counts = np.asarray(n, dtype=float)
    if np.any(~np.isfinite(counts)) or np.any(counts < 1):
        raise InvalidInputError(f"device counts must be finite and >= 1: got {n!r}")
    if counts.ndim == 0 or np.all(counts == counts.flat[0]):  # one GPU count (a search over one cluster)
        z = _blom(float(counts.flat[0]))
        return z if counts.ndim == 0 else np.full(counts.shape, z)
    unique, inverse = np.unique(counts, return_inverse=True)
    return np.array([_blom(k) for k in unique])[inverse].reshape(counts.shape)


@lru_cache(maxsize=256)
def _blom(n: float) -> float:
    from statistics import NormalDist  # imports random, decimal and fractions: not at ``import perfmodel``

    return NormalDist().inv_cdf((n - BLOM_ALPHA) / (n + 1 - 2 * BLOM_ALPHA))


def slowest_device_lag(n, spread: float = FLEET_SPREAD):
    """The fraction by which the slowest of ``n`` devices' kernels outlast the median device's:
    ``spread`` · E[max of n standard normals]."""
    return spread * expected_max_normal(n)


def lagged_seconds(kernels, host, lag):
    """(seconds a step grows by, host seconds still exposed) when its kernels, ``kernels`` GPU seconds
    with ``host`` seconds of launch overhead exposed beside them, take ``1 + lag`` times as long: a phase
    runs max(GPU, CPU), so the exposed host time hides the first of the growth."""
    grow = maximum(lag * kernels - host, 0.0)
    return grow, host + grow - lag * kernels


def device_spread(cluster) -> float:
    """σ of a device's speed over the median's for the cluster's GPU: its ``speed_spread``, else the fleet's."""
    spread = getattr(getattr(cluster, "gpu", None), "speed_spread", None)
    return FLEET_SPREAD if spread is None else spread


def paced_growth(kernels, host, optimizer, n, spread: float = FLEET_SPREAD):
    """Seconds a one-stage step on ``n`` devices grows by at its slowest device's pace: its kernels' growth past
    the exposed ``host`` time (:func:`lagged_seconds`) and its optimizer's (``step.slowest_pace`` for pipelines)."""
    lag = slowest_device_lag(n, spread)
    return lagged_seconds(kernels, host, lag)[0] + lag * optimizer
