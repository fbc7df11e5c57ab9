"""Memory per GPU: hand-worked model states, activations and feasibility."""

import dataclasses

import pytest

import perfmodel as pm
from perfmodel.costs import memory as mem
from perfmodel.parallel.config import Schedule, StepConfig
from perfmodel.parallel.pipeline import in_flight

S, B_, H, A, T = 2048, 1, 12288, 96, 8   # GPT-3 175B layer, one sequence, 8-way tensor parallel
SBH = S * B_ * H                         # 25,165,824


@pytest.mark.parametrize("sp, recompute, expected", [
    (False, "none", SBH * (10 + 24 / T + 5 * A * S / (H * T))),   # sbh(10 + 24/t + 5as/(ht)) = 23 sbh
    (True, "none", SBH / T * (34 + 5 * A * S / H)),               # sbh/t·(34 + 5as/h)
    (False, "selective", SBH * (10 + 24 / T)),                    # sbh(10 + 24/t)
    (True, "selective", SBH * 34 / T),                            # sbh·34/t
    (False, "full", 2 * SBH),                                     # 2sbh
])
def test_korthikanti_table2(sp, recompute, expected):
    got = mem.korthikanti_layer_bytes(S, B_, H, A, tp=T, sp=sp, recompute=recompute)
    assert float(got) == pytest.approx(expected)


def test_korthikanti_values_by_hand():
    assert float(mem.korthikanti_layer_bytes(S, B_, H, A, tp=T)) == 578_813_952              # 23 · sbh
    assert float(mem.korthikanti_layer_bytes(S, B_, H, A, tp=T, sp=True, recompute="selective")) == 106_954_752


def test_our_layer_accounting_maps_onto_korthikanti():
    # megatron stack, SP + selective, FlashAttention: 34h/t - 2h/t (no dropout masks) + (16 + 4a)/t per token
    # (layer-norm mean/rstd in fp32 and the attention log-sum-exp, which Korthikanti et al. do not count)
    model = pm.transformer(96, H, A, S, 51200)
    ours = mem.layer_activation_bytes(model, tp=T, sp=True, precision="bf16-mixed", recompute="selective",
                                      framework="megatron") * S * B_
    theirs = mem.korthikanti_layer_bytes(S, B_, H, A, tp=T, sp=True, recompute="selective")
    assert float(ours) == pytest.approx(float(theirs) - 2 * SBH / T + (16 + 4 * A) * S * B_ / T)
    # autocast keeps fp32 norm inputs: +2 bytes per element of both norm inputs
    autocast = mem.layer_activation_bytes(model, tp=T, sp=True, precision="bf16-mixed", recompute="selective")
    assert float(autocast - ours / (S * B_)) == pytest.approx(2 * 2 * H / T)
    # full recompute keeps the layer input only: 2 bytes (megatron) or 4 (autocast fp32 stream) per element
    assert float(mem.layer_activation_bytes(model, tp=T, sp=False, recompute="full", framework="megatron")) == 2 * H
    assert float(mem.layer_activation_bytes(model, tp=T, sp=False, recompute="full")) == 4 * H




def test_megatron_llama_layer_and_its_fp8_gemm_inputs():
    """Llama-style layer on the megatron stack (fused SwiGLU and RoPE, SP + selective), bytes per token:
    norm inputs 2·(2h + 4)/t, normed inputs 2·2h/t, q k v 2·(a + 2·kv)·d/t, output 2h/t + 4a/t,
    SwiGLU fc1 output 2·2f/t and its product 2f/t; RoPE saves nothing. Under fp8, Transformer Engine keeps
    the GEMM inputs (normed inputs, product, and a copy of the attention output) in one byte."""
    h, a, kv, f, t = 8192, 64, 8, 28672, 8
    model = pm.transformer(80, h, a, 4096, 32000, kv_heads=kv, ffn_hidden=f, activation="swiglu",
                           norm="rmsnorm", bias=False, position="rotary")
    d = h // a
    bf16 = 2 * (2 * h + 4) / t + 2 * 2 * h / t + 2 * (a + 2 * kv) * d / t + 2 * h / t + 4 * a / t + (4 + 2) * f / t
    fp8 = bf16 - 2 * h / t + h / t - f / t
    for precision, expected in (("bf16-mixed", bf16), ("fp8-mixed", fp8)):
        got = mem.layer_activation_bytes(model, tp=t, sp=True, precision=precision, recompute="selective",
                                         framework="megatron")
        assert float(got) == pytest.approx(expected)
    # eager autocast keeps gate, up, silu and product, the rotated q and k, and 16-bit GEMM inputs under fp8
    eager = [float(mem.layer_activation_bytes(model, tp=t, sp=True, precision=p, recompute="selective"))
             for p in ("bf16-mixed", "fp8-mixed")]
    assert eager[0] == eager[1] > float(bf16)
