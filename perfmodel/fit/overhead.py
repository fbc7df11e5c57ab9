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

On a CPU the rows also hold two wider models whose arithmetic is not
negligible, and a third term prices how much slower the kernels run inside a
step than in a loop over one op (their operands are no longer in cache)::

    measured − predicted = a + e · N_kernels + f · T_kernels

with T_kernels the predicted compute seconds of the step's kernels; ``1 + f``
(``host["in_step_compute_factor"]``) multiplies every kernel's compute time on
that host. On a GPU the rows are launch-bound (their kernel time is hidden
behind the host), so f is not fitted there.
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


def kernel_count(model, micro_batch: int, precision: str, kernels=None) -> float:
    """Kernels of one micro-batch's forward and backward as the step list holds them
    (``kernels``: that list, when the caller has it already)."""
    from perfmodel.workload.step import step_kernels

    fwd, bwd = kernels or step_kernels(model, micro_batch, precision=precision)
    return float(sum(np.asarray(k.count, float).sum() for k in fwd + bwd))


def fit_step_overhead(profile, table: pd.DataFrame, gpu) -> dict:
    """Host entries (``cpu_extra_per_kernel_s``, ``step_extra_s`` and, on a CPU,
    ``in_step_compute_factor``) from ``train_step`` rows, or {}.

    ``gpu``: the hardware the rows were measured on (catalog name or TOML path).
    """
    import perfmodel as pm
    from perfmodel.costs.compute import phase_time
    from perfmodel.errors import PerfModelError
    from perfmodel.strategy import Strategy
    from perfmodel.workload.step import step_kernels

    rows = step_rows(table)
    if rows["layers"].nunique() < MIN_SIZES:
        return {}
    cluster = pm.cluster(str(gpu))
    n, t, r = [], [], []
    for _, row in rows.iterrows():
        model = pm.transformer(layers=int(row.layers), hidden=int(row.hidden), heads=int(row.heads),
                               seq=int(row.seq), vocab=int(row.vocab))
        precision = precision_of(str(row["dtype"]))
        try:
            predicted = pm.predict(model, cluster, Strategy(dp=1, micro_batch=int(row.batch), precision=precision),
                                   profile=profile).step_time
            fwd, bwd = step_kernels(model, int(row.batch), precision=precision)
            t.append(float(phase_time(profile, fwd)[1] + phase_time(profile, bwd)[1]))
        except PerfModelError:  # a class the profile cannot price: no overhead term rather than a wrong one
            return {}
        n.append(kernel_count(model, int(row.batch), precision, (fwd, bwd)))
        r.append(float(row.time_s) - predicted)
    n, t, r = np.asarray(n), np.asarray(t), np.asarray(r)
    columns = [np.ones_like(n), n]
    # f needs compute that varies apart from the kernel count: the wide rows (a CPU only, see above)
    with_f = bool(profile.host.get("serial")) and len(rows) >= 4 and _independent(n, t)
    if with_f:
        columns.append(t)
    coef = _nonnegative_lstsq(np.column_stack(columns), r)
    out = {"cpu_extra_per_kernel_s": float(coef[1]), "step_extra_s": float(coef[0]),
           "step_overhead_source": f"fitted to {len(rows)} train_step rows "
                                   f"({int(rows.layers.min())}-{int(rows.layers.max())} blocks): "
                                   "measured minus predicted = a + e * kernels"
                                   + (" + f * kernel seconds" if with_f else "")}
    if with_f:
        out["in_step_compute_factor"] = 1.0 + float(coef[2])
    return out


def _independent(n, t) -> bool:
    """Whether kernel seconds vary apart from the kernel count (not one line through the rows)."""
    if len(n) < 3 or np.ptp(t) <= 0:
        return False
    fitted = np.polyval(np.polyfit(n, t, 1), n)
    return float(np.max(np.abs(t - fitted))) > 0.1 * float(np.max(t))


def _nonnegative_lstsq(A, b):
    """Least squares with every coefficient >= 0 (a profile never gets faster from these terms)."""
    from scipy.optimize import nnls

    return nnls(A, b)[0]
