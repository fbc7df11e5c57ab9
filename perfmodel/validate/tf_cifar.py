"""CIFAR-10 ResNets trained with TensorFlow 1.2 on one K80 or P100, as DAWNBench logged them.

    python -m perfmodel.validate.tf_cifar          # predicted against measured steps/s, per row and per GPU

Rows: ``perfmodel/data/published_tf_cifar_runs.csv``. Stanford DAWN's DAWNBench v1 entries (2017) trained
tensorflow/models' CIFAR ResNet (stanford-futuredata/dawn-bench-models @faacf04 ``tensorflow/CIFAR10/resnet``:
batch 128, ``--data_format=NCHW`` as its README runs it, fp32, momentum SGD, the CIFAR-10 files through 16
queue-runner threads) on one K80 of a Google Cloud VM (8 vCPU), one K80 of an EC2 p2.xlarge (4 vCPU) and one
P100 PCIe of their cluster; TensorFlow 1.2, CUDA 8.0, cuDNN 5.1 (dawn-bench-entries ``CIFAR10/train/*.json``).
Each row's steps/s is the median of the 707 ``global_step/sec`` readings its training log holds (TensorFlow's
step counter, every 100 steps; the readings taken over a checkpoint save are the slow tail the median leaves
out). Priced as a user would: ``pm.predict(preset, pm.cluster(gpu), Strategy(dp=1, micro_batch=128,
precision="fp32", optimizer="sgd", framework="tensorflow", memory_format="contiguous"))``. Nothing is fitted
to these rows: they check, they do not calibrate (docs/parameter-servers.md, "CIFAR ResNets in TensorFlow
1.2"). Error = predicted / measured steps/s − 1 (+: predicted too fast).
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from perfmodel.core.entry import run_command
from perfmodel.hardware import cluster
from perfmodel.parallel.strategy import Strategy
from perfmodel.predict import predict
from perfmodel.validate import tf_ps
from perfmodel.workload.presets import preset

TF_CIFAR_CSV = Path(__file__).resolve().parent.parent / "data" / "published_tf_cifar_runs.csv"
COLUMNS = ("setting", "machine", "gpu", "model", "batch", "steps_per_s", "readings", "stack", "source")


def load_rows(path=TF_CIFAR_CSV) -> list[dict]:
    """The logged rows as dicts, checked for the columns the scorer reads."""
    return tf_ps.load_rows(path, "published_tf_cifar_runs", COLUMNS)


def row_inputs(r: dict, framework: str = "tensorflow") -> tuple:
    """(model, cluster, strategy) of one row, as a user would write them (fp32, SGD, NCHW, one GPU)."""
    s = Strategy(dp=1, micro_batch=int(r["batch"]), precision="fp32", optimizer="sgd", framework=framework,
                 memory_format="contiguous")
    return preset(r["model"]), cluster(r["gpu"]), s


def score(rows=None) -> list[tf_ps.TfPsRow]:
    """Every row priced (steps/s; one GPU, so no speed-up)."""
    out = []
    for r in load_rows() if rows is None else rows:
        p = predict(*row_inputs(r))
        out.append(tf_ps.TfPsRow(r["setting"], r["model"], int(r["batch"]), 1, "", float(r["steps_per_s"]),
                                 1.0 / p.step_time))
    return out


def summary(scored: list) -> dict[str, tuple[float, float, int]]:
    """(median |error|, median error, rows) overall and per setting (rows with ``setting`` and ``error``)."""
    groups: dict[str, list[tf_ps.TfPsRow]] = {"all": scored}
    for r in scored:
        groups.setdefault(f"setting {r.setting}", []).append(r)
    return {k: (statistics.median(abs(r.error) for r in g), statistics.median(r.error for r in g), len(g))
            for k, g in groups.items()}


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print_report(score(), "steps/s", digits=3, width=26)
    return 0


def print_report(scored: list, unit: str, *, digits: int, width: int) -> None:
    """Each scored row (``setting``, ``model``, ``measured``, ``predicted``, ``error``; values in ``unit``), then
    the :func:`summary` table, one line per group (this check's and ``pytorch_cifar``'s report)."""
    print(f"{'setting':<10} {'model':<{width}} {'measured':>9} {'predicted':>9} {'error':>8}   ({unit}, batch 128)")
    for r in scored:
        print(f"{r.setting:<10} {r.model:<{width}} {r.measured:9.{digits}f} {r.predicted:9.{digits}f} {r.error:+8.1%}")
    print("\nmedian |error|, median error (rows)")
    for k, (a, m, n) in summary(scored).items():
        print(f"  {k:<20} {a:7.1%} {m:+7.1%}  ({n})")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
