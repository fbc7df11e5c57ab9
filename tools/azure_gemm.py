"""Build-time tool: an Azure AI-benchmarking-guide results page's cuBLASLt GEMM table as rows of
``gemm_published.csv``.

    python -m tools.azure_gemm ND_A100_v4_results.md --gpu a100-sxm4-80gb \\
        --source "Azure/AI-benchmarking-guide Azure_Results/ND_A100_v4_results.md @3bb66cac ..." \\
        -o perfmodel/profiles/data/reference/gemm_published.csv

Reads the ``GEMM CuBLASLt`` section of a page of Azure/AI-benchmarking-guide ``Azure_Results/``
(rows ``| m | n | k | TFLOPS |``; the page names the data type in its text) and replaces the rows of
``--gpu`` in the table (the rows of other GPUs are kept). The benchmark is superbench's
``cublaslt_gemm`` (``Benchmarks/GEMMCublasLt.py``): back-to-back calls timed on the GPU, so GPU time
alone (``timing = kernel``). Only shapes whose m, n and k are multiples of 8 are kept: the
published-GEMM fit refits the aligned kernel family alone (:mod:`perfmodel.fit.published_gemm`).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from tools.deepbench_gemm import replace_gpu_rows
from perfmodel.core.entry import run_command

ALIGN = 8  # 16-byte vectors of 16-bit elements: the aligned family of the GEMM forms
DTYPES = {"FP16": "fp16", "BF16": "bf16", "FP8": "fp8"}
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|")


def gemm_section(text: str) -> tuple[str, list[str]]:
    """(data type, the table's lines) of the page's ``GEMM CuBLASLt`` section."""
    start = text.find("GEMM CuBLASLt")
    if start < 0:
        raise ValueError("no 'GEMM CuBLASLt' section in the page")
    end = text.find("\n### ", start)
    body = text[start:end if end > 0 else len(text)]
    named = [d for d in DTYPES if re.search(rf"\b{d}\b", body)]
    if len(named) != 1:
        raise ValueError(f"the GEMM section names {named or 'no'} data type; expected one of {sorted(DTYPES)}")
    return DTYPES[named[0]], body.splitlines()


def gemm_rows(text: str, gpu: str, source: str) -> list[dict]:
    """gemm_published.csv rows of a results page (aligned shapes only)."""
    dtype, lines = gemm_section(text)
    out = []
    for line in lines:
        hit = ROW.match(line.strip())
        if not hit:
            continue
        m, n, k = (int(g) for g in hit.groups()[:3])
        if m % ALIGN or n % ALIGN or k % ALIGN:
            continue
        out.append({"gpu": gpu, "dtype": dtype, "batch": 1, "m": m, "n": n, "k": k,
                    "tflops": float(hit.group(4)), "timing": "kernel", "source": source})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", help="a results page (markdown) of Azure/AI-benchmarking-guide")
    parser.add_argument("--gpu", required=True, help="catalog name of the GPU the rows belong to")
    parser.add_argument("--source", required=True, help="where the page comes from (repository, path, commit)")
    parser.add_argument("-o", "--out", required=True)
    args = parser.parse_args(argv)
    replace_gpu_rows(Path(args.out), args.gpu, gemm_rows(Path(args.page).read_text(), args.gpu, args.source))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
