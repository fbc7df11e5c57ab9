"""Reading the bundled TOML tables and merging a user's file over them."""

from __future__ import annotations

import math
import numbers
import sys
from importlib import resources
from pathlib import Path

import pandas as pd

from perfmodel.core.errors import InvalidInputError
from perfmodel.core.readers import read_toml_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

KEY = ("provider", "region", "gpu")


def read_toml(path) -> dict:
    """Parse a TOML file; a missing or malformed file raises naming the path."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"'path' must name an existing TOML file: got {str(path)!r}")
    return read_toml_file(path, field="path", expect="a TOML file")


def bundled(name: str) -> dict:
    """The bundled ``data/<name>`` file shipped with the package."""
    text = resources.files("perfmodel.analysis.transient").joinpath("data", name).read_text("utf-8")
    return tomllib.loads(text)


def rows_of(doc: dict, table: str, origin: str) -> list[dict]:
    """The ``[[table]]`` rows of a parsed file, each with ``[defaults]`` filled in."""
    rows = doc.get(table, [])
    if not isinstance(rows, list):
        raise InvalidInputError(f"{origin}: '{table}' must be an array of tables ([[{table}]])")
    if not rows:  # a file that adds nothing is a mistake, not a request for the bundled table
        raise InvalidInputError(f"{origin}: no [[{table}]] rows (each names a provider, region and gpu)")
    defaults = doc.get("defaults", {})
    out = []
    for i, row in enumerate(rows):
        missing = [k for k in KEY if not isinstance(row.get(k), str) or not row.get(k)]
        if missing:
            raise InvalidInputError(
                f"{origin}: [[{table}]] row {i} lacks {', '.join(map(repr, missing))} "
                f"(each row needs a non-empty provider, region and gpu)"
            )
        out.append({**defaults, **row})
    return out


def merge(base: list[dict], user: list[dict]) -> list[dict]:
    """User rows replace base rows with the same (provider, region, gpu); others append."""
    merged = {tuple(r[k].lower() for k in KEY): r for r in base}
    for row in user:
        merged[tuple(row[k].lower() for k in KEY)] = row
    return list(merged.values())


def check_rate(origin: str, field: str, value, *, allow_zero: bool = True) -> float:
    """A finite number >= 0 (or > 0): prices, rates, times read from a table."""
    ok = (not isinstance(value, bool) and isinstance(value, numbers.Real)
          and math.isfinite(value) and (value > 0 or (allow_zero and value == 0)))
    if not ok:
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidInputError(f"{origin}: {field!r} must be a finite number {bound}: got {value!r}")
    return float(value)


def load_table(name: str, table: str, path, columns: list[str], check) -> pd.DataFrame:
    """Bundled rows of ``data/<name>`` merged with the user's ``path``; ``check`` validates."""
    rows = rows_of(bundled(name), table, f"bundled {name}")
    if path is not None:
        rows = merge(rows, rows_of(read_toml(path), table, str(path)))
    checked = [check(row, f"{table} {row['provider']}/{row['region']}/{row['gpu']}")
               for row in rows]
    return pd.DataFrame(checked, columns=columns)
