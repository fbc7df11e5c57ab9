"""The co-location harness: processes follow one cycle clock and every row is accounted for."""

import pytest

pytest.importorskip("torch")

from calibration import interference  # noqa: E402


def test_phase_clock_cycles_through_together_then_each_alone():
    # 2 jobs, 1 s phases: [0, 1) together, [1, 2) job 0 alone, [2, 3) job 1 alone, then cycle 1
    assert interference.phase_of(0.5, 0.0, 1.0, 2)[:2] == (0, 0)
    assert interference.phase_of(1.5, 0.0, 1.0, 2)[:2] == (0, 1)
    assert interference.phase_of(2.5, 0.0, 1.0, 2)[:2] == (0, 2)
    assert interference.phase_of(3.2, 0.0, 1.0, 2)[:2] == (1, 0)


def test_alternate_cycles_run_their_phases_backwards():
    # ABBA: cycle 0 together, 0 alone, 1 alone; cycle 1 job 1 alone, job 0 alone, together
    order = [interference.phase_of(t + 0.5, 0.0, 1.0, 2, alternate=True)[:2] for t in range(6)]
    assert order == [(0, 0), (0, 1), (0, 2), (1, 2), (1, 1), (1, 0)]
    assert interference.phase_of(6.5, 0.0, 1.0, 2, alternate=True)[:2] == (2, 0)


def test_a_pair_of_launch_storms_is_measured_together_and_alone():
    rows = interference.measure([("launch", "launch")], "kernel", phase_s=0.3, cycles=1, setup_s=0.3,
                                guard_s=0.05, alternate=True, log=lambda _: None)
    assert {r["slot"] for r in rows} <= {0, 1} and {r["mix"] for r in rows} == {"launch+launch"}
    assert len(rows) >= 1  # a cycle whose phase held no whole iteration is left out, not invented
    for r in rows:
        assert set(interference.COLUMNS) == set(r)
        assert r["wall_alone_s"] > 0 and r["wall_together_s"] > 0 and r["iterations"] >= 1
        assert r["slowdown"] == pytest.approx(r["wall_together_s"] / r["wall_alone_s"])
        assert r["other_alone"] >= 0 and r["other_together"] >= 0


def _row(repeat, slot, alone, together):
    return {"mix": "a+b", "job": "a", "slot": slot, "repeat": repeat, "slowdown": 2.0, "cpu_slowdown": 1.0,
            "sessions_alone": alone, "sessions_together": together}


def test_loaded_cycles_are_dropped_and_the_mix_run_again(monkeypatch):
    # run 1: cycle 1 saw 3 other sessions in job 1's solo phase; run 2: cycle 0 clean, cycle 1 loaded
    runs = iter([[_row(0, 0, 0, 1), _row(0, 1, 1, 1), _row(1, 0, 0, 0), _row(1, 1, 3, 0)],
                 [_row(0, 0, 0, 0), _row(0, 1, 0, 0), _row(1, 0, 2.5, 0), _row(1, 1, 0, 0)]])
    monkeypatch.setattr(interference, "run_mix", lambda *a, **k: next(runs))
    assert interference.loaded_cycles([_row(0, 0, 0, 1.5), _row(1, 0, 1, 1)], 1) == {0}
    assert interference.loaded_cycles([_row(0, 0, 9, 9)], None) == set()
    log = []
    rows = interference.measure([("a", "b")], "kernel", phase_s=1, cycles=2, setup_s=0, guard_s=0,
                                max_sessions=1, attempts=3, log=log.append)
    assert [(r["repeat"], r["slot"]) for r in rows] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert max(max(r["sessions_alone"], r["sessions_together"]) for r in rows) <= 1
    assert sum("dropped 1 cycles" in line for line in log) == 2


def test_a_wait_at_the_cpu_clock_read_counts_in_the_iteration_after_it(monkeypatch):
    # the scheduler can end a slice at a CPU-clock read (update_curr): here every read waits 2 ms.
    # Chained timing counts those waits, so a phase's timed iterations cover it; timed one by one,
    # the read after each iteration fell outside it and half the phase went unseen
    import time

    clock = time.process_time

    def slow_clock():
        time.sleep(0.002)
        return clock()

    monkeypatch.setattr(interference, "_kernel", lambda kind: (lambda: None))
    monkeypatch.setattr(interference.time, "process_time", slow_clock)
    rows = interference.worker("compute", "kernel", time.time() + 0.05, 0.3, 1, 0, 1, 0.05)
    assert [r["phase"] for r in rows] == [0, 1]
    for r in rows:
        assert r["n"] > 20 and r["wall_s"] >= 0.8 * (0.3 - 0.05)


def test_streams_are_enqueued_so_their_fronts_advance_together():
    from calibration import gpu_interference as gi

    # 1 ms and 0.25 ms iterations, 2 ms of each: the one whose enqueued work ends earliest goes next
    assert gi.interleave([1e-3, 0.25e-3], 2e-3) == [0, 1, 1, 1, 1, 0, 1, 1, 1, 1]
    with pytest.raises(ValueError, match="must be > 0"):
        gi.interleave([0.0], 1.0)


