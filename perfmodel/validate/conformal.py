"""Conformal calibration of log-ratios by regime: the centre, scale and scores a regime ships.

    regimes = calibrate(items, method="weighted")   # items: Item(regime, group, log_ratio, source)

Two scores (docs/accuracy.md), chosen between by held-back coverage and width
(``perfmodel.validate.intervals``):

* ``split``: plain split conformal per regime (Mondrian; Vovk et al. 2005): score |r - c|,
  each regime its own quantile. A regime of n rows supports a level only when
  ⌈(n+1)·level⌉ ≤ n, so with ten rows the 90% width is its largest score.
* ``weighted``: locally weighted split conformal (Lei et al. 2018, JASA 113:1094, §5.2):
  score |r - c| / σ, σ the regime's difficulty (its median |r - c|, shrunk towards the pooled
  one with ``SHRINK`` pseudo-rows, at least ``FLOOR``), all regimes' scores pooled into one
  quantile q; a regime's half-width is q·σ. Pooling lets every regime use the quantile of
  all rows; σ keeps hard regimes wide and easy ones narrow. Its coverage holds over all
  regimes together, not in each one (a heavy-tailed regime under-covers).
* ``hybrid``: Mondrian where the data supports it: a regime with enough rows for the level
  uses its own split-conformal quantile (``own_scores``), a smaller one the weighted q·σ.
* ``normalised``: locally weighted with a per-row difficulty σ(x) = σ_regime·exp(β·x), σ_regime
  as for ``weighted`` (it carries the profile kind, framework and step class of the regime) and
  exp(β·x) what varies inside a regime, known before measuring (``Item.features``: communication
  share, GPU count, power-capped part; :data:`perfmodel.interval.DIFFICULTY`),
  β a ridge fit of ln((|r - c| + ``FLOOR``) / σ_regime) on x (:func:`fit_difficulty`); scores |r - c| / σ(x)
  pooled. A regime of fewer than ``MIN_ROWS`` rows has its centre shrunk towards that of its
  nearest parent regime with enough (:func:`lineage`, :func:`shrunk_centre`). ``normalised-mondrian``: the same scores, each regime with
  enough rows for the level its own quantile (``own_scores``), the others the pooled one.

Each row is scored against the centre and scale of the other configurations of its regime
(leave one configuration out, as a new configuration would be; Barber et al. 2021, Ann.
Statist. 49:486, jackknife+): without that the in-sample median sits closer to its own rows
and the interval under-covers.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np

METHODS = ("split", "weighted", "hybrid", "normalised", "normalised-mondrian")
NORMALISED = ("normalised", "normalised-mondrian")
SHRINK = 3.0   # pseudo-rows of the pooled scale in a regime's scale (a regime of 3 rows is half its own)
FLOOR = 0.01   # smallest scale (log): no regime claims better than 1% spread from a few agreeing rows
MIN_ROWS = 8   # a regime with fewer rows has its centre shrunk to its parent's (a median of 3 rows moves with each)
RIDGE = 2.0    # ridge penalty of the difficulty fit, in rows: a coefficient few rows support shrinks to 0


@dataclass(frozen=True)
class Item:
    """One validation row as calibration sees it: its regime, configuration, log-ratio and source."""

    regime: str
    group: str
    log_ratio: float
    source: str
    features: tuple = ()  # the difficulty features (``normalised``), known before measuring


def calibrate(items: list[Item], method: str = "weighted") -> dict:
    """Per regime: rows, configurations, sources, centre, scale and the sorted scores it draws on."""
    if method not in METHODS:
        raise ValueError(f"'method' must be one of {', '.join(METHODS)}: got {method!r}")
    if method in NORMALISED:
        return _normalised(items, mondrian=method == "normalised-mondrian")
    by = {}
    for it in items:
        by.setdefault(it.regime, []).append(it)
    pooled = _pooled_scale([it.log_ratio for it in items], by) if method != "split" else None
    out, scores = {}, {}
    for name in sorted(by):
        mine = by[name]
        r = np.array([it.log_ratio for it in mine])
        g = np.array([it.group for it in mine])
        centre = float(np.median(r))
        scale = _scale(r - centre, pooled) if pooled is not None else 1.0
        scores[name] = _loo_scores(r, g, pooled)
        out[name] = {"n": len(mine), "configurations": len(set(g.tolist())),
                     "sources": sorted({it.source for it in mine}), "centre": round(centre, 5),
                     "scale": round(scale, 5)}
    everything = sorted(round(s, 5) for v in scores.values() for s in v)
    for name, entry in out.items():
        entry["scores"] = everything if method != "split" else sorted(round(s, 5) for s in scores[name])
        if method == "hybrid":  # its own |r - c|: the scores scaled back by each row's scale
            g = np.array([it.group for it in by[name]])
            r = np.array([it.log_ratio for it in by[name]])
            entry["own_scores"] = sorted(round(s, 5) for s in _loo_scores(r, g, None))
    return out


def _pooled_scale(log_ratios: list[float], by: dict) -> float:
    """The median |r - its regime's median| over every row: the scale a regime without rows would have."""
    dev = [abs(it.log_ratio - float(np.median([o.log_ratio for o in mine]))) for mine in by.values() for it in mine]
    return float(np.median(dev)) if dev else FLOOR


