"""Distributed composition: hand-worked volumes, bubbles, overlaps and layouts.

Collectives are priced with a datasheet entry of constant bus bandwidth and no
latency unless a test says otherwise, so every number below can be checked
with a pencil: t = S · factor(n) / B (nccl-tests doc/PERFORMANCE.md).
"""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel import step as compose
from perfmodel.parallel import context, data as data_parallel, expert, pipeline, tensor
from perfmodel.parallel.config import Schedule, StepConfig
from perfmodel.parallel.pipeline import PhaseTimes
from perfmodel.parallel.wire import activation_bytes
from perfmodel.parallel import placement
from perfmodel.workload import stack
from perfmodel.core.errors import PerfModelError
from perfmodel.workload import kernels as steps
from perfmodel.costs.comm import BUSBW_FACTOR, datasheet_entry
from perfmodel.parallel.fabric import cluster_collectives, parameter_server_links
from perfmodel.parallel.placement import group_layout, layout, pipeline_crossings
from perfmodel.predict import default_profile

B = 100e9  # bytes/s, bus bandwidth of every level in the hand-worked cases


def flat_coll(intra=B, inter=B):
    """Every collective at a constant bus bandwidth, zero latency."""
    return {"intra": {"all_reduce": datasheet_entry(intra, 0.0, source="test")},
            "inter": {"all_reduce": datasheet_entry(inter, 0.0, source="test")}}


def cfg(**kw):
    """One configuration: a one-GPU Strategy's (micro-batch 1) with the fields ``kw`` changed."""
    return dataclasses.replace(StepConfig.from_strategy(pm.Strategy(micro_batch=1)), **kw)


# --- volumes -----------------------------------------------------------------------------------


def test_megatron_tp_all_reduce_bytes_per_layer():
    # b=1, s=2048, h=12288 in bf16: S = 50,331,648 B per all-reduce; ring factor 2·7/8 = 1.75
    m = pm.transformer(2, 12288, 96, 2048, 51200)
    lay = layout(1, 8, 1, 8)
    t = tensor.tp_comm_times(m, flat_coll(), lay, cfg(tp=8), precision="bf16-mixed", recompute="none")
    one = 1.75 * 50_331_648 / B
    assert float(t.layer_f) == pytest.approx(2 * one)       # 2 all-reduces forward
    assert float(t.layer_b) == pytest.approx(2 * one)       # 2 backward
    full = tensor.tp_comm_times(m, flat_coll(), lay, cfg(tp=8), precision="bf16-mixed", recompute="full")
    assert float(full.layer_b) == pytest.approx(4 * one)    # the recomputed forward all-reduces again


def test_sequence_parallel_moves_the_same_bus_bytes_forward():
    m = pm.transformer(2, 12288, 96, 2048, 51200)
    lay = layout(1, 8, 1, 8)
    ar = tensor.tp_comm_times(m, flat_coll(), lay, cfg(tp=8), precision="bf16-mixed", recompute="none")
    sp = tensor.tp_comm_times(m, flat_coll(), lay, cfg(tp=8, sequence_parallel=True), precision="bf16-mixed", recompute="none")
    assert float(sp.layer_f) == pytest.approx(float(ar.layer_f))  # RS + AG = AR, (n-1)/n twice
    # backward re-gathers the sharded input of both column-parallel GEMMs: 1.5x the bytes
    assert float(sp.layer_b) == pytest.approx(1.5 * float(ar.layer_b))


def test_tp_overlap_hides_backward_collectives_behind_weight_gradients():
    m = pm.transformer(2, 12288, 96, 2048, 51200)
    lay = layout(1, 8, 1, 8)
    t = 1.0  # a second of forward GEMMs hides any all-reduce here
    hid = tensor.tp_comm_times(m, flat_coll(), lay, cfg(tp=8, tp_overlap=True), precision="bf16-mixed",
                                recompute="none", hidden_by=t)
    assert float(hid.layer_b) == 0.0
    sp = tensor.tp_comm_times(m, flat_coll(), lay, cfg(tp=8, tp_overlap=True, sequence_parallel=True), precision="bf16-mixed",
                               recompute="none", hidden_by=t)
    assert float(sp.layer_b) == pytest.approx(2 * 0.875 * 50_331_648 / B)  # the two gradient all-gathers


