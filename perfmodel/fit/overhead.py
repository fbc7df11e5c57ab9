"""What a whole training step costs beyond its kernels, measured on tiny models.

A kernel microbenchmark calls one op in a loop; a training step also runs
module calls, autograd's bookkeeping and the optimizer's host code around every
op. calibration's ``train_step`` rows time whole steps of tiny transformers
(1 to 8 blocks of width 64: arithmetic negligible). The profile prices the same
models; the difference is regressed on the number of kernels in the step::

    measured − predicted = a + e · N_kernels

``e`` (``host["cpu_extra_per_kernel_s"]``) is added to the host time of every
kernel (on a GPU it only matters where the host is the bottleneck: small
models, eager mode); ``a`` (``host["step_extra_s"]``) once per step on a
device without a launch queue (a CPU), where it adds to the step. Both are
clipped at zero: a profile never gets faster from this term.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

STEP_OP = "train_step"
MIN_SIZES = 2  # distinct block counts needed for a slope


def precision_of(dtype: str) -> str:
    """The training precision whose kernels run in ``dtype`` (a compute.csv dtype)."""
    return "fp32" if dtype in ("fp32", "tf32") else f"{dtype}-mixed"


def step_rows(table: pd.DataFrame) -> pd.DataFrame:
    rows = table[(table.op == STEP_OP) & (pd.to_numeric(table.time_s, errors="coerce") > 0)]
    return rows.dropna(subset=["layers", "hidden", "heads", "seq", "vocab", "batch"])


def kernel_count(model, micro_batch: int, precision: str) -> float:
    """Kernels of one micro-batch's forward and backward as the step list holds them."""
    from perfmodel.workload.step import step_kernels

    fwd, bwd = step_kernels(model, micro_batch, precision=precision)
    return float(sum(np.asarray(k.count, float).sum() for k in fwd + bwd))


def fit_step_overhead(profile, table: pd.DataFrame, gpu) -> dict:
    """Host entries (``cpu_extra_per_kernel_s``, ``step_extra_s``) from ``train_step`` rows, or {}.

    ``gpu``: the hardware the rows were measured on (catalog name or TOML path).
    """
    import perfmodel as pm
    from perfmodel.errors import PerfModelError
    from perfmodel.strategy import Strategy

    rows = step_rows(table)
    if rows["layers"].nunique() < MIN_SIZES:
        return {}
    cluster = pm.cluster(str(gpu))
    n, r = [], []
    for _, row in rows.iterrows():
        model = pm.transformer(layers=int(row.layers), hidden=int(row.hidden), heads=int(row.heads),
                               seq=int(row.seq), vocab=int(row.vocab))
        precision = precision_of(str(row["dtype"]))
        try:
            predicted = pm.predict(model, cluster, Strategy(dp=1, micro_batch=int(row.batch), precision=precision),
                                   profile=profile).step_time
        except PerfModelError:  # a class the profile cannot price: no overhead term rather than a wrong one
            return {}
        n.append(kernel_count(model, int(row.batch), precision))
        r.append(float(row.time_s) - predicted)
    slope, intercept = np.polyfit(np.asarray(n), np.asarray(r), 1)
    return {"cpu_extra_per_kernel_s": max(float(slope), 0.0), "step_extra_s": max(float(intercept), 0.0),
            "step_overhead_source": f"fitted to {len(rows)} train_step rows "
                                    f"({int(rows.layers.min())}-{int(rows.layers.max())} blocks): "
                                    "measured minus predicted = a + e * kernels"}
