"""Bounded caches for the pieces of one prediction that repeat across calls.

``pm.predict`` prices one configuration with the same vectorised code ``search``
runs over a million, so each call pays numpy's per-call overhead on arrays of
one element. Many of those pieces depend on a few fields only (a layer's kernel
times on the micro-batch, tp, sp, precision and stack; a collective on its size
and group), so consecutive predictions that share them price them once.

Keys hold plain values (floats, strings, frozen dataclasses) plus one object compared
by identity (a Profile, a collectives mapping: read-only by contract, and holding
dicts, so not hashable by value); an entry keeps that object alive, so an
identity is never reused while its entry stands. Only scalar configurations are
cached: arrays (a search) always run through. Oldest entries go first once a
cache holds ``maxsize``.
"""

from __future__ import annotations

import dataclasses
import functools
import operator

import numpy as np

SCALAR_TYPES = (float, int, bool, np.floating, np.integer, np.bool_)
# hashable as they are, and equal (same hash) to the Python number of the same value
PLAIN_TYPES = frozenset((float, int, bool, str, np.float64, np.int64, np.bool_))


def scalar(x):
    """``x`` as a hashable value when it is one number (or a 0-d array) or a string, else None."""
    if type(x) in PLAIN_TYPES:
        return x
    if isinstance(x, SCALAR_TYPES):
        return x.item() if isinstance(x, np.generic) else x
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return x.item()
    return None


_MEMOS: list[IdentityMemo] = []


def clear_memos() -> None:
    """Empty every cache of this module's kind (tests compare cached and uncached predictions)."""
    for memo in _MEMOS:
        memo.clear()


class IdentityMemo:
    """A bounded mapping (object by identity, hashable key) -> value."""

    def __init__(self, maxsize: int = 4096):
        self.maxsize = maxsize
        self._entries: dict = {}
        _MEMOS.append(self)

    def get(self, owner, key):
        hit = self._entries.get((id(owner), key))
        return hit[1] if hit is not None and hit[0] is owner else None

    def put(self, owner, key, value) -> None:
        if len(self._entries) >= self.maxsize:
            self._entries.pop(next(iter(self._entries)))
        self._entries[(id(owner), key)] = (owner, value)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def memo_by_fields(fields: tuple[str, ...], maxsize: int = 1024):
    """Cache ``fn(model, profile, c, **options)`` for scalar configurations ``c``.

    ``c`` is a frozen record (``perfmodel.parallel.config.StepConfig``); the key is the model
    (by value), the profile (by identity), ``c.<f>`` for each of ``fields`` (the only fields of
    ``c`` that ``fn`` reads) and the keyword options. A model that cannot be hashed runs through
    uncached. Configurations whose fields are arrays (a search) are priced once per distinct
    combination of those fields and spread back (``_deduplicated``). The cached value is a
    frozen record, shared by the calls that hit it.
    """
    def wrap(fn):
        memo = IdentityMemo(maxsize)

        @functools.wraps(fn)
        def cached(model, profile, c, **options):
            values = tuple(scalar(getattr(c, f)) for f in fields)
            try:
                key = (model, values, tuple(sorted(options.items())))
                hash(key)
            except TypeError:
                return fn(model, profile, c, **options)
            if None in values:
                return _deduplicated(fn, fields, model, profile, c, options)
            hit = memo.get(profile, key)
            if hit is None:
                hit = fn(model, profile, c, **options)
                memo.put(profile, key, hit)
            return hit

        cached.memo = memo
        return cached
    return wrap


def _spread(value, n: int, inverse):
    """``value`` with each array of ``n`` entries (in frozen records and tuples too) indexed by ``inverse``."""
    if isinstance(value, np.ndarray):
        return value[inverse] if value.shape == (n,) else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _spread(getattr(value, f.name), n, inverse)
                                             for f in dataclasses.fields(value) if f.init})
    if isinstance(value, tuple):
        return tuple(_spread(v, n, inverse) for v in value)
    return value


def _deduplicated(fn, fields, model, profile, c, options):
    """``fn`` over the distinct rows of ``c``'s ``fields`` (1-D arrays of one length), outputs spread back.

    A search holds thousands of configurations but a few dozen (micro-batch, tp, sp) rows; each
    output element is the same elementwise arithmetic on the same inputs, so results are identical.
    """
    arrays = {f: np.asarray(getattr(c, f)) for f in fields if not isinstance(getattr(c, f), str)}
    lengths = {a.shape for a in arrays.values() if a.ndim}
    if any(a.dtype.kind not in "biuf" for a in arrays.values()):
        return fn(model, profile, c, **options)
    if len(lengths) != 1 or len(next(iter(lengths))) != 1:
        return _grid_deduplicated(fn, model, profile, c, options, arrays)
    n = next(iter(lengths))[0]
    names = [f for f, a in arrays.items() if a.ndim]
    first, inverse = _distinct_rows([arrays[f] for f in names])
    if first.size == n:
        return fn(model, profile, c, **options)
    out = fn(model, profile, dataclasses.replace(c, **{f: arrays[f][first] for f in names}), **options)
    return _spread(out, first.size, inverse)


