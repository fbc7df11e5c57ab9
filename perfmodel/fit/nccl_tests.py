"""Read the text output of NVIDIA nccl-tests into the collectives table.

Usage::

    from perfmodel.fit.nccl_tests import parse_nccl_tests, import_logs
    df = parse_nccl_tests(open("all_reduce_perf.log").read(), source="all_reduce_perf.log")
    df = import_logs(["logs/"], "calib/h100-cluster")   # writes collectives.csv + metadata.json

Understands what ``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``,
``alltoall_perf``, ``sendrecv_perf`` and ``broadcast_perf`` print, old and new:
the table with ``redop``/``root`` columns and ``#wrong`` (2.x), the older one
with an ``error`` column and no ``root``, lines prefixed by launchers
(``0: `` from srun, ``[1,0]<stdout>:`` from mpirun), several runs concatenated
in one file, and NCCL INFO noise between rows. The out-of-place time is used.
A row that cannot be read is counted (``df.attrs["bad_lines"]``), never fatal.

Sizes and bandwidths follow nccl-tests ``doc/PERFORMANCE.md``: ``size_bytes``
is S as printed in the ``size`` column, algbw = S / t and busbw = algbw times
the per-collective factor (``perfmodel.costs.comm.busbw_factor``).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from perfmodel.costs.comm import COLLECTIVES, busbw_factor
from perfmodel.core.errors import InvalidInputError, unknown_name
from perfmodel.core.readers import read_csv_file, read_json_file
from perfmodel.fit.tables import COLLECTIVE_COLUMNS

__all__ = ["COLLECTIVE_KEY_COLUMNS", "collective_from_name", "import_logs", "parse_nccl_tests"]

#: Columns that identify one measurement (a rerun skips rows with the same key).
COLLECTIVE_KEY_COLUMNS = (
    "collective", "backend", "scope", "group_size", "nodes", "ranks_per_node",
    "size_bytes", "dtype",
)
# nccl-tests binary name fragments -> collective (checked in this order)
_NAME_PATTERNS = (
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.I)),
    ("all_reduce", re.compile(r"all_?reduce", re.I)),
    ("all_gather", re.compile(r"all_?gather", re.I)),
    ("all_to_all", re.compile(r"all_?to_?all", re.I)),
    ("sendrecv", re.compile(r"send_?recv", re.I)),
    ("broadcast", re.compile(r"broadcast|bcast", re.I)),
)
# nccl-tests type names (src/common.cu test_typenames) -> our dtype names
_DTYPES = {
    "float": "fp32", "half": "fp16", "bfloat16": "bf16", "double": "fp64",
    "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32",
    "int64": "int64", "uint64": "uint64", "char": "int8", "int": "int32",
    "f8e4m3": "fp8_e4m3", "f8e5m2": "fp8_e5m2", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
}
_ROW = re.compile(r"(?:^|[\s:>\]])(\d+)\s+(\d+)\s+([A-Za-z][\w]*)(?:\s+(.*))?$")
_RANK = re.compile(
    r"#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s*(.*)$"
)
_STARTING = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_VERSION = re.compile(r"#\s*nccl-tests version\s+(\S+)")
_ITERS = re.compile(r"(?<!warmup )(?<!agg )\biters:\s*(\d+)")
_NRANKS = re.compile(r"\bnranks\s+(\d+)")
_AVG_BUSBW = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")


@dataclass
class _Run:
    """What one nccl-tests invocation printed before and around its table."""

    collective: str | None = None
    started: bool = False  # collective read from a '# Collective test starting' line
    version: str = ""
    iters: int | None = None
    ranks: dict = field(default_factory=dict)  # (group, rank) -> (host, device name)
    nranks_info: int | None = None
    has_root: bool | None = None  # None: header not seen, guess per row
    avg_busbw: float | None = None
    rows: list = field(default_factory=list)  # (size, dtype, time_us, busbw printed)


def collective_from_name(name: str) -> str | None:
    """``'all_reduce_perf'`` or ``'logs/alltoall_perf.txt'`` -> our collective name, else None."""
    base = os.path.basename(name)
    for coll, pattern in _NAME_PATTERNS:
        if pattern.search(base):
            return coll
    return None


def _strip_prefix(line: str) -> str:
    """Drop a launcher prefix in front of a ``#`` comment (``0: #``, ``[1,0]<stdout>:#``)."""
    i = line.find("#")
    return line[i:] if i >= 0 else line


