"""Robust nonlinear least squares of a named closed form, with k-fold CV.

Fits minimise the soft-L1 loss of log(predicted / measured), i.e. relative
error, so a 10 µs kernel and a 10 ms kernel weigh the same; free parameters
are optimised in log space to stay positive (scipy.optimize.least_squares).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from perfmodel.core.lazy import scipy_optimize

from perfmodel.forms.registry import Form


@dataclass(frozen=True)
class Free:
    """A free parameter: initial value and positive bounds."""

    init: float
    lo: float
    hi: float


def fit_form(form: Form, X: Mapping[str, np.ndarray], y: np.ndarray, free: Mapping[str, Free],
             fixed: Mapping[str, float], *, predict=None, weights=None) -> dict[str, float]:
    """Return all parameters (fixed + fitted) of ``form`` fitted to ``(X, y)``.

    ``predict(params, X)`` overrides the form's own evaluation (used when the
    measurement is a sum of forms, e.g. forward + backward). ``weights`` scale
    each point's log residual (default 1).
    """
    names = list(free)
    lo = np.log([free[n].lo for n in names])
    hi = np.log([free[n].hi for n in names])
    x0 = np.clip(np.log([free[n].init for n in names]), lo + 1e-9, hi - 1e-9)
    evaluate = predict or (lambda p, X: form.evaluate(p, **X))
    logy = np.log(y)
    w = np.ones(len(logy)) if weights is None else np.asarray(weights, float)

    def residual(theta):
        params = {**fixed, **dict(zip(names, np.exp(theta)))}
        pred = np.asarray(evaluate(params, X), dtype=float)
        return w * (np.log(np.maximum(pred, 1e-15)) - logy)

    sol = scipy_optimize.least_squares(residual, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.05, max_nfev=4000)
    return {**fixed, **dict(zip(names, map(float, np.exp(sol.x))))}


def mape(pred, meas) -> float:
    """Mean absolute percentage error, as a fraction."""
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    # sklearn.metrics.mean_absolute_percentage_error is the same metric, but its summation order differs
    # in the last bits, which can flip a near-tie between candidate forms and change a bundled profile
    return float(np.mean(np.abs(pred - meas) / meas)) if len(meas) else float("nan")


def kfold(n: int, folds: int, seed: int):
    """(train, test) index pairs of shuffled k-fold cross-validation over ``n`` rows.

    The folds scikit-learn's ``KFold(folds, shuffle=True, random_state=seed)`` makes (a
    RandomState(seed) permutation cut into folds, the first n % folds one row larger),
    without the dependency.
    """
    order = np.arange(n)
    np.random.RandomState(seed).shuffle(order)
    sizes = np.full(folds, n // folds)
    sizes[: n % folds] += 1
    start = 0
    for size in sizes:
        held = np.zeros(n, bool)
        held[order[start:start + size]] = True
        yield np.flatnonzero(~held), np.flatnonzero(held)
        start += size


def cross_validate(form: Form, X, y, free, fixed, *, folds=5, seed=0, predict=None, score_mask=None,
                   weights=None):
    """k-fold CV MAPE of the fitted form (on rows where ``score_mask`` holds)."""
    n = len(y)
    if n < max(folds, len(free) + 1):
        return float("nan")
    evaluate = predict or (lambda p, X: form.evaluate(p, **X))
    preds = np.empty(n)
    for train, test in kfold(n, min(folds, n), seed):
        sub = {k: np.asarray(v)[train] for k, v in X.items()}
        params = fit_form(form, sub, y[train], free, fixed, predict=predict,
                          weights=None if weights is None else np.asarray(weights, float)[train])
        preds[test] = evaluate(params, {k: np.asarray(v)[test] for k, v in X.items()})
    mask = np.ones(n, bool) if score_mask is None else np.asarray(score_mask, bool)
    return mape(preds[mask], y[mask])
