"""tools/azure_gemm.py: an Azure AI-benchmarking-guide results page's cuBLASLt table as gemm_published.csv rows."""

from __future__ import annotations

import pytest

from tools.azure_gemm import gemm_rows, main

PAGE = """## Microbenchmarks
### GEMM CuBLASLt

The results shown below are with random initialization, FP16, and 10,000 warmup iterations.

| m           | n         | k        | ND A100 V4 (TFLOPS)    |
| ----------- | --------- | -------- | ---------------------- |
| 1024        | 1024      | 1024     | 119.4                   |
| 1024        | 2145      | 1024     | 132.8                   |
| 802816      | 192       | 768      | 157.8                  |

### HBM Bandwidth

|       | ND A100 V4 (TB/s) |
| Copy  | 1.61              |
"""


def test_rows_keep_aligned_shapes_with_the_pages_data_type():
    rows = gemm_rows(PAGE, "a100-sxm4-80gb", "src")
    assert [(r["m"], r["n"], r["k"], r["tflops"]) for r in rows] == [(1024, 1024, 1024, 119.4), (802816, 192, 768, 157.8)]
    assert {r["dtype"] for r in rows} == {"fp16"} and {r["timing"] for r in rows} == {"kernel"}


def test_a_page_without_the_section_or_its_data_type_is_refused():
    with pytest.raises(ValueError, match="GEMM CuBLASLt"):
        gemm_rows("### HBM Bandwidth\n", "a100-sxm4-80gb", "src")
    with pytest.raises(ValueError, match="data type"):
        gemm_rows(PAGE.replace("FP16, ", ""), "a100-sxm4-80gb", "src")


def test_other_gpus_rows_stay_and_this_gpus_are_replaced(tmp_path):
    page, out = tmp_path / "page.md", tmp_path / "gemm.csv"
    page.write_text(PAGE)
    out.write_text("gpu,dtype,batch,m,n,k,tflops,timing,source\nh100,bf16,1,1,1,1,1.0,kernel,x\n"
                   "a100-sxm4-80gb,fp16,1,8,8,8,1.0,kernel,old\n")
    assert main([str(page), "--gpu", "a100-sxm4-80gb", "--source", "src", "-o", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert lines[1] == "h100,bf16,1,1,1,1,1.0,kernel,x" and len(lines) == 4 and "old" not in out.read_text()
