"""Published kernel microbenchmarks of GPUs this project has not measured itself.

Tables under ``data/reference/`` (source and date on every row):

* ``attention_published.csv``: FlashAttention-2, FlashAttention-3 and cuDNN attention on an
  H100 SXM5, forward (causal and not; head dims 64, 128, 256) and backward (not causal; head
  dims 64 and 128), sequence 512..16k (Shah et al. 2024, arXiv 2407.08608, Figs. 5-6), and
  FlashAttention-2 forward+backward (pass ``fwdbwd``, causal and not, head dims 64 and 128) on
  the A100 80GB and the H100 (Dao 2023, arXiv 2307.08691, Figs. 4 and 7), and from the same figures
  FlashAttention-1 (``fa1``: flash-attn 1.x) on both and the Triton kernel (``triton``:
  flash-attn's ``flash_attn_triton.py``, which MPT's ``attn_impl='triton'`` copies) on the A100. The figures fix
  batch x seq = 16k tokens and heads x head_dim = 2048; FLOPs = 4·b·heads·s²·d forward,
  halved when causal, 2.5x that backward, 3.5x forward+backward (the papers' convention).
* ``attention_carried.csv``: a kernel's curves for a GPU with none published, carried from a donor GPU's
  published curves at the ratio one harness measured on both (Azure's FlashAttention-2 forward+backward at
  one shape on a GB200 and an H100, for the GB200 and the B200): FlashAttention-2 does not use Blackwell's
  new tensor-core instructions, so it runs near its Hopper rate, not at the datasheet peak ratio.
* ``gemm_mamf.csv``: the best bf16/fp8 ``torch.matmul`` rate found by a shape search
  (Maximum Achievable Matmul FLOPS, stas00/ml-engineering; read by ``profiles/reference.py``): a check of the
  GPUs with GEMMs of their own published, the rate of those without (``profiles.mamf.calibrate_mamf``).
* ``gemm_published.csv``: GEMM rates over shapes of a GPU's own kernels, GPU time alone
  (``timing = kernel``): XLA's measured matmul table for sm_90 (bf16; m, n, k from 256 to 4096),
  DeepBench's P100 training GEMMs (fp32 and 16-bit inputs; tools/deepbench_gemm.py) and Azure's A100
  cuBLASLt fp16 shapes (7 rows; tools/azure_gemm.py), fitted into
  those GPUs' ``gemm`` entries by :func:`perfmodel.fit.published.fit_published_gemm`.
* ``gemm_same_architecture.csv``: GEMM rates of a sibling die for a GPU with none published: cuBLAS
  7.0 sgemm on a Tesla K40 (GK110B, Kepler) for the K80's GK210, carried at the same fraction of peak.
* ``float8_linear_published.csv``: the speedup over bfloat16 of a compiled LayerNorm -> Linear -> Sigmoid
  forward+backward with torchao's float8 linear, by the forward's M, K, N (pytorch/ao's float8 README,
  ``benchmarks/float8/float8_roofline.py``), fitted by :mod:`perfmodel.fit.published_float8`.
* ``overlap_slowdown.csv``: how much slower compute runs while NCCL kernels run beside it
  (Lee et al. 2025, arXiv 2507.03114).

This module only reads the tables; :mod:`perfmodel.fit.published` fits them into profiles.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.core.errors import unknown_name
from perfmodel.hardware import load_gpu
from perfmodel.profiles.reference import mamf_table

REFERENCE = Path(__file__).with_name("data") / "reference"
ATTENTION_CSV = REFERENCE / "attention_published.csv"
# GEMM rates published for a GPU as a check of its profile, never fitted (the MAMF file's columns)
GEMM_CHECKS_CSV = REFERENCE / "gemm_checks_published.csv"
GEMM_CSV = REFERENCE / "gemm_published.csv"
# XLA's measured matmul table of two generations, one generator on both (never fitted): the ratio of their rates
# at one shape checks a profile carried from one generation to the other
GENERATIONS_CSV = REFERENCE / "gemm_generations_published.csv"
GENERATION_GPUS = {"sm_100": ("gb200-186gb", "b200-sxm-180gb"), "sm_90": ("h100-sxm5-80gb",)}
SAME_ARCH_CSV = REFERENCE / "gemm_same_architecture.csv"
OVERLAP_CSV = REFERENCE / "overlap_slowdown.csv"
ATTENTION_CARRIED_CSV = REFERENCE / "attention_carried.csv"
FLOAT8_LINEAR_CSV = REFERENCE / "float8_linear_published.csv"
ATTENTION_KERNELS = ("fa2", "fa3", "cudnn", "fa1", "triton")
BWD_FLOPS_FACTOR = 2.5  # backward FLOPs / forward FLOPs (FlashAttention-2 paper, §4.1)


@lru_cache(maxsize=1)
def attention_table() -> pd.DataFrame:
    """Every digitised attention row: gpu, kernel, pass, head_dim, causal, seq, batch, heads, tflops."""
    df = pd.read_csv(ATTENTION_CSV)
    df["causal"] = df["causal"].astype(str).str.lower().eq("true")
    return df


def attention_flops(batch, heads, seq, head_dim, causal, which: str = "fwd"):
    """FLOPs the papers divide by: 4·b·heads·s²·d (fwd), halved when causal, x2.5 backward."""
    fwd = 4.0 * np.asarray(batch, float) * heads * np.asarray(seq, float) ** 2 * head_dim
    fwd = np.where(np.asarray(causal, bool), 0.5 * fwd, fwd)
    return fwd * (BWD_FLOPS_FACTOR if which == "bwd" else 1.0)


@lru_cache(maxsize=1)
def attention_carried_table() -> pd.DataFrame:
    """gpu, kernel, donor, measured_on, measured_tflops, donor_tflops, clock_scale, source."""
    return pd.read_csv(ATTENTION_CARRIED_CSV)


def carried_attention(gpu: str, kernel: str) -> tuple[str, float, str] | None:
    """(donor GPU, rate factor, source) where ``gpu``'s ``kernel`` curves are carried from a donor's: the
    factor is measured / donor rate of one harness on both (times ``clock_scale`` where measured on a
    sibling at another clock); None where none is carried."""
    t = attention_carried_table()
    hit = t[(t.gpu == gpu) & (t.kernel == kernel)]
    if hit.empty:
        return None
    r = hit.iloc[0]
    return str(r.donor), float(r.measured_tflops / r.donor_tflops * r.clock_scale), str(r.source)


def _kernel_rows(gpu: str, kernel: str) -> pd.DataFrame:
    """``gpu``'s published rows of ``kernel``, else a donor's with every rate times the carried factor."""
    t = attention_table()
    own = t[(t.gpu == gpu) & (t.kernel == kernel)]
    carried = carried_attention(gpu, kernel) if own.empty else None
    if carried is None:
        return own
    donor, factor, _ = carried
    return t[(t.gpu == donor) & (t.kernel == kernel)].assign(gpu=gpu, tflops=lambda d: d.tflops * factor)


def attention_rows(gpu: str, kernel: str = "fa2") -> pd.DataFrame:
    """Compute-table rows (op ``sdpa``: phase ``fwd`` and ``fwdbwd``, seconds per call) of ``kernel``
    on ``gpu`` (published, or carried: :func:`carried_attention`), in the schema
    :class:`perfmodel.fit.compute.ComputeFitter` reads; empty if none."""
    if kernel not in ATTENTION_KERNELS:
        raise unknown_name("published attention kernel", kernel, ATTENTION_KERNELS)
    t = _kernel_rows(gpu, kernel)
    if t.empty:
        return pd.DataFrame()
    t = t.assign(time_s=attention_flops(t.batch, t.heads, t.seq, t.head_dim, t.causal, "fwd")
                 / (t.tflops * 1e12))
    keys = ["head_dim", "causal", "seq", "batch", "heads"]
    fwd, bwd = t[t["pass"] == "fwd"].set_index(keys), t[t["pass"] == "bwd"].set_index(keys)
    # a backward row times 2.5x the forward FLOPs at its own rate
    bwd_s = BWD_FLOPS_FACTOR * bwd.time_s
    both = (fwd.time_s + bwd_s).dropna()
    # a forward+backward row times 3.5x the forward FLOPs; used where forward and backward are not
    # both published (the causal backward, and GPUs with forward+backward only)
    whole = (1.0 + BWD_FLOPS_FACTOR) * t[t["pass"] == "fwdbwd"].set_index(keys).time_s
    both = pd.concat([both, whole[~whole.index.isin(both.index)]])
    rows = [_rows(fwd.time_s, "fwd"), _rows(both, "fwdbwd")]
    return pd.concat([r for r in rows if len(r)], ignore_index=True)


def attention_pass_flops(batch, heads, seq, head_dim, causal, which: str):
    """FLOPs a published row of pass ``which`` ("fwd", "bwd" or "fwdbwd": 1 + 2.5 times the forward's)
    is divided by."""
    if which == "fwdbwd":
        return (1.0 + BWD_FLOPS_FACTOR) * attention_flops(batch, heads, seq, head_dim, causal, "fwd")
    return attention_flops(batch, heads, seq, head_dim, causal, which)


def _rows(series: pd.Series, phase: str) -> pd.DataFrame:
    idx = series.index.to_frame(index=False)
    return pd.DataFrame({"op": "sdpa", "phase": phase, "timing": "eager", "dtype": "bf16",
                         "batch": idx.batch.astype(float), "heads": idx.heads.astype(float),
                         "kv_heads": idx.heads.astype(float), "seq": idx.seq.astype(float),
                         "head_dim": idx.head_dim.astype(float), "causal": idx.causal.astype(bool),
                         "time_s": series.to_numpy(float)})


def attention_source(gpu: str, kernel: str = "fa2") -> str | None:
    """The figures ``kernel``'s rows on ``gpu`` come from, each named once (None if there are none); for
    carried rows, the donor's figures and the ratio they were carried at."""
    t = attention_table()
    t = t[(t.gpu == gpu) & (t.kernel == kernel)]
    carried = carried_attention(gpu, kernel) if t.empty else None
    if carried is not None:
        donor, factor, source = carried
        return f"{attention_source(donor, kernel)}, carried from {donor} at x{factor:.3f} ({source})"
    parts = t.source.str.split(r"; (?:label hidden by the legend: bar height |bar labels )?digitised ", regex=True)
    figures, dates = parts.str[0], parts.str[-1]
    return None if t.empty else " + ".join(dict.fromkeys(figures)) + f" (bar labels digitised {dates.max()})"


@lru_cache(maxsize=1)
def float8_linear_table() -> pd.DataFrame:
    """Every published float8-linear speedup row: gpu, recipe, m, k, n (the forward's), speedup, source."""
    return pd.read_csv(FLOAT8_LINEAR_CSV)


def gemm_check_table() -> pd.DataFrame:
    """Every GEMM rate that checks a profile (not fitted): the MAMF rows and ``GEMM_CHECKS_CSV``'s."""
    return pd.concat([mamf_table(), pd.read_csv(GEMM_CHECKS_CSV)], ignore_index=True)


@lru_cache(maxsize=1)
def generation_table() -> pd.DataFrame:
    """XLA's rows of two GPU generations at shared shapes: key (sm_100, sm_90), dtype, batch, m, n, k, tflops."""
    return pd.read_csv(GENERATIONS_CSV)


@lru_cache(maxsize=1)
def gemm_table() -> pd.DataFrame:
    """Every published GEMM row: gpu, dtype, batch, m, n, k, tflops, timing, source."""
    return pd.read_csv(GEMM_CSV)


@lru_cache(maxsize=1)
def same_architecture_table() -> pd.DataFrame:
    """GEMM rows measured on a sibling die of the same architecture, for a GPU without its own:
    gpu (the target), measured_on, measured_peak_tflops, dtype, batch, m, n, k, tflops, timing, source."""
    return pd.read_csv(SAME_ARCH_CSV)


def same_architecture_rows(gpu: str) -> pd.DataFrame:
    """``gpu``'s sibling-die rows (gemm_published.csv's columns), each rate carried at the same fraction of
    peak: tflops x the target's datasheet peak / the measured die's (rates follow peak FLOP/s, as
    datasheet scaling carries them; ``scale_gemm``)."""
    t = same_architecture_table()
    t = t[t.gpu == gpu]
    if t.empty:
        return t
    peak = load_gpu(gpu).peak_flops
    ratio = t.dtype.map(lambda d: peak[d] / 1e12) / t.measured_peak_tflops
    source = t.source + "; measured on " + t.measured_on + ", carried at the same fraction of peak"
    return t.assign(tflops=t.tflops * ratio, source=source)


def gemm_rows(gpu: str) -> pd.DataFrame:
    """Published GEMM rows of ``gpu`` with their seconds per call (2·batch·m·n·k FLOPs at the published
    rate): dtype, m, n, k, time_s, source; empty if none are published. A batched product of ``batch``
    (m x k)·(k x n) GEMMs is read as one of batch·m rows: it launches batch·⌈m/TM⌉·⌈n/TN⌉ tiles, the
    same waves when TM divides m (every batched row's m is a multiple of 256). A GPU with no rows of its
    own takes its sibling die's (:func:`same_architecture_rows`)."""
    t = gemm_table()
    t = t[t.gpu == gpu]
    if t.empty:
        t = same_architecture_rows(gpu)
    t = t.assign(m=t.batch * t.m, time_s=2.0 * t.batch * t.m * t.n * t.k / (t.tflops * 1e12))
    return t[["dtype", "m", "n", "k", "time_s", "source"]].reset_index(drop=True)


@lru_cache(maxsize=1)
def _overlap() -> pd.DataFrame:
    return pd.read_csv(OVERLAP_CSV)


def overlap_slowdown(gpu: str, statistic: str = "mean") -> tuple[float, str] | None:
    """(fraction by which compute slows while NCCL runs beside it, source) for ``gpu``, if published."""
    t = _overlap()
    hit = t[(t.statistic == statistic) & t.gpus.str.split().apply(lambda names: gpu in names)]
    return None if hit.empty else (float(hit.compute_slowdown.iloc[0]), str(hit.source.iloc[0]))
