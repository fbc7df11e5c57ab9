"""Prediction intervals: stated level, coverage on held-back validation rows, regimes, propagation, ties.

The rows are the project's own validation sets (perfmodel.validate.intervals); coverage is
measured on configurations held back from the calibration of each split (docs/accuracy.md).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import perfmodel as pm
from perfmodel import interval as iv
from perfmodel.core.errors import InvalidInputError
from perfmodel.explore.search import strategy_of
from perfmodel.explore.ties import mark_ties, tie_line
from perfmodel.validate import intervals as cal
from perfmodel.validate.loop import results_table, summarize, validate_measured

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "measured_sample.csv"
# a regime known to miss when its worst run source is held back: the fms-fsdp compile blog's 464-H100 FSDP1 rows
# are predicted 39-67% too fast, a bias no other source of the regime shares (79.7% measured; docs/accuracy.md)
KNOWN_SHORT = {"datasheet/low-comm/fsdp": 0.70}


@pytest.fixture(scope="module")
def rows():
    return cal.scored_rows()


def test_every_validation_source_is_scored_once(rows):
    counts = {}
    for r in rows:
        counts[r.source] = counts.get(r.source, 0) + 1
    # measured_sample.csv repeats train_dev.jsonl and published_runs.csv rows: none are counted twice
    assert counts == {"h200 train_dev": 3, "h200 gpu_runs": 20, "published": 45, "published stacks": 10,
                      "published checks": 139, "cpu steps": 3}
    assert all(math.isfinite(r.log_ratio) for r in rows)


@pytest.mark.parametrize("level", [0.5, 0.8, 0.9])
def test_held_back_coverage_is_near_the_stated_level(rows, level):
    shipped = iv.calibration_table()
    # whole run sources held back (a publication table, or one of the H200 configurations), by the generator's
    # own protocol (200 splits at every level), under which its rule chose the shipped score: with 30 splits
    # the hybrid score read 76.0% at 80% where 200 read 78.1%
    splits = 200
    h = cal.held_back(rows, level=level, splits=splits, method=shipped["method"],
                      memory_method=shipped["memory"]["method"])
    # conformal: at least the level in expectation; above it by more than 1/(n+1) at low levels, since each row is
    # scored against the other run sources of its regime, whose biases differ, and a step outside every regime
    # takes its origin's pool, corrected for a few regimes (55% at 50%; it was 61% under twice the widest width)
    assert level - 0.03 <= h["coverage"] <= level + {0.5: 0.12, 0.8: 0.09, 0.9: 0.06}[level], h
    if level == 0.9:  # per regime fewer rows: a wider margin (at 50% and 80% some regimes miss: docs/accuracy.md)
        for name, r in h["per_regime"].items():
            # the CPU host's three rows: held back, its one calibrated case is the +99% job against two rows that
            # agree within 10% (0% at every level; docs/accuracy.md); every other regime is held to the level
            if name != iv.UNCALIBRATED and not name.startswith("host/"):
                assert r["coverage"] >= KNOWN_SHORT.get(name, level - cal.REGIME_SLACK), (name, r)
        # memory, whole sources held back: the TorchTitan paper's readings, held back, fall in a regime of one run
        # source or none and get the stated prior width, which covers them (it was twice ±0.6%: 61.5% before)
        m = h["memory"]
        assert m["coverage"] >= level - 0.03, m
        assert m["per_regime"]["uncalibrated"]["coverage"] >= level, m


def test_held_back_split_never_calibrates_on_the_rows_it_checks(rows, monkeypatch):
    seen = []
    real = cal.build_table

    def spy(cal_rows, *args):
        seen.append({r.group for r in cal_rows})
        return real(cal_rows, *args)

    monkeypatch.setattr(cal, "build_table", spy)
    checked = []
    real_width = cal.regime_and_width
    monkeypatch.setattr(cal, "regime_and_width", lambda t, r, lv: (checked.append((len(seen), r.group)),
                                                                  real_width(t, r, lv))[1])
    cal.held_back(rows, splits=3, unit="configuration")
    assert len(seen) == 3 and checked
    assert all(group not in seen[split - 1] for split, group in checked)


def test_held_back_splits_keep_run_sources_whole(rows, monkeypatch):
    by_source = {}
    for r in rows:
        by_source.setdefault(r.run_source, set()).add(r.source)
    # a publication table is one source (KempnerForge's 13 experiments of one report too); own runs: one each
    kempner = [s for s in by_source if "KempnerForge MFU scaling report" in s]
    assert len(kempner) == 1 and sum(r.run_source == kempner[0] for r in rows) == 13
    assert len({r.run_source for r in rows if r.source == "h200 gpu_runs"}) == 10  # 10 configurations, 2 runs each
    seen, checked = [], []
    real, real_width = cal.build_table, cal.regime_and_width
    monkeypatch.setattr(cal, "build_table", lambda cal_rows, *a: (seen.append({r.run_source for r in cal_rows}),
                                                                 real(cal_rows, *a))[1])
    monkeypatch.setattr(cal, "regime_and_width", lambda t, r, lv: (checked.append((len(seen), r.run_source)),
                                                                  real_width(t, r, lv))[1])
    h = cal.held_back(rows, splits=2, method="normalised")
    assert h["unit"] == "source" and checked
    assert all(source not in seen[split - 1] for split, source in checked)
    with pytest.raises(ValueError, match="'unit' must be one of source, configuration"):
        cal.held_back(rows, splits=1, unit="row")


def test_shipped_table_is_what_the_generator_builds(rows):
    shipped = iv.calibration_table()
    fresh = cal.build_table(rows, shipped["method"], shipped["memory"]["method"], cal.traced_scored_rows())
    assert shipped["command"] == "python -m perfmodel.validate.intervals --write"
    assert shipped["validated_stacks"] == fresh["validated_stacks"]
    assert shipped["shape_range"] == fresh["shape_range"] and shipped["datasheet_gpus"] == fresh["datasheet_gpus"]
    for section in ("regimes", "memory"):  # a cost-model change shifts scores: rerun the command
        mine = fresh[section] if section == "regimes" else fresh["memory"]["regimes"]
        theirs = shipped[section] if section == "regimes" else shipped["memory"]["regimes"]
        assert set(theirs) == set(mine)
        for name, entry in mine.items():
            assert theirs[name]["n"] == entry["n"]
            if not math.isnan(iv.scaled_width(entry, 0.8)):
                assert iv.scaled_width(theirs[name], 0.8) == pytest.approx(iv.scaled_width(entry, 0.8), abs=0.03)
    assert set(shipped["fallback"]) == set(fresh["fallback"])
    for origin, pool in fresh["fallback"].items():
        assert shipped["fallback"][origin]["regimes"] == pool["regimes"]
        assert iv.pooled_half_width(shipped["fallback"][origin], 0.9) == pytest.approx(
            iv.pooled_half_width(pool, 0.9), abs=0.03)
    assert shipped["held_back"]["coverage"] >= 0.87 and shipped["held_back_configurations"]["memory"]["coverage"] >= 0.87
    assert shipped["held_back"]["unit"] == "source" and shipped["held_back_configurations"]["unit"] == "configuration"
    # the shipped score is the narrowest of those covering 90% held back and 50%, 80% within SLACK,
    # each calibrated regime within REGIME_SLACK; where none does, of those holding every regime at 90% and
    # overall at 50% and 80%; where none does, of those that hold overall
    choice = shipped["method_choice"]
    ok = ([c for c in choice.values() if c["every_regime_holds"]]
          or [c for c in choice.values() if c["regimes_at_level_holds"]]
          or [c for c in choice.values() if c["overall_holds"]])
    assert all(c["coverage"] >= 0.9 and all(c[f"coverage_at_{lv:g}"] >= lv - cal.SLACK for lv in cal.CHECK_LEVELS)
               for c in ok)
    # ...the fewest regime misses, then the best worst regime at the level, then the narrowest
    def rank(c):
        return c["regime_misses"], -(c["worst_regime_at_0.9"] or ["", 1.0])[1], c["median_half_width_pct"]
    assert rank(choice[shipped["method"]]) == min(rank(c) for c in ok)
    assert cal.choose_method({"a": {"coverage": 0.91, "median_half_width_pct": 20}, "b": {
        "coverage": 0.95, "median_half_width_pct": 15}}, 0.9, {0.5: {"a": {"coverage": 0.5}, "b": {"coverage": 0.4}}}) == "a"
    narrow_misses_a_regime = {"coverage": 0.93, "median_half_width_pct": 12,
                              "per_regime": {"easy": {"coverage": 0.99}, "hard": {"coverage": 0.7}}}
    assert cal.choose_method({"a": {"coverage": 0.91, "median_half_width_pct": 20}, "b": narrow_misses_a_regime},
                             0.9) == "a"
    # no score holds in every regime: of those holding overall at every level, the fewest regime misses, then the
    # best worst regime, then the narrowest
    both_miss = {"a": {**narrow_misses_a_regime, "median_half_width_pct": 20}, "b": narrow_misses_a_regime,
                 "c": {"coverage": 0.85, "median_half_width_pct": 5}}
    assert cal.choose_method(both_miss, 0.9) == "b"
    # every regime held at the level but one missed at another level: before the narrower that holds overall only
    low = {0.5: {"a": {"coverage": 0.5, "per_regime": {"hard": {"coverage": 0.3}}},
                 "b": {"coverage": 0.5, "per_regime": {"hard": {"coverage": 0.3}}}}}
    assert cal.choose_method({"a": {"coverage": 0.91, "median_half_width_pct": 20}, "b": narrow_misses_a_regime},
                             0.9, low) == "a"
    less_bad = {"coverage": 0.92, "median_half_width_pct": 14,
                "per_regime": {"easy": {"coverage": 0.95}, "hard": {"coverage": 0.85}}}
    assert cal.choose_method({**both_miss, "d": less_bad}, 0.9) == "d"  # 0.85 misses by 5 points only
    worse_worst = {**less_bad, "median_half_width_pct": 10, "per_regime": {"hard": {"coverage": 0.81}}}
    assert cal.choose_method({"d": less_bad, "e": worse_worst}, 0.9) == "d"


def test_default_interval_is_ninety_percent_and_level_changes_it():
    s = pm.Strategy(micro_batch=32)
    p90, p50 = pm.predict("gpt2-small", "h200", s), pm.predict("gpt2-small", "h200", s, level=0.5)
    assert p90.interval_level == 0.9 and p50.interval_level == 0.5
    assert p90.step_time >= iv.SHORT_STEP_S
    assert p90.interval_regime == p50.interval_regime == "measured/low-comm/pytorch"
    # centred on the regime's bias: the 50% interval need not hold the step itself
    assert p90.interval[0] < p50.interval[0] < p50.interval[1] < p90.interval[1]
    assert p90.interval[0] < p90.step_time < p90.interval[1]
    assert p90.to_dict()["interval_regime"] == "measured/low-comm/pytorch"
    table = iv.calibration_table()
    entry = table["regimes"]["measured/low-comm/pytorch"]
    own = "own_scores" in entry  # hybrid: the regime's own quantile where it has the rows for it
    scores, scale = (entry["own_scores"], 1.0) if own else (entry["scores"], entry["scale"])
    k = math.ceil((len(scores) + 1) * 0.9)  # the conformal order statistic, by hand
    c, q = entry["centre"], scale * scores[k - 1]
    if "difficulty" in table:  # normalised: times this step's difficulty over its regime's typical row's
        b = table["difficulty"]["coef"]
        share = iv.shares(p90.step_time, p90.breakdown)[0]  # one GPU, a measured profile at TDP
        q *= entry["regime_scale"] * math.exp(b[0] + b[1] * float(share)) / entry["scale"]
    assert p90.interval == pytest.approx((p90.step_time * math.exp(c - q), p90.step_time * math.exp(c + q)))
    # a short step's regime (7 rows) is too few for 90% under a per-regime score: labelled so
    short = pm.predict("gpt2-small", "h200", pm.Strategy(micro_batch=8))
    assert short.step_time < iv.SHORT_STEP_S and "measured/low-comm/pytorch/short-step" in short.interval_regime


def test_conformal_scores_by_hand():
    from perfmodel.validate.conformal import FLOOR, SHRINK, Item, calibrate

    items = [Item("a", "1", 0.0, "s"), Item("a", "2", 0.1, "s"), Item("a", "3", 0.4, "s"), Item("b", "4", -0.2, "s")]
    split = calibrate(items, "split")
    # each row against the median of the other configurations: |0 - 0.25|, |0.1 - 0.2|, |0.4 - 0.05|
    assert split["a"]["scores"] == [0.1, 0.25, 0.35] and split["a"]["centre"] == 0.1
    assert split["b"]["scores"] == [0.2]  # one configuration: against no centre (0)
    w = calibrate(items, "weighted")
    pooled = 0.05  # median |r - its regime's median| over all rows: 0.1, 0, 0.3 and 0
    assert w["a"]["scale"] == pytest.approx((3 * 0.1 + SHRINK * pooled) / (3 + SHRINK))  # own median |dev| 0.1
    assert w["b"]["scale"] == pytest.approx(max(FLOOR, (1 * 0.0 + SHRINK * pooled) / (1 + SHRINK)))
    assert w["a"]["scores"] == w["b"]["scores"] and len(w["a"]["scores"]) == 4  # pooled
    h = calibrate(items, "hybrid")
    assert h["a"]["own_scores"] == split["a"]["scores"]
    assert iv.scaled_width(h["a"], 0.5) == 0.25  # its own ⌈4 · 0.5⌉ = 2nd score
    # at 0.8 its 3 rows are too few (⌈4 · 0.8⌉ = 4 > 3): the pooled 4th score times its scale
    assert iv.scaled_width(h["a"], 0.8) == pytest.approx(h["a"]["scale"] * h["a"]["scores"][3])


def test_normalised_scores_by_hand():
    from perfmodel.validate.conformal import MIN_ROWS, SHRINK, Item, calibrate, fit_difficulty, lineage, shrunk_centre

    assert lineage("measured/low-comm/pytorch/short-step") == [
        "measured/low-comm/pytorch/short-step", "measured/low-comm/pytorch", "measured/pytorch", "measured"]
    assert lineage("datasheet/high-comm/fsdp") == ["datasheet/high-comm/fsdp", "datasheet/fsdp", "datasheet"]
    # a small regime's median is shrunk towards its parent's by SHRINK pseudo-rows; a large one keeps its own
    own, parent = np.array([0.1, 0.2, 0.3]), np.array([0.0] * 9 + [0.1, 0.2, 0.3])
    assert shrunk_centre(own, parent) == pytest.approx((3 * 0.2 + SHRINK * 0.0) / (3 + SHRINK))
    assert shrunk_centre(np.full(MIN_ROWS, 0.2), parent) == pytest.approx(0.2)
    # the log-scale fit recovers a spread that doubles with the feature (ridge negligible with many rows)
    x = np.tile([0.0, 1.0], 500)[:, None]
    beta = fit_difficulty(x, np.exp(np.log(0.05) + math.log(2) * x[:, 0]) - 0.01)
    assert beta == pytest.approx([math.log(0.05), math.log(2)], abs=0.01)
    # a regime whose second half is twice as spread: its feature gets a positive coefficient (shrunk by the
    # ridge penalty and the FLOOR: ln(0.05 / 0.03) = 0.51 at most), every row scored, pooled
    items = [Item("a/low-comm/x", str(i), (0.02 if i % 2 else -0.02) * (2 if i >= 10 else 1), "s",
                  (float(i >= 10),)) for i in range(20)]
    out = calibrate(items, "normalised")["a/low-comm/x"]
    assert 0.1 < out["difficulty"][1] < 0.51 and len(out["scores"]) == 20
    assert out["centre"] == pytest.approx(0.0, abs=0.03) and out["regime_scale"] > 0
    mondrian = calibrate(items, "normalised-mondrian")["a/low-comm/x"]
    assert iv.scaled_width(mondrian, 0.8) == pytest.approx(mondrian["own_scores"][16])  # ⌈21 · 0.8⌉ = 17th


def test_normalised_width_follows_the_step_difficulty(rows):
    table = cal.build_table(rows, "normalised")  # whichever score is shipped
    name = "datasheet/low-comm/fsdp"
    names = np.array([name] * 3, dtype=object)
    x = iv.difficulty_features(np.array([0.0, 0.1, 0.1]), 8, False)
    capped = iv.difficulty_features(np.array([0.1]), 8, True)
    f = iv.row_factor(table, names, x)
    b = dict(zip(["intercept", *iv.DIFFICULTY], table["difficulty"]["coef"]))
    assert f[1] / f[0] == pytest.approx(math.exp(0.1 * b["comm_share"]))
    assert iv.row_factor(table, names[:1], capped)[0] / f[1] == pytest.approx(math.exp(b["power_capped"]))
    assert iv.one_factor(table, name, 0.1, 8, True) == pytest.approx(iv.row_factor(table, names[:1], capped)[0])
    # uncalibrated names and regimes without rows keep the regime's width
    assert iv.row_factor(table, np.array(["uncalibrated: host-bound"], dtype=object), x[:1])[0] == 1.0
    # a power-capped part is wider than the same job at TDP (its clock comes from a formula)
    s = pm.Strategy(dp=8, micro_batch=1, framework="torchtitan")
    capped_p, tdp = pm.predict("llama-3-8b", "grand-teton-h100", s), pm.predict("llama-3-8b", "dgx-h100", s)
    if "difficulty" in iv.calibration_table() and b["power_capped"] > 0 and \
            capped_p.interval_regime == tdp.interval_regime == name:
        assert _rel(capped_p) > _rel(tdp)


def test_selection_check_holds_the_choice_back(rows):
    sel = cal.selection_check(rows, outer=1, inner=1)
    assert sum(sel["chosen"].values()) == 1 and set(sel["chosen"]) <= set(cal.conformal.METHODS)
    assert 0.0 <= sel["coverage"] <= 1.0 and sel["per_regime"]


def test_torchtitan_paper_rows_price_the_step_the_paper_logs():
    from perfmodel.validate.published import read_published_stacks

    cases = {c.label: c for c in read_published_stacks()}
    # Table 1: local batch 2 x 8192 tokens at 5,762 tokens/s/GPU; Table 2: 1 x 65536 over cp=2 at 2,540
    assert cases["torchtitan-8b-fsdp"].measured == pytest.approx(2 * 8192 / 5762)
    assert cases["torchtitan-8b-cp2-64k"].measured == pytest.approx(65536 / (2 * 2540))
    assert cases["torchtitan-8b-cp2-64k"].strategy.cp == 2 and cases["torchtitan-8b-fsdp"].strategy.compile is False
    assert cases["torchtitan-8b-fsdp"].extra["reserved_memory_bytes"] == pytest.approx(82.4 * 2**30)


def test_memory_interval_is_calibrated_by_framework_and_wide_without_data():
    p = pm.predict("gpt2-small", "h200", pm.Strategy(micro_batch=32))
    lo, hi = p.memory_interval
    assert lo < p.peak_memory < hi and p.memory_interval_regime == "memory/pytorch"
    entry = iv.calibration_table()["memory"]["regimes"]["pytorch"]
    c, w = entry["centre"], iv.scaled_width(entry, 0.9)
    assert (lo, hi) == pytest.approx((p.peak_memory * math.exp(c - w), p.peak_memory * math.exp(c + w)))
    assert p.to_dict()["memory_interval_regime"] == "memory/pytorch"
    mega = pm.predict("gpt2-small", "a100-sxm4-80gb", pm.Strategy(micro_batch=8, framework="megatron"))
    assert mega.memory_interval_regime == "uncalibrated: memory of megatron never measured"
    assert math.log(mega.memory_interval[1] / mega.peak_memory) > w
    # one GPU's rows do not speak for data parallelism (buckets, shards, buffers in flight)
    ddp = pm.predict("gpt2-small", "dgx-a100-80gb", pm.Strategy(micro_batch=8))
    assert ddp.memory_interval_regime == "uncalibrated: memory of pytorch/parallel never measured"
    titan = pm.predict("llama-3-8b", "dgx-h100", pm.Strategy(dp=8, micro_batch=1, framework="torchtitan"))
    assert titan.memory_interval_regime.startswith(("memory/torchtitan/parallel",
                                                    "uncalibrated: memory of torchtitan/parallel too few"))


@pytest.mark.parametrize("level", [0, 1, 1.5, -0.1, True, "0.9", float("nan")])
def test_a_level_outside_zero_one_is_refused(level):
    with pytest.raises(InvalidInputError, match=r"'level' must be a coverage probability strictly between 0 and 1"):
        pm.predict("gpt2-small", "h200", pm.Strategy(micro_batch=8), level=level)


def _rel(p):  # log half-width: the conformal quantile
    return math.log(p.interval[1] / p.interval[0]) / 2


def test_intervals_widen_for_datasheet_profiles_and_unvalidated_stacks():
    measured = pm.predict("gpt2-small", "h200", pm.Strategy(micro_batch=32))
    assert measured.interval_regime == "measured/low-comm/pytorch"
    s = pm.Strategy(micro_batch=32, framework="megatron")
    unchecked = pm.predict("gpt2-small", "l4", s)  # a datasheet profile no measured row has checked
    assert unchecked.interval_regime == "uncalibrated: datasheet profile of l4 never checked against measurements"
    a100 = pm.predict("gpt2-small", "a100-sxm4-80gb", s)  # a datasheet profile with validation rows
    assert a100.interval_regime == "datasheet/low-comm/megatron"
    stack = pm.predict("gpt2-small", "h200", pm.Strategy(micro_batch=32, attention="unfused"))
    assert stack.interval_regime == "uncalibrated: stack pytorch/unfused not validated"
    # a checked datasheet regime is as wide as its rows make it: datasheet/low-comm/megatron's 85 rows (since the
    # GB200 rows, docs/accuracy.md) leave it a little wider than the measured H200's; never checked is wider than both
    assert _rel(unchecked) > max(_rel(a100), _rel(measured)) and _rel(stack) > _rel(measured)
    assert _rel(measured) <= _rel(a100) < 1.5 * _rel(measured)
    table = iv.calibration_table()
    # no data: the pooled interval of the profile's origin (a datasheet profile's at least the measured pool's)
    assert _rel(unchecked) == pytest.approx(iv.fallback_half_width(table, 0.9, "datasheet"))
    assert _rel(stack) == pytest.approx(iv.fallback_half_width(table, 0.9, "measured"))
    assert iv.fallback_half_width(table, 0.9, "datasheet") >= iv.fallback_half_width(table, 0.9, "measured")
    # a validated stack on a datasheet profile no row of that stack checked: labelled, the datasheet pool's
    other = pm.predict("gpt2-small", "a100-sxm4-80gb", pm.Strategy(micro_batch=8))
    assert other.interval_regime == "uncalibrated: no validation rows in datasheet/low-comm/pytorch"
    centre, width = iv.fallback_interval(table, 0.9, "datasheet")
    assert other.interval == pytest.approx((other.step_time * math.exp(centre - width),
                                            other.step_time * math.exp(centre + width)))
    short = pm.predict("gpt2-small", "a100-sxm4-80gb", s.replace(micro_batch=2))
    assert short.interval_regime == "uncalibrated: no validation rows in datasheet/low-comm/megatron/short-step"
    assert _rel(short) == pytest.approx(width)


def test_other_regimes_without_data_are_labelled():
    table = iv.calibration_table()
    names = iv.regimes("measured", np.array([0.0, 0.5, 0.0]), np.array([0.0, 0.0, 0.6]), None, "pytorch",
                       np.array([1.0, 1.0, 0.01]))
    assert names.tolist() == ["measured/low-comm/pytorch", "measured/high-comm/pytorch", "uncalibrated: host-bound"]
    assert iv.relabel(table, names, 0.9)[1] == "uncalibrated: no validation rows in measured/high-comm/pytorch"
    c, w = iv.log_interval(table, names, 0.9, "measured")
    # no measured high-comm pytorch rows, and host-bound: the measured pool's centre and width
    fallback = iv.fallback_interval(table, 0.9, "measured")
    assert (c[1], w[1]) == (c[2], w[2]) == pytest.approx(fallback) and w[0] < w[1]
    assert c[0] == table["regimes"]["measured/low-comm/pytorch"]["centre"]
    small = pm.predict("gpt2-small", "h200", pm.Strategy(micro_batch=1)).interval_regime
    # its regime; under the split score its 7 rows are too few for 0.9 and the label says so
    assert small in ("measured/low-comm/pytorch/short-step",
                     "uncalibrated: too few rows in measured/low-comm/pytorch/short-step for 0.9")
    long = pm.transformer(layers=2, hidden=512, heads=8, seq=256, vocab=1024)
    assert pm.predict(long, "h200", pm.Strategy(micro_batch=4)).interval_regime == (
        "uncalibrated: hidden=512 outside calibrated 768-25600")
    assert iv.fallback_half_width(iv.EMPTY_TABLE, 0.9) == pytest.approx(math.log(4))  # no pool at all


def test_mixtures_of_experts_are_calibrated_within_the_rows_experts_only():
    # the DGX Cloud Grok-1 proxy rows (8 experts) are the only MoE rows: 8 experts is in range, 60 is not and
    # takes the honest fallback, not a dense regime's width; a table without MoE rows says no row has experts
    table = iv._shipped()
    assert table["shape_range"]["experts"] == [1, 8]
    cluster = pm.cluster("dgx-h100", nodes=2)
    mixtral = pm.predict("mixtral-8x7b", cluster,
                         pm.Strategy(framework="megatron", tp=2, ep=4, micro_batch=1, sequence_parallel=True))
    assert not mixtral.interval_regime.startswith("uncalibrated")
    wide = pm.preset("mixtral-8x7b").with_(experts=64, experts_per_token=8, ffn_hidden=1792)
    moe = pm.predict(wide, cluster, pm.Strategy(framework="megatron", tp=2, ep=4, micro_batch=1,
                                                sequence_parallel=True))
    assert moe.interval_regime == "uncalibrated: experts=64 outside calibrated 1-8"
    dense = pm.predict("llama-3-8b", cluster, pm.Strategy(framework="megatron", micro_batch=1))
    assert not dense.interval_regime.startswith("uncalibrated")
    assert moe.interval[1] / moe.step_time > dense.interval[1] / dense.step_time
    dense_only = {**table, "shape_range": {**table["shape_range"], "experts": [1, 1]}}
    assert iv.uncalibrated_reason(dense_only, kind="datasheet", stack="megatron/flash", model=wide,
                                  profile_gpu="h100-sxm5-80gb", cluster_gpu="h100-sxm5-80gb") == \
        "a mixture of experts (experts=64): no validation row has experts"
    no_field = {k: v for k, v in table["shape_range"].items() if k != "experts"}
    assert iv.uncalibrated_reason({**table, "shape_range": no_field}, kind="datasheet", stack="megatron/flash",
                                  model=wide, profile_gpu="h100-sxm5-80gb", cluster_gpu="h100-sxm5-80gb") is None


def test_a_table_of_another_schema_reads_as_uncalibrated(tmp_path, monkeypatch):
    old = tmp_path / "intervals.json"
    old.write_text('{"schema_version": 1, "regimes": {}}')
    monkeypatch.setattr(iv, "TABLE_PATH", old)
    iv.reload_table()
    try:
        with pytest.warns(UserWarning, match="python -m perfmodel.validate.intervals --write"):
            p = pm.predict("gpt2-small", "h200", pm.Strategy(micro_batch=8))
        assert p.interval_regime == "uncalibrated: stack pytorch/flash not validated"
        assert p.interval == pytest.approx((p.step_time / 4, p.step_time * 4))
    finally:
        monkeypatch.undo()
        iv.reload_table()


def test_sweep_compare_and_search_rows_carry_intervals_and_ties():
    c = pm.compare("gpt2-small", "h200", {"a": "mb=8", "b": "mb=8", "c": "mb=1,gb=8"})
    assert (c["step_time_low"] < c["step_time"]).all() and (c["step_time"] < c["step_time_high"]).all()
    assert c["tie"].tolist()[:2] == [True, True] and c.attrs["ties"] >= 2
    sw = pm.sweep("gpt2-small", "micro_batch", [4, 8], cluster="h200")
    assert {"step_time_low", "step_time_high", "interval_level", "interval_regime"} <= set(sw.columns)
    df = pm.search("gpt2-small", "dgx-a100-80gb", 64, top_k=4)
    assert (df["step_time_low"] <= df["step_time"]).all() and (df["step_time"] <= df["step_time_high"]).all()
    assert df["tie"].iloc[0] and df.attrs["ties"] == int(df["tie"].sum())
    one = pm.predict("gpt2-small", "dgx-a100-80gb", strategy_of(df.iloc[0]))  # search and predict agree
    assert one.interval == pytest.approx((df["step_time_low"].iloc[0], df["step_time_high"].iloc[0]))


def test_ties_by_hand():
    df = pd.DataFrame({"label": ["a", "b", "c"], "tokens_per_second": [100.0, 90.0, 50.0],
                       "step_time": [1.0, 1.0, 1.0], "step_time_low": [0.95, 0.9, 0.9],
                       "step_time_high": [1.05, 1.1, 1.1], "interval_level": [0.9] * 3})
    # tokens/s bounds: a 95.2-105.3, b 81.8-100, c 45.5-55.6: b overlaps a, c does not
    out = mark_ties(df, 0, "tokens_per_second")
    assert out["tie"].tolist() == [True, True, False] and out.attrs["ties"] == 2
    assert tie_line(out, ["a", "b"]).startswith("tie: 2 candidates' 90% intervals overlap the best's")
    alone = mark_ties(df.assign(step_time_low=1.0, step_time_high=1.0), 0, "tokens_per_second")
    assert alone.attrs["ties"] == 1 and "clear winner" in tie_line(alone, ["a"])
    memory = mark_ties(df.assign(peak_memory=1.0), 0, "peak_memory")  # no interval for memory: no tie claimed
    assert not memory["tie"].any() and memory.attrs["ties"] is None
    assert tie_line(memory, []) == "peak_memory has no interval: ties not assessed"


def test_heterogeneous_and_transient_plans_carry_bounds():
    from perfmodel.analysis.hetero import predict_mixed

    mixed = predict_mixed("gpt2-small", {"a100-sxm4-80gb": 2, "h200": 1}, level=0.8)
    assert (mixed["step_time_low_s"] < mixed["step_time_s"]).all()
    assert (mixed["step_time_s"] < mixed["step_time_high_s"]).all()
    assert mixed["interval_regime"].str.endswith("exchange uncalibrated").all()
    plan = pm.plan_training("llama-3-8b", pm.cluster("dgx-a100-80gb"), pm.Strategy(dp=8, micro_batch=1), 1000,
                            trials=200)
    assert (plan["expected_time_low_s"] < plan["expected_time_s"]).all()
    assert (plan["expected_cost_usd"] < plan["expected_cost_high_usd"]).all()
    given = pm.plan_training("llama-3-8b", pm.cluster("dgx-a100-80gb"), pm.Strategy(dp=8), 1000, step_time_s=1.0,
                             trials=200)
    assert given["expected_time_low_s"].isna().all() and (given["interval_regime"] == "step time given").all()
    bounded = pm.plan_training("llama-3-8b", pm.cluster("dgx-a100-80gb"), pm.Strategy(dp=8), 1000, step_time_s=1.0,
                               step_interval_s=(0.8, 1.5), trials=200)
    assert bounded["expected_time_low_s"].to_numpy() == pytest.approx(0.8 * bounded["expected_time_s"].to_numpy())
    assert bounded["expected_cost_high_usd"].to_numpy() == pytest.approx(1.5 * bounded["expected_cost_usd"].to_numpy())
    with pytest.raises(InvalidInputError, match="'step_interval_s' must hold step_time_s=1"):
        pm.plan_training("llama-3-8b", pm.cluster("dgx-a100-80gb"), pm.Strategy(dp=8), 10, step_time_s=1.0,
                         step_interval_s=(1.2, 1.5), trials=10)
    with pytest.raises(InvalidInputError, match="'step_interval_s' needs 'step_time_s'"):
        pm.plan_training("llama-3-8b", pm.cluster("dgx-a100-80gb"), pm.Strategy(dp=8), 10,
                         step_interval_s=(0.8, 1.5), trials=10)


def test_validate_reports_coverage_per_regime():
    results, _ = validate_measured(SAMPLE)
    by = summarize(results)["coverage_by_regime"]
    # the short steps: their own regime, or "uncalibrated" where the shipped score finds its rows too few
    assert set(by) - {"measured/low-comm/pytorch/short-step", "uncalibrated"} == {
        "measured/low-comm/pytorch", "datasheet/low-comm/megatron", "datasheet/high-comm/megatron"}
    assert len(set(by) & {"measured/low-comm/pytorch/short-step", "uncalibrated"}) == 1
    assert sum(r["rows"] for r in by.values()) == len(results) == 30
    text = results_table(results)
    assert "(stated level 90%)" in text and "datasheet/high-comm/megatron" in text


def test_cli_prints_level_regime_and_ties(capsys):
    from perfmodel.cli import main

    assert main(["predict", "--model", "gpt2-small", "--gpu", "h200", "--micro-batch", "8", "--level", "0.8"]) == 0
    out = capsys.readouterr().out
    assert ", 80%, measured/low-comm/pytorch/short-step)" in out and ", 80%, memory/pytorch)" in out
    assert main(["compare", "--model", "gpt2-small", "--gpu", "h200", "--strategies", "mb=8", "mb=8,gb=16"]) == 0
    assert "tie: 2 candidates' 90% intervals overlap the best's" in capsys.readouterr().out
    assert main(["search", "--model", "gpt2-small", "--gpu", "h200", "--global-batch", "16", "--top-k", "2",
                 "--level", "0.8"]) == 0
    out = capsys.readouterr().out
    assert "the model cannot rank them: rank 1, rank 2" in out and "stated at 80%" in out
    assert main(["compare", "--model", "gpt2-small", "--gpu", "h200", "--strategies", "mb=8", "--level", "0.5"]) == 0
    assert "stated at 50%" in capsys.readouterr().out
    assert main(["sweep", "--model", "gpt2-small", "--gpu", "h200", "--over", "micro_batch", "--values", "4", "8",
                 "--level", "0.8"]) == 0
    assert "stated at 80%" in capsys.readouterr().out
    assert main(["plan", "--model", "gpt2-small", "--steps", "100", "--workers", "a100:1,t4:1", "--micro-batch", "8",
                 "--precision", "fp16-mixed", "--trials", "20", "--level", "0.8"]) == 0
    out = capsys.readouterr().out
    assert "expected_time_low_s" in out and "the step's 80% interval" in out and "exchange uncalibrated" in out


def test_memory_regime_without_rows_gets_the_stated_prior_not_the_calibrated_widths():
    table = iv.calibration_table()
    mem = table["memory"]
    # the prior: ±25% at 90%, Laplace quantiles at other levels; never narrowed by the sub-percent regimes
    assert iv.memory_prior_width(0.9) == pytest.approx(math.log(1.25))
    assert iv.memory_prior_width(0.5) == pytest.approx(math.log(1.25) * math.log(2) / math.log(10))
    c, w, name = iv.memory_log_interval(table, "megatron/parallel", 0.9)
    assert name == "uncalibrated: memory of megatron/parallel never measured" and c == 0.0
    assert w == pytest.approx(iv.memory_fallback_width(mem, 0.9)) and w >= math.log(1.25)
    widest = max(iv.scaled_width(e, 0.8) for e in mem["regimes"].values())
    assert w > 4 * widest
    # a regime measured by one run source alone: its spread says nothing of another source's, so the prior
    one = {"memory": {"regimes": {"x/parallel/reserved": {**mem["regimes"]["torchtitan/parallel/reserved"],
                                                          "run_sources": 1}}, "fallback_scores": []}}
    c, w, name = iv.memory_log_interval(one, "x/parallel", 0.5)
    assert name == "uncalibrated: memory of x/parallel measured by one run source"
    assert w == pytest.approx(iv.memory_prior_width(0.5))
    # two sources: calibrated on its reserved readings, labelled so
    two = {"memory": {**one["memory"], "regimes": {"x/parallel/reserved": {**one["memory"]["regimes"][
        "x/parallel/reserved"], "run_sources": 2}}}}
    assert iv.memory_log_interval(two, "x/parallel", 0.5)[2] == "memory/x/parallel/reserved"


def test_memory_rows_are_stratified_by_reading(rows):
    readings = {(r.framework, r.memory_reading) for r in rows if r.memory_log_ratio is not None}
    assert readings == {("pytorch", "allocated"), ("torchtitan", "reserved")}
    cells = {r.memory_cell for r in rows if r.memory_log_ratio is not None}
    assert cells == {"pytorch", "torchtitan/parallel/reserved"}
    # the pooled fallback scores: each row against its regime's other run sources (0 where none)
    scores = cal.memory_fallback_scores([r for r in rows if r.memory_log_ratio is not None])
    assert len(scores) == 33 and scores == sorted(scores)


def test_rows_are_scored_against_the_other_run_sources_of_their_regime():
    from perfmodel.validate.conformal import Item, calibrate

    # two sources of one regime (5 rows and 2), each agreeing within itself, 0.2 apart: left out by source, every
    # score is about the gap; left out by configuration, the larger source's rows score near 0
    rows = [cal.Scored(source="s", group=f"g{i}", label="x", kind="measured", stack="pytorch/flash", hidden=768,
                       seq=1024, profile_gpu="h200", cluster_gpu="h200", share=0.0, host_share=0.0,
                       log_ratio=(0.2 if i >= 5 else 0.0) + 0.001 * i, run_source="A" if i < 5 else "B")
            for i in range(7)]
    assert cal.SCORE_UNIT == "source" and {cal._score_unit(r) for r in rows} == {"A", "B"}
    by_source = calibrate([Item("r", cal._score_unit(r), r.log_ratio, "s") for r in rows], "split")["r"]
    by_config = calibrate([Item("r", r.group, r.log_ratio, "s") for r in rows], "split")["r"]
    assert min(by_source["scores"]) > 0.19 and min(by_config["scores"]) < 0.01
    table = cal.build_table(rows, "split")
    assert table["regimes"]["measured/low-comm/pytorch"]["run_sources"] == 2
    assert table["regimes"]["measured/low-comm/pytorch"]["configurations"] == 7


def test_cpu_steps_are_a_regime_of_their_own(rows):
    cpu = [r for r in rows if r.source == "cpu steps"]
    assert len(cpu) == 3 and {r.kind for r in cpu} == {"host"}
    assert {r.cell for r in cpu} == {"host/low-comm/pytorch"}  # no short-step or host-bound split on a CPU
    table = iv.calibration_table()
    assert table["host_shape_range"]["hidden"] == [32, 192] and table["shape_range"]["hidden"][0] >= 768
    entry = table["regimes"]["host/low-comm/pytorch"]
    assert entry["n"] == 3 and "regime_scale" not in entry  # split, apart from the GPU regimes' pooled score
    # three rows support up to 75% (the ⌈4 · 0.8⌉ = 4th score does not exist); past them the stated Laplace
    # prior through the largest score: the split width at 3/4, b·ln(1/(1 - level)) with b = largest / ln 4
    assert entry["beyond_rows"] == "laplace" and iv.scaled_width(entry, 0.5) == entry["scores"][1]
    for level in (0.8, 0.9, 0.95):
        assert iv.scaled_width(entry, level) == pytest.approx(entry["scores"][-1] * math.log(1 / (1 - level))
                                                              / math.log(4))
    assert iv.laplace_width(entry["scores"], 0.75) == pytest.approx(entry["scores"][-1])  # meets the rows
    case = cal.read_cpu_steps()[0]
    widths = []
    for level in (0.5, 0.8, 0.9):
        p = pm.predict(case.model, case.cluster, case.strategy, profile=case.profile, level=level)
        assert p.interval_regime == "host/low-comm/pytorch"
        widths.append(_rel(p))
    assert widths == sorted(widths) and widths[2] == pytest.approx(iv.scaled_width(entry, 0.9))
    # a CPU step outside its regime's shapes: the host regime's interval, not a GPU pool's
    assert iv.fallback_interval(table, 0.9, "host") == (entry["centre"], iv.scaled_width(entry, 0.9))
    # the vectorised path names a CPU step as predict does: no short-step or host-bound split on a host profile
    names = iv.regimes("host", np.array([0.0, 0.0]), np.array([0.5, 0.0]), None, "pytorch", np.array([0.01, 1.0]))
    assert names.tolist() == ["host/low-comm/pytorch"] * 2 == [iv._one_regime("host", 0.0, h, None, "pytorch", t)
                                                              for h, t in ((0.5, 0.01), (0.0, 1.0))]
    # the GPU pools are drawn from GPU regimes only
    assert set(table["fallback"]) == set(iv.ORIGINS)
    assert all(p["rows"] == sum(e["n"] for n, e in table["regimes"].items() if n.startswith(o + "/"))
               for o, p in table["fallback"].items())


def test_cnn_steps_have_regimes_of_their_own_calibrated_on_the_published_cnn_checks(rows):
    traced = cal.traced_scored_rows()
    assert {r.cell for r in traced} == {"cnn/pytorch", "cnn/tensorflow"} and len(traced) == 122  # 26+5+73+12+6
    table = iv.calibration_table()
    # the transformer regimes and their fallback pools are what they are without the CNN rows
    alone = cal.build_table(rows, table["method"], table["memory"]["method"])
    both = cal.build_table(rows, table["method"], table["memory"]["method"], traced)
    assert {k: v for k, v in both["regimes"].items() if not k.startswith("cnn/")} == alone["regimes"]
    assert both["fallback"] == alone["fallback"]
    # a CNN step takes its framework's regime, with the table's centre and width at the level
    p = pm.predict("resnet50", "a100", pm.Strategy(micro_batch=256))
    assert p.interval_regime == "cnn/pytorch"
    c, w = iv.regime_log_interval(table, "cnn/pytorch", 0.9)
    assert p.interval == pytest.approx((p.step_time * math.exp(c - w), p.step_time * math.exp(c + w)))
    tf = pm.predict("resnet-cifar32", "k80", pm.Strategy(micro_batch=128, precision="fp32", framework="tensorflow"))
    assert tf.interval_regime == "cnn/tensorflow"
    assert tf.interval[1] / tf.step_time > p.interval[1] / p.step_time  # the K80's InceptionV3 rows: +47...+56%
    # no CNN row ran under FSDP: the datasheet origin's fallback, and the label says why
    fsdp = pm.predict("resnet50", "a100", pm.Strategy(micro_batch=256, framework="fsdp1"))
    assert fsdp.interval_regime == "uncalibrated: no validation rows in cnn/fsdp"
    assert fsdp.interval[1] / fsdp.step_time == pytest.approx(math.exp(sum(iv.fallback_interval(table, 0.9))))
    # in-sample the regimes hold their rows at the level; a new source is what the left-out check measures
    for name in ("cnn/pytorch", "cnn/tensorflow"):
        c, w = iv.regime_log_interval(table, name, 0.9)
        mine = [r for r in traced if r.cell == name]
        assert sum(abs(r.log_ratio - c) <= w for r in mine) >= 0.9 * len(mine)
    left = table["traced_left_out"]["0.9"]
    assert left["rows"] == 122 and 0 < left["coverage"] <= 1


def test_a_higher_level_never_gives_a_narrower_interval():
    """A regime whose rows are too few for a level keeps its centre and is never narrower than its widest score
    (before, it fell to its origin's pool, which can be narrower than the regime's own width one level down)."""
    import copy

    table = iv.calibration_table()
    thin = copy.deepcopy(table)
    entry = thin["regimes"]["cnn/tensorflow"]
    entry["scores"] = entry["scores"][-12:]  # 12 rows support 12/13 = 92.3%: 0.95 is past them
    for t in (table, thin):
        for name in t["regimes"]:
            widths = [iv.regime_log_interval(t, name, lv, "datasheet")[1] for lv in (0.5, 0.8, 0.9, 0.95)]
            assert widths == sorted(widths), name
    assert iv.labelled(thin, "cnn/tensorflow", 0.95).startswith(iv.UNCALIBRATED)  # and it says so
    c, w = iv.regime_log_interval(thin, "cnn/tensorflow", 0.95, "datasheet")
    assert c == entry["centre"] and w == pytest.approx(max(entry["scores"][-1], iv.fallback_half_width(thin, 0.95)))