@pytest.mark.parametrize("zero, per_psi", [
    (0, lambda n: 16.0),               # ZeRO paper baseline (2 + 2 + K)Ψ, K = 12
    (1, lambda n: 4 + 12 / n),         # P_os
    (2, lambda n: 2 + 14 / n),         # P_os+g
    (3, lambda n: 16 / n),             # P_os+g+p
])
def test_zero_model_states_per_gpu(zero, per_psi):
    # Rajbhandari et al. 2020, Figure 1 / §5: fp16 mixed precision with Adam
    psi, n = 7.5e9, 64
    t = mem.static_bytes(psi, psi, precision="fp16-mixed", zero=zero, dp=n, framework="megatron")
    assert float(sum(t.values())) == pytest.approx(per_psi(n) * psi)


def test_autocast_model_states_shard_the_same_16_bytes():
    psi, n = 1e9, 8
    t = mem.static_bytes(psi, 0.0, precision="bf16-mixed", zero=3, dp=n)
    assert {k: float(v) for k, v in t.items()} == pytest.approx(
        {"weights": 4 * psi / n, "weight_copies": 0.0, "optimizer": 8 * psi / n, "gradients": 4 * psi / n})
    ddp = mem.static_bytes(psi, psi, precision="bf16-mixed", zero=0, dp=n)
    assert float(sum(ddp.values())) == pytest.approx(18 * psi)  # + the bf16 weight copies autocast caches


def test_communication_buffers():
    p, unit = 1e9, 5e7
    ddp = mem.comm_buffer_bytes(p, unit, zero=0, dp=8)
    assert float(ddp) == 4 * p                                       # DDP buckets: a copy of the gradients
    assert float(mem.comm_buffer_bytes(p, unit, zero=0, dp=1)) == 0  # one rank: no DDP
    assert float(mem.comm_buffer_bytes(p, unit, zero=0, dp=8, ps=2)) == 0
    assert float(mem.comm_buffer_bytes(p, unit, zero=2, dp=8, bucket=25e6)) == 25e6
    # Megatron-style sharded gradients (Llama 3 §3.3.2): a block's unsharded fp32 gradient awaits its reduce-scatter
    mega = {"dp": 8, "bucket": 25e6, "framework": "megatron"}
    assert float(mem.comm_buffer_bytes(p, unit, zero=2, **mega)) == 4 * unit
    assert float(mem.comm_buffer_bytes(p, 1e6, zero=2, **mega)) == 25e6          # a small block: the bucket
    assert float(mem.comm_buffer_bytes(p, unit, zero=1, **mega)) == 25e6          # whole buffer, reduced in place
    fsdp = mem.comm_buffer_bytes(p, unit, zero=3, dp=8, fsdp=True)
    assert float(fsdp) == 3 * 2 * unit                               # two gathered units + one gradient, 16-bit
    big = mem.comm_buffer_bytes(p, 5e9, zero=3, dp=8)                # DeepSpeed caps live parameters
    assert float(big) == 2 * (1e9 + 5e8)


def test_in_flight_micro_batches_per_schedule():
    c = StepConfig.from_strategy(pm.Strategy(dp=1, pp=4, global_batch=128))   # 16 micro-batches of 8
    assert [float(in_flight(c, s)) for s in range(4)] == [4, 3, 2, 1]   # 1F1B: p - s
    assert float(in_flight(dataclasses.replace(c, schedule=Schedule.GPIPE), 0)) == 16  # GPipe: all m
    inter = dataclasses.replace(c, virtual_stages=2, schedule=Schedule.INTERLEAVED)
    assert float(in_flight(inter, 0)) == pytest.approx(4 * (1 + 3 / 8))


def test_infeasible_configuration_reports_by_how_much():
    model = pm.preset("llama-3-70b")
    p = pm.predict(model, pm.cluster("dgx-h100"), pm.Strategy(dp=8, micro_batch=1))
    assert not p.fits
    need = p.peak_memory * (1 + mem.ALLOCATOR_RESERVE) + mem.CUDA_CONTEXT_BYTES
    assert p.over_capacity == pytest.approx(need - p.memory_capacity)
    assert p.memory["weights"] == pytest.approx(4 * model.params)   # fp32 master weights, unsharded
    sharded = pm.predict(model, pm.cluster("dgx-h100"), pm.Strategy(dp=8, micro_batch=1, zero=3))
    assert sharded.memory["weights"] == pytest.approx(4 * model.params / 8)


def test_pipeline_memory_takes_the_fullest_stage():
    model = pm.preset("gpt2-medium")
    one = pm.predict(model, pm.cluster("dgx-a100-80gb", gpus_per_node=2), pm.Strategy(pp=2, micro_batch=4,
                                                                                        global_batch=32))
    # the first stage holds 2 micro-batches of 12 layers, the last 1 micro-batch plus the loss
    assert one.memory["activations"] > 0
    assert one.peak_memory < pm.predict(model, pm.cluster("dgx-a100-80gb", gpus_per_node=1),
                                        pm.Strategy(micro_batch=4, global_batch=32)).peak_memory
