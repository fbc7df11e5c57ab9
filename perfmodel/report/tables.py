"""Plain-text tables for predictions and fit reports."""

from __future__ import annotations

import dataclasses

import pandas as pd

from perfmodel.core.units import format_bytes, format_seconds


def _non_default(s) -> str:
    """The strategy fields not already on the line that differ from their defaults."""
    shown = {"dp", "tp", "pp", "micro_batch", "global_batch", "zero", "recompute", "precision", "optimizer"}
    extra = [f"{f.name}={_short(getattr(s, f.name))}" for f in dataclasses.fields(s)
             if f.name not in shown and getattr(s, f.name) != f.default]
    return (" " + " ".join(extra)) if extra else ""


def _short(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def prediction_table(p) -> str:
    """A readable multi-line summary of one Prediction."""
    s = p.strategy
    lines = [
        f"model      {p.model}",
        f"cluster    {p.cluster}",
        f"strategy   dp={s.dp} tp={s.tp} pp={s.pp} micro_batch={s.micro_batch} global_batch={s.batch} "
        f"zero={s.shard} recompute={s.recompute} precision={s.precision} optimizer={s.optimizer}"
        + _non_default(s),
        f"profile    {p.profile}",
        "",
        f"step time        {format_seconds(p.step_time)}   (interval {format_seconds(p.interval[0])} – {format_seconds(p.interval[1])}, "
        f"{p.interval_level:.0%}, {p.interval_regime})",
        f"tokens/s         {p.tokens_per_second:,.0f}",
        f"samples/s        {p.samples_per_second:,.2f}",
        f"TFLOP/s per GPU  {p.tflops_per_gpu:.1f}",
        f"MFU              {p.mfu:.1%}",
        f"peak memory      {format_bytes(p.peak_memory)} of {format_bytes(p.memory_capacity)}"
        + ("" if p.fits else f"   DOES NOT FIT (over by {format_bytes(p.over_capacity)})"),
        f"reserved         {format_bytes(p.reserved_memory)} (caching allocator; peak memory is allocated)",
        f"bottleneck       {p.bottleneck}",
        "",
        "time breakdown (per step)",
    ]
    total = max(p.step_time, 1e-30)
    for key, value in p.breakdown.items():
        if value > 1e-6 * total:  # rounding residue of a term that is zero
            lines.append(f"  {key:<16} {format_seconds(value):>12}  {value / total:6.1%}")
    lines.append("memory breakdown (per GPU)")
    for key, value in p.memory.items():
        if value > 0:
            lines.append(f"  {key:<16} {format_bytes(value):>12}")
    return "\n".join(lines)


CV_TARGET = 0.08  # CV MAPE a class should reach: GEMMs >= 1 GFLOP, memory-bound ops >= 1 MiB, attention


def fit_target_summary(report: pd.DataFrame, target: float = CV_TARGET) -> str:
    """One line: how many cross-validated classes reach ``target`` and which do not."""
    scored = report.dropna(subset=["cv_mape"])
    over = scored[scored["cv_mape"] > target]
    line = f"CV MAPE <= {target:.0%}: {len(scored) - len(over)} of {len(scored)} cross-validated classes"
    if len(over):
        line += "; above it: " + ", ".join(f"{c} {v:.1%}" for c, v in zip(over["class"], over["cv_mape"]))
    return line


def fit_report_table(report: pd.DataFrame) -> str:
    """class, points, chosen form, CV MAPE and the candidates' CV MAPE."""
    df = report.copy()
    df["cv_mape"] = df["cv_mape"].map(lambda v: "n/a" if pd.isna(v) else f"{v:.1%}")
    if "fit_mape" in df:
        df["fit_mape"] = df["fit_mape"].map(lambda v: "" if v is None or pd.isna(v) else f"{v:.1%}")
    if "candidates" in df:
        df["candidates"] = df["candidates"].map(
            lambda c: ", ".join(f"{k} {v:.1%}" for k, v in c.items() if v == v) if isinstance(c, dict) else "")
    return df.to_string(index=False)
