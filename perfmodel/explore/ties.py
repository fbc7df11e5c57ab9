"""Ranking under uncertainty: which candidates are tied with the best within the model's error.

Two candidates are tied when the interval of the ranking metric of one overlaps the
best's (each from ``Prediction.interval`` at its stated level). The errors of two
configurations of one model on one profile are correlated, so overlap of the two
marginal intervals is the cautious test: it calls a tie whenever the model could not
tell them apart. docs/accuracy.md.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# metrics proportional to 1 / step time (larger is better) and to the step time (smaller is better)
RATE_METRICS = ("tokens_per_second", "samples_per_second", "tflops_per_gpu", "mfu")
TIME_METRICS = ("step_time", "usd_per_million_tokens")


def metric_bounds(df: pd.DataFrame, column: str):
    """(low, high) of ``column`` per row from the step-time interval; None for a metric without one."""
    if column not in df.columns or "step_time_low" not in df.columns:
        return None
    value, step = df[column].astype(float), df["step_time"].astype(float)
    if column in RATE_METRICS:
        return value * step / df["step_time_high"], value * step / df["step_time_low"]
    if column in TIME_METRICS:
        return value * df["step_time_low"] / step, value * df["step_time_high"] / step
    return None


def tied_with(df: pd.DataFrame, best, column: str) -> np.ndarray:
    """True for the rows whose ``column`` interval overlaps that of row ``best`` (an index label)."""
    found = metric_bounds(df, column)
    if found is None or best is None:
        return np.zeros(len(df), dtype=bool)
    low, high = found
    return ((low <= high[best]) & (high >= low[best])).to_numpy().copy()


def mark_ties(df: pd.DataFrame, best, column: str, *, candidates=None) -> pd.DataFrame:
    """Add a boolean ``tie`` column (rows within the model's error of ``best``, itself included) and
    ``attrs["ties"]``: how many candidates tie, 1 when the best stands alone, None when ``column``
    has no interval."""
    tie = tied_with(df, best, column)
    if candidates is not None:
        tie &= np.asarray(candidates, dtype=bool)
    df["tie"] = tie
    # None: the column has no interval (memory, a breakdown term), so ties were not assessed
    df.attrs["ties"] = int(tie.sum()) if metric_bounds(df, column) is not None else None
    df.attrs["ties_by"] = column
    return df


def tie_line(df: pd.DataFrame, labels) -> str:
    """One printed line saying whether the best is distinguishable from the next candidates."""
    n = df.attrs.get("ties")
    if n is None:
        return f"{df.attrs.get('ties_by', 'this column')} has no interval: ties not assessed"
    if n <= 1:
        return "the best candidate's interval overlaps no other's: a clear winner within the model's error"
    level = df["interval_level"].iloc[0] if "interval_level" in df.columns else float("nan")
    names = ", ".join(str(x) for x in list(labels)[:5]) + (" ..." if n > 5 else "")
    return (f"tie: {n} candidates' {level:.0%} intervals overlap the best's, the model cannot rank them: "
            f"{names}")