@pytest.mark.parametrize("zero, psi", [(0, 2.0), (1, 2.0), (2, 2.0), (3, 3.0)])
def test_zero_data_parallel_volume_in_units_of_psi(zero, psi):
    # Rajbhandari et al. 2020, §7: DDP and ZeRO-1/2 move 2Ψ per rank, ZeRO-3 3Ψ (ring, n -> inf)
    n = 64
    sent = sum(count * float(BUSBW_FACTOR[coll](n)) for coll, count in data_parallel.dp_collectives(zero))
    assert sent == pytest.approx(psi * (n - 1) / n)


def test_dp_times_match_their_collectives_when_nothing_overlaps():
    lay = layout(8, 1, 1, 8)
    params = 1e9
    c = cfg(dp=8, bucket_bytes=1e12)  # one bucket
    ar = 1.75 * params * 4 / B  # fp32 gradients
    assert float(data_parallel.ddp_time(flat_coll(), lay, c, params, 0.0)) == pytest.approx(ar)
    z1 = data_parallel.zero12_time(flat_coll(), lay, cfg(dp=8, shard_stage=1, bucket_bytes=1e12), params, 0.0)
    assert float(z1) == pytest.approx(2 * 0.875 * params * 4 / B)  # RS grads + AG fp32 weights


def test_ddp_communicates_once_per_step_and_hides_behind_the_last_backward():
    lay = layout(8, 1, 1, 8)
    params = 1e9                       # 4 GB of gradients: a first bucket of 1 MiB, 152 of 25 MiB, the rest
    total = 1.75 * 4e9 / B
    last = 1.75 * (4e9 - 2**20 - 152 * 25 * 2**20) / B
    one = data_parallel.ddp_time(flat_coll(), lay, cfg(dp=8), params, window_s=10.0)
    four = data_parallel.ddp_time(flat_coll(), lay, cfg(dp=8, micro_batches=4), params, window_s=10.0)
    assert float(one) == pytest.approx(last)            # only the last bucket is exposed
    assert float(four) == float(one)                     # no_sync: one all-reduce per step
    # communication starts once the first bucket's (1 MiB) share of backward is done
    short = data_parallel.ddp_time(flat_coll(), lay, cfg(dp=8), params, window_s=0.01)
    assert float(short) == pytest.approx(total - 0.01 * (1 - 2**20 / 4e9))


def test_gradient_reduction_after_backward_is_exposed_but_for_the_pipeline_drain():
    """dp_overlap=False (Megatron-LM local DDP, DeepSpeed pipeline engine): the all-reduce starts when
    the backward pass ends; only the first pipeline stage, the last to finish its backward, shows all of it."""
    model = pm.transformer(layers=8, hidden=2048, heads=16, seq=1024, vocab=32000)
    cl = pm.cluster("dgx-a100-80gb", nodes=4)
    base = dict(dp=16, tp=1, pp=2, micro_batch=1, global_batch=64, framework="megatron", precision="fp16-mixed")
    hidden, after = (pm.predict(model, cl, pm.Strategy(**base, dp_overlap=flag)) for flag in (True, False))
    assert after.breakdown["dp_comm"] > 1.5 * hidden.breakdown["dp_comm"] > 0
    assert float(after.step_time - hidden.step_time) == pytest.approx(
        float(after.breakdown["dp_comm"] - hidden.breakdown["dp_comm"]), rel=1e-6)
    single = dict(base, pp=1, dp=32, global_batch=64)
    one_stage = [pm.predict(model, cl, pm.Strategy(**single, dp_overlap=f)).breakdown["dp_comm"] for f in (True, False)]
    assert one_stage[1] > one_stage[0]


