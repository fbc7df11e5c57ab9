"""Calibrate the prediction intervals on the project's own validation rows, and check their coverage.

    python -m perfmodel.validate.intervals            # residuals, held-back coverage per regime
    python -m perfmodel.validate.intervals --write    # ...and rewrite perfmodel/data/intervals.json

Rows (:mod:`perfmodel.validate.interval_rows`, each predicted with its GPU's bundled profile, the CPU
jobs with their host's): the H200 steps, the published runs of Megatron-LM, DeepSpeed, torchtitan and
the check set, the committed CPU steps. A row's log-ratio is r = ln(measured / predicted step); per
regime (:func:`perfmodel.interval.regime_name`) the table keeps the median r (the centre), a scale and
the scores (:mod:`perfmodel.validate.conformal`), each row scored against the other run sources of its
regime (``SCORE_UNIT``). Rows with a measured peak memory give the memory section the same way, by
framework, GPUs and reading (allocated or reserved).
The shipped table uses every row; coverage is measured by repeated random splits
of the run sources (:func:`run_source`: a publication table, or one of the project's own
configurations; near-duplicates stay on one side): calibrate on one part, count the held-back
rows inside their interval. Every score (``conformal.METHODS``) is measured so; the table ships
the narrowest of those covering the level (and 50%, 80%) in every regime, else of those covering it
overall the one with the fewest regime misses (:func:`choose_method`). ``--selection`` holds that
choice back too. The fallback of a step outside every calibrated regime (its profile origin's pool,
``perfmodel.interval.fallback_interval``) is checked by leaving each regime out in turn
(:func:`unseen_regimes`, printed and shipped as ``unseen_regimes``). docs/accuracy.md.

    python -m perfmodel.validate.intervals --selection   # ...and the choice of score held back (nested)
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math

import numpy as np

from perfmodel.core.entry import run_command
from perfmodel import interval as iv
from perfmodel.parallel.paths import PATHS
from perfmodel.validate import conformal
from perfmodel.validate.interval_rows import (CPU_RUNS, GPU_RUNS, OWN_RUNS, SAMPLE, SOURCE_FILES,  # noqa: F401
                                              TRAIN_DEV, Scored, read_cpu_steps, read_train_dev, run_source,
                                              score, scored_rows, traced_scored_rows, validation_cases)

COMMAND = "python -m perfmodel.validate.intervals --write"
QUANTILES = (0.5, 0.8, 0.9, 0.95)
HELD_BACK = 0.2  # share of configurations each split holds back (the table to ship calibrates on all)


# what a row is scored without (conformal.py: against the centre of the rest of its regime): its run source,
# the unit a held-back split keeps whole, so a source's shared bias shows in the scores as it does held back
SCORE_UNIT = "source"


def _score_unit(r: Scored) -> str:
    """The part of its regime a row's score leaves out (:data:`SCORE_UNIT`: ``"source"`` or ``"configuration"``)."""
    return r.run_source if SCORE_UNIT == "source" else r.group


def _count_units(entries: dict, rows: list[Scored], cell) -> None:
    """Each regime's configurations and run sources (its scores left out run sources, not configurations)."""
    for name, entry in entries.items():
        mine = [r for r in rows if cell(r) == name]
        entry["configurations"] = len({r.group for r in mine})
        entry["run_sources"] = len({r.run_source for r in mine})


