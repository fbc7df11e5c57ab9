"""Fit collective tables (collectives.csv, nccl-tests logs) into profile entries.

Run ``python -m perfmodel.fit.comm`` to refit the packaged nccl-tests
all_reduce curves and print their cross-validated errors; add ``--write`` to
rewrite the bundled entries ``perfmodel/profiles/data/nvlink_allreduce_*.json``.

Each (fabric level, collective) is fitted in bus-bandwidth terms
(nccl-tests doc/PERFORMANCE.md), ``t = alpha(n) + S factor(n) / busbw(S)``,
with every candidate form compared by k-fold cross-validation (scikit-learn
``KFold``) on the relative error of the time; the best form is refitted on all
points. Rows are pooled over group sizes: busbw does not depend on n.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.core.entry import run_command
from perfmodel.costs.comm import BUSBW_FACTOR, COLLECTIVES, COMM_FORMS
from perfmodel.core.errors import InvalidInputError
from perfmodel.fit import regression
from perfmodel.forms.registry import FORMS
from perfmodel.profiles import datasheet
from perfmodel.profiles.datasheet import profile_entry
from perfmodel.fit.regression import Free
from perfmodel.core.checks import check_choice, check_int

TABLE_COLUMNS = (
    "collective", "backend", "scope", "group_size", "nodes", "ranks_per_node", "size_bytes",
    "dtype", "time_s", "time_min_s", "algbw_GBps", "busbw_GBps", "reps", "world_size",
)
REQUIRED_COLUMNS = ("collective", "group_size", "size_bytes", "time_s")
MIN_DISTINCT_SIZES = 4
FIT_LEVELS = ("intra", "inter", "world")
# packaged copies of public nccl-tests results (each row names its source)
REFERENCE_ALLREDUCE = "nccl_allreduce_busbw_single_node.csv"
BUNDLED_SYSTEMS = {"a100": "Azure ND A100 v4", "h100": "Azure ND H100 v5", "h200": "Azure ND H200 v5",
                   "gb200": "Azure ND GB200 v6"}
SYSTEM_ALIASES = {"dgx-a100": "a100", "dgx-h100": "h100", "hgx-h200": "h200", "gb200-nvl72": "gb200"}
ALGORITHM_NOTE = {  # which NCCL algorithm the curve shows (source column of the CSV)
    "a100": "ring/tree (A100 has no NVLink SHARP)",
    "h100": "NVLS (NVLink SHARP in-switch reduction; a ring reaches ~370 GB/s, NVIDIA/nccl-tests#212)",
    "h200": "NVLS (NVLink SHARP in-switch reduction; a ring reaches ~370 GB/s, NVIDIA/nccl-tests#212)",
    "gb200": "ring (as the Azure file states), 4 GPUs of one NVL72 domain",
}


# --- parameter fitting ----------------------------------------------------------------------


def _free(form: str, size, n, factor, t) -> tuple[dict, dict]:
    """Free parameters (start, bounds) and fixed ones; the rank term only over several n."""
    busbw = size * factor / t
    free = {"alpha_s": Free(0.5 * t.min(), 1e-9, 1.0),
            "busbw_bytes_per_s": Free(busbw.max(), 1e3, 1e15)}
    fixed = {"alpha_rank_s": 0.0}
    if np.unique(n).size > 1:
        free["alpha_rank_s"], fixed = Free(1e-7, 1e-12, 1e-2), {}
    if form == "comm_logistic":
        half = size[np.argmin(np.abs(busbw - busbw.max() / 2))]  # where busbw reaches half its peak
        free.update(half_size_bytes=Free(half, 1.0, 1e14), exponent=Free(1.0, 0.05, 4.0))
    return free, fixed


def _variables(size, n, factor, t):
    size, n, factor, t = (np.asarray(a, dtype=float) for a in (size, n, factor, t))
    return {"size": size, "n": n, "factor": factor}, t


def fit_params(form: str, size, n, factor, t) -> dict[str, float]:
    """Parameters of ``form`` fitted to times ``t`` (relative error, perfmodel.fit.regression)."""
    check_choice("form", form, COMM_FORMS)
    X, t = _variables(size, n, factor, t)
    free, fixed = _free(form, X["size"], X["n"], X["factor"], t)
    return regression.fit_form(FORMS[form], X, t, free, fixed)


def cv_mape(form: str, size, n, factor, t, *, folds: int = 5, score_mask=None) -> float:
    """k-fold (shuffled, seed 0) CV MAPE of ``form`` on time; NaN if too few points."""
    check_choice("form", form, COMM_FORMS)
    X, t = _variables(size, n, factor, t)
    free, fixed = _free(form, X["size"], X["n"], X["factor"], t)
    folds = min(check_int("folds", folds, minimum=2), t.size)
    return regression.cross_validate(FORMS[form], X, t, free, fixed, folds=folds, score_mask=score_mask)


# --- table handling -------------------------------------------------------------------------


def _level(row) -> str | None:
    """Fabric level of a measurement: scope if it says intra/inter, else from where ranks sit."""
    if row.get("scope") in ("intra", "inter"):
        return row["scope"]
    if row.get("scope") == "cross-site":  # a WAN curve (perfmodel.hardware.sites), no level of a site
        return None
    nodes, group = row.get("nodes"), row.get("group_size")
    if nodes is None or pd.isna(nodes):
        return None
    if nodes == 1:
        return "intra"
    return "inter" if group == nodes else "world"  # one rank per node is a network measurement


def clean_table(table: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """Rows usable for fitting (with a ``level`` column) and ``{reason: count}`` of the rest."""
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise InvalidInputError(
            f"collective table lacks columns {missing} (needs {list(REQUIRED_COLUMNS)}; "
            f"schema: {', '.join(TABLE_COLUMNS)})"
        )
    df = table.copy()
    for col in ("size_bytes", "time_s", "group_size", "nodes"):
        if col in df.columns:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    df["level"] = [_level(r) for r in df.to_dict("records")]
    checks = [
        ("time_s missing or <= 0", ~(df["time_s"] > 0)),
        ("size_bytes missing or <= 0", ~(df["size_bytes"] > 0)),
        ("unknown collective", ~df["collective"].isin(COLLECTIVES)),
        ("group_size missing or < 2", ~(df["group_size"] >= 2)),
        ("fabric level unknown (no nodes, scope not intra/inter)", df["level"].isna()),
    ]
    rejected, bad = {}, np.zeros(len(df), dtype=bool)
    for reason, mask in checks:
        mask = mask.to_numpy() & ~bad
        if mask.any():
            rejected[reason] = int(mask.sum())
        bad |= mask
    return df[~bad].reset_index(drop=True), rejected


def _unfitted(rows: pd.DataFrame, source: str, rejected: dict, note: str) -> dict:
    sizes = rows["size_bytes"]
    return {
        "form": None, "params": {}, "cv_mape": None, "n_points": len(rows),
        "range_bytes": [float(sizes.min()), float(sizes.max())] if len(rows) else None,
        "source": source, "candidates": {}, "rejected": rejected, "note": note,
    }


def fit_collective(
    table: pd.DataFrame,
    collective: str,
    *,
    forms: Sequence[str] | None = None,
    folds: int = 5,
    source: str = "",
) -> dict:
    """Fit the rows of one collective (one fabric level) and return its profile entry.

    The entry carries the report keys ``candidates`` (form -> CV MAPE),
    ``rejected`` (reason -> row count) and ``note``; ``form`` is None when there
    are fewer than 4 distinct sizes (keep the datasheet entry then).
    """
    check_choice("collective", collective, COLLECTIVES)
    forms = tuple(COMM_FORMS if forms is None else forms)
    for form in forms:
        check_choice("form", form, COMM_FORMS)
    rows, rejected = clean_table(table)
    other = rows["collective"] != collective
    if other.any():
        rejected[f"collective is not {collective!r}"] = int(other.sum())
    rows = rows[~other]
    if rows["size_bytes"].nunique() < MIN_DISTINCT_SIZES:
        note = (f"{rows['size_bytes'].nunique()} distinct sizes (< {MIN_DISTINCT_SIZES}): "
                "not fitted; keep the datasheet entry")
        return _unfitted(rows, source, rejected, note)
    size, n, t = (rows[c].to_numpy(dtype=float) for c in ("size_bytes", "group_size", "time_s"))
    factor = BUSBW_FACTOR[collective](n)
    candidates = {f: cv_mape(f, size, n, factor, t, folds=folds) for f in forms}
    scored = [f for f in forms if np.isfinite(candidates[f])]
    if scored:
        best = min(scored, key=lambda f: candidates[f])
        note = f"{best} chosen by {min(folds, len(rows))}-fold CV MAPE on time"
    else:  # too few points to judge any form: the simplest one, unscored
        best = min(forms, key=lambda f: len(FORMS[f].params))
        note = f"{len(rows)} points: too few to cross-validate; {best} fitted unscored"
    return {
        "form": best,
        "params": fit_params(best, size, n, factor, t),
        "cv_mape": float(candidates[best]) if best in scored else None,
        "n_points": len(rows),
        "range_bytes": [float(size.min()), float(size.max())],
        "source": source,
        "candidates": {f: (float(v) if np.isfinite(v) else None) for f, v in candidates.items()},
        "rejected": rejected,
        "note": note,
    }


def fit_collectives(table: pd.DataFrame, *, source: str = "") -> dict[str, dict[str, dict]]:
    """Fit every (level, collective) in a table: ``{level: {collective: entry}}``.

    Level: ``scope`` "intra"/"inter" when given; else a group inside one node is
    "intra", a group with one rank per node "inter", and a group with several
    ranks on several nodes "world" (a check for ``hierarchical_time``, not an
    input to it). Entries that could not be fitted have ``form`` None.
    """
    rows, rejected = clean_table(table)
    if "backend" in rows.columns and rows["backend"].nunique() > 1:
        raise InvalidInputError(
            f"collective table mixes backends {sorted(rows['backend'].unique())}: fit one at a time"
        )
    out: dict[str, dict[str, dict]] = {}
    for (level, collective), group in rows.groupby(["level", "collective"], sort=True):
        entry = fit_collective(group, collective, source=source)
        entry["rejected"] = rejected  # rows the table lost before grouping
        out.setdefault(level, {})[collective] = entry
    return out




# --- packaged reference data ----------------------------------------------------------------


def _data_file(*parts: str):
    return Path(__file__).parent.parent / "profiles" / "data" / Path(*parts)


def load_reference_allreduce() -> pd.DataFrame:
    """Published 8-GPU nccl-tests all_reduce curves in the collectives.csv schema.

    Extra columns ``system`` and ``source`` name the machine and the document.
    Time is derived as ``S / algbw`` with ``algbw = busbw / (2 (n-1) / n)``.
    """
    with _data_file("reference", REFERENCE_ALLREDUCE).open() as fh:
        raw = pd.read_csv(fh)
    n = raw["gpus"].astype(int)
    size = raw["message_size_bytes_assumed"].astype(float)
    algbw = raw["busbw_GBps"] / BUSBW_FACTOR["all_reduce"](n)  # GB/s = 1e9 bytes/s (nccl-tests)
    return pd.DataFrame({
        "collective": raw["collective"], "backend": "nccl", "scope": "intra", "group_size": n,
        "nodes": 1, "ranks_per_node": n, "size_bytes": size, "dtype": "float32",
        "time_s": size / (algbw * 1e9), "time_min_s": np.nan, "algbw_GBps": algbw,
        "busbw_GBps": raw["busbw_GBps"], "reps": np.nan, "world_size": n,
        "system": raw["system"], "source": raw["source"],
    })


def _system_key(system: str) -> str:
    name = str(system).lower()
    check_choice("system", name, [*BUNDLED_SYSTEMS, *SYSTEM_ALIASES])
    return SYSTEM_ALIASES.get(name, name)


def fit_reference_allreduce(system: str) -> dict:
    """Fit one system's packaged all_reduce curve (1 KiB to 8 GiB); returns entry + report."""
    key = _system_key(system)
    table = load_reference_allreduce()
    rows = table[table["system"].str.startswith(BUNDLED_SYSTEMS[key])]
    source = (f"nccl-tests all_reduce_perf, {rows['system'].iloc[0]}; NCCL algorithm "
              f"{ALGORITHM_NOTE[key]}; data: {rows['source'].iloc[0]}")
    return fit_collective(rows, "all_reduce", source=source)