def test_zero2_and_zero3_communicate_every_micro_batch():
    lay = layout(8, 1, 1, 8)
    p = 1e9
    z2 = [float(data_parallel.zero12_time(flat_coll(), lay, cfg(dp=8, shard_stage=2, micro_batches=m, bucket_bytes=1e12), p, 0.0)) for m in (1, 4)]
    rs, ag = 0.875 * 4 * p / B, 0.875 * 4 * p / B
    assert z2 == pytest.approx([rs + ag, 4 * rs + ag])
    z1 = float(data_parallel.zero12_time(flat_coll(), lay, cfg(dp=8, shard_stage=1, micro_batches=4, bucket_bytes=1e12), p, 0.0))
    assert z1 == pytest.approx(rs + ag)
    units = {"layer": (10.0, p / 10, 0.0, 0.0), "embed": (0.0, 0.0, 0.0, 0.0), "head": (0.0, 0.0, 0.0, 0.0)}
    z3 = [float(data_parallel.zero3_time(flat_coll(), lay, cfg(dp=8, shard_stage=3, micro_batches=m, fsdp=True), units, 2.0, False))
          for m in (1, 4)]
    # no compute to hide behind: AG forward + AG backward + RS for each of 10 units, 16-bit
    per = 3 * 0.875 * 2 * p / B + 2 * 0.875 * 2 * (p / 10) / B  # + first gather and last reduce once more
    assert z3[0] == pytest.approx(per)
    assert z3[1] == pytest.approx(4 * per)


def test_zero3_prefetch_hides_gathers_behind_compute():
    lay = layout(8, 1, 1, 8)
    p = 1e8                                   # per unit: AG 1.75 ms in 16-bit
    units = {"layer": (10.0, p, 1.0, 2.0), "embed": (0.0, 0.0, 0.0, 0.0), "head": (0.0, 0.0, 0.0, 0.0)}
    t = float(data_parallel.zero3_time(flat_coll(), lay, cfg(dp=8, shard_stage=3, fsdp=True), units, 2.0, False))
    ag = rs = 0.875 * 2 * p / B
    assert t == pytest.approx(ag + rs)        # only the first gather and the last reduce-scatter
    deepspeed = float(data_parallel.zero3_time(flat_coll(), lay, cfg(dp=8, shard_stage=3), units, 2.0, False))
    assert deepspeed == pytest.approx(t)      # bucketed, same bytes; latency-free here


def test_zero3_without_overlap_exposes_every_gather_and_reduce_scatter():
    """dp_overlap=False (DeepSpeed ZeRO-3 of early 2021 synchronised the device at each gather launch):
    the compute beside a collective hides none of it, and the first gather is not charged twice."""
    lay = layout(8, 1, 1, 8)
    p = 1e8
    units = {"layer": (10.0, p, 1.0, 2.0), "embed": (0.0, 0.0, 0.0, 0.0), "head": (0.0, 0.0, 0.0, 0.0)}
    ag = rs = 0.875 * 2 * p / B
    for m in (1, 3):
        serial = float(data_parallel.zero3_time(flat_coll(), lay, cfg(dp=8, shard_stage=3, micro_batches=m, dp_overlap=False),
                                                units, 2.0, False))
        assert serial == pytest.approx(m * 10 * (2 * ag + rs))
    model = pm.transformer(layers=8, hidden=4096, heads=32, seq=2048, vocab=32000)
    cl = pm.cluster("dgx-a100-80gb", nodes=8)
    base = dict(dp=64, micro_batch=2, global_batch=128, zero=3, framework="megatron", precision="fp16-mixed")
    hidden, serial = (pm.predict(model, cl, pm.Strategy(**base, dp_overlap=f)) for f in (True, False))
    assert serial.breakdown["dp_comm"] > hidden.breakdown["dp_comm"]
    assert float(serial.step_time - hidden.step_time) == pytest.approx(
        float(serial.breakdown["dp_comm"] - hidden.breakdown["dp_comm"]), rel=1e-6)


def test_parameter_server_push_pull_through_server_nics():
    links = {"server": 10e9, "worker": 2e9, "latency": 0.0}
    params = 1e8                               # 400 MB of fp32 gradients
    c = cfg(dp=8, ps_servers=2, bucket_bytes=4e8)            # one bucket: nothing overlaps
    one_way = 4e8 * max(8 / (2 * 10e9), 1 / 2e9)  # servers' NICs carry 8 workers over 2 servers
    assert float(data_parallel.ps_time(c, params, 0.0, links)) == pytest.approx(2 * one_way)
    few = cfg(dp=2, ps_servers=2, bucket_bytes=4e8)          # the worker's own NIC share is the limit
    assert float(data_parallel.ps_time(few, params, 0.0, links)) == pytest.approx(2 * 4e8 / 2e9)


def test_parameter_server_links_from_the_node():
    links = parameter_server_links(pm.cluster("dgx-a100-80gb", nodes=2))
    assert links["server"] == pytest.approx(8 * 24e9)  # 8 HDR NICs at NCCL's 24 GB/s
    assert links["worker"] == pytest.approx(24e9)