def build_table(rows: list[Scored], method: str = "weighted", memory_method: str | None = None,
                traced: list[Scored] = ()) -> dict:
    """The calibration table of ``rows``: centre, scale and scores per regime (step time and memory, each
    with its score), validated stacks, shape ranges; and the ``traced`` graphs' regimes (``cnn/<framework>``)."""
    regimes = conformal.calibrate([conformal.Item(r.cell, _score_unit(r), r.log_ratio, r.source, r.features)
                                   for r in rows if r.kind != "host"], method)
    hosts = [conformal.Item(r.cell, _score_unit(r), r.log_ratio, r.source) for r in rows if r.kind == "host"]
    # a CPU host measured as the device: its own quantiles (split), apart from the GPU regimes' pooled scores
    regimes |= conformal.calibrate(hosts, "split") if hosts else {}
    for name in {it.regime for it in hosts}:  # past the levels its rows support, the stated Laplace prior
        regimes[name]["beyond_rows"] = "laplace"
    # a CNN's kernels are other classes than a transformer's: its own quantiles too, out of the pools and the
    # fallback (each row against its regime's other run sources; a regime of one source, against no bias)
    regimes |= conformal.calibrate([conformal.Item(r.cell, _score_unit(r), r.log_ratio, r.source)
                                    for r in traced], "split") if traced else {}
    _count_units(regimes, list(rows) + list(traced), lambda r: r.cell)
    difficulty = {}
    for entry in regimes.values():  # one fit for the table, every regime carries it
        if "difficulty" in entry:
            difficulty = {"features": list(iv.DIFFICULTY), "coef": entry.pop("difficulty")}
    for name, entry in regimes.items():  # as predict applies them (a datasheet regime never below its measured twin)
        entry["half_width_pct"] = {str(q): conformal.percent(
            entry["centre"], iv.regime_width({"regimes": regimes}, name, q, math.nan)) for q in QUANTILES}
    measured = [r for r in rows if r.memory_log_ratio is not None]
    memory = conformal.calibrate([conformal.Item(r.memory_cell, _score_unit(r), r.memory_log_ratio, r.source)
                                  for r in measured], memory_method or method)
    _count_units(memory, measured, lambda r: r.memory_cell)
    for entry in memory.values():
        entry.pop("difficulty", None)  # no features: one scale
        entry["half_width_pct"] = {str(q): conformal.percent(entry["centre"], iv.scaled_width(entry, q))
                                   for q in QUANTILES}
    # one range for both GPU profile kinds (a datasheet profile prices shapes with the measured fits rescaled);
    # a CPU host measured as the device has its own (its rows are toy shapes no GPU row checks)
    extra = {"difficulty": difficulty} if difficulty else {}
    shapes, host_shapes = _shape_range([r for r in rows if r.kind != "host"]), _shape_range([r for r in rows
                                                                                            if r.kind == "host"])
    ran = {name: sorted({dict(r.paths)[name] for r in rows if r.paths}) for name in PATHS}
    return {**extra, "method": method, "validated_stacks": sorted({r.stack for r in rows}), "validated_paths": ran,
            "shape_range": shapes,
            "host_shape_range": host_shapes,
            "datasheet_gpus": sorted({r.cluster_gpu for r in rows if r.kind == "datasheet"}), "regimes": regimes,
            "memory": {"method": memory_method or method, "regimes": memory,
                       "fallback_scores": memory_fallback_scores(measured)},
            "fallback": conformal.regime_pools([conformal.Item(r.cell, r.group, r.log_ratio, r.source)
                                                for r in rows if r.kind in iv.ORIGINS]),
            "fallback_floor": iv.EMPTY_TABLE["fallback_floor"]}


def _shape_range(rows: list[Scored]) -> dict:
    """[min, max] of each of ``perfmodel.interval.RANGE_FIELDS`` over ``rows`` (empty without rows)."""
    return {f: [min(getattr(r, f) for r in rows), max(getattr(r, f) for r in rows)] for f in iv.RANGE_FIELDS} \
        if rows else {}


def memory_fallback_scores(rows: list[Scored]) -> list[float]:
    """|r - c| of every memory row, c its regime's median over the other run sources (0 where none measured
    it): the pooled scores a memory regime without rows draws on (:func:`perfmodel.interval.memory_fallback_width`)."""
    out = []
    for r in rows:
        others = [o.memory_log_ratio for o in rows if o.memory_cell == r.memory_cell and o.run_source != r.run_source]
        out.append(round(abs(r.memory_log_ratio - (float(np.median(others)) if others else 0.0)), 5))
    return sorted(out)


