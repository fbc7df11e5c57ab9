"""A closed form: one numpy function and its sympy twin.

A Profile stores, for each op class or collective, the *name* of a closed form
and its fitted parameters. Loading a profile looks the name up here: nothing
from a file is ever executed. Each form evaluates on numpy arrays (so sweeps
broadcast) and exports the same formula as a sympy expression, so a user can
read, differentiate or solve it; tests check both agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from perfmodel.core.lazy import sympy as sp  # imported on first symbolic use

from perfmodel.core.errors import ProfileError


@dataclass(frozen=True)
class Form:
    """A closed form ``f(variables; params)`` with a numpy and a sympy body.

    ``numpy_fn(params, **variables)`` and ``sympy_fn(params, **symbols)``
    receive ``params`` as a mapping name -> value (floats or sympy symbols).
    ``scalar_fn`` (optional) is the numpy body's twin on Python floats (``math``, the same
    operations in the same order): ``evaluate`` uses it when every variable is one number, and
    falls back to ``numpy_fn`` when it raises (a division by zero) or gives no finite float.
    """

    name: str
    variables: tuple[str, ...]
    params: tuple[str, ...]
    numpy_fn: Callable
    sympy_fn: Callable
    doc: str = ""
    scalar_fn: Callable | None = None

    def __post_init__(self):
        # the names as sets, for the check every evaluation makes
        object.__setattr__(self, "_param_set", frozenset(self.params))
        object.__setattr__(self, "_variable_set", frozenset(self.variables))

    def evaluate(self, params: Mapping[str, float], /, **variables):
        self._check(params, variables)
        if self.scalar_fn is not None:
            floats = _floats(variables)
            if floats is not None:
                try:
                    t = self.scalar_fn(params, **floats)
                except (ArithmeticError, ValueError, TypeError):
                    t = None
                if type(t) is float and math.isfinite(t):
                    return np.float64(t)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return self.numpy_fn(params, **{k: np.asarray(v, dtype=float) for k, v in variables.items()})

    def expression(self, params: Mapping[str, float] | None = None, /, **symbols) -> sp.Expr:
        """Sympy expression; free variables default to symbols named like them."""
        syms = {v: symbols.get(v, sp.Symbol(v, positive=True)) for v in self.variables}
        if params is None:
            params = {p: sp.Symbol(p, positive=True) for p in self.params}
        else:
            # a form's optional parameters (``stream_k`` of ``gemm_tiles``) pass through as the numpy body sees them
            params = {**params, **{p: sp.Float(params[p]) if isinstance(params[p], float) else params[p]
                                   for p in self.params}}
        return self.sympy_fn(params, **syms)

    def _check(self, params, variables) -> None:
        if params.keys() >= self._param_set and variables.keys() <= self._variable_set:
            return
        missing = [p for p in self.params if p not in params]
        if missing:
            raise ProfileError(f"form {self.name!r} lacks parameters {missing} (needs {list(self.params)})")
        extra = set(variables) - set(self.variables)
        if extra:
            raise ProfileError(f"form {self.name!r} takes variables {list(self.variables)}, got {sorted(extra)}")


_NUMBER_TYPES = frozenset((float, int, bool, np.float64, np.int64, np.float32, np.int32, np.bool_))


def _floats(variables) -> dict | None:
    """``variables`` as Python floats when each is one real number (or a 0-d array of one), else None."""
    out = {}
    for k, v in variables.items():
        if type(v) in _NUMBER_TYPES or (type(v) is np.ndarray and v.ndim == 0 and v.dtype.kind in "fiu"):
            out[k] = float(v)
        else:
            return None
    return out
