"""Tidy measurement tables: the schema calibration writes and fitting reads.

``compute.csv`` has one row per measurement (blank where a column does not
apply); ``collectives.csv`` likewise. ``legacy_h200_to_tidy`` converts the
JSON-lines tables of the bundled H200 measurements into this schema.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.core.errors import InvalidInputError
from perfmodel.core.checks import read_text_file
from perfmodel.core.readers import MAX_TABLE_BYTES

COMPUTE_COLUMNS = (
    "op", "phase", "timing", "dtype", "m", "n", "k", "batch", "tokens", "hidden", "vocab",
    "heads", "kv_heads", "seq", "head_dim", "causal", "params", "fused", "bytes", "cin",
    "cout", "hw", "kernel", "stride", "groups", "layers", "time_s", "time_min_s", "time_p90_s", "reps", "inner",
    "start_s", "device",
)
# start_s: seconds from the start of the run to this case's first call (after its cool-down), so the
# load each row followed can be read from the table (the power state carries over between rows)
_MEASURED = ("time_s", "time_min_s", "time_p90_s", "reps", "inner", "start_s", "device")
#: What identifies a compute measurement: everything but the measured values.
COMPUTE_KEY_COLUMNS = tuple(c for c in COMPUTE_COLUMNS if c not in _MEASURED)


def twin_rows(left: pd.DataFrame, right: pd.DataFrame, *, ignore=(), suffix: str = "_twin") -> pd.DataFrame:
    """Rows of ``left`` beside their measurements of the same case in ``right`` (every key column
    but ``ignore``; blanks match blanks), ``right``'s measured columns suffixed."""
    keys = [k for k in COMPUTE_KEY_COLUMNS if k not in ignore and k in left.columns and k in right.columns]
    # a key that holds words on one side and only blanks (float NaN) on the other: compare both as objects
    mixed = [k for k in keys if left[k].dtype != right[k].dtype
             and not (pd.api.types.is_numeric_dtype(left[k]) and pd.api.types.is_numeric_dtype(right[k]))]
    if mixed:
        left, right = left.astype(dict.fromkeys(mixed, object)), right.astype(dict.fromkeys(mixed, object))
    return left.merge(right, on=keys, suffixes=("", suffix))


COLLECTIVE_COLUMNS = (
    "collective", "backend", "scope", "group_size", "nodes", "ranks_per_node", "size_bytes",
    "dtype", "time_s", "time_min_s", "algbw_GBps", "busbw_GBps", "reps", "world_size",
)


# compute.csv columns that hold words; every other column holds numbers (or is blank)
TEXT_COLUMNS = ("op", "phase", "timing", "dtype", "causal", "fused", "device")


# The sizes each op's fit reads (fit/compute.py, fit/conv.py): a row of that op without them, or with
# one <= 0, would reach the least-squares solver as NaN or a negative size
_ELEMENTWISE = ("tokens", "hidden")
OP_SIZES = {"gemm": ("m", "n", "k"), "bmm": ("m", "n", "k"), "sdpa": ("batch", "heads", "seq", "head_dim"),
            "adamw": ("params",), "conv2d": ("batch", "cin", "cout", "hw", "kernel", "stride"),
            **dict.fromkeys(("copy", "add", "scale", "sum", "h2d", "d2h"), ("bytes",)),
            "cross_entropy": ("tokens", "vocab"), "rope": ("batch", "heads", "seq", "head_dim"),
            **dict.fromkeys(("layernorm", "rmsnorm", "softmax", "gelu", "swiglu", "residual_add", "embedding"),
                            _ELEMENTWISE)}


def _bad_sizes(df: pd.DataFrame) -> dict:
    """Rows whose op lacks a size its fit needs, or has one <= 0, per reason."""
    bad = {}
    ops = df["op"].astype(str)
    for op, columns in OP_SIZES.items():
        rows = (ops == op).to_numpy()
        if not rows.any():
            continue
        for col in columns:
            values = pd.to_numeric(df[col], errors="coerce").to_numpy(float) if col in df else np.full(len(df), np.nan)
            bad[f"missing or non-positive {col} ({op})"] = rows & ~(np.isfinite(values) & (values > 0))
    return bad


MAX_ALGBW_BYTES_PER_S = 1e15


