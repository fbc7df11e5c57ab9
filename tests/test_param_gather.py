"""The distributed optimizer's parameter all-gather under fp8 parameters: GEMM weights at one byte."""

from __future__ import annotations

import pytest

import perfmodel as pm
from perfmodel.workload.stacks.float8 import gather_bytes_per_param


def test_fp8_parameters_are_gathered_at_one_byte_under_megatron_only():
    assert gather_bytes_per_param(2.0, 100.0, 90.0, True, "megatron") == pytest.approx(1.1)
    assert gather_bytes_per_param(2.0, 100.0, 90.0, False, "megatron") == 2.0
    assert gather_bytes_per_param(4.0, 100.0, 90.0, True, "torchtitan") == 4.0  # FSDP2: stacks.float8.fp8_gathered


def _dp_comm(**kw):
    m = pm.preset("gpt3-175b")
    s = pm.Strategy(dp=64, tp=4, pp=8, micro_batch=1, global_batch=1024, zero=1, framework="megatron",
                    schedule="interleaved", virtual_stages=12, sequence_parallel=True, precision="fp8-mixed",
                    grad_reduce_fp32=False, **kw)
    return pm.predict(m, pm.cluster("dgx-h100", nodes=256), s).breakdown["dp_comm"]


def test_fp8_parameters_shorten_the_distributed_optimizers_gather():
    plain, fp8 = _dp_comm(), _dp_comm(fp8_params=True)
    # GPT-3 175B at tp 4, pp 8, dp 64: the gather of a stage's ~5.5e9 parameters is most of the exposed time;
    # its GEMM weights (all but norms, biases and the embedding) move at 1 byte instead of 2
    assert 0.5 * plain < fp8 < 0.85 * plain
