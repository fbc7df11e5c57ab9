"""Histogram of simulated training times, for reports."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from perfmodel.errors import InvalidInputError

SECONDS_PER_HOUR = 3600.0


def plot_time_distribution(trials, path, *, on_demand_s=None, title=None) -> Path:
    """Write a histogram of trial times (seconds, shown in hours) to ``path``; return it.

    Marks the mean and the 50th/90th/99th percentiles, and the on-demand time
    when ``on_demand_s`` is given. Renders with matplotlib's Agg canvas
    (no display, no change to the global backend); the format follows the suffix.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    times = np.asarray(trials, dtype=float).ravel()
    if times.size == 0 or not np.all(np.isfinite(times)) or np.any(times < 0):
        raise InvalidInputError("'trials' must be a non-empty array of finite times >= 0 (s): "
                                f"got {times.size} values")
    hours = times / SECONDS_PER_HOUR
    fig = Figure(figsize=(7, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.hist(hours, bins=min(60, max(10, int(np.sqrt(hours.size)))), color="tab:blue", alpha=0.7)
    marks = {"mean": hours.mean(), **dict(zip(("p50", "p90", "p99"),
                                              np.percentile(hours, [50, 90, 99])))}
    for (label, value), style in zip(marks.items(), ("-", "--", "-.", ":")):
        ax.axvline(value, color="black", linestyle=style, label=f"{label} {value:.3g} h")
    if on_demand_s is not None:
        ax.axvline(on_demand_s / SECONDS_PER_HOUR, color="tab:red",
                   label=f"on-demand {on_demand_s / SECONDS_PER_HOUR:.3g} h")
    ax.set_xlabel("time to train (hours)")
    ax.set_ylabel("trials (count)")
    ax.set_title(title or f"Simulated time to train ({times.size} trials)")
    ax.legend()
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path
