"""Durable, resumable result tables and the machine check of an output folder."""

from __future__ import annotations

import json

import pytest

from calibration.tables import (
    COMPUTE_COLUMNS,
    COMPUTE_KEY_COLUMNS,
    MixedMachineError,
    TableWriter,
    format_value,
    update_metadata,
)
from perfmodel.core.errors import InvalidInputError

COLS = ("op", "m", "time_s")
KEYS = ("op", "m")


def test_format_value_is_what_resume_compares():
    assert format_value(None) == ""
    assert format_value(float("nan")) == ""
    assert format_value(True) == "True" and format_value(False) == "False"
    assert format_value(8.0) == "8" and format_value(8) == "8" and format_value("8") == "8"
    assert format_value(1.5e-05) == "1.5e-05"


def test_compute_key_is_every_column_but_the_measured_ones():
    assert COMPUTE_KEY_COLUMNS[:4] == ("op", "phase", "timing", "dtype")
    measured = {"time_s", "time_min_s", "time_p90_s", "reps", "inner", "start_s", "device"}
    assert set(COMPUTE_COLUMNS) - set(COMPUTE_KEY_COLUMNS) == measured


def test_rows_are_appended_once_and_known_on_reopen(tmp_path):
    path = tmp_path / "t.csv"
    w = TableWriter(path, COLS, KEYS)
    w.append({"op": "gemm", "m": 64, "time_s": 1e-5})
    w.append({"op": "gemm", "m": 128})
    assert path.read_text() == "op,m,time_s\ngemm,64,1e-05\ngemm,128,\n"
    again = TableWriter(path, COLS, KEYS)
    assert again.done == {("gemm", "64"), ("gemm", "128")}
    assert again.key({"op": "gemm", "m": 64.0}) in again.done
    assert path.read_text().count("op,m,time_s") == 1


def test_a_torn_last_line_is_dropped(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("op,m,time_s\ngemm,64,1e-05\ngemm,12")  # killed in the middle of a write
    w = TableWriter(path, COLS, KEYS)
    assert w.repaired == len("gemm,12") and w.done == {("gemm", "64")}
    w.append({"op": "gemm", "m": 128, "time_s": 2e-5})
    assert path.read_text() == "op,m,time_s\ngemm,64,1e-05\ngemm,128,2e-05\n"


def test_other_columns_are_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(InvalidInputError, match=r"t.csv has columns \['a', 'b'\], not this table's"):
        TableWriter(path, COLS, KEYS)
    w = TableWriter(tmp_path / "u.csv", COLS, KEYS)
    with pytest.raises(InvalidInputError, match=r"row has columns \['flops'\] not in u.csv"):
        w.append({"op": "gemm", "flops": 1})


def _meta(device_name: str, host: str = "node-1") -> dict:
    return {"host": host, "hosts": [host], "device": "cuda", "device_name": device_name,
            "date": "2026-11-29T00:00:00+00:00", "command": "python -m calibration.compute"}


def test_metadata_keeps_runs_and_refuses_another_machine(tmp_path):
    update_metadata(tmp_path, _meta("NVIDIA H200"))
    meta = update_metadata(tmp_path, _meta("NVIDIA H200"))
    assert len(meta["runs"]) == 2 and "mixed" not in meta
    with pytest.raises(MixedMachineError,
                       match=r"holds measurements of another machine \(NVIDIA H200 \(cuda\) on node-1\); "
                             r"this is NVIDIA A100 \(cuda\) on node-1\. .*--force-mix"):
        update_metadata(tmp_path, _meta("NVIDIA A100"))
    assert json.loads((tmp_path / "metadata.json").read_text())["device_name"] == "NVIDIA H200"
    meta = update_metadata(tmp_path, _meta("NVIDIA A100"), force_mix=True)
    assert meta["mixed"] is True and meta["device_name"] == "NVIDIA A100" and len(meta["runs"]) == 3
