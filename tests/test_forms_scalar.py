"""Every registered closed form gives the same number on Python floats (its ``scalar_fn`` twin,
perfmodel/forms/scalar.py) as its numpy body on arrays, to rtol 1e-12: over seeded random
parameters around the bundled profiles' fits and sizes that include zeros, ones, misaligned
rows and fractional element counts. ``Form.evaluate`` on one number must equal the array path
whether the twin answers or falls back (zero sizes: numpy's inf or masks)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from perfmodel.forms.comm import BUSBW_FACTOR
from perfmodel.forms.registry import FORMS
from perfmodel.profiles.profile import list_profiles, load_profile

RTOL = 1e-12
DRAWS = 300
EXACT = ("elem_bytes", "sms", "T")  # counts the forms read as integers (alignment, waves, tiles)
EXTRA = {"s_half": 512.0, "p_causal": 0.9, "p4": 0.6, "p2": 0.4}  # sdpa_flash's and gemm_two_levels' own, not in a bundled fit
SIZES = (0.0, 1.0, 2.0, 3.0, 7.0, 8.0, 63.5, 64.0, 100.0, 128.0, 1000.0, 4095.0, 4096.0, 12288.0, 50257.0,
         1.5e6, 3.3e9)


@pytest.fixture(scope="module")
def base_params() -> dict:
    """A value for every parameter name: the first bundled fit that has it (else ``EXTRA``)."""
    out = dict(EXTRA)
    for name in list_profiles():
        profile = load_profile(name)
        entries = list(profile.compute.values())
        entries += [e for level in profile.collectives.values() for e in level.values()]
        for entry in entries:
            for k, v in entry["params"].items():
                out.setdefault(k, float(v))
    return out


def _params(rng, form, base) -> dict:
    return {p: base[p] if p in EXACT else base[p] * rng.uniform(0.5, 2.0) for p in form.params}


def _variables(rng, form) -> dict:
    out = {}
    for v in form.variables:
        if v == "causal":
            out[v] = rng.choice([0.0, 1.0])
        elif v == "n":
            out[v] = float(rng.choice([1, 2, 3, 8, 16, 64]))
        elif v == "factor":
            continue
        elif v == "head_dim":
            out[v] = rng.choice([0.0, 1.0, 60.0, 64.0, 80.0, 96.0, 100.0, 128.0, 256.0])
        else:
            out[v] = rng.choice(SIZES) * rng.choice([1.0, 1.0, 1.0, 0.37])
    if "factor" in form.variables:
        out["factor"] = float(BUSBW_FACTOR[rng.choice(sorted(BUSBW_FACTOR))](out["n"]))
    return out


def _array_path(form, params, variables) -> float:
    return float(np.asarray(form.evaluate(params, **{k: np.array([v]) for k, v in variables.items()}))[0])


@pytest.mark.parametrize("name", sorted(FORMS))
def test_scalar_twin_equals_numpy_body(name, base_params):
    form = FORMS[name]
    assert form.scalar_fn is not None, f"form {name!r} has no twin on floats"
    rng = random.Random(f"scalar-{name}")
    answered = 0
    for _ in range(DRAWS):
        params, variables = _params(rng, form, base_params), _variables(rng, form)
        want = _array_path(form, params, variables)
        got = form.evaluate(params, **variables)
        assert isinstance(got, np.floating), (name, variables, type(got))
        np.testing.assert_allclose(float(got), want, rtol=RTOL, err_msg=f"{name} {variables}")
        try:
            twin = form.scalar_fn(params, **variables)
        except (ArithmeticError, ValueError):
            continue
        if isinstance(twin, float) and math.isfinite(twin):
            answered += 1
            np.testing.assert_allclose(twin, want, rtol=RTOL, err_msg=f"{name} twin {variables}")
    assert answered > DRAWS // 3, f"the twin of {name!r} answered {answered} of {DRAWS} draws"


def test_integers_and_zero_d_arrays_take_the_float_path(base_params):
    form = FORMS["gemm_tiles"]
    params = {p: base_params[p] for p in form.params}
    plain = form.evaluate(params, m=4096.0, n=4095.0, k=8192.0)
    assert form.evaluate(params, m=4096, n=np.int64(4095), k=np.asarray(8192.0)) == plain
    assert plain == _array_path(form, params, {"m": 4096.0, "n": 4095.0, "k": 8192.0})
    assert form.evaluate(params, m=0, n=4096, k=4096) == _array_path(form, params, {"m": 0.0, "n": 4096.0,
                                                                                    "k": 4096.0})
