"""Fit published kernel microbenchmarks into a datasheet-scaled profile.

A datasheet-scaled profile copies the reference GPU's curves. Where a GPU's own kernels
were measured and published (:mod:`perfmodel.profiles.published`), those measurements
replace the copy, fitted with the forms and regression of this project's own tables:

* attention by query x key blocks (``sdpa_tiles``; ``_fit_blocks``), as FlashAttention-2
  (``sdpa:fa2.fwd``, ``sdpa:fa2.bwd``) on the H100 SXM5 (Shah et al.
  2024, Figs. 5-6; causal forward+backward: Dao 2023, Fig. 7) and the A100 (Dao 2023, Fig. 4, forward+
  backward only: split by the H100's published forward share, ``FORWARD_SHARE_FROM``): the kernel of
  flash-attn 2.x and of PyTorch's ``FLASH_ATTENTION`` backend, which ``Strategy(attention="flash2")``
  prices; FlashAttention-3 (``sdpa:fa3.*``, Hopper only, ``attention="flash3"``) and cuDNN attention
  (``sdpa:cudnn.*``, ``attention="cudnn"``) on the H100 SXM5 (Shah et al. 2024, Figs. 5-6);
  FlashAttention-1 (``sdpa:fa1.*``, ``attention="flash1"``) on the A100 and the H100 and the Triton
  kernel (``sdpa:triton.*``, ``attention="triton"``) on the A100 (Dao 2023, Figs. 4 and 7, forward+
  backward only; no Hopper measurement of the Triton kernel is published, docs/hardware.md).
  ``sdpa:fwd``/``sdpa:bwd`` stay the profile's own attention
  (on Hopper the H200's measured SDPA, cuDNN attention at torch 2.11, as torchtitan v0.2.2 asks for first:
  torchtitan/models/attention.py, ``ScaledDotProductAttentionWrapper``);
* GEMM over shapes where a GPU's own are published (:mod:`perfmodel.fit.published_gemm`);
* torchao float8 linears beyond their GEMMs and casts (``fp8_linear:<recipe>``), where published
  (:mod:`perfmodel.fit.published_float8`);
* ``host["overlap_compute_slowdown"]``: compute slowed while NCCL runs beside it
  (Lee et al. 2025), which data-parallel pricing applies to the overlapped seconds.

The profile's ``meta["published_fits"]`` names what was replaced and from where, so its origin
reads "datasheet, with published measurements" rather than "measured".

    python -m perfmodel.fit.build    # rebuilds the bundled profiles, this step included
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from perfmodel.fit.published_float8 import fit_published_float8
from perfmodel.fit.published_gemm import fit_published_gemm
from perfmodel.fit.regression import Free, cross_validate, fit_form, mape
from perfmodel.forms.registry import get_form
from perfmodel.hardware import load_gpu
from perfmodel.profiles.profile import Profile
from perfmodel.profiles.published import attention_rows, attention_source, overlap_slowdown

DEFAULT_ATTENTION_KERNEL = "fa2"
PUBLISHED_KERNELS = ("fa2", "fa3", "cudnn", "fa1", "triton")  # fitted into every profile whose GPU has rows of them
# GPUs whose attention is another's published curve: the H200 SXM has the H100 SXM5's compute
# (GH100, 132 SMs at 1980 MHz, 700 W; only memory differs), the A100 40GB the A100 80GB's (GA100,
# 108 SMs at 1410 MHz), and attention is compute-bound
SAME_COMPUTE = {"h200-sxm-141gb": "h100-sxm5-80gb", "a100-sxm4-40gb": "a100-sxm4-80gb"}
# A kernel with forward+backward rows only is split into forward and backward by the forward's share of
# the time of FlashAttention-2 on the H100 at the same shape, where both passes are published:
# flash-attn 2.x builds one CUDA source (csrc/flash_attn/src, Ampere mma tiles) for sm_80 and sm_90
# (setup.py). An assumption for the A100's FlashAttention-2 and for FlashAttention-1 and the Triton kernel
# (whose own header says its forward is faster and its backward slower than FlashAttention-1's): the
# forward+backward total is what those rows measure.
FORWARD_SHARE_FROM = ("h100-sxm5-80gb", "fa2")
# the longest program's tail: at most one sweep of n key blocks per SM (the last wave's programs); the
# figures fix batch x seq, so they hold the tail's share constant and cannot bound it themselves
TAIL_MAX = 1.0
# FlashAttention-2's head-dim-256 kernel runs slower per FLOP than its 128 one (Shah et al. 2024, Fig. 5e-f:
# 326 vs 370 TFLOP/s), which the saturating head-dim term of ``sdpa_tiles`` cannot follow: its fit keeps
# head dims up to 128, where models are, and the 256 rows stay in the table as a check (docs/hardware.md)
MAX_FITTED_HEAD_DIM = {"fa2": 128, "cudnn": 128}  # cuDNN: 581 at 256 against 595-617 at 128
# flash-attn 2 instantiates head dims in steps of 32; cuDNN on Hopper runs as if padded to steps of 64;
# flash-attn 1 runs head dims up to 32, 64 or 128 in the kernel of that size (csrc/flash_attn/fmha_api.cpp)
# and the Triton kernel pads to the next power of two (BLOCK_HEADDIM): steps of 64 from 33 to 128. Both run
# head dim 64 faster per FLOP than 128 (Dao 2023, Figs. 4 and 7: A100 110 against 83 TFLOP/s and 100
# against 95, not causal), which a saturating head-dim term cannot follow: their rate falls with head dim
BLOCK_FORM = {"fa2": "sdpa_tiles", "fa3": "sdpa_tiles", "cudnn": "sdpa_tiles64", "fa1": "sdpa_tiles64_falling",
              "triton": "sdpa_tiles64_falling"}


def fit_published_attention(gpu: str, kernel: str = DEFAULT_ATTENTION_KERNEL, *, folds: int = 5,
                            seed: int = 0) -> dict:
    """``{"sdpa:fwd": entry, "sdpa:bwd": entry}`` fitted to ``gpu``'s published ``kernel`` rows
    (empty when none are published)."""
    table = attention_rows(gpu, kernel)
    if table.empty:
        return {}
    source = f"published: {kernel} {attention_source(gpu, kernel)}"
    table = table[table.head_dim <= MAX_FITTED_HEAD_DIM.get(kernel, np.inf)]
    donor = FORWARD_SHARE_FROM
    if not (table.phase == "fwd").any() and (gpu, kernel) != donor:
        table = _split_by_forward_share(table, *donor, folds=folds, seed=seed)
        source = f"{source}; forward share of the time from the {donor[0]} {donor[1]} fit"
    if not (table.phase == "fwd").any():
        return {}
    opts = {"sms": float(load_gpu(gpu).sm_count), "form_name": BLOCK_FORM[kernel], "folds": folds, "seed": seed,
            "source": source}
    fwd = _fit_blocks(table, None, **opts)
    return {"sdpa:fwd": fwd, "sdpa:bwd": _fit_blocks(table, fwd, **opts)}


def _split_by_forward_share(table: pd.DataFrame, donor: str, kernel: str, *, folds: int, seed: int) -> pd.DataFrame:
    """``table`` (forward+backward rows only) with forward rows added: each forward+backward time times
    the forward's share t_f / (t_f + t_b) of ``donor``'s fitted curves at the same shape."""
    fits = fit_published_attention(donor, kernel, folds=folds, seed=seed)
    both = table[table.phase == "fwdbwd"]
    X = {c: both[c].to_numpy(float) for c in ("batch", "heads", "seq", "head_dim", "causal")}
    t_f, t_b = (np.asarray(get_form(fits[k]["form"]).evaluate(fits[k]["params"], **X), float)
                for k in ("sdpa:fwd", "sdpa:bwd"))
    fwd = both.assign(phase="fwd", time_s=both.time_s.to_numpy(float) * t_f / (t_f + t_b))
    return pd.concat([fwd, table], ignore_index=True)


def _fit_blocks(table: pd.DataFrame, fwd: dict | None, *, sms: float, form_name: str, folds: int, seed: int,
                source: str) -> dict:
    """The forward (``fwd`` None) or the backward (forward+backward rows minus the forward) by query x
    key blocks (``sdpa_tiles``, 128-row blocks: FlashAttention-2, Dao 2023, Alg. 1-2; the backward sweeps
    the blocks the forward does). The tail of the longest program is at most one sweep of n blocks per
    SM (``TAIL_MAX``). The backward keeps the forward's launch latency (the figures fix batch x seq, so
    a constant is not told apart from the per-row cost); the diagonal blocks' cost (``p_diag``) is
    fitted where causal rows of the pass are published, else the forward's."""
    cols = ["batch", "heads", "seq", "head_dim", "causal"]
    f = table[table.phase == "fwd"].set_index(cols).time_s
    both = table[table.phase == "fwdbwd"].set_index(cols).time_s
    y_series = f if fwd is None else (both - f).dropna()
    y_series = y_series[y_series > 0]
    idx = y_series.index.to_frame(index=False)
    X = {c: idx[c].to_numpy(float) for c in cols}
    y = y_series.to_numpy(float)
    fixed = {"t_cpu": 0.0, "T": 128.0, "sms": sms, "p_mis": 1.0}  # no misaligned head dim published
    free = {"R": Free(3e14, 1e12, 5e15), "d_half": Free(32.0, 1.0, 1e4), "k_tail": Free(0.5, 1e-3, TAIL_MAX),
            "c_row": Free(1e-10, 1e-14, 1e-6)}  # per query row: Q, O and log-sum-exp (dQ, dK, dV backward)
    if fwd is None:
        free["t0"] = Free(5e-6, 1e-8, 1e-3)
    else:
        fixed["t0"] = fwd["params"]["t0"]
    causal_rows = bool(X["causal"].any())
    if causal_rows:
        free["p_diag"] = Free(0.5, 1e-3, 5.0)
    else:
        fixed["p_diag"] = fwd["params"]["p_diag"] if fwd else 0.0
    form = get_form(form_name)
    cv = cross_validate(form, X, y, free, fixed, folds=folds, seed=seed)
    params = fit_form(form, X, y, free, fixed)
    fitted = np.asarray(form.evaluate(params, **X), float)
    note = "" if fwd is None else ("; causal backward fitted" if causal_rows else "; causal block terms from the forward fit")
    return {"form": form_name, "params": {k: float(v) for k, v in params.items()}, "cv_mape": cv,
            "fit_mape": mape(fitted, y), "n_points": len(y), "source": source + note}


