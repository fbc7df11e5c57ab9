"""Fit a GPU's published GEMM rates over shapes into its datasheet-scaled ``gemm`` entries.

A datasheet-scaled entry is the H200's measured curve times the ratio of datasheet peaks. Where a
GPU's own GEMMs were measured over shapes (:func:`perfmodel.profiles.published.gemm_rows`), the
aligned kernel family of that curve is refitted to them: rate ``R`` (at most the datasheet peak), the
saturation in k (and m, n, or the tile efficiencies) and the launch latency ``t0``, in the better by CV
of the entry's own form and ``gemm_tiles``, by the fitting routine of
:class:`perfmodel.fit.compute.ComputeFitter` (robust log-space least squares, 5-fold CV). What the
published rows cannot identify keeps the scaled entry's values: they are GPU time of aligned shapes
(every dimension a multiple of 256), so the misaligned family (``R_mis``, ``p16`` ...) and the eager
CPU floor ``t_cpu`` stay as scaled. A dtype with no published rows keeps its scaled entry, unless
:data:`SHARED_RATE` lends it another dtype's. Fewer than ``MIN_ROWS`` shapes fit the rate and the latency
alone, on the scaled curve of each dtype sharing the rows, the better by leave-one-out CV kept.

    python -m perfmodel.fit.published_gemm     # prints the fit of each published GPU and dtype
"""

from __future__ import annotations

import numpy as np

from perfmodel.core.entry import no_options, run_command
from perfmodel.fit.regression import Free, cross_validate, fit_form, mape
from perfmodel.forms.registry import get_form
from perfmodel.hardware import load_gpu
from perfmodel.profiles.datasheet import REFERENCE_PROFILE, datasheet_profile
from perfmodel.profiles.profile import load_profile
from perfmodel.profiles.published import gemm_rows, gemm_table, same_architecture_table

MIN_ROWS = 8  # fewer published shapes than this do not pin down five parameters
MIN_RATE_ROWS = 4  # from this many up to MIN_ROWS, only the rate and the launch latency are fitted
# dtype -> dtype whose published rows it takes, per GPU, where the datasheet gives both one tensor-core
# rate and only one was measured (A100 whitepaper: 312 TFLOP/s dense fp16 and bf16; Azure's table is fp16)
SHARED_RATE = {"a100-sxm4-80gb": {"bf16": "fp16"}}
# gpu -> dtypes whose published rows are checks, not fits: the GPU's die was measured by this project on another
# board, and those measurements, validated on whole training steps of that die, carry its compute-bound terms
# (datasheet scaling: same peaks, memory-bound terms by bandwidth). The H100 SXM5 and the H200 SXM are one GH100
# (132 SMs, same clocks, 700 W; only the HBM differs). XLA's sm_90 table prices bf16 8192^3 at 827 TFLOP/s and
# 2048x2048x13312 at 803, above the best torch matmul rate a shape search finds on an H100 SXM (794.5 at that
# shape, gemm_mamf.csv) and above this project's H200 (736 and 701; 664 sustained): docs/hardware.md
CHECK_ONLY = {"h100-sxm5-80gb": ("bf16",)}
# gpu -> dtypes whose published rows fit the rate and the latency only, the tile efficiencies staying the scaled
# entry's: DeepBench's V100 and T4 fp16 rows, 64 of 104 skinny (n = 8-128 with m, k of 512-7680: a few output
# tiles). Fitted in full, their slowness went into gemm_tiles' tile efficiencies (V100 e4, e8, e16 = 0.40 / 0.48 /
# 0.55), which then priced a tall-skinny convolution GEMM as if it had few tiles: ResNet-50's 7x7 stem at batch
# 128 (m 1.6 M, n 64) at 6.2 ms forward instead of 1.3 (docs/hardware.md)
RATE_ONLY = {"v100-sxm2-32gb": ("fp16",), "t4": ("fp16",)}
BIG_FLOPS = 1e9  # CV is scored on GEMMs of at least 1 GFLOP, as ComputeFitter scores its GEMM fits
SMALL_WEIGHT = 0.3  # smaller GEMMs sit near the launch latency: they weigh less, as in ComputeFitter's memory fits
# the aligned-family parameters each GEMM form fits (bounds as ComputeFitter's)
SATURATION = {"k_half": Free(128, 1, 1e5), "m_half": Free(64, 1, 1e5), "n_half": Free(64, 1, 1e5)}
ALIGNED = {
    "gemm_smooth": ("R", "k_half", "m_half", "n_half", "t0"),
    "gemm_two": ("R", "k_half", "m_half", "n_half", "t0"),
    "gemm_two_levels": ("R", "k_half", "m_half", "n_half", "t0"),
    "gemm_tiles": ("R", "k_half", "e16", "e8", "e4", "t_split", "t0"),
}
CUBE_ONLY = ("R", "t0")  # what rows with m = n = k identify without confounding m, n and k
# a saturation half-point h (rate x d/(d + h) in dimension d) is seen only by rows with d near it: their
# smallest d at most this many times h (the factor at most 0.8). DeepBench's GEMMs start at m, k = 512, far above
# the scaled entry's m_half 14 and k_half 41-118 (fp32, fp16): a free h there runs to a bound (k_half 1 or 331) and
# misprices the small-k GEMMs a 1x1 convolution is, so an unseen h keeps the scaled entry's value
HALF_SEEN = 4.0
HALF_DIMENSION = {"k_half": "k", "m_half": "m", "n_half": "n"}
BOUNDS = {"R": Free(7e14, 1e12, 5e15), "t0": Free(3e-6, 1e-8, 1e-3), "e16": Free(0.9, 0.3, 1.2),
          "e8": Free(0.75, 0.2, 1.2), "e4": Free(0.6, 0.1, 1.2), "t_split": Free(3e-6, 1e-8, 1e-3), **SATURATION}


