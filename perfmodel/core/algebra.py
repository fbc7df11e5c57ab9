"""Operations that work on numpy arrays and on sympy expressions alike.

The pricing functions run on numpy arrays (``predict``, ``search``) and, for a
symbolic step time, on sympy expressions (``perfmodel.analysis.symbolic``): one
implementation of each formula serves both.
"""

from __future__ import annotations

import numpy as np


_NUMERIC = frozenset((np.ndarray, float, int, bool, np.float64, np.int64, np.bool_))  # never sympy: no lookup


def is_symbolic(value) -> bool:
    """Whether ``value`` is a sympy object (sympy is imported only when one is met)."""
    t = type(value)
    return t not in _NUMERIC and t.__module__.startswith("sympy")


def to_sympy(value):
    """A number or a 0-d array as a sympy Float; a sympy expression unchanged."""
    import sympy as sp

    if isinstance(value, np.ndarray):
        value = value.item()
    if isinstance(value, (np.floating, np.integer, float, int)) and not isinstance(value, bool):
        return sp.Float(float(value))
    return value


def maximum(a, b):
    """Element-wise maximum: ``np.maximum`` on numbers and arrays, ``sympy.Max`` on expressions."""
    if is_symbolic(a) or is_symbolic(b):
        import sympy as sp

        return _unsimplified(sp.Max, to_sympy(a), to_sympy(b))
    return np.maximum(a, b)


def minimum(a, b):
    """Element-wise minimum: ``np.minimum`` on numbers and arrays, ``sympy.Min`` on expressions."""
    if is_symbolic(a) or is_symbolic(b):
        import sympy as sp

        return _unsimplified(sp.Min, to_sympy(a), to_sympy(b))
    return np.minimum(a, b)


def _unsimplified(func, *args):
    """``sympy.Min``/``Max`` evaluated on numbers, left as written on expressions: sympy's search for
    redundant arguments (``_find_localzeros``) takes seconds to minutes on a step's expressions, and
    substituting numbers evaluates them anyway."""
    if all(getattr(a, "is_number", False) for a in args):
        return func(*args)
    return func(*args, evaluate=False)


def equal(a, b):
    """Element-wise ``a == b``: ``np.equal`` on numbers and arrays, one structural truth value on expressions."""
    if is_symbolic(a) or is_symbolic(b):
        return bool(to_sympy(a) == to_sympy(b))
    return np.equal(a, b)


_TRUTHS = (bool, np.bool_)
_FLOATS = (float, np.float64)
_INTS = (int, np.int64)
_ONE_DTYPES = (np.dtype(float), np.dtype(bool))


def _one(x):
    """``x`` as the one plain number it holds (a float, an int, a truth value, or a 0-d float or
    truth array's element), else None."""
    t = type(x)
    if t in _FLOATS or t in _TRUTHS or t in _INTS:
        return x
    if t is np.ndarray and x.shape == () and x.dtype in _ONE_DTYPES:
        return x[()]
    return None


def pick(condition, a, b):
    """``np.where(condition, a, b)``; where the condition is one truth value and the branches one float
    and one float or int (a single prediction), the chosen one as a float64 without building arrays:
    np.where's number and dtype, at a tenth of its cost, and what follows computes on a scalar
    instead of a 0-d array."""
    t = type(condition)
    if t in _TRUTHS:
        if type(a) in _FLOATS and type(b) in _FLOATS:  # the common case first
            return np.float64(a if condition else b)
    elif t is not np.ndarray or condition.ndim:  # arrays of configurations (a search): numpy at once
        return np.where(condition, a, b)
    c, x, y = _one(condition), _one(a), _one(b)
    if c is not None and x is not None and y is not None and type(c) in _TRUTHS:
        tx, ty = type(x), type(y)
        if tx in _FLOATS and (ty in _FLOATS or ty in _INTS) or tx in _INTS and ty in _FLOATS:  # a float64
            return np.float64(x if c else y)
    return np.where(condition, a, b)


_SCALARS = frozenset((float, int, bool, np.float64, np.int64, np.bool_))


def floats(value):
    """``np.asarray(value, float)``; one plain number as a float64 scalar: the same number, and what
    follows computes on a scalar instead of a 0-d array (a single prediction)."""
    if type(value) in _SCALARS:
        return np.float64(value)
    return np.asarray(value, float)


def where(condition, a, b):
    """``np.where`` on numbers and arrays; on sympy expressions ``condition`` must be one truth
    value (the symbolic paths price one configuration), and the chosen branch is returned."""
    if type(condition) in _TRUTHS and type(a) in _FLOATS and type(b) in _FLOATS:
        return np.float64(a if condition else b)  # pick's shortcut
    if is_symbolic(a) or is_symbolic(b):
        if np.ndim(condition) != 0:
            raise ValueError("a symbolic branch needs a single condition")
        return a if bool(condition) else b
    return pick(condition, a, b)


def number(value):
    """``value`` as pricing multiplies it: a float array, or a sympy expression unchanged."""
    return value if is_symbolic(value) else np.asarray(value, float)
