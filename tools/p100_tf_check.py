"""Check tool: one-GPU TensorFlow 1.x runs on a P100 as published, priced on the bundled P100 profile.

    python -m tools.p100_tf_check                         # the bundled profile
    python -m tools.p100_tf_check --profile OLD.json      # any other profile, e.g. before a refit

Rows: ``perfmodel/data/published_tf_p100_single.csv``, TensorFlow's performance page of May 2017
(DGX-1, synthetic ImageNet, fp32, plain SGD, CUDA 8.0 / cuDNN 5.1). They are check data: nothing
is fitted to them. The runs are on the SXM2 P100 (boost 1480 MHz, 300 W); perfmodel prices the
PCIe P100 (boost 1303 MHz, 250 W; P100 datasheets), whose compute-bound kernels should run about
12% slower, so a prediction ~12% below the published rate is the expected one, not an error.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from perfmodel.core.entry import run_command
from perfmodel.core.readers import read_csv_file
from perfmodel.validate import tf_ps

ROWS = Path(__file__).resolve().parents[1] / "perfmodel" / "data" / "published_tf_p100_single.csv"


def score(profile=None) -> list[tuple[str, int, float, float]]:
    """(model, batch, published images/s, predicted images/s) per row, priced as the K80 check prices its
    rows (:func:`perfmodel.validate.tf_ps.predict_row`): one machine, no parameter-server link."""
    out = []
    for r in read_csv_file(ROWS, field="published_tf_p100_single").to_dict("records"):
        row = {**r, "gpu": r["gpu_priced"], "nodes": 1, "gpus_per_node": int(r["gpus"]), "ps_servers": 0}
        pred = tf_ps.predict_row(row, profile=profile or r["gpu_priced"])
        out.append((r["model"], int(r["batch"]), float(r["images_per_s"]), pred))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", help="profile name or JSON path (default: the bundled p100-pcie-16gb)")
    args = parser.parse_args(argv)
    rows = score(args.profile)
    print(f"{'model':14} {'batch':>5} {'published':>9} {'predicted':>9} {'error':>7}")
    for model, batch, meas, pred in rows:
        print(f"{model:14} {batch:5d} {meas:9.1f} {pred:9.1f} {pred / meas - 1:+7.1%}")
    print(f"median |error| {statistics.median(abs(p / m - 1) for _, _, m, p in rows):.1%} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
