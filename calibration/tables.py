"""Result tables that survive Ctrl-C and crashes, and resume where they stopped.

Each finished row is appended to its CSV as one line, flushed and fsync'ed
before the next measurement starts, so an interrupted run loses at most the
row it was measuring. A rerun into the same folder reads the rows already
there and skips their keys. ``metadata.json`` says which machine measured the
folder; measuring another machine into it is refused unless forced.

    writer = TableWriter(out_dir / "compute.csv", COMPUTE_COLUMNS, COMPUTE_KEY_COLUMNS)
    if key not in writer.done: writer.append(row)
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from calibration.env import identity
from perfmodel.errors import InvalidInputError
from perfmodel.fit.nccl_tests import COLLECTIVE_KEY_COLUMNS
from perfmodel.fit.tables import COLLECTIVE_COLUMNS, COMPUTE_COLUMNS, COMPUTE_KEY_COLUMNS

__all__ = [
    "COLLECTIVE_COLUMNS",
    "COLLECTIVE_KEY_COLUMNS",
    "COMPUTE_COLUMNS",
    "COMPUTE_KEY_COLUMNS",
    "MixedMachineError",
    "TableWriter",
    "format_value",
    "update_metadata",
]


class MixedMachineError(InvalidInputError):
    """The output folder holds measurements of another machine."""


def format_value(value) -> str:
    """How a value is written to the CSV (and compared for resume): '' for missing."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)
    return str(value)


def row_key(row: Mapping, key_columns: Sequence[str]) -> tuple[str, ...]:
    return tuple(format_value(row.get(c)) for c in key_columns)


class TableWriter:
    """Append rows to a CSV one fsync'ed line at a time; know which keys are done."""

    def __init__(self, path: str | Path, columns: Sequence[str], key_columns: Sequence[str]):
        self.path = Path(path)
        self.columns = tuple(columns)
        self.key_columns = tuple(key_columns)
        self.done: set[tuple[str, ...]] = set()
        self.repaired = 0  # bytes of a torn last line dropped on open
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._open()

    def _open(self) -> None:
        if self.path.exists() and self.path.stat().st_size:
            self._drop_torn_tail()
            with open(self.path, newline="") as f:
                reader = csv.reader(f)
                header = next(reader, None)
                if header is not None and tuple(header) != self.columns and set(header) < set(self.columns):
                    self._add_columns(header)  # a table of an older schema: rewrite it with the new
                    return self._open()        # (blank) columns, then resume as usual
                if header is not None and tuple(header) != self.columns:
                    raise InvalidInputError(
                        f"{self.path} has columns {header}, not this table's "
                        f"({', '.join(self.columns)}); write to another folder"
                    )
                for values in reader:
                    if len(values) == len(self.columns):
                        self.done.add(row_key(dict(zip(self.columns, values)), self.key_columns))
        if not self.path.exists() or self.path.stat().st_size == 0:
            self._write_line(self.columns)

    def _add_columns(self, header: list[str]) -> None:
        """Rewrite the file (atomically) with this table's columns; columns it lacked stay blank."""
        with open(self.path, newline="") as f:
            rows = [dict(zip(header, values)) for values in list(csv.reader(f))[1:] if len(values) == len(header)]
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
        with os.fdopen(fd, "w", newline="") as f:
            writer = csv.writer(f, lineterminator="\n")
            writer.writerow(self.columns)
            writer.writerows([row.get(c, "") for c in self.columns] for row in rows)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def _drop_torn_tail(self) -> None:
        """Cut a last line that a kill left without its newline (its row was unfinished)."""
        with open(self.path, "rb+") as f:
            data = f.read()
            if data.endswith(b"\n"):
                return
            keep = data.rfind(b"\n") + 1
            self.repaired = len(data) - keep
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())

    def _write_line(self, values: Sequence[str]) -> None:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(values)
        data = buf.getvalue().encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, data)  # one write of one line: a row is in the file whole or not at all
            if written != len(data):
                raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")
            os.fsync(fd)
        finally:
            os.close(fd)

    def key(self, row: Mapping) -> tuple[str, ...]:
        return row_key(row, self.key_columns)

    def append(self, row: Mapping) -> None:
        """Write ``row`` (a mapping column -> value; missing columns are blank) durably."""
        unknown = set(row) - set(self.columns)
        if unknown:
            raise InvalidInputError(f"row has columns {sorted(unknown)} not in {self.path.name}")
        self._write_line([format_value(row.get(c)) for c in self.columns])
        self.done.add(self.key(row))

    def __len__(self) -> int:
        return len(self.done)


def _atomic_write_json(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, default=str)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def update_metadata(out_dir: str | Path, meta: dict, *, force_mix: bool = False) -> dict:
    """Write ``meta`` to ``out_dir/metadata.json``, keeping earlier runs in ``runs``.

    Raises :class:`MixedMachineError` when the folder already describes another
    machine (hosts, device kind or device name differ) unless ``force_mix``.
    """
    path = Path(out_dir) / "metadata.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(path.read_text()) if path.exists() else {}
    mixed = bool(old.get("mixed"))
    if old.get("device_name"):
        before, now = identity(old), identity(meta)
        if before != now:
            if not force_mix:
                raise MixedMachineError(
                    f"{path.parent} holds measurements of another machine ({_describe(before)}); "
                    f"this is {_describe(now)}. Write to another folder, or pass --force-mix "
                    "to mix them"
                )
            mixed = True
    runs = old.get("runs", [])
    new = {**old, **{k: v for k, v in meta.items() if k != "runs"}}
    new["runs"] = [*runs, {k: meta.get(k) for k in ("date", "command", "host", "hosts", "device_name",
                                                     "world_size", "nodes", "quick", "budget_s")}]
    if mixed:
        new["mixed"] = True
    if old.get("device_name") and not mixed:
        new["date_first"] = old.get("date_first", old.get("date"))
    _atomic_write_json(path, new)
    return new


def _describe(ident: dict) -> str:
    return f"{ident['device_name']} ({ident['device']}) on {', '.join(map(str, ident['hosts']))}"
