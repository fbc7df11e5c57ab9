"""Fit the ``conv2d`` overhead class from convolution rows of a compute table.

A measured convolution time is modelled as its implicit GEMMs priced by the
already fitted ``gemm:<dtype>`` entry plus an overhead in the elements it moves
(see :mod:`perfmodel.costs.conv`); only the overhead's parameters are fitted,
in log space like every other class, with k-fold CV. Backward rows are
``fwdbwd`` minus ``fwd`` of the same shape (a data- and a weight-gradient GEMM).
Table columns used: batch, cin, cout, hw, kernel, stride (padding = kernel // 2,
as the calibration harness runs them), phase, dtype, time_s.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfmodel.costs.conv import conv_output_size, gemm_part_seconds
from perfmodel.forms.registry import get_form
from perfmodel.fit.regression import Free, cross_validate, fit_form, mape
from perfmodel.workload.graph import conv_elements

SHAPE = ["batch", "cin", "cout", "hw", "kernel", "stride"]
MIN_POINTS = 4


def conv_rows(table: pd.DataFrame, variant: str) -> pd.DataFrame:
    """One row per shape with the seconds to explain: forward, or fwdbwd − fwd."""
    conv = table[table.op == "conv2d"].copy()
    for col in SHAPE:
        conv[col] = pd.to_numeric(conv[col], errors="coerce")
    conv = conv.dropna(subset=SHAPE + ["time_s"])
    fwd = conv[conv.phase == "fwd"].groupby(SHAPE)["time_s"].median()
    if variant == "fwd":
        y = fwd
    else:
        both = conv[conv.phase == "fwdbwd"].groupby(SHAPE)["time_s"].median()
        y = (both - fwd).dropna()
        y = y[y > 0]
    return y.rename("time_s").reset_index()


def _features(rows: pd.DataFrame, gemm_entry: dict, variant: str) -> dict:
    r = {c: rows[c].to_numpy(float) for c in SHAPE}
    out_hw = conv_output_size(r["hw"], r["kernel"], r["stride"])
    passes = 1 if variant == "fwd" else 2
    x = conv_elements(r["batch"], r["cin"], r["cout"], r["hw"] ** 2, out_hw ** 2, r["kernel"] ** 2, passes=passes)
    t_gemm = gemm_part_seconds(gemm_entry, r["batch"], r["cin"], r["cout"], r["hw"], r["kernel"], r["stride"],
                               phase=variant)
    return {"x": np.asarray(x, float), "t_gemm": np.asarray(t_gemm, float)}


def fit_conv(table: pd.DataFrame, *, variant: str, gemm_entry: dict | None, fwd_entry: dict | None = None,
             folds: int = 5, seed: int = 0, source: str = "") -> dict | None:
    """Profile entry of ``conv2d:<dtype>:<variant>`` (None when too few rows or no GEMM fit).

    Backward needs the forward entry: it is fitted on the fwdbwd rows as
    max(harness floor, forward + backward), the floor being the harness's per-call
    CPU cost of ``torch.autograd.grad`` (fitted, then dropped, as for memory-bound classes).
    """
    if gemm_entry is None or (variant == "bwd" and fwd_entry is None):
        return None
    rows = conv_rows(table, "fwd") if variant == "fwd" else _fwdbwd_rows(table)
    if len(rows) < MIN_POINTS:
        return None
    X, y = _features(rows, gemm_entry, variant), rows.time_s.to_numpy(float)
    if variant == "bwd":
        X["t_fwd"] = _forward_seconds(rows, gemm_entry, fwd_entry)
    scores, fits = {}, {}
    for label, (name, free) in _candidates(variant).items():
        form = get_form(name)
        predict = _predictor(form, variant)
        scores[label] = cross_validate(form, X, y, free, {"t_cpu": 0.0}, folds=folds, seed=seed, predict=predict)
        fits[label] = (name, fit_form(form, X, y, free, {"t_cpu": 0.0}, predict=predict), predict)
    finite = {k: v for k, v in scores.items() if np.isfinite(v)}
    best = min(finite, key=finite.get) if finite else next(iter(fits))
    form_name, params, predict = fits[best]
    entry = {"form": form_name, "params": {k: float(v) for k, v in params.items()}, "cv_mape": scores[best],
             "fit_mape": mape(predict(params, X), y), "n_points": int(len(y)), "source": source,
             "candidates": {k: round(v, 4) for k, v in scores.items()},
             "gemm_only_mape": mape(np.maximum(X["t_gemm"] + X.get("t_fwd", 0.0), params.get("floor", 0.0)), y),
             "dtype": str(table[table.op == "conv2d"].dtype.iloc[0]),
             "timing": "eager" if variant == "fwd" else "fwdbwd-minus-fwd",
             "gemm_part": "implicit GEMMs priced by the gemm fit of the same dtype (not fitted here)"}
    if "floor" in entry["params"]:
        entry["harness_floor_s"] = entry["params"].pop("floor")
    return entry


def _candidates(variant: str) -> dict:
    """Overhead forms, each from a small and a large starting point (the log-space fit is local).

    One cuDNN kernel's fixed cost stays under 50 µs: larger offsets in a table are the
    harness's per-call cost, which the backward floor absorbs.
    """
    out = {}
    for start, (t0, beta) in (("small start", (1e-8, 1e-17)), ("large start", (1e-5, 1e-12))):
        base = {"t0": Free(t0, 1e-9, 5e-5), "beta": Free(beta, 1e-18, 1e-9)}
        if variant == "bwd":
            base["floor"] = Free(1e-4, 1e-6, 1e-3)
        out[f"mem_affine, {start}"] = ("mem_affine", base)
        out[f"mem_power, {start}"] = ("mem_power", {**base, "gamma": Free(1.0, 0.5, 1.5)})
    return out


def _predictor(form, variant):
    def predict(p, X):  # measured = implicit GEMMs (fixed) + overhead (fitted) [+ forward, floor]
        own = {k: v for k, v in p.items() if k != "floor"}
        body = X["t_gemm"] + form.evaluate({**own, "t_cpu": 0.0}, x=X["x"])
        if variant == "fwd":
            return body
        return np.maximum(p["floor"], X["t_fwd"] + body)
    return predict


def _fwdbwd_rows(table: pd.DataFrame) -> pd.DataFrame:
    conv = table[(table.op == "conv2d") & (table.phase == "fwdbwd")].copy()
    for col in SHAPE:
        conv[col] = pd.to_numeric(conv[col], errors="coerce")
    return conv.dropna(subset=SHAPE + ["time_s"]).groupby(SHAPE)["time_s"].median().reset_index()


def _forward_seconds(rows: pd.DataFrame, gemm_entry: dict, fwd_entry: dict) -> np.ndarray:
    X = _features(rows, gemm_entry, "fwd")
    own = {**fwd_entry["params"], "t_cpu": 0.0}
    return X["t_gemm"] + get_form(fwd_entry["form"]).evaluate(own, x=X["x"])