def clean_rows(df: pd.DataFrame, table: str = "compute") -> tuple[pd.DataFrame, dict[str, int]]:
    """Drop rows a fit must not see; return the kept rows (numeric columns as numbers) and a count
    per reason."""
    reasons: dict[str, int] = {}
    time = pd.to_numeric(df.get("time_s"), errors="coerce")
    bad = {"missing or non-numeric time_s": time.isna(),
           "non-positive time_s": time <= 0,
           "infinite time_s": np.isinf(time)}
    if table == "compute":
        df = df.copy()
        for col in (c for c in COMPUTE_COLUMNS if c not in TEXT_COLUMNS and c in df.columns):
            raw = df[col]
            numbers = pd.to_numeric(raw, errors="coerce")
            given = raw.notna() & (raw.astype(str).str.strip() != "")
            if col != "time_s":
                bad[f"non-numeric {col}"] = given & numbers.isna()
                bad[f"infinite {col}"] = np.isinf(numbers)
            df[col] = numbers
        if "op" in df:
            bad.update(_bad_sizes(df))
    if table == "collectives":
        size = pd.to_numeric(df.get("size_bytes"), errors="coerce")
        bad["missing or non-positive size_bytes"] = size.isna() | (size <= 0)
        # algbw = S / t above 1 PB/s is no link's (a 1e-300 s time written as a row): not a measurement
        bad["algbw above 1 PB/s"] = (size / time.where(time > 0)) > MAX_ALGBW_BYTES_PER_S
    drop = np.zeros(len(df), dtype=bool)
    for reason, mask in bad.items():
        mask = np.asarray(mask, dtype=bool) & ~drop
        if mask.any():
            reasons[reason] = int(mask.sum())
        drop |= mask
    return df.loc[~drop].reset_index(drop=True), reasons


def read_compute_table(path: str | Path) -> pd.DataFrame:
    """Read a ``compute.csv`` (or a folder holding one) and check its columns."""
    path = Path(path)
    if path.is_dir():
        path = path / "compute.csv"
    if not path.exists():
        raise InvalidInputError(f"'table' {str(path)!r} does not exist (expected a compute.csv or a folder with one)")
    text = read_text_file(path, field="table", expect="a compute.csv", max_bytes=MAX_TABLE_BYTES)
    try:
        df = pd.read_csv(io.StringIO(text))
    except pd.errors.EmptyDataError:
        raise InvalidInputError(f"'table' {str(path)!r} is empty (expected a header: {', '.join(COMPUTE_COLUMNS)})") from None
    except pd.errors.ParserError as exc:
        raise InvalidInputError(f"'table' {str(path)!r} is not a readable CSV: {str(exc).strip()}") from None
    missing = [c for c in ("op", "time_s") if c not in df.columns]
    if missing:
        raise InvalidInputError(f"{path.name} lacks columns {missing} (schema: {', '.join(COMPUTE_COLUMNS)})")
    for col in COMPUTE_COLUMNS:
        if col not in df.columns:
            df[col] = np.nan
    return df


def _dtype(value: str) -> str:
    return {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}.get(value, value)


def _fwd_fwdbwd(common: dict, rec: dict):
    """The forward and forward+backward rows of one record (``fwd_sec``, ``fwdbwd_sec``)."""
    yield {**common, "phase": "fwd", "time_s": rec["fwd_sec"]}
    yield {**common, "phase": "fwdbwd", "time_s": rec["fwdbwd_sec"]}


def _token_op_rows(op: str, rec: dict):
    """Rows of an ``<name>[_<dtype>]_<phase>`` record over tokens x hidden (norms, activations)."""
    base, phase = op.rsplit("_", 1)
    parts = base.split("_")
    dtype = parts[-1] if parts[-1] in ("fp32", "bf16") else _dtype(rec.get("dtype", "bf16"))
    name = "_".join(p for p in parts if p not in ("fp32", "bf16"))
    common = {"op": name, "phase": phase, "dtype": dtype, "tokens": rec["tokens"], "hidden": rec["hidden"]}
    if "eager_sec" in rec:
        yield {**common, "timing": "eager", "time_s": rec["eager_sec"]}
        if rec.get("graph_sec") is not None:
            yield {**common, "timing": "graph", "time_s": rec["graph_sec"]}
    else:
        yield {**common, "timing": "eager", "time_s": rec["sec"], "time_min_s": rec.get("sec_min"),
               "inner": rec.get("inner")}