def regime_and_width(table: dict, r: Scored, level: float) -> tuple[str, float, float]:
    """The regime a row falls in under ``table``, and its log centre and half-width (as predict has them)."""
    shape = type("Shape", (), {name: getattr(r, name) for name in iv.RANGE_FIELDS})  # every field the range checks
    reason = iv.uncalibrated_reason(table, kind=r.kind, stack=r.stack, model=shape, profile_gpu=r.profile_gpu,
                                    cluster_gpu=r.cluster_gpu, paths=dict(r.paths))
    raw = iv.regimes(r.kind, r.share, r.host_share, reason, r.framework, r.step_s)
    centre, width = iv.log_interval(table, raw, level, iv.origin_of(r.kind, reason))
    names = iv.relabel(table, raw, level)
    name, width = str(names.item()), float(width.item())
    if not name.startswith(iv.UNCALIBRATED):
        width *= float(iv.row_factor(table, raw, r.features).item())
    return name, float(centre.item()), width


def unseen_regimes(rows: list[Scored], *, method: str, levels=QUANTILES) -> dict:
    """Leave one regime out: each calibrated regime in turn has its rows dropped from the calibration, the
    table is built on the rest, and its rows are priced as predict would price a regime no row checks (the
    fallback of their origin, :func:`perfmodel.interval.fallback_interval`). Per level: coverage and median
    half-width of each regime so unseen, their mean over regimes and over rows."""
    out = {}
    tables = {name: build_table([r for r in rows if r.cell != name], method) for name in sorted({r.cell for r in rows})}
    for level in levels:
        per = {}
        for name, table in tables.items():
            inside, width = [], []
            for r in (r for r in rows if r.cell == name):
                _, c, w = regime_and_width(table, r, level)
                inside.append(abs(r.log_ratio - c) <= w)
                width.append(math.exp(c) * math.sinh(w))
            per[name] = {"coverage": round(float(np.mean(inside)), 4), "rows": len(inside),
                         "median_half_width_pct": round(100 * float(np.median(width)), 2)}
        gpu = [v for k, v in per.items() if k.split("/")[0] in iv.ORIGINS]
        out[str(level)] = {"mean_coverage": round(float(np.mean([v["coverage"] for v in gpu])), 4),
                           "row_coverage": round(sum(v["coverage"] * v["rows"] for v in gpu)
                                                 / sum(v["rows"] for v in gpu), 4), "per_regime": per}
    return out


UNITS = ("source", "configuration")  # what a held-back split keeps whole


def held_back(rows: list[Scored], *, level: float = iv.DEFAULT_LEVEL, splits: int = 200,
              fraction: float = HELD_BACK, seed: int = 0, method: str = "weighted",
              memory_method: str | None = None, unit: str = "source") -> dict:
    """Coverage on held-back run sources (``unit="configuration"``: configurations) over ``splits`` random
    splits (calibrate on the rest), of step time per regime and of memory (scored by ``memory_method``,
    default ``method``)."""
    if unit not in UNITS:
        raise ValueError(f"'unit' must be one of {', '.join(UNITS)}: got {unit!r}")
    key = (lambda r: r.run_source) if unit == "source" else (lambda r: r.group)
    groups = sorted({key(r) for r in rows})
    rng = np.random.default_rng(seed)
    time, memory = _Tally(), _Tally()
    for _ in range(splits):
        cal = set(rng.permutation(groups)[: round(len(groups) * (1 - fraction))].tolist())
        table = build_table([r for r in rows if key(r) in cal], method, memory_method)
        for r in rows:
            if key(r) in cal:
                continue
            name, c, w = regime_and_width(table, r, level)
            time.add(name.split(":")[0], abs(r.log_ratio - c) <= w, math.exp(c) * math.sinh(w))
            if r.memory_log_ratio is not None:
                c, w, name = iv.memory_log_interval(table, r.memory_regime, level)
                memory.add(name.split(":")[0], abs(r.memory_log_ratio - c) <= w, math.exp(c) * math.sinh(w))
    return {"level": level, "splits": splits, "held_back_fraction": fraction, "seed": seed, "method": method,
            "unit": unit, **time.summary(), "memory": memory.summary()}


