"""The one way perfmodel reads a user's file: bounded size, UTF-8 only, bounded nesting.

Every reader of a user's JSON, TOML or CSV file (profiles, model and cluster TOMLs, HF configs,
strategy files, calibration tables, measured steps) goes through these functions, so a binary
file, a huge file or a 100,000-deep nest gives one perfmodel error naming the file and the limit,
never a UnicodeDecodeError, a MemoryError or a RecursionError from inside a parser.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from perfmodel.core.errors import InvalidInputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

# A profile is ~20 KB and the largest bundled graph ~70 KB; 16 MiB leaves room for traced models
MAX_DOCUMENT_BYTES = 16 * 2**20
# A calibration table of 10^6 rows is ~140 MB; beyond 512 MiB a table is not a measurement log
MAX_TABLE_BYTES = 512 * 2**20
# The deepest document perfmodel writes nests 5 levels (profile -> collectives -> level -> name -> params)
MAX_DEPTH = 32


def _named(field: str | None, path: Path) -> str:
    """How a message names the file: the option or field it came from, then the path."""
    return f"{field!r} {str(path)!r}" if field else repr(str(path))


def _existing(path, field: str | None, expect: str) -> Path:
    path = Path(path)
    if not path.exists():
        raise InvalidInputError(f"{_named(field, path)} does not exist (expected {expect})")
    if path.is_dir():
        raise InvalidInputError(f"{_named(field, path)} is a folder (expected {expect})")
    return path


def read_text_file(path, *, field: str | None, expect: str = "a text file", max_bytes: int = MAX_DOCUMENT_BYTES,
                   error=InvalidInputError) -> str:
    """A user's text file; a missing path, a folder, a file over ``max_bytes`` or bytes that are not
    UTF-8 raise ``error`` naming ``field``. A leading byte-order mark (spreadsheet exports) is dropped."""
    path = _existing(path, field, expect)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise error(f"{_named(field, path)} is {size / 2**20:.1f} MiB, over the {max_bytes / 2**20:.0f} MiB "
                        f"limit (expected {expect})")
        with path.open("rb") as fh:  # size checked again on the bytes read: /proc and pipes report 0
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{_named(field, path)} cannot be read ({exc.strerror or exc})") from None
    if len(raw) > max_bytes:
        raise error(f"{_named(field, path)} is over the {max_bytes / 2**20:.0f} MiB limit (expected {expect})")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{_named(field, path)} is not UTF-8 text (byte {exc.start}; expected {expect})") from None
    if "\x00" in text:
        raise error(f"{_named(field, path)} is binary, not text (a NUL byte at {text.index(chr(0))}; "
                    f"expected {expect})")
    return text


def nesting_depth(data) -> int:
    """How deep lists and tables nest in a parsed document (a scalar is 0), without recursion."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            deepest = max(deepest, depth + 1)
            if depth + 1 > MAX_DEPTH:
                return deepest
            stack.extend((child, depth + 1) for child in node)
    return deepest


def _check_depth(data, where: str, error):
    if nesting_depth(data) > MAX_DEPTH:
        raise error(f"{where}: nests lists or tables deeper than {MAX_DEPTH} levels")
    return data


def _parse(loads, decode_error, kind: str, text: str, where: str, error):
    """``loads(text)``; a syntax error, deep nesting or an oversized integer raise ``error``."""
    try:
        data = loads(text)
    except decode_error as exc:
        detail = f"{exc.msg} at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise error(f"{where}: not valid {kind} ({detail})") from None
    except RecursionError:
        raise error(f"{where}: nests {kind} lists or tables deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise error(f"{where}: not valid {kind} ({exc})") from None
    return _check_depth(data, where, error)


def parse_json(text: str, where: str, *, error=InvalidInputError):
    """The document in ``text``; bad JSON or deep nesting raise ``error`` (NaN is left to the field checks)."""
    return _parse(json.loads, json.JSONDecodeError, "JSON", text, where, error)


def parse_toml(text: str, where: str, *, error=InvalidInputError) -> dict:
    """The table in ``text``; bad TOML or deep nesting raise ``error``."""
    return _parse(tomllib.loads, tomllib.TOMLDecodeError, "TOML", text, where, error)


def read_json_file(path, *, field: str, error=InvalidInputError, expect: str = "a JSON file"):
    """Parse a user's JSON file; a missing, binary, huge, malformed or deeply nested file raises ``error``."""
    return parse_json(read_text_file(path, field=field, expect=expect), str(path), error=error)


def read_toml_file(path, *, field: str, error=InvalidInputError, expect: str = "a TOML file") -> dict:
    """Parse a user's TOML file, with the limits of :func:`read_json_file`."""
    return parse_toml(read_text_file(path, field=field, expect=expect), str(path), error=error)


def read_csv_file(path, *, field: str, expect: str = "a CSV file", max_bytes: int = MAX_TABLE_BYTES,
                  error=InvalidInputError):
    """A user's CSV table as a pandas DataFrame; binary, huge, ragged or empty files raise ``error``."""
    import io

    import pandas as pd

    text = read_text_file(path, field=field, expect=expect, max_bytes=max_bytes, error=error)
    try:
        return pd.read_csv(io.StringIO(text))
    except pd.errors.EmptyDataError:
        raise error(f"{_named(field, path)} is empty (expected {expect})") from None
    except (pd.errors.ParserError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise error(f"{_named(field, Path(path))} is not a readable CSV table ({first}; expected {expect})") from None
