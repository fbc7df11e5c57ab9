"""A failed training launch is reported by its error line, and a multi-process launch is tried twice."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

from perfmodel.validate import loop
from perfmodel.validate.launch import failure_line

TORCHRUN_TAIL = """Traceback (most recent call last):
  File "train.py", line 3, in <module>
RuntimeError: The server socket has failed to listen on any local network address.
=======================================================
calibration.train FAILED
-------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
=======================================================
"""


def _done(code: int, stderr: str = "", stdout: str = "") -> subprocess.CompletedProcess:
    return subprocess.CompletedProcess([], code, stdout=stdout, stderr=stderr)


def test_the_reported_line_is_the_error_not_torchruns_banner():
    assert failure_line(_done(1, TORCHRUN_TAIL)).startswith("RuntimeError: The server socket")
    assert failure_line(_done(2, "usage: train\ntrain: error: unknown --flag\n")) == "train: error: unknown --flag"
    assert failure_line(_done(1, "", "just this\n")) == "just this"
    assert failure_line(_done(1)) == "(no output)"


def test_a_multi_process_launch_is_tried_twice_and_a_single_one_once(monkeypatch, tmp_path: Path):
    calls = []

    def fake_call(cmd, threads, what, timeout_s=900.0):
        calls.append(what)
        return _done(1, TORCHRUN_TAIL) if len(calls) == 1 else _done(0, stdout="row written\n")

    monkeypatch.setattr(loop, "_call", fake_call)
    run = loop.DDP_CALIBRATION_RUNS[0]
    logged = []
    failures = loop.measure_runs([replace(run, procs=2)], tmp_path / "out.csv",
                                 target=lambda r: ("cpu-host", None), log=logged.append)
    assert failures == [] and len(calls) == 2 and "launching it again" in logged[0]
    calls.clear()
    failures = loop.measure_runs([replace(run, procs=1)], tmp_path / "out.csv",
                                 target=lambda r: ("cpu-host", None), log=logged.append)
    assert len(calls) == 1 and failures == [f"{run.label} procs=1: exit 1: RuntimeError: The server socket has "
                                            "failed to listen on any local network address."]


def test_a_retried_launch_leaves_one_row_of_its_run(monkeypatch, tmp_path: Path):
    """A rank that fails after rank 0 wrote the run's row makes the launch exit non-zero: the retry must not leave
    that row beside its own (the run would be scored twice)."""
    out = tmp_path / "out.csv"
    out.write_text("model,dp\nearlier,1\n")
    attempts = []

    def fake_call(cmd, threads, what, timeout_s=900.0):
        attempts.append(what)
        with out.open("a") as f:
            f.write("tiny,2\n")  # rank 0 writes its row on every attempt
        return _done(1, TORCHRUN_TAIL) if len(attempts) == 1 else _done(0, stdout="row written\n")

    monkeypatch.setattr(loop, "_call", fake_call)
    run = replace(loop.DDP_CALIBRATION_RUNS[0], procs=2)
    assert loop.measure_runs([run], out, target=lambda r: ("cpu-host", None), log=lambda line: None) == []
    assert out.read_text() == "model,dp\nearlier,1\ntiny,2\n" and len(attempts) == 2
