"""docs/calibration.md's four steps on this CPU: the torchrun recipe over gloo (2 processes), a fit that
combines its folder with a compute folder, and a prediction that uses the profile; the SLURM script."""

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import perfmodel as pm

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_four_steps_on_a_cpu(tmp_path, capsys):
    pytest.importorskip("torch")
    from perfmodel.cli import main
    from perfmodel.fit.build import CALIBRATED_H200_TABLES

    out = tmp_path / "calib"
    # step 2: the recipe every node runs (here one node of two gloo processes, collectives only)
    proc = subprocess.run(["bash", "calibration/multinode.sh", str(out), "1", "2", f"127.0.0.1:{_free_port()}",
                           "--quick", "--collectives", "all_reduce", "--scopes", "world"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={"PATH": "/usr/bin:/bin", "STEPS": "collectives", "PYTHON": sys.executable,
                               "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    table = pd.read_csv(out / "collectives" / "collectives.csv")
    assert set(table["collective"]) == {"all_reduce"} and (table["group_size"] == 2).all()
    meta = json.loads((out / "collectives" / "metadata.json").read_text())
    assert meta["device"] == "cpu" and meta["world_size"] == 2
    # a compute folder of the same host (rows borrowed from the bundled tables, to keep the test short)
    compute = out / "compute"
    compute.mkdir()
    rows = pd.read_csv(CALIBRATED_H200_TABLES / "compute.csv")
    pd.concat([rows[(rows.op == "gemm") & (rows.dtype == "fp32")].head(8), rows[rows.op == "add"].head(8)]).to_csv(
        compute / "compute.csv", index=False)
    (compute / "metadata.json").write_text(json.dumps({k: meta.get(k) for k in (
        "device", "device_name", "cpu_model", "torch_threads", "memory_bytes")}))
    # step 3: both folders into one profile, named after the host, every fitted class shown
    profile = tmp_path / "cluster.json"
    assert main(["fit", str(compute), str(out / "collectives"), "-o", str(profile)]) == 0
    report = capsys.readouterr().out
    assert re.search(r"^all_reduce@intra +\d+ +comm_\w+ +\d+\.\d%", report, re.M), report
    assert re.search(r"^gemm:fp32 +8 ", report, re.M)
    hint = re.search(r"predict with it: perfmodel predict --gpu (\S+) --profile (\S+) --precision fp32", report)
    prof = pm.load_profile(str(profile))
    assert prof.gpu.startswith("cpu-") and "all_reduce" in prof.collectives["intra"]
    # step 4: predict with it
    assert main(["predict", "--model", "gpt2-small", "--gpu", hint.group(1), "--profile", hint.group(2),
                 "--precision", "fp32", "--micro-batch", "1"]) == 0
    assert re.search(r"^profile +cpu-\S+ \(measured: fitted to compute, collectives", capsys.readouterr().out, re.M)


def test_slurm_script_and_docs_walk_the_same_steps():
    sbatch = (ROOT / "calibration" / "cluster.sbatch").read_text()
    assert re.search(r"^#SBATCH --nodes=2$", sbatch, re.M) and re.search(r"^#SBATCH --ntasks-per-node=1$", sbatch, re.M)
    assert "calibration/multinode.sh" in sbatch and "scontrol show hostnames" in sbatch
    for script in ("cluster.sbatch", "multinode.sh"):
        assert subprocess.run(["bash", "-n", str(ROOT / "calibration" / script)]).returncode == 0
    docs = (ROOT / "docs" / "calibration.md").read_text()
    section = docs.split("## Calibrate a cluster in four steps", 1)[1].split("\n## ", 1)[0]
    for step in ("**1. Install", "**2. Measure", "**3. Fit", "**4. Predict"):
        assert step in section
    for needed in ("sbatch --nodes 4 calibration/cluster.sbatch", "calibration/multinode.sh", "NODE_RANK",
                   "perfmodel fit calib/cluster/compute calib/cluster/collectives", "--profile cluster.json",
                   "--gpu", "at least 2 nodes", "perfmodel calibrate --collectives"):
        assert needed in section, needed
