"""How much wider than its regime's width a step's interval is: the difficulty of a row inside its regime.

Under the locally weighted (``normalised``) score of ``perfmodel/validate/conformal.py`` a regime's scores are
|r - c| / σ(x), σ(x) a log-linear fit on features known before measuring (``DIFFICULTY``). A step's half-width is
its regime's times σ(x) over the regime's typical row's. Only math and numpy: ``perfmodel.interval`` applies it.
"""

from __future__ import annotations

import math

import numpy as np


# what predicts a row's difficulty inside its regime before measuring (the ``normalised`` scores,
# validate/conformal.py; the regime's own scale carries its profile kind, framework and step class):
# the exposed communication share, the GPU count (log10: collectives beyond the measured sizes) and a
# power-capped part (its clock from a formula, profiles/power_cap.py)
DIFFICULTY = ("comm_share", "log10_gpus", "power_capped")


def difficulty_features(share, n_gpus: int, power_capped: bool) -> np.ndarray:
    """The ``DIFFICULTY`` features of each step's communication ``share`` (on a last axis)."""
    share = np.asarray(share, dtype=float)
    cols = [np.clip(share, 0.0, 1.0), np.full(share.shape, math.log10(max(int(n_gpus), 1))),
            np.full(share.shape, float(bool(power_capped)))]
    return np.stack(cols, axis=-1)


def row_factor(table: dict, names, features) -> np.ndarray:
    """σ(x) / σ of the regime's typical row, per step: how much wider than its regime's width a step's
    interval is under a ``normalised`` table (1 for other scores, uncalibrated steps and regimes without rows)."""
    names = np.asarray(names, dtype=object)
    out = np.ones(names.shape)
    beta = table.get("difficulty", {}).get("coef")
    if beta is None:
        return out
    x = np.asarray(features, dtype=float).reshape(names.shape + (len(beta) - 1,))
    lnsig = beta[0] + x @ np.asarray(beta[1:], dtype=float)
    for name in set(names.ravel().tolist()):
        entry = table["regimes"].get(name)
        if entry is not None and "regime_scale" in entry:  # scored with the difficulty (not a CPU host's)
            mask = names == name
            out[mask] = entry.get("regime_scale", 1.0) * np.exp(lnsig[mask]) / entry["scale"]
    return out


def one_factor(table: dict, name: str, share: float, n_gpus: int, capped: bool) -> float:
    """:func:`row_factor` of one step of a calibrated regime, on floats (predict's path)."""
    b0, b_share, b_gpus, b_capped = table["difficulty"]["coef"]  # the order of DIFFICULTY
    entry = table["regimes"][name]
    ln_sigma = (b0 + b_share * min(max(share, 0.0), 1.0) + b_gpus * math.log10(max(int(n_gpus), 1))
                + (b_capped if capped else 0.0))
    return entry.get("regime_scale", 1.0) * math.exp(ln_sigma) / entry["scale"]
