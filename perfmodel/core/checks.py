"""Input checks used everywhere; each raises a perfmodel error naming the field.

Style: "'tp' must divide heads=32: got 3 (valid: 1, 2, 4, 8, 16, 32)".
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable

import numpy as np

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


TRUE_WORDS, FALSE_WORDS = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def check_flag(name: str, value) -> bool:
    """``value`` as a bool: True/False (numpy's too: a table cell), 1/0, or text written by a user ("true", "off", ...)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE_WORDS + FALSE_WORDS:
        return value.strip().lower() in TRUE_WORDS
    raise InvalidInputError(f"{name!r} must be True or False (or one of {', '.join(TRUE_WORDS + FALSE_WORDS)}): "
                            f"got {value!r}")


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
    """The divisors of ``n`` in increasing order, in O(sqrt n) steps (n up to 2**40 in well under a second)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


# Upper bounds of the sizes a user gives, where the value enters (Strategy, cluster, search). Each
# is far above any training run so far; past them floats overflow (a micro-batch of 10**300 gave
# NaN), enumerations outgrow memory or per-stage pricing outgrows seconds.
LIMITS = {
    "gpus": 2**24,           # 16.8 M GPUs in one cluster (the largest runs use ~10**5)
    "nodes": 2**24,
    "gpus_per_node": 2**10,
    "dp": 2**24, "tp": 2**16, "cp": 2**16, "ep": 2**16,
    "pp": 256,               # each stage is priced on its own; the deepest published pipelines use 64-128
    "virtual_stages": 64,    # Megatron-LM interleaving uses a handful of chunks per stage
    "micro_batch": 2**20,    # samples per micro-batch
    "global_batch": 2**30,   # samples per step
    "ps_servers": 2**16,
    "max_micro_batch": 1024, # search: micro-batches tried 1..this
    "max_virtual_stages": 64,
    "search_grid": 4_000_000,
    "trials": 10**6,         # Monte Carlo trials per scenario (10**4 give percentiles to ~1%)
    "mixed_workers": 2**16,  # heterogeneous clusters are priced one worker at a time  # configurations search enumerates before its rules (each holds ~10 numbers)
}


def check_size(name: str, value, *, minimum: int = 1, limit: str | None = None) -> int:
    """``check_int`` with the upper bound of ``LIMITS[limit or name]``."""
    return check_int(name, value, minimum=minimum, maximum=LIMITS[limit or name])


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
