"""Calibrate this machine (quick), fit a profile, predict a training step, then time the real step.

Run::

    python examples/calibrate_fit_predict.py                     # temporary folder, ~2 min on 2 CPU cores
    python examples/calibrate_fit_predict.py --quick             # the same (the calibration is always quick)
    python examples/calibrate_fit_predict.py --work-dir calib     # keep tables, host files and profiles
    perfmodel validate --quick --profile calib/profile.json      # later: reuse them

On a machine without a GPU the device is the CPU: one process with one torch
thread is one "GPU" (perfmodel.validate.host). Calibrating measures kernels
alone and with two processes computing side by side, and gloo all_reduce
between two processes; fitting turns the tables into profiles.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

import perfmodel as pm
from perfmodel.validate import calibrate_host


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work-dir", default=None, help="folder for the calibration (rerunning resumes it)")
    p.add_argument("--quick", action="store_true", help="accepted for uniformity: this example is always quick")
    args = p.parse_args(argv)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="calibrate-fit-predict-"))

    # 1. calibrate + 2. fit: tables in work/tables*, host description and profiles next to them
    host = calibrate_host(work, threads=1, procs=2, quick=True, log=lambda line: None)
    print(f"profiles: {host.profile} (one process), {host.shared_profile} (two side by side)")

    # 3. predict: a tiny GPT, fp32 (the CPU's precision), one process and two data-parallel ones
    model = pm.transformer(layers=2, hidden=128, heads=4, seq=64, vocab=1024, name="tiny-gpt")
    one = pm.predict(model, pm.cluster(str(host.gpu)), pm.Strategy(micro_batch=4, precision="fp32"),
                     profile=host.profile)
    two = pm.predict(model, pm.cluster(str(host.node)), pm.Strategy(dp=2, micro_batch=4, precision="fp32"),
                     profile=host.shared_profile)
    for label, pred in (("1 process ", one), ("2 procs DDP", two)):
        lo, hi = pred.interval
        print(f"{label}: predicted step {pred.step_time * 1e3:.2f} ms "
              f"(interval {lo * 1e3:.2f}-{hi * 1e3:.2f} ms), bottleneck: {pred.bottleneck}")

    # 4. and the real thing, for comparison (python -m calibration.train appends a row to a CSV)
    runs = work / "example-runs.csv"
    cmd = [sys.executable, "-m", "calibration.train", "--model", "tiny-gpt", "--layers", "2", "--hidden", "128",
           "--heads", "4", "--seq", "64", "--vocab", "1024", "--micro-batch", "4", "--device", "cpu",
           "--steps", "10", "--warmup", "3", "--out", str(runs)]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
        return out.returncode
    measured = float(pd.read_csv(runs)["step_time_s"].iloc[-1])
    print(f"1 process : measured step  {measured * 1e3:.2f} ms "
          f"({100 * (one.step_time - measured) / measured:+.1f}% error)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
