"""The widths a step outside every calibrated regime draws on: pooled over regimes, and past a regime's rows.

A step no calibrated regime holds is a draw from a regime the validation rows never saw; its interval
comes from the calibrated regimes of its profile origin taken as exchangeable units
(:func:`pooled_half_width`). A regime of too few rows for a level extends its rows by a stated
Laplace shape (:func:`laplace_width`). Only math and numpy: ``perfmodel.interval`` applies them.
"""

from __future__ import annotations

import math

import numpy as np


def laplace_width(scores, level: float) -> float:
    """Past the level n/(n+1) that n sorted ``scores`` support: a Laplace |x| quantile b·ln(1/(1 - level))
    through the largest score (the split-conformal width at n/(n+1)), b = largest / ln(n + 1); the shape
    of the memory prior (``perfmodel.interval.MEMORY_PRIOR_90``). A CPU host's regime of three rows uses it above 75%."""
    n = len(scores)
    return float(scores[-1]) * math.log(1.0 / (1.0 - level)) / math.log(n + 1.0) if n else math.nan


def origin_of(kind: str, reason) -> str:
    """The pool an uncalibrated step's interval is drawn from: its profile's origin ("measured", "datasheet",
    "host"); another GPU's profile stands in as a datasheet one would (scaled figures it does not even have)."""
    if kind == "host":
        return "host"
    return "datasheet" if kind == "datasheet" or str(reason).startswith("profile of") else "measured"


def pooled_half_width(pool: dict, level: float) -> float:
    """The regime as the unit: the pooled-CDF quantile of Dunn, Wasserman & Ramdas 2023 (JASA 118:2491) with a
    split-conformal correction over regimes. Each of the pool's K calibrated regimes weighs 1 (its rows 1/n each), the unseen regime 1 at +inf, so the
    width is the smallest score whose weight reaches level·(K + 1); past K/(K + 1), the largest score (all
    that K regimes can say; ``perfmodel.validate.intervals.unseen_regimes`` measures what it covers)."""
    cum = np.cumsum(pool["weights"])
    i = int(np.searchsorted(cum, level * (pool["regimes"] + 1) - 1e-9))
    return float(pool["scores"][min(i, len(pool["scores"]) - 1)])
