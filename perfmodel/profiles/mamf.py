"""Which GEMM rates the Maximum Achievable Matmul FLOPS rows set, and how.

MAMF (``data/reference/gemm_mamf.csv``: one harness's best ``torch.matmul`` rate over a shape search)
sets a datasheet-scaled GPU's rate in a dtype only where no GEMMs of that dtype are published for it:
Azure's cuBLASLt rows (or its die's, carried), best square rates (``profiles/reference.py``) and the
shapes :mod:`perfmodel.fit.published_gemm` fits (``profiles/published.py``) take precedence, being
measurements of the rate a kernel sustains rather than a search's best. Where MAMF sets it, the GPU runs
at its own MAMF shape the fraction of MAMF the reference GPU's fit runs at the reference's MAMF shape, so
the search's upward bias cancels (docs/hardware.md, "Blackwell"). Where the GPU's fp8 GEMMs are published and
its bf16 ones are not, the search's bias on that board is known in fp8 (the fraction of its fp8 MAMF the published
rate sustains, against the reference's fraction) and is carried to its bf16 MAMF row: one harness, one board.
"""

from __future__ import annotations

from perfmodel.profiles.published import gemm_rows
from perfmodel.profiles.reference import (MAMF_CSV, best_square_gemms, gemm_rate_at, mamf_row, mamf_table,
                                          measured_gemms, scale_rates)


def own_gemm_dtypes(gpu: str) -> set[str]:
    """The GEMM dtypes whose rates ``gpu``'s published GEMMs set (fp16 rows set bf16 too: one tensor-core rate):
    Azure's (or its die's), best square rates, and the shapes ``fit.published_gemm`` fits (gemm_published.csv)."""
    dtypes = set(measured_gemms(gpu).dtype) | set(best_square_gemms(gpu).dtype) | set(gemm_rows(gpu).dtype)
    return dtypes | ({"bf16"} if "fp16" in dtypes else set())


def mamf_calibrates(gpu: str, dtype: str | None = None) -> bool:
    """Whether ``gpu``'s own MAMF row of ``dtype`` (or of any dtype) sets its GEMM rates: it has one and no GEMMs
    of that dtype published."""
    t = mamf_table()
    own = set(t.dtype[t.gpu == gpu]) - own_gemm_dtypes(gpu)
    return dtype in own if dtype else bool(own)


def mamf_fraction(compute: dict, gpu: str, dtype: str) -> float | None:
    """The fraction of ``gpu``'s MAMF row in ``dtype`` that ``compute``'s GEMM entry of that dtype runs at the
    row's shape (None where either is missing)."""
    entry, row = compute.get(f"gemm:{dtype}"), mamf_row(gpu, dtype)
    return None if entry is None or row is None else gemm_rate_at(entry, row) / (float(row.tflops) * 1e12)


def calibrate_mamf(compute: dict, gpu: str, reference: dict, reference_gpu: str) -> None:
    """Scale the GEMM rates of a datasheet-scaled ``compute`` (in place) so that, at ``gpu``'s own MAMF
    shape, it runs the fraction of MAMF the ``reference`` fits run at the reference GPU's MAMF shape: one
    harness's best rate on both GPUs, its search bias cancelling, in place of the datasheet peak ratio.
    fp16 follows bf16 (one tensor-core rate). Only the dtypes :func:`mamf_calibrates` names."""
    ratios = {}  # from the entries as scaled, before any is moved (fp16 takes bf16's)
    for own in ("bf16", "fp8"):
        if not mamf_calibrates(gpu, own):
            continue
        entry, target = compute.get(f"gemm:{own}"), mamf_row(gpu, own)
        fraction = mamf_fraction(reference, reference_gpu, own)
        if entry is None or target is None or fraction is None:
            continue
        note = f"the fraction the {reference_gpu} fit runs of its own"
        other = "fp8" if own == "bf16" else "bf16"
        own_other, ref_other = mamf_fraction(compute, gpu, other), mamf_fraction(reference, reference_gpu, other)
        if own_other and ref_other and not mamf_calibrates(gpu, other):  # published in the other dtype
            fraction *= own_other / ref_other
            note += f" x{own_other / ref_other:.3f}, the search's bias on this board in {other} (published GEMMs)"
        ratios[own] = fraction, fraction * float(target.tflops) * 1e12 / gemm_rate_at(entry, target), note
    for dtype in ("bf16", "fp16", "fp8"):
        own = "bf16" if dtype == "fp16" else dtype
        if f"gemm:{dtype}" in compute and own in ratios:
            fraction, ratio, note = ratios[own]
            compute[f"gemm:{dtype}"] = scale_rates(compute[f"gemm:{dtype}"], ratio, f"{fraction:.1%} of {gpu}'s "
                                                   f"{own} MAMF at its shape, {note} ({MAMF_CSV.name})")
