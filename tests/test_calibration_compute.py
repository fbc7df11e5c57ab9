"""Compute calibration: grid, byte counts, request checks, a quick run, interrupt and resume."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from calibration import compute, grids
from calibration.ops import copies_for, moved_bytes
from calibration.tables import COMPUTE_COLUMNS, COMPUTE_KEY_COLUMNS

ROOT = Path(__file__).resolve().parents[1]
NO_GPU = not torch.cuda.is_available()


def cpu_quick() -> grids.Request:
    return grids.Request(device="cpu", dtypes=("fp32",), timings=("eager",), quick=True)


def test_quick_cpu_grid_covers_every_op_without_graphs():
    cases = grids.cases(cpu_quick())
    assert {c["op"] for c in cases} == set(compute.BUILDERS) - {"h2d", "d2h"}  # no host copies without a GPU
    assert {c["timing"] for c in cases} == {"eager"}
    assert 100 <= len(cases) <= 200  # >= 4 shapes per class, still < 10 s on 2 cores
    keys = [tuple(str(c.get(k)) for k in COMPUTE_KEY_COLUMNS) for c in cases]
    assert len(set(keys)) == len(keys)


def test_gpu_grid_times_small_forward_ops_in_graphs_too():
    req = grids.Request(device="cuda:0", dtypes=("bf16", "fp32"), timings=("eager", "graph"),
                        mem_limit_bytes=80e9)
    cases = grids.cases(req)
    graph = {(c["op"], c["phase"]) for c in cases if c["timing"] == "graph"}
    assert ("layernorm", "fwd") in graph and ("launch_add", "fwd") in graph
    # forward + backward of row-wise ops in graphs too (autograd's CPU cost hides their GPU time)
    assert ("layernorm", "fwdbwd") in graph and ("swiglu", "fwdbwd") in graph
    assert ("sdpa", "fwdbwd") not in graph and ("embedding", "fwdbwd") not in graph
    assert ("sdpa", "fwd") not in graph
    norms = {c["dtype"] for c in cases if c["op"] in ("layernorm", "rmsnorm", "residual_add")}
    assert norms == {"fp32"}  # norms and residual adds run in fp32 under autocast
    assert {c["dtype"] for c in cases if c["op"] == "h2d"} == {"pinned", "pageable"}
    misaligned = [c for c in cases if c["op"] == "gemm" and c["dtype"] == "bf16"
                  and (c["m"], c["n"], c["k"]) in ((4095, 4096, 4096), (4096, 4097, 4096), (4096, 4096, 4100))]
    assert len(misaligned) == 3
    # the memory limit drops what does not fit: 32768 x 256000 fp32 logits are 33.5 GB
    assert not any(c["op"] == "cross_entropy" and c["vocab"] == 256000 and c["tokens"] == 32768 for c in cases)


def test_bytes_moved_are_hand_checkable():
    # layernorm fwd on 2048 x 768 fp32: read x + write y = 2 * 2048 * 768 * 4 bytes
    assert moved_bytes({"op": "layernorm", "phase": "fwd", "dtype": "fp32", "tokens": 2048, "hidden": 768}) == 12_582_912
    # swiglu fwd+bwd bf16: 3 tensors forward + 5 backward of 2048 x 768 x 2 bytes
    assert moved_bytes({"op": "swiglu", "phase": "fwdbwd", "dtype": "bf16", "tokens": 2048, "hidden": 768}) == 8 * 2048 * 768 * 2
    # AdamW: 7 fp32 values per parameter (p, g, m, v read; p, m, v written)
    assert moved_bytes({"op": "adamw", "phase": "step", "dtype": "fp32", "params": 10**6}) == 28_000_000
    # logits cast before cross-entropy: 2 bytes read + 4 written per logit
    assert moved_bytes({"op": "cast_bf16_to_fp32", "phase": "fwd", "dtype": "fp32", "tokens": 2, "vocab": 10}) == 120
    # embedding fwd+bwd: gather (2 T H) + zero the V x H gradient + read dy and scatter-add (3 T H), fp32
    assert moved_bytes({"op": "embedding", "phase": "fwdbwd", "dtype": "fp32", "tokens": 8, "vocab": 100,
                        "hidden": 4}) == (5 * 8 * 4 + 100 * 4) * 4


def test_inputs_rotate_only_when_they_fit_in_l2():
    small = {"op": "gemm", "dtype": "bf16", "m": 512, "n": 512, "k": 512}  # 1 MiB of inputs
    big = {"op": "gemm", "dtype": "bf16", "m": 8192, "n": 8192, "k": 8192}
    l2 = 50 * 2**20
    assert copies_for(small, "cuda:0", l2) == 16
    assert copies_for(big, "cuda:0", l2) == 1
    assert copies_for(small, "cpu", None) == 1


@pytest.mark.parametrize("argv, message", [
    (["--dtypes", "fp8"], "fp8 matmuls need a CUDA GPU of compute capability 8.9 or newer; on the CPU use --dtypes bf16"),
    (["--dtypes", "tf32"], "tf32 is a CUDA math mode; on the CPU use --dtypes fp32"),
    (["--timing", "graph"], r"CUDA graphs \(--timing graph\) need a GPU; on the CPU use --timing eager"),
    (["--dtypes", "fp64"], r"unknown dtype 'fp64'.*\(known: bf16, fp16, fp32, fp8, tf32\)"),
    (["--ops", "matmul"], "unknown op 'matmul'"),
    (["--device", "cuda"], "--device cuda: no CUDA GPU is visible to torch"),
])
@pytest.mark.skipif(not NO_GPU, reason="checks the messages of a machine without a GPU")
def test_gpu_only_requests_on_a_cpu_exit_2_naming_the_alternative(tmp_path, capsys, argv, message):
    assert compute.main(["--out", str(tmp_path), "--quick", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("calibration.compute: error: ")
    import re
    assert re.search(message, err), err
    assert not (tmp_path / "compute.csv").exists()


def test_another_machines_folder_is_refused_unless_forced(tmp_path, capsys):
    (tmp_path / "metadata.json").write_text(json.dumps(
        {"host": "gpu-node-7", "hosts": ["gpu-node-7"], "device": "cuda", "device_name": "NVIDIA H200"}))
    argv = ["--out", str(tmp_path), "--quick", "--device", "cpu", "--ops", "launch_add", "--no-progress"]
    assert compute.main(argv) == 2
    assert "holds measurements of another machine (NVIDIA H200 (cuda) on gpu-node-7)" in capsys.readouterr().err
    assert compute.main([*argv, "--force-mix"]) == 0
    assert json.loads((tmp_path / "metadata.json").read_text())["mixed"] is True
    rows = list(csv.DictReader((tmp_path / "compute.csv").open()))
    assert [(r["op"], r["phase"]) for r in rows] == [("launch_add", "fwd"), ("launch_add", "fwdbwd")]
    assert float(rows[0]["time_s"]) > 0


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _compute(out: Path, *extra: str, **kw) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "calibration.compute", "--out", str(out), "--no-progress", *extra]
    return subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def _rows(path: Path) -> list[str]:
    return path.read_text().splitlines()[1:] if path.exists() else []


@pytest.mark.slow
def test_quick_run_writes_the_schema_and_a_rerun_skips_everything(tmp_path):
    proc = _compute(tmp_path, "--quick")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    with (tmp_path / "compute.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames) == COMPUTE_COLUMNS
    assert len(rows) >= 40
    assert all(float(r["time_s"]) > 0 and float(r["time_min_s"]) <= float(r["time_s"]) for r in rows)
    starts = [float(r["start_s"]) for r in rows]  # when each case began: rows in the order measured
    assert starts[0] >= 0 and all(b > a for a, b in zip(starts, starts[1:]))
    assert {r["op"] for r in rows} >= {"gemm", "sdpa", "layernorm", "cross_entropy", "adamw", "conv2d", "copy"}
    meta = json.loads((tmp_path / "metadata.json").read_text())
    assert meta["device"] == "cpu" and meta["quick"] is True
    assert meta["command"].endswith(f"-m calibration.compute --out {tmp_path} --no-progress --quick")
    again = _compute(tmp_path, "--quick")
    out, err = again.communicate(timeout=120)
    assert again.returncode == 0 and out.startswith(f"compute.csv: 0 rows written, {len(rows)} already there")
    assert len(_rows(tmp_path / "compute.csv")) == len(rows)


def _start_and_kill(out: Path, sig: int, at_least: int) -> list[str]:
    """Start a CPU GEMM calibration, kill it with ``sig`` once ``at_least`` new rows are in."""
    before = len(_rows(out / "compute.csv"))
    proc = _compute(out, "--device", "cpu", "--ops", "gemm")
    deadline = time.monotonic() + 60
    while len(_rows(out / "compute.csv")) < before + at_least:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "interrupted: finished rows are kept" in err
    else:
        assert proc.returncode == -signal.SIGKILL
    return _rows(out / "compute.csv")


def _keys(lines: list[str]) -> list[tuple[str, ...]]:
    return [tuple(row[: len(COMPUTE_KEY_COLUMNS)]) for row in csv.reader(lines)]


@pytest.mark.slow
def test_interrupted_runs_lose_no_row_and_resume_skips_done_rows(tmp_path):
    planned = len(grids.cases(grids.Request(device="cpu", dtypes=("fp32",), timings=("eager",),
                                            ops=frozenset({"gemm"}))))
    after_int = _start_and_kill(tmp_path, signal.SIGINT, 5)
    after_kill = _start_and_kill(tmp_path, signal.SIGKILL, 3)
    complete = [line for line in after_kill if line.count(",") == len(COMPUTE_COLUMNS) - 1]
    assert after_kill[: len(after_int)] == after_int  # the second run appended, changed nothing
    assert len(set(_keys(complete))) == len(complete)  # and measured nothing twice
    done = _compute(tmp_path, "--device", "cpu", "--ops", "gemm")
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    final = _rows(tmp_path / "compute.csv")
    assert final[: len(complete)] == complete
    assert len(final) == len(set(_keys(final))) == planned
    assert f"{planned - len(complete)} rows written, {len(complete)} already there" in out


def test_gpu_runs_idle_after_each_case_in_proportion_to_its_load(tmp_path, monkeypatch):
    """On a GPU every case waits ``cooldown`` x the previous case's busy seconds (capped), so a row does
    not inherit the power-limited state of a heavy one; the CPU path never waits."""
    from calibration.timing import Plan, Timing

    plan = Plan(cooldown=1.0, cooldown_max_s=0.05, warmup=1)
    assert plan.idle_before(0.01) == 0.01 and plan.idle_before(3.0) == 0.05 and Plan().idle_before(1.0) == 0.0
    assert Timing(0.001, 0.001, 0.001, reps=4, inner=5).busy_s(warmup=1) == pytest.approx(0.022)
    slept = []
    monkeypatch.setattr(compute.time, "sleep", slept.append)
    monkeypatch.setattr(grids.Request, "gpu", property(lambda self: True))  # the CPU plays a GPU
    monkeypatch.setattr(compute.torch.cuda, "get_device_properties", lambda device: object())
    req = grids.Request(device="cpu", dtypes=("fp32",), timings=("eager",), quick=True, ops=frozenset({"copy"}))
    summary = compute.run(req, tmp_path, plan, progress=False)
    rows = _rows(tmp_path / "compute.csv")
    assert summary.written == len(rows) >= 3
    assert len(slept) == summary.written - 1 and all(0 < s <= 0.05 for s in slept)


def test_cpu_timing_batches_calls_and_reports_per_call_seconds():
    from calibration.timing import Plan, time_cpu

    t = time_cpu([lambda: time.sleep(0.001)], Plan(max_reps=4, min_reps=4))
    assert t.inner == 1 and t.reps == 4  # a 1 ms call already fills a 0.2 ms batch
    assert 0.001 <= t.min_s <= t.median_s <= t.p90_s < 0.01
    fast = time_cpu([lambda: None], Plan(max_reps=3, min_reps=3))
    assert fast.inner > 10 and fast.median_s < 1e-4  # tiny calls are batched


def test_cuda_event_timing_divides_each_batch_by_its_calls(monkeypatch):
    """The GPU path's arithmetic, with CUDA events replaced by a virtual clock each call advances 50 µs."""
    from calibration import timing

    clock = [0.0]

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self):
            self.t = clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return (end.t - self.t) * 1e3  # milliseconds, as CUDA events report

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    rotated = []

    def call(i):
        rotated.append(i)
        clock[0] += 5e-5
    calls = [lambda i=i: call(i) for i in range(3)]
    t = timing.time_cuda(calls, timing.Plan(max_reps=5, min_reps=5))
    assert t.reps == 5 and t.inner == 4  # 4 calls of 50 µs fill the 0.2 ms batch
    assert t.median_s == pytest.approx(5e-5)
    assert set(rotated) == {0, 1, 2}  # inputs rotate among the copies


