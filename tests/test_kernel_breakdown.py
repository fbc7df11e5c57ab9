"""analysis.kernel_breakdown: the kernels pm.predict prices, by part, phase and class."""

import json

import pytest

import perfmodel as pm
from perfmodel.analysis.kernel_breakdown import class_shares
from perfmodel.cli import main

kernel_breakdown = pm.kernel_breakdown  # the public name


def test_one_gpu_kernels_add_up_to_the_predicted_forward_and_backward():
    for model, s in (("resnet50", pm.Strategy(micro_batch=256)), ("gpt2-medium", pm.Strategy(micro_batch=16))):
        df = kernel_breakdown(model, "h200", s)
        p = pm.predict(model, "h200", s)
        assert p.breakdown["host_overhead"] == pytest.approx(0.0, abs=1e-12) and p.slowest_device_lag == 0.0  # GPU-bound
        assert df["gpu_s_per_step"].sum() == pytest.approx(p.breakdown["forward"] + p.breakdown["backward"], rel=1e-9)
        assert df["share"].sum() == pytest.approx(1.0)
        assert list(df["gpu_s_per_step"]) == sorted(df["gpu_s_per_step"], reverse=True)
    cnn = kernel_breakdown("resnet50", "h200", pm.Strategy(micro_batch=256))
    assert "whole graph" in set(cnn["part"]) and "blocks" not in set(cnn["part"]) and cnn.attrs["blocks"] == 0
    assert "conv" in set(cnn["class"])


def test_data_parallel_kernels_run_at_the_slowest_gpu_pace():
    c = pm.cluster("dgx-h100", nodes=12)
    s = pm.Strategy(framework="fsdp1", fsdp="hybrid", micro_batch=2, global_batch=192)
    df, p = kernel_breakdown("llama-2-7b", c, s), pm.predict("llama-2-7b", c, s)
    kernels = df["gpu_s_per_step"].sum()
    assert kernels * (1 + p.slowest_device_lag) == pytest.approx(p.breakdown["forward"] + p.breakdown["backward"],
                                                                 rel=1e-9)
    shares = class_shares(df)
    assert shares.index[0] == "gemm" and 0.4 < shares["gemm"] < 0.9 and "sdpa" in shares.index
    blocks = df[df["part"] == "blocks"]
    assert list(blocks["gpu_s_per_step"]) == pytest.approx(list(blocks["gpu_s_per_micro_batch"] * 32))
    assert df.attrs["blocks"] == 32 and df.attrs["micro_batches"] == 1


def test_pipeline_stages_count_the_busiest_stage_and_async_workers_one_gpu():
    c = pm.cluster("dgx-h100")
    df = kernel_breakdown("llama-3-8b", c, pm.Strategy(framework="megatron", tp=2, pp=2, micro_batch=1,
                                                       global_batch=16, sequence_parallel=True))
    assert df.attrs["blocks"] == 16 and df.attrs["micro_batches"] == 8
    ps = pm.Strategy(framework="tensorflow", precision="fp32", ps_servers=1, ps_async=True, micro_batch=128)
    worker = kernel_breakdown("resnet-cifar32", pm.cluster("k80", nodes=4), ps)
    alone = kernel_breakdown("resnet-cifar32", "k80", pm.Strategy(framework="tensorflow", precision="fp32",
                                                                  micro_batch=128))
    assert worker["gpu_s_per_step"].sum() == pytest.approx(alone["gpu_s_per_step"].sum())
    with pytest.raises(pm.InvalidInputError, match="'strategy' must be a perfmodel.Strategy"):
        kernel_breakdown("llama-3-8b", c, "tp=2")
    with pytest.raises(pm.UnsupportedError, match="traced graph"):
        kernel_breakdown("resnet50", c, pm.Strategy(framework="megatron"))
    # what pm.predict refuses, it refuses alike: asynchronous workers without servers
    for f in (kernel_breakdown, pm.predict):
        with pytest.raises(pm.InvalidInputError, match="'ps_async'=True needs parameter servers"):
            f("gpt2-small", "h100", pm.Strategy(ps_async=True))


def test_cli_prints_and_exports_the_kernels(capsys):
    args = ["predict", "--model", "gpt2-medium", "--gpu", "h200", "--micro-batch", "16", "--kernels"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "kernels of the busiest stage" in out and "by class: gemm" in out
    assert main([*args, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["kernels"]
    assert {r["class"] for r in rows} >= {"gemm", "sdpa"} and all(r["gpu_s_per_step"] > 0 for r in rows)
