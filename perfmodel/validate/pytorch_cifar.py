"""CIFAR-10 ResNet-164s trained with PyTorch 0.1.12 on one K80 or P100, as DAWNBench logged them.

    python -m perfmodel.validate.pytorch_cifar     # predicted against measured epoch seconds, per row and per GPU

Rows: ``perfmodel/data/published_pytorch_cifar_runs.csv``. The same DAWNBench v1 entries as
``validate/tf_cifar.py``, in the other framework, on the same three machines: stanford-futuredata/dawn-bench-models
@faacf04 ``pytorch/CIFAR10`` (its README's command: batch 128, SGD with momentum and weight decay, fp32, random
crop and flip in one loader worker) trained ``preact164`` and ``preact164-basic`` under PyTorch 0.1.12, CUDA 8.0,
cuDNN 5.1 (dawn-bench-entries ``CIFAR10/train/dawn_resnet164_*_pytorch.json``).

What an epoch holds: ``train.py`` runs the 50,000 training images (390 batches of 128 and one of 80), then the
10,000 test images forward (``run(..., train=False)``, volatile inputs). Each entry's ``.tsv`` gives the hours
elapsed at each epoch's end, counted from the run's first batch (``results.py``: ``elapsed`` over the merged train
and test records), so one epoch's difference holds its training steps and one pass over the test images. The row's
``epoch_s`` is the median of the 180 differences.

Priced as a user would: ``pm.predict(preset, pm.cluster(gpu), Strategy(dp=1, micro_batch=128, precision="fp32",
optimizer="sgd", framework="pytorch", memory_format="contiguous"))``; the epoch is train_images / 128 steps plus
eval_images / 128 forward passes (the step's forward phase). Nothing is fitted to these rows: they check, beside
the TensorFlow rows, whether a CIFAR gap is the framework's or the GPU's kernels (docs/parameter-servers.md).
Error = predicted / measured epochs per second − 1 (+: predicted too fast).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from perfmodel.core.entry import run_command
from perfmodel.predict import predict
from perfmodel.validate import tf_cifar, tf_ps

PYTORCH_CIFAR_CSV = Path(__file__).resolve().parent.parent / "data" / "published_pytorch_cifar_runs.csv"
COLUMNS = ("setting", "machine", "gpu", "model", "batch", "train_images", "eval_images", "epoch_s", "epochs",
           "stack", "source")


@dataclass(frozen=True)
class EpochRow:
    """One logged run and its prediction, in seconds per epoch."""

    setting: str
    model: str
    measured: float  # seconds per epoch
    predicted: float

    @property
    def error(self) -> float:
        """Predicted / measured epochs per second − 1 (+: predicted too fast)."""
        return self.measured / self.predicted - 1.0


def load_rows(path=PYTORCH_CIFAR_CSV) -> list[dict]:
    """The logged rows as dicts, checked for the columns the scorer reads."""
    return tf_ps.load_rows(path, "published_pytorch_cifar_runs", COLUMNS)


def row_inputs(r: dict) -> tuple:
    """(model, cluster, strategy) of one row, as a user would write them."""
    return tf_cifar.row_inputs(r, framework="pytorch")


def predicted_epoch(r: dict, p=None) -> float:
    """Seconds of one epoch: its training steps and its forward passes over the test images (``p``: the row's
    prediction, when already made)."""
    p = predict(*row_inputs(r)) if p is None else p
    batch = int(r["batch"])
    return int(r["train_images"]) / batch * p.step_time + int(r["eval_images"]) / batch * p.breakdown["forward"]


def score(rows=None) -> list[EpochRow]:
    """Every row priced."""
    return [EpochRow(r["setting"], r["model"], float(r["epoch_s"]), predicted_epoch(r))
            for r in (load_rows() if rows is None else rows)]


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    tf_cifar.print_report(score(), "s per epoch", digits=1, width=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
