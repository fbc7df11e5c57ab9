"""What one search computes once and shares gives the numbers computing it each time gives.

A search prices each (framework, cp) space under every recompute policy; the kernels of a
(tp, micro-batch) row recur across those calls, so their prices are kept by the bytes of their
size arrays (``perfmodel/costs/compute.py``), and a grid's valid cells are gathered by indices
kept per value shape (``space.Factored.flat``). Neither may change a number.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import perfmodel as pm
from perfmodel.core.memo import clear_memos
from perfmodel.costs import compute
from perfmodel.explore import search
from perfmodel.explore.space import Factored
from perfmodel.predict import default_profile
from perfmodel.workload.ops import Kernel

MODEL = pm.transformer(layers=8, hidden=1024, heads=16, seq=1024, vocab=32000, name="small")
CLUSTER = pm.cluster("dgx-h100", nodes=2)


def _table(**kw) -> pd.DataFrame:
    clear_memos()
    return search(MODEL, CLUSTER, 64, top_k=30, cp=(1, 2), **kw).reset_index(drop=True)


def test_kept_kernel_prices_leave_the_table_unchanged(monkeypatch):
    kept = _table()
    monkeypatch.setattr(compute, "ARRAY_KERNEL_MAX", 0)  # every array kernel priced afresh
    fresh = _table()
    assert kept.attrs["evaluated"] > 5_000
    pd.testing.assert_frame_equal(kept, fresh, check_exact=True)
    assert kept.attrs["rejected"] == fresh.attrs["rejected"]


def test_array_kernel_prices_are_kept_by_value_and_read_only():
    clear_memos()
    prof = default_profile(pm.cluster("h100"))
    m = np.array([1024.0, 2048.0, 4095.0])
    k = Kernel("fc1", "gemm", "fwd", {"m": m, "n": 4096.0, "k": 1024.0})
    gpu, cpu = compute.kernel_time(prof, k)
    again, _ = compute.kernel_time(prof, Kernel("fc1", "gemm", "fwd", {"m": m.copy(), "n": 4096.0, "k": 1024.0}))
    assert again is gpu and not gpu.flags.writeable  # the same sizes by value: the kept result
    np.testing.assert_array_equal(gpu, compute._kernel_time(prof, k)[0])
    other = compute.kernel_time(prof, Kernel("fc1", "gemm", "fwd", {"m": m[::-1].copy(), "n": 4096.0, "k": 1024.0}))[0]
    np.testing.assert_array_equal(other, gpu[::-1])
    # the key holds the dtype and shape, not only the bytes
    assert compute._array_kernel_key(k) != compute._array_kernel_key(
        Kernel("fc1", "gemm", "fwd", {"m": m.view(np.int64), "n": 4096.0, "k": 1024.0}))
    assert compute._array_kernel_key(Kernel("c", "conv", "fwd", {"m": m})) is None  # priced by name too
    assert compute._array_kernel_key(Kernel("x", "gemm", "fwd", {"m": np.zeros(compute.ARRAY_KERNEL_MAX + 1)})) is None


@pytest.mark.parametrize("seed", range(4))
def test_flat_gathers_what_the_broadcast_mask_selects(seed):
    rng = np.random.default_rng(seed)
    shape = (5, 3, 2, 1, 3, 2)
    grid = Factored(columns={}, mask=rng.random(shape) < 0.4)
    values = [2.5, np.float64(3.0), np.array(7), np.arange(5.0).reshape(5, 1, 1, 1, 1, 1),
              np.array([None, "full", "hybrid"], dtype=object).reshape(1, 3, 1, 1, 1, 1),
              rng.random((5, 1, 2, 1, 3, 1)), rng.random(shape), rng.random((3, 2)).reshape(3, 2),
              rng.random((1, 2)) > 0.5]
    for v in values:
        want = np.broadcast_to(v, shape)[grid.mask]
        got = grid.flat(v)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert (got == want).all()
    with pytest.raises(ValueError):
        grid.flat(np.zeros(4))  # not broadcastable: numpy's own error, as before
