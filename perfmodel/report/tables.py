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


# what each memory term holds at the step's peak (costs/memory.py, docs/memory.md)
MEMORY_WORDS = {
    "weights": "fp32 master weights", "weight_copies": "16-bit weight copies autocast keeps for the step",
    "optimizer": "optimizer states", "gradients": "gradients alive at the peak",
    "activations": "activations saved for backward",
    "loss": "cross-entropy over tokens × vocab (a CNN: samples × classes): what its backward holds "
            "(eager: 3 fp32 tensors; fused: 4 B a logit)",
    "comm_buffers": "communication buckets and gather buffers", "recompute": "one layer's recomputed activations",
}
# each optimizer's states in words (costs/optimizers.py MOMENTS)
OPTIMIZER_WORDS = {"adamw": "AdamW: two fp32 moments", "sgd": "SGD: an fp32 momentum buffer",
                   "rmsprop": "RMSprop: fp32 square average and momentum buffer"}


def memory_words(key: str, strategy) -> str:
    """What memory term ``key`` holds, in words, under ``strategy`` (its optimizer names its states)."""
    words = MEMORY_WORDS.get(key, "")
    if key == "optimizer" and strategy.optimizer in OPTIMIZER_WORDS:
        states = strategy.optimizer_states
        return f"{words} ({OPTIMIZER_WORDS[strategy.optimizer]})" + (f", kept as {states!r}" if states else "")
    return words


def _profile_words(p) -> str:
    """The profile's name and where its numbers come from (measured or datasheet), said once."""
    origin = getattr(p, "profile_origin", "")
    if not origin:
        return p.profile
    name = p.profile.removesuffix(" (datasheet)") if origin.startswith("datasheet") else p.profile
    return f"{name} ({origin})"


def prediction_table(p) -> str:
    """A readable multi-line summary of one Prediction."""
    s = p.strategy
    lines = [
        f"model      {p.model}",
        f"cluster    {p.cluster}",
        f"strategy   dp={s.dp} tp={s.tp} pp={s.pp} micro_batch={s.micro_batch} global_batch={s.batch} "
        f"zero={s.shard} recompute={s.recompute} precision={s.precision} optimizer={s.optimizer}"
        + _non_default(s),
        f"profile    {_profile_words(p)}",
        *(f"caveat     {c}" for c in getattr(p, "caveats", ())),
        "",
        f"step time        {format_seconds(p.step_time)}   (interval {format_seconds(p.interval[0])} – {format_seconds(p.interval[1])}, "
        f"{p.interval_level:.0%}, {p.interval_regime}) — {p.interval_kind}",
        # a model without a sequence (a CNN) has no tokens: its rate is samples (images) alone, as repr() says
        *([f"tokens/s         {p.tokens_per_second:,.0f}"] if p.tokens_per_second != p.samples_per_second else []),
        f"samples/s        {p.samples_per_second:,.2f}",
        f"TFLOP/s per GPU  {p.tflops_per_gpu:.1f}   (executed FLOPs, recomputation included)",
        f"MFU              {p.mfu:.1%}   (model FLOPs over peak: recomputation not counted)",
        f"peak memory      {format_bytes(p.peak_memory)} of {format_bytes(p.memory_capacity)}"
        + (f" ({getattr(p, 'memory_headroom', 0.0):.0%} kept free)" if getattr(p, "memory_headroom", 0.0) else "")
        + ("" if p.fits else f"   DOES NOT FIT (over by {format_bytes(p.over_capacity)})")
        + f"   (interval {format_bytes(p.memory_interval[0])} – {format_bytes(p.memory_interval[1])}, "
          f"{p.interval_level:.0%}, {p.memory_interval_regime})",
        f"reserved         {format_bytes(p.reserved_memory)} (caching allocator; peak memory is allocated)",
        f"bottleneck       {p.bottleneck}",
        "",
        "time breakdown (per step)",
    ]
    lag = getattr(p, "slowest_device_lag", 0.0)
    if lag > 0:
        lines[-1] += (f"   (kernels {lag:.1%} slower than one GPU's: the slowest of the {s.gpus:,} GPUs sets the pace, "
                      "docs/distributed.md)")
    total = max(p.step_time, 1e-30)
    for key, value in p.breakdown.items():
        if value > 1e-6 * total:  # rounding residue of a term that is zero
            lines.append(f"  {key:<16} {format_seconds(value):>12}  {value / total:6.1%}")
    lines.append("memory breakdown (per GPU)")
    for key, value in p.memory.items():
        if value > 0:
            lines.append(f"  {key:<16} {format_bytes(value):>12}  {memory_words(key, s)}".rstrip())
    return "\n".join(lines)