def _scale(deviations: np.ndarray, pooled: float) -> float:
    """A regime's scale: its median |deviation| shrunk towards ``pooled`` by ``SHRINK`` pseudo-rows."""
    n = len(deviations)
    own = statistics.median(np.abs(deviations).tolist()) if n else 0.0
    return max(FLOOR, (n * own + SHRINK * pooled) / (n + SHRINK))


def _loo_scores(r: np.ndarray, g: np.ndarray, pooled: float | None) -> list[float]:
    """Each row's score against the centre (and scale) of the other configurations of its regime."""
    out = np.empty(len(r))
    for group in set(g.tolist()):
        mine, others = g == group, r[g != group]
        centre = float(np.median(others)) if len(others) else 0.0
        scale = 1.0 if pooled is None else _scale(others - centre, pooled)
        out[mine] = np.abs(r[mine] - centre) / scale
    return out.tolist()


def fit_difficulty(x: np.ndarray, deviations: np.ndarray, offset=0.0) -> np.ndarray:
    """β of ln σ = offset + β·[1, x]: ridge least squares of ln(|deviation| + FLOOR) - offset on the features
    (intercept unpenalised; Lei et al. 2018 §5.2 fit the spread by regression, here a log-linear one;
    ``offset``: the log of each row's regime scale, so β says what varies inside a regime)."""
    a = np.column_stack([np.ones(len(x)), x])
    return _ridge(a, np.log(np.abs(deviations) + FLOOR) - offset)


