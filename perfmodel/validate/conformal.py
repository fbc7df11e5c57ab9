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

Each row is scored against the centre and scale of the other configurations of its regime
(leave one configuration out, as a new configuration would be; Barber et al. 2021, Ann.
Statist. 49:486, jackknife+): without that the in-sample median sits closer to its own rows
and the interval under-covers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

METHODS = ("split", "weighted", "hybrid")
SHRINK = 3.0   # pseudo-rows of the pooled scale in a regime's scale (a regime of 3 rows is half its own)
FLOOR = 0.01   # smallest scale (log): no regime claims better than 1% spread from a few agreeing rows


@dataclass(frozen=True)
class Item:
    """One validation row as calibration sees it: its regime, configuration, log-ratio and source."""

    regime: str
    group: str
    log_ratio: float
    source: str


def calibrate(items: list[Item], method: str = "weighted") -> dict:
    """Per regime: rows, configurations, sources, centre, scale and the sorted scores it draws on."""
    if method not in METHODS:
        raise ValueError(f"'method' must be one of {', '.join(METHODS)}: got {method!r}")
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
    own = float(np.median(np.abs(deviations))) if n else 0.0
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


def percent(centre: float, log_width: float):
    """(high - low) / 2 over the predicted value, in percent (None when the width is undefined)."""
    return None if math.isnan(log_width) else round(100 * math.exp(centre) * math.sinh(log_width), 2)
