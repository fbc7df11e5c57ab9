"""Plots for reports: the spread of simulated training times; cost and time against cluster mix."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from perfmodel.core.errors import InvalidInputError
from perfmodel.core.extras import optional_import

SECONDS_PER_HOUR = 3600.0


def plot_time_distribution(trials, path, *, on_demand_s=None, title=None) -> Path:
    """Write a histogram of trial times (seconds, shown in hours) to ``path``; return it.

    Marks the mean and the 50th/90th/99th percentiles, and the on-demand time
    when ``on_demand_s`` is given. Renders with matplotlib's Agg canvas
    (no display, no change to the global backend); the format follows the suffix.
    """
    optional_import("matplotlib", extra="plot", feature="plots")
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


def plot_cost_vs_mix(df, path, *, label="mix", title=None) -> Path:
    """Write bars of expected spot cost vs on-demand cost per row of ``df``, times on a second axis.

    ``df``: one row per cluster mix with columns ``label`` (the x tick),
    ``expected_cost_usd`` and ``expected_time_s`` (spot), ``on_demand_cost_usd``
    and, optionally, ``on_demand_time_s`` — the columns of
    :func:`~perfmodel.analysis.transient.plan_training` rows, so one spot row per mix
    (with a ``mix`` column added) plots directly. Costs in US dollars, times in
    hours. Agg canvas; the format follows the suffix. Returns the path.
    """
    optional_import("matplotlib", extra="plot", feature="plots")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    need = [label, "expected_cost_usd", "on_demand_cost_usd", "expected_time_s"]
    missing = [c for c in need if c not in getattr(df, "columns", ())]
    if missing or len(df) == 0:
        raise InvalidInputError(f"'df' must be a non-empty DataFrame with columns {need}: "
                                f"missing {missing}, {len(getattr(df, 'index', ()))} rows")
    x = np.arange(len(df))
    fig = Figure(figsize=(max(6.0, 1.4 * len(df) + 2), 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.bar(x - 0.2, df["expected_cost_usd"], 0.4, color="tab:blue", label="spot cost (expected)")
    ax.bar(x + 0.2, df["on_demand_cost_usd"], 0.4, color="tab:gray", label="on-demand cost")
    ax.set_xticks(x, [str(v) for v in df[label]], rotation=20, ha="right")
    ax.set_xlabel(label)
    ax.set_ylabel("expected cost (US$)")
    right = ax.twinx()
    right.plot(x, df["expected_time_s"] / SECONDS_PER_HOUR, "o-", color="tab:red", label="spot time (expected)")
    if "on_demand_time_s" in df.columns:
        right.plot(x, df["on_demand_time_s"] / SECONDS_PER_HOUR, "s--", color="black", label="on-demand time")
    right.set_ylabel("time to train (hours)")
    hours = [df["expected_time_s"].max()] + ([df["on_demand_time_s"].max()] if "on_demand_time_s" in df else [])
    right.set_ylim(0, 1.15 * max(hours) / SECONDS_PER_HOUR)
    ax.set_ylim(0, 1.15 * max(df["expected_cost_usd"].max(), df["on_demand_cost_usd"].max()))
    handles = [h for a in (ax, right) for h in a.get_legend_handles_labels()[0]]
    fig.legend(handles, [h.get_label() for h in handles], loc="outside lower center", ncols=2,
               fontsize="small")
    ax.set_title(title or "Cost and time to train by cluster mix")
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path