def test_stream_iterations_count_only_where_every_stream_had_work():
    from calibration import gpu_interference as gi

    # stream 0 ends iterations at 1, 2, 3, 4 s; stream 1 at 1.5, 3 s: the window ends at 3 s.
    # guard 0.5 s drops stream 0's first iteration (starts at 0) and stream 1's first too
    got = gi.window_means([[1.0, 2.0, 3.0, 4.0], [1.5, 3.0]], 0.5)
    assert got == [(pytest.approx(1.0), 2), (pytest.approx(1.5), 1)]
    assert gi.window_means([[1.0], []], 0.0) == [(pytest.approx(float("nan"), nan_ok=True), 0), (
        pytest.approx(float("nan"), nan_ok=True), 0)]
    rows = gi.stream_rows(("compute", "memory"), 3, {0: (2e-3, 10), 1: (1e-3, 0)}, {0: (1e-3, 20), 1: (1e-3, 5)})
    assert len(rows) == 1 and rows[0]["slowdown"] == pytest.approx(2.0) and rows[0]["repeat"] == 3
    assert set(rows[0]) | {"device", "harness"} == set(interference.COLUMNS)


def test_the_cuda_harness_says_clearly_when_no_gpu_is_there(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is present: the message for its absence cannot be seen here")
    with pytest.raises(SystemExit) as e:
        interference.main(["kernels", "--streams", "--out", "unused.csv"])
    assert e.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err
    from calibration import gpu_interference as gi

    with pytest.raises(RuntimeError, match="use --device cpu"):
        gi.cuda_kernel("compute")


def _fake_cuda(monkeypatch):
    """torch.cuda's events, streams and kernels replaced by host clocks and sleeps: the streams
    harness's own logic runs as on a GPU whose streams run one after the other."""
    import contextlib
    import time
    import types

    from calibration import gpu_interference as gi

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self, stream=None):
            self.t = time.perf_counter()

        def elapsed_time(self, other):
            return (other.t - self.t) * 1e3

    class Stream:
        def wait_event(self, event):
            pass

    cuda = types.SimpleNamespace(Event=Event, Stream=Stream, synchronize=lambda: None, get_device_name=lambda i: "fake",
                                 stream=lambda s: contextlib.nullcontext())
    monkeypatch.setattr(gi, "require_cuda", lambda: types.SimpleNamespace(cuda=cuda))
    sleeps = {"compute": 2e-3, "memory": 1e-3, "launch": 5e-4}
    monkeypatch.setattr(gi, "cuda_kernel", lambda kind, sync=True, stream=None: lambda: time.sleep(sleeps[kind]))


def test_the_streams_harness_gives_the_process_harness_rows(monkeypatch):
    _fake_cuda(monkeypatch)
    rows = interference.measure([("compute", "memory")], "kernel", phase_s=0.04, cycles=2, setup_s=0.0,
                                guard_s=0.005, streams=True, alternate=True, log=lambda _: None)
    assert {(r["slot"], r["repeat"]) for r in rows} == {(0, 0), (1, 0), (0, 1), (1, 1)}
    for r in rows:
        assert set(r) == set(interference.COLUMNS) and r["harness"] == "streams" and r["device"] == "fake"
        # streams of this stand-in run one after the other: together takes longer than alone
        assert r["slowdown"] > 1.0 and r["iterations"] >= 1


def test_a_cuda_worker_times_the_gpu_kernel_on_the_same_clock(monkeypatch):
    import time

    _fake_cuda(monkeypatch)
    rows = interference.worker("memory", "kernel", time.time() + 0.02, 0.1, 1, 0, 1, 0.01, device="cuda")
    assert [r["phase"] for r in rows] == [0, 1] and all(r["n"] >= 5 for r in rows)


def test_the_streams_command_writes_its_csv_mix_by_mix(monkeypatch, tmp_path):
    import pandas as pd

    _fake_cuda(monkeypatch)
    out = tmp_path / "kernels-streams.csv"
    assert interference.main(["kernels", "--streams", "--out", str(out), "--phase", "0.03", "--guard", "0.005",
                              "--cycles", "1", "--mixes", "compute+launch", "memory+memory"]) == 0
    rows = pd.read_csv(out)
    assert set(rows["mix"]) == {"compute+launch", "memory+memory"} and set(rows["harness"]) == {"streams"}


def test_the_gpu_script_parses_and_runs_both_harnesses_and_the_fit():
    import subprocess
    from pathlib import Path

    script = Path(interference.__file__).with_name("single_gpu_interference.sh")
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    for needed in ("kernels --device cuda", "kernels --streams", "perfmodel.fit.gpu_interference", "timeout"):
        assert needed in text, needed
