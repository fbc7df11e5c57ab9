"""Tables of compare / sweep / search results: aligned text for people, CSV, JSON or Markdown files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from perfmodel.core.errors import InvalidInputError
from perfmodel.core.units import format_seconds
from perfmodel.parallel.zero_bubble import ZERO_BUBBLE

FORMATS = (".csv", ".json", ".md")


def _gib(x) -> str:
    return f"{x / 2**30:.1f} GiB"


def _count(x) -> str:
    return f"{x:,.0f}"


def _pct(x) -> str:
    return f"{x:.1%}"


def _flag(x) -> str:
    return "yes" if bool(x) else "NO"


def _usd(x) -> str:
    return f"${x:,.2f}"


# column -> (header, formatter); the shown order follows the caller's list
SHOWN = {
    "label": ("strategy", str), "dp": ("dp", str), "tp": ("tp", str), "pp": ("pp", str),
    "virtual_stages": ("v", str), "micro_batch": ("mb", str), "micro_batches": ("m", str),
    "global_batch": ("batch", str), "zero": ("zero", str), "recompute": ("recompute", str),
    "sequence_parallel": ("sp", lambda x: "sp" if bool(x) else "-"), "precision": ("precision", str),
    "gpus": ("GPUs", _count), "nodes": ("nodes", _count), "seq": ("seq", str), "gpu": ("gpu", str),
    "step_time": ("step", format_seconds), "tokens_per_second": ("tokens/s", _count),
    "tflops_per_gpu": ("TFLOP/s/GPU", lambda x: f"{x:.1f}"), "mfu": ("MFU", _pct),
    "scaling_efficiency": ("scaling eff.", _pct), "speedup": ("speed-up", lambda x: f"{x:.2f}x"),
    "peak_memory": ("memory/GPU", _gib), "memory_capacity": ("capacity", _gib), "fits": ("fits", _flag),
    "usd_per_hour": ("$/hour", _usd), "usd_per_million_tokens": ("$/M tokens", lambda x: f"${x:,.3f}"),
    "bottleneck": ("bottleneck", str), "interval": ("interval", str), "caveat": ("caveat", str),
    "model": ("model", str), "cluster": ("cluster", str), "stack": ("stack", str),
}
# CSV / JSON column names with their unit where the name alone does not say it
UNITS = {"step_time": "step_time_s", "peak_memory": "peak_memory_bytes", "memory_capacity": "memory_capacity_bytes",
         "over_capacity": "over_capacity_bytes", "usd_per_hour": "usd_per_hour", "mfu": "mfu_fraction",
         "scaling_efficiency": "scaling_efficiency_fraction", "tflops_per_gpu": "executed_tflops_per_gpu",
         **{k: f"{k}_s" for k in ("forward", "backward", "optimizer", "host_overhead", "tp_comm", "dp_comm",
                                   "pipeline_bubble", "p2p")}}
CONTEXT = ("model", "cluster", "gpu")  # columns every export carries (from the table's attrs when absent)
# what a reader of an exported table needs to read TFLOP/s beside MFU
FLOPS_NOTE = ("TFLOP/s/GPU counts executed FLOPs (recomputation included); MFU counts model FLOPs only "
              "(Narayanan et al. 2021 eq. 3, no recomputation) over the GPU's peak.")
READABLE = ("model", "cluster", "gpu", "label", "gpus", "dp", "tp", "pp", "micro_batch", "global_batch", "zero",
            "recompute", "step_time", "interval", "tokens_per_second", "tflops_per_gpu", "mfu",
            "scaling_efficiency", "speedup", "peak_memory", "fits", "usd_per_million_tokens", "bottleneck", "caveat")


def _cell(column: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    fmt = SHOWN.get(column, (column, str))[1]
    return fmt(value)


def with_intervals(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with an ``interval`` text column ("36.3 ms – 41.2 ms") where it holds interval_low_s/high_s."""
    if "interval_low_s" not in df.columns or "interval" in df.columns:
        return df
    df = df.copy()
    df["interval"] = [f"{format_seconds(lo)} – {format_seconds(hi)}" if lo == lo and hi == hi else "-"
                      for lo, hi in zip(df["interval_low_s"], df["interval_high_s"])]
    return df


