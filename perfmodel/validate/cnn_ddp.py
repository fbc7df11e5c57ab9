"""Data-parallel CNN training as published (``perfmodel/data/published_cnn_ddp_runs.csv``).

    python -m perfmodel.validate.cnn_ddp          # errors per row, medians per setting

Each row is ResNet-50 trained with PyTorch's data parallelism on 1-32 V100-SXM2 GPUs (8 per server,
NVLink hybrid cube mesh, one 100 Gb/s EDR InfiniBand port per server), as OneFlow's DLPerf measured
pytorch/examples' ImageNet script (sources in ``published_cnn_runs.md``), priced as a user would: ``pm.predict(preset,
pm.cluster(node, nodes, gpus_per_node, nic=...), Strategy(dp=gpus, micro_batch=batch, precision=...,
optimizer="sgd", memory_format=layout))``. Nothing is fitted to these rows: they check. Two errors per
row, as ``validate.tf_ps`` gives them: the absolute images/s, and the speed-up over the 1-GPU row of
the same setting (what is left of the data-parallel terms once the one-GPU error divides out).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from perfmodel.core.entry import run_command
from perfmodel.hardware import cluster, load_link
from perfmodel.parallel.strategy import Strategy
from perfmodel.predict import predict
from perfmodel.validate.speedup import SpeedupErrors, median_abs, print_medians, speedup_cell
from perfmodel.validate.tf_ps import load_rows as _load_rows
from perfmodel.workload.presets import preset

CNN_DDP_CSV = Path(__file__).resolve().parent.parent / "data" / "published_cnn_ddp_runs.csv"
COLUMNS = ("setting", "model", "gpu", "node", "nodes", "gpus_per_node", "gpus", "nic", "nics_per_node", "batch",
           "precision", "layout", "optimizer", "images_per_s", "source")


@dataclasses.dataclass(frozen=True)
class DdpRow(SpeedupErrors):
    """One published run, its prediction (images/s) and both speed-ups over its 1-GPU row."""

    setting: str
    gpus: int
    measured: float
    predicted: float
    measured_speedup: float = float("nan")
    predicted_speedup: float = float("nan")


def load_rows(path=CNN_DDP_CSV) -> list[dict]:
    """The published rows as dicts, checked for the columns the scorer reads."""
    return _load_rows(path, field="published_cnn_ddp_runs", columns=COLUMNS)


def row_inputs(r: dict) -> tuple:
    """(model, cluster, strategy) of one published row, as a user would write them."""
    c = cluster(r["node"], nodes=int(r["nodes"]), gpus_per_node=int(r["gpus_per_node"]),
                nic=load_link(r["nic"]) if r["nic"] else None)
    if r["nic"]:  # the site's port count, not the preset's
        c = dataclasses.replace(c, node=dataclasses.replace(c.node, nics_per_node=int(r["nics_per_node"])))
    s = Strategy(dp=int(r["gpus"]), micro_batch=int(r["batch"]), precision=r["precision"], optimizer=r["optimizer"],
                 memory_format=r["layout"])
    return preset(r["model"]), c, s


def score(rows=None) -> list[DdpRow]:
    """Every row priced, with speed-ups over the 1-GPU row of its setting."""
    rows = load_rows() if rows is None else rows
    priced = [(r, float(predict(*row_inputs(r)).samples_per_second)) for r in rows]
    solo = {r["setting"]: (float(r["images_per_s"]), p) for r, p in priced if int(r["gpus"]) == 1}
    out = []
    for r, p in priced:
        m1, p1 = solo.get(r["setting"], (float("nan"), float("nan")))
        gpus, meas = int(r["gpus"]), float(r["images_per_s"])
        ms, ps = (meas / m1, p / p1) if gpus > 1 else (float("nan"), float("nan"))
        out.append(DdpRow(r["setting"], gpus, meas, p, ms, ps))
    return out


def summary(scored: list[DdpRow]) -> dict[str, tuple[float, float, int]]:
    """(median |error| of images/s, median |error| of the speed-up, rows) overall and per setting."""
    groups: dict[str, list[DdpRow]] = {"all": scored}
    for r in scored:
        groups.setdefault(r.setting, []).append(r)
    return {k: (median_abs(r.error for r in g), median_abs(r.speedup_error for r in g), len(g))
            for k, g in groups.items()}


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    scored = score()
    print(f"{'setting':<24} {'gpus':>4} {'meas':>8} {'pred':>8} {'err':>7} {'speedup m/p':>13} {'err':>7}")
    for r in scored:
        sp = speedup_cell(r, r.gpus)
        print(f"{r.setting:<24} {r.gpus:>4} {r.measured:8.1f} {r.predicted:8.1f} {r.error:+7.1%}   {sp}")
    print_medians(summary(scored), 28)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