def _keep_unmeasured(entry: dict, before: dict | None) -> dict:
    """``entry`` with the misaligned-head-dim factor of the entry it replaces: the published rows
    have head dims 64 and 128 only, so that factor is not identified by them."""
    if not before or "p_mis" not in before["params"]:
        return entry
    return {**entry, "params": {**entry["params"], "p_mis": float(before["params"]["p_mis"])}}


def with_published(profile: Profile, *, kernels: tuple = PUBLISHED_KERNELS) -> Profile:
    """``profile`` with its classes replaced by fits to its GPU's published microbenchmarks
    (``sdpa:<kernel>.fwd|bwd`` for each of ``kernels`` published for it)."""
    gpu = SAME_COMPUTE.get(profile.gpu, profile.gpu)
    fitted = {f"sdpa:{kernel}.{key.split(':')[1]}": _keep_unmeasured(entry, profile.compute.get(key))
              for kernel in kernels for key, entry in fit_published_attention(gpu, kernel).items()}
    # GEMM over shapes, where published (a die's rows serve its other memory sizes; measured entries stay)
    fitted.update(fit_published_gemm(gpu, profile.compute))
    # torchao float8 linears beyond their GEMMs and casts, priced with the curves above (fit/published_float8.py)
    fitted.update(fit_published_float8(replace(profile, compute={**profile.compute, **fitted}), gpu))
    notes = {k: v["source"] for k, v in fitted.items()}
    host = dict(profile.host)
    slowdown = overlap_slowdown(profile.gpu)
    if slowdown is not None:
        host["overlap_compute_slowdown"] = slowdown[0]
        notes["overlap_compute_slowdown"] = f"published: {slowdown[1]}"
    if not notes:
        return profile
    compute = {**profile.compute, **fitted}
    meta = {**profile.meta, "published_fits": {**profile.meta.get("published_fits", {}), **notes}}
    return replace(profile, compute=compute, host=host, meta=meta)