# --- pipeline ------------------------------------------------------------------------------------


def _uniform_times(f=1.0, b=2.0):
    z = np.float64(0.0)
    return PhaseTimes(layer_f=np.float64(f), layer_b=np.float64(b), embed_f=z, embed_b=z, head_f=z, head_b=z)


@pytest.mark.parametrize("p, m, v", [(4, 8, 1), (4, 8, 2), (8, 16, 4), (2, 1, 1)])
def test_bubble_fraction_is_p_minus_1_over_v_m(p, m, v):
    model = SimpleNamespace(layers=p * v)
    c = cfg(pp=p, micro_batches=m, virtual_stages=v, schedule=Schedule.INTERLEAVED if v > 1 else Schedule.ONE_F_ONE_B)
    t = _uniform_times()
    pipe, worst = pipeline.pipeline_time(model, t, pipeline.stages(model, c), c)
    ideal = m * float(worst)
    assert (float(pipe) - ideal) / ideal == pytest.approx((p - 1) / (v * m))


def test_uneven_stages_pay_the_slowest_stage_m_times():
    model = SimpleNamespace(layers=4)
    c = cfg(pp=2, micro_batches=4, stage_layers=(1, 3))
    pipe, worst = pipeline.pipeline_time(model, _uniform_times(), pipeline.stages(model, c), c)
    assert float(worst) == 9.0                       # 3 layers x (1 + 2)
    assert float(pipe) == pytest.approx(4 * 9 + 3)   # + the fill/drain through the 1-layer stage


def test_p2p_counts_and_node_crossings():
    m = pm.transformer(8, 4096, 32, 2048, 51200)
    size = 2048 * 4096 * 2 / 4          # scatter/gather: each of tp=4 ranks sends 1/4
    c = cfg(pp=4, tp=4, micro_batches=8, sequence_parallel=True)
    coll = flat_coll(inter=B / 10)
    inside = pipeline.p2p_time(coll, layout(1, 4, 4, 16), c, activation_bytes(m, c, "bf16-mixed"))
    assert float(inside) == pytest.approx((2 * 8 + 2 * 3) * size / B)
    across = pipeline.p2p_time(coll, layout(1, 4, 4, 8), c, activation_bytes(m, c, "bf16-mixed"))
    # 2 stages per node: one of 3 boundaries crosses; the steady state waits on the slow one
    assert float(across) == pytest.approx(2 * 8 * 10 * size / B + 2 * (10 + 2) * size / B)


# --- placement ------------------------------------------------------------------------------------


def test_megatron_placement_puts_tensor_groups_inside_a_node():
    lay = layout(dp=4, tp=8, pp=2, gpus_per_node=8)
    assert [tuple(map(float, lay[k])) for k in ("tp", "pp", "dp")] == [(8, 1), (1, 2), (1, 4)]
    other = layout(dp=2, tp=4, pp=2, gpus_per_node=8, order="dp-tp-pp")
    assert [tuple(map(float, other[k])) for k in ("dp", "tp", "pp")] == [(2, 1), (4, 1), (1, 2)]
    assert tuple(map(float, group_layout(16, 1, 8))) == (8, 2)       # spans two nodes, 8 on each
    assert float(pipeline_crossings(layout(1, 2, 8, 8)["pp"])) == 1.0  # 4 stages per node


def test_a_group_that_does_not_tile_the_node_straddles_two():
    # tp 3 on 8-GPU nodes: ranks 6-8 sit on two nodes, and that group's collectives pace the step
    assert tuple(map(float, group_layout(3, 1, 8))) == (2, 2)
    assert tuple(map(float, group_layout(6, 1, 8))) == (3, 2)
    assert tuple(map(float, group_layout(3, 2, 8))) == (2, 2)  # span 6 (pp 3 after tp 2)
    for size, stride in ((1, 1), (2, 1), (4, 2), (8, 1), (2, 4)):  # spans that divide the node: inside it
        assert float(group_layout(size, stride, 8)[1]) == 1.0
    m = pm.preset("gpt3-175b")
    c = pm.cluster("dgx-a100-80gb", nodes=24)

    def tp_seconds(tp):
        s = pm.Strategy(tp=tp, micro_batch=1, global_batch=384, framework="megatron", recompute="full", zero=1)
        return pm.predict(m, c, s).breakdown["tp_comm"]
    assert tp_seconds(3) > tp_seconds(4)  # a straddling group of 3 crosses the network; 4 stay on NVLink


