"""Check tool: two DeepBench training workbooks on the shapes both timed, as fractions of each GPU's peak.

    python -m tools.deepbench_compare DeepBench_NV_M40.xlsx 6.84 DeepBench_NV_P100.xlsx 9.3

Arguments: workbook A, its fp32 peak in TFLOP/s, workbook B, its peak (baidu-research/DeepBench
``results/train/`` @da81ba7; the peaks are the GPUs' datasheet boost figures). Prints, per convolution
class (kernel, stride, pass) and for the GEMMs, the median fraction of peak on each GPU and their ratio
A / B. Where the convolution ratio matches the GEMM ratio, a convolution's time relative to its
implicit GEMM (the classes' c, ``costs/cnn.py``) is the same on both GPUs and software stacks, which is
what carrying c from one GPU to another (``perfmodel.fit.build.carried_conv``) assumes.
"""

from __future__ import annotations

import argparse

import pandas as pd

from perfmodel.core.entry import run_command
from tools.deepbench_conv import _sheets, conv_rows
from tools.deepbench_gemm import gemm_rows

CONV_KEY = ["batch", "cin", "cout", "hw", "kernel", "stride", "phase"]
GEMM_KEY = ["batch", "m", "n", "k", "transposes"]


def _fp32_sheet(path) -> list[list]:
    sheets = _sheets(path)
    name = next((n for n in sheets if n.replace(" ", "").replace("-", "").lower() == "resultsfp32"), None)
    if name is None:
        raise SystemExit(f"{path}: no fp32 results sheet (sheets: {', '.join(sheets)})")
    return sheets[name]


def conv_fractions(path, peak_flops: float) -> pd.DataFrame:
    """The workbook's square fp32 convolution passes with their fraction of ``peak_flops``."""
    t = pd.DataFrame(conv_rows(_fp32_sheet(path), "fp32", str(path))).drop_duplicates(CONV_KEY)
    out_hw = (t.hw + 2 * (t.kernel // 2) - t.kernel) // t.stride + 1
    flops = 2.0 * t.batch * t.cout * out_hw**2 * t.cin * t.kernel**2  # every pass: the forward's FLOPs
    return t.assign(fraction=flops / t.time_s / peak_flops)


def gemm_fractions(path, peak_flops: float) -> pd.DataFrame:
    """The workbook's fp32 GEMMs with their fraction of ``peak_flops``."""
    t = pd.DataFrame(gemm_rows(_fp32_sheet(path), "fp32", str(path), ""))
    t = t.assign(transposes=t.source.str[-2:]).drop_duplicates(GEMM_KEY)
    return t.assign(fraction=t.tflops * 1e12 / peak_flops)


def compare(a, peak_a: float, b, peak_b: float) -> pd.DataFrame:
    """Median fraction of peak on A and on B and their ratio, per convolution class and for the GEMMs."""
    conv = conv_fractions(a, peak_a).merge(conv_fractions(b, peak_b), on=CONV_KEY, suffixes=("_a", "_b"))
    rows = conv.groupby(["kernel", "stride", "phase"]).agg(
        shapes=("fraction_a", "size"), a=("fraction_a", "median"), b=("fraction_b", "median"))
    rows.index = [f"conv k{k} s{s} {p}" for k, s, p in rows.index]
    gemm = gemm_fractions(a, peak_a).merge(gemm_fractions(b, peak_b), on=GEMM_KEY, suffixes=("_a", "_b"))
    rows.loc["gemm"] = [len(gemm), gemm.fraction_a.median(), gemm.fraction_b.median()]
    return rows.assign(ratio=rows.a / rows.b)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("peak_a", type=float, help="TFLOP/s")
    parser.add_argument("b")
    parser.add_argument("peak_b", type=float, help="TFLOP/s")
    args = parser.parse_args(argv)
    table = compare(args.a, args.peak_a * 1e12, args.b, args.peak_b * 1e12)
    print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
