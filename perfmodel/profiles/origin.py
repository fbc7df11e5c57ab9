"""Where a profile's numbers come from, in words: measured (fitted to tables) or datasheet-derived,
which classes were fitted to a GPU's published microbenchmarks instead (``meta["published_fits"]``), and
where its convolution classes come from when not from the reference (``seeded_from``, ``conv_carried_from``)."""

from __future__ import annotations


def profile_origin(profile) -> str:
    """"measured (fitted to <tables>)", "datasheet (scaled from <reference>)" or "origin not recorded",
    followed by the classes fitted to published measurements, if any."""
    meta = profile.meta
    published = meta.get("published_fits") or {}
    extra = f"; published measurements: {', '.join(sorted(published))}" if published else ""
    if meta.get("seeded_from"):  # fit/build.py:seeded, a public convolution table of this GPU
        extra += f"; convolution classes fitted to {meta['seeded_from']}"
    elif meta.get("conv_carried_from"):  # fit/build.py:carried_conv
        extra += f"; convolution classes carried from {meta['conv_carried_from']}"
    if meta.get("fitted_from"):
        fallback = meta.get("fallback_classes")
        rest = f"; {fallback} classes from the bundled profile" if fallback else ""
        return "measured: fitted to " + ", ".join(map(str, meta["fitted_from"])) + rest + extra
    cap = meta.get("power_cap")
    if cap and meta.get("derived_from"):
        return (f"power-capped: {meta['derived_from']} at {cap['tdp_w']:g} W, compute x{cap['clock_ratio']:.3f} "
                f"(compute-bound rate at {cap['power_limit_w']:g} W: {cap['source'].split(':')[0]}), "
                f"memory-bound x{cap['bandwidth_ratio']:.3f}" + extra)
    if meta.get("derived_from"):
        return f"datasheet: {meta['derived_from']}'s fits scaled by datasheet FLOP/s and bandwidth" + extra
    return "origin not recorded" + extra


def origin_word(profile) -> str:
    """One word of :func:`profile_origin`: measured, datasheet or unknown."""
    meta = profile.meta
    return "measured" if meta.get("fitted_from") else "datasheet" if meta.get("derived_from") else "unknown"
