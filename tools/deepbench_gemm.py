"""Build-time tool: DeepBench's published GEMM training results as rows of ``gemm_published.csv``.

    python -m tools.deepbench_gemm DeepBench_NV_P100.xlsx --gpu p100-pcie-16gb \\
        --source "baidu-research/DeepBench results/train/DeepBench_NV_P100.xlsx @da81ba7 ..." \\
        -o perfmodel/profiles/data/reference/gemm_published.csv

Reads the "Dense Matrix Multiplication" block of each results sheet of a workbook from
baidu-research/DeepBench ``results/train/`` (M, N, K, transposes, time in ms; cuBLAS) and
replaces the rows of ``--gpu`` in the table (the rows of other GPUs are kept). The rate is
2·M·N·K over the published time. Only shapes whose n and k are multiples of 8 are kept: the
published-GEMM fit refits the aligned kernel family alone (:mod:`perfmodel.fit.published_gemm`).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from perfmodel.core.entry import run_command
from tools.deepbench_conv import block_rows, data_cells, is_number, workbook_rows

COLUMNS = ("gpu", "dtype", "batch", "m", "n", "k", "tflops", "timing", "source")
ALIGN = 8  # fp32 elements in 32 bytes: the aligned family of the GEMM forms


def gemm_rows(rows: list[list], dtype: str, gpu: str, source: str) -> list[dict]:
    """gemm_published.csv rows of one sheet's GEMM block."""
    out = []
    for cells in block_rows(rows, "Dense Matrix Multiplication"):
        cells = data_cells(cells)
        if len(cells) < 6 or not all(is_number(x) for x in cells[:3]):
            if out:  # the end of the block (another benchmark's header)
                break
            continue
        m, n, k = (int(float(x)) for x in cells[:3])
        times = [float(x) for x in cells[5:] if is_number(x)]  # ms, then the sheet's own TFLOP/s
        if not times or n % ALIGN or k % ALIGN:
            continue
        out.append({"gpu": gpu, "dtype": dtype, "batch": 1, "m": m, "n": n, "k": k,
                    "tflops": round(2.0 * m * n * k / (times[0] * 1e-3) / 1e12, 4), "timing": "kernel",
                    "source": f"{source}; transposes {cells[3]}{cells[4]}"})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workbook")
    parser.add_argument("--gpu", required=True, help="catalog name of the GPU the rows belong to")
    parser.add_argument("--source", required=True, help="where the workbook comes from (repository, commit)")
    parser.add_argument("-o", "--out", required=True)
    args = parser.parse_args(argv)
    rows = workbook_rows(args.workbook, lambda sheet, dtype: gemm_rows(sheet, dtype, args.gpu, args.source))
    replace_gpu_rows(Path(args.out), args.gpu, rows)
    return 0


def replace_gpu_rows(path: Path, gpu: str, rows: list[dict]) -> None:
    """Write ``rows`` as ``gpu``'s rows of a gemm_published.csv-shaped table: other GPUs' lines stay byte for
    byte as they are, this GPU's are replaced at the end."""
    kept = path.read_text().splitlines(keepends=True) if path.exists() else [",".join(COLUMNS) + "\n"]
    kept = [line for line in kept if not line.startswith(f"{gpu},")]
    with open(path, "w", newline="") as fh:
        fh.writelines(kept)
        csv.DictWriter(fh, fieldnames=list(COLUMNS), lineterminator="\n").writerows(rows)
    print(f"wrote {len(rows)} rows of {gpu} to {path}")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
