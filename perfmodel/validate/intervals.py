"""Calibrate the prediction intervals on the project's own validation rows, and check their coverage.

    python -m perfmodel.validate.intervals            # residuals, held-back coverage per regime
    python -m perfmodel.validate.intervals --write    # ...and rewrite perfmodel/data/intervals.json

Rows (each predicted with its GPU's bundled profile): the H200 development steps
(``data/h200-2026-11-29/train_dev.jsonl``), the H200 validation runs
(``data/h200-calibration-2026-11-30/gpu_runs.csv``), the published large runs
(``data/published_runs.csv``) and ``examples/measured_sample.csv`` (rows another
source already gives are dropped). A row's log-ratio is r = ln(measured / predicted step);
per regime (:func:`perfmodel.interval.cell`) the table keeps the median r (the centre)
and the scores |r - centre|.
The shipped table uses every row; coverage is measured by repeated random splits
of the configurations (repeats of one configuration stay on one side): calibrate on
one part, count the held-back rows inside their interval. docs/accuracy.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfmodel import interval as iv
from perfmodel.validate.measured import Case, read_measured
from perfmodel.hardware import cluster
from perfmodel.parallel.strategy import Strategy
from perfmodel.predict import default_profile, predict
from perfmodel.profiles.profile import load_profile
from perfmodel.validate.published import read_published
from perfmodel.workload.model import transformer

DATA = Path(__file__).resolve().parent.parent / "data"
TRAIN_DEV = DATA / "h200-2026-11-29" / "train_dev.jsonl"
GPU_RUNS = DATA / "h200-calibration-2026-11-30" / "gpu_runs.csv"
SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "measured_sample.csv"  # in the repository only
COMMAND = "python -m perfmodel.validate.intervals --write"
SOURCE_FILES = {"h200 train_dev": "perfmodel/data/h200-2026-11-29/train_dev.jsonl",
                "h200 gpu_runs": "perfmodel/data/h200-calibration-2026-11-30/gpu_runs.csv",
                "published": "perfmodel/data/published_runs.csv (sources: published_runs.md)",
                "measured_sample": "examples/measured_sample.csv"}
QUANTILES = (0.5, 0.8, 0.9, 0.95)


@dataclass(frozen=True)
class Scored:
    """One validation row predicted: what picks its regime, and its score."""

    source: str
    group: str
    label: str
    kind: str
    stack: str
    hidden: int
    seq: int
    profile_gpu: str
    cluster_gpu: str
    share: float
    host_share: float
    log_ratio: float  # ln(measured / predicted step)

    @property
    def cell(self) -> str:
        return str(iv.cell(self.kind, self.share))


def read_train_dev(path: Path = TRAIN_DEV) -> list[Case]:
    """The H200 development steps (GPT-style, untied head, eager bf16 autocast, fused AdamW, one GPU)."""
    cases = []
    for line, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        r = json.loads(text)
        m = transformer(r["layers"], r["hidden"], r["heads"], r["seq"], r["vocab"], tied_embeddings=False,
                        name=r["model"])
        s = Strategy(micro_batch=r["batch"], recompute="full" if r["checkpoint"] else "none")
        cases.append(Case(line=line, label=r["model"], model=m, cluster=cluster("h200"), strategy=s,
                          metric="step_time_s", measured=float(r["step_sec"]), source=f"train_dev.jsonl line {line}"))
    return cases


def validation_cases() -> list[tuple[str, Case]]:
    """(source, case) of every validation row; a row another source already holds is dropped."""
    found = [("h200 train_dev", c) for c in read_train_dev()]
    found += [("h200 gpu_runs", c) for c in read_measured(GPU_RUNS)[0]]
    found += [("published", c) for c in read_published()]
    seen = {(c.label, round(math.log(c.measured), 3)) for _, c in found}
    if SAMPLE.is_file():
        for c in read_measured(SAMPLE)[0]:
            if c.metric == "step_time_s" and (c.label, round(math.log(c.measured), 3)) not in seen:
                found.append(("measured_sample", c))
    return found


def score(source: str, case: Case) -> Scored:
    """Predict one case and score it."""
    p = predict(case.model, case.cluster, case.strategy, profile=case.profile)
    prof = load_profile(case.profile) if case.profile else default_profile(case.cluster)
    share, host = iv.shares(p.step_time, p.breakdown)
    s = case.strategy
    return Scored(source=source, group=_configuration(case), label=case.label,
                  kind=iv.profile_kind(prof), stack=iv.stack_key(s.framework, s.attention, s.precision),
                  hidden=int(case.model.hidden), seq=int(case.model.seq), profile_gpu=prof.gpu,
                  cluster_gpu=case.cluster.gpu.name, share=float(share), host_share=float(host),
                  log_ratio=math.log(case.measured / p.step_time))


def _configuration(case: Case) -> str:
    """What makes two rows repeats of one configuration (they stay on one side of a split)."""
    m, s = case.model, case.strategy
    fields = (case.label, m.layers, m.hidden, m.seq, m.vocab, case.cluster.n_gpus, s.dp, s.tp, s.pp, s.cp,
              s.micro_batch, s.global_batch, s.recompute, s.shard, s.fsdp, s.framework, s.attention, s.precision)
    return "|".join(map(str, fields))


def scored_rows() -> list[Scored]:
    """Every validation row predicted and scored."""
    return [score(source, case) for source, case in validation_cases()]


def build_table(rows: list[Scored]) -> dict:
    """The calibration table of ``rows``: sorted scores per regime, validated stacks, shape ranges."""
    regimes = {}
    for name in sorted({r.cell for r in rows}):
        mine = [r for r in rows if r.cell == name]
        centre = round(float(np.median([r.log_ratio for r in mine])), 5)
        regimes[name] = {"n": len(mine), "configurations": len({r.group for r in mine}),
                         "sources": sorted({r.source for r in mine}), "centre": centre,
                         "scores": _scores(mine)}
    for name, entry in regimes.items():  # as predict applies them (a datasheet cell never below its measured twin)
        entry["half_width_pct"] = {str(q): _pct(entry["centre"], iv.regime_width({"regimes": regimes}, name, q,
                                                                                 math.nan)) for q in QUANTILES}
    # one range for both profile kinds: a datasheet profile prices shapes with the measured fits rescaled
    shapes = {f: [min(getattr(r, f) for r in rows), max(getattr(r, f) for r in rows)] for f in iv.SHAPE_FIELDS}
    return {"validated_stacks": sorted({r.stack for r in rows}), "shape_range": shapes,
            "datasheet_gpus": sorted({r.cluster_gpu for r in rows if r.kind == "datasheet"}), "regimes": regimes,
            "fallback_floor": iv.EMPTY_TABLE["fallback_floor"]}


def _scores(rows: list[Scored]) -> list[float]:
    """Sorted |r - centre| with each row's centre the median of the other configurations' rows
    (leave one configuration out, as for a new one: the full-sample median would sit closer to
    each calibration row than to a new row, and the interval would under-cover; Barber et al.
    2021, Ann. Statist. 49:486, jackknife+)."""
    out = []
    for r in rows:
        others = [o.log_ratio for o in rows if o.group != r.group]
        out.append(round(abs(r.log_ratio - (float(np.median(others)) if others else 0.0)), 5))
    return sorted(out)


def _pct(centre: float, log_width: float):
    """(high - low) / 2 over the predicted step, in percent."""
    return None if math.isnan(log_width) else round(100 * math.exp(centre) * math.sinh(log_width), 2)


def regime_and_width(table: dict, r: Scored, level: float) -> tuple[str, float, float]:
    """The regime a row falls in under ``table``, and its log centre and half-width (as predict has them)."""
    shape = type("Shape", (), {"hidden": r.hidden, "seq": r.seq})
    reason = iv.uncalibrated_reason(table, kind=r.kind, stack=r.stack, model=shape, profile_gpu=r.profile_gpu,
                                    cluster_gpu=r.cluster_gpu)
    names = iv.regimes(r.kind, r.share, r.host_share, reason)
    centre, width = iv.log_interval(table, names, level)
    return str(names.item()), float(centre.item()), float(width.item())


def held_back(rows: list[Scored], *, level: float = iv.DEFAULT_LEVEL, splits: int = 200, fraction: float = 0.5,
              seed: int = 0) -> dict:
    """Coverage on held-back configurations over ``splits`` random splits (calibrate on the rest)."""
    groups = sorted({r.group for r in rows})
    rng = np.random.default_rng(seed)
    inside, width, regime = [], [], []
    for _ in range(splits):
        cal = set(rng.permutation(groups)[: round(len(groups) * (1 - fraction))].tolist())
        table = build_table([r for r in rows if r.group in cal])
        for r in rows:
            if r.group not in cal:
                name, c, w = regime_and_width(table, r, level)
                inside.append(abs(r.log_ratio - c) <= w)
                width.append(math.exp(c) * math.sinh(w))  # (high - low) / 2 over the prediction
                regime.append(name.split(":")[0])
    inside, width, regime = np.array(inside), np.array(width), np.array(regime)
    per = {name: {"coverage": round(float(inside[regime == name].mean()), 4),
                  "median_half_width_pct": round(100 * float(np.median(width[regime == name])), 2),
                  "held_back_rows": int((regime == name).sum())} for name in sorted(set(regime.tolist()))}
    return {"level": level, "splits": splits, "held_back_fraction": fraction, "seed": seed,
            "coverage": round(float(inside.mean()), 4),
            "median_half_width_pct": round(100 * float(np.median(width)), 2), "per_regime": per}


def generate(*, level: float = iv.DEFAULT_LEVEL, splits: int = 200) -> dict:
    """The table to ship: every row's scores, provenance, and the held-back coverage."""
    rows = scored_rows()
    table = build_table(rows)
    counts = {}
    for r in rows:
        counts[r.source] = counts.get(r.source, 0) + 1
    sources = {name: {"file": SOURCE_FILES[name], "rows": n} for name, n in counts.items()}
    return {"schema_version": iv.TABLE_SCHEMA, "created": _dt.date.today().isoformat(), "command": COMMAND,
            "method": "split-conformal by regime: centre = median ln(measured / predicted step), scores = "
                      "|ln ratio - median of the other configurations' rows|; a regime without rows "
                      f"(or too few for the level) gets {iv.FALLBACK_FACTOR:g}x the widest calibrated half-width",
            "comm_share_threshold": iv.COMM_SHARE, "host_share_threshold": iv.HOST_SHARE,
            "sources": sources, **table, "held_back": held_back(rows, level=level, splits=splits)}


