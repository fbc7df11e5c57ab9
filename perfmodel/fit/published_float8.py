"""What a torchao float8 linear takes beyond its GEMMs and its casts' bytes, fitted to published speedups.

pytorch/ao's float8 README publishes, for NVIDIA H100, the speedup over bfloat16 of a compiled
``LayerNorm -> Linear -> Sigmoid`` forward+backward with ``Float8Linear`` by the forward's M, K, N: the sum
of the GPU kernels' times (``benchmarks/float8/float8_roofline.py``; ``float8_linear_published.csv``: 216
rowwise cells, 2 tensorwise examples). Each row is priced here as the block it measures (the norm, the
linear's three GEMMs with the casts ``workload/stacks/float8.py`` counts, the sigmoid; Inductor's fusion of
the memory-bound kernels, ``workload/stacks/compile.py``), in bfloat16 and in float8. The measured float8
time, the priced bfloat16 time over the measured speedup, exceeds the priced float8 time: at small shapes
by a time that does not shrink with them (1024³ runs 0.42× under rowwise scaling), and at any shape by a
time that grows with the linear's input (8192 × 32768 at N = 1024: 3.3 ms more than its casts' bytes). The
fitted form (``fp8_linear_extra``) is that: ``t0`` per linear and ``a`` per element of its input
(M·K), both >= 0, by least squares on the log speedup; a recipe with fewer rows than ``MIN_ROWS_FOR_SLOPE``
fits ``t0`` alone. The profile keeps it as ``fp8_linear:<recipe>``; ``workload/stacks/float8.py`` adds it to
each float8 linear of a step (a third of ``t0`` and half the input term per GEMM; the forward's share is
repeated where the forward is recomputed).

    python -m perfmodel.fit.build               # rebuilds the bundled profiles, this step included
    python -m perfmodel.validate.kernels        # prints the fitted speedups against the published ones
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from perfmodel.core.lazy import scipy_optimize
from perfmodel.costs.compute import kernel_time
from perfmodel.profiles.profile import Profile
from perfmodel.profiles.published import float8_linear_table
from perfmodel.workload.ops import linear, mem
from perfmodel.workload.stack import adapt_kernels

FORM = "fp8_linear_extra"
MIN_ROWS_FOR_SLOPE = 8  # fewer rows: the fixed time alone (the two tensorwise examples)
FOLDS = 6


def block_seconds(profile: Profile, m: float, k: float, n: float, recipe: str | None) -> float:
    """GPU seconds of a compiled LayerNorm -> Linear[k -> n] -> Sigmoid forward+backward over m tokens, bfloat16
    (``recipe`` None) or torchao float8 under ``recipe``, as ``profile`` prices it."""
    dtype = "bf16" if recipe is None else "fp8"
    f, b = linear("fc", float(m), float(k), float(n), dtype=dtype)
    x, y = float(m) * float(k), float(m) * float(n)
    fwd = [mem("ln", "layernorm", "fwd", x, rows=float(m), dtype="bf16"), *f, mem("sig", "gelu", "fwd", y, dtype="bf16")]
    bwd = [mem("sig.bwd", "gelu", "bwd", y, dtype="bf16", variant="bwd"), *b,
           mem("ln.bwd", "layernorm", "bwd", x, rows=float(m), dtype="bf16", variant="bwd")]
    precision = "bf16-mixed" if recipe is None else "fp8-mixed"
    total = 0.0
    for kernels in (fwd, bwd):  # Inductor compiles the forward and the backward graphs apart
        for kern in adapt_kernels(kernels, precision=precision, framework="torchtitan", compiled=True,
                                  float8_recipe=recipe or ""):
            total += float(kernel_time(profile, kern)[0]) * float(kern.count)
    return total


def _priced(profile: Profile, rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(bfloat16 seconds, float8 seconds without the fitted extra, input elements M·K) of each row."""
    base = replace(profile, compute={c: e for c, e in profile.compute.items() if not c.startswith("fp8_linear:")})
    bf16, fp8 = (np.array([block_seconds(base, r.m, r.k, r.n, rec) for r in rows.itertuples()])
                 for rec in (None, rows.recipe.iloc[0]))
    return bf16, fp8, rows.m.to_numpy(float) * rows.k.to_numpy(float)


def _solve(bf16, fp8, mk, speedup, slope: bool) -> np.ndarray:
    """(t0, a) >= 0 minimising the log speedup's squared error (a = 0 unless ``slope``)."""
    def residual(p):
        a = p[1] if slope else 0.0
        return np.log(bf16 / (fp8 + p[0] + a * mk) / speedup)

    x0 = np.array([1e-4, 1e-11]) if slope else np.array([1e-4])
    sol = scipy_optimize.least_squares(residual, x0, bounds=(0.0, np.inf), x_scale=x0)
    return np.array([sol.x[0], sol.x[1] if slope else 0.0])


def _errors(p, bf16, fp8, mk, speedup) -> np.ndarray:
    return bf16 / (fp8 + p[0] + p[1] * mk) / speedup - 1.0


def fit_float8_linear(profile: Profile, gpu: str, recipe: str, *, folds: int = FOLDS, seed: int = 0) -> dict | None:
    """The ``fp8_linear:<recipe>`` entry fitted to ``gpu``'s published rows, priced with ``profile`` (None: no
    rows). ``cv_mape``: the median |error| of the speedup on ``folds`` held-out folds (rows enough for a slope)."""
    t = float8_linear_table()
    rows = t[(t.gpu == gpu) & (t.recipe == recipe)]
    if rows.empty:
        return None
    bf16, fp8, mk = _priced(profile, rows)
    speedup = rows.speedup.to_numpy(float)
    slope = len(rows) >= MIN_ROWS_FOR_SLOPE
    p = _solve(bf16, fp8, mk, speedup, slope)
    cv = None
    if slope:
        order = np.random.default_rng(seed).permutation(len(rows))
        held = []
        for part in np.array_split(order, folds):
            keep = np.setdiff1d(order, part)
            q = _solve(bf16[keep], fp8[keep], mk[keep], speedup[keep], slope)
            held.extend(np.abs(_errors(q, bf16[part], fp8[part], mk[part], speedup[part])))
        cv = float(np.median(held))
    fitted = float(np.median(np.abs(_errors(p, bf16, fp8, mk, speedup))))
    source = rows.source.iloc[0].split("; cell labels")[0]
    return {"form": FORM, "params": {"t0": float(p[0]), "a": float(p[1])}, "cv_mape": cv, "fit_mape": fitted,
            "n_points": int(len(rows)), "source": f"published: {source} ({len(rows)} rows; t0 per linear"
                                                  f"{', a per input element' if slope else ' alone'})"}


def fit_published_float8(profile: Profile, gpu: str) -> dict:
    """``{"fp8_linear:<recipe>": entry}`` for every recipe published for ``gpu``, priced with ``profile``."""
    t = float8_linear_table()
    out = {}
    for recipe in dict.fromkeys(t[t.gpu == gpu].recipe):
        entry = fit_float8_linear(profile, gpu, recipe)
        if entry is not None:
            out[f"fp8_linear:{recipe}"] = entry
    return out