def fit_gemm_entry(rows, before: dict, *, peak_flops: float | None = None, folds: int = 5,
                   seed: int = 0, names: tuple | None = None) -> dict:
    """``before`` (a scaled ``gemm`` entry) with its aligned family (or ``names`` of it) fitted to ``rows``
    (m, n, k, time_s: GPU time alone); the fit's CV and in-sample MAPE are over rows of at least
    ``BIG_FLOPS``."""
    form_name = before["form"]
    form = get_form(form_name)
    X = {d: rows[d].to_numpy(float) for d in ("m", "n", "k")}
    y = rows.time_s.to_numpy(float)
    names = ALIGNED[form_name] if names is None else names
    fixed = {k: float(v) for k, v in before["params"].items() if k not in names}
    fixed["t_cpu"] = 0.0  # GPU time alone: no eager floor in these rows
    free = {k: Free(min(max(float(before["params"].get(k, BOUNDS[k].init)), BOUNDS[k].lo), BOUNDS[k].hi),
                    BOUNDS[k].lo, BOUNDS[k].hi) for k in names}
    if peak_flops is not None:  # the asymptotic rate cannot pass the tensor cores' peak
        free["R"] = Free(min(free["R"].init, peak_flops), free["R"].lo, peak_flops)
    big = 2.0 * X["m"] * X["n"] * X["k"] >= BIG_FLOPS
    weights = np.where(big, 1.0, SMALL_WEIGHT)
    cv = cross_validate(form, X, y, free, fixed, folds=folds, seed=seed, score_mask=big, weights=weights)
    params = fit_form(form, X, y, free, fixed, weights=weights)
    fit_err = mape(np.asarray(form.evaluate(params, **X), float)[big], y[big])
    params["t_cpu"] = float(before["params"]["t_cpu"])  # the eager floor of the scaled entry
    source = (f"published: {rows.source.iloc[0]}; aligned family fitted to {len(y)} shapes, "
              f"misaligned family and t_cpu from the datasheet-scaled entry")
    return {**before, "params": {k: float(v) for k, v in params.items()}, "cv_mape": float(cv),
            "fit_mape": float(fit_err), "n_points": len(y), "source": source}