def _header_columns(comment: str) -> list[str] | None:
    """Column names of the ``# size count type ... time algbw busbw`` header line, else None."""
    words = comment.lstrip("#").split()
    if len(words) >= 4 and words[0] == "size" and "algbw" in words and "busbw" in words:
        return words
    return None


# nccl-tests prints times in us with two decimals: a row under 10 ns is a printing or parsing accident,
# and sizes above 1 PiB are beyond any device's memory (their algbw would overflow int64 bytes)
MIN_TIME_US = 0.01
MAX_SIZE_BYTES = 2**50


def _parse_size(text: str) -> int:
    if len(text) > 16 or int(text) > MAX_SIZE_BYTES:
        raise ValueError(f"size above {MAX_SIZE_BYTES} bytes")
    return int(text)


def _parse_row(rest: list[str], has_root: bool | None) -> tuple[float, float]:
    """(out-of-place time in us, busbw printed) from the tokens after ``size count type``."""
    i = 0
    if i < len(rest) and re.fullmatch(r"[A-Za-z]\w*", rest[i]):
        i += 1  # redop (sum, prod, min, max, avg, none, ...)
    if has_root is None:  # no header: a root column leaves 4k+1 tokens
        has_root = (len(rest) - i) % 4 == 1
    if has_root:
        int(rest[i])
        i += 1
    time_us, algbw, busbw = (float(x) for x in rest[i:i + 3])  # ValueError when short
    if not (math.isfinite(time_us) and time_us >= MIN_TIME_US and math.isfinite(algbw + busbw)):
        raise ValueError(f"time must be a number >= {MIN_TIME_US} us")
    return time_us, busbw


def _parse_text(text: str, source: str, collective: str | None) -> tuple[list[_Run], int, list[str]]:
    """Split ``text`` into runs (one per nccl-tests invocation); count unreadable rows."""
    default = collective or collective_from_name(source)
    runs = [_Run(collective=default)]
    bad, examples = 0, []
    for raw in text.splitlines():
        line = raw.rstrip()
        comment = _strip_prefix(line)
        if comment.startswith("#"):
            _read_comment(comment, runs, default)
            continue
        if "NCCL INFO" in line or "NCCL WARN" in line:
            nranks = _NRANKS.search(line)
            if nranks:
                runs[-1].nranks_info = max(runs[-1].nranks_info or 0, int(nranks.group(1)))
            continue
        match = _ROW.search(line)
        if not match:
            continue
        size, count, type_name, rest = match.groups()
        try:
            if type_name not in _DTYPES:
                raise ValueError(f"unknown data type {type_name!r}")
            time_us, busbw = _parse_row((rest or "").split(), runs[-1].has_root)
            size = _parse_size(size)
        except (ValueError, IndexError):
            bad += 1
            if len(examples) < 5:
                examples.append(line.strip()[:120])  # a 5-million-digit size is not shown whole
            continue
        runs[-1].rows.append((size, _DTYPES[type_name], time_us, busbw))
    return [r for r in runs if r.rows], bad, examples


def _read_comment(comment: str, runs: list[_Run], default: str | None) -> None:
    """Update the current run from one ``#`` line; start a new run where a new one begins."""
    run = runs[-1]
    starting = _STARTING.match(comment)
    version = _VERSION.match(comment)
    nthread = comment.startswith("# nThread")
    begins = (
        (version and (run.rows or run.started or run.version))
        or (starting and (run.rows or run.started))
        or (nthread and (run.rows or run.iters is not None))
    )
    if begins:
        runs.append(_Run(collective=default))
        run = runs[-1]
    if starting:
        run.collective = collective_from_name(starting.group(1)) or run.collective
        run.started = True
    if version:
        run.version = version.group(1)
    if nthread and _ITERS.search(comment):
        run.iters = int(_ITERS.search(comment).group(1))
    rank = _RANK.match(comment)
    if rank:
        group = int(rank.group(2) or 0)
        run.ranks[(group, int(rank.group(1)))] = (rank.group(3), rank.group(4).strip())
    columns = _header_columns(comment)
    if columns:
        run.has_root = "root" in columns
    avg = _AVG_BUSBW.match(comment)
    if avg:
        run.avg_busbw = float(avg.group(1))


