"""torchao float8 linears beyond their GEMMs and casts: the fit to pytorch/ao's published block speedups and
what it does to a training step (perfmodel/fit/published_float8.py, workload/stacks/float8.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.fit.published_float8 import block_seconds, fit_float8_linear
from perfmodel.profiles.published import float8_linear_table
from perfmodel.validate.published import read_published_stacks

H100 = "h100-sxm5-80gb"


def _speedup(profile, m, k, n, recipe):
    return block_seconds(profile, m, k, n, None) / block_seconds(profile, m, k, n, recipe)


def test_bundled_entries_are_the_fit_and_follow_the_published_cells():
    p = pm.load_profile(H100)
    for recipe in ("rowwise", "tensorwise"):
        assert p.compute[f"fp8_linear:{recipe}"]["params"] == pytest.approx(
            fit_float8_linear(p, H100, recipe)["params"], rel=1e-6)
    rowwise = p.compute["fp8_linear:rowwise"]
    assert rowwise["n_points"] == 216 and rowwise["cv_mape"] < 0.10
    assert rowwise["params"]["t0"] > 1e-4 and rowwise["params"]["a"] > 0  # a fixed time and one per input element
    t = float8_linear_table()
    llama = t[(t.recipe == "rowwise") & t.m.isin([8192, 16384]) & t.k.isin([4096, 16384]) & t.n.isin([4096, 16384])]
    errors = [_speedup(p, r.m, r.k, r.n, "rowwise") / r.speedup - 1 for r in llama.itertuples()]
    assert np.median(np.abs(errors)) < 0.08
    # tensorwise: the fixed time alone, from the two published examples (0.80 at 1024x2048x1024, 1.39 at
    # 4096x8192x16384); the large one was already within 2% without it
    assert p.compute["fp8_linear:tensorwise"]["params"]["a"] == 0.0
    assert _speedup(p, 1024, 2048, 1024, "tensorwise") == pytest.approx(0.80, rel=0.05)
    assert _speedup(p, 4096, 8192, 16384, "tensorwise") == pytest.approx(1.39, rel=0.05)


def test_the_extra_joins_each_float8_gemm_of_a_step_and_moves_the_rowwise_check_row():
    """torchao's README rows (not fitted): rowwise Llama 3 8B ran 1.10x its bf16 step; without the extra the
    model gave 1.24x, with it within 5%."""
    rows = {c.label: c for c in read_published_stacks() if c.label.startswith("torchao-8b")}
    bf16, row = rows["torchao-8b-bf16"], rows["torchao-8b-fp8-rowwise"]
    measured = bf16.measured / row.measured
    step = pm.predict(row.model, row.cluster, row.strategy).step_time
    base = pm.predict(bf16.model, bf16.cluster, bf16.strategy).step_time
    assert base / step == pytest.approx(measured, rel=0.05)
    p = pm.load_profile(row.cluster.gpu.name)
    bare = dataclasses.replace(p, compute={k: v for k, v in p.compute.items() if not k.startswith("fp8_linear:")})
    without = pm.predict(row.model, row.cluster, row.strategy, profile=bare).step_time
    assert base / without > measured * 1.1 and step > without


def test_a_gpu_without_published_rows_prices_no_extra():
    m = pm.transformer(layers=2, hidden=2048, heads=16, seq=2048, vocab=32000)
    s = pm.Strategy(dp=1, micro_batch=1, framework="torchtitan", precision="fp8-mixed", compile=True)
    l4 = pm.load_profile("l4")
    assert not any(k.startswith("fp8_linear:") for k in l4.compute)
    assert pm.predict(m, pm.cluster("l4"), s).step_time > 0


def test_rowwise_with_gw_hp_takes_rowwise_extra_on_its_rowwise_gemms():
    from perfmodel.workload.ops import linear
    from perfmodel.workload.stacks.float8 import torchao_float8
    fwd, bwd = linear("mlp.fc1", 8192, 4096, 14336, dtype="fp8")
    out = {k.name: k for g in fwd + bwd for k in torchao_float8(g, "rowwise_with_gw_hp")}
    assert out["mlp.fc1.fp8_extra"].variant == out["mlp.fc1.dgrad.fp8_extra"].variant == "rowwise"
    assert out["mlp.fc1.wgrad"].dtype == "bf16" and "mlp.fc1.wgrad.fp8_extra" not in out
    assert out["mlp.fc1.fp8_extra"].size["mk"] == 8192 * 4096 / 2 and out["mlp.fc1.dgrad.fp8_extra"].size["mk"] == 0