class _Tally:
    """Held-back rows: inside or not, half-width (over the prediction) and regime."""

    def __init__(self):
        self.inside, self.width, self.regime = [], [], []

    def add(self, regime: str, inside: bool, width: float) -> None:
        self.inside.append(inside)
        self.width.append(width)
        self.regime.append(regime)

    def summary(self) -> dict:
        inside, width, regime = np.array(self.inside), np.array(self.width), np.array(self.regime)
        if not len(inside):
            return {"coverage": None, "median_half_width_pct": None, "per_regime": {}}
        per = {name: {"coverage": round(float(inside[regime == name].mean()), 4),
                      "median_half_width_pct": round(100 * float(np.median(width[regime == name])), 2),
                      "held_back_rows": int((regime == name).sum())} for name in sorted(set(regime.tolist()))}
        return {"coverage": round(float(inside.mean()), 4),
                "median_half_width_pct": round(100 * float(np.median(width)), 2), "per_regime": per}


CHECK_LEVELS = (0.5, 0.8)  # a shipped score must also hold at these levels (within SLACK), as predict may ask
# the shipped score's own test allows 3 points (tests/test_intervals.py); the held-back estimate moves by ~2 points
# with the splits drawn (hybrid at 80%: 76.0% over 30 splits, 78.1% over 200), so a 2-point slack chose on noise
SLACK = 0.03


REGIME_SLACK = 0.10  # each calibrated regime, with ~10 rows, may fall this far below a level


def _holds(summary: dict, level: float, slack: float) -> bool:
    """Held-back coverage of at least ``level - slack`` overall and ``level - REGIME_SLACK`` in each
    calibrated regime (a pooled score may otherwise cover the easy regimes and miss a hard one)."""
    per = summary.get("per_regime", {})
    return summary["coverage"] >= level - slack and all(
        r["coverage"] is None or r["coverage"] >= level - REGIME_SLACK for name, r in per.items()
        if name != iv.UNCALIBRATED)


def _holds_overall(summary: dict, level: float, slack: float) -> bool:
    return summary["coverage"] >= level - slack


def _worst(summary: dict):
    """(regime, coverage) of the calibrated regime covering least held back."""
    per = [(name, r["coverage"]) for name, r in summary.get("per_regime", {}).items() if name != iv.UNCALIBRATED]
    return min(per, key=lambda t: t[1]) if per else None


def choose_method(checks: dict, level: float, others: dict | None = None) -> str:
    """The score to ship: the narrowest median half-width among those covering at least ``level`` held back
    and, at each of ``others`` (level -> method -> summary), that level less ``SLACK`` — overall and within
    ``REGIME_SLACK`` in every calibrated regime; when none does, the same among those that hold in every regime
    at ``level`` and overall at the others (the shipped score's test); when none does, among those that hold
    overall at every level; within a rule, the one with the fewest regime misses (:func:`regime_misses`), among
    equals the one whose worst calibrated regime covers most at ``level`` (a held-out set is one population,
    and a pooled score can be narrowest by covering the easy regimes and missing a hard one), then the
    narrowest; when none holds overall either, the best-covering one. ``checks``: method -> held-back summary."""
    others = others or {}
    for rule, other_rule in ((_holds, _holds), (_holds, _holds_overall), (_holds_overall, _holds_overall)):
        covering = [m for m, h in checks.items() if rule(h, level, 0.0)
                    and all(other_rule(o[m], lv, SLACK) for lv, o in others.items())]
        if covering:
            return min(covering, key=lambda m: (regime_misses(checks[m], level, {lv: o[m] for lv, o in
                                                                                 others.items()}),
                                                -(_worst(checks[m]) or ("", 1.0))[1],
                                                checks[m]["median_half_width_pct"]))
    return max(checks, key=lambda m: checks[m]["coverage"])


def regime_misses(summary: dict, level: float, others: dict) -> int:
    """How many (calibrated regime, level) pairs of one score cover less than the level by more than
    ``REGIME_SLACK`` held back (``others``: level -> that score's summary)."""
    return sum(r["coverage"] is not None and r["coverage"] < lv - REGIME_SLACK
               for lv, h in ((level, summary), *others.items())
               for name, r in h.get("per_regime", {}).items() if name != iv.UNCALIBRATED)