def as_tiles(entry: dict) -> dict:
    """``entry`` in the ``gemm_tiles`` form: its misaligned family as it is (``gemm_tiles`` prices
    misaligned GEMMs as ``gemm_two``'s second family), the tile efficiencies at their starting values."""
    if entry["form"] == "gemm_tiles":
        return entry
    params = {k: v for k, v in entry["params"].items() if k not in ("m_half", "n_half", "p8", "p_both")}
    params = {"p4": 1.0, "p2": 1.0, "R_mis": params["R"], "k_half_mis": params["k_half"], "mn_half_mis": 1e5,
              **params, **{k: BOUNDS[k].init for k in ("e16", "e8", "e4", "t_split")}}
    return {**entry, "form": "gemm_tiles", "params": params}


def fit_published_gemm(gpu: str, compute, *, folds: int = 5, seed: int = 0, checks: dict = CHECK_ONLY) -> dict:
    """``{"gemm:<dtype>": entry}`` for each dtype of ``gpu`` with at least ``MIN_ROWS`` published rows
    whose ``compute`` entry is datasheet-scaled (``n_points == 0``), but for those ``checks`` names (their
    rows check the scaled entry: :data:`CHECK_ONLY`); empty when none apply. As
    ComputeFitter does, the form is the better by CV of the entry's own and ``gemm_tiles`` (cuBLAS
    picks a tile per shape: a smooth saturation misses the plateau of large GEMMs)."""
    table = gemm_rows(gpu)
    out = {}
    for dtype, rows in _rows_by_dtype(gpu, table).items():
        before = compute.get(f"gemm:{dtype}")
        if dtype in checks.get(gpu, ()):
            continue  # its die's own measured curve prices it; the rows check it (scaled_error)
        if before is None or before.get("n_points") or len(rows) < MIN_RATE_ROWS or before["form"] not in ALIGNED:
            continue  # measured by this project, too few rows, or a form without an aligned family
        peak = load_gpu(gpu).peak_flops.get(dtype)
        if dtype in RATE_ONLY.get(gpu, ()):
            fits = [fit_gemm_entry(rows, before, peak_flops=peak, folds=folds, seed=seed, names=CUBE_ONLY)]
        elif ((rows.m == rows.n) & (rows.n == rows.k)).all():
            # cubes vary one size: they identify the rate and the latency, not how saturation splits over
            # m, n and k (freed, the three halves trade freely), nor tile shapes: those keep the scaled entry's
            fits = [fit_gemm_entry(rows, before, peak_flops=peak, folds=folds, seed=seed, names=CUBE_ONLY)]
        elif len(rows) < MIN_ROWS:
            # a few shapes cannot pin the aligned family either: rate and latency are fitted on the scaled
            # curve of each dtype that shares the rows, and the better by leave-one-out CV is kept
            starts = [dtype] + [d for d in _rate_peers(gpu, dtype) if _scaled(compute, d)]
            fits = [_noted(fit_gemm_entry(rows, compute[f"gemm:{d}"], peak_flops=peak, folds=len(rows), seed=seed,
                                          names=CUBE_ONLY), d, dtype) for d in starts]
        else:
            fits = [fit_gemm_entry(rows, start, peak_flops=peak, folds=folds, seed=seed, names=seen(rows, start))
                    for start in {before["form"]: before, "gemm_tiles": as_tiles(before)}.values()]
        best = min(fits, key=lambda e: e["cv_mape"])
        candidates = {e["form"]: round(e["cv_mape"], 4) for e in fits}
        out[f"gemm:{dtype}"] = {**best, "candidates": candidates}
    return out


def seen(rows, entry: dict) -> tuple:
    """The aligned-family parameters of ``entry``'s form that ``rows`` identify: all but a saturation
    half-point whose dimension's smallest published value lies above ``HALF_SEEN`` times the entry's own."""
    return tuple(name for name in ALIGNED[entry["form"]]
                 if name not in HALF_DIMENSION
                 or rows[HALF_DIMENSION[name]].min() <= HALF_SEEN * float(entry["params"][name]))


