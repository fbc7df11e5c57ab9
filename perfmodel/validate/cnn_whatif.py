"""What an unmeasured CNN class would have to cost: the CNN check rows re-priced at an assumed efficiency.

    python -m perfmodel.validate.cnn_whatif                          # depthwise passes at 100 ... 25% efficiency
    python -m perfmodel.validate.cnn_whatif --cls depthwise --passes wgrad   # the weight gradient alone
    python -m perfmodel.validate.cnn_whatif --cls silu                # SiLU forward and backward

An unmeasured class runs at its reference (perfmodel/costs/cnn.py): a depthwise pass, SiLU or a
squeeze-excitation pool at its bytes over the GPU's copy-bandwidth curve, efficiency 1. Here each
assumed efficiency eta becomes the class's correction c = 1 / eta (form ``scaled_ref``, t0 = 0) in
every precision, and the published check rows (``published_cnn_runs.csv``) are priced again. Nothing
is fitted: eta is an assumption, the rows only say how far each family's error would move, which is
what a measurement on a GPU (``perfmodel calibrate``, the ``conv2d`` groups = channels cases and the
CNN layers) has to settle. No profile is changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

from perfmodel.core.entry import run_command
from perfmodel.core.errors import InvalidInputError
from perfmodel.costs.cnn import CONV_PASSES, MEM_CLASSES
from perfmodel.profiles.profile import Profile, load_profile
from perfmodel.validate.cnn import CnnRow, read_cnn_runs, score

EFFICIENCIES = (1.0, 0.75, 0.5, 0.35, 0.25)
DTYPES = ("fp16", "bf16", "fp32", "tf32")
CLASSES = ("depthwise",) + MEM_CLASSES


def class_keys(cls: str, passes=None) -> list[str]:
    """Profile keys that price every kernel of ``cls`` (a convolution kind's pooled key, or a layer class)."""
    if cls not in CLASSES:
        raise InvalidInputError(f"cls {cls!r}: choose one of {', '.join(CLASSES)}")
    valid = CONV_PASSES if cls == "depthwise" else ("fwd", "bwd")
    passes = tuple(passes or valid)
    bad = [p for p in passes if p not in valid]
    if bad:
        raise InvalidInputError(f"passes {bad} for {cls!r}: choose from {', '.join(valid)}")
    stem = "conv.depthwise" if cls == "depthwise" else cls
    return [f"{stem}:{d}:{p}" for d in DTYPES for p in passes]


def assumed_profile(profile: Profile, keys: list[str], efficiency: float) -> Profile:
    """``profile`` with each of ``keys`` priced at ``efficiency`` of its reference (c = 1 / efficiency)."""
    if not 0.0 < efficiency <= 1.0:
        raise InvalidInputError(f"efficiency {efficiency!r}: give a fraction in (0, 1]")
    entry = {"form": "scaled_ref", "params": {"t0": 0.0, "c": 1.0 / efficiency, "t_cpu": 0.0},
             "source": f"assumed efficiency {efficiency:g} (perfmodel.validate.cnn_whatif), not measured"}
    return dataclasses.replace(profile, compute={**profile.compute, **{k: entry for k in keys}})


def family_errors(scored: list[CnnRow], layout: str = "nhwc") -> dict[str, float]:
    """Median |throughput error| per family over the rows of one layout, and over all of them (``all``)."""
    groups: dict[str, list[float]] = {}
    for r in scored:
        if r.layout == layout:
            groups.setdefault(r.family, []).append(abs(r.error))
            groups.setdefault("all", []).append(abs(r.error))
    return {f: statistics.median(v) for f, v in sorted(groups.items())}


def whatif(cls: str = "depthwise", passes=None, efficiencies=EFFICIENCIES, layout: str = "nhwc",
           gpu: str = "rtx-3090") -> list:
    """(efficiency, {family: median |error|}, {EfficientNet model: signed error}) per assumed efficiency,
    over the check rows of one layout and GPU."""
    rows = [r for r in read_cnn_runs() if r["layout"] == layout and r["gpu"] == gpu]
    if not rows:
        raise InvalidInputError(f"gpu {gpu!r}, layout {layout!r}: no check rows (published_cnn_runs.csv)")
    keys = class_keys(cls, passes)
    gpus = sorted({r["gpu"] for r in rows})
    out = []
    for eta in efficiencies:
        profiles = {g: assumed_profile(load_profile(g), keys, eta) for g in gpus}
        scored = score(rows, profiles)
        signed = {f"{r.model} {r.gpu}": r.error for r in scored if r.family == "efficientnet"}
        out.append((eta, family_errors(scored, layout), signed))
    return out


def report(results: list, what: str) -> str:
    families = sorted({f for _, fam, _ in results for f in fam})
    models = sorted({m for _, _, s in results for m in s})
    lines = [f"{what}: median |throughput error| by family, and each EfficientNet row's signed error", "",
             "| efficiency | " + " | ".join(families) + " | " + " | ".join(models) + " |",
             "| --- |" + " --- |" * (len(families) + len(models))]
    for eta, fam, signed in results:
        lines.append(f"| {eta:g} | " + " | ".join(f"{fam.get(f, float('nan')):.1%}" for f in families) + " | "
                     + " | ".join(f"{signed[m]:+.1%}" for m in models) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cls", default="depthwise", help=f"one of {', '.join(CLASSES)}")
    parser.add_argument("--passes", nargs="+", default=None, help="fwd dgrad wgrad (depthwise) or fwd bwd")
    parser.add_argument("--efficiency", nargs="+", type=float, default=list(EFFICIENCIES))
    parser.add_argument("--layout", default="nhwc", choices=("nhwc", "nchw"))
    parser.add_argument("--gpu", default="rtx-3090", help="the GPU whose check rows are priced")
    args = parser.parse_args(argv)
    results = whatif(args.cls, args.passes, args.efficiency, args.layout, args.gpu)
    print(report(results, f"{args.cls} {' '.join(args.passes or ['(every pass)'])}, {args.gpu} {args.layout}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
