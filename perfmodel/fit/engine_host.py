"""Fit the DeepSpeed engine's host seconds from ``calibration/deepspeed_host.py`` rows.

    python -m perfmodel.fit.engine_host perfmodel/data/deepspeed-host-2026-12-01/host.csv
"""

from __future__ import annotations

import argparse

import numpy as np

from perfmodel.core.entry import run_command
from perfmodel.core.lazy import scipy_optimize
from perfmodel.core.readers import read_csv_file


def fit_deepspeed_host(path) -> dict[int, tuple[float, float]]:
    """ZeRO stage -> (per-step s, per tensor per micro-step s): non-negative least squares of the
    measured extra seconds on [1, tensors × accumulation]."""
    t = read_csv_file(path, field="deepspeed host rows")
    out = {}
    for stage, g in t.groupby("stage"):
        x = np.column_stack([np.ones(len(g)), g["tensors"] * g["accumulation"]])
        coef, _ = scipy_optimize.nnls(x, g["extra_s"].to_numpy(float))
        out[int(stage)] = (float(coef[0]), float(coef[1]))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rows", help="the CSV calibration/deepspeed_host.py writes")
    for stage, (a, b) in fit_deepspeed_host(parser.parse_args(argv).rows).items():
        print(f"ZeRO-{stage}: {a * 1e3:.2f} ms per step + {b * 1e6:.2f} us per tensor per micro-step")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
