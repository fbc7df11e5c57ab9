"""torchao's float8 recipes and its FSDP2 float8 all-gather: the casts each GEMM adds, by hand, and what they change."""

import dataclasses

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.core.errors import InvalidInputError, UnknownNameError, UnsupportedError
from perfmodel.parallel.config import StepConfig
from perfmodel.workload.ops import linear
from perfmodel.workload.stacks.float8 import AMAX_CAST, LAYOUT, fp8_gathered, torchao_float8

M, K, N = 1024, 4096, 6144  # tokens, in, out of one linear


def cast_bytes(kernels):
    """The casts' elements priced as fp32 copies (size x), by kernel name."""
    return {k.name: float(k.size["x"]) for k in kernels if k.cls == "copy"}


@pytest.fixture(scope="module")
def gemms():
    fwd, bwd = linear("mlp.fc1", M, K, N, dtype="fp8")
    dgrad = next(k for k in bwd if ".dgrad" in k.name)
    wgrad = next(k for k in bwd if k.name.endswith(".wgrad"))
    return fwd[0], dgrad, wgrad


def test_each_recipe_casts_what_torchao_casts(gemms):
    fwd, dgrad, wgrad = gemms
    x, w, dy = M * K, N * K, M * N
    # tensorwise: the backward reuses the forward's scales, so dgrad and wgrad lay fp8 tensors out only
    assert cast_bytes(torchao_float8(fwd)) == {"mlp.fc1.fp8_cast": x * AMAX_CAST, "mlp.fc1.fp8_w_cast": w * AMAX_CAST}
    assert cast_bytes(torchao_float8(dgrad)) == {"mlp.fc1.dgrad.fp8_grad_cast": dy * AMAX_CAST,
                                                 "mlp.fc1.dgrad.fp8_w_layout": w * LAYOUT}
    assert cast_bytes(torchao_float8(wgrad)) == {"mlp.fc1.wgrad.fp8_layout": (dy + x) * LAYOUT}
    # rowwise: each operand scaled along its GEMM's own axis, so cast anew from 16 bits
    assert cast_bytes(torchao_float8(fwd, "rowwise")) == cast_bytes(torchao_float8(fwd))
    assert cast_bytes(torchao_float8(dgrad, "rowwise")) == {"mlp.fc1.dgrad.fp8_rowwise_cast": (dy + w) * AMAX_CAST}
    assert cast_bytes(torchao_float8(wgrad, "rowwise")) == {"mlp.fc1.wgrad.fp8_rowwise_cast": (dy + x) * AMAX_CAST}
    # rowwise_with_gw_hp: wgrad in bf16 on the saved 16-bit tensors, no cast
    hp = torchao_float8(wgrad, "rowwise_with_gw_hp")
    assert [(k.cls, k.dtype) for k in hp] == [("gemm", "bf16")]
    assert cast_bytes(torchao_float8(dgrad, "rowwise_with_gw_hp")) == cast_bytes(torchao_float8(dgrad, "rowwise"))
    # the float8 all-gather brings the weight in fp8: the forward casts the input only
    assert cast_bytes(torchao_float8(fwd, fp8_gather=True)) == {"mlp.fc1.fp8_cast": x * AMAX_CAST}
    assert cast_bytes(torchao_float8(dgrad, fp8_gather=True)) == cast_bytes(torchao_float8(dgrad))


@pytest.fixture(scope="module")
def runs():
    m, c = dataclasses.replace(pm.preset("llama-3-8b"), seq=8192), pm.cluster("grand-teton-h100")
    base = dict(dp=8, micro_batch=1, framework="torchtitan", recompute="selective-op", compile=True, loss="eager")
    cases = {"bf16": {}, "tensorwise": dict(precision="fp8-mixed"),
             "gather": dict(precision="fp8-mixed", fp8_params=True),
             "rowwise": dict(precision="fp8-mixed", float8_recipe="rowwise"),
             "gw_hp": dict(precision="fp8-mixed", float8_recipe="rowwise_with_gw_hp")}
    return {name: pm.predict(m, c, pm.Strategy(**base, **kw)) for name, kw in cases.items()}


def test_recipes_order_as_their_casts_and_gemms_say(runs):
    t = {name: p.step_time for name, p in runs.items()}
    # more casts and rowwise's measured extra (fp8_linear:rowwise), each slower; all faster than bf16 at these
    # shapes. gw_hp trades rowwise's fp8 wgrad, its casts and a third of the extra for a bf16 wgrad: no order
    assert t["gather"] < t["tensorwise"] < t["rowwise"] < t["bf16"] and t["gw_hp"] < t["bf16"]
    # the recipe changes kernels, not what is saved (torchao saves the 16-bit input and weight either way)
    assert runs["rowwise"].peak_memory == pytest.approx(runs["tensorwise"].peak_memory)


