"""Symbolic step times and symbolic forms agree with the numeric predictor."""

import numpy as np
import pytest
import sympy as sp

import perfmodel as pm
from perfmodel.forms.registry import FORMS, get_form
from perfmodel.analysis.symbolic import symbol, symbolic_step_time

MODEL = pm.transformer(layers=4, hidden=512, heads=8, seq=512, vocab=32000)


@pytest.mark.parametrize("batch", [1, 3, 8, 32])
def test_micro_batch_symbol_matches_predict(batch):
    expr = symbolic_step_time(MODEL, pm.cluster("h200"), pm.Strategy(micro_batch=4), free=("micro_batch",))
    value = float(expr.subs(symbol("micro_batch"), batch))
    assert value == pytest.approx(pm.predict(MODEL, "h200", pm.Strategy(micro_batch=batch)).step_time, rel=1e-9)


@pytest.mark.parametrize("batch", [2, 8])
def test_unfused_attention_symbol_matches_predict(batch):
    s = pm.Strategy(micro_batch=4, attention="unfused")
    expr = symbolic_step_time(MODEL, pm.cluster("h200"), s, free=("micro_batch",))
    value = float(expr.subs(symbol("micro_batch"), batch))
    expected = pm.predict(MODEL, "h200", pm.Strategy(micro_batch=batch, attention="unfused")).step_time
    assert value == pytest.approx(expected, rel=1e-9)
    assert expected > pm.predict(MODEL, "h200", pm.Strategy(micro_batch=batch)).step_time


def test_gradient_accumulation_symbol_and_derivative():
    s = pm.Strategy(micro_batch=4, global_batch=16)
    expr = symbolic_step_time(MODEL, pm.cluster("h200"), s, free=("micro_batches",))
    m = symbol("micro_batches")
    assert float(expr.subs(m, 4)) == pytest.approx(pm.predict(MODEL, "h200", s).step_time, rel=1e-9)
    slope = float(sp.diff(expr, m).subs(m, 4))  # each extra micro-batch costs one fwd+bwd + one grad add
    one = pm.predict(MODEL, "h200", pm.Strategy(micro_batch=4))
    assert slope == pytest.approx(one.step_time - one.breakdown["optimizer"], rel=0.05)


@pytest.mark.parametrize("node, nodes, dp, overlap", [("dgx-h100", 1, 8, True), ("dgx-h100", 1, 8, False),
                                                      ("dgx-h100", 2, 16, True), ("dgx-a100-80gb", 4, 32, True)])
def test_data_parallel_symbol_matches_predict(node, nodes, dp, overlap):
    """DDP in the expression is the predictor's: a 1 MiB first bucket, the reducer's copies, the ring."""
    c = pm.cluster(node, nodes=nodes)
    s = pm.Strategy(dp=dp, micro_batch=4, dp_overlap=overlap)
    expr = symbolic_step_time(pm.preset("gpt2-small"), c, s, free=("dp", "micro_batch"))
    value = float(expr.subs({symbol("dp"): dp, symbol("micro_batch"): 4}))
    assert value == pytest.approx(pm.predict("gpt2-small", c, s).step_time, rel=1e-9)


def test_unsupported_scope_is_refused_clearly():
    with pytest.raises(pm.UnsupportedError, match="traced graph"):
        symbolic_step_time("resnet50", "h200", pm.Strategy())
    with pytest.raises(pm.InvalidInputError, match="'free' must be a tuple"):
        symbolic_step_time(MODEL, "h200", pm.Strategy(), free=None)
    with pytest.raises(pm.UnsupportedError, match="free symbols supported"):
        symbolic_step_time(MODEL, pm.cluster("h200"), pm.Strategy(), free=("tp",))
    c = pm.cluster("dgx-a100-80gb")
    with pytest.raises(pm.UnsupportedError, match="pp=1"):
        symbolic_step_time(MODEL, c, pm.Strategy(dp=4, pp=2, global_batch=64))
    with pytest.raises(pm.UnsupportedError, match="context or expert parallelism"):
        symbolic_step_time(MODEL, pm.cluster("dgx-h100"), pm.Strategy(dp=4, cp=2, micro_batch=1))



@pytest.mark.parametrize("precision, framework", [("fp16-mixed", "pytorch"), ("tf32", "pytorch"),
                                                  ("bf16-mixed", "megatron"), ("fp8-mixed", "megatron")])
def test_every_precision_and_framework_matches_predict(precision, framework):
    """The expression is the predictor's own pricing on sympy inputs: loss scaling, fp32 attention,
    Megatron's 16-bit weights and padded vocabulary need no second implementation."""
    s = pm.Strategy(micro_batch=4, precision=precision, framework=framework)
    expr = symbolic_step_time(MODEL, pm.cluster("h100"), s, free=("micro_batch",))
    value = float(expr.subs(symbol("micro_batch"), 4))
    assert value == pytest.approx(pm.predict(MODEL, "h100", s).step_time, rel=1e-9)


def test_every_profile_class_exports_a_formula_that_matches_numpy():
    profile = pm.load_profile("h200-sxm-141gb")
    rng = np.random.default_rng(0)
    for key, entry in profile.compute.items():
        form = get_form(entry["form"])
        for _ in range(3):
            values = {v: float(rng.integers(64, 8192)) for v in form.variables}
            if "causal" in values:
                values["causal"] = float(rng.integers(0, 2))
            if "head_dim" in values:
                values["head_dim"] = float(rng.choice([64, 80, 125, 128]))
            numeric = float(form.evaluate(entry["params"], **values))
            symbolic = float(form.expression(entry["params"], **{k: sp.Integer(int(v)) for k, v in values.items()}))
            assert symbolic == pytest.approx(numeric, rel=1e-9), key


def test_profile_formula_names_gemm_and_collectives():
    profile = pm.load_profile("h200-sxm-141gb")
    gemm = profile.formula("gemm", dtype="bf16")
    assert {s.name for s in gemm.free_symbols} == {"m", "n", "k"}
    ar = profile.formula("all_reduce", level="intra")
    assert {s.name for s in ar.free_symbols} == {"S", "n"}
    assert len(FORMS) >= 8