def bundled_allreduce_entry(system: str) -> dict:
    """Fitted NVLink all_reduce entry bundled for ``system`` (a100, h100, h200: 8 GPUs; gb200: 4)."""
    return datasheet.bundled_allreduce_entry(_system_key(system))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the bundled JSON entries")
    parser.add_argument("--only", choices=sorted(BUNDLED_SYSTEMS), action="append",
                        help="fit (and with --write rewrite) only this system's curve; repeatable")
    args = parser.parse_args(argv)
    print("system  form            CV MAPE all   CV MAPE 1MiB-8GiB   busbw asymptote GB/s")
    for key in args.only or BUNDLED_SYSTEMS:
        entry = fit_reference_allreduce(key)
        rows = load_reference_allreduce()
        rows = rows[rows["system"].str.startswith(BUNDLED_SYSTEMS[key])]
        size, n, t = (rows[c].to_numpy(dtype=float) for c in ("size_bytes", "group_size", "time_s"))
        big = cv_mape(entry["form"], size, n, BUSBW_FACTOR["all_reduce"](n), t, score_mask=size >= 2**20)
        print(f"{key:6}  {entry['form']:15} {entry['cv_mape']:11.1%}   {big:17.1%}"
              f"   {entry['params']['busbw_bytes_per_s'] / 1e9:14.0f}   candidates {entry['candidates']}")
        if args.write:
            path = _data_file(f"nvlink_allreduce_{key}.json")
            with open(str(path), "w") as fh:
                json.dump(profile_entry(entry), fh, indent=2)
                fh.write("\n")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