def _run_shape(run: _Run) -> tuple[float, float, float, str, list[str]]:
    """(group_size, nodes, ranks_per_node, device name, hosts) of a run; NaN when unknown."""
    nan = float("nan")
    if run.ranks:
        first_group = min(g for g, _ in run.ranks)
        members = {r: v for (g, r), v in run.ranks.items() if g == first_group}
        group_size = float(len(members))
        hosts = sorted({h for h, _ in members.values()})
        nodes = float(len(hosts))
        per_node = group_size / nodes if group_size % nodes == 0 else nan
        device = next(iter(members.values()))[1]
        return group_size, nodes, per_node, device, hosts
    if run.nranks_info:
        return float(run.nranks_info), nan, nan, "", []
    return nan, nan, nan, "", []


def _int_or_na(x: float):
    return pd.NA if math.isnan(x) else int(x)


def _run_frame(run: _Run) -> pd.DataFrame:
    """Rows of one run in the collectives.csv schema."""
    group_size, nodes, per_node, _, _ = _run_shape(run)
    size = pd.Series([r[0] for r in run.rows], dtype="int64")
    time_s = pd.Series([r[2] / 1e6 for r in run.rows])  # nccl-tests prints microseconds
    algbw = size / time_s / 1e9  # PERFORMANCE.md: algbw = S / t, GB = 1e9 bytes
    if group_size > 0:
        busbw = algbw * float(busbw_factor(run.collective, int(group_size)))
    else:  # ranks unknown: keep what nccl-tests computed
        busbw = pd.Series([r[3] for r in run.rows], dtype=float)
    n = len(run.rows)
    ints = {  # nullable integers: the CSV shows 8, or nothing when unknown
        "group_size": group_size, "nodes": nodes, "ranks_per_node": per_node,
        "reps": float(run.iters) if run.iters else math.nan, "world_size": group_size,
    }
    df = pd.DataFrame({
        "collective": run.collective,
        "backend": "nccl",
        "scope": "world",
        **{k: pd.array([_int_or_na(v)] * n, dtype="Int64") for k, v in ints.items()},
        "size_bytes": size,
        "dtype": [r[1] for r in run.rows],
        "time_s": time_s,
        "time_min_s": float("nan"),  # nccl-tests prints the mean over iterations only
        "algbw_GBps": algbw,
        "busbw_GBps": busbw,
    })
    return df[list(COLLECTIVE_COLUMNS)]


def parse_nccl_tests(text: str, *, source: str = "", collective: str | None = None) -> pd.DataFrame:
    """Parse nccl-tests output into a DataFrame with :data:`COLLECTIVE_COLUMNS`.

    The collective is read from ``# Collective test starting: X_perf`` (nccl-tests
    >= 2.17), else from ``collective``, else from the ``source`` file name
    (``all_gather_perf.log``). ``group_size`` counts the ``#  Rank`` device lines
    (of the first ``Group``), else the ``nranks`` of NCCL INFO lines. Rows that
    cannot be read are counted in ``df.attrs["bad_lines"]`` with a few examples
    in ``df.attrs["bad_examples"]``; ``df.attrs["runs"]`` describes each run.
    """
    if collective is not None and collective not in COLLECTIVES:
        raise unknown_name("collective", collective, COLLECTIVES)
    runs, bad, examples = _parse_text(text, source, collective)
    missing = [r for r in runs if r.collective is None]
    if missing:
        raise InvalidInputError(
            f"cannot tell which collective {source or 'the text'!r} measured: no "
            "'# Collective test starting' line and no collective in its name; name the file after the "
            "binary, e.g. all_reduce_perf.log (or, from Python, pass "
            f"collective= one of {', '.join(COLLECTIVES)})"
        )
    frames = [_run_frame(r) for r in runs]
    df = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(COLLECTIVE_COLUMNS))
    df.attrs["source"] = source
    df.attrs["bad_lines"] = bad
    df.attrs["bad_examples"] = examples
    df.attrs["runs"] = [_run_summary(r) for r in runs]
    return df


def _run_summary(run: _Run) -> dict:
    group_size, nodes, _, device, hosts = _run_shape(run)
    return {
        "collective": run.collective,
        "rows": len(run.rows),
        "group_size": None if math.isnan(group_size) else int(group_size),
        "nodes": None if math.isnan(nodes) else int(nodes),
        "device_name": device,
        "hosts": hosts,
        "nccl_tests_version": run.version,
        "iters": run.iters,
        "avg_busbw_GBps_reported": run.avg_busbw,
    }