def compare_methods(rows: list[Scored], *, level: float, splits: int, fraction: float, unit: str,
                    seed: int = 0) -> tuple[dict, dict]:
    """Held-back summaries of every score at ``level`` and at each of ``CHECK_LEVELS``, each over the same
    ``splits`` splits (with a quarter of them, one regime read 34% at 50% that 200 read 43%: a regime's rows
    come from a few sources, so its tally moves with which of them a split holds back):
    (method -> summary, level -> method -> summary)."""
    checks = {m: held_back(rows, level=level, splits=splits, fraction=fraction, method=m, unit=unit, seed=seed)
              for m in conformal.METHODS}
    others = {lv: {m: held_back(rows, level=lv, splits=splits, fraction=fraction, method=m,
                                unit=unit, seed=seed) for m in conformal.METHODS} for lv in CHECK_LEVELS}
    return checks, others


def selection_check(rows: list[Scored], *, level: float = iv.DEFAULT_LEVEL, outer: int = 20, inner: int = 8,
                    fraction: float = HELD_BACK, unit: str = "source", seed: int = 1) -> dict:
    """The whole rule held back: per outer split, choose the score on the calibration part alone (``inner``
    splits of it, :func:`choose_method`), build its table there, count the held-back rows inside. Its coverage
    against the chosen score's is the optimism of choosing the score on the rows it is checked on."""
    key = (lambda r: r.run_source) if unit == "source" else (lambda r: r.group)
    groups = sorted({key(r) for r in rows})
    rng = np.random.default_rng(seed)
    time, chosen = _Tally(), {}
    for k in range(outer):
        cal = set(rng.permutation(groups)[: round(len(groups) * (1 - fraction))].tolist())
        part = [r for r in rows if key(r) in cal]
        checks, others = compare_methods(part, level=level, splits=inner, fraction=fraction, unit=unit, seed=k)
        method = choose_method(checks, level, others)
        chosen[method] = chosen.get(method, 0) + 1
        table = build_table(part, method)
        for r in rows:
            if key(r) not in cal:
                name, c, w = regime_and_width(table, r, level)
                time.add(name.split(":")[0], abs(r.log_ratio - c) <= w, math.exp(c) * math.sinh(w))
    return {"level": level, "outer": outer, "inner": inner, "unit": unit, "chosen": chosen, **time.summary()}