def _ridge(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """argmin |a·β - y|² + RIDGE·|β[1:]|² (column 0 the unpenalised intercept)."""
    penalty = RIDGE * np.eye(a.shape[1])
    penalty[0, 0] = 0.0
    return np.linalg.solve(a.T @ a + penalty, a.T @ y)


def log_scale(beta, x) -> np.ndarray:
    """ln σ(x) of feature rows ``x`` under coefficients ``beta`` (:func:`fit_difficulty`)."""
    beta = np.asarray(beta, dtype=float)
    return beta[0] + np.atleast_2d(np.asarray(x, dtype=float)) @ beta[1:]


def lineage(name: str) -> list[str]:
    """A regime and its parents, nearest first: without ``/short-step``, then without the communication
    class (``kind/framework``: a framework's bias is its kernels', whatever its share), then the kind."""
    parts = name.split("/")
    out = [name]
    if parts[-1] == "short-step":
        parts = parts[:-1]
        out.append("/".join(parts))
    if len(parts) == 3:
        out.append(f"{parts[0]}/{parts[2]}")
    if len(parts) > 1:
        out.append(parts[0])
    return out


def centre_pools(names: list[str]) -> dict:
    """Each regime's parent pool: the nearest of its :func:`lineage` beyond itself holding ``MIN_ROWS`` rows or
    more (the kind at worst), the centre it is shrunk towards."""
    chains = [lineage(n) for n in names]
    out = {}
    for name in set(names):
        mine = lineage(name)[1:] or [name]
        out[name] = next((p for p in mine if sum(p in c for c in chains) >= MIN_ROWS), mine[-1])
    return out


def shrunk_centre(own: np.ndarray, parent: np.ndarray) -> float:
    """A regime's centre: its median, shrunk towards its parent pool's by ``SHRINK`` pseudo-rows (a few rows'
    median moves with each row; a regime of ``MIN_ROWS`` or more keeps its own)."""
    n = len(own)
    mid = statistics.median(parent.tolist()) if len(parent) else 0.0
    if n >= MIN_ROWS or not n:
        return statistics.median(own.tolist()) if n else mid
    return (n * statistics.median(own.tolist()) + SHRINK * mid) / (n + SHRINK)


def _normalised(items: list[Item], mondrian: bool) -> dict:
    """``normalised`` and ``normalised-mondrian`` (module docstring): centres by pool, scores |r - c| / σ(x),
    each row against the other configurations (its centre and regime scale from them, β fitted without them)."""
    names = [it.regime for it in items]
    pools = centre_pools(names)
    r = np.array([it.log_ratio for it in items])
    g = np.array([it.group for it in items])
    x = np.array([it.features for it in items], dtype=float).reshape(len(items), -1)
    chains = [lineage(n) for n in names]
    in_pool = {p: np.array([p in c for c in chains]) for p in set(pools.values())}
    regime = {name: np.array([n == name for n in names]) for name in set(names)}
    dev = np.empty(len(items))
    for i, it in enumerate(items):  # against the other configurations of its regime and pool
        others = g != it.group
        dev[i] = r[i] - shrunk_centre(r[regime[it.regime] & others], r[in_pool[pools[it.regime]] & others])
    pooled = statistics.median(np.abs(dev).tolist())
    base = np.empty(len(items))  # each row's regime scale (its median |r - c| shrunk to the pooled one)
    for mine in regime.values():
        base[mine] = _scale(dev[mine], pooled)
    a = np.column_stack([np.ones(len(x)), x])
    y = np.log(np.abs(dev) + FLOOR) - np.log(base)
    scores = np.empty(len(items))
    for group in set(g.tolist()):  # β without the group: the normal equations less its rows
        mine = g == group
        name = names[int(np.flatnonzero(mine)[0])]  # one configuration, one regime
        own = _scale(dev[regime[name] & ~mine], pooled)
        beta = _ridge(a[~mine], y[~mine])
        scores[mine] = np.abs(dev[mine]) / (own * np.exp(a[mine] @ beta))
    beta = _ridge(a, y)
    own_scale = base * np.exp(a @ beta)
    everything = sorted(round(float(s), 5) for s in scores)
    out = {}
    for name in sorted(set(names)):
        mine = regime[name]
        scale = float(np.exp(np.median(np.log(own_scale[mine]))))  # the regime's typical row
        entry = {"n": int(mine.sum()), "configurations": len(set(g[mine].tolist())),
                 "sources": sorted({it.source for it, m in zip(items, mine) if m}),
                 "centre": round(shrunk_centre(r[mine], r[in_pool[pools[name]]]), 5), "shrunk_towards": pools[name],
                 "scale": round(scale, 5), "regime_scale": round(float(base[mine][0]), 5), "scores": everything,
                 "difficulty": [round(float(b), 5) for b in beta]}
        if mondrian:  # in units of the regime's typical width, so scale x quantile is that width
            entry["own_scores"] = sorted(round(float(s * scale), 5) for s in scores[mine])
        out[name] = entry
    return out


def percent(centre: float, log_width: float):
    """(high - low) / 2 over the predicted value, in percent (None when the width is undefined)."""
    return None if math.isnan(log_width) else round(100 * math.exp(centre) * math.sinh(log_width), 2)


def regime_pools(items: list[Item]) -> dict:
    """Per profile origin (a regime name's first part) with two calibrated regimes or more: what a regime
    the rows never saw looks like to the others. Each row scored |r - c|, c the median of the origin's rows
    outside its regime (a new regime's bias is unknown: it is centred as the others are), each regime one unit
    (its rows weigh 1/n each); the centre a new regime takes is the median of all the origin's rows
    (``perfmodel.interval_pools.pooled_half_width`` takes its quantile)."""
    out = {}
    for origin in sorted({it.regime.split("/")[0] for it in items}):
        mine = [it for it in items if it.regime.split("/")[0] == origin]
        names = sorted({it.regime for it in mine})
        if len(names) < 2:
            continue
        scored = []
        for name in names:
            own = [it.log_ratio for it in mine if it.regime == name]
            centre = statistics.median([it.log_ratio for it in mine if it.regime != name])
            scored += [(round(abs(r - centre), 5), 1.0 / len(own)) for r in own]
        scored.sort()
        out[origin] = {"regimes": len(names), "rows": len(mine),
                       "centre": round(statistics.median([it.log_ratio for it in mine]), 5),
                       "scores": [s for s, _ in scored], "weights": [round(w, 6) for _, w in scored]}
    return out