def _expand(paths: list[str]) -> list[Path]:
    """Files named, and the ``*.log``/``*.txt``/``*.out`` files of folders named."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(q for q in p.iterdir() if q.suffix in (".log", ".txt", ".out"))
        elif p.is_file():
            files.append(p)
        else:
            raise InvalidInputError(f"'paths' must name files or folders: {str(p)!r} does not exist")
    return files


def _atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and os.replace (no torn files)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _key_strings(df: pd.DataFrame) -> list[tuple[str, ...]]:
    """Key columns as strings that compare equal however the CSV typed them (8 == 8.0)."""
    def text(v) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else (str(int(v)) if v.is_integer() else repr(v))
        return "" if v is None else str(v)
    key = list(COLLECTIVE_KEY_COLUMNS)
    return [tuple(text(v) for v in row) for row in df[key].astype(object).itertuples(index=False)]


def _merge_rows(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """``old`` followed by the rows of ``new`` whose key is not in ``old``."""
    if old.empty:
        return new
    seen = set(_key_strings(old))
    keep = [k not in seen for k in _key_strings(new)]
    return pd.concat([old, new[keep]], ignore_index=True)


def import_logs(paths: list[str], out_dir: str) -> pd.DataFrame:
    """Parse nccl-tests logs and add them to ``out_dir/collectives.csv`` + ``metadata.json``.

    ``paths`` are log files or folders (their ``*.log``, ``*.txt``, ``*.out``).
    Rows already in ``collectives.csv`` (same key) are kept and not duplicated.
    Returns the imported rows; ``attrs["bad_lines"]`` sums the unreadable rows.
    """
    files = _expand(list(paths))
    if not files:
        raise InvalidInputError(f"'paths' must name at least one nccl-tests log: got {list(paths)!r}")
    out = Path(out_dir)
    frames, reports = [], []
    for f in files:
        df = parse_nccl_tests(f.read_text(errors="replace"), source=str(f))
        frames.append(df)
        reports.append({"path": str(f), "rows": len(df), "bad_lines": df.attrs["bad_lines"],
                        "bad_examples": df.attrs["bad_examples"], "runs": df.attrs["runs"]})
    new = pd.concat(frames, ignore_index=True)
    if new.empty:  # nothing to add: say so rather than write an empty import
        examples = [e for r in reports for e in r["bad_examples"]][:2]
        raise InvalidInputError(
            f"no nccl-tests result rows in {', '.join(r['path'] for r in reports)} (expected the output of "
            f"all_reduce_perf and its siblings: '#  size  count  type ...' and one line per size)"
            + (f"; unreadable lines, e.g. {examples}" if examples else ""))
    csv = out / "collectives.csv"
    old = _existing_rows(csv, new.columns)  # both files read and checked before either is written
    meta = _existing_metadata(out / "metadata.json")
    out.mkdir(parents=True, exist_ok=True)
    _atomic_write(csv, _merge_rows(old, new).to_csv(index=False))
    _write_import_metadata(out / "metadata.json", reports, meta)
    new.attrs["bad_lines"] = sum(r["bad_lines"] for r in reports)
    new.attrs["files"] = reports
    return new


def _existing_rows(csv: Path, columns) -> pd.DataFrame:
    """The rows already in ``csv`` (none if it is absent or empty); a table of other columns is refused."""
    if not csv.exists() or (csv.is_file() and not csv.stat().st_size):
        return pd.DataFrame(columns=columns)
    old = read_csv_file(csv, field="out", expect="a collectives.csv written by perfmodel")
    foreign = [c for c in old.columns if c not in columns]
    if foreign or "collective" not in old.columns:
        raise InvalidInputError(f"{str(csv)!r} is not a collectives.csv (columns {list(old.columns)[:8]}; expected "
                                f"{', '.join(columns)}): give another --out folder")
    return old


def _existing_metadata(path: Path) -> dict:
    if not path.exists():
        return {}
    meta = read_json_file(path, field="out", expect="a metadata.json object")
    if not isinstance(meta, dict):
        raise InvalidInputError(f"{str(path)!r} must hold a JSON object: got {type(meta).__name__}")
    return meta


def _write_import_metadata(path: Path, reports: list[dict], meta: dict) -> None:
    runs = [run for r in reports for run in r["runs"]]
    meta.setdefault("source", "nccl-tests")
    for key, values in (("device_name", [r["device_name"] for r in runs]),
                        ("world_size", [r["group_size"] for r in runs]),
                        ("nodes", [r["nodes"] for r in runs])):
        known = [v for v in values if v]
        if known and key not in meta:
            meta[key] = max(known) if key != "device_name" else known[0]
    meta.setdefault("nccl_tests_imports", []).append({
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "files": reports,
    })
    _atomic_write(path, json.dumps(meta, indent=2, default=str) + "\n")