def generate(*, level: float = iv.DEFAULT_LEVEL, splits: int = 200, fraction: float = HELD_BACK,
             unit: str = "source") -> dict:
    """The table to ship: every row's scores, provenance, the held-back coverage of every score and the
    chosen one (splits keep ``unit`` whole), and the chosen one's with configurations held back."""
    rows, traced = scored_rows(), traced_scored_rows()
    checks, others = compare_methods(rows, level=level, splits=splits, fraction=fraction, unit=unit)
    method = choose_method(checks, level, others)
    memory_method = choose_method({m: h["memory"] for m, h in checks.items()}, level,
                                  {lv: {m: h["memory"] for m, h in o.items()} for lv, o in others.items()})
    counts = {}
    for r in rows + traced:
        counts[r.source] = counts.get(r.source, 0) + 1
    sources = {name: {"file": SOURCE_FILES[name], "rows": n} for name, n in counts.items()}
    core = build_table(rows, method, memory_method, traced)
    return {"schema_version": iv.TABLE_SCHEMA, "created": _dt.date.today().isoformat(), "command": COMMAND,
            "method_note": "centre = median ln(measured / predicted) per regime; scores = |ln ratio - centre| "
                           "(split) or |ln ratio - centre| / scale with all regimes pooled (weighted; normalised: "
                           "scale = the regime's times exp(difficulty coef . features)), each "
                           "against the other run sources of its regime; a step outside every calibrated regime (or in one "
                           "with too few rows for the level) gets its profile origin's pooled interval (fallback: "
                           "each row against the median of the origin's other regimes, each regime one unit, the "
                           "unseen regime one more; past K/(K+1) the largest score), never narrower than its "
                           "nearest calibrated regimes'; a CPU host's regime past its rows a Laplace prior through "
                           "its largest score; a "
                           "memory regime without rows, or of one run source, the stated prior "
                           f"(±{100 * (math.exp(iv.MEMORY_PRIOR_90) - 1):.0f}% at 90%)",
            "comm_share_threshold": iv.COMM_SHARE, "host_share_threshold": iv.HOST_SHARE,
            "short_step_s": iv.SHORT_STEP_S, "sources": sources, **core,
            "traced_left_out": traced_left_out(traced, core["fallback"]),
            "held_back": {**checks[method], "memory": checks[memory_method]["memory"]},
            "held_back_configurations": held_back(rows, level=level, splits=splits, fraction=fraction, method=method,
                                                  memory_method=memory_method, unit="configuration"),
            "unseen_regimes": unseen_regimes(rows, method=method),
            "method_choice": {m: {k: h[k] for k in ("coverage", "median_half_width_pct")}
                              | {f"coverage_at_{lv:g}": o[m]["coverage"] for lv, o in others.items()}
                              | {f"{name}_holds": rule(h, level, 0.0)
                                 and all(other(o[m], lv, SLACK) for lv, o in others.items())
                                 for name, rule, other in (("every_regime", _holds, _holds),
                                                           ("regimes_at_level", _holds, _holds_overall),
                                                           ("overall", _holds_overall, _holds_overall))}
                              | {"regime_misses": regime_misses(h, level, {lv: o[m] for lv, o in others.items()})}
                              | {f"worst_regime_at_{lv:g}": _worst(s) for lv, s in ((level, h), *(
                                  (lv, o[m]) for lv, o in others.items()))}
                              for m, h in checks.items()},
            "memory_method_choice": {m: {k: h["memory"][k] for k in ("coverage", "median_half_width_pct")}
                                     for m, h in checks.items()}}


def traced_left_out(traced: list[Scored], fallback: dict, levels=QUANTILES) -> dict:
    """Each run source of the traced graphs' rows left out: its rows priced by the regimes the other sources
    calibrate (a regime with no other source, by ``fallback``, the transformer rows' pools of the rows' origin),
    coverage and median half-width per level; what a CNN table from a new source should expect."""
    found = {level: ([], []) for level in levels}  # level -> (inside, half-width %) per row
    for source in sorted({r.run_source for r in traced}):
        table = {**build_table([], "split", "split", [r for r in traced if r.run_source != source]),
                 "fallback": fallback}
        for r in (r for r in traced if r.run_source == source):
            for level, (inside, widths) in found.items():
                c, w = iv.regime_log_interval(table, r.cell, level, r.kind)
                inside.append(abs(r.log_ratio - c) <= w)
                widths.append(100 * math.exp(c) * math.sinh(w))
    return {f"{level:g}": {"coverage": float(np.mean(inside)), "median_half_width_pct": float(np.median(widths)),
                           "rows": len(inside)} for level, (inside, widths) in found.items()}