def test_tensor_group_across_nodes_uses_the_ring_over_both_fabrics():
    m = pm.transformer(2, 8192, 64, 2048, 51200)
    coll = flat_coll(inter=B / 8)
    inside = tensor.tp_comm_times(m, coll, layout(1, 8, 1, 8), cfg(tp=8), precision="bf16-mixed", recompute="none")
    span = tensor.tp_comm_times(m, coll, layout(1, 16, 1, 8), cfg(tp=16), precision="bf16-mixed", recompute="none")
    s = 2048 * 8192 * 2
    # ring over 16 ranks: each rail carries S/8 at B/8 = the NVLink share; bound by the network here
    assert float(span.layer_f) == pytest.approx(2 * (2 * 15 / 16) * (s / 8) / (B / 8))
    assert float(span.layer_f) > float(inside.layer_f)


# --- the whole step ---------------------------------------------------------------------------------


def test_breakdown_adds_up_to_the_step():
    model = pm.preset("gpt2-medium")
    for s in (pm.Strategy(dp=2, tp=2, pp=2, micro_batch=2, global_batch=16),
              pm.Strategy(dp=8, micro_batch=4, zero=3),
              pm.Strategy(dp=2, tp=2, pp=2, micro_batch=1, global_batch=8, schedule="interleaved",
                          virtual_stages=2, sequence_parallel=True)):
        p = pm.predict(model, pm.cluster("dgx-a100-80gb"), s)
        assert sum(p.breakdown.values()) == pytest.approx(p.step_time, rel=1e-9)