def test_float8_all_gather_moves_one_byte_per_linear_weight(runs):
    assert runs["gather"].breakdown["dp_comm"] < runs["tensorwise"].breakdown["dp_comm"]
    # the two blocks in flight hold their linears' weights at 1 byte: 2 x 218,103,808 bytes fewer (Llama 3 8B)
    gemm_block = 4096 * (4096 + 2 * 1024) + 4096 * 4096 + 3 * 4096 * 14336
    held = runs["tensorwise"].memory["comm_buffers"] - runs["gather"].memory["comm_buffers"]
    assert held == pytest.approx(2 * gemm_block, rel=1e-9)
    assert fp8_gathered(True, "torchtitan", 123.0) == 123.0
    assert fp8_gathered(False, "torchtitan", 123.0) == 0.0
    assert fp8_gathered(True, "megatron", np.float64(5.0)) == 0.0  # Megatron's fp8 parameters: not an FSDP2 gather


def test_defaults_and_refusals_name_the_field():
    def recipe(**kw):  # the recipe a step runs (None in the Strategy: the stack's default)
        return StepConfig.from_strategy(pm.Strategy(**kw)).float8_recipe
    assert recipe(framework="torchtitan", precision="fp8-mixed") == "tensorwise"
    assert recipe(framework="megatron", precision="fp8-mixed") == "delayed"
    assert recipe(framework="torchtitan") == ""
    s = pm.Strategy(framework="torchtitan", precision="fp8-mixed")
    assert s.float8_recipe is None and s.is_default("float8_recipe") and "float8_recipe" not in repr(s)
    assert "float8_recipe='rowwise'" in repr(s.replace(float8_recipe="rowwise"))
    assert s.replace(precision="bf16-mixed").precision == "bf16-mixed"  # the default follows the precision
    with pytest.raises(InvalidInputError, match="'float8_recipe'='rowwise' scales fp8 GEMMs: it needs precision"):
        pm.Strategy(framework="torchtitan", float8_recipe="rowwise")
    with pytest.raises(UnsupportedError, match="float8_recipe='rowwise' is a recipe of torchao's float8 linears: "
                                               "framework='megatron' runs te's, which take delayed, tensorwise"):
        pm.Strategy(framework="megatron", precision="fp8-mixed", float8_recipe="rowwise")
    with pytest.raises(UnknownNameError, match="unknown float8_recipe 'colwise'"):
        pm.Strategy(framework="torchtitan", precision="fp8-mixed", float8_recipe="colwise")
    with pytest.raises(InvalidInputError, match="takes tensorwise scaling only"):
        pm.Strategy(framework="torchtitan", precision="fp8-mixed", float8_recipe="rowwise", fp8_params=True)
    with pytest.raises(UnsupportedError, match="stacks that take it: megatron, torchtitan"):
        pm.Strategy(framework="fsdp1", precision="fp8-mixed", fp8_params=True)


def test_transformer_engine_current_scaling_reads_each_tensor_once_more(gemms):
    """TE's current scaling (Megatron-Core --fp8-recipe tensorwise) computes each tensor's amax before its cast:
    6 bytes per element where delayed scaling moves 4 (as fp32 copies: 0.75 against 0.5)."""
    from perfmodel.workload.stack import transformer_engine_fp8

    fwd, dgrad, _ = gemms
    delayed, current = (cast_bytes(transformer_engine_fp8(fwd, recipe=r)) for r in ("delayed", "tensorwise"))
    assert delayed == {"mlp.fc1.fp8_cast": 0.5 * M * K} and current == {"mlp.fc1.fp8_cast": 0.75 * M * K}
    assert cast_bytes(transformer_engine_fp8(dgrad, recipe="tensorwise")) == {"mlp.fc1.dgrad.fp8_grad_cast": 0.75 * M * N}
    m, c = pm.preset("llama-3-8b"), pm.cluster("dgx-h100")
    s = pm.Strategy(dp=8, micro_batch=1, framework="megatron", precision="fp8-mixed")
    assert pm.predict(m, c, s.replace(float8_recipe="tensorwise")).step_time > pm.predict(m, c, s).step_time
