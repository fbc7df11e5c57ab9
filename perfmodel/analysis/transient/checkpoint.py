"""Checkpoint/restart under revocations: the interval and the expected time to finish.

Notation (seconds): W useful work, τ work between checkpoints (the interval),
δ time to write one checkpoint, R downtime per revocation (wait for a
replacement + restart + restore), M mean time between revocations of the
part of the cluster whose loss stalls the job.

Synchronous training (all-reduce data parallelism) stalls when any worker is
revoked and rolls back to the last checkpoint; its M is the cluster's,
1 / Σ 1/Mᵢ. The job runs as ⌈W/τ⌉ segments, each τ of work then a
checkpoint (the last segment holds the remainder). A segment of length
a = τ + δ is retried until it runs a whole a without a revocation; the
downtime R is not itself exposed to revocations. Renewal-reward argument:
with X ~ Exp(1/M), E[T_a] = E[min(X, a)] + P(X < a)(R + E[T_a]), so

    E[T_a] = (M + R) (e^{a/M} - 1)

(Bougeret et al., "Checkpointing strategies for parallel jobs", SC 2011:
e^{λR'}(1/λ + D)(e^{λa} − 1), here with downtime D = R and no failable
recovery R' = 0; Daly 2006 makes the same renewal argument). Summed over
segments, when τ divides W: E[T] = (M + R)(e^{(τ+δ)/M} - 1) W/τ; the
expected number of revocations is Σ (e^{a/M} - 1).

Asynchronous / parameter-server training (:func:`expected_time_async`) loses
no work when a worker is revoked: the job slows by that worker's share while
it is away.
"""

from __future__ import annotations

import math

import numpy as np
from perfmodel.core.lazy import scipy_special as special

from perfmodel.core.errors import InvalidInputError
from perfmodel.core.checks import check_choice

METHODS = ("young", "daly", "exact")


def _array(name: str, value, *, allow_zero: bool = False) -> np.ndarray:
    """``value`` as a float array of finite numbers > 0 (or >= 0)."""
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name!r} must be a number of seconds or an array of them: got {value!r}") from None
    bad = ~np.isfinite(arr) | (arr < 0) | ((arr == 0) & (not allow_zero))
    if bad.any():
        bound = ">= 0" if allow_zero else "> 0"
        shown = arr[bad].ravel()[0] if arr.ndim else float(arr)
        raise InvalidInputError(f"{name!r} must be finite and {bound} (seconds): got {shown!r}")
    return arr


def _out(arr: np.ndarray):
    return float(arr) if arr.ndim == 0 else arr


def young_daly_interval(checkpoint_s: float, mtbf_s: float, *, method: str = "daly") -> float:
    """Work time between checkpoints that minimises the expected time to finish.

    ``"young"``: τ = √(2δM) (Young, "A first order approximation to the
    optimum checkpoint interval", CACM 17(9), 1974).
    ``"daly"``: τ = √(2δM)·[1 + ⅓√(δ/2M) + δ/(18M)] − δ for δ < 2M, else M
    (Daly, "A higher order estimate of the optimum checkpoint interval for
    restart dumps", FGCS 22(3), 2006).
    ``"exact"``: the minimiser of (e^{(τ+δ)/M} − 1)/τ, the closed form of this
    module: τ = M·(1 + W₀(−e^{−1−δ/M})), W₀ the principal Lambert W branch
    (Bougeret et al., SC 2011, sequential job under exponential failures).
    Broadcasts over arrays.
    """
    check_choice("method", method, METHODS)
    delta = _array("checkpoint_s", checkpoint_s, allow_zero=True)
    m = _array("mtbf_s", mtbf_s)
    if method == "young":
        return _out(np.sqrt(2.0 * delta * m))
    if method == "exact":
        if np.any(delta == 0):
            raise InvalidInputError("'checkpoint_s' must be > 0 for the exact interval (a free checkpoint is "
                                    "best taken continuously: the minimiser is 0)")
        # d/dτ of (e^{(τ+δ)/M} − 1)/τ = 0  <=>  (τ/M − 1) e^{τ/M − 1} = −e^{−1−δ/M}
        w0 = special.lambertw(-np.exp(-1.0 - delta / m), 0).real
        exact = m * (1.0 + w0)
        # near the branch point (δ/M below ~1e-8) W₀ loses its digits; Young's √(2δM) is exact to O(δ/M) there
        return _out(np.where(delta / m < 1e-8, np.sqrt(2.0 * delta * m), exact))
    ratio = delta / (2.0 * m)
    daly = np.sqrt(2.0 * delta * m) * (1.0 + np.sqrt(ratio) / 3.0 + ratio / 9.0) - delta
    return _out(np.where(delta < 2.0 * m, daly, m))


def checkpoint_time_s(checkpoint_bytes: float, bw_bytes_per_s: float) -> float:
    """Time to write (or read back) a checkpoint: bytes / storage bandwidth."""
    size = _array("checkpoint_bytes", checkpoint_bytes, allow_zero=True)
    bw = _array("bw_bytes_per_s", bw_bytes_per_s)
    return _out(size / bw)