def test_arrays_price_many_configurations_as_one():
    model = pm.preset("gpt2-medium")
    cl = pm.cluster("dgx-h100", nodes=2)
    prof = default_profile(cl)
    coll = cluster_collectives(cl, prof)
    strategies = [pm.Strategy(dp=16, micro_batch=2, zero=z) for z in (0, 1, 2, 3)] + [
        pm.Strategy(dp=4, tp=2, pp=2, micro_batch=2, global_batch=32, sequence_parallel=True)]
    configs = [StepConfig.from_strategy(s) for s in strategies]
    singles = [compose.evaluate(model, cl, prof, coll, c, precision="bf16-mixed", recompute="none",
                                optimizer="adamw")["step_time"] for c in configs]
    arrays = StepConfig.stack(configs)
    many = compose.evaluate(model, cl, prof, coll, arrays, precision="bf16-mixed", recompute="none", optimizer="adamw")
    assert many["step_time"] == pytest.approx(np.array([float(x) for x in singles]), rel=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_narayanan_flop_convention_with_full_recompute(causal):
    # 96·B·s·l·h²·(1 + s/6h + V/16lh) (Narayanan et al. 2021, eq. 3) with the full s² scores; causal
    # attention computes s(s+1)/2 of them, so its s/6h term is scaled by (s+1)/2s
    B_, s, L, h, V = 8, 2048, 4, 2048, 51200
    model = pm.transformer(L, h, 16, s, V, tied_embeddings=True, causal=causal)
    p = pm.predict(model, pm.cluster("dgx-a100-80gb"), pm.Strategy(dp=8, micro_batch=1, recompute="full"))
    executed = p.tflops_per_gpu * 1e12 * p.step_time * 8
    scores = s / (6 * h) * ((s + 1) / (2 * s) if causal else 1.0)
    assert executed == pytest.approx(96 * B_ * s * L * h * h * (1 + scores + V / (16 * L * h)), rel=1e-9)
    model_flops = 72 * B_ * s * L * h * h * (1 + scores + V / (12 * L * h))
    assert p.model_flops == pytest.approx(model_flops, rel=1e-9)


def test_megatron_stack_drops_autocast_casts_and_keeps_flops():
    m = pm.preset("gpt2-small")
    lf, lb = steps.layer_kernels(m, 4, precision="bf16-mixed")
    mf = stack.adapt_kernels(lf, precision="bf16-mixed", framework="megatron")
    assert not [k for k in mf if "cast" in k.name]
    assert {k.dtype for k in mf if k.cls in ("layernorm", "residual_add")} == {"bf16"}
    un = stack.adapt_kernels(lf + lb, precision="bf16-mixed", attention="unfused")
    flops = lambda ks, cls: sum(float(k.flops * np.asarray(k.count)) for k in ks if k.name.startswith(cls))  # noqa: E731
    assert flops(un, "attn.sdpa.") == pytest.approx(3 * flops(lf, "attn.sdpa"))  # 4bhs²d fwd, twice bwd
    with pytest.raises(PerfModelError, match="framework"):
        stack.adapt_kernels(lf, precision="bf16-mixed", framework="jax")


def test_transformer_engine_fp8_casts_each_gemm_input_and_keeps_the_lm_head_bf16():
    """Megatron-Core + Transformer Engine under fp8: one cast + transpose of the input per forward GEMM and
    of dy per input-gradient GEMM (4 bytes per element: a copy of half as many fp32 elements); the
    weight-gradient GEMM reuses them; Megatron's output layer is not a TE module, so it runs bf16."""
    m = pm.transformer(layers=2, hidden=1024, heads=8, seq=512, vocab=32000)
    lf, lb = steps.layer_kernels(m, 2, precision="fp8-mixed")
    hf, hb = steps.head_kernels(m, 2, precision="fp8-mixed")
    f = stack.adapt_kernels(lf + hf, precision="fp8-mixed", framework="megatron")
    b = stack.adapt_kernels(lb + hb, precision="fp8-mixed", framework="megatron")
    casts = {k.name: float(k.size["x"]) for k in f + b if "fp8" in k.name}
    T = 2 * 512
    assert casts["attn.qkv.fp8_cast"] == T * 1024 / 2 and casts["mlp.fc2.dgrad.fp8_grad_cast"] == T * 1024 / 2
    assert casts["mlp.fc2.fp8_cast"] == T * 4096 / 2 and not [n for n in casts if "wgrad" in n or "lm_head" in n]
    assert {k.dtype for k in f + b if k.name.startswith("lm_head") and k.cls == "gemm"} == {"bf16"}
    assert {k.dtype for k in f + b if k.cls == "gemm" and not k.name.startswith("lm_head")} == {"fp8"}
    eager = stack.adapt_kernels(lf, precision="fp8-mixed")  # eager PyTorch: no Transformer Engine casts
    assert not [k for k in eager if "fp8" in k.name]


def test_ddp_adds_three_passes_over_its_gradient_buckets():
    """Copy into the bucket, divide by the group size, copy back (PyTorch reducer defaults)."""
    assert data_parallel.ddp_bucket_passes(lambda elems: elems * 1e-12, 1e9) == pytest.approx(3e-3)
    assert data_parallel.ddp_bucket_passes(lambda elems: elems * 1e-12, 1e9, "megatron") == pytest.approx(1e-3)
    model = pm.transformer(layers=4, hidden=1024, heads=16, seq=1024, vocab=32000)
    cluster = pm.cluster("h200", 1, 8)
    prof = default_profile(cluster)
    ddp = pm.predict(model, cluster, pm.Strategy(dp=8, micro_batch=1), profile=prof)
    from perfmodel.costs.compute import kernel_time
    from perfmodel.workload.ops import mem

    copy_s = float(kernel_time(prof, mem("x", "copy", "fwd", model.params, variant="fwd"))[0])
    lay = layout(8, 1, 1, 8)
    comm = cluster_collectives(cluster, prof)
    c = StepConfig.from_strategy(pm.Strategy(dp=8, micro_batch=1))
    t = compose.compute_times(model, prof, c, precision="bf16-mixed", recompute="none").wall
    back = model.layers * t.layer_b + t.embed_b + t.head_b
    slowdown = prof.host["overlap_compute_slowdown"]  # compute beside NCCL runs slower (published)
    expected = float(data_parallel.ddp_time(comm, lay, c, model.params, back, 4.0, slowdown=slowdown)) + 3 * copy_s
    assert ddp.breakdown["dp_comm"] == pytest.approx(expected, rel=1e-6)


# --- context parallelism ----------------------------------------------------------------------------


def _llama(seq=8192):
    return pm.transformer(8, 4096, 32, seq, 128256, kv_heads=8, ffn_hidden=14336, activation="swiglu",
                          norm="rmsnorm", bias=False, position="rotary")


def test_context_parallel_splits_tokens_not_model_flops():
    """cp ranks share each sequence: model FLOPs per step are those of the whole batch, each rank's
    activations are those of s/cp tokens, and ZeRO shards over dp × cp (Megatron-Core)."""
    model, cl = _llama(), pm.cluster("dgx-h100", nodes=1)
    base = dict(micro_batch=1, global_batch=8, framework="megatron", zero=1)
    one = pm.predict(model, cl, pm.Strategy(dp=8, **base))
    four = pm.predict(model, cl, pm.Strategy(dp=2, cp=4, **base))
    assert four.model_flops == pytest.approx(one.model_flops, rel=1e-12)
    assert four.tokens_per_second == pytest.approx(8 * 8192 / four.step_time)
    assert four.memory["optimizer"] == pytest.approx(one.memory["optimizer"], rel=1e-12)
    # activations: the rank's 2048 tokens hold a quarter of the 8192-token ones (the embedding output aside)
    assert four.memory["activations"] == pytest.approx(one.memory["activations"] / 4, rel=0.02)
    # smaller attention blocks and four times as many micro-batches per rank: slower per token, not faster
    assert four.step_time > one.step_time


def test_ring_attention_prices_one_cp_th_of_the_attention_per_rank():
    from perfmodel.parallel.context import ring_attention
    from perfmodel.workload import kernels as steps

    model = _llama(8192)
    for cp in (2, 4, 8):
        local = dataclasses.replace(model, seq=8192 // cp)
        fwd, _ = steps.layer_kernels(local, 1, precision="bf16-mixed")
        sdpa = [k for k in fwd if k.cls == "sdpa"]
        ring = ring_attention(fwd, cp, causal=True)
        own = sum(k.flops * k.count for k in sdpa)
        whole = 4.0 * model.heads * 8192 ** 2 * model.head_dim  # full-s² convention, whole sequence
        assert own + sum(k.flops * k.count for k in ring) == pytest.approx(whole / cp)
        # cp − 1 later steps, each two non-causal (s/2cp)² blocks (head-tail load balancing)
        assert [k.size["causal"] for k in ring] == [0.0] and ring[0].count == pytest.approx(2 * (cp - 1))
        assert ring[0].size["seq"] == 8192 / (2 * cp)


def test_ring_exchange_is_exposed_only_where_the_blocks_cannot_hide_it():
    """Each of the cp − 1 ring steps passes K and V (backward: and their gradients) beside one attention
    block: a block shorter than the transfer exposes the difference, a longer one hides it."""
    cl = pm.cluster("dgx-h100", nodes=2)
    coll = cluster_collectives(cl, default_profile(cl))
    local = dataclasses.replace(_llama(), seq=2048)                 # cp = 4: 2048 of 8192 tokens per rank
    c = cfg(tp=4, cp=4, framework="megatron")                       # Transformer Engine's p2p ring
    kv = 2 * 2048 * (8 / 4) * 128 * 2                               # K and V of the chunk, bf16
    lay = placement.layout(1, 4, 1, 8, cp=4)                        # tp·cp = 16: the ring spans both nodes
    assert lay["cp"] == (2.0, 2.0)
    send = pipeline.sendrecv_time(coll, "inter", kv)
    both = pipeline.sendrecv_time(coll, "inter", 2 * kv)
    quick = (3 * 0.1 * send, 3 * 0.1 * both)
    got = context.cp_comm_times(local, coll, lay, c, precision="bf16-mixed", recompute="none", ring_gpu_s=quick)
    assert got.layer_f == pytest.approx(3 * 0.9 * send) and got.layer_b == pytest.approx(3 * 0.9 * both)
    slow = (3 * 2 * send, 3 * 2 * both)
    hidden = context.cp_comm_times(local, coll, lay, c, precision="bf16-mixed", recompute="none", ring_gpu_s=slow)
    assert (hidden.layer_f, hidden.layer_b) == (0.0, 0.0)
    inside = placement.layout(2, 2, 1, 8, cp=4)                     # tp·cp = 8: one node, NVLink
    assert inside["cp"] == (4.0, 1.0) and inside["dp_cp"] == (4.0, 2.0)   # dp replicas on two nodes


def test_context_parallel_errors_name_the_fields():
    model, cl = _llama(8190), pm.cluster("dgx-h100", nodes=1)
    with pytest.raises(pm.InvalidInputError, match="seq=8190 must be divisible by 2 × cp = 4"):
        pm.predict(model, cl, pm.Strategy(dp=4, cp=2, micro_batch=1))
    with pytest.raises(pm.InvalidInputError, match="attention='flash'"):
        pm.Strategy(cp=2, attention="unfused")
    with pytest.raises(pm.InvalidInputError, match=r"dp × tp × pp × cp = 8 × 1 × 1 × 2 = 16"):
        pm.predict(_llama(), cl, pm.Strategy(dp=8, cp=2, micro_batch=1))


# --- expert parallelism -------------------------------------------------------------------------------


def _moe():
    return pm.transformer(4, 2048, 16, 2048, 32000, kv_heads=4, ffn_hidden=7168, activation="swiglu",
                          norm="rmsnorm", bias=False, position="rotary", experts=8, experts_per_token=2)


def test_expert_parallel_ranks_hold_fewer_experts_with_bigger_gemms():
    """ep = 4: a rank holds 2 of the 8 experts, each multiplying the routed tokens of 4 ranks."""
    m = _moe()
    T = 2 * 2048
    for ep in (1, 4):
        fwd, _ = steps.layer_kernels(m, 2, precision="bf16-mixed", ep=ep)
        fc1 = [k for k in fwd if k.name == "moe.expert.fc1"][0]
        assert fc1.size["m"] == pytest.approx(T * 2 * ep / 8) and fc1.count == 8 // ep


def test_expert_parallel_splits_expert_weights_not_model_flops():
    m, cl = _moe(), pm.cluster("dgx-h100", nodes=1)
    base = dict(dp=8, micro_batch=2, global_batch=32, framework="megatron", zero=1)
    one, four = (pm.predict(m, cl, pm.Strategy(ep=ep, **base)) for ep in (1, 4))
    assert four.model_flops == pytest.approx(one.model_flops, rel=1e-12)
    expert = 8 * (2048 * 2 * 7168 + 7168 * 2048)                # one layer's experts (SwiGLU, no bias)
    assert one.memory["weights"] - four.memory["weights"] == pytest.approx(2 * 4 * expert * (1 - 1 / 4))
    # ZeRO-1: the dense states over 8 ranks, the rank's 2 experts over the 2 replicas holding them
    assert four.memory["optimizer"] == pytest.approx(one.memory["optimizer"], rel=1e-9)
    assert four.breakdown["tp_comm"] > 0.0 == one.breakdown["tp_comm"]   # the all-to-alls


def test_expert_all_to_all_by_hand():
    """Dispatch + combine forward, the same backward: 2 all-to-alls of tokens·top_k·h each way."""
    from perfmodel.costs.comm import hierarchical_time

    m, cl = _moe(), pm.cluster("dgx-h100", nodes=2)
    coll = cluster_collectives(cl, default_profile(cl))
    lay = placement.layout(8, 2, 1, 8, ep=8)                        # ep 8 at stride 2: 4 per node, 2 nodes
    assert lay["ep"] == (4.0, 2.0) and lay["dp"] == (4.0, 2.0)
    c = cfg(tp=2, sequence_parallel=True, ep=8)
    size = 1 * 2048 / 2 * 2 * 2048 * 2                              # sequence shard · top-2 · h · bf16
    a2a = hierarchical_time(coll, "all_to_all", size, 4.0, 2.0)
    got = expert.ep_comm_times(m, coll, lay, c, precision="bf16-mixed", recompute="full")
    assert float(got.layer_f) == pytest.approx(2 * a2a) and float(got.layer_b) == pytest.approx(4 * a2a)


def test_expert_parallel_errors_name_the_fields():
    m, cl = _moe(), pm.cluster("dgx-h100", nodes=1)
    with pytest.raises(pm.InvalidInputError, match="mixture-of-experts"):
        pm.predict(_llama(), cl, pm.Strategy(dp=8, ep=2, micro_batch=1))
    with pytest.raises(pm.InvalidInputError, match="'ep'=3 must divide dp × cp = 8"):
        pm.Strategy(dp=8, ep=3)
    with pytest.raises(pm.InvalidInputError, match="sequence_parallel=True"):
        pm.Strategy(dp=4, tp=2, ep=2)
    with pytest.raises(pm.InvalidInputError, match="'ep'"):
        pm.predict(m, pm.cluster("dgx-h100", nodes=2), pm.Strategy(dp=16, ep=16, micro_batch=1))
