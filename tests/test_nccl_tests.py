"""nccl-tests log importer: fixtures in the exact format the tools print."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from perfmodel.core.errors import InvalidInputError, UnknownNameError
from perfmodel.fit.nccl_tests import collective_from_name, import_logs, parse_nccl_tests
from perfmodel.fit.tables import COLLECTIVE_COLUMNS

FIXTURES = Path(__file__).parent / "fixtures" / "nccl_tests"


def parse(name: str, **kw) -> pd.DataFrame:
    path = FIXTURES / name
    return parse_nccl_tests(path.read_text(), source=str(path), **kw)


def printed_rows(name: str) -> list[tuple[int, float, float]]:
    """(size, out-of-place time us, out-of-place busbw) read independently from the text."""
    rows = []
    for line in (FIXTURES / name).read_text().splitlines():
        words = line.split()
        if words and words[0] in ("0:", "[1,0]<stdout>:"):
            words = words[1:]
        elif line.startswith("[1,0]<stdout>:"):
            words = line[len("[1,0]<stdout>:"):].split()
        if len(words) >= 11 and words[0].isdigit() and words[2] in ("float", "bfloat16"):
            rows.append((int(words[0]), float(words[-8]), float(words[-6])))
    return rows


def test_all_reduce_new_format_golden_row():
    df = parse("all_reduce_perf_1node_8gpu.log")
    assert list(df.columns) == list(COLLECTIVE_COLUMNS)
    assert len(df) == 21 and df.attrs["bad_lines"] == 0
    assert df["size_bytes"].min() == 1024 and df["size_bytes"].max() == 2**30
    row = df[df["size_bytes"] == 1048576].iloc[0]
    # printed: 1048576 ... 17.90 us  58.58 GB/s algbw  102.51 GB/s busbw
    assert row["time_s"] == pytest.approx(17.90e-6)
    assert row["algbw_GBps"] == pytest.approx(1048576 / 17.90e-6 / 1e9)  # 58.58
    assert row["busbw_GBps"] == pytest.approx(58.58 * 1.75, abs=0.01)  # 102.51
    assert (row["collective"], row["backend"], row["scope"], row["dtype"]) == ("all_reduce", "nccl", "world", "fp32")
    assert (row["group_size"], row["nodes"], row["ranks_per_node"], row["world_size"]) == (8, 1, 8, 8)
    assert row["reps"] == 20  # 'iters: 20', not 'warmup iters: 5'
    assert math.isnan(row["time_min_s"])
    run = df.attrs["runs"][0]
    assert run["nccl_tests_version"] == "2.17.6" and run["device_name"] == "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.log")))
def test_every_fixture_matches_the_printed_numbers(name):
    df = parse(name)
    printed = printed_rows(name)
    assert len(df) == len(printed) > 0
    assert df["size_bytes"].tolist() == [p[0] for p in printed]
    assert df["time_s"].tolist() == pytest.approx([p[1] / 1e6 for p in printed])
    # recomputed from size and the rounded time: equal to the printed busbw up to rounding
    for ours, (_, _, bus) in zip(df["busbw_GBps"], printed):
        assert ours == pytest.approx(bus, abs=0.01, rel=0.01)


def test_srun_prefix_two_nodes_and_a_torn_row_is_counted():
    df = parse("all_gather_perf_2nodes_srun.log")
    assert len(df) == 10
    assert df.attrs["bad_lines"] == 1
    assert df.attrs["bad_examples"] == ["0:     33554432        524288     float"]
    assert 33554432 not in df["size_bytes"].tolist()
    assert set(df["group_size"]) == {16} and set(df["nodes"]) == {2} and set(df["ranks_per_node"]) == {8}
    assert df.attrs["runs"][0]["hosts"] == ["node-017", "node-018"]


def test_old_formats_without_root_or_redop():
    ar = parse("all_reduce_perf_v2_old.log")  # 'redop' and an 'error' column, no 'root'
    assert len(ar) == 25 and set(ar["group_size"]) == {4}
    bc = parse("broadcast_perf_old.log")  # 'root' but no 'redop'; NCCL WARN lines inside
    assert len(bc) == 22 and bc.attrs["bad_lines"] == 0 and set(bc["nodes"]) == {2}
    assert (bc["busbw_GBps"] == bc["algbw_GBps"]).all()
    a2a = parse("alltoall_perf_old.log")  # header names 'redop', rows leave it blank
    assert len(a2a) == 11 and set(a2a["collective"]) == {"all_to_all"}
    row = a2a[a2a["size_bytes"] == 65536].iloc[0]  # 25.38 us, 8 ranks: busbw = S/t * 7/8
    assert row["busbw_GBps"] == pytest.approx(65536 / 25.38e-6 / 1e9 * 7 / 8)


def test_reduce_scatter_bf16_reads_dtype_and_iters():
    df = parse("reduce_scatter_perf_bf16.log")
    assert set(df["dtype"]) == {"bf16"} and set(df["reps"]) == {50}


def test_two_runs_in_one_file_with_mpirun_prefix():
    df = parse("mixed_all_reduce_broadcast_mpirun.log")
    assert df.groupby("collective").size().to_dict() == {"all_reduce": 5, "broadcast": 5}
    assert [r["collective"] for r in df.attrs["runs"]] == ["all_reduce", "broadcast"]
    bc = df[df["collective"] == "broadcast"]
    assert (bc["busbw_GBps"] == bc["algbw_GBps"]).all()


def test_collective_from_binary_name():
    assert collective_from_name("logs/all_reduce_perf.txt") == "all_reduce"
    assert collective_from_name("reduce_scatter_perf") == "reduce_scatter"
    assert collective_from_name("alltoall_perf.log") == "all_to_all"
    assert collective_from_name("sendrecv_perf") == "sendrecv"
    assert collective_from_name("hypercube_perf") is None


def test_unknown_collective_is_an_error_naming_the_fix():
    text = (FIXTURES / "all_reduce_perf_v2_old.log").read_text()
    with pytest.raises(InvalidInputError, match=r"cannot tell which collective 'run1.log' measured.*e\.g\. all_reduce_perf\.log"):
        parse_nccl_tests(text, source="run1.log")
    assert len(parse_nccl_tests(text, source="run1.log", collective="all_reduce")) == 25
    with pytest.raises(UnknownNameError, match="unknown collective 'gather'"):
        parse_nccl_tests(text, collective="gather")


def test_garbage_never_crashes_and_without_ranks_keeps_printed_busbw():
    text = "\n".join([
        "random words",
        "# size count type redop root time algbw busbw #wrong time algbw busbw #wrong",
        "        1024           256     float     sum      -1    10.00    0.10    0.18      0    10.0  0.10  0.18  0",
        "        2048           512     weird     sum      -1    10.00    0.20    0.36      0    10.0  0.20  0.36  0",
        "        4096          1024     float     sum      -1      N/A    0.40    0.72      0",
        "        8192          2048     float     sum      -1    -1.00    0.80    1.44      0",
    ])
    df = parse_nccl_tests(text, collective="all_reduce")
    assert len(df) == 1 and df.attrs["bad_lines"] == 3
    assert df["busbw_GBps"].iloc[0] == 0.18 and pd.isna(df["group_size"].iloc[0])
    assert len(parse_nccl_tests("", collective="all_reduce")) == 0


def test_import_logs_writes_tables_and_does_not_duplicate(tmp_path):
    out = tmp_path / "calib"
    df = import_logs([str(FIXTURES)], str(out))
    n = len(df)
    assert n == 21 + 10 + 25 + 11 + 22 + 10 + 16 + 19
    assert df.attrs["bad_lines"] == 1
    table = pd.read_csv(out / "collectives.csv")
    assert list(table.columns) == list(COLLECTIVE_COLUMNS) and len(table) == n
    assert table["group_size"].dtype.kind == "i"  # written as 8, not 8.0
    again = import_logs([str(FIXTURES / "sendrecv_perf_2nodes.log")], str(out))
    assert len(again) == 19 and len(pd.read_csv(out / "collectives.csv")) == n
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["source"] == "nccl-tests" and len(meta["nccl_tests_imports"]) == 2
    assert meta["nccl_tests_imports"][0]["files"][0]["path"].endswith(".log")


def test_import_logs_rejects_missing_paths(tmp_path):
    with pytest.raises(InvalidInputError, match="'paths' must name files or folders: '.*nope' does not exist"):
        import_logs([str(tmp_path / "nope")], str(tmp_path / "out"))
    with pytest.raises(InvalidInputError, match="at least one nccl-tests log"):
        import_logs([str(tmp_path)], str(tmp_path / "out"))


def test_a_log_without_results_is_an_error_and_writes_nothing(tmp_path):
    (tmp_path / "notes.log").write_text("hello\nthis is not nccl-tests output\n")
    with pytest.raises(InvalidInputError, match="no nccl-tests result rows in"):
        import_logs([str(tmp_path / "notes.log")], str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
