"""Uncertainty beside each compare / search / sweep row: its interval and the caveats that apply to it.

The interval is the Prediction's (``Prediction.interval``, described by
``Prediction.interval_kind``); caveats are known biases of the model recorded
in docs/explore.md, named on the rows they concern.
"""

from __future__ import annotations

import pandas as pd

from perfmodel.explore.search import strategy_of
from perfmodel.hardware import as_cluster
from perfmodel.interval import DEFAULT_LEVEL
from perfmodel.predict import predict

# dp at which ZeRO-3 without model parallelism is known to rank optimistically (docs/explore.md: the
# published ZeRO-3 runs at 384-2240 A100s were slower than the PTD-P runs beside them)
ZERO3_OPTIMISTIC_DP = 16


def row_caveat(row) -> str:
    """Known biases that apply to one row ("" when none)."""
    notes = []
    if (int(row.get("zero", 0)) == 3 and int(row.get("tp", 1)) == 1 and int(row.get("pp", 1)) == 1
            and int(row.get("dp", 1)) >= ZERO3_OPTIMISTIC_DP and bool(row.get("dp_overlap", True))):
        notes.append("ZeRO-3 without tp/pp: optimistic (gathers assumed hidden; docs/explore.md)")
    if int(row.get("pp", 1)) > 1 and str(row.get("schedule", "")) == "interleaved":
        notes.append("interleaved pipeline: bubble from the schedule formula, p2p not overlapped")
    return "; ".join(notes)


def add_uncertainty(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with a ``caveat`` column (rows holding ``interval_low_s``/``interval_high_s`` keep them)."""
    df = df.copy()
    df["caveat"] = [row_caveat(r) for r in df.to_dict("records")] if len(df) else []
    return df


def search_intervals(df: pd.DataFrame, model, clusters, *, profile=None, level: float | None = None) -> pd.DataFrame:
    """Search rows with their Prediction's interval (each top row priced once by ``pm.predict``), at ``level``
    (None: the level the search stated its rows at, ``interval_level``)."""
    by_name = {}
    for c in clusters if isinstance(clusters, (list, tuple)) else [clusters]:
        c = as_cluster(c)
        by_name[c.name] = c
    low, high, kind = [], [], ""
    for row in df.to_dict("records"):
        cl = by_name.get(row.get("cluster"), next(iter(by_name.values())))
        p = predict(model, cl, strategy_of(row), profile=profile,
                    level=level if level is not None else row.get("interval_level", DEFAULT_LEVEL))
        low.append(p.interval[0])
        high.append(p.interval[1])
        kind = p.interval_kind
    df = df.copy()
    df["interval_low_s"], df["interval_high_s"] = low, high
    df.attrs["interval_kind"] = kind
    return add_uncertainty(df)
