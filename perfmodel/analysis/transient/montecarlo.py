"""Monte Carlo distribution of the time to train on transient servers.

Same failure semantics as the closed forms in :mod:`.checkpoint`, but any
lifetime model (exponential, Weibull, piecewise hazard, hard maximum
lifetime), per-worker models, and the whole distribution rather than its mean.
Vectorised over trials; seeded, so a given call always returns the same array.

``mode="sync"``: any revocation stalls the job, which rolls back to the last
checkpoint and waits ``restart_s``; the revoked worker is replaced by a fresh
server (age 0), the others keep ageing. ``mode="async"``: a revoked worker
is away for ``restart_s`` while the others go on; progress runs at the share
of workers present; checkpoints stall the job for δ each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from perfmodel.core.errors import InvalidInputError
from perfmodel.analysis.transient.checkpoint import _array, _resolve_interval, check_checkpoint_vs_mtbf
from perfmodel.analysis.transient.revocation import Exponential, Lifetime, as_lifetime
from perfmodel.core.checks import check_choice, check_int, check_size

MODES = ("sync", "async")
_CHUNK_ELEMENTS = 2_000_000  # floats held at once by the asynchronous simulation


@dataclass(frozen=True)
class Simulation:
    """Trial outcomes: wall time (s) and revocations per worker, shapes (trials,), (trials, n)."""

    times_s: np.ndarray
    revocations: np.ndarray
    interval_s: float


def worker_models(revocation, workers: int) -> list[Lifetime]:
    """One lifetime model per worker from a model, an MTBF, or a per-worker sequence."""
    if isinstance(revocation, Sequence) and not isinstance(revocation, str):
        if len(revocation) != workers:
            raise InvalidInputError(
                f"'revocation' as a sequence needs one model per worker ({workers}): "
                f"got {len(revocation)}")
        return [as_lifetime(r, f"revocation[{i}]") for i, r in enumerate(revocation)]
    return [as_lifetime(revocation)] * workers


def cluster_mtbf_s(models: Sequence[Lifetime]) -> float:
    """Mean time between revocations of the cluster: 1 / Σ 1/Mᵢ (exact for exponential)."""
    return 1.0 / sum(1.0 / m.mean_lifetime_s for m in models)


def _groups(models):
    """Worker columns sharing one model, so each model samples once per step."""
    groups: dict = {}
    for j, m in enumerate(models):
        groups.setdefault(m, []).append(j)
    return [(m, np.array(cols)) for m, cols in groups.items()]


def _next_revocation(models, ages, rng):
    """Time to the next revocation and the revoked worker, per trial."""
    if all(isinstance(m, Exponential) and math.isinf(m.max_lifetime_s) for m in models):
        rates = np.array([1.0 / m.mtbf_s for m in models])  # min of Exp(λᵢ) is Exp(Σλ)
        f = rng.exponential(1.0 / rates.sum(), size=ages.shape[0])
        who = rng.choice(len(models), size=ages.shape[0], p=rates / rates.sum())
        return f, who
    resid = np.empty_like(ages)
    for model, cols in _groups(models):
        resid[:, cols] = model.sample_residual(ages[:, cols], rng)
    return resid.min(axis=1), resid.argmin(axis=1)


def _segment_plan(work: float, tau: float, delta: float):
    """Number of segments, length of a full one (τ+δ) and of the last one."""
    n_seg = max(1, math.ceil(work / tau - 1e-9))
    return n_seg, tau + delta, work - (n_seg - 1) * tau + delta


def _simulate_sync(work, models, delta, restart, tau, trials, rng):
    n_seg, seg, last = _segment_plan(work, tau, delta)
    n = len(models)
    ages = np.zeros((trials, n))
    done = np.zeros(trials, dtype=np.int64)  # segments checkpointed so far
    times = np.zeros(trials)
    counts = np.zeros((trials, n), dtype=np.int64)
    active = np.arange(trials)
    while active.size:
        f, who = _next_revocation(models, ages[active], rng)
        remaining = (n_seg - 1 - done[active]) * seg + last
        finish = f >= remaining
        times[active[finish]] += remaining[finish]
        idx, f, who = active[~finish], f[~finish], who[~finish]
        k = np.minimum(np.floor(f / seg).astype(np.int64), n_seg - 1 - done[idx])
        done[idx] += k  # segments completed before the revocation survive it
        times[idx] += f + restart
        ages[idx] += (f + restart)[:, None]
        ages[idx, who] = 0.0
        counts[idx, who] += 1
        active = idx
    return times, counts


def _async_chunk(work, models, restart, cycles, c, rng):
    """Finish time (without checkpoint stalls), revocations and coverage for c trials."""
    n = len(models)
    up = np.empty((c, n, cycles))
    for model, cols in _groups(models):
        up[:, cols, :] = model.sample_residual(np.zeros((c, len(cols), cycles)), rng)
    down_at = np.cumsum(up + restart, axis=2) - restart  # start of each absence
    covered = (down_at[:, :, -1] + restart).min(axis=1)  # state known up to here
    times = np.concatenate([down_at, down_at + restart], axis=2).reshape(c, -1)
    steps = np.concatenate([-np.ones_like(down_at), np.ones_like(down_at)], axis=2).reshape(c, -1)
    order = np.argsort(times, axis=1, kind="stable")
    t = np.take_along_axis(times, order, axis=1)
    present = n + np.cumsum(np.take_along_axis(steps, order, axis=1), axis=1)
    present_before = np.concatenate([np.full((c, 1), float(n)), present[:, :-1]], axis=1)
    t_prev = np.concatenate([np.zeros((c, 1)), t[:, :-1]], axis=1)
    progress = np.cumsum((t - t_prev) * present_before / n, axis=1)  # cluster-seconds of work
    crossed = progress >= work
    i = np.where(crossed.any(axis=1), crossed.argmax(axis=1), t.shape[1])
    p_prev = np.where(i > 0, np.take_along_axis(progress, np.maximum(i - 1, 0)[:, None], 1)[:, 0], 0)
    start = np.where(i > 0, np.take_along_axis(t, np.maximum(i - 1, 0)[:, None], 1)[:, 0], 0)
    rate = np.where(i > 0, np.take_along_axis(present, np.maximum(i - 1, 0)[:, None], 1)[:, 0],
                    n) / n
    finish = start + (work - p_prev) / rate
    counts = (down_at < finish[:, None, None]).sum(axis=2)
    return finish, counts, covered


def _simulate_async(work, models, delta, restart, tau, trials, rng):
    n = len(models)
    n_ckpt = math.ceil(work / tau - 1e-9)
    availability = np.mean([m.mean_lifetime_s / (m.mean_lifetime_s + restart) for m in models])
    horizon = 2.0 * work / availability + restart
    shortest = min(m.mean_lifetime_s for m in models)
    cycles = int(horizon / (shortest + restart) * 1.5) + 8
    times = np.empty(trials)
    counts = np.empty((trials, n), dtype=np.int64)
    todo = np.arange(trials)
    while todo.size:
        chunk = max(1, _CHUNK_ELEMENTS // (2 * n * cycles))
        redo = []
        for lo in range(0, todo.size, chunk):
            sel = todo[lo:lo + chunk]
            finish, cnt, covered = _async_chunk(work, models, restart, cycles, sel.size, rng)
            ok = finish <= covered
            times[sel[ok]], counts[sel[ok]] = finish[ok] + n_ckpt * delta, cnt[ok]
            redo.append(sel[~ok])
        todo = np.concatenate(redo)
        cycles *= 2  # too few lifetimes drawn to cover these trials: draw more
    return times, counts


MAX_REVOCATIONS = 1e5  # per simulated run: beyond it a spot plan is meaningless and the loop too long
# over all trials: each revocation is one vectorised step over the trials still running (~0.1 us per
# trial and step), so this keeps a simulation to seconds
MAX_SIMULATED_REVOCATIONS = 5e7


def simulate(work_s, *, revocation, workers, checkpoint_s, restart_s, interval_s=None,
             trials=10000, seed=0, mode="sync") -> Simulation:
    """Run the Monte Carlo; see :func:`simulate_time` for the arguments."""
    work = float(_array("work_s", work_s))
    workers = check_int("workers", workers)
    trials = check_size("trials", trials)
    seed = check_int("seed", seed, minimum=0)
    check_choice("mode", mode, MODES)
    delta = float(_array("checkpoint_s", checkpoint_s, allow_zero=True))
    restart = float(_array("restart_s", restart_s, allow_zero=True))
    models = worker_models(revocation, workers)
    mtbf = cluster_mtbf_s(models)
    check_checkpoint_vs_mtbf(delta, mtbf, f"the cluster of {workers} worker(s)")
    tau = float(_resolve_interval(interval_s, np.asarray(delta), np.asarray(mtbf)))
    longest = min(m.max_lifetime_s for m in models)
    if mode == "sync" and min(tau, work) + delta >= longest:  # no server lives through one segment
        raise InvalidInputError(
            f"a checkpoint segment (interval {min(tau, work):.3g} s + checkpoint {delta:.3g} s) outlasts the "
            f"servers' max_lifetime_s = {longest:.3g} s, so none can finish: use an interval below "
            f"{max(longest - delta, 0.0):.3g} s or a faster checkpoint")
    busy = work + math.ceil(work / tau) * delta  # the run's length without revocations, checkpoints included
    if busy / mtbf > MAX_REVOCATIONS:  # each revocation is one step of the simulation
        raise InvalidInputError(
            f"the run would meet about {busy / mtbf:.3g} revocations ({busy:.3g} s of work and checkpoints, "
            f"{mtbf:.3g} s between revocations); the simulation stops at {MAX_REVOCATIONS:.0e}: "
            f"fewer steps, or a checkpoint interval longer than {tau:.3g} s")
    if trials * busy / mtbf > MAX_SIMULATED_REVOCATIONS:
        raise InvalidInputError(
            f"{trials:,} trials × about {busy / mtbf:.3g} revocations per run is above the "
            f"{MAX_SIMULATED_REVOCATIONS:.0e} revocations one simulation draws: use at most "
            f"{max(1, int(MAX_SIMULATED_REVOCATIONS * mtbf / busy)):,} trials, or fewer steps")
    rng = np.random.default_rng(seed)
    run = _simulate_sync if mode == "sync" else _simulate_async
    times, counts = run(work, models, delta, restart, tau, trials, rng)
    return Simulation(times, counts, tau)


def simulate_time(work_s, *, revocation, workers, checkpoint_s, restart_s, interval_s=None,
                  trials=10000, seed=0, mode="sync") -> np.ndarray:
    """Wall time (s) of each of ``trials`` simulated runs finishing ``work_s`` of work.

    ``revocation``: a lifetime model (:class:`~.revocation.Exponential`,
    :class:`~.revocation.Weibull`, :class:`~.revocation.PiecewiseHazard`), an
    MTBF in seconds (exponential), or one of those per worker. ``restart_s``:
    downtime per revocation (replacement wait + restart + restore).
    ``interval_s``: work between checkpoints; default Daly's interval for the
    cluster's mean time between revocations. ``mode``: ``"sync"`` or ``"async"``.
    """
    return simulate(work_s, revocation=revocation, workers=workers, checkpoint_s=checkpoint_s,
                    restart_s=restart_s, interval_s=interval_s, trials=trials, seed=seed,
                    mode=mode).times_s
