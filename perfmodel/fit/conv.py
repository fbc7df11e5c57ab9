"""Fit convolutions from a compute table: the CNN classes, and the older ``conv2d`` overhead class.

CNN classes (:func:`fit_classes`, priced by :mod:`perfmodel.costs.cnn`): rows of op
``conv2d`` timed one pass at a time (phase fwd, dgrad, wgrad; column ``groups``) and of
the bandwidth-bound layers (batchnorm, relu, silu, sigmoid, maxpool, avgpool, se_pool, se_scale;
phase fwd or bwd; ``bytes`` moved) fit t = max(t_cpu, t0 + c · t_ref) per class and,
pooled, per convolution kind, each with k-fold CV (leave-one-out below five rows).

The ``conv2d`` overhead class (:func:`fit_conv`, priced by :mod:`perfmodel.costs.conv`):

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

from perfmodel.core.errors import PerfModelError
from perfmodel.costs.cnn import (CONV_PASSES, GEMM_ONLY, MEM_CLASSES, STEM_CHANNELS, conv_label, conv_pass_kernel,
                                 output_fill, pooled_label, reference_seconds, winograd_eligible)
from perfmodel.costs.conv import conv_output_size, gemm_part_seconds
from perfmodel.forms.registry import get_form
from perfmodel.fit.regression import Free, cross_validate, fit_form, mape
from perfmodel.workload.graph import conv_elements
from perfmodel.workload.ops import Kernel

SHAPE = ["batch", "cin", "cout", "hw", "kernel", "stride"]
MIN_POINTS = 4
# The GEMM-only pool describes GEMM-shaped layers: a first layer's 3 image channels are not one (its implicit
# GEMM's k is padded to 8 channels, right for NHWC tensor cores, 8/3 too many for NCHW fp32), so such rows
# price only their own class
GEMM_POOL_MIN_CHANNELS = STEM_CHANNELS


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


# -- CNN kernel classes: a correction of a reference time per class (perfmodel/costs/cnn.py) ----------
CLASS_FORM = "scaled_ref"
FILL_FORM = "scaled_ref_fill"  # CLASS_FORM with the pass's SM shortfall (perfmodel/costs/cnn.py output_fill)
# CV MAPE FILL_FORM must gain over CLASS_FORM to be kept: one point, above the spread of 5-fold CV on ~20 rows
FILL_MIN_GAIN = 0.01
MEM_CLASS_PASSES = ("fwd", "bwd")


def _as_int(col: pd.Series, default: float) -> pd.Series:
    return pd.to_numeric(col, errors="coerce").fillna(default)


def class_rows(table: pd.DataFrame) -> pd.DataFrame:
    """Rows the CNN classes are fitted on, each with its profile key (``key``), kind-level key
    (``kind_key``) and, for a dense shape no Winograd algorithm runs, the pooled ``conv.dense-gemm`` key
    (``conv.dense-gemm-strided`` above stride 1; ``gemm_only_key``, else empty;
    :func:`perfmodel.costs.cnn.pooled_label`): convolution passes timed
    alone (phase fwd, dgrad or wgrad) and the bandwidth-bound layers (phase fwd or bwd, 'bytes' = bytes moved)."""
    conv = table[(table.op == "conv2d") & table.phase.isin(CONV_PASSES)].copy()
    conv["groups"] = _as_int(conv["groups"], 1.0) if "groups" in conv else 1.0
    for col in SHAPE:
        conv[col] = pd.to_numeric(conv[col], errors="coerce")
    conv = conv.dropna(subset=SHAPE + ["time_s"])
    labels = [conv_label(k, k, s, g, c) for k, s, g, c in zip(conv.kernel, conv.stride, conv.groups, conv.cin)]
    conv["key"] = [f"conv.{lb}:{d}:{p}" for lb, d, p in zip(labels, conv.dtype, conv.phase)]
    conv["kind_key"] = [f"conv.{lb.split('-')[0]}:{d}:{p}" for lb, d, p in zip(labels, conv.dtype, conv.phase)]
    pooled = [pooled_label(k, k, s, g, c) for k, s, g, c in zip(conv.kernel, conv.stride, conv.groups, conv.cin)]
    conv["gemm_only_key"] = [f"conv.{pl}:{d}:{p}" if f"-{GEMM_ONLY}" in pl and c >= GEMM_POOL_MIN_CHANNELS else ""
                             for pl, d, p, c in zip(pooled, conv.dtype, conv.phase, conv.cin)]
    mem = table[table.op.isin(MEM_CLASSES) & table.phase.isin(MEM_CLASS_PASSES)].copy()
    mem["bytes"] = pd.to_numeric(mem["bytes"], errors="coerce")
    mem = mem.dropna(subset=["bytes", "time_s"])
    mem["key"] = [f"{o}:{d}:{p}" for o, d, p in zip(mem.op, mem.dtype, mem.phase)]
    mem["kind_key"] = mem["key"]
    mem["gemm_only_key"] = ""
    return pd.concat([conv, mem], ignore_index=True)


def class_keys(rows: pd.DataFrame) -> list[str]:
    """Every class key with enough rows: per class, each convolution kind pooled, then the dense shapes
    no Winograd algorithm runs, pooled at stride 1 and above it."""
    counts = rows.groupby("key").size()
    conv = rows[rows.op == "conv2d"]
    kinds = conv.groupby("kind_key").size()
    gemm = conv[conv.gemm_only_key != ""].groupby("gemm_only_key").size()
    return [k for group in (counts, kinds, gemm) for k, n in group.items() if n >= MIN_POINTS]


def _row_kernel(rows: pd.DataFrame) -> Kernel:
    """One Kernel over the rows of one class (sizes as arrays; kind, dtype and pass shared)."""
    op, phase, dtype = (str(rows.iloc[0][c]) for c in ("op", "phase", "dtype"))
    if op != "conv2d":
        return Kernel(op, op, "fwd", {"bytes": rows["bytes"].to_numpy(float)}, 1, 0.0, phase, dtype)
    r = {c: rows[c].to_numpy(float) for c in SHAPE + ["groups"]}
    return conv_pass_kernel("conv", "fwd", phase, r["batch"], r["cin"], r["cout"], r["hw"], r["kernel"],
                            r["stride"], groups=r["groups"], dtype=dtype)


def fit_class(rows: pd.DataFrame, key: str, reference, *, folds: int = 5, seed: int = 0,
              source: str = "") -> dict | None:
    """Profile entry of one CNN class: t = max(t_cpu, t0 + c · t_ref) fitted in log space, k-fold CV.

    ``reference`` is the Profile whose GEMM and copy-bandwidth fits price t_ref (the same GPU's);
    None when it lacks them. ``key`` is a class key or a kind-level key of :func:`class_keys`.
    """
    sub = class_subset(rows, key)
    if len(sub) < MIN_POINTS or reference is None:
        return None
    kern = _row_kernel(sub)
    try:
        t_ref, _ = reference_seconds(reference, kern)
    except PerfModelError:  # the reference profile has no GEMM of this dtype or no copy curve
        return None
    bandwidth = kern.cls != "conv" or "depthwise" in key
    X, y = {"t_ref": np.asarray(t_ref, float)}, sub.time_s.to_numpy(float)
    if not bandwidth:  # a GEMM-referenced pass may also take its SM shortfall (form scaled_ref_fill)
        X["fill"] = np.broadcast_to(np.asarray(output_fill(reference, kern), float), y.shape)
    scores, fits, starts = {}, {}, _class_starts(fill="fill" in X)
    for label, (name, free) in starts.items():  # a local log-space fit: several starts, best CV kept
        form = get_form(name)
        own = {v: X[v] for v in form.variables}
        scores[label] = cross_validate(form, own, y, free, {}, folds=min(folds, len(y)), seed=seed)
        fits[label] = fit_form(form, own, y, free, {})
    finite = {k: v for k, v in scores.items() if np.isfinite(v)}
    plain = {k: v for k, v in finite.items() if starts[k][0] == CLASS_FORM}
    best = min(finite, key=finite.get) if finite else next(iter(fits))
    if plain and (starts[best][0] != CLASS_FORM and not (finite[best] < min(plain.values()) - FILL_MIN_GAIN
                                                          and np.any(X["fill"] > 1.0))):
        best = min(plain, key=plain.get)  # the extra exponent only where its rows show a shortfall and CV drops
    params, cv = fits[best], scores[best]
    form = get_form(starts[best][0])
    winograd = None if bandwidth else channel_range(sub)
    channels = {"channels": winograd} if winograd else {}
    return {**channels, "form": form.name, "params": {k: float(v) for k, v in params.items()}, "cv_mape": cv,
            "fit_mape": mape(form.evaluate(params, **{v: X[v] for v in form.variables}), y),
            "n_points": int(len(y)), "source": source,
            "reference": "bytes moved at copy:fp32:fwd" if bandwidth else f"implicit GEMM on gemm:{kern.dtype}",
            "reference_only_mape": mape(X["t_ref"], y), "dtype": str(kern.dtype),
            "candidates": {k: round(v, 4) for k, v in scores.items()},
            "classes": ", ".join(sorted(set(sub.key)) if key not in set(sub.key) else [key])}


def channel_range(rows: pd.DataFrame) -> dict | None:
    """The narrowest Winograd shapes (3x3 or 5x5 at stride 1) a convolution class was fitted on: the fewest
    output channels (padded to 8, as its implicit GEMM has them) and the fewest input channels among rows of at
    least ``STEM_CHANNELS`` (None when every such row is a stem); None for a class with no such row, whose c
    holds no Winograd saving. ``costs.cnn.within_channels`` lends the class to no narrower kernel: a Winograd
    saving measured on 64 channels or more is not carried down to a CIFAR network's 16 (docs/cnn.md)."""
    rows = rows[[winograd_eligible(k, k, st) for k, st in zip(rows.kernel, rows.stride)]]
    if not len(rows):
        return None
    wide = rows.cin[rows.cin >= STEM_CHANNELS]
    cout = rows.cout.to_numpy(float)
    cout = np.where(rows.groups.to_numpy(float) == 1, np.ceil(cout / 8.0) * 8.0, cout)
    return {"cin_min": float(wide.min()) if len(wide) else None, "cout_min": float(cout.min())}


def _class_starts(fill: bool = False) -> dict:
    """(form, starting point) of each class fit tried, the best by CV kept. A kernel's own latency t0 stays
    within a few µs; what an eager loop adds beyond it is the CPU floor t_cpu (dropped from the GPU time, as for
    other classes). ``fill``: a GEMM-referenced convolution pass, which also tries ``scaled_ref_fill`` (its SM
    shortfall's exponent a in [0.001, 1.5]; a = 0 is ``scaled_ref``)."""
    out = {}
    for t0, t_cpu in ((1e-6, 1e-5), (1e-6, 3e-5), (1e-8, 1e-4)):
        base = {"t0": Free(t0, 1e-9, 5e-6), "c": Free(1.0, 0.05, 50.0), "t_cpu": Free(t_cpu, 1e-7, 5e-4)}
        out[f"t0 {t0:g}, t_cpu {t_cpu:g}"] = (CLASS_FORM, base)
        if fill:
            out[f"t0 {t0:g}, t_cpu {t_cpu:g}, fill"] = (FILL_FORM, {**base, "a": Free(0.2, 1e-3, 1.5)})
    return out


def class_channel_ranges(table: pd.DataFrame) -> dict[str, dict]:
    """:func:`channel_range` of every convolution class ``table`` can fit (key -> range), without fitting."""
    rows = class_rows(table)
    conv = rows[rows.op == "conv2d"]
    ranges = {key: channel_range(class_subset(conv, key)) for key in class_keys(rows) if "depthwise" not in key}
    return {key: r for key, r in ranges.items() if r}


def class_subset(rows: pd.DataFrame, key: str) -> pd.DataFrame:
    """The rows of ``rows`` (:func:`class_rows`) one class key of :func:`class_keys` is fitted on."""
    return rows[(rows.key == key) | (rows.kind_key == key) | (rows.gemm_only_key == key)]


def fit_classes(table: pd.DataFrame, reference, *, folds: int = 5, seed: int = 0, source: str = "") -> dict:
    """Every CNN class entry fittable from ``table`` against ``reference`` (key -> entry)."""
    rows = class_rows(table)
    out = {}
    for key in class_keys(rows):
        entry = fit_class(rows, key, reference, folds=folds, seed=seed, source=source)
        if entry is not None:
            out[key] = entry
    return out
