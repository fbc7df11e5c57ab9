"""Fit an interference table to co-located kernel-class runs (``calibration.interference kernels``).

Each measured row is one process of class ``job`` running beside the others of its ``mix``; its
slowdown is its median iteration time together over alone, each run with the host's other runnable
threads measured (``other_alone``, ``other_together``). The prediction of a row is the sharing model
itself (``perfmodel.analysis.contention.solve_sharing``) on one-class jobs, so the fitted table means
exactly what predictions use: 9 class-pair coefficients (with ``others=True`` 3 more, for other
users' work beside each class, ``a|other``: priced on either side with the other sessions each side
counted, ``row_foreign``) and the time-slice loss, by bounded least
squares on log slowdowns (scipy ``least_squares``, soft-L1 loss against outliers of a busy host).
CV error: leave one repeat out, refit, predict the held-out repeat; median |relative error|.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from perfmodel.core.lazy import scipy_optimize

from perfmodel.analysis.contention import solve_sharing
from perfmodel.analysis.interference import CLASSES, OTHER, InterferenceTable
from perfmodel.core.errors import InvalidInputError
from perfmodel.hardware.common import FrozenMap
from perfmodel.core.checks import check_choice

PAIRS = tuple(f"{a}|{b}" for a in CLASSES for b in CLASSES)
KEYS = PAIRS + tuple(f"{a}|{OTHER}" for a in CLASSES)  # the coefficients fitted with others=True
REQUIRED = ("mix", "job", "repeat", "slowdown", "other_alone", "other_together")
METRICS = ("wall", "cpu")
COLUMN = {"wall": "slowdown", "cpu": "cpu_slowdown"}  # the measured slowdown each metric is fitted to
MAX_COEFFICIENT = 5.0
MAX_SWITCH = 0.5


@dataclass(frozen=True)
class InterferenceFit:
    """The fitted table, each row's prediction and the leave-one-repeat-out error."""

    table: InterferenceTable
    rows: pd.DataFrame       # the measured rows with 'predicted' and 'error' (relative)
    cv_error: float

    def __repr__(self) -> str:
        return f"InterferenceFit({self.table!r}, {len(self.rows)} rows, CV median |error| {self.cv_error:.1%})"


def _table(x: np.ndarray, name: str = "fit") -> InterferenceTable:
    # x: the coefficients in KEYS order (its first len(x) - 1), then the switch loss
    return InterferenceTable(name, FrozenMap(dict(zip(KEYS, map(float, x[:-1])))), float(x[-1]))


def row_seconds(kind: str) -> list[float]:
    """Device seconds by class of a one-class microbenchmark (one unit of its class)."""
    if kind not in CLASSES:
        raise InvalidInputError(f"kernel class {kind!r} unknown (valid: {', '.join(CLASSES)})")
    return [1.0 if c == kind else 0.0 for c in CLASSES]


def host_slots(cores: int, other_sessions: float, jobs: int = 1, balance: float = 0.0) -> float:
    """Cores' worth ``jobs`` one-thread processes of one session get on a Linux host where
    ``other_sessions`` sessions also run, under autogroup scheduling (sched(7), "The autogroup
    feature"): a session's weight is split over its runnable tasks (CFS group shares). A core holding
    m of the session's tasks gives each (1/jobs) / (m/jobs + o) = 1 / (m + jobs * o) of itself, o the
    other sessions' weight on that core. ``balance`` = 0: the others spread evenly over the cores,
    o = other_sessions / cores; 1: the load balancer evens the cores' whole weighted load
    (``load_balance`` in kernel/sched/fair.c moves tasks until the cores' loads match), so the cores
    our tasks hold carry fewer others, o = max(0, L - m / jobs) with the level L that places all of
    them (water-filling; L = (1 + other_sessions) / cores when every core gets some); between: that
    fraction of the way (``fit_balance`` measures it from the runs' CPU shares)."""
    cores, jobs = int(cores), int(jobs)
    sessions, balance = max(float(other_sessions), 0.0), min(max(float(balance), 0.0), 1.0)
    base, extra = divmod(jobs, cores)
    per_core = [base + 1] * extra + [base] * (cores - extra)
    level = _water_level([m / jobs for m in per_core], sessions)
    total = 0.0
    for m in (m for m in per_core if m > 0):
        others = (1.0 - balance) * sessions / cores + balance * max(0.0, level - m / jobs)
        total += m / (m + jobs * others)
    return float(total)


def _water_level(loads: list[float], amount: float) -> float:
    """The level L with sum(max(0, L - load)) = amount: ``amount`` poured over cores of ``loads``."""
    filled = sorted(loads)
    for n in range(len(filled), 0, -1):
        level = (amount + sum(filled[:n])) / n
        if level >= filled[n - 1]:
            return level
    return filled[0]


