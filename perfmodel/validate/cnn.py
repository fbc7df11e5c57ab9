"""Published CNN training throughput (``perfmodel/data/published_cnn_runs.csv``) against the predictor.

    python -m perfmodel.validate.cnn                    # errors per row, medians per family, GPU and layout
    python -m perfmodel.validate.cnn --breakdown efficientnet-b0 rtx-3090 256   # a step by kernel class

Each row is one model trained on one GPU at a batch size (timm's ``benchmark.py``:
synthetic images, SGD with momentum, ``torch.autocast``), priced as a user would:
``pm.predict(preset, gpu, Strategy(micro_batch=batch, precision=..., optimizer="sgd", memory_format=layout))``.
Nothing in perfmodel is fitted to these rows: they check, they do not calibrate.
Two numbers per row: the throughput error, and the error of the throughput relative
to ResNet-50 on the same GPU, layout and stack (what is left once the GPU's absolute
scale, datasheet-derived for a GPU without measurements, is divided out).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path

import numpy as np

from perfmodel.core.entry import run_command
from perfmodel.core.errors import InvalidInputError
from perfmodel.core.readers import read_csv_file
from perfmodel.costs.cnn import CNN_CLASSES, kernel_label
from perfmodel.costs.compute import kernel_time
from perfmodel.parallel.strategy import Strategy
from perfmodel.predict import predict
from perfmodel.profiles.profile import load_profile
from perfmodel.workload.kernels import PRECISIONS, gemm_dtype
from perfmodel.workload.presets import preset

CNN_RUNS_CSV = Path(__file__).resolve().parent.parent / "data" / "published_cnn_runs.csv"
BASELINE = "resnet50"  # the model other rows are compared with on the same GPU
COLUMNS = ("model", "family", "gpu", "precision", "layout", "optimizer", "batch", "samples_per_s", "source")


@dataclasses.dataclass(frozen=True)
class CnnRow:
    """One published run and its prediction (samples per second)."""

    model: str
    family: str
    gpu: str
    layout: str
    batch: int
    measured: float
    predicted: float
    source: str

    @property
    def error(self) -> float:
        """Signed relative error of the predicted throughput (+: predicted faster than measured)."""
        return self.predicted / self.measured - 1.0


def read_cnn_runs(path: str | Path = CNN_RUNS_CSV) -> list[dict]:
    """The rows of a published CNN runs table (columns :data:`COLUMNS` at least)."""
    table = read_csv_file(path, field="published CNN runs")
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise InvalidInputError(f"published CNN runs {str(path)!r} needs columns {', '.join(COLUMNS)}: "
                                f"missing {', '.join(missing)}")
    return [{k: str(v) for k, v in row.items()} for row in table.to_dict("records")]


def score(rows: list[dict] | None = None, profiles: dict | None = None) -> list[CnnRow]:
    """Each row priced with the public API (on ``profiles[gpu]`` where given, else the GPU's bundled profile)."""
    out = []
    for r in read_cnn_runs() if rows is None else rows:
        batch = int(r["batch"])
        p = predict(*row_inputs(r), profile=(profiles or {}).get(r["gpu"]))
        out.append(CnnRow(r["model"], r["family"], r["gpu"], r["layout"], batch, float(r["samples_per_s"]),
                          batch / float(p.step_time), r["source"]))
    return out


def row_inputs(r: dict) -> tuple:
    """(model, GPU, strategy) of one published row, as a user would write them (one GPU)."""
    return preset(r["model"]), r["gpu"], Strategy(micro_batch=int(r["batch"]), precision=r["precision"],
                                                   optimizer=r["optimizer"], memory_format=r["layout"])


def relative_errors(scored: list[CnnRow]) -> dict[CnnRow, float]:
    """Error of each row's throughput divided by ResNet-50's on the same GPU and layout (rows without
    such a baseline, and the baseline itself, are left out)."""
    base = {(r.gpu, r.layout, r.source): r for r in scored if r.model == BASELINE}
    out = {}
    for r in scored:
        b = base.get((r.gpu, r.layout, r.source))
        if b is not None and r is not b:
            out[r] = (r.predicted / b.predicted) / (r.measured / b.measured) - 1.0
    return out


def summary(scored: list[CnnRow]) -> dict[tuple[str, str, str], tuple[int, float, float | None]]:
    """(GPU, layout, family) -> (rows, median |error|, median |relative error| or None)."""
    rel = relative_errors(scored)
    groups: dict = {}
    for r in scored:
        groups.setdefault((r.gpu, r.layout, r.family), []).append(r)
    out = {}
    for key, rs in sorted(groups.items()):
        rels = [abs(rel[r]) for r in rs if r in rel]
        out[key] = (len(rs), statistics.median(abs(r.error) for r in rs), statistics.median(rels) if rels else None)
    return out


# (model, the model it extends, what the difference adds): the step time one adds per image isolates a part
INCREMENTS = (("seresnext50-32x4d", "resnext50-32x4d", "squeeze-excitation (16 blocks)"),
              ("seresnext101-32x4d", "resnext101-32x4d", "squeeze-excitation (33 blocks)"),
              ("resnext50-32x4d", "resnet50", "grouped 3x3 (32 groups) for dense, wider 1x1"),
              ("resnet101", "resnet50", "17 dense bottlenecks at 14x14"),
              ("resnet152", "resnet101", "4 at 28x28 and 13 at 14x14 dense bottlenecks"))


def increments(scored: list[CnnRow]) -> list[tuple[str, str, str, float, float]]:
    """(layout, pair, what it adds, measured, predicted seconds per image) of each :data:`INCREMENTS` pair
    on the same GPU, layout and stack: a part's own cost, measured without a kernel benchmark."""
    rows = {(r.model, r.gpu, r.layout, r.source): r for r in scored}
    out = []
    for (model, gpu, layout, source), r in rows.items():
        for big, small, what in INCREMENTS:
            base = rows.get((small, gpu, layout, source))
            if model == big and base is not None:
                out.append((f"{gpu} {layout}", f"{big} - {small}", what, 1 / r.measured - 1 / base.measured,
                            1 / r.predicted - 1 / base.predicted))
    return out


def _label(kern) -> str:
    if kern.cls in CNN_CLASSES:
        label = kernel_label(kern)
        return (label.split("-")[0] if label.startswith("conv.") else label) + ":" + kern.variant
    return f"{kern.cls}:{kern.variant}"


def class_breakdown(model: str, gpu: str, batch: int, precision: str = "fp16-mixed") -> dict[str, float]:
    """GPU seconds of one step's forward, backward and loss kernels by class (``conv.depthwise:wgrad``,
    ``batchnorm:bwd``, ``silu:fwd`` ...), largest first; the optimizer and communication are not included."""
    graph, profile = preset(model), load_profile(gpu)
    dtype = gemm_dtype(precision)
    if f"gemm:{dtype}" not in profile.compute:
        have = [p for p in PRECISIONS if f"gemm:{gemm_dtype(p)}" in profile.compute]
        raise InvalidInputError(f"precision {precision!r}: profile {profile.name!r} has no {dtype} GEMM rate; "
                                f"valid here: {', '.join(have)}")
    fwd, bwd = graph.layer_kernels(batch, precision=precision)
    loss_fwd, loss_bwd = graph.head_kernels(batch, precision=precision)
    out: dict[str, float] = {}
    for kern in fwd + bwd + loss_fwd + loss_bwd:
        gpu_s, _ = kernel_time(profile, kern)
        out[_label(kern)] = out.get(_label(kern), 0.0) + float(np.sum(gpu_s)) * float(np.sum(kern.count))
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def report(scored: list[CnnRow]) -> str:
    """The rows and the medians as markdown tables."""
    rel = relative_errors(scored)
    lines = ["| model | GPU | layout | batch | measured /s | predicted /s | error | vs ResNet-50 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in scored:
        vs = f"{rel[r]:+.1%}" if r in rel else "-"
        lines.append(f"| {r.model} | {r.gpu} | {r.layout} | {r.batch} | {r.measured:.0f} | {r.predicted:.0f} | "
                     f"{r.error:+.1%} | {vs} |")
    lines += ["", "| GPU | layout | family | rows | median abs error | median abs error vs ResNet-50 |",
              "| --- | --- | --- | --- | --- | --- |"]
    for (gpu, layout, family), (n, err, rel_err) in summary(scored).items():
        rel_text = "-" if rel_err is None else f"{rel_err:.1%}"
        lines.append(f"| {gpu} | {layout} | {family} | {n} | {err:.1%} | {rel_text} |")
    lines += ["", "| GPU, layout | pair | adds | measured ms/image | predicted ms/image | predicted / measured |",
              "| --- | --- | --- | --- | --- | --- |"]
    for where, pair, what, measured, predicted in increments(scored):
        lines.append(f"| {where} | {pair} | {what} | {measured * 1e3:.3f} | {predicted * 1e3:.3f} | "
                     f"{predicted / measured:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--breakdown", nargs=3, metavar=("MODEL", "GPU", "BATCH"),
                        help="print one step's GPU time by kernel class instead")
    parser.add_argument("--precision", default="fp16-mixed", choices=PRECISIONS,
                        help="of --breakdown (fp32 on a GPU without 16-bit rates, e.g. the k80)")
    args = parser.parse_args(argv)
    if args.breakdown:
        model, gpu, batch = args.breakdown
        if not batch.isdigit() or int(batch) < 1:
            raise InvalidInputError(f"--breakdown BATCH {batch!r}: a positive whole number of images, e.g. 256")
        parts = class_breakdown(model, gpu, int(batch), args.precision)
        total = sum(parts.values())
        print(f"{model} on {gpu}, batch {batch}, {args.precision}: {total * 1e3:.1f} ms of kernels")
        for label, t in parts.items():
            print(f"  {label:28s} {t * 1e3:8.2f} ms  {t / total:6.1%}")
        return 0
    print(report(score()))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
