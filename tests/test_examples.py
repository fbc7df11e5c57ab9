"""Every script in examples/ runs with small sizes (``--quick``) and says at its top how to run it."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))
PLOTS = {"scaling_llama3_70b.py": "scaling_llama3_70b.png", "dp_fsdp_3d_13b.py": "dp_fsdp_3d_13b.png"}


def test_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert set(PLOTS) <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_says_how_to_run_it(path):
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert f"python examples/{path.name}" in doc
    assert "--quick" in doc


# calibrate_fit_predict.py calibrates this machine (minutes): tests/test_train_runs.py runs it on the
# quick calibration its validation already took, so it is not calibrated a second time here.
CALIBRATES = {"calibrate_fit_predict.py"}


@pytest.mark.parametrize("path", [p for p in EXAMPLES if p.name not in CALIBRATES], ids=lambda p: p.name)
def test_example_runs_quick(path, tmp_path):
    root = str(Path(__file__).resolve().parents[1])  # this checkout, not whatever copy is installed
    env = {**os.environ, "MPLBACKEND": "Agg", "PERFMODEL_QUICK": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(path), "--quick"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip()
    if path.name in PLOTS:
        assert (tmp_path / PLOTS[path.name]).read_bytes()[:4] == b"\x89PNG"
        assert f"wrote {PLOTS[path.name]}" in done.stdout