CV_TARGET = 0.08  # CV MAPE a class should reach: GEMMs >= 1 GFLOP, memory-bound ops >= 1 MiB, attention
REPORT_WIDTH = 100  # characters per fit-report line


def fit_target_summary(report: pd.DataFrame, target: float = CV_TARGET) -> str:
    """How many cross-validated classes (collectives included) reach ``target``, which do not, and how
    many are fallbacks; wrapped to lines of at most REPORT_WIDTH characters."""
    import textwrap

    scored = report.dropna(subset=["cv_mape"])
    over = scored[scored["cv_mape"] > target]
    line = f"CV MAPE <= {target:.0%}: {len(scored) - len(over)} of {len(scored)} cross-validated classes"
    if len(over):
        line += "; above it: " + ", ".join(f"{c} {v:.1%}" for c, v in zip(over["class"], over["cv_mape"]))
    fallbacks = int(report["form"].astype(str).str.startswith("(").sum())
    if fallbacks:
        line += f"; {fallbacks} not fitted from these tables (fallbacks)"
    return "\n".join(textwrap.wrap(line, REPORT_WIDTH, subsequent_indent="  "))


def _origin(form: str) -> tuple[str, str]:
    """(form shown, where the class comes from) of one report row."""
    if form.startswith("("):  # "(bundled fallback)", "(datasheet fallback)", "(not fitted: ...)"
        return "-", form.strip("()")
    return form, "fitted"


def _runner_up(candidates, chosen: str) -> str:
    if not isinstance(candidates, dict):
        return ""
    rest = sorted((v, k) for k, v in candidates.items() if k != chosen and v is not None and v == v)
    return f"; 2nd {rest[0][1]} {rest[0][0]:.1%}" if rest else ""


def fit_report_table(report: pd.DataFrame) -> str:
    """One line per class and collective fitted from the tables: points, chosen form, CV MAPE, fit MAPE
    (and the runner-up form's CV MAPE); then the classes taken from elsewhere, listed by fallback."""
    import textwrap

    def pct(v):
        return "-" if v is None or pd.isna(v) else f"{v:.1%}"

    rows, fallbacks = [], {}
    for r in report.to_dict("records"):
        form, origin = _origin(str(r["form"]))
        if origin != "fitted":
            fallbacks.setdefault(origin, []).append(str(r["class"]))
            continue
        origin += _runner_up(r.get("candidates"), form)
        rows.append([str(r["class"]), str(int(r["points"])), form, pct(r["cv_mape"]), pct(r.get("fit_mape")), origin])
    head = ["class", "points", "form", "cv_mape", "fit_mape", "from"]
    widths = [max(len(x[i]) for x in [head, *rows]) for i in range(5)]
    def line(cells):
        left = [cells[0].ljust(widths[0]), cells[1].rjust(widths[1]), cells[2].ljust(widths[2]),
                cells[3].rjust(widths[3]), cells[4].rjust(widths[4])]
        text = "  ".join(left) + "  " + cells[5]
        return text if len(text) <= REPORT_WIDTH else text[:REPORT_WIDTH - 3] + "..."

    out = [line(c) for c in [head, *rows]] if rows else ["no class fitted from these tables"]
    for origin, classes in fallbacks.items():
        out += textwrap.wrap(f"{origin} ({len(classes)}, not measured here): " + ", ".join(classes), REPORT_WIDTH,
                             subsequent_indent="  ")
    return "\n".join(out)


def kernel_table(df: pd.DataFrame, rows: int = 12) -> str:
    """``analysis.kernel_breakdown``'s largest rows and the share of each class, as text."""
    a = df.attrs
    what = f"the busiest stage ({a['blocks']:g} blocks" if a.get("blocks") else "the traced graph (its whole step"
    head = (f"kernels of {what} x {a.get('micro_batches', 1):g} micro-batches per step; each kernel priced alone on "
            f"{a.get('profile', '')}; launches per block or part and micro-batch)")
    lines = [head, f"  {'part':<14} {'phase':<9} {'class':<18} {'launches':>8} {'GPU/step':>10} {'host/step':>10} {'share':>6}"]
    for _, r in df.head(rows).iterrows():
        lines.append(f"  {r['part']:<14} {r['phase']:<9} {r['class']:<18} {r['launches']:>8g} "
                     f"{format_seconds(r['gpu_s_per_step']):>10} {format_seconds(r['cpu_s_per_step']):>10} {r['share']:>6.1%}")
    if len(df) > rows:
        rest = df.iloc[rows:]
        lines.append(f"  ... {len(rest)} more rows, {rest['share'].sum():.1%} of the kernel time")
    shares = df.groupby("class")["share"].sum().sort_values(ascending=False)
    lines.append("by class: " + ", ".join(f"{k} {v:.1%}" for k, v in shares.items() if v >= 0.005))
    return "\n".join(lines)