def fit_balance(rows, cores: float) -> tuple[float, float]:
    """(balance, median |log error|) of ``host_slots`` against the CPU share each side of each row
    measured (CPU seconds / wall seconds per iteration, alone and together): bounded least squares
    with a soft-L1 loss, as a shared host's other users make some phases wild. Rows without
    sessions or positive times are left out; none left gives (0, NaN): the even spread."""
    need = ("sessions_alone", "sessions_together", "cpu_alone_s", "wall_alone_s", "cpu_together_s", "wall_together_s")
    if not all(c in rows.columns for c in need):
        return 0.0, float("nan")
    values = rows[list(need)].to_numpy(float)
    rows = rows[np.isfinite(values).all(axis=1) & (values[:, 2:] > 0).all(axis=1)]  # times > 0, sessions >= 0
    if rows.empty:
        return 0.0, float("nan")
    jobs = rows["mix"].astype(str).str.count(r"\+").to_numpy() + 1
    share = np.log(np.r_[rows["cpu_alone_s"] / rows["wall_alone_s"], rows["cpu_together_s"] / rows["wall_together_s"]])

    def residual(x):
        alone = [host_slots(cores, s, 1, x[0]) for s in rows["sessions_alone"]]
        together = [host_slots(cores, s, k, x[0]) / k for s, k in zip(rows["sessions_together"], jobs)]
        return np.log(np.r_[alone, together]) - share

    x = scipy_optimize.least_squares(residual, [0.5], bounds=([0.0], [1.0]), loss="soft_l1", f_scale=0.05).x
    return float(x[0]), float(np.median(np.abs(residual(x))))


def row_sides(r, cores: float, metric: str = "wall", balance: float = 0.0) -> tuple[float, float, float, float]:
    """(slots alone, slots together, background alone, background together) of a measured row.

    Wall time, where the row recorded other sessions: each side gets its session's share of the
    cores (``host_slots`` with that ``balance``). CPU time, or rows without sessions: all cores, the other runnable
    threads as background (they take the cores our jobs would otherwise run beside each other on).
    """
    if metric == "wall" and hasattr(r, "sessions_alone") and np.isfinite(r.sessions_alone):
        jobs = len(str(r.mix).split("+"))
        return (host_slots(cores, r.sessions_alone, 1, balance), host_slots(cores, r.sessions_together, jobs, balance),
                0.0, 0.0)
    return float(cores), float(cores), float(r.other_alone), float(r.other_together)


def row_foreign(r) -> tuple[float, float]:
    """(alone, together): other users' runnable work beside a measured row's jobs, the other
    sessions with runnable work each side counted (the runnable threads where none were counted)."""
    if hasattr(r, "sessions_alone") and np.isfinite(r.sessions_alone) and np.isfinite(r.sessions_together):
        return float(r.sessions_alone), float(r.sessions_together)
    return float(r.other_alone), float(r.other_together)


def predicted_slowdown(table, mix_seconds, slot: int, sides, free=None, metric: str = "wall",
                       cores: float | None = None, foreign=(0.0, 0.0)) -> float:
    """Slowdown of job ``slot`` of a mix; ``sides`` = ``row_sides(...)`` (each side's slots and
    background); ``metric`` "wall" (step time) or "cpu" (the seconds it executes: interference
    without the waits for a core). ``cores``: the host's cores, where a side's slots are a
    session's share of them (the jobs then still run beside each other, on their own cores, that
    share of the time); None: as many as the slots. ``foreign``: other users' work beside the jobs
    (alone, together; ``row_foreign``), slowing them by the table's ``a|other``."""
    check_choice("metric", metric, METRICS)
    slots_a, slots_t, bg_a, bg_t = sides
    free = [0.0] * len(mix_seconds) if free is None else list(free)
    switch = table.switch_fraction
    together = solve_sharing(mix_seconds, free, table, slots_t, switch, bg_t, executed=True, units=cores,
                             foreign=foreign[1])
    alone = solve_sharing([mix_seconds[slot]], [free[slot]], table, slots_a, switch, bg_a, executed=True,
                          units=cores, foreign=foreign[0])
    k = 0 if metric == "wall" else 1
    return float(together[k][slot] / alone[k][0])


def _predict(table, rows: pd.DataFrame, slots: float, metric: str, balance: float = 0.0) -> np.ndarray:
    out = []
    for r in rows.itertuples():
        mix = [row_seconds(k) for k in r.mix.split("+")]
        out.append(predicted_slowdown(table, mix, int(r.slot), row_sides(r, slots, metric, balance),
                                      metric=metric, cores=slots, foreign=row_foreign(r)))
    return np.asarray(out)


