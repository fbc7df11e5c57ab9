"""argparse types of the command line: bounded numbers, and the renamed --bucket-mb."""

from __future__ import annotations

import argparse
import math


def _bounded(kind, low: float, *, strict: bool = False):
    """An argparse ``type``: a finite ``kind`` (int or float) >= ``low`` (> ``low`` when ``strict``)."""
    what = "an integer" if kind is int else "a number"
    bound = f"{'>' if strict else '>='} {low:g}"

    def parse(text: str):
        try:
            if not text.isascii():  # int() also reads '٣' and other Unicode digits
                raise ValueError(text)
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} {bound}: got {text!r}") from None
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be {what} {bound}: got {text!r}")
        return value
    parse.__name__ = f"{kind.__name__} {bound}"
    return parse


POSITIVE_INT = _bounded(int, 1)
NONNEGATIVE_INT = _bounded(int, 0)
POSITIVE_FLOAT = _bounded(float, 0.0, strict=True)
NONNEGATIVE_FLOAT = _bounded(float, 0.0)


def headroom_fraction(text: str) -> float:
    """An argparse ``type`` for --memory-headroom: a fraction 0 <= h < 1."""
    value = NONNEGATIVE_FLOAT(text)
    if value >= 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction >= 0 and < 1 (0.1 keeps 10% free): got {text!r}")
    return value


def renamed_bucket(text: str):
    raise argparse.ArgumentTypeError(f"--bucket-mb is now --bucket-mib (MiB, as torch's bucket_cap_mb): use --bucket-mib {text}")
