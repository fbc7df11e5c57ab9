"""framework="deepspeed": DeepSpeed v0.16.4's pipeline engine and BF16_Optimizer, worked by hand.

Collectives at a constant 100 GB/s bus bandwidth and no latency (t = S · factor(n) / B, nccl-tests
doc/PERFORMANCE.md: sendrecv 1, all-gather and reduce-scatter (n−1)/n, all-reduce 2(n−1)/n).
docs/stacks.md ("DeepSpeed's pipeline engine") gives the sources.
"""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.analysis.symbolic import symbolic_step_time
from perfmodel.core.errors import UnsupportedError
from perfmodel.costs.comm import datasheet_entry
from perfmodel.parallel import deepspeed as ds
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.pipeline import Stage, p2p_time, schedule_seconds
from perfmodel.parallel.placement import layout

B = 100e9
COLL = {level: {"all_reduce": datasheet_entry(B, 0.0, source="test")} for level in ("intra", "inter")}
ACT = 1e8  # bytes of one micro-batch's b·s·h


def cfg(**kw):
    return dataclasses.replace(StepConfig.from_strategy(pm.Strategy(micro_batch=1, framework="deepspeed")), **kw)


def four_stages():
    return [Stage(6.0, float(i), i == 0, i == 3, True) for i in range(4)]


def test_transfers_and_gathers_per_micro_batch():
    # TrainSchedule: a middle stage receives and sends an activation and a gradient per micro-batch, each
    # a blocking dist.send / dist.recv; the first and the last stage have one neighbour
    assert list(ds.transfers_per_micro_batch(4, np.arange(4))) == [2, 4, 4, 2]
    assert list(ds.transfers_per_micro_batch(2, np.arange(2))) == [2, 2]
    assert float(ds.transfers_per_micro_batch(1, 0)) == 0
    # pipe_partitioned: gather the received activation (not stage 0); before backward, the own output and
    # the received gradient (not the last stage)
    assert list(ds.gathers_per_micro_batch(4, np.arange(4))) == [2, 3, 3, 1]


def test_p2p_by_hand_against_megatron():
    # pp = 4 in one node, m = 8, tp = 1: each transfer 1e8 B / 100 GB/s = 1 ms, whole tensors, no gather
    c = cfg(pp=4.0, dp=1.0, micro_batches=8.0)
    lay = layout(1, 1, 4, 8)
    # the middle stages wait on 4 per micro-batch (32 ms); fill and drain cross 3 boundaries each way (6 ms)
    assert float(ds.p2p_seconds(COLL, lay, c, ACT, four_stages())) == pytest.approx(0.038)
    # Megatron-LM's batched send/recv pairs: 2 per micro-batch on the critical path
    assert float(p2p_time(COLL, lay, c, ACT)) == pytest.approx(0.022)


def test_partitioned_p2p_by_hand():
    # tp = 2: each rank sends 0.5e8 B (0.5 ms, + a 64 B meta tensor) and all-gathers 1e8 B over 2 ranks
    # (1e8 · 1/2 / 100 GB/s = 0.5 ms); middle stage per micro-batch 4 · 0.5 + 3 · 0.5 = 3.5 ms
    c = cfg(pp=4.0, dp=1.0, tp=2.0, micro_batches=8.0)
    lay = layout(1, 2, 4, 8)
    fill = 3 * 0.5e-3 + 3 * 0.5e-3
    assert float(ds.p2p_seconds(COLL, lay, c, ACT, four_stages())) == pytest.approx(8 * 3.5e-3 + 2 * fill, rel=1e-5)
    assert float(ds.p2p_seconds(COLL, layout(4, 2, 1, 8), cfg(pp=1.0, dp=4.0, tp=2.0), ACT, four_stages()[:1])) == 0


def test_bubble_of_the_1f1b_train_schedule():
    # TrainSchedule runs 2(m + p − 1) steps, m forwards and m backwards per stage: balanced stages of
    # f = 2 ms, b = 4 ms, p = 4, m = 8 take (m + p − 1)(f + b) = 66 ms, a bubble of (p − 1)(f + b) = 18 ms
    assert float(schedule_seconds(0.006, 4 * 0.006, 8, 1)) == pytest.approx(0.066)
    # the same schedule as Megatron-LM's non-interleaved 1F1B: the same bubble on the same stages
    m = pm.transformer(layers=8, hidden=1024, heads=16, seq=1024, vocab=50304)
    bubble = {fw: pm.predict(m, "dgx-a100-80gb", pm.Strategy(framework=fw, pp=4, dp=2, micro_batch=1, global_batch=16,
                                                               attention="unfused"))
              .breakdown["pipeline_bubble"] for fw in ("deepspeed", "megatron")}
    assert bubble["deepspeed"] == pytest.approx(bubble["megatron"], rel=1e-12) and bubble["deepspeed"] > 0


