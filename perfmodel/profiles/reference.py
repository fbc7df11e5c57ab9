"""Published microbenchmarks of other GPUs, used to calibrate datasheet-scaled profiles.

A datasheet-scaled profile assumes the target GPU reaches the same fraction of
its datasheet peak as the measured reference GPU. Where public measurements
of the target exist (``data/reference/gpu_microbench_measured.csv``: cuBLASLt
GEMM and HBM STREAM on Azure ND A100 v4 / H100 v5 / H200 v5, from
Azure/AI-benchmarking-guide), they replace that assumption:

* GEMM: the rate parameters are scaled by the median ratio of predicted to
  measured time over the published square-ish shapes of at least 4096³ (small
  shapes measure launch overhead of a different harness);
* memory bandwidth: classes are scaled by the ratio of STREAM Copy bandwidths
  (reference GPU / target GPU) instead of the ratio of datasheet figures; a GPU without
  STREAM rows takes its published same-device copy bandwidth
  (``data/reference/copy_bandwidth_published.csv``, counted as STREAM counts: read + write).

Where a GPU has neither in a dtype, the Maximum Achievable Matmul FLOPS rows (``data/reference/gemm_mamf.csv``:
one harness's best ``torch.matmul`` rate over a shape search, on many GPUs) set its rate
(``profiles.mamf.calibrate_mamf``, which also knows the shapes ``fit.published_gemm`` fits): at its own
MAMF shape it runs the fraction of MAMF the reference GPU's fit runs at the reference's MAMF shape.
The search's upward bias (the profiles' fits run 9-16% below MAMF at its shapes on the A100, H100
and H200) cancels, so a MAMF row is never matched as a rate.

Where only a harness's best rate over square sizes is published
(``data/reference/gemm_best_square.csv``: ``torch.mm`` on GeForce cards), the rate
parameters are scaled by measured best rate / the fit's best rate over the same sizes.
A GeForce card runs above its rated boost clock when power allows (the RTX 3090:
75.6-75.9 TFLOP/s fp16 with fp32 accumulate against the GA102 whitepaper's 71 at
1,695 MHz), while the H200 the fits come from reaches 73% of its peak (power-limited):
one fraction of peak carried from one to the other is wrong by that factor.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import numpy as np

from perfmodel.core.lazy import pandas as pd  # imported on first use: keeps `import perfmodel` light
from perfmodel.forms.registry import get_form

REFERENCE_CSV = Path(__file__).with_name("data") / "reference" / "gpu_microbench_measured.csv"
BEST_SQUARE_CSV = REFERENCE_CSV.with_name("gemm_best_square.csv")
COPY_CSV = REFERENCE_CSV.with_name("copy_bandwidth_published.csv")
MAMF_CSV = REFERENCE_CSV.with_name("gemm_mamf.csv")
# a GPU with no MAMF row of a dtype takes its die's: stas00/ml-engineering's bf16 table lists the H100 SXM
# with the note "H200 is the same" (one GH100 at 700 W; this project carries the H200's curve to the H100)
MAMF_SAME_DIE = {"h200-sxm-141gb": "h100-sxm5-80gb"}
BEST_SQUARE_DTYPES = ("fp16", "bf16")  # its fp32 column may be TF32 or not (the harness leaves it to torch)
GPU_NAMES = {"A100-SXM4-80GB": ("a100-sxm4-80gb", "a100-sxm4-40gb"), "H100 80GB HBM3": ("h100-sxm5-80gb",),
             "H200 141GB": ("h200-sxm-141gb",), "GB200 185GB": ("gb200-186gb",)}
# a GPU with no GEMMs of its own published takes its die's, scaled by the two GPUs' MAMF ratio in that dtype
# (one harness on both): the B200 is the GB200's die (GB100) with a lower power limit and clock
GEMMS_SAME_DIE = {"b200-sxm-180gb": "gb200-186gb"}
SAME_HBM = {"a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb"}  # the 40 GB A100 has other memory
MIN_DIM = 4096


@lru_cache(maxsize=1)
def _table() -> pd.DataFrame:
    df = pd.read_csv(REFERENCE_CSV)
    rows = []
    for gpu_label, catalog in GPU_NAMES.items():
        for _, r in df[df.gpu == gpu_label].iterrows():
            for name in catalog:
                rows.append({**r.to_dict(), "catalog": name})
    return pd.DataFrame(rows)


def microbench_rows() -> pd.DataFrame:
    """Every published row of ``gpu_microbench_measured.csv``, once per catalog GPU it describes."""
    return _table()


def _shape(param: str):
    m = re.fullmatch(r"(\d+)\^3", param)
    if m:
        d = int(m.group(1))
        return d, d, d
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)", param)
    return tuple(int(g) for g in m.groups()) if m else None


def measured_gemms(gpu: str) -> pd.DataFrame:
    """Published GEMM rows of ``gpu``: dtype, m, n, k, time_s, source. A GPU of ``GEMMS_SAME_DIE`` takes its
    die's, each time scaled by the die's MAMF / this GPU's MAMF in the row's dtype (dtypes without both left out)."""
    donor = GEMMS_SAME_DIE.get(gpu)
    if donor is not None:
        return _carried_gemms(gpu, donor)
    t = _table()
    t = t[(t.catalog == gpu) & t.benchmark.str.startswith("cuBLASLt GEMM")]
    out = []
    for _, r in t.iterrows():
        shape = _shape(r.param)
        if shape is None:
            continue
        m, n, k = shape
        dtype = r.benchmark.split()[-1].lower()
        out.append({"dtype": dtype, "m": m, "n": n, "k": k, "time_s": 2.0 * m * n * k / (r.value * 1e12),
                    "source": r.source})
    return pd.DataFrame(out, columns=["dtype", "m", "n", "k", "time_s", "source"])


def _carried_gemms(gpu: str, donor: str) -> pd.DataFrame:
    rows = measured_gemms(donor)
    keep = []
    for dtype, sub in rows.groupby("dtype"):
        own, theirs = mamf_row(gpu, dtype), mamf_row(donor, dtype)
        if own is None or theirs is None:
            continue
        ratio = float(own.tflops) / float(theirs.tflops)
        keep.append(sub.assign(time_s=sub.time_s / ratio,
                               source=[f"{s} (carried from {donor} x{ratio:.3f}, the MAMF ratio)" for s in sub.source]))
    return pd.concat(keep, ignore_index=True) if keep else rows.iloc[0:0]


@lru_cache(maxsize=1)
def _copy_table() -> pd.DataFrame:
    return pd.read_csv(COPY_CSV)


def stream_copy_bw(gpu: str) -> float | None:
    """Published copy bandwidth (bytes/s, read and write both counted, as STREAM Copy counts them) of
    ``gpu``'s memory, if any: Azure's STREAM Copy for the HBM GPUs, else the median of
    ``copy_bandwidth_published.csv`` (same-device copies of CUDA samples' p2pBandwidthLatencyTest)."""
    if gpu not in SAME_HBM:
        rows = _copy_table()
        rows = rows[rows.gpu == gpu]
        return float(np.median(rows.copy_gbps)) * 1e9 if len(rows) else None
    t = _table()
    t = t[(t.catalog == gpu) & (t.benchmark == "HBM stream") & (t.param == "Copy")]
    return float(t.value.iloc[0]) * 1e12 if len(t) else None


@lru_cache(maxsize=1)
def _best_square_table() -> pd.DataFrame:
    return pd.read_csv(BEST_SQUARE_CSV)


def best_square_gemms(gpu: str) -> pd.DataFrame:
    """Published best ``torch.mm`` rates of ``gpu`` over square sizes: dtype, sizes (tuple), tflops, source."""
    t = _best_square_table()
    t = t[(t.gpu == gpu) & t.dtype.isin(BEST_SQUARE_DTYPES)].copy()
    t["sizes"] = [tuple(int(v) for v in str(s).split()) for s in t.sizes]
    return t


def best_square_ratio(entry: dict, sizes, tflops: float) -> float:
    """Measured best rate / the fit's best rate over the same square sizes n³ (FLOPs 2n³)."""
    n = np.asarray(sizes, dtype=float)
    pred = get_form(entry["form"]).evaluate({**entry["params"], "t_cpu": 0.0}, m=n, n=n, k=n)
    return float(tflops * 1e12 / np.max(2.0 * n**3 / pred))


def scale_rates(entry: dict, ratio: float, note: str) -> dict:
    params = {name: value * ratio if name in ("R", "R_mis") else value for name, value in entry["params"].items()}
    return {**entry, "params": params, "source": f"{entry.get('source', '')}; rate x{ratio:.3f} to match {note}"}


def calibrate_best_square(compute: dict, gpu: str) -> None:
    """Scale GEMM rates of ``compute`` (in place) by ``gpu``'s published best square rates (median per dtype)."""
    for dtype, sub in best_square_gemms(gpu).groupby("dtype"):
        entry = compute.get(f"gemm:{dtype}")
        if entry is None:
            continue
        ratios = [best_square_ratio(entry, r.sizes, r.tflops) for r in sub.itertuples()]
        note = f"{len(sub)} published best {dtype} torch.mm rates ({sub.source.iloc[0].split()[0]})"
        compute[f"gemm:{dtype}"] = scale_rates(entry, float(np.median(ratios)), note)


@lru_cache(maxsize=1)
def mamf_table() -> pd.DataFrame:
    """Maximum Achievable Matmul FLOPS rows: gpu, dtype, m, n, k, tflops, torch, source."""
    return pd.read_csv(MAMF_CSV)


def mamf_row(gpu: str, dtype: str):
    """``gpu``'s MAMF row in ``dtype`` (its die's where it has none of its own; ``MAMF_SAME_DIE``), or None."""
    t = mamf_table()
    for name in (gpu, MAMF_SAME_DIE.get(gpu)):
        hit = t[(t.gpu == name) & (t.dtype == dtype)]
        if len(hit):
            return hit.iloc[0]
    return None


def gemm_rate_at(entry: dict, row) -> float:
    """FLOP/s of the GEMM ``entry`` prices at the shape of MAMF ``row``."""
    m, n, k = (float(row[c]) for c in ("m", "n", "k"))
    return 2.0 * m * n * k / float(get_form(entry["form"]).evaluate({**entry["params"], "t_cpu": 0.0}, m=m, n=n, k=k))


def calibrate_gemm(compute: dict, gpu: str) -> None:
    """Scale GEMM rates of ``compute`` (in place) to match ``gpu``'s published GEMMs."""
    calibrate_best_square(compute, gpu)
    rows = measured_gemms(gpu)
    if rows.empty:
        return
    for dtype, sub in rows.groupby("dtype"):
        sub = sub[(sub[["m", "n", "k"]] >= MIN_DIM).all(axis=1)]
        # fp16 and bf16 share the tensor-core rate on A100/H100/H200 (NVIDIA datasheets)
        keys = [f"gemm:{d}" for d in ((dtype, "bf16") if dtype == "fp16" else (dtype,))]
        for key in keys:
            entry = compute.get(key)
            if entry is None or sub.empty:
                continue
            form = get_form(entry["form"])
            pred = form.evaluate({**entry["params"], "t_cpu": 0.0}, m=sub.m.values, n=sub.n.values, k=sub.k.values)
            ratio = float(np.median(pred / sub.time_s.values))
            compute[key] = scale_rates(entry, ratio, f"{len(sub)} published {dtype} GEMMs >= {MIN_DIM}^3 "
                                                     f"({sub.source.iloc[0].split()[0]})")
