"""TensorFlow 1.x parameter-server training as published (``perfmodel/data/published_tf_ps_runs.csv``).

    python -m perfmodel.validate.tf_ps            # errors per row, medians per setting and variable_update

Each row is one tf_cnn_benchmarks run (TensorFlow's performance page of May 2017: synthetic
ImageNet, fp32, plain SGD, K80 GPUs on GCE and EC2), priced as a user would:
``pm.predict(preset, pm.cluster("k80", nodes, gpus_per_node, nic=...), Strategy(dp=gpus,
micro_batch=batch, precision="fp32", optimizer="sgd", framework="tensorflow",
ps_servers=servers))``, synchronous (tf_cnn_benchmarks applies one update per step from all
towers; the distributed rows ran with ``cross_replica_sync=True``). Nothing in perfmodel is
fitted to these rows: they check, they do not calibrate. Two errors per row: the absolute
images/s, and the speed-up over the 1-GPU row of the same setting, model and batch.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from perfmodel.core.entry import run_command
from perfmodel.core.errors import InvalidInputError
from perfmodel.core.readers import read_csv_file
from perfmodel.hardware import cluster
from perfmodel.hardware.cloud import vm_nic
from perfmodel.parallel.strategy import Strategy
from perfmodel.predict import predict
from perfmodel.validate.speedup import SpeedupErrors, median_abs, print_medians, speedup_cell
from perfmodel.workload.presets import preset

TF_PS_CSV = Path(__file__).resolve().parent.parent / "data" / "published_tf_ps_runs.csv"
COLUMNS = ("setting", "machine", "gpu", "nodes", "gpus_per_node", "gpus", "model", "batch", "variable_update",
           "ps_servers", "images_per_s", "source")
# The page's model names -> the presets of what tf_cnn_benchmarks @9165a70 built (models/ of that hash): its
# inception3 has no auxiliary head (inception_model.py); its ResNets and VGG16 are priced on the torchvision presets
TF_MODELS = {"inception-v3": "inception-v3-tf"}
# The instances' network: EC2 p2.8xlarge "10 Gigabit" (AWS instance-type table); GCE 2 Gb/s per vCPU
MACHINE_NIC = {"p2.8xlarge": {"vcpus": 32, "nic": "10Gb/s"}, "n1-standard-32-k80x8": {"vcpus": 32, "provider": "gcp"}}


@dataclasses.dataclass(frozen=True)
class TfPsRow(SpeedupErrors):
    """One published run, its prediction (images/s) and both speed-ups over its 1-GPU row."""

    setting: str
    model: str
    batch: int
    gpus: int
    variable_update: str
    measured: float
    predicted: float
    measured_speedup: float = float("nan")
    predicted_speedup: float = float("nan")


def load_rows(path=TF_PS_CSV, field: str = "published_tf_ps_runs", columns=COLUMNS) -> list[dict]:
    """The published rows as dicts, checked for the ``columns`` the scorer reads."""
    rows = read_csv_file(path, field=field).to_dict("records")
    missing = [c for c in columns if rows and c not in rows[0]]
    if missing or not rows:
        raise InvalidInputError(f"{path}: needs rows with columns {', '.join(columns)}; missing {missing}")
    return rows


def predict_row(r: dict, profile=None) -> float:
    """Predicted images/s of one published row (``profile``: a profile name, path or Profile; default the
    row's GPU's bundled one). A machine without a NIC entry (one DGX-1) is priced without a network."""
    return float(predict(*row_inputs(r), profile=profile).samples_per_second)


def row_inputs(r: dict) -> tuple:
    """(model, cluster, strategy) of one published row, as a user would write them."""
    nodes, gpn, gpus = int(r["nodes"]), int(r["gpus_per_node"]), int(r["gpus"])
    nic = vm_nic(**MACHINE_NIC[r["machine"]]) if r["machine"] in MACHINE_NIC else None
    if nic is None and nodes > 1:
        raise InvalidInputError(f"machine {r['machine']!r} spans {nodes} nodes but has no network "
                                f"(known machines: {', '.join(MACHINE_NIC)})")
    c = cluster(r["gpu"], nodes=nodes, gpus_per_node=gpn, nic=nic)
    s = Strategy(dp=gpus, micro_batch=int(r["batch"]), precision="fp32", optimizer="sgd", framework="tensorflow",
                 ps_servers=int(r["ps_servers"]), ps_local_reduce=r["variable_update"] == "distributed_replicated")
    return preset(TF_MODELS.get(r["model"], r["model"])), c, s


def score(rows=None) -> list[TfPsRow]:
    """Every row priced, with speed-ups over the 1-GPU row of its setting, model and batch."""
    rows = load_rows() if rows is None else rows
    priced = [(r, predict_row(r)) for r in rows]
    solo = {(r["setting"], r["model"], r["batch"]): (float(r["images_per_s"]), p)
            for r, p in priced if int(r["gpus"]) == 1}
    out = []
    for r, p in priced:
        m1, p1 = solo.get((r["setting"], r["model"], r["batch"]), (float("nan"), float("nan")))
        gpus, meas = int(r["gpus"]), float(r["images_per_s"])
        ms, ps = (meas / m1, p / p1) if gpus > 1 else (float("nan"), float("nan"))
        out.append(TfPsRow(r["setting"], r["model"], int(r["batch"]), gpus, r["variable_update"], meas, p, ms, ps))
    return out


def summary(scored: list[TfPsRow]) -> dict[str, tuple[float, float, int]]:
    """(median |error| of images/s, median |error| of the speed-up, rows) overall, per setting and mode."""
    groups: dict[str, list[TfPsRow]] = {"all": scored}
    for r in scored:
        groups.setdefault(f"setting {r.setting}", []).append(r)
        groups.setdefault(f"variable_update {r.variable_update}", []).append(r)
    return {k: (median_abs(r.error for r in g), median_abs(r.speedup_error for r in g), len(g))
            for k, g in groups.items()}


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    scored = score()
    print(f"{'setting':<20} {'model':<13} {'batch':>5} {'gpus':>4} {'mode':<22} {'meas':>7} {'pred':>7} "
          f"{'err':>7} {'speedup m/p':>13} {'err':>7}")
    for r in scored:
        sp = speedup_cell(r, r.gpus)
        print(f"{r.setting:<20} {r.model:<13} {r.batch:>5} {r.gpus:>4} {r.variable_update:<22} "
              f"{r.measured:7.1f} {r.predicted:7.1f} {r.error:+7.1%}   {sp}")
    print_medians(summary(scored), 40)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