def stack_label(row) -> str:
    """A search row's software stack in a few words: the framework, then what is not its default (a precision
    other than bf16 autocast, compile, FSDP's mode, the tensor-parallel overlap, a zero-bubble schedule, cp,
    activation offload; the fields ``search(fixed=...)`` held: bf16 gradients, optimizer states, fp8 parameters, a
    float8 recipe not the default; a MoE row's expert options), e.g. ``megatron fp8 userbuffers`` or
    ``torchtitan compile zbv``."""
    words = [str(row.get("framework", ""))]
    precision = str(row.get("precision", "bf16-mixed"))
    words += [] if precision == "bf16-mixed" else [precision.removesuffix("-mixed")]
    words += ["compile"] if bool(row.get("compile", False)) else []
    fsdp = row.get("fsdp")
    words += [f"fsdp-{fsdp}"] if isinstance(fsdp, str) and fsdp else []
    overlap = row.get("tp_comm_overlap")
    words += [overlap] if isinstance(overlap, str) and overlap else []
    schedule = str(row.get("schedule", ""))
    words += [schedule] if schedule in ZERO_BUBBLE else []
    cp, offload = int(row.get("cp", 1) or 1), int(row.get("offload_layers", 0) or 0)
    words += [f"cp{cp}"] if cp > 1 else []
    words += [f"offload{offload}"] if offload else []
    # the fields search(fixed=...) held, where a row has them
    words += ["grad-bf16"] if row.get("grad_reduce_fp32") is False or row.get("grad_reduce_fp32") == 0 else []
    states, recipe = row.get("optimizer_states"), row.get("float8_recipe")
    words += [f"states-{states}"] if isinstance(states, str) and states else []
    words += ["fp8-params"] if bool(row.get("fp8_params", False)) else []
    words += [recipe] if isinstance(recipe, str) and recipe and recipe not in ("tensorwise", "delayed") else []
    return " ".join(w for w in words + _expert_words(row) if w)


def _expert_words(row) -> list[str]:
    """A MoE row's expert options where set (None or NaN: the stack's default): the expert tensor-parallel size
    (``etp1``) and grouped or looped expert GEMMs."""
    etp, grouped = row.get("etp"), row.get("grouped_experts")
    words = [f"etp{int(etp)}"] if etp is not None and etp == etp else []
    if grouped is not None and grouped == grouped:
        words.append("grouped-experts" if bool(grouped) else "looped-experts")
    return words


def format_table(df: pd.DataFrame, columns, *, best_column: str | None = "best") -> str:
    """An aligned text table of ``columns`` (those present, each once), rows marked '*' where
    ``best_column`` is true; an ``interval`` column is made from interval_low_s/high_s."""
    df = with_intervals(df)
    columns = [c for c in dict.fromkeys(columns) if c in df.columns]
    headers = [""] + [SHOWN.get(c, (c, str))[0] for c in columns]
    marks = ["*" if best_column in df.columns and bool(b) else "" for b in df.get(best_column, [False] * len(df))]
    body = [[mark] + [_cell(c, row[c]) for c in columns] for mark, (_, row) in zip(marks, df.iterrows())]
    widths = [max(len(r[i]) for r in [headers, *body]) for i in range(len(headers))]
    left = {"label", "recompute", "precision", "bottleneck", "gpu", "caveat", "stack"}
    def line(cells):
        out = []
        for i, cell in enumerate(cells):
            name = columns[i - 1] if i else ""
            out.append(cell.ljust(widths[i]) if name in left or i == 0 else cell.rjust(widths[i]))
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in body)])


def with_context(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with model, cluster and GPU columns first (taken from ``attrs`` where the rows lack them)."""
    df = df.copy()
    for i, key in enumerate(c for c in CONTEXT if c not in df.columns and df.attrs.get(c)):
        df.insert(i, key, df.attrs[key])
    return df


def markdown(df: pd.DataFrame, columns=READABLE) -> str:
    """A GitHub Markdown table of the readable ``columns`` (formatted as the text table), and a note
    on TFLOP/s against MFU; the CSV and JSON exports keep every column at full precision."""
    df = with_intervals(with_context(df))
    columns = [c for c in columns if c in df.columns] or list(df.columns)
    head = "| " + " | ".join(SHOWN.get(c, (c, str))[0] for c in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    rows = ["| " + " | ".join(_cell(c, row[c]).replace("|", "\\|") for c in columns) + " |"
            for _, row in df.iterrows()]
    note = ["", FLOPS_NOTE] if "tflops_per_gpu" in columns or "mfu" in columns else []
    return "\n".join([head, rule, *rows, *note]) + "\n"


def write_table(df: pd.DataFrame, path) -> Path:
    """Write ``df`` as CSV, JSON (a list of records, with ``attrs`` under "meta") or Markdown, by suffix.

    CSV and JSON carry model, cluster and GPU columns and units in the column names (UNITS);
    Markdown is the readable subset (``markdown``)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise InvalidInputError(f"'--out' must end in one of {', '.join(FORMATS)}: got {str(path)!r}")
    if suffix == ".md":
        path.write_text(markdown(df))
        return path
    df = with_context(df).rename(columns=UNITS)
    if suffix == ".csv":
        df.to_csv(path, index=False)
    else:
        records = json.loads(df.to_json(orient="records"))
        meta = {k: v for k, v in df.attrs.items() if isinstance(v, (int, float, str, dict, list))}
        meta["notes"] = FLOPS_NOTE
        path.write_text(json.dumps({"rows": records, "meta": meta}, indent=1, default=str) + "\n")
    return path
