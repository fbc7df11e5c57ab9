"""Strategy.norm_kernels: an eager RMSNorm composed of elementwise ops (workload/stacks/norms.py)."""

from __future__ import annotations

import pytest

import perfmodel as pm
from perfmodel.costs.memory import layer_activation_bytes
from perfmodel.errors import UnknownNameError, UnsupportedError
from perfmodel.workload import kernels as steps
from perfmodel.workload.stack import adapt_kernels
from perfmodel.workload.stacks.norms import bytes_per_element


def test_bytes_per_element_by_hand():
    # bf16 input: cast to fp32 2+4, pow 4+4, mean 4, times rstd 4+4, cast back 4+2, times weight 2+2 = 36
    assert bytes_per_element(2.0, "fwd") == 36.0
    # backward: weight product's dx 2+2 and dw 2+2+2 then 2, cast 2+4, rstd product's dx 4+4 and
    # d(rstd) 4+4+4 then 4, pow's 4+4+4, the two gradients summed 4+4+4, the first cast 4+2 = 72
    assert bytes_per_element(2.0, "bwd") == 72.0
    assert bytes_per_element(4.0, "fwd") == 28.0  # an fp32 input: no casts


def test_an_eager_composite_norm_is_its_ops_and_compile_fuses_them():
    model = pm.preset("llama-2-7b")
    fwd, bwd = steps.layer_kernels(model, 1, precision="bf16-mixed")
    out = adapt_kernels(fwd + bwd, precision="bf16-mixed", framework="fsdp1", norm_kernels="composite")
    assert not [k for k in out if k.cls == "rmsnorm"]
    ln1 = [k for k in out if k.name.startswith("ln1.") and k.phase == "fwd"]
    assert [k.name for k in ln1] == ["ln1.to_fp32", "ln1.pow", "ln1.mean", "ln1.mul_rstd", "ln1.to_input",
                                     "ln1.mul_weight"]
    elems = next(k for k in fwd if k.name == "ln1").size["x"]
    assert sum(float(k.size["x"]) for k in ln1) * 8.0 == pytest.approx(36.0 * float(elems))
    compiled = adapt_kernels(fwd + bwd, precision="bf16-mixed", framework="fsdp1", compiled=True,
                             norm_kernels="composite")
    assert compiled == adapt_kernels(fwd + bwd, precision="bf16-mixed", framework="fsdp1", compiled=True)


def test_composite_norms_cost_time_and_memory_only_where_they_run():
    cl = pm.cluster("dgx-a100-80gb")
    s = pm.Strategy(dp=8, micro_batch=2, framework="fsdp1", recompute="none")
    model = pm.preset("llama-2-7b")
    fused, comp = (pm.predict(model, cl, s.replace(norm_kernels=n)) for n in ("fused", "composite"))
    assert comp.step_time > fused.step_time
    # saved per token and layer: the fp32 copy (4 bytes) and the normalized bf16 input (2) where the fused kernel
    # keeps its bf16 input (2), twice a block: 8 h bytes more
    extra = layer_activation_bytes(model, framework="fsdp1", norm_kernels="composite") - \
        layer_activation_bytes(model, framework="fsdp1")
    assert extra == pytest.approx(8.0 * model.hidden)
    assert comp.peak_memory > fused.peak_memory
    cs = s.replace(compile=True)
    assert pm.predict(model, cl, cs.replace(norm_kernels="composite")).step_time == pm.predict(model, cl, cs).step_time
    gpt = pm.preset("gpt2-small")  # LayerNorm: nn.LayerNorm is one kernel in every stack
    assert pm.predict(gpt, cl, s.replace(norm_kernels="composite")).step_time == pm.predict(gpt, cl, s).step_time


def test_bad_values_name_the_choices_and_the_stacks():
    with pytest.raises(UnknownNameError, match="norm_kernels 'split'.*composite, fused"):
        pm.Strategy(norm_kernels="split")
    with pytest.raises(UnsupportedError, match="norm_kernels='composite'.*framework='megatron'.*pytorch"):
        pm.Strategy(framework="megatron", norm_kernels="composite")


def test_the_command_line_takes_it(capsys):
    from perfmodel.cli import main

    args = ["predict", "--model", "llama-2-7b", "--gpu", "dgx-a100-80gb", "--dp", "8", "--micro-batch", "2",
            "--framework", "fsdp1"]
    assert main(args) == 0
    fused = capsys.readouterr().out
    assert main([*args, "--norm-kernels", "composite"]) == 0
    composite = capsys.readouterr().out
    assert "norm_kernels=composite" in composite and "norm_kernels" not in fused