def test_reduction_after_the_last_backward_by_hand():
    # 1e9 gradients of a stage over 8 ranks in one node, sent in bf16 (communication_data_type), none hidden
    lay = layout(8, 1, 1, 8)
    ar, half = 2 * 7 / 8 * 2e9 / B, 7 / 8 * 2e9 / B   # 35 ms all-reduce; 17.5 ms reduce-scatter / all-gather
    assert float(ds.reduce_seconds(COLL, lay, cfg(dp=8.0, shard_stage=0), 1e9, "bf16-mixed")) == pytest.approx(ar)
    # BF16_Optimizer under ZeRO-1: all-reduce, then all-gather the updated bf16 partitions
    assert float(ds.reduce_seconds(COLL, lay, cfg(dp=8.0, shard_stage=1), 1e9, "bf16-mixed")) == pytest.approx(ar + half)
    # fp16 ZeRO-1 (stage_1_and_2): reduce-scatter, then all-gather
    assert float(ds.reduce_seconds(COLL, lay, cfg(dp=8.0, shard_stage=1), 1e9, "fp16-mixed")) == pytest.approx(2 * half)


def test_tied_embedding_all_reduce_by_hand():
    # 1e8 embedding elements; BF16_Optimizer reduces the fp32 _hp_grad: 4e8 B over 2 ranks, 2 · 1/2 · 4e8 / B = 4 ms
    tied, untied = SimpleNamespace(tied_embeddings=True), SimpleNamespace(tied_embeddings=False)
    c, lay = cfg(pp=4.0, dp=1.0), layout(1, 1, 4, 8)
    assert float(ds.tied_seconds(COLL, lay, c, tied, 1e8, "bf16-mixed")) == pytest.approx(4e-3)
    assert float(ds.tied_seconds(COLL, lay, c, tied, 1e8, "fp16-mixed")) == pytest.approx(2e-3)
    assert float(ds.tied_seconds(COLL, lay, c, untied, 1e8, "bf16-mixed")) == 0


def test_bf16_optimizer_passes_per_micro_batch():
    m = pm.transformer(layers=12, hidden=1024, heads=16, seq=1024, vocab=50304)
    c = pm.cluster("dgx-a100-80gb")

    def opt(fw, precision, batch):
        s = pm.Strategy(framework=fw, dp=8, micro_batch=2, global_batch=batch, precision=precision)
        return pm.predict(m, c, s).breakdown["optimizer"]
    # fp16 keeps Megatron-LM's optimizer seconds; bf16 adds a cast + add over the fp32 buffers per
    # micro-batch (m = 4, 8, 16) and a fixed part per step (the reduction's passes, the zero_)
    assert opt("deepspeed", "fp16-mixed", 64) == pytest.approx(opt("megatron", "fp16-mixed", 64))
    extra = [opt("deepspeed", "bf16-mixed", b) - opt("megatron", "bf16-mixed", b) for b in (64, 128, 256)]
    assert 0 < extra[0] < extra[1] < extra[2]
    assert extra[2] - extra[1] == pytest.approx(2 * (extra[1] - extra[0]), rel=1e-9)


@pytest.mark.parametrize("kw, message", [
    (dict(pp=2, zero=2), "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"),
    (dict(pp=2, schedule="interleaved", virtual_stages=2), "schedule='interleaved' does not apply to framework='deepspeed'"),
])
def test_what_the_pipeline_engine_refuses(kw, message):
    with pytest.raises(UnsupportedError, match=message):
        pm.Strategy(framework="deepspeed", **kw)
    pm.Strategy(framework="deepspeed", zero=3)  # pp = 1: any ZeRO stage


def test_symbolic_step_times_refuse_deepspeed():
    with pytest.raises(UnsupportedError, match="do not cover framework='deepspeed'"):
        symbolic_step_time(pm.preset("gpt2-medium"), pm.cluster("dgx-a100-80gb"),
                           pm.Strategy(dp=8, micro_batch=8, framework="deepspeed"), free=("micro_batch",))
