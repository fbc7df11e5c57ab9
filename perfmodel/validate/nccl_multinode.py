"""Multi-node all-reduce bus bandwidth the model predicts against the points NCCL's maintainers and users
reported (``profiles/data/reference/nccl_busbw_reported_points.csv``, the rows with more than one node).

Check data only: nothing is fitted to these rows. Each row is priced twice, by NCCL's tuning model
(``costs/nccl_tuning.py``, the default) and by the constant-latency ring that preceded it (the link's
latency per ring step), so a change of the inter-node model shows on them. The rows report large
messages; the cluster each describes is built from the catalog (``CHECKS``), with its NIC count.

    python -m perfmodel.validate.nccl_multinode
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pandas as pd

from perfmodel.core.entry import no_options, run_command
from perfmodel.costs.comm import hierarchical_time
from perfmodel.hardware.build import cluster as build_cluster
from perfmodel.hardware.catalog import load_link
from perfmodel.parallel.fabric import cluster_collectives
from perfmodel.predict import default_profile

POINTS_CSV = Path(__file__).parents[1] / "profiles" / "data" / "reference" / "nccl_busbw_reported_points.csv"

# system (the CSV's first column) -> the cluster it describes, the message size priced and the figure read
CHECKS = (
    {"system": "DGX-A100 8x200Gb/s IB", "node": "dgx-a100-80gb", "nodes": 4, "nics": 8, "nic": "ib-hdr",
     "size": 2**33, "figure": r"([\d.]+)"},
    {"system": "A800 8-GPU node, 1x HDR 200G NIC", "node": "dgx-a100-80gb", "nodes": 12, "nics": 1, "nic": "ib-hdr",
     "size": 2**33, "figure": r"([\d.]+) inter"},
    {"system": "single 100Gb/s NIC", "node": "dgx-a100-80gb", "nodes": 2, "nics": 1, "nic": "ib-edr",
     "size": 2**33, "figure": r"([\d.]+)"},
    {"system": "A100x8 per node, 4x dual-port 200Gb IB", "node": "dgx-a100-80gb", "nodes": 2, "nics": 4,
     "nic": "ib-hdr", "size": 2**32, "figure": r"([\d.]+)"},  # a dual-port card is held to one x16 PCIe 4.0 link
)


def _cluster(check: dict):
    base = build_cluster(check["node"], nodes=check["nodes"])
    node = dataclasses.replace(base.node, nic=load_link(check["nic"]), nics_per_node=check["nics"])
    return dataclasses.replace(base, node=node)


def _busbw(coll, size: float, rpn: int, nodes: int) -> float:
    n = rpn * nodes
    return size / float(hierarchical_time(coll, "all_reduce", size, rpn, nodes, algorithm="ring")) * 2 * (n - 1) / n


def score() -> pd.DataFrame:
    """One row per reported multi-node point: published and predicted busbw (GB/s), both inter-node models."""
    points = pd.read_csv(POINTS_CSV)
    rows = []
    for check in CHECKS:
        row = points[(points.system == check["system"]) & (points.nodes.astype(str) != "1")].iloc[0]
        published = float(re.search(check["figure"], str(row.busbw_GBps)).group(1))
        cl = _cluster(check)
        coll = cluster_collectives(cl, default_profile(cl))
        ring = {**coll, "inter": {k: {x: y for x, y in e.items() if x != "nccl"} for k, e in coll["inter"].items()}}
        rpn, size = cl.node.gpus_per_node, float(check["size"])
        nccl, old = (_busbw(c, size, rpn, check["nodes"]) / 1e9 for c in (coll, ring))
        rows.append({"system": check["system"], "nodes": check["nodes"], "size_bytes": int(size),
                     "published_GBps": published, "nccl_model_GBps": nccl, "constant_latency_GBps": old,
                     "error_nccl": published / nccl - 1, "error_constant": published / old - 1})
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    no_options(__doc__, argv)
    pd.set_option("display.width", 200)
    print(score().to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
