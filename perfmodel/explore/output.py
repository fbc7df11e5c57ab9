"""Tables of compare / sweep / search results: aligned text for people, CSV, JSON or Markdown files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from perfmodel.core.errors import InvalidInputError
from perfmodel.core.units import format_seconds

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
    "bottleneck": ("bottleneck", str),
}


def _cell(column: str, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    fmt = SHOWN.get(column, (column, str))[1]
    return fmt(value)


def format_table(df: pd.DataFrame, columns, *, best_column: str | None = "best") -> str:
    """An aligned text table of ``columns`` (those present), rows marked '*' where ``best_column`` is true."""
    columns = [c for c in columns if c in df.columns]
    headers = [""] + [SHOWN.get(c, (c, str))[0] for c in columns]
    marks = ["*" if best_column in df.columns and bool(b) else "" for b in df.get(best_column, [False] * len(df))]
    body = [[mark] + [_cell(c, row[c]) for c in columns] for mark, (_, row) in zip(marks, df.iterrows())]
    widths = [max(len(r[i]) for r in [headers, *body]) for i in range(len(headers))]
    left = {"label", "recompute", "precision", "bottleneck", "gpu"}
    def line(cells):
        out = []
        for i, cell in enumerate(cells):
            name = columns[i - 1] if i else ""
            out.append(cell.ljust(widths[i]) if name in left or i == 0 else cell.rjust(widths[i]))
        return "  ".join(out).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in body)])


def markdown(df: pd.DataFrame) -> str:
    """A GitHub Markdown table of every column, values as stored (floats to 6 significant digits)."""
    def cell(x):
        if isinstance(x, float):
            return f"{x:.6g}"
        return str(x).replace("|", "\\|")

    head = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    rows = ["| " + " | ".join(cell(x) for x in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *rows]) + "\n"


def write_table(df: pd.DataFrame, path) -> Path:
    """Write ``df`` as CSV, JSON (a list of records, with ``attrs`` under "meta") or Markdown, by suffix."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise InvalidInputError(f"'--out' must end in one of {', '.join(FORMATS)}: got {str(path)!r}")
    if suffix == ".csv":
        df.to_csv(path, index=False)
    elif suffix == ".json":
        records = json.loads(df.to_json(orient="records"))
        meta = {k: v for k, v in df.attrs.items() if isinstance(v, (int, float, str, dict, list))}
        path.write_text(json.dumps({"rows": records, "meta": meta}, indent=1, default=str) + "\n")
    else:
        path.write_text(markdown(df))
    return path
