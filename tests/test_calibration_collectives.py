"""Collective calibration: launcher variables, groups per scope, sizes, a 2-process gloo run."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from calibration import collectives
from calibration.collectives import Layout, exact_size, parse_sizes
from calibration.env import dist_env
from calibration.tables import COLLECTIVE_COLUMNS
from perfmodel.core.errors import PerfModelError

ROOT = Path(__file__).resolve().parents[1]


def test_torchrun_and_slurm_variables():
    env = dist_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4",
                    "MASTER_ADDR": "n1", "MASTER_PORT": "29400"})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 8, 3, 4)
    assert (env.master_addr, env.master_port, env.launcher) == ("n1", 29400, "torchrun")
    env = dist_env({"SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
                    "SLURM_TASKS_PER_NODE": "8(x2)", "MASTER_ADDR": "n1"})
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.launcher) == (9, 16, 1, 8, "slurm")
    assert dist_env({"PATH": "/bin"}) is None
    assert dist_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}) is None  # a single task: nothing to measure


def test_groups_of_each_scope_on_two_nodes_of_four():
    layout = Layout(rank=0, world_size=8, hosts=("a",) * 4 + ("b",) * 4)
    assert layout.scope_groups("world") == [(tuple(range(8)),)]
    assert layout.scope_groups("intra") == [((0, 1, 2, 3), (4, 5, 6, 7))]
    assert layout.scope_groups("inter") == [((0, 4), (1, 5), (2, 6), (3, 7))]  # every rail at once
    assert layout.scope_groups("subgroup") == [((0, 1),)]  # 4 consecutive ranks would repeat 'intra'
    assert layout.span((0, 4)) == (2, 1) and layout.span((0, 1, 2, 3, 4)) == (2, None)


def test_one_node_has_no_intra_or_inter_scope_but_subgroups():
    layout = Layout(rank=0, world_size=8, hosts=("a",) * 8)
    assert layout.scope_groups("intra") == [] and layout.scope_groups("inter") == []
    assert layout.scope_groups("subgroup") == [((0, 1),), ((0, 1, 2, 3),)]


def test_sizes_and_the_exact_s_of_split_collectives():
    assert parse_sizes("1KiB:8KiB") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1MiB") == [2**20]
    with pytest.raises(PerfModelError, match=r"'--sizes' must be LOW:HIGH with 1 <= LOW <= HIGH: got '8KiB:1KiB'"):
        parse_sizes("8KiB:1KiB")
    # all_gather on 3 ranks of fp32: 1024 B -> 85 elements per rank -> S = 85 * 3 * 4 = 1020 B
    assert exact_size("all_gather", 3, 1024, 4) == 1020
    assert exact_size("all_reduce", 3, 1022, 4) == 1020
    assert exact_size("all_to_all", 8, 16, 4) == 0  # too small to give each rank an element


def test_without_a_launcher_it_prints_the_torchrun_command(monkeypatch, capsys):
    for key in list(os.environ):
        if key in ("RANK", "WORLD_SIZE") or key.startswith("SLURM_"):
            monkeypatch.delenv(key)
    assert collectives.main(["--out", "calib/x", "--quick"]) == 2
    err = capsys.readouterr().err
    assert "needs one process per device, started by torchrun or srun" in err
    assert "  torchrun --nproc-per-node " in err and " -m calibration.collectives --out calib/x --quick\n" in err


@pytest.mark.slow
def test_two_gloo_processes_measure_every_collective_and_resume(tmp_path):
    # python -m torch.distributed.run is torchrun, with this interpreter; --standalone picks a free port
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "calibration.collectives", "--quick", "--no-progress", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    with (tmp_path / "collectives.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames) == COLLECTIVE_COLUMNS
    assert {r["collective"] for r in rows} == set(collectives.COLLECTIVES)
    assert len(rows) == 6 * 4  # 1 KiB, 4 KiB, 16 KiB, 64 KiB
    for r in rows:
        assert (r["backend"], r["scope"], r["group_size"], r["world_size"]) == ("gloo", "world", "2", "2")
        algbw = int(r["size_bytes"]) / float(r["time_s"]) / 1e9
        assert float(r["algbw_GBps"]) == pytest.approx(algbw)
        factor = {"all_reduce": 1.0, "broadcast": 1.0, "sendrecv": 1.0}.get(r["collective"], 0.5)  # n = 2
        assert float(r["busbw_GBps"]) == pytest.approx(algbw * factor)
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0 and "0 rows written, 24 already there" in again.stdout


@pytest.mark.slow
def test_cold_timing_measures_single_calls_after_a_cache_sweep(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "calibration.collectives", "--collectives", "all_reduce", "--sizes", "4KiB:64KiB", "--cold", "1MiB",
           "--no-progress", "--out", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    with (tmp_path / "collectives.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["size_bytes"]) for r in rows] == [4096, 8192, 16384, 32768, 65536]
    assert all(int(r["reps"]) == collectives.COLD_REPS for r in rows)  # one call per rep
    assert json.loads((tmp_path / "metadata.json").read_text())["cold_bytes"] == 2**20
    bad = subprocess.run(cmd[:-2] + ["--cold", "lots", "--out", str(tmp_path / "x")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=180)
    assert bad.returncode != 0 and "--cold" in bad.stderr
