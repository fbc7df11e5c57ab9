"""The interval of a step outside every calibrated regime: its profile origin's pool, regime as the unit.

By hand on small pools, under exchangeable regimes by simulation, and on the project's own rows with each
calibrated regime left out in turn (docs/accuracy.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from perfmodel import interval as iv
from perfmodel.validate import intervals as cal
from perfmodel.validate.conformal import Item, regime_pools


def test_pool_scores_each_regime_against_the_others_by_hand():
    items = [Item("m/a", "1", 0.0, "s"), Item("m/a", "2", 0.2, "s"), Item("m/b", "3", 0.5, "s"),
             Item("d/a", "4", 0.3, "s")]
    pools = regime_pools(items)
    assert set(pools) == {"m"}  # one regime alone says nothing of an unseen one
    m = pools["m"]
    # m/a's rows against m/b's median (0.5), m/b's row against m/a's (0.1); each regime weighs 1
    assert m["scores"] == [0.3, 0.4, 0.5] and m["weights"] == [0.5, 1.0, 0.5]
    assert m["regimes"] == 2 and m["rows"] == 3 and m["centre"] == 0.2
    # the smallest score whose weight reaches level · (K + 1) = 3 · level: 0.3 to 1/6, 0.4 to 1/2, then 0.5
    assert [iv.pooled_half_width(m, lv) for lv in (0.1, 0.4, 0.6, 0.9)] == [0.3, 0.4, 0.5, 0.5]


def test_pool_covers_an_unseen_exchangeable_regime():
    # regimes whose biases are draws of one law: the pooled width covers a new regime's row at the level
    rng = np.random.default_rng(0)
    level, inside = 0.8, []
    for _ in range(300):
        items = [Item(f"m/{k}", f"{k}.{j}", b + 0.02 * rng.standard_normal(), "s")
                 for k, b in enumerate(rng.standard_normal(9)) for j in range(3)]
        pool = regime_pools(items)["m"]
        new = rng.standard_normal() + 0.02 * rng.standard_normal()
        inside.append(abs(new - pool["centre"]) <= iv.pooled_half_width(pool, level))
    assert np.mean(inside) >= level - 0.05


def test_fallback_takes_its_origins_pool_and_no_pool_the_floor():
    pool = {"regimes": 2, "rows": 3, "centre": 0.1, "scores": [0.3, 0.4, 0.5], "weights": [0.5, 1.0, 0.5]}
    table = {**iv.EMPTY_TABLE, "fallback": {"measured": pool, "datasheet": {**pool, "centre": 0.2,
                                                                           "scores": [0.1, 0.2, 0.35]}}}
    assert iv.fallback_interval(table, 0.4, "measured") == (0.1, 0.4)
    # a datasheet profile rescales the measured fits: never narrower than the measured pool
    assert iv.fallback_interval(table, 0.4, "datasheet") == (0.2, 0.4)
    # no host regime: the floor, not a GPU pool (the CPU rows are off by up to +99% where the GPU pools are ±10%)
    assert iv.fallback_interval(table, 0.9, "host") == (0.0, math.log(4))
    assert iv.origin_of("measured", "profile of h100 used for h200") == "datasheet"
    assert iv.origin_of("measured", None) == "measured" and iv.origin_of("host", None) == "host"
    assert iv.fallback_interval(iv.EMPTY_TABLE, 0.9, "measured") == (0.0, math.log(4))


def test_each_regime_left_out_is_covered_by_its_origins_pool():
    shipped = iv.calibration_table()
    unseen = shipped["unseen_regimes"]
    assert set(unseen) == {str(q) for q in cal.QUANTILES}
    # calibrated regimes taken as exchangeable units: over the GPU regimes, the level within a few points where
    # K - 1 regimes support it (K = 4 per origin: up to 75%); above, the pool's largest score, which covers more
    for level in ("0.8", "0.9"):
        assert unseen[level]["mean_coverage"] >= float(level) - 0.05, unseen[level]
    assert unseen["0.5"]["mean_coverage"] >= 0.5 - 0.05
    # the table records what the check gives on the shipped rows and score
    for name, entry in unseen["0.9"]["per_regime"].items():
        assert entry["rows"] == shipped["regimes"][name]["n"]


def test_unseen_regimes_prices_a_left_out_regime_by_the_fallback():
    class Row:  # two GPU regimes of one origin, one left out at a time
        def __init__(self, cell, r):
            self.cell, self.log_ratio, self.kind = cell, r, "measured"

    rows = [Row("measured/low-comm/a", 0.0), Row("measured/low-comm/a", 0.1), Row("measured/low-comm/b", 0.3)]
    seen = {}

    def build(part, method):
        seen.setdefault("cells", []).append(sorted({r.cell for r in part}))
        return {"left_out": {r.cell for r in rows} - {r.cell for r in part}}

    def width(table, r, level):  # the fallback: centre 0, half-width 0.2
        assert r.cell in table["left_out"]  # each row priced by a table built without its regime
        return "uncalibrated", 0.0, 0.2

    mp = pytest.MonkeyPatch()
    mp.setattr(cal, "build_table", build)
    mp.setattr(cal, "regime_and_width", width)
    try:
        out = cal.unseen_regimes(rows, method="split", levels=(0.9,))
    finally:
        mp.undo()
    assert seen["cells"] == [["measured/low-comm/b"], ["measured/low-comm/a"]]
    per = out["0.9"]["per_regime"]
    assert per["measured/low-comm/a"]["coverage"] == 1.0 and per["measured/low-comm/b"]["coverage"] == 0.0
    assert out["0.9"]["mean_coverage"] == 0.5 and out["0.9"]["row_coverage"] == pytest.approx(2 / 3, abs=1e-4)
