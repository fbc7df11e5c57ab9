"""How a Megatron-code optimizer keeps its states (Strategy.optimizer_states) and fp8 parameters
(Strategy.fp8_params), worked by hand (docs/memory.md, "Model states")."""

from __future__ import annotations

import pytest

import perfmodel as pm
from perfmodel.core.errors import InvalidInputError, UnknownNameError, UnsupportedError
from perfmodel.costs import memory as mem

# 4 layers of hidden 1024, gelu MLP of 4096, 16 heads: 12 h^2 = 12,582,912 GEMM weights a layer
MODEL = pm.transformer(layers=4, hidden=1024, heads=16, seq=1024, vocab=32768)
GEMM_LAYER = 12 * 1024 * 1024


def _predict(**kw):
    # two micro-batches: the gradient buffer is alive at every moment of the step, so at the peak
    base = dict(dp=8, micro_batch=1, global_batch=16, framework="megatron", zero=1)
    return pm.predict(MODEL, pm.cluster("dgx-h100"), pm.Strategy(**{**base, **kw}))


@pytest.mark.parametrize("states, optimizer, fp8_params, expected", [
    (None, "adamw", False, 12.0),          # fp32 main params + 2 fp32 moments (Megatron-Core)
    ("fp32", "adamw", True, 12.0),         # Apex with store_params: the same bytes
    ("remainders", "adamw", False, 10.0),  # int16 remainders + 2 fp32 moments (Apex, NeMo 1.x bf16)
    ("bf16", "adamw", False, 4.0),         # 2 bf16 moments, no main copy
    ("bf16", "adamw", True, 6.0),          # + a bf16 main copy under fp8 parameters (store_params)
    ("fp32", "sgd", False, 8.0),           # fp32 main + one fp32 momentum
    ("remainders", "sgd", False, 6.0),
    ("bf16", "sgd", False, 2.0),
])
def test_bytes_per_parameter(states, optimizer, fp8_params, expected):
    assert mem.optimizer_state_bytes(optimizer, states, fp8_params) == expected
    per = mem.model_state_bytes("fp8-mixed" if fp8_params else "bf16-mixed", optimizer, "megatron",
                                optimizer_states=states, fp8_params=fp8_params)
    assert per["optimizer"] == expected and per["weights"] == 2.0


def test_the_optimizer_term_scales_by_the_layout_and_the_gradients_by_their_dtype():
    default = _predict()
    remainders = _predict(optimizer_states="remainders", grad_reduce_fp32=False)
    bf16 = _predict(optimizer_states="bf16")
    assert remainders.memory["optimizer"] == pytest.approx(default.memory["optimizer"] * 10 / 12, rel=1e-12)
    assert bf16.memory["optimizer"] == pytest.approx(default.memory["optimizer"] * 4 / 12, rel=1e-12)
    assert remainders.memory["gradients"] == pytest.approx(default.memory["gradients"] / 2, rel=1e-12)
    assert remainders.memory["weights"] == default.memory["weights"]
    assert remainders.peak_memory < default.peak_memory
    assert remainders.step_time == pytest.approx(_predict(grad_reduce_fp32=False).step_time, rel=1e-12)


def test_fp8_parameters_drop_the_bf16_copy_of_each_layer_gemm_weight():
    te_cache = _predict(precision="fp8-mixed")
    fp8_params = _predict(precision="fp8-mixed", fp8_params=True)
    # 4 layers x 12,582,912 GEMM weights x 2 bytes of bf16: 100,663,296 bytes fewer; TE's fp8 bytes stay
    assert te_cache.memory["weights"] - fp8_params.memory["weights"] == pytest.approx(2 * 4 * GEMM_LAYER, rel=1e-12)
    assert fp8_params.memory["fp8_weights"] == te_cache.memory["fp8_weights"] == pytest.approx(2 * 4 * GEMM_LAYER)
    # the compute is the same; only the distributed optimizer's gather is shorter (one byte per GEMM weight)
    same = {k: v for k, v in te_cache.breakdown.items() if k != "dp_comm"}
    assert {k: fp8_params.breakdown[k] for k in same} == pytest.approx(same, rel=1e-12)
    assert fp8_params.breakdown["dp_comm"] < te_cache.breakdown["dp_comm"]


def test_options_that_do_not_apply_are_refused_by_name():
    with pytest.raises(UnsupportedError, match="'optimizer_states'='remainders' .* framework='pytorch'; "
                                               "stacks that take it: megatron"):
        pm.Strategy(optimizer_states="remainders")
    with pytest.raises(UnsupportedError, match="'fp8_params'=True .* framework='fsdp1'; stacks that take it"):
        pm.Strategy(framework="fsdp1", precision="fp8-mixed", fp8_params=True)
    with pytest.raises(InvalidInputError, match="needs precision='fp8-mixed' \\(got 'bf16-mixed'\\)"):
        pm.Strategy(framework="megatron", fp8_params=True)
    with pytest.raises(InvalidInputError, match="'remainders' cannot hold fp8 parameters"):
        pm.Strategy(framework="megatron", precision="fp8-mixed", fp8_params=True, optimizer_states="remainders", zero=1)
    # Megatron-LM gathers fp8 parameters in its distributed optimizer only (arguments.py asserts it)
    with pytest.raises(InvalidInputError, match="distributed optimizer.*needs zero=1 or 2 \\(got zero=0\\)"):
        pm.Strategy(framework="megatron", precision="fp8-mixed", fp8_params=True)
    with pytest.raises(UnknownNameError, match="known: bf16, fp32, remainders"):
        pm.Strategy(framework="megatron", optimizer_states="fp16")


def test_nemo_recipes_fit_only_as_their_yaml_sets_the_optimizer():
    """NVIDIA's DGX Cloud NeMo runs (perfmodel/data/published_runs.md) ran on 80 GB H100s: as their yamls set
    the optimizer (Apex distributed_fused_adam, bf16 gradient buffer, fp8 parameters) they fit; priced with
    Megatron-Core's defaults they would not."""
    from dataclasses import replace

    from perfmodel.validate.published import read_published_checks

    wanted = ("dgxc-llama8-8-fp8", "dgxc-nemo340-128-bf16", "dgxc-llama405-576-bf16")
    cases = [c for c in read_published_checks() if c.label in wanted]
    assert len(cases) == len(wanted)
    for c in cases:
        assert pm.predict(c.model, c.cluster, c.strategy).fits, c.label
        defaults = replace(c.strategy, optimizer_states=None, fp8_params=False, grad_reduce_fp32=None)
        assert not pm.predict(c.model, c.cluster, defaults).fits, c.label
