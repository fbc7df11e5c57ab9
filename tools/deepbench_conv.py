"""Build-time tool: DeepBench's published convolution training results as a compute.csv.

    python -m tools.deepbench_conv DeepBench_NV_V100.xlsx --gpu "NVIDIA V100" -o perfmodel/data/deepbench-v100/compute.csv

Reads the "Convolution" block of each results sheet of a workbook from
baidu-research/DeepBench ``results/train/`` (forward, gradient with respect to the
inputs and to the parameters, in ms; cuDNN, NCHW) and writes one row per pass in
the schema of docs/calibration.md (op ``conv2d``, phase ``fwd``/``dgrad``/``wgrad``).
Only the shapes the square-convolution classes describe are kept: square input and
filter, equal strides, padding = filter // 2. The workbook is a zip of XML
(Office Open XML); no spreadsheet library is needed.
"""

from __future__ import annotations

import argparse
import csv
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

from perfmodel.core.entry import run_command
from perfmodel.fit.tables import COMPUTE_COLUMNS

NS = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
# 16-bit inputs with fp32 sums (V100), 16-bit inputs with fp32 products and sums (P100)
SHEET_DTYPES = {"Results FP32": "fp32", "Results - FP16 ip, Mixed math": "fp16", "Results - Psuedo FP16": "fp16"}


def workbook_rows(path, convert) -> list[dict]:
    """``convert(sheet, dtype)`` over every results sheet of the workbook (``SHEET_DTYPES``), concatenated."""
    return [row for name, sheet in _sheets(path).items() if name in SHEET_DTYPES
            for row in convert(sheet, SHEET_DTYPES[name])]


def _sheets(path) -> dict[str, list[list]]:
    """Every sheet of the workbook as rows of cell values (shared strings resolved)."""
    book = zipfile.ZipFile(path)
    strings = []
    if "xl/sharedStrings.xml" in book.namelist():
        for si in ET.fromstring(book.read("xl/sharedStrings.xml")).iter(NS + "si"):
            strings.append("".join(t.text or "" for t in si.iter(NS + "t")))
    names = [s.get("name") for s in ET.fromstring(book.read("xl/workbook.xml")).iter(NS + "sheet")]
    out = {}
    for i, name in enumerate(names, 1):
        rows = []
        for row in ET.fromstring(book.read(f"xl/worksheets/sheet{i}.xml")).iter(NS + "row"):
            cells = []
            for c in row.iter(NS + "c"):
                v = c.find(NS + "v")
                text = None if v is None else v.text
                cells.append(strings[int(text)] if c.get("t") == "s" and text is not None else text)
            rows.append(cells)
        out[name] = rows
    return out


def is_number(text) -> bool:
    try:
        float(text)
    except (TypeError, ValueError):
        return False
    return True


def data_cells(cells: list) -> list:
    """A result row's cells from its first number on: some workbooks (V100) lead each row with the
    application's name, others (P100) do not."""
    return cells if cells and is_number(cells[0]) else cells[1:]


def block_rows(rows: list[list], header: str):
    """The rows after a sheet's ``header`` row (a benchmark's title) whose first cell is filled."""
    inside = False
    for cells in rows:
        head = cells[0] if cells else None
        if head == header:
            inside = True
        elif inside and head is not None:
            yield cells


def conv_rows(rows: list[list], dtype: str, device: str) -> list[dict]:
    """compute.csv rows of one sheet's convolution block."""
    out = []
    for cells in block_rows(rows, "Convolution"):
        if cells[0] == "W" or len(cells) < 15:
            continue
        cells = data_cells(cells)
        try:
            w, h, c, n, k, s, r, pw, ph, sh, sv = (int(float(x)) for x in cells[0:11])
        except (TypeError, ValueError):  # the end of the block (another benchmark's header)
            break
        if w != h or r != s or pw != ph or pw != r // 2 or sh != sv:
            continue
        shape = {"op": "conv2d", "timing": "eager", "dtype": dtype, "batch": n, "cin": c, "cout": k, "hw": w,
                 "kernel": r, "stride": sh, "groups": 1, "device": device}
        for phase, ms in zip(("fwd", "dgrad", "wgrad"), cells[11:14]):
            try:
                out.append({**shape, "phase": phase, "time_s": float(ms) / 1e3})
            except (TypeError, ValueError):  # "N/A*": no input gradient for a first layer
                continue
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workbook")
    parser.add_argument("--gpu", required=True, help="device label for the 'device' column")
    parser.add_argument("-o", "--out", required=True)
    args = parser.parse_args(argv)
    rows = workbook_rows(args.workbook, lambda sheet, dtype: conv_rows(sheet, dtype, args.gpu))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(COMPUTE_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