def _noted(entry: dict, start: str, dtype: str) -> dict:
    """``entry`` (fitted from the scaled ``gemm:<start>`` curve) with its source saying so when that is
    not ``dtype``'s own."""
    if start == dtype:
        return entry
    return {**entry, "source": entry["source"] + f"; the other terms from the scaled gemm:{start} curve"}


def _rate_peers(gpu: str, dtype: str) -> list[str]:
    """The dtypes :data:`SHARED_RATE` pairs with ``dtype`` on ``gpu`` (either way round)."""
    pairs = SHARED_RATE.get(gpu, {}).items()
    return [b for a, b in pairs if a == dtype] + [a for a, b in pairs if b == dtype]


def _scaled(compute: dict, dtype: str) -> bool:
    entry = compute.get(f"gemm:{dtype}")
    return entry is not None and not entry.get("n_points") and entry["form"] in ALIGNED


def _rows_by_dtype(gpu: str, table) -> dict:
    """``{dtype: rows}`` of ``gpu``'s published table, with the rows :data:`SHARED_RATE` lends a dtype
    that has none of its own (their ``source`` says so)."""
    rows = {dtype: sub for dtype, sub in table.groupby("dtype")}
    for dtype, lender in SHARED_RATE.get(gpu, {}).items():
        if dtype not in rows and lender in rows:
            note = f"; {lender} rows: {dtype} has the same datasheet tensor-core rate"
            rows[dtype] = rows[lender].assign(dtype=dtype, source=rows[lender].source + note)
    return rows


def scaled_error(gpu: str, entry: dict, dtype: str) -> float:
    """MAPE of ``entry`` (the scaled curve) on ``gpu``'s published ``dtype`` rows of at least ``BIG_FLOPS``."""
    pred, measured = _big_rows(gpu, entry, dtype)
    return mape(pred, measured)


def scaled_bias(gpu: str, entry: dict, dtype: str) -> float:
    """Median of predicted rate / published rate - 1 of ``entry`` over the rows of ``scaled_error``
    (negative: the curve is slower than the published rows)."""
    pred, measured = _big_rows(gpu, entry, dtype)
    return float(np.median(measured / pred - 1.0))


def _big_rows(gpu: str, entry: dict, dtype: str):
    """(predicted seconds, published seconds) of ``gpu``'s ``dtype`` rows of at least ``BIG_FLOPS``."""
    rows = _rows_by_dtype(gpu, gemm_rows(gpu))[dtype]
    X = {d: rows[d].to_numpy(float) for d in ("m", "n", "k")}
    big = 2.0 * X["m"] * X["n"] * X["k"] >= BIG_FLOPS
    pred = np.asarray(get_form(entry["form"]).evaluate({**entry["params"], "t_cpu": 0.0}, **X), float)
    return pred[big], rows.time_s.to_numpy(float)[big]


def main(argv=None) -> None:
    no_options(__doc__, argv)
    reference = load_profile(REFERENCE_PROFILE)
    for gpu in sorted(set(gemm_table().gpu) | set(same_architecture_table().gpu)):
        scaled = datasheet_profile(gpu, reference).compute
        for dtype in CHECK_ONLY.get(gpu, ()):
            print(f"{gpu} gemm:{dtype}: check only (CHECK_ONLY), the scaled curve: "
                  f"{scaled_error(gpu, scaled[f'gemm:{dtype}'], dtype):.1%} MAPE on the published rows "
                  f"(median signed {scaled_bias(gpu, scaled[f'gemm:{dtype}'], dtype):+.1%})")
        for key, entry in fit_published_gemm(gpu, scaled).items():
            r0, r1 = scaled[key]["params"]["R"], entry["params"]["R"]
            off = scaled_error(gpu, scaled[key], key.split(":")[1])
            print(f"{gpu} {key}: {entry['form']}, {entry['n_points']} shapes, CV {entry['cv_mape']:.1%}, "
                  f"in-sample {entry['fit_mape']:.1%} (scaled curve: {off:.1%}); "
                  f"R {r0 / 1e12:.0f} -> {r1 / 1e12:.0f} TFLOP/s")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