def report(table: dict) -> str:
    """The table and its held-back coverage as text."""
    lines = [f"{'regime':24s} {'rows':>5s} {'configs':>7s} " + " ".join(f"{'±' + str(q):>7s}" for q in QUANTILES)]
    for name, r in table["regimes"].items():
        widths = " ".join(f"{w:6.1f}%" if w is not None else "      -" for w in r["half_width_pct"].values())
        lines.append(f"{name:24s} {r['n']:5d} {r['configurations']:7d} {widths}")
    h = table["held_back"]
    lines.append(f"held-back coverage at {h['level']:.0%} ({h['splits']} splits, {h['held_back_fraction']:.0%} of "
                 f"configurations held back): {h['coverage']:.1%}, median half-width {h['median_half_width_pct']:.1f}%")
    for name, r in h["per_regime"].items():
        lines.append(f"  {name:22s} coverage {r['coverage']:6.1%}  median half-width "
                     f"{r['median_half_width_pct']:5.1f}%  ({r['held_back_rows']} held-back rows)")
    lines.append(f"validated stacks: {', '.join(table['validated_stacks'])}; shapes: {table['shape_range']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perfmodel.validate.intervals", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite {iv.TABLE_PATH.name} next to perfmodel.interval")
    ap.add_argument("--splits", type=int, default=200, help="random held-back splits for the coverage check")
    args = ap.parse_args(argv)
    table = generate(splits=args.splits)
    print(report(table))
    if args.write:
        iv.TABLE_PATH.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {iv.TABLE_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
