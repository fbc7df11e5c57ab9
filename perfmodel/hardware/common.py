"""Pieces shared by the hardware descriptions: a frozen mapping and field checks."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Mapping

from perfmodel.core.errors import InvalidInputError


class FrozenMap(Mapping):
    """A read-only, hashable, picklable mapping (frozen dataclasses hold these)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping | None = None):
        self._data = dict(data or {})

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self) -> Iterator:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __getstate__(self):
        return self._data

    def __setstate__(self, state) -> None:
        self._data = state


def check_number(owner: str, name: str, value, *, optional: bool = False) -> float | None:
    """Return ``value`` as a finite float > 0 (None passes when ``optional``)."""
    if value is None and optional:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidInputError(f"{owner}: {name!r} must be a number > 0: got {value!r}")
    return float(value)


def check_name(kind: str, name) -> str:
    """Require a non-empty string name."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidInputError(f"{kind} 'name' must be a non-empty string: got {name!r}")
    return name
