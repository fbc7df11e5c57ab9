"""Where a profile's numbers come from, in words: measured (fitted to tables) or datasheet-derived."""

from __future__ import annotations


def profile_origin(profile) -> str:
    """"measured (fitted to <tables>)", "datasheet (scaled from <reference>)" or "origin not recorded"."""
    meta = profile.meta
    if meta.get("fitted_from"):
        fallback = meta.get("fallback_classes")
        rest = f"; {fallback} classes from the bundled profile" if fallback else ""
        return "measured: fitted to " + ", ".join(map(str, meta["fitted_from"])) + rest
    if meta.get("derived_from"):
        return f"datasheet: {meta['derived_from']}'s fits scaled by datasheet FLOP/s and bandwidth"
    return "origin not recorded"


def origin_word(profile) -> str:
    """One word of :func:`profile_origin`: measured, datasheet or unknown."""
    meta = profile.meta
    return "measured" if meta.get("fitted_from") else "datasheet" if meta.get("derived_from") else "unknown"