def check_checkpoint_vs_mtbf(checkpoint_s, mtbf_s, what: str = "the cluster") -> None:
    """A checkpoint that outlasts the mean time between revocations never completes."""
    delta, m = np.broadcast_arrays(np.asarray(checkpoint_s, float), np.asarray(mtbf_s, float))
    bad = delta >= m
    if bad.any():
        d, mm = float(delta[bad].ravel()[0]), float(m[bad].ravel()[0])
        raise InvalidInputError(
            f"'checkpoint_s'={d:g} s must be shorter than the mean time between revocations "
            f"of {what} ({mm:g} s): valid are checkpoint_s < {mm:g} s; use faster storage, "
            f"smaller checkpoints, fewer workers or more reliable servers"
        )


def _segments(work, interval):
    """Number of full segments and the remainder of the last one (0 when τ divides W)."""
    full = np.floor(work / interval)
    rest = work - full * interval
    tiny = rest <= 1e-12 * np.maximum(work, 1.0)  # τ divides W up to rounding
    return full, np.where(tiny, 0.0, rest)


def _finite_expectation(value, segment_s, mtbf_s):
    """``value``, unless a segment so much longer than the mean time between revocations made it
    overflow: e^{(τ+δ)/M} past 1e308 means the segment practically never finishes."""
    if np.all(np.isfinite(value)):
        return value
    seg, m = np.broadcast_arrays(np.asarray(segment_s, float), np.asarray(mtbf_s, float))
    worst = int(np.argmax(seg / m))
    raise InvalidInputError(f"a checkpoint segment of {seg.flat[worst]:.3g} s (interval + checkpoint) against "
                            f"{m.flat[worst]:.3g} s between revocations practically never finishes (expected "
                            "time overflows); use a shorter 'interval_s'")


def _resolve_interval(interval_s, checkpoint, mtbf):
    if interval_s is None:
        if np.any(checkpoint == 0):
            raise InvalidInputError("'interval_s' is required when 'checkpoint_s' is 0 "
                                    "(the Young/Daly interval would be 0)")
        return np.asarray(young_daly_interval(checkpoint, mtbf, method="daly"), dtype=float)
    return _array("interval_s", interval_s)


def expected_time(work_s, *, mtbf_s, checkpoint_s, restart_s, interval_s=None):
    """Expected wall time (s) to finish ``work_s`` of useful work, synchronous training.

    Closed form (module docstring): Σ over segments (M + R)(e^{(τᵢ+δ)/M} − 1),
    with τ = ``interval_s`` (default: Daly's interval for δ and M). Exact for
    exponential revocations with the failure semantics above. ``mtbf_s`` is
    the cluster's mean time between revocations. Broadcasts over arrays.
    """
    work = _array("work_s", work_s)
    m = _array("mtbf_s", mtbf_s)
    delta = _array("checkpoint_s", checkpoint_s, allow_zero=True)
    restart = _array("restart_s", restart_s, allow_zero=True)
    check_checkpoint_vs_mtbf(delta, m)
    tau = _resolve_interval(interval_s, delta, m)
    full, rest = _segments(work, tau)
    with np.errstate(over="ignore", invalid="ignore"):
        per_full = np.expm1((tau + delta) / m)  # e^{a/M} − 1: expected tries beyond the first
        per_last = np.where(rest > 0, np.expm1((rest + delta) / m), 0.0)
        total = (m + restart) * (np.where(full > 0, full * per_full, 0.0) + per_last)
    return _out(_finite_expectation(total, tau + delta, m))


def expected_revocations(work_s, *, mtbf_s, checkpoint_s, interval_s=None):
    """Expected number of revocations while finishing ``work_s`` (synchronous training)."""
    work = _array("work_s", work_s)
    m = _array("mtbf_s", mtbf_s)
    delta = _array("checkpoint_s", checkpoint_s, allow_zero=True)
    check_checkpoint_vs_mtbf(delta, m)
    tau = _resolve_interval(interval_s, delta, m)
    full, rest = _segments(work, tau)
    with np.errstate(over="ignore", invalid="ignore"):
        last = np.where(rest > 0, np.expm1((rest + delta) / m), 0.0)
        total = np.where(full > 0, full * np.expm1((tau + delta) / m), 0.0) + last
    return _out(_finite_expectation(total, tau + delta, m))


def expected_time_async(work_s, *, mtbf_s, checkpoint_s, restart_s, interval_s=None):
    """Expected wall time (s), asynchronous / parameter-server training.

    ``mtbf_s``: one value per worker (a sequence) or one for all. A revoked
    worker is away for R and the job runs at the share of workers present;
    each worker is present a long-run fraction Aᵢ = Mᵢ/(Mᵢ + R) of the time
    (alternating renewal process, e.g. Ross, Stochastic Processes, 1996,
    Thm 3.4.4), so T ≈ W / mean(Aᵢ) + ⌈W/τ⌉ δ. Checkpoints (of the parameter
    servers) stall the job for δ each and are not exposed to revocations.
    Exact as W grows; short jobs finish slightly sooner (all workers start up).
    """
    work = float(_array("work_s", work_s))
    m = _array("mtbf_s", np.atleast_1d(mtbf_s))
    delta = float(_array("checkpoint_s", checkpoint_s, allow_zero=True))
    restart = float(_array("restart_s", restart_s, allow_zero=True))
    cluster = 1.0 / np.sum(1.0 / m)
    check_checkpoint_vs_mtbf(delta, cluster)
    tau = float(_resolve_interval(interval_s, np.asarray(delta), np.asarray(cluster)))
    availability = float(np.mean(m / (m + restart)))
    return work / availability + math.ceil(work / tau - 1e-12) * delta