def _rows_from_legacy(rec: dict):
    op = rec.get("op")
    if op is None or op in ("bmm", "gemm_misaligned"):  # gemm.jsonl rows carry no op
        yield {"op": "bmm" if op == "bmm" else "gemm", "phase": "fwd", "timing": "eager",
               "dtype": rec["dtype"], "m": rec["m"], "n": rec["n"], "k": rec["k"],
               "batch": rec.get("batch"), "time_s": rec["sec"], "time_min_s": rec.get("sec_min"),
               "reps": rec.get("reps"), "inner": rec.get("inner")}
        return
    if op in ("copy", "add", "scale", "sum"):
        yield {"op": op, "phase": "fwd", "timing": "eager", "dtype": "fp32", "bytes": rec["moved"],
               "time_s": rec["sec"], "time_min_s": rec.get("sec_min"), "inner": rec.get("inner")}
    elif op in ("h2d_pinned", "d2h_pinned", "h2d_pageable"):
        kind, pin = op.split("_")
        yield {"op": kind, "phase": "fwd", "timing": "eager", "dtype": pin, "bytes": rec["bytes"],
               "time_s": rec["sec"]}
    elif op.endswith(("_fwd", "_fwdbwd")) and "tokens" in rec:
        yield from _token_op_rows(op, rec)
    elif op == "residual_add_fp32":
        common = {"op": "residual_add", "phase": "fwd", "dtype": "fp32", "tokens": rec["tokens"], "hidden": rec["hidden"]}
        yield {**common, "timing": "eager", "time_s": rec["eager_sec"]}
        yield {**common, "timing": "graph", "time_s": rec["graph_sec"]}
    elif op == "sdpa":
        common = {"op": "sdpa", "timing": "eager", "dtype": "bf16", "batch": rec["batch"],
                  "heads": rec["heads"], "kv_heads": rec.get("kv_heads", rec["heads"]),
                  "seq": rec["seq"], "head_dim": rec["head_dim"], "causal": bool(rec["causal"])}
        yield from _fwd_fwdbwd(common, rec)
    elif op == "conv2d":
        common = {"op": "conv2d", "timing": "eager", "dtype": "bf16", "batch": rec["batch"], "cin": rec["cin"],
                  "cout": rec["cout"], "hw": rec["hw"], "kernel": rec["k"], "stride": rec["stride"]}
        yield from _fwd_fwdbwd(common, rec)
    elif op == "adamw_step":
        yield {"op": "adamw", "phase": "step", "timing": "eager", "dtype": "fp32", "params": rec["params"],
               "fused": bool(rec["fused"]), "time_s": rec["sec"]}
    elif op == "cross_entropy_fp32":
        common = {"timing": "eager", "tokens": rec["tokens"], "vocab": rec["vocab"]}
        yield {**common, "op": "cast_bf16_to_fp32", "phase": "fwd", "dtype": "fp32",
               "bytes": rec["tokens"] * rec["vocab"] * 6, "time_s": rec["cast_bf16_to_fp32_sec"]}
        yield {**common, "op": "cross_entropy", "phase": "fwd", "dtype": "fp32", "time_s": rec["fwd_sec"]}
        yield {**common, "op": "cross_entropy", "phase": "fwdbwd", "dtype": "fp32", "time_s": rec["fwdbwd_sec"]}
    elif op == "cast":
        elems = rec["fp32_bytes"] // 4
        for name, key in (("cast_fp32_to_bf16", "fp32_to_bf16_sec"), ("cast_bf16_to_fp32", "bf16_to_fp32_sec")):
            yield {"op": name, "phase": "fwd", "timing": "eager", "dtype": "fp32", "bytes": elems * 6,
                   "time_s": rec[key]}
    elif op == "rope":
        common = {"op": "rope", "timing": "eager", "dtype": "bf16", "batch": rec["batch"], "heads": rec["heads"],
                  "seq": rec["seq"], "head_dim": rec["head_dim"]}
        yield from _fwd_fwdbwd(common, rec)
    elif op == "embedding":
        common = {"op": "embedding", "timing": "eager", "dtype": "fp32", "tokens": rec["tokens"],
                  "vocab": rec["vocab"], "hidden": rec["hidden"]}
        yield from _fwd_fwdbwd(common, rec)
    elif op in ("add_tiny", "mm_tiny"):
        name = "launch_add" if op == "add_tiny" else "launch_mm"
        yield {"op": name, "phase": "fwd", "timing": "eager", "time_s": rec["eager_sec"]}
        yield {"op": name, "phase": "fwd", "timing": "graph", "time_s": rec["graph_sec"]}


def legacy_h200_to_tidy(folder: str | Path) -> pd.DataFrame:
    """Convert the H200 JSON-lines microbenchmarks (not ``train_dev``) to ``compute.csv`` rows."""
    rows = []
    for name in ("gemm.jsonl", "mem.jsonl", "ops.jsonl", "micro2.jsonl", "h2d.jsonl"):
        for line in Path(folder, name).read_text().splitlines():
            if line.strip():
                rows.extend(_rows_from_legacy(json.loads(line)))
    df = pd.DataFrame(rows)
    for col in COMPUTE_COLUMNS:
        if col not in df.columns:
            df[col] = np.nan
    df["device"] = "NVIDIA H200"
    return df[list(COMPUTE_COLUMNS)]


# Rows one fit takes: a calibration run writes ~1,500; past this, memory and time of the candidate
# fits and cross-validation grow faster than the table, so repeats are merged and the rest sampled
MAX_FIT_ROWS = 20_000


def bound_rows(df: pd.DataFrame, *, seed: int = 0, limit: int = MAX_FIT_ROWS) -> tuple[pd.DataFrame, dict[str, int]]:
    """At most ``limit`` rows: repeated measurements of one case merged into their median first, then an
    even sample of each op's rows. Returns the rows and what was done, as counts by reason."""
    if len(df) <= limit:
        return df, {}
    done = {}
    keys = [c for c in COMPUTE_KEY_COLUMNS if c in df.columns]
    how = {c: "median" if pd.api.types.is_numeric_dtype(df[c]) else "first" for c in _MEASURED if c in df.columns}
    merged = df.groupby(keys, dropna=False, sort=False).agg(how).reset_index()
    if len(merged) < len(df):
        done[f"repeats merged into their median (over {limit:,} rows)"] = len(df) - len(merged)
    if len(merged) > limit:
        frac = limit / len(merged)
        sampled = merged.groupby("op", group_keys=False, sort=False).sample(frac=frac, random_state=seed)
        done[f"sampled out (over {limit:,} distinct cases)"] = len(merged) - len(sampled)
        merged = sampled
    return merged.reset_index(drop=True), done