def _grid_deduplicated(fn, model, profile, c, options, arrays):
    """``fn`` over the distinct grid rows of ``c``'s fields that vary along the first axis only (a search
    grid's rows: ``explore.space.Factored``), the other fields left as they are (varying along other
    axes); outputs spread back along the first axis. Anything else runs through as it is."""
    grid = [a for a in arrays.values() if a.ndim]
    ndim = grid[0].ndim if grid else 0
    rows = [f for f, a in arrays.items() if a.ndim and a.shape[0] > 1]
    if (not rows or ndim < 2 or any(a.ndim != ndim for a in grid)
            or any(a.size != a.shape[0] for f, a in arrays.items() if f in rows)
            or any(a.shape[0] != 1 for f, a in arrays.items() if a.ndim and f not in rows)
            or len({arrays[f].shape[0] for f in rows}) != 1):
        return fn(model, profile, c, **options)
    n = arrays[rows[0]].shape[0]
    first, inverse = _distinct_rows([arrays[f].reshape(-1) for f in rows])
    if first.size in (1, n):
        return fn(model, profile, c, **options)
    out = fn(model, profile, dataclasses.replace(c, **{f: arrays[f][first] for f in rows}), **options)
    return _spread_rows(out, first.size, ndim, inverse)


def _spread_rows(value, n: int, ndim: int, inverse):
    """``value`` with each array of ``ndim`` dimensions and ``n`` rows (in frozen records and tuples too)
    indexed along its first axis by ``inverse``."""
    if isinstance(value, np.ndarray):
        return value[inverse] if value.ndim == ndim and value.shape[0] == n else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: _spread_rows(getattr(value, f.name), n, ndim, inverse)
                                             for f in dataclasses.fields(value) if f.init})
    if isinstance(value, tuple):
        return tuple(_spread_rows(v, n, ndim, inverse) for v in value)
    return value


def _distinct_rows(columns):
    """(index of one occurrence of each distinct row, row -> its distinct index) of equal-length columns.

    Each column is coded by its own distinct values and the codes are combined into one integer,
    so a few sorts of one column replace a sort of whole rows.
    """
    code = np.zeros(columns[0].size, np.int64)
    for col in columns:
        values, inv = np.unique(col, return_inverse=True)
        code = code * values.size + inv.reshape(-1)
    codes, first, inverse = np.unique(code, return_index=True, return_inverse=True)
    return first, inverse.reshape(-1)


class ChainMemo:
    """A bounded mapping (objects by identity, hashable key) -> value, for a price computed from
    earlier prices and plain values.

    ``owners`` are the inputs held by identity (a Profile, a collectives mapping, a record another
    memo returned: read-only, so the same object means the same values); an entry keeps them alive,
    so an identity is never reused while it stands. ``key`` holds everything else by value; a key
    of None (an array configuration) or one that cannot be hashed is computed and not kept.
    """

    def __init__(self, maxsize: int = 1024):
        self.maxsize = maxsize
        self._entries: dict = {}
        _MEMOS.append(self)

    def __call__(self, owners: tuple, key, compute):
        """``compute()``, once per (owners, key)."""
        if key is None:
            return compute()
        k = (tuple(map(id, owners)), key)
        try:
            hit = self._entries.get(k)
        except TypeError:
            return compute()
        if hit is not None:  # the entry holds its owners, so no other live object has their ids
            return hit[1]
        value = compute()
        if len(self._entries) >= self.maxsize:
            self._entries.pop(next(iter(self._entries)))
        self._entries[k] = (owners, value)
        return value

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def scalar_fields(record, names: tuple[str, ...]):
    """The values of ``record``'s fields ``names`` as a tuple of plain numbers and strings (a
    memo key), or None when any of them is an array of several values (a search)."""
    out = []
    for name in names:
        v = getattr(record, name)
        if type(v) not in PLAIN_TYPES:
            if v is None or type(v) is tuple:  # optional and tuple-valued fields (stage_layers) key as they are
                out.append(v)
                continue
            v = scalar(v)
            if v is None:
                return None
        out.append(v)
    return tuple(out)


_GETTERS: dict = {}  # field names -> the getter of their values


def fields_key(values: dict | None, fields: tuple[str, ...], *extra):
    """A memo key: the ``values`` (by name) of ``fields`` and ``extra``; None when ``values`` is None
    (a configuration of arrays, which is not cached)."""
    if values is None:
        return None
    get = _GETTERS.get(fields)
    if get is None:
        get = _GETTERS[fields] = operator.itemgetter(*fields) if fields else (lambda _: ())
    return get(values), extra


def canonical(memo: ChainMemo, value):
    """One object for each ``value`` (the first one seen equal to it), or None when it cannot be
    hashed; memos downstream may then hold it by identity."""
    try:
        hash(value)
    except TypeError:
        return None
    return memo((), value, lambda: value)