def test_a_failed_graph_capture_stops_the_run_and_a_rerun_skips_that_case(tmp_path, monkeypatch, capsys):
    cases = [{"op": "launch_add", "phase": "fwd", "dtype": "fp32", "timing": t, "bytes": 8}
             for t in ("graph", "eager")]
    monkeypatch.setattr(grids, "cases", lambda req: [dict(c) for c in cases])
    calls = []

    def fake_measure(case, device, plan, l2, clock=None):
        calls.append(case["timing"])
        if case["timing"] == "graph":
            raise RuntimeError("CUDA error: operation failed due to a previous error during capture")
        return {**case, "time_s": 1e-5, "time_min_s": 1e-5, "time_p90_s": 1e-5, "reps": 3, "inner": 1}
    monkeypatch.setattr(compute, "measure_case", fake_measure)
    req = grids.Request(device="cpu", dtypes=("fp32",), timings=("eager",), quick=True)
    first = compute.run(req, tmp_path, compute.QUICK_PLAN, progress=False)
    assert first.stopped_by_capture and first.written == 0 and calls == ["graph"]  # nothing after it
    second = compute.run(req, tmp_path, compute.QUICK_PLAN, progress=False)
    assert not second.stopped_by_capture and second.written == 1 and calls == ["graph", "eager"]
    compute._report(first, tmp_path, None)
    assert "rerun the same command" in capsys.readouterr().out