def report(table: dict) -> str:
    """The table and its held-back coverage as text."""
    head = f"{'regime':36s} {'rows':>5s} {'configs':>7s} " + " ".join(f"{'±' + str(q):>7s}" for q in QUANTILES)
    lines = [f"step time ({table['method']} score)", head] + _widths(table["regimes"])
    lines += [f"peak memory ({table['memory']['method']} score)", head] + _widths(table["memory"]["regimes"])
    h = table["held_back"]
    unit = {"source": "run sources", "configuration": "configurations"}[h.get("unit", "configuration")]
    lines.append(f"held-back coverage at {h['level']:.0%} ({h['splits']} splits, {h['held_back_fraction']:.0%} of "
                 f"{unit} held back): {h['coverage']:.1%}, median half-width {h['median_half_width_pct']:.1f}%")
    lines += _per_regime(h["per_regime"])
    if "held_back_configurations" in table:
        c = table["held_back_configurations"]
        lines.append(f"  configurations held back instead: {c['coverage']:.1%}, median half-width "
                     f"{c['median_half_width_pct']:.1f}%; memory {c['memory']['coverage']:.1%}")
        lines += _per_regime(c["per_regime"])
    m = h["memory"]
    if m["coverage"] is not None:
        lines.append(f"memory: coverage {m['coverage']:.1%}, median half-width {m['median_half_width_pct']:.1f}%")
        lines += _per_regime(m["per_regime"])
    lines += _unseen(table.get("unseen_regimes", {}))
    if table.get("traced_left_out"):
        lines.append("CNN rows, each run source left out (priced by the others' regimes): coverage / median half-width "
                     + "; ".join(f"{lv}: {c['coverage']:.1%} / {c['median_half_width_pct']:.1f}%"
                                 for lv, c in table["traced_left_out"].items()))
    for what, key in (("step time", "method_choice"), ("memory", "memory_method_choice")):
        lines.append(f"scores compared ({what}): " + "; ".join(
            f"{name} coverage {c['coverage']:.1%} median half-width {c['median_half_width_pct']:.1f}%"
            for name, c in table[key].items()))
    lines.append(f"validated stacks: {', '.join(table['validated_stacks'])}; shapes: {table['shape_range']}")
    return "\n".join(lines)


def _widths(regimes: dict) -> list[str]:
    out = []
    for name, r in regimes.items():
        widths = " ".join(f"{w:6.1f}%" if w is not None else "      -" for w in r["half_width_pct"].values())
        out.append(f"{name:36s} {r['n']:5d} {r['configurations']:7d} {widths}")
    return out


def _unseen(unseen: dict) -> list[str]:
    """The leave-one-regime-out check (:func:`unseen_regimes`): each regime's coverage and width, per level."""
    if not unseen:
        return []
    names = next(iter(unseen.values()))["per_regime"]
    lines = ["each regime left out (its rows priced by the fallback of their origin): coverage / median half-width",
             f"{'regime':36s} " + " ".join(f"{lv:>14s}" for lv in unseen)]
    for name in names:
        cells = [f"{u['per_regime'][name]['coverage']:6.1%}/{u['per_regime'][name]['median_half_width_pct']:5.1f}%"
                 for u in unseen.values()]
        lines.append(f"{name:36s} " + " ".join(f"{c:>14s}" for c in cells))
    lines.append(f"{'GPU regimes: mean (over rows)':36s} " + " ".join(
        f"{u['mean_coverage']:6.1%} ({u['row_coverage']:.1%})".rjust(14) for u in unseen.values()))
    return lines


def _per_regime(per: dict) -> list[str]:
    return [f"  {name:34s} coverage {r['coverage']:6.1%}  median half-width {r['median_half_width_pct']:5.1f}%  "
            f"({r['held_back_rows']} held-back rows)" for name, r in per.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perfmodel.validate.intervals", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite {iv.TABLE_PATH.name} next to perfmodel.interval")
    ap.add_argument("--splits", type=int, default=200, help="random held-back splits for the coverage check")
    ap.add_argument("--held-back", type=float, default=HELD_BACK,
                    help=f"share of configurations each split holds back (default {HELD_BACK})")
    ap.add_argument("--unit", choices=UNITS, default="source",
                    help="what a split keeps whole: a run source (default) or a configuration")
    ap.add_argument("--selection", action="store_true",
                    help="also hold the choice of score back (nested splits; its optimism; about 2 minutes)")
    args = ap.parse_args(argv)
    if not 0 < args.held_back < 1:
        ap.error(f"--held-back must be strictly between 0 and 1: got {args.held_back}")
    table = generate(splits=args.splits, fraction=args.held_back, unit=args.unit)
    print(report(table))
    if args.selection:
        sel = selection_check(scored_rows(), fraction=args.held_back, unit=args.unit)
        print(f"score chosen inside each split ({sel['outer']} outer x {sel['inner']} inner splits; chosen "
              f"{sel['chosen']}): coverage {sel['coverage']:.1%}, median half-width {sel['median_half_width_pct']:.1f}%")
        print("\n".join(_per_regime(sel["per_regime"])))
    if args.write:
        iv.TABLE_PATH.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {iv.TABLE_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
