"""One exception family for perfmodel.

Every error a user can cause derives from :class:`PerfModelError`, so callers
can catch one class; the CLI turns these into a one-line message and exit
status 2. Messages name the field, the value and what would be valid.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class PerfModelError(ValueError):
    """Base class of every perfmodel error caused by input."""


class InvalidInputError(PerfModelError):
    """A field has a value that is wrong (type, range, divisibility...)."""


class UnknownNameError(PerfModelError, KeyError):
    """A name (preset, GPU, collective, column...) is not known."""

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0] if self.args else ""


class UnsupportedError(PerfModelError):
    """Valid input that the model cannot represent."""


class ProfileError(PerfModelError):
    """A profile file is malformed, of an unknown schema or lacks a field."""


class InfeasibleError(PerfModelError):
    """A search or plan has no configuration that satisfies its constraints."""


def unknown_name(kind: str, name: str, known: Iterable[str]) -> UnknownNameError:
    """Build an error for an unknown name that lists the known ones and the closest."""
    known = sorted(known)
    close = difflib.get_close_matches(str(name), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return UnknownNameError(f"unknown {kind} {name!r}{hint} (known: {', '.join(known)})")
