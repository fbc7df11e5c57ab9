"""float8 training with torchao as torchtitan runs it: which GEMMs run in fp8, what the casts move.

torchtitan v0.2.2 ``torchtitan/components/quantization/float8.py`` converts every ``nn.Linear``
with torchao ``Float8LinearConfig`` but those in ``filter_fqns``, which the Llama 3 recipes set to
the output layer (``models/llama3/train_configs/llama3_8b.toml``: ``filter_fqns = ["output"]``);
the default recipe is tensorwise dynamic scaling (``recipe_name=None``), and ``recipe_name`` picks
torchao's others (``Strategy.float8_recipe``, ``RECIPES``). torchao (pytorch/ao 36027d8
``torchao/float8/float8_linear.py`` ``matmul_with_hp_or_float8_args``, ``config.py``
``Float8LinearConfig.from_recipe_name``) saves the 16-bit input and weight and casts each GEMM's
operands from them:

* ``tensorwise``: forward casts the input and the weight (an amax reduction over the 16-bit tensor,
  then the scaled cast: 2 + 2 bytes read, 1 written per element); dgrad casts the output gradient the
  same way and lays the fp8 weight out for cuBLAS (1 byte read, 1 written); wgrad lays out the fp8
  output gradient and input likewise (one scale per tensor: the compiled graph reuses the casts);
* ``rowwise``: every operand scaled along the GEMM's own reduction axis (``AXISWISE``), so each of the
  six operands of the three GEMMs is cast from its 16-bit tensor (amax + cast each): the forward's
  two, dgrad's output gradient and weight, wgrad's output gradient and input;
* ``rowwise_with_gw_hp``: forward as ``rowwise``; dgrad casts the output gradient rowwise and the
  weight tensorwise; wgrad runs in bf16 on the saved 16-bit tensors (no casts).

``fp8_gather`` (``Strategy.fp8_params`` under torchtitan: torchtitan's ``enable_fsdp_float8_all_gather``
with ``precompute_float8_dynamic_scale_for_fsdp``, tensorwise only, torchao ``config.py`` asserts it):
FSDP2 all-gathers the linears' weights already in fp8 (``fsdp_utils.py``
``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather`` casts the local shard with the scale precomputed
once per step), so the forward casts no weight; dgrad still lays the fp8 weight out. The shard's cast runs
on FSDP2's all-gather copy-in stream and the scale's amax over the shards once per step (about 4 bytes per
sharded parameter): neither is priced. The unsharded buffers hold those weights at 1 byte (``fsdp_buffers``).

All three GEMMs of a linear run in fp8 (but wgrad under ``rowwise_with_gw_hp``); the LM head stays
bf16. Rowwise GEMMs are torch's CUTLASS rowwise ``_scaled_mm`` kernel, priced at the profile's fp8
GEMM rate as the tensorwise cuBLAS one (pytorch/pytorch#147971: within 90-100% of tensorwise for most
shapes with fast accumulation; its long tail and the backward's slow accumulation are not priced).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from perfmodel.core.checks import check_choice
from perfmodel.core.errors import InvalidInputError, UnsupportedError
from perfmodel.workload.stacks import stack, takes_main_grad
from perfmodel.workload.ops import Kernel, mem

AMAX_CAST = 5.0 / 8.0   # bytes of amax + cast per element, as fp32 copies (8 bytes each)
LAYOUT = 2.0 / 8.0      # bytes of an fp8 transpose per element, as fp32 copies
# the scaling recipes each kind of float8 linears has, its default first: torchao's recipe names
# (Float8LinearRecipeName); Transformer Engine's delayed scaling (the DelayedScaling recipe Megatron-Core
# and Composer's amp_fp8 build by default: amax from history, one fused cast + transpose per operand) and
# current scaling (Float8CurrentScaling: Megatron-Core --fp8-recipe tensorwise, megatron/core/fp8_utils.py)
RECIPES = {"torchao": ("tensorwise", "rowwise", "rowwise_with_gw_hp"), "te": ("delayed", "tensorwise")}


def float8_recipe(kind: str, recipe, framework: str, precision: str, fp8_gather: bool = False) -> str:
    """The scaling recipe a step runs: ``recipe`` checked against the float8 linears of its stack (``kind``, the
    stack's ``float8``), or their default; "" when the step does not run fp8. ``fp8_gather``: torchao's float8
    all-gather (``Strategy.fp8_params``), which takes tensorwise scaling only."""
    if precision != "fp8-mixed":
        if recipe is not None:
            raise InvalidInputError(f"'float8_recipe'={recipe!r} scales fp8 GEMMs: it needs precision='fp8-mixed' "
                                    f"(got {precision!r})")
        return ""
    if recipe is None:
        return RECIPES[kind][0]
    if recipe not in RECIPES[kind]:
        others = [k for k, names in RECIPES.items() if recipe in names]
        if others:
            raise UnsupportedError(f"float8_recipe={recipe!r} is a recipe of {others[0]}'s float8 linears: "
                                   f"framework={framework!r} runs {kind}'s, which take {', '.join(RECIPES[kind])}")
        check_choice("float8_recipe", recipe, RECIPES[kind])
    if fp8_gather and kind == "torchao" and recipe != "tensorwise":
        raise InvalidInputError(f"'fp8_params'=True (torchao's float8 all-gather) takes tensorwise scaling only "
                                f"(torchao float8/config.py asserts it): got float8_recipe={recipe!r}")
    return recipe


def check_fp8_params(framework: str, precision: str, zero: int, optimizer_states) -> None:
    """``Strategy.fp8_params``: Transformer Engine fp8 parameters under Megatron-Core's distributed optimizer, or
    torchao's FSDP2 float8 all-gather; an error naming the field where the stack or the other fields do not take it."""
    takes = ", ".join(takes_main_grad())
    if framework not in (*takes_main_grad(), "torchtitan"):  # torchao: its float8 all-gather (above)
        raise UnsupportedError(f"'fp8_params'=True keeps or gathers the GEMM weights in fp8 (Transformer Engine fp8 "
                               f"parameters; torchao's FSDP2 float8 all-gather): it does not apply to framework="
                               f"{framework!r}; stacks that take it: {takes}, torchtitan")
    if precision != "fp8-mixed":
        raise InvalidInputError(f"'fp8_params'=True keeps the GEMM weights in fp8: it needs precision='fp8-mixed' "
                                f"(got {precision!r})")
    if optimizer_states == "remainders":
        raise InvalidInputError("'optimizer_states'='remainders' cannot hold fp8 parameters: their fp32 main "
                                "copy is not the bf16 value plus a remainder, so NeMo stores it whole "
                                "(store_params=True); use optimizer_states='fp32' (or 'bf16')")
    if framework in takes_main_grad() and zero < 1:  # Megatron-LM core_r0.9.0 megatron/training/arguments.py
        raise InvalidInputError(f"'fp8_params'=True under framework={framework!r} gathers fp8 parameters in the "
                                f"distributed optimizer ('--fp8-param-gather only supported with distributed "
                                f"optimizer', Megatron-LM arguments.py): it needs zero=1 or 2 (got zero={zero})")


def torchao_float8(k: Kernel, recipe: str = "tensorwise", fp8_gather: bool = False) -> list[Kernel]:
    """A GEMM of a torchao ``Float8Linear`` under ``recipe`` and the casts it adds (``fp8_gather``: its weight
    all-gathered in fp8 by FSDP2)."""
    if k.name.startswith("lm_head"):
        return [replace(k, dtype="bf16")]
    m, n, kk = k.size["m"], k.size["n"], k.size["k"]
    a, b = np.multiply(m, kk), np.multiply(n, kk)  # the two operands' elements

    def cast(tag, elems, factor):
        return mem(f"{k.name}.{tag}", "copy", k.phase, np.multiply(elems, factor), count=k.count, variant="fwd")

    wgrad, dgrad = k.name.endswith(".wgrad"), ".dgrad" in k.name
    if recipe == "rowwise_with_gw_hp" and wgrad:
        return [replace(k, dtype="bf16")]
    # the linear's input x[T, in]: m·k of the forward GEMM, n·k of the weight gradient's (TN: m=out, n=in, k=T)
    # rowwise_with_gw_hp scales its forward and dgrad operands as rowwise does: they take rowwise's measured extra
    extra = linear_extra(k, "rowwise" if recipe == "rowwise_with_gw_hp" else recipe,
                         0.0 if dgrad else np.multiply(n if wgrad else m, kk))
    if recipe != "tensorwise" and (wgrad or dgrad):  # each operand scaled along its own axis: cast anew
        return [cast("fp8_rowwise_cast", np.add(a, b), AMAX_CAST), k, extra]
    if wgrad:
        return [cast("fp8_layout", np.add(a, b), LAYOUT), k, extra]
    if dgrad:
        return [cast("fp8_grad_cast", a, AMAX_CAST), cast("fp8_w_layout", b, LAYOUT), k, extra]
    if fp8_gather:
        return [cast("fp8_cast", a, AMAX_CAST), k, extra]
    return [cast("fp8_cast", a, AMAX_CAST), cast("fp8_w_cast", b, AMAX_CAST), k, extra]


def linear_extra(k: Kernel, recipe: str, input_elems) -> Kernel:
    """What one GEMM of a float8 linear takes beyond its GEMM and its casts' bytes, as measured against bfloat16
    (the profile's ``fp8_linear:<recipe>``, fitted by perfmodel/fit/published_float8.py; none: nothing): a third
    of the linear's fixed time and half its time per input element (the forward and the weight gradient cast
    the input, each along its own axis under rowwise scaling). Its own launch: compile does not fuse it."""
    return Kernel(f"{k.name}.fp8_extra", "fp8_linear", k.phase, {"mk": np.multiply(input_elems, 0.5),
                                                                  "share": 1.0 / 3.0}, k.count, 0.0, recipe, "fp8")


def fp8_gathered(fp8_params, framework: str, gemm_params):
    """A block's parameters FSDP2 all-gathers in fp8: its linears' weights under torchao's float8 all-gather
    (``Strategy.fp8_params`` with an FSDP2 stack, precision fp8-mixed: checked there), else none."""
    return gemm_params if fp8_params and stack(framework).sharding == "fsdp2" else 0.0


def gather_bytes_per_param(param_bytes, params, gemm_params, fp8_params: bool, framework: str):
    """Bytes per parameter a distributed optimizer's all-gather moves: under a Megatron-code stack with
    ``fp8_params`` its GEMM weights (``gemm_params`` of ``params``) at one byte, as Megatron-Core's
    ``--fp8-param-gather`` ("perform the param all-gather in fp8") and NeMo's ``distributed_adam.py`` (fp8
    buckets sync as ``torch.uint8``) move them; norms, biases and embeddings at ``param_bytes``."""
    if not (fp8_params and stack(framework).grad_buffer):
        return param_bytes
    share = np.minimum(np.divide(gemm_params, np.maximum(params, 1e-300)), 1.0)
    return param_bytes - share * (param_bytes - 1.0)
