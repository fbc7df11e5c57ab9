"""Unit strings in, SI numbers out (and back, for people to read).

Everything inside perfmodel is SI: seconds, bytes, bytes/s, FLOP/s. Strings
such as ``"80GiB"``, ``"400Gb/s"``, ``"989TFLOPS"`` or ``"5us"`` are parsed
here and only here, at the edges (catalog files, command line).

Conventions (IEC 80000-13 / SI):

* decimal prefixes: k/K = 1e3, M = 1e6, G = 1e9, T = 1e12, P = 1e15
  (``"141GB"`` is 141e9 bytes);
* binary prefixes: Ki = 2**10, Mi = 2**20, Gi = 2**30, Ti = 2**40, Pi = 2**50
  (``"80GiB"`` is 80 * 2**30 bytes);
* ``B`` is a byte and ``b`` a bit: ``"400Gb/s"`` is 50e9 bytes/s.

Each parser accepts a plain number (returned unchanged as a float) or a
string, and raises :class:`~perfmodel.core.errors.InvalidInputError` naming the
field when it cannot read the value.
"""

from __future__ import annotations

import math
import numbers
import re
from decimal import Decimal

from perfmodel.core.errors import InvalidInputError

__all__ = [
    "format_bytes",
    "format_rate",
    "format_seconds",
    "parse_bandwidth",
    "parse_bytes",
    "parse_duration",
    "parse_flops",
]

# factors are exact Decimals so "66.9TFLOPS" is the float nearest 66.9e12, no rounding noise
_D = Decimal
_PREFIXES = {
    "": _D(1),
    "k": _D(10) ** 3,
    "K": _D(10) ** 3,
    "M": _D(10) ** 6,
    "G": _D(10) ** 9,
    "T": _D(10) ** 12,
    "P": _D(10) ** 15,
    "Ki": _D(2) ** 10,
    "Mi": _D(2) ** 20,
    "Gi": _D(2) ** 30,
    "Ti": _D(2) ** 40,
    "Pi": _D(2) ** 50,
}
# FLOP/s strings are matched lower-case ("TFLOPS", "tflop/s"): the decimal prefixes, plus exa
_FLOPS_PREFIXES = {k.lower(): v for k, v in _PREFIXES.items() if "i" not in k} | {"e": _D(10) ** 18}

# bytes of one element of each precision the cost model knows
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
_DURATIONS = {
    "ns": _D("1e-9"),
    "us": _D("1e-6"),
    "\u00b5s": _D("1e-6"),  # micro sign
    "\u03bcs": _D("1e-6"),  # greek small letter mu
    "ms": _D("1e-3"),
    "s": _D(1),
    "sec": _D(1),
    "min": _D(60),
    "h": _D(3600),
    "hr": _D(3600),
}

# a number (int, decimal or scientific) followed by an optional unit
_NUMBER_UNIT = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(\S*?)\s*$")
# size: prefix + B; bandwidth adds b (bit) and a per-second suffix
_PREFIX = r"(?P<prefix>Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P|)"
_SIZE_UNIT = re.compile(_PREFIX + r"(?P<unit>B|b|bit|bits|byte|bytes)$")
_RATE_UNIT = re.compile(_PREFIX + r"(?P<unit>B|b|bit|bits|byte|bytes)(?:/s|/sec|ps)$")
_FLOPS_UNIT = re.compile(r"^(?P<prefix>[kmgtpe]?)(?:flops|flop/s|flop/sec)$")
_BITS = ("b", "bit", "bits")


def _fail(field: str, what: str, value, hint: str = "") -> InvalidInputError:
    return InvalidInputError(f"{field!r} must be {what}: got {value!r}{hint}")


def _split(value, field: str, what: str) -> float | tuple[Decimal, str]:
    """A plain number as a float, or (number, unit string) read from a string."""
    if isinstance(value, bool):
        raise _fail(field, what, value)
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number) or number < 0:
            raise _fail(field, what, value)
        return number
    if not isinstance(value, str):
        raise _fail(field, what, value)
    match = _NUMBER_UNIT.match(value)
    if not match:
        raise _fail(field, what, value)
    number = Decimal(match.group(1))
    if number < 0:
        raise _fail(field, what, value)
    return number, match.group(2)


def _float(number: Decimal, field: str, what: str, value) -> float:
    result = float(number)
    if not math.isfinite(result):  # e.g. "1e400GB"
        raise _fail(field, what, value)
    return result


