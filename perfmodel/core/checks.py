"""Input checks used everywhere; each raises a perfmodel error naming the field.

Style: "'tp' must divide heads=32: got 3 (valid: 1, 2, 4, 8, 16, 32)".
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

from perfmodel.core import readers
from perfmodel.core.errors import InvalidInputError, unknown_name


def check_int(name: str, value, *, minimum: int = 1, maximum: int | None = None) -> int:
    """Return ``value`` as an int, requiring an integer >= ``minimum`` (and <= ``maximum``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        if (not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
                and float(value).is_integer()):
            value = int(value)
        else:
            raise InvalidInputError(f"{name!r} must be an integer >= {minimum}: got {value!r}")
    if value < minimum:
        raise InvalidInputError(f"{name!r} must be an integer >= {minimum}: got {value!r}")
    if maximum is not None and value > maximum:
        shown = repr(value) if len(repr(value)) <= 24 else f"{repr(value)[:20]}… ({len(repr(value))} digits)"
        raise InvalidInputError(f"{name!r} must be an integer between {minimum} and {maximum:,}: got {shown}")
    return int(value)


def check_positive(name: str, value, *, allow_zero: bool = False) -> float:
    """Return ``value`` as a finite float > 0 (or >= 0 with ``allow_zero``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise InvalidInputError(f"{name!r} must be a finite number: got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidInputError(f"{name!r} must be {bound}: got {value!r}")
    return float(value)


def check_choice(name: str, value, choices: Iterable):
    """Return ``value`` if it is one of ``choices``; else list the valid ones."""
    choices = list(choices)
    if value not in choices:
        raise unknown_name(name, value, [str(c) for c in choices])
    return value


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_divides(name: str, value: int, other_name: str, other: int) -> None:
    """Require ``value`` to divide ``other``; list the divisors otherwise."""
    if other % value:
        valid = ", ".join(map(str, divisors(other)))
        raise InvalidInputError(
            f"{name!r} must divide {other_name}={other}: got {value} (valid: {valid})"
        )


# Every user file is read through core.readers (size, encoding and nesting limits); kept here by name
read_text_file = readers.read_text_file
read_json_file = readers.read_json_file