def _fit_params(rows: pd.DataFrame, slots: float, metric: str, balance: float = 0.0, keys=PAIRS) -> np.ndarray:
    measured = np.log(rows[COLUMN[metric]].to_numpy(float))

    def residual(x):
        return np.log(_predict(_table(x), rows, slots, metric, balance)) - measured

    x0 = np.r_[np.full(len(keys), 0.1), 0.02]
    upper = np.r_[np.full(len(keys), MAX_COEFFICIENT), MAX_SWITCH]
    return scipy_optimize.least_squares(residual, x0, bounds=(np.zeros_like(x0), upper), loss="soft_l1", f_scale=0.05,
                         ftol=1e-6, xtol=1e-6, gtol=1e-6).x


def repeat_out(rows: pd.DataFrame, fit_params, predict, cv: bool = True):
    """(held-out predictions, repeats): each repeat of ``rows`` predicted by ``predict(params, its rows)``
    with ``params = fit_params(the other repeats' rows)``; all NaN with one repeat or ``cv`` False."""
    held = np.full(len(rows), np.nan)
    repeats = sorted(rows["repeat"].unique())
    for rep in repeats if len(repeats) > 1 and cv else []:
        test = (rows["repeat"] == rep).to_numpy()
        held[test] = predict(fit_params(rows[~test]), rows[test])
    return held, repeats


def held_error(held: np.ndarray, measured: np.ndarray, where=None) -> float:
    """Median |held / measured − 1| over the rows ``where`` selects (all by default); NaN when none was held out."""
    rel = np.abs(held / measured - 1.0)[slice(None) if where is None else where]
    return float(np.nanmedian(rel)) if np.isfinite(rel).any() else float("nan")


def read_rows(path) -> pd.DataFrame:
    """The measured rows of ``path`` (CSV), checked."""
    rows = pd.read_csv(path)
    missing = [c for c in REQUIRED if c not in rows.columns]
    if missing:
        raise InvalidInputError(f"{Path(path).name}: missing columns {missing} (needs {', '.join(REQUIRED)})")
    if "slot" not in rows.columns:
        rows["slot"] = rows.groupby(["mix", "repeat"]).cumcount()
    bad = ~(rows["slowdown"] > 0)
    if bad.any():
        raise InvalidInputError(f"{Path(path).name}: 'slowdown' must be > 0 (rows {list(rows.index[bad])})")
    return rows


def fit_interference(rows, *, slots: int = 2, name: str = "cpu", source: str = "", cv: bool = True,
                     metric: str = "wall", others: bool = False) -> InterferenceFit:
    """Fit the table to kernel-class rows (a DataFrame or CSV path) measured on ``slots`` cores
    (``cv=False``: no leave-one-repeat-out refits; the CV error is then NaN). ``metric``: fit the
    wall-clock slowdowns ("wall") or the CPU-time ones ("cpu", the switch loss then unused).
    ``others``: also fit ``a|other`` (other users' work beside each class; docs/contention.md says
    why it is off by default: the measured sets do not tell it apart from zero)."""
    check_choice("metric", metric, METRICS)
    rows = read_rows(rows) if not isinstance(rows, pd.DataFrame) else rows.copy()
    if COLUMN[metric] not in rows.columns:
        raise InvalidInputError(f"metric {metric!r} needs a {COLUMN[metric]!r} column")
    keys = KEYS if others else PAIRS
    if len(rows) < len(keys) + 1:
        raise InvalidInputError(f"{len(rows)} rows cannot fit {len(keys) + 1} parameters")
    balance, share_error = fit_balance(rows, float(slots))
    x = _fit_params(rows, float(slots), metric, balance, keys)
    measured = rows[COLUMN[metric]].to_numpy(float)
    held, repeats = repeat_out(rows, lambda part: _fit_params(part, float(slots), metric, balance, keys),
                               lambda xr, part: _predict(_table(xr), part, float(slots), metric, balance), cv)
    pred = _predict(_table(x), rows, float(slots), metric, balance)
    rows["predicted"] = pred
    rows["error"] = pred / measured - 1.0
    cv_error = held_error(held, measured)
    table = InterferenceTable(name, FrozenMap(dict(zip(KEYS, map(float, x[:-1])))), float(x[-1]),
                              cv_error, len(rows), source or "fitted to co-located kernel-class runs",
                              FrozenMap({"slots": slots, "repeats": len(repeats), "metric": metric, "balance": balance,
                                         "balance_share_error": share_error if np.isfinite(share_error) else None,
                                         "method": "least squares on log slowdowns, leave-one-repeat-out CV"}))
    return InterferenceFit(table, rows, cv_error)