def _parse(value, field: str, what: str, factor_of) -> float:
    """A plain number, or a number times ``factor_of(unit)`` (which raises for a bad unit)."""
    split = _split(value, field, what)
    if isinstance(split, float):
        return split
    number, unit = split
    return _float(number * (factor_of(unit) if unit else 1), field, what, value)


def _match(pattern, unit: str, field: str, what: str, value):
    """``pattern``'s match of ``unit``, or the error naming ``field`` and what is valid."""
    match = pattern.match(unit)
    if not match:
        raise _fail(field, what, value)
    return match


def parse_bytes(value, field: str = "size") -> float:
    """Bytes from ``"80GiB"``, ``"141GB"``, ``"40 GB"``, ``"512MiB"`` or ``1024``."""
    what = "a size like '80GiB' or '141GB'"

    def factor(unit):
        match = _match(_SIZE_UNIT, unit, field, what, value)
        if match.group("unit") in _BITS:
            raise _fail(field, what, value, " (b is a bit; write B for bytes)")
        return _PREFIXES[match.group("prefix")]
    return _parse(value, field, what, factor)


def parse_bandwidth(value, field: str = "bandwidth") -> float:
    """Bytes/s from ``"400Gb/s"`` (= 50e9), ``"900GB/s"``, ``"200Gbps"`` or a number."""
    what = "a bandwidth like '400Gb/s' or '900GB/s'"

    def factor(unit):
        match = _match(_RATE_UNIT, unit, field, what, value)
        bits = match.group("unit") in _BITS
        return _PREFIXES[match.group("prefix")] / (8 if bits else 1)  # 8 bits per byte
    return _parse(value, field, what, factor)


def parse_flops(value, field: str = "flops") -> float:
    """FLOP/s from ``"989TFLOPS"``, ``"989.4 TFLOP/s"``, ``"1.98PFLOPS"`` or ``19.5e12``."""
    what = "a rate like '989TFLOPS' or '19.5e12'"

    def factor(unit):
        match = _match(_FLOPS_UNIT, unit.lower(), field, what, value)
        return _FLOPS_PREFIXES[match.group("prefix")]
    return _parse(value, field, what, factor)


def parse_duration(value, field: str = "time") -> float:
    """Seconds from ``"5us"``, ``"2.5 µs"``, ``"1ms"``, ``"3s"``, ``"30min"``, ``"1h"``."""
    what = "a duration like '5us' or '1.5ms'"

    def factor(unit):
        if unit not in _DURATIONS:
            raise _fail(field, what, value, f" (units: {', '.join(_DURATIONS)})")
        return _DURATIONS[unit]
    return _parse(value, field, what, factor)


def _scaled(x: float, steps: list[tuple[float, str]]) -> tuple[float, str]:
    """Pick the largest step whose factor is <= |x|; steps go from large to small."""
    for factor, name in steps:
        if abs(x) >= factor:
            return x / factor, name
    return x / steps[-1][0], steps[-1][1]


def _number(x: float) -> str:
    return f"{x:.4g}"


def format_bytes(n: float, binary: bool = True) -> str:
    """``150109880320`` -> ``'139.8 GiB'`` (or ``'150.1 GB'`` with ``binary=False``)."""
    if binary:
        steps = [
            (2.0**50, "PiB"),
            (2.0**40, "TiB"),
            (2.0**30, "GiB"),
            (2.0**20, "MiB"),
            (2.0**10, "KiB"),
            (1.0, "B"),
        ]
    else:
        steps = [(1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1.0, "B")]
    value, unit = _scaled(float(n), steps)
    return f"{_number(value)} {unit}"


def format_seconds(t: float) -> str:
    """``0.01234`` -> ``'12.34 ms'``; ``5e-6`` -> ``'5 us'``; ``5400`` -> ``'1.5 h'``."""
    t = float(t)
    if t == 0:
        return "0 s"
    steps = [(3600.0, "h"), (60.0, "min"), (1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")]
    value, unit = _scaled(t, steps)
    return f"{_number(value)} {unit}"


def format_rate(x: float, unit: str) -> str:
    """``(989.4e12, 'FLOP/s')`` -> ``'989.4 TFLOP/s'``; ``(50e9, 'B/s')`` -> ``'50 GB/s'``."""
    steps = [(1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")]
    value, prefix = _scaled(float(x), steps)
    return f"{_number(value)} {prefix}{unit}"
