"""Fit compute cost classes (GEMM, attention, memory-bound ops, optimizer) from a table.

Usage::

    fitter = ComputeFitter(sms=132).fit(read_compute_table("tables/"))
    fitter.entries_   # class key -> profile entry (form, params, cv_mape, ...)
    fitter.report_    # one row per class: points, CV MAPE, chosen form, candidates

Class keys: ``gemm:<dtype>``, ``sdpa:fwd``/``sdpa:bwd``, ``<op>:<dtype>:fwd|bwd``
for memory-bound ops over ``x`` elements (definition of x per op below),
``adamw:fused``/``adamw:foreach``; ``host`` holds the eager per-kernel CPU cost.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfmodel.forms.registry import get_form
from perfmodel.fit.regression import Free, cross_validate, fit_form, mape
from perfmodel.fit.tables import bound_rows, clean_rows, twin_rows
from perfmodel.fit.conv import class_keys, class_rows, fit_class
from perfmodel.profiles.profile import Profile
from perfmodel.core.units import DTYPE_BYTES
from perfmodel.fit.host_copy import fit_host_copies
from perfmodel.fit.conv import fit_conv  # conv2d: implicit GEMMs + a fitted overhead class

# operands touched per element by the raw memory ops (mem table 'bytes' is read + written)
RAW_OPERANDS = {"copy": 2, "add": 3, "scale": 2, "sum": 1}
MEM_OPS = ("layernorm", "rmsnorm", "softmax", "gelu", "swiglu", "residual_add", "rope",
           "cross_entropy", "cast_bf16_to_fp32", "cast_fp32_to_bf16", "embedding",
           "copy", "add", "scale", "sum")
MIN_POINTS = 4


RATE_PARAMS = ("R", "R_mis")
TIME_PARAMS = ("t0", "t_cpu", "floor")
INVERSE_RATE_PARAMS = ("beta", "beta_y", "beta_row")


def _data_scales(X, y) -> tuple[float, float]:
    """How far the data sit from the GPU-sized starting values: (rate factor, time factor).

    Starting values and bounds are written for a datacenter GPU (GEMMs near 1e15
    FLOP/s, launches near 10 µs). Tables from a much slower (or faster) device —
    a CPU at 1e11 FLOP/s — move them by these factors; within 100× of the GPU
    defaults nothing moves, so GPU fits do not depend on this.
    """
    if {"m", "n", "k"} <= set(X):
        work = 2.0 * X["m"] * X["n"] * X["k"]
        rate = float(np.median(work / y)) / 4e14
    elif "x" in X:  # bandwidth from the larger half of the sizes (the small ones measure latency)
        big = X["x"] >= np.median(X["x"])
        rate = 1e-12 / max(float(np.median(y[big] / np.maximum(X["x"][big], 1.0))), 1e-18)
    else:
        rate = 1.0
    tau = float(np.min(y)) / 1.5e-5
    clamp = lambda f: 1.0 if 0.01 <= f <= 100.0 else f  # noqa: E731
    return clamp(rate), clamp(tau)


# Back-to-back tensor-core load longer than this meets the power limit: on an H200 at 700 W
# a 16384^3 bf16 GEMM runs its first 11 ms at 796 TFLOP/s and the rest at ~680, and 1 s of
# load settles at 0.85 of the burst rate (calibration.sustained). A training step interleaves
# memory-bound kernels and ran its GEMMs at the burst rate (per-kernel step profiles), so the
# fit prices the kernel at burst and treats the throttled rows' rate fraction as a nuisance.
POWER_ONSET_S = 0.03


def _evaluator(form):
    """Evaluate ``form`` on a table's points; rows flagged ``graph`` (replayed in a CUDA graph:
    GPU time alone) are evaluated without the eager CPU floor ``t_cpu``, rows measured under
    longer load than ``POWER_ONSET_S`` at the fitted power-limited fraction ``p_power``."""
    def evaluate(p, X):
        variables = {v: X[v] for v in form.variables}
        t = form.evaluate(p, **variables)
        if "graph" in X and "t_cpu" in p:
            t = np.where(np.asarray(X["graph"]) > 0, form.evaluate({**p, "t_cpu": 0.0}, **variables), t)
        if "load_s" in X and "p_power" in p:  # measured after the power limit engaged
            t = np.where(np.asarray(X["load_s"]) > POWER_ONSET_S, t / p["p_power"], t)
        return t
    return evaluate


def _rescale(free: dict, rate: float, tau: float) -> dict:
    out = {}
    for name, f in free.items():
        if name in RATE_PARAMS and rate != 1.0:
            f = Free(f.init * rate, f.lo * min(rate, 1.0), f.hi * max(rate, 1.0))
        elif name in INVERSE_RATE_PARAMS and rate != 1.0:
            f = Free(f.init / rate, f.lo / max(rate, 1.0), f.hi / min(rate, 1.0))
        elif name in TIME_PARAMS and tau != 1.0:
            f = Free(f.init * tau, f.lo * min(tau, 1.0), f.hi * max(tau, 1.0))
        out[name] = f
    return out


def _row_counts(df: pd.DataFrame):
    """Tokens (rows) of each measurement when every row has them, else None."""
    tokens = pd.to_numeric(df["tokens"], errors="coerce").to_numpy(float)
    return tokens if np.isfinite(tokens).all() and df["op"].iloc[0] not in RAW_OPERANDS else None


def mem_elements(df: pd.DataFrame) -> np.ndarray:
    """Elements ``x`` a memory-bound row works on (the op's main tensor)."""
    op = df["op"].iloc[0]
    if op in RAW_OPERANDS:
        return df["bytes"].to_numpy(float) / 4 / RAW_OPERANDS[op]
    if op.startswith("cast_"):
        tv = (df["tokens"] * df["vocab"]).to_numpy(float)
        return np.where(np.isfinite(tv), tv, df["bytes"].to_numpy(float) / 6)
    if op == "cross_entropy":
        return (df["tokens"] * df["vocab"]).to_numpy(float)
    if op == "rope":
        return (df["batch"] * df["heads"] * df["seq"] * df["head_dim"]).to_numpy(float)
    return (df["tokens"] * df["hidden"]).to_numpy(float)


ROWLEN_FREE = {"r": Free(0.5, 1e-3, 10.0), "L_half": Free(2048.0, 64.0, 1e6), "q": Free(2.0, 1.0, 8.0)}
SMALL_WEIGHT = 0.3  # memory-bound points under 1 MiB: launch-floor territory, where a form that
# serves the >= 1 MiB range (the one scored, and the one a step's time depends on) need not fit


def _size_weights(x):
    return np.where(np.asarray(x, float) * 4 >= 2**20, 1.0, SMALL_WEIGHT)


def _autograd_call_s(table) -> float:
    """What one ``torch.autograd.grad`` call costs beyond its kernels: a one-element add's
    forward+backward less two of its launches."""
    add = table[(table.op == "launch_add") & (table.timing == "eager") & (table.time_s > 0)]
    fwd, both = add[add.phase == "fwd"].time_s, add[add.phase == "fwdbwd"].time_s
    if fwd.empty or both.empty:
        return 0.0
    return max(float(both.min()) - 2 * float(fwd.min()), 0.0)


def without_autograd_call(table: pd.DataFrame, seconds: float) -> pd.DataFrame:
    """The table with ``seconds`` taken off every eager fwdbwd row: the autograd engine's per-call
    cost, which a benchmark pays on every call and a step once (on a serial host it adds to the
    op's time). Rows it leaves at or below zero are dropped."""
    if seconds <= 0:
        return table
    hit = (table.phase == "fwdbwd") & (table.timing == "eager")
    out = table.assign(time_s=np.where(hit, table.time_s - seconds, table.time_s))
    return out[out.time_s > 0]


FLOOR_SHOWS = 1.05  # an eager row this much slower than its graph twin measured the CPU floor


def _floor_never_showed(graph: pd.DataFrame, eager: pd.DataFrame) -> bool:
    """True when every graph-timed row has an eager twin within ``FLOOR_SHOWS`` of it: the graph rows
    then removed no CPU floor, and the eager rows (usually more, over a wider range) say as much."""
    pairs = twin_rows(graph.reset_index(), eager, ignore=("timing",))
    return (len(eager) > len(graph) and pairs["index"].nunique() == len(graph)
            and bool((pairs.time_s_twin <= FLOOR_SHOWS * pairs.time_s).all()))


class ComputeFitter:
    """Fit every compute class found in a table; keep the best of the candidate forms by CV."""

    def __init__(self, *, sms: int = 132, folds: int = 5, seed: int = 0, mem_bw_bytes_per_s: float = 4.0e12,
                 source: str = "", power_limited: bool = True, serial: bool = False, progress=None):
        self.sms = sms
        self.progress = progress  # progress(done, total, class): called before each class is fitted
        self.power_limited = power_limited  # a GPU: long back-to-back GEMM load meets its power limit
        self.serial = serial  # a CPU: a benchmark's per-call host costs add to its op's time
        self.folds = folds
        self.seed = seed
        self.mem_bw_bytes_per_s = mem_bw_bytes_per_s
        self.source = source

    def __repr__(self) -> str:
        return f"ComputeFitter(sms={self.sms}, folds={self.folds}, seed={self.seed})"

    def fit(self, table: pd.DataFrame) -> ComputeFitter:
        table, self.rejected_ = clean_rows(table)
        table, reduced = bound_rows(table, seed=self.seed)  # bounded memory on a huge table; says what it did
        self.rejected_.update(reduced)
        self.entries_: dict[str, dict] = {}
        self._skipped: dict[str, str] = {}
        self.host_: dict[str, float] = {}
        rows = []
        self.points_: dict[str, tuple] = {}  # class -> (measured, fitted) for residual plots
        if self.serial:  # a benchmark pays the autograd engine per call, a step once: take it out
            autograd = _autograd_call_s(table)
            if autograd > 0:
                self.host_["autograd_call_s"] = autograd
                table = without_autograd_call(table, autograd)
        jobs = list(self._jobs(table))
        for i, (key, fn) in enumerate(jobs):
            if self.progress is not None:
                self.progress(i, len(jobs), key)
            self._key = key
            entry = fn()
            if entry is None:
                form = self._skipped.get(key, "(datasheet fallback)")
                rows.append({"class": key, "points": 0, "form": form, "cv_mape": np.nan})
                continue
            self.entries_[key] = entry
            rows.append({"class": key, "points": entry["n_points"], "form": entry["form"],
                         "cv_mape": entry["cv_mape"], "fit_mape": entry.get("fit_mape"),
                         "candidates": entry.get("candidates", {})})
        self._fit_host(table)
        self.report_ = pd.DataFrame(rows, columns=["class", "points", "form", "cv_mape", "fit_mape", "candidates"])
        return self

    # -- job list ---------------------------------------------------------
    def _jobs(self, table):
        for dtype in ("bf16", "fp16", "tf32", "fp32", "fp8"):
            sub = table[(table.op == "gemm") & (table.dtype == dtype)]
            if len(sub):
                yield f"gemm:{dtype}", lambda sub=sub, dtype=dtype: self._fit_gemm(sub, dtype)
        sdpa = table[table.op == "sdpa"]
        if len(sdpa):
            yield "sdpa:fwd", lambda: self._fit_sdpa(sdpa, "fwd")
            yield "sdpa:bwd", lambda: self._fit_sdpa(sdpa, "bwd")
        for (op, dtype), sub in table[table.op.isin(MEM_OPS)].groupby(["op", "dtype"]):
            yield f"{op}:{dtype}:fwd", lambda sub=sub: self._fit_mem(sub, "fwd")
            if (sub.phase == "fwdbwd").any():
                yield f"{op}:{dtype}:bwd", lambda sub=sub: self._fit_mem(sub, "bwd")
        for fused, sub in table[table.op == "adamw"].groupby("fused"):
            name = "fused" if str(fused).lower() in ("true", "1", "1.0") else "foreach"
            yield f"adamw:{name}", lambda sub=sub: self._fit_per_param(sub)
        for dtype, sub in table[table.op == "conv2d"].groupby("dtype"):
            for variant in ("fwd", "bwd"):
                yield f"conv2d:{dtype}:{variant}", lambda sub=sub, dtype=dtype, variant=variant: fit_conv(
                    sub, variant=variant, gemm_entry=self.entries_.get(f"gemm:{dtype}"),
                    fwd_entry=self.entries_.get(f"conv2d:{dtype}:fwd"), folds=self.folds, seed=self.seed,
                    source=self.source)
        cnn = class_rows(table)  # CNN classes: corrections of the GEMM and copy fits above
        for key in class_keys(cnn):
            yield key, lambda key=key: self._fit_cnn_class(cnn, key)

    def _fit_cnn_class(self, cnn, key):
        entry = fit_class(cnn, key, self._reference(), folds=self.folds, seed=self.seed, source=self.source)
        if entry is None and ((cnn.key == key) | (cnn.kind_key == key) | (cnn.gemm_only_key == key)).sum() >= MIN_POINTS:
            # enough rows, but no GEMM or copy fit of this run to correct: say so in the report
            self._skipped[key] = "(skipped: no gemm/copy fit in this run; measure --ops gemm,copy with it)"
        return entry

    def _reference(self) -> Profile:
        """The classes fitted so far as a Profile: what the CNN classes' reference times are priced on."""
        return Profile("fitted so far", "", dict(self.entries_))

    def _entry(self, form, params, cv, n, fit_err, candidates=None, **extra):
        return {"form": form, "params": {k: float(v) for k, v in params.items()}, "cv_mape": cv,
                "fit_mape": fit_err, "n_points": int(n), "source": self.source,
                **({"candidates": candidates} if candidates else {}), **extra}

    # -- GEMM ---------------------------------------------------------------
    def _fit_gemm(self, sub, dtype):
        if len(sub) < MIN_POINTS:
            return None
        X = {k: sub[k].to_numpy(float) for k in ("m", "n", "k")}
        y = sub.time_s.to_numpy(float)
        big = 2 * X["m"] * X["n"] * X["k"] >= 1e9
        if (sub.timing == "graph").any():
            X["graph"] = (sub.timing == "graph").to_numpy(float)
        # seconds of back-to-back load the benchmark put on the GPU (warm-up, probe, reps x inner)
        load = (sub.time_s * (3 + sub.reps.fillna(0) * sub.inner.fillna(1))).to_numpy(float)
        power_limited = self.power_limited and (load[big] > POWER_ONSET_S).sum() >= MIN_POINTS
        if power_limited:
            X["load_s"] = load
        fixed = {"sms": float(self.sms), "elem_bytes": float(DTYPE_BYTES[dtype]),
                 "bw": self.mem_bw_bytes_per_s}
        free = {"R": Free(5e14, 1e12, 5e15), "k_half": Free(64, 1, 1e5), "t0": Free(3e-6, 1e-8, 1e-3),
                "t_cpu": Free(1e-5, 1e-7, 1e-3), "p16": Free(0.9, 0.05, 1.0), "p8": Free(0.5, 0.01, 1.0),
                "p4": Free(0.3, 0.01, 1.0), "p2": Free(0.2, 0.01, 1.0), "p_both": Free(0.8, 0.05, 1.0)}
        # (one fixed tile shape, ``gemm_wave``, was 10-50% off on the H200 tables: cuBLAS picks the
        # tile per shape, which ``gemm_tiles`` models)
        candidates = {
            "gemm_smooth": ("gemm_smooth", fixed, {**free, "m_half": Free(64, 1, 1e5), "n_half": Free(64, 1, 1e5)}),
        }
        two = {"R": Free(7e14, 1e12, 5e15), "k_half": Free(128, 1, 1e5), "m_half": Free(64, 1, 1e5),
               "n_half": Free(64, 1, 1e5), "p16": Free(0.9, 0.05, 1.0), "R_mis": Free(1.5e14, 1e11, 5e15),
               "k_half_mis": Free(256, 1, 1e5), "mn_half_mis": Free(1e5, 1, 1e9), "t0": Free(3e-6, 1e-8, 1e-3),
               "t_cpu": Free(1e-5, 1e-7, 1e-3)}
        candidates["gemm_two"] = ("gemm_two", fixed, two)
        candidates["gemm_two_levels"] = ("gemm_two_levels", fixed,
                                         {**two, "p4": Free(0.7, 0.05, 1.0), "p2": Free(0.5, 0.05, 1.0)})
        # CUTLASS's sm90 stream-K scheduler serves tensor-core kernels; fp32 runs SIMT kernels
        tiles_fixed = {**fixed, "stream_k": 0.0 if dtype == "fp32" else 1.0}
        candidates["gemm_tiles"] = ("gemm_tiles", tiles_fixed, {
            **{k: two[k] for k in ("R", "k_half", "p16", "R_mis", "k_half_mis", "mn_half_mis", "t0", "t_cpu")},
            "e16": Free(0.9, 0.3, 1.2), "e8": Free(0.75, 0.2, 1.2), "e4": Free(0.6, 0.1, 1.2),
            "t_split": Free(3e-6, 1e-8, 1e-3), "p4": Free(0.7, 0.05, 1.0), "p2": Free(0.5, 0.05, 1.0)})
        if not power_limited:
            return self._best(candidates, X, y, score_mask=big)
        power = {"p_power": Free(0.9, 0.5, 1.0)}  # a nuisance parameter of the benchmark, not of the kernel
        candidates = {label: (form, fx, {**fr, **power}) for label, (form, fx, fr) in candidates.items()}
        entry = self._best(candidates, X, y, score_mask=big)
        entry["power_limited"] = {"onset_s": POWER_ONSET_S, "rate_fraction": entry["params"].pop("p_power")}
        return entry

    def _best(self, candidates, X, y, *, score_mask=None, predict=None, extra=None, weights=None):
        scores, fits = {}, {}
        rate, tau = _data_scales(X, y)
        for label, (form_name, fixed, free) in candidates.items():
            free = _rescale(free, rate, tau)
            form = get_form(form_name)
            evaluate = predict or _evaluator(form)
            scores[label] = cross_validate(form, X, y, free, fixed, folds=self.folds, seed=self.seed,
                                           score_mask=score_mask, predict=evaluate, weights=weights)
            fits[label] = (form_name, fit_form(form, X, y, free, fixed, predict=evaluate, weights=weights))
        finite = {k: v for k, v in scores.items() if np.isfinite(v)}
        best = min(finite, key=finite.get) if finite else next(iter(candidates))
        form_name, params = fits[best]
        evaluate = predict or _evaluator(get_form(form_name))
        mask = np.ones(len(y), bool) if score_mask is None else score_mask
        fitted = np.asarray(evaluate(params, X), float)
        fit_err = mape(fitted[mask], y[mask])
        self.points_[self._key] = (y, fitted)
        return self._entry(form_name, params, scores[best], len(y), fit_err,
                           {k: round(v, 4) for k, v in scores.items()}, **(extra or {}))

    # -- attention -----------------------------------------------------------
    def _fit_sdpa(self, sdpa, which):
        cols = ["batch", "heads", "kv_heads", "seq", "head_dim", "causal"]
        fwd = sdpa[sdpa.phase == "fwd"].set_index(cols)["time_s"]
        both = sdpa[sdpa.phase == "fwdbwd"].set_index(cols)["time_s"]
        if which == "fwd":
            y_series = fwd
        else:  # backward = forward+backward minus forward of the same configuration
            y_series = (both - fwd).dropna()
            y_series = y_series[y_series > 0]
        if len(y_series) < MIN_POINTS:
            return None
        idx = y_series.index.to_frame(index=False)
        X = {"batch": idx.batch.to_numpy(float), "heads": idx.heads.to_numpy(float),
             "seq": idx.seq.to_numpy(float), "head_dim": idx.head_dim.to_numpy(float),
             "causal": idx.causal.astype(str).str.lower().isin(["true", "1", "1.0"]).to_numpy(float)}
        y = y_series.to_numpy(float)
        free = {"R": Free(6e14, 1e12, 5e15), "s_half": Free(256, 1, 1e5), "d_half": Free(64, 1, 1e4),
                "p_mis": Free(0.2, 0.01, 1.0), "p_causal": Free(0.8, 0.3, 1.2), "t0": Free(5e-6, 1e-8, 1e-3)}
        candidates = {}
        for form in ("sdpa_flash", "sdpa_flash64"):  # head_dim padded to steps of 32 or of 64
            candidates[form] = (form, {"t_cpu": 0.0, "c_row": 0.0}, free)
            candidates[f"{form}/rows"] = (form, {"t_cpu": 0.0}, {**free, "c_row": Free(1e-10, 1e-14, 1e-6)})
        tiles = {"R": free["R"], "d_half": free["d_half"], "p_mis": free["p_mis"], "t0": free["t0"],
                 "c_row": Free(1e-10, 1e-14, 1e-6), "k_tail": Free(0.5, 1e-3, 5.0)}
        for form in ("sdpa_tiles", "sdpa_tiles64"):
            fixed = {"t_cpu": 0.0, "T": 128.0, "sms": float(self.sms)}  # 128-row blocks (FlashAttention-2 on A100/H100)
            candidates[form] = (form, {**fixed, "p_diag": 0.0}, tiles)
            candidates[f"{form}/diag"] = (form, fixed, {**tiles, "p_diag": Free(0.5, 1e-3, 5.0)})
        # A head_dim off a multiple of 8 leaves FlashAttention; the tables hold one such
        # row, which no held-out fold can predict: it is fitted but not scored.
        aligned = np.mod(X["head_dim"], 8) == 0
        entry = self._best(candidates, X, y, score_mask=aligned)
        entry["cv_scope"] = f"head_dim multiple of 8 ({int(aligned.sum())} of {len(y)} points)"
        return entry

    # -- memory-bound ---------------------------------------------------------
    def _fit_mem(self, sub, which):
        fwd_rows = sub[sub.phase == "fwd"]
        graph = fwd_rows[fwd_rows.timing == "graph"]
        measured_dtype = sub["dtype"].iloc[0]
        if which == "fwd":
            eager = fwd_rows[fwd_rows.timing == "eager"]
            rows = graph if len(graph) >= MIN_POINTS and not _floor_never_showed(graph, eager) else eager
            if len(rows) < MIN_POINTS and rows["op"].iloc[0:1].isin(["embedding"]).all() and len(rows) >= 3:
                pass
            elif len(rows) < MIN_POINTS:
                return None
            X, y = {"x": mem_elements(rows)}, rows.time_s.to_numpy(float)
            t_cpu = Free(1e-5, 1e-7, 1e-3) if rows is not graph else None
            free = {"t0": Free(2e-6, 1e-9, 1e-3), "beta": Free(1e-12, 1e-15, 1e-8)}
            fixed = {"t_cpu": 0.0}
            if t_cpu is not None:
                free, fixed = {**free, "t_cpu": t_cpu}, {}
            candidates = {"mem_affine": ("mem_affine", fixed, free),
                          "mem_power": ("mem_power", fixed, {**free, "gamma": Free(0.95, 0.85, 1.0)}),
                          "mem_smoothmax": ("mem_smoothmax", fixed, {**free, "q": Free(2.0, 1.0, 8.0)})}
            rows_col = _row_counts(rows)
            if rows_col is not None:  # row-wise ops: a per-row cost besides the bytes
                X_rows = {**X, "rows": rows_col}
                entry_rows = self._best({"mem_rows": ("mem_rows", fixed, {**free, "beta_row": Free(1e-10, 1e-14, 1e-6)}),
                                         "mem_rowlen": ("mem_rowlen", fixed, {**free, **ROWLEN_FREE})}, X_rows, y,
                                        score_mask=X["x"] * 4 >= 2**20, weights=_size_weights(X["x"]),
                                        extra={"dtype": measured_dtype, "timing": rows.timing.iloc[0]})
            entry = self._best(candidates, X, y, score_mask=X["x"] * 4 >= 2**20, weights=_size_weights(X["x"]),
                               extra={"dtype": measured_dtype, "timing": rows.timing.iloc[0]})
            if rows_col is not None:
                entry["candidates"].update(entry_rows["candidates"])
                entry_rows["candidates"] = entry["candidates"]
                if entry_rows["cv_mape"] < entry["cv_mape"]:
                    return entry_rows
            return entry
        return self._fit_mem_bwd(sub, measured_dtype)

    def _fit_mem_bwd(self, sub, measured_dtype):
        """Backward from fwd+bwd rows: graph-timed = fwd(x) + bwd(x); eager = max(harness floor, that).

        Graph-timed rows (GPU time alone) are used when there are enough of them: eager ones
        carry autograd's CPU cost per call (~0.2 ms), a floor that hides the GPU time of small ops.
        """
        graph = sub[(sub.phase == "fwdbwd") & (sub.timing == "graph")]
        use_graph = len(graph) >= MIN_POINTS
        both = graph if use_graph else sub[(sub.phase == "fwdbwd") & (sub.timing == "eager")]
        fwd_entry = self.entries_.get(f"{sub.op.iloc[0]}:{measured_dtype}:fwd")
        if len(both) < MIN_POINTS or fwd_entry is None:
            return None
        fwd_form = get_form(fwd_entry["form"])
        fwd_gpu = {**fwd_entry["params"], "t_cpu": 0.0}
        X, y = {"x": mem_elements(both)}, both.time_s.to_numpy(float)
        rows_col = _row_counts(both)
        base = {"t0": Free(5e-6, 1e-9, 1e-3), "beta": Free(1e-12, 1e-15, 1e-8)}
        if not use_graph:
            base["floor"] = Free(1e-4, 1e-6, 1e-3)
        if rows_col is not None:
            X["rows"] = rows_col
        if sub.op.iloc[0] == "embedding":
            X["y"] = (both.vocab * both.hidden).to_numpy(float)
            options = {"mem_affine2": {**base, "beta_y": Free(1e-12, 1e-15, 1e-8)}}
        else:
            options = {"mem_affine": base}
            if rows_col is not None:
                options["mem_rows"] = {**base, "beta_row": Free(1e-10, 1e-14, 1e-6)}
                options["mem_rowlen"] = {**base, **ROWLEN_FREE}
        best = None
        for name, free in options.items():
            form = get_form(name)

            def predict(p, X, form=form):
                bwd = {k: v for k, v in p.items() if k != "floor"}
                fwd_t = fwd_form.evaluate(fwd_gpu, **{v: X[v] for v in fwd_form.variables})
                body = fwd_t + form.evaluate({**bwd, "t_cpu": 0.0}, **{v: X[v] for v in form.variables})
                return np.maximum(p["floor"], body) if "floor" in p else body

            entry = self._best({name: (name, {"t_cpu": 0.0}, free)}, X, y, predict=predict,
                               score_mask=X["x"] * 4 >= 2**20, weights=_size_weights(X["x"]),
                               extra={"dtype": measured_dtype,
                                      "timing": "graph-fwdbwd-minus-fwd" if use_graph else "fwdbwd-minus-fwd"})
            if best is None or (np.isfinite(entry["cv_mape"]) and entry["cv_mape"] < best["cv_mape"]):
                candidates = {**(best or {}).get("candidates", {}), **entry.get("candidates", {})}
                best = entry
                best["candidates"] = candidates
            else:
                best["candidates"].update(entry.get("candidates", {}))
        if not use_graph:
            best["harness_floor_s"] = best["params"].pop("floor")
        return best

    def _fit_per_param(self, sub):
        if len(sub) < 3:
            return None
        X, y = {"params": sub.params.to_numpy(float)}, sub.time_s.to_numpy(float)
        free = {"t0": Free(1e-5, 1e-8, 1e-2), "beta": Free(1e-11, 1e-14, 1e-8)}
        return self._best({"per_param": ("per_param", {}, free)}, X, y)

    def _fit_host(self, table):
        """Eager CPU cost per kernel launch, from tiny kernels eager vs in a CUDA graph."""
        tiny = table[table.op.isin(["launch_add", "launch_mm"]) & (table.timing == "eager")]
        if len(tiny):
            self.host_["cpu_per_kernel_s"] = float(tiny.time_s.min())
        gemm = self.entries_.get("gemm:bf16")
        if gemm:
            self.host_["gemm_cpu_floor_s"] = gemm["params"]["t_cpu"]
        self.host_.update(fit_host_copies(table))  # pinned h2d / d2h copies (activation offload)

