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
kept >= 0 (a profile never gets faster from this term); each step's equation
is divided by its measured time and fitted with a soft-L1 loss, so one step
timed while the machine was busy does not set the terms.

On a CPU the rows also hold four wider models whose arithmetic is not
negligible, and a third term prices how much slower the GEMMs run inside a
step than in a loop over one op (their weights are no longer in cache)::

    measured − predicted = a + e · N_kernels + f · T_gemm

with T_gemm the predicted compute seconds of the step's GEMMs; ``1 + f``
(``host["in_step_compute_factor"]``) multiplies every GEMM's compute time on
that host (per-op profiles of CPU steps show the GEMMs 26–30% slower than
their loop timing and the memory-bound ops at it). On a GPU the rows are
launch-bound (their kernel time is hidden behind the host), so f is not
fitted there.

``fit_ddp_overhead`` does the same for data parallelism on a CPU host: tiny
DDP steps measured under ``torch.distributed.run`` against their prediction
give a cost per gradient bucket (``host["ddp_bucket_extra_s"]``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfmodel import hardware
from perfmodel.core.errors import PerfModelError
from perfmodel.costs.compute import phase_time
from perfmodel.hardware import as_cluster
from perfmodel.parallel.config import bucket_bytes
from perfmodel.parallel.data import ddp_buckets
from perfmodel.parallel.strategy import Strategy, fill_dp
from perfmodel.parallel.wire import wire_bytes
from perfmodel.predict import predict
from perfmodel.workload.kernels import step_kernels
from perfmodel.workload.model import transformer

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
    fwd, bwd = kernels or step_kernels(model, micro_batch, precision=precision)
    return float(sum(np.asarray(k.count, float).sum() for k in fwd + bwd))


def fit_step_overhead(profile, table: pd.DataFrame, gpu) -> dict:
    """Host entries (``cpu_extra_per_kernel_s``, ``step_extra_s`` and, on a CPU,
    ``in_step_compute_factor``) from ``train_step`` rows, or {}.

    ``gpu``: the hardware the rows were measured on (catalog name or TOML path).
    """
    rows = step_rows(table)
    if rows["layers"].nunique() < MIN_SIZES:
        return {}
    cluster = hardware.cluster(str(gpu))
    n, t, r = [], [], []
    for _, row in rows.iterrows():
        model = transformer(layers=int(row.layers), hidden=int(row.hidden), heads=int(row.heads),
                               seq=int(row.seq), vocab=int(row.vocab))
        precision = precision_of(str(row["dtype"]))
        try:
            predicted = predict(model, cluster, Strategy(dp=1, micro_batch=int(row.batch), precision=precision),
                                   profile=profile).step_time
            fwd, bwd = step_kernels(model, int(row.batch), precision=precision)
            t.append(sum(float(phase_time(profile, [k for k in ks if k.cls == "gemm"])[1]) for ks in (fwd, bwd)))
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
    # relative residuals, robust loss: one step timed while the machine was busy must not set the factor
    coef = _robust_nonnegative(np.column_stack(columns), r, rows.time_s.to_numpy(float))
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


ROBUST_SCALE = 0.02  # residuals beyond 2% of a step's time count linearly, not squared (soft L1)


def _robust_nonnegative(A, b, scale):
    """Coefficients >= 0 (a profile never gets faster from these terms) fitting A·x = b with each
    row divided by ``scale`` (its measured time) and a soft-L1 loss: least squares on the rows
    that agree, outliers (a step slowed by other load) pulled in less."""
    from scipy.optimize import least_squares, nnls

    w = 1.0 / np.asarray(scale, float)
    start = nnls(A * w[:, None], b * w)[0]
    if not A.any():
        return start
    fit = least_squares(lambda x: (A @ x - b) * w, start, bounds=(0.0, np.inf), loss="soft_l1",
                        f_scale=ROBUST_SCALE, x_scale="jac")
    x = fit.x
    x[np.max(np.abs(A), axis=0) * x < 1e-9] = 0.0  # a term adding under a nanosecond is the bound itself
    return x


def fit_ddp_overhead(profile, cases) -> dict:
    """A serial host's cost per DDP bucket beyond the priced all-reduce and bucket copies.

    On a CPU the all-reduce a DDP step issues takes longer than the same call
    timed in a loop (it follows the rank's backward, waits for the slowest rank,
    and wakes gloo's threads on busy cores; docs/distributed.md). ``cases``:
    measured DDP steps of tiny models (``perfmodel.validate.read_measured``);
    ``profile``: the host's data-parallel profile without this term. The fit is
    the median over the steps of (measured − predicted) / N_buckets, clipped at
    zero; ``host["ddp_bucket_extra_s"]`` then adds it per bucket on that host.
    """
    per_bucket = []
    for case in cases:
        s = fill_dp(case.strategy, as_cluster(case.cluster).n_gpus)  # dp=None: the cluster's, as predict
        if s.dp < 2 or s.shard or s.ps_servers:
            continue
        gap = case.measured - predict(case.model, case.cluster, s, profile=profile).step_time
        grad_bytes = wire_bytes(s.precision, s.framework).grad * case.model.params / s.tp / s.pp
        per_bucket.append(gap / float(ddp_buckets(grad_bytes, bucket_bytes(s, s.dp))))
    if not per_bucket:
        return {}
    return {"ddp_bucket_extra_s": max(float(np.median(per_bucket)), 0.0),
            "ddp_bucket_extra_source": f"median over {len(per_bucket)} measured DDP steps of tiny models: "
                                       "(measured - predicted) / DDP buckets"}
