"""The public name of perfmodel's exception family (defined in :mod:`perfmodel.core.errors`)."""

from perfmodel.core.errors import (
    InfeasibleError,
    InvalidInputError,
    PerfModelError,
    ProfileError,
    UnknownNameError,
    UnsupportedError,
    unknown_name,
)

__all__ = ["InfeasibleError", "InvalidInputError", "PerfModelError", "ProfileError", "UnknownNameError",
           "UnsupportedError", "unknown_name"]
