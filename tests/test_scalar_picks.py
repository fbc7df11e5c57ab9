"""The single-prediction shortcuts of ``core/algebra`` (``pick`` for np.where, ``floats`` for
np.asarray(x, float)) give the numbers their numpy calls give, and a prediction made with them
equals one made with the numpy calls in their place, to rtol 1e-12, over seeded random
configurations (those of tests/test_fast_predict.py)."""

from __future__ import annotations

import random
import sys

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.core import algebra
from perfmodel.core.memo import clear_memos
from test_fast_predict import FIELDS, _groups

RTOL = 1e-12
VALUES = (0.0, -0.0, 1.0, 2.5e9, -3.0, np.inf, np.nan, 7, True, False)


def _draw(rng):
    """One operand as a prediction meets it: a float, a float64, an int, a truth value, a 0-d array,
    a float32, or a small array."""
    v = rng.choice(VALUES)
    kind = rng.randrange(7)
    if kind == 1:
        return np.float64(v)
    if kind == 2:
        return np.asarray(v, float)
    if kind == 3:
        return np.asarray(v)
    if kind == 4:
        return np.float32(v)
    if kind == 5:
        return np.full(rng.choice([1, 3]), float(v))
    return v


def test_pick_and_floats_give_numpys_numbers_and_dtypes():
    rng = random.Random(22)
    for _ in range(3000):
        cond = rng.choice([True, False, np.bool_(True), np.asarray(False), np.array([True, False, True])])
        a, b = _draw(rng), _draw(rng)
        fast, ref = algebra.pick(cond, a, b), np.where(cond, a, b)
        assert np.asarray(fast).dtype == ref.dtype and np.shape(fast) == ref.shape
        np.testing.assert_array_equal(fast, ref)
        assert algebra.where(cond, a, b).dtype == ref.dtype
        x = _draw(rng)
        fast, ref = algebra.floats(x), np.asarray(x, float)
        assert np.asarray(fast).dtype == ref.dtype and np.shape(fast) == ref.shape
        np.testing.assert_array_equal(fast, ref)


FAST = {"pick": algebra.pick, "floats": algebra.floats}
REFERENCE = {"pick": lambda condition, a, b: np.where(condition, a, b),
             "floats": lambda value: np.asarray(value, float)}


def _reference(monkeypatch) -> int:
    """Every perfmodel module's ``pick`` and ``floats`` replaced by the numpy calls they stand for
    (algebra.where's own call included); how many names were replaced."""
    replaced = 0
    for name, module in list(sys.modules.items()):
        if name == "perfmodel" or name.startswith("perfmodel."):
            for attr, ref in REFERENCE.items():
                if getattr(module, attr, None) is FAST[attr]:
                    monkeypatch.setattr(module, attr, ref)
                    replaced += 1
    return replaced


@pytest.fixture(scope="module")
def configurations():
    return [(m, c, s) for m, c, _, strategies in _groups(n_groups=4, per_group=4, seed=7) for s in strategies]


def test_predictions_with_the_shortcuts_equal_those_with_numpys_calls(configurations, monkeypatch):
    clear_memos()
    fast = [pm.predict(*x) for x in configurations]
    assert _reference(monkeypatch) >= 8  # algebra and the modules that import the shortcuts
    clear_memos()
    for x, p in zip(configurations, fast):
        q = pm.predict(*x)
        for f in FIELDS:
            np.testing.assert_allclose(getattr(p, f), getattr(q, f), rtol=RTOL, err_msg=f"{f} of {x[2]}")
    clear_memos()
