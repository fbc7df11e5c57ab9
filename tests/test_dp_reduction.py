"""Gradient reduction per stack, worked by hand: how many reductions a step runs and what they expose.

Collectives at a constant 100 GB/s bus bandwidth and no latency (t = S · factor(n) / B,
nccl-tests doc/PERFORMANCE.md); a reduce-scatter over 8 ranks moves 7/8 of S per rank.
docs/distributed.md ("Gradient reduction per stack") gives the sources.
"""

import dataclasses

import pytest

import perfmodel as pm
from perfmodel.costs.comm import datasheet_entry
from perfmodel.parallel import data as dp_
from perfmodel.parallel.config import StepConfig, megatron_bucket_bytes
from perfmodel.parallel.placement import layout
from perfmodel.validate.published import read_published

B = 100e9
COLL = {"intra": {"all_reduce": datasheet_entry(B, 0.0, source="test")},
        "inter": {"all_reduce": datasheet_entry(B, 0.0, source="test")}}
LAY = layout(8, 1, 1, 8)  # 8 data-parallel ranks in one node
P = 1e9                   # gradients of the stage, elements
RS = AG = 0.875 * 4 * P / B  # one fp32 reduce-scatter (all-gather) of them: 35 ms


def cfg(**kw):
    return dataclasses.replace(StepConfig.from_strategy(pm.Strategy(micro_batch=1)), dp=8, bucket_bytes=1e12, **kw)


@pytest.mark.parametrize("framework, zero, reductions", [
    ("deepspeed", 1, 1),  # reduces at the accumulation boundary only
    ("deepspeed", 2, 4),  # every micro-step, each waited for
    ("megatron", 1, 1),   # the distributed optimizer: the fp32 grad buffer, once per step
    ("megatron", 2, 4),   # sharded gradients: every micro-batch (asynchronous, nothing to hide behind here)
    ("pytorch", 0, None),  # DDP: one all-reduce (2 RS-volumes) under no_sync
])
def test_reductions_per_step_per_stack(framework, zero, reductions):
    c = cfg(shard_stage=zero, micro_batches=4, framework=framework)
    if zero == 0:
        t = dp_.ddp_time(COLL, LAY, c, P, 0.0)
        assert float(t) == pytest.approx(2 * RS)
        assert dict(dp_.dp_collectives(0, 4)) == {"all_reduce": 1}
        return
    t = dp_.zero12_time(COLL, LAY, c, P, 0.0)  # no compute beside it: every reduction exposed
    assert float(t) == pytest.approx(reductions * RS + AG)
    assert dict(dp_.dp_collectives(zero, 4))["reduce_scatter"] == reductions


def test_asynchronous_reductions_hide_behind_the_rest_of_the_step():
    # megatron zero=2, 1F1B (v = 1) on the only stage of pp = 1: m = 4 reduce-scatters of 35 ms each
    # may run beside the compute after the first backward: W = (m - warm) f + (m - 1) b with warm = 1
    c = cfg(shard_stage=2, micro_batches=4, framework="megatron")
    f, b = 0.010, 0.020
    t = dp_.zero12_time(COLL, LAY, c, P, b, forward_s=f, index=0.0)
    window = 3 * f + 3 * b                     # 90 ms
    last = RS                                   # a single bucket leaves when the last backward ends: all of it waits
    assert float(t) == pytest.approx(max(last, 4 * RS - window) + AG)  # max(35, 140 - 90) = 50 ms + 35
    deepspeed = dp_.zero12_time(COLL, LAY, dataclasses.replace(c, framework="deepspeed"), P, b, forward_s=f)
    assert float(deepspeed) == pytest.approx(4 * RS + AG)  # each micro-step waits for its single bucket


def test_last_chunk_buckets_exposed_in_the_interleaved_schedule():
    # v = 4 chunks, p = 2, m = 4 (last group g = 2 micro-batches), one chunk's backward w = 1 s
    c = cfg(virtual_stages=4.0, pp=2.0, micro_batches=4.0, framework="megatron")
    window = 4.0                                    # the stage's backward per micro-batch
    # four buckets of 0.25 s per chunk: chunk 0's last bucket is what waits
    assert float(dp_.chunked_exposed(1.0, 0.25, 0.25, window, c)) == pytest.approx(0.25)
    # one 1 s bucket per chunk: it leaves when chunk 0's backward ends; the other chunks had 2-6 s
    assert float(dp_.chunked_exposed(1.0, 1.0, 1.0, window, c)) == pytest.approx(1.0)
    # 3 s per chunk: chunks leave at -6, -4, -2, 0 s; one stream: busy -6..-3, -3..0, 0..3, 3..6
    assert float(dp_.chunked_exposed(3.0, 3.0, 1.0, window, c)) == pytest.approx(6.0)


def test_megatron_default_bucket_and_explicit_buckets():
    # Megatron-Core: max(40,000,000, 1,000,000 · dp) fp32 elements; torch DDP: 25 MiB
    assert float(StepConfig.from_strategy(pm.Strategy(dp=128, framework="megatron")).bucket_bytes) == 512e6
    assert float(StepConfig.from_strategy(pm.Strategy(dp=8, framework="megatron")).bucket_bytes) == 160e6
    assert float(StepConfig.from_strategy(pm.Strategy(dp=8)).bucket_bytes) == 25 * 2**20
    assert float(StepConfig.from_strategy(pm.Strategy(dp=8, framework="megatron", bucket_mib=25)).bucket_bytes) \
        == 25 * 2**20
    assert float(megatron_bucket_bytes(16)) == 160e6


def test_llama3_405b_reduction_is_hidden_but_for_its_tail():
    case = {c.label: c for c in read_published()}["llama3-405B-16384"]
    hidden = pm.predict(case.model, case.cluster, case.strategy).breakdown
    exposed = pm.predict(case.model, case.cluster, case.strategy.replace(dp_overlap=False)).breakdown
    # 16 fp32 reduce-scatters of 12.7 GB over 128 ranks at ~47 GB/s are ~4.4 s; beside the step they
    # expose what the compute after each stage's first backward cannot cover, plus the slowed compute
    assert exposed["dp_comm"] > 4.3
    assert hidden["dp_comm"] < exposed["dp_comm"] - 1.5


def _interleaved(m=8.0, p=4.0, v=2.0):
    # Megatron's interleaved schedule on p = 4 stages of v = 2 chunks: stage 0 runs 5.5 micro-batches'
    # forwards before its first backward (((p - 1)·2 + (v - 1)·p)/v + 1/v; pipeline.in_flight)
    base = pm.Strategy(micro_batch=1, pp=int(p), schedule="interleaved", virtual_stages=int(v))
    return cfg(shard_stage=2, micro_batches=m, pp=p, virtual_stages=v, framework="megatron",
               schedule=StepConfig.from_strategy(base).schedule)


def test_asynchronous_reductions_also_run_through_the_pipelines_waits():
    c = _interleaved()
    f, b = 0.010, 0.020
    # stage 0 waits (p - 1 - i)·f/v = 3 · 10 ms / 2 between its first and its last backward; the last stage none
    assert float(dp_.pipeline_waits(f, c, 0.0)) == pytest.approx(0.015)
    assert float(dp_.pipeline_waits(f, c, 3.0)) == 0.0
    # W = (m - warm)·f + (m - 1/v)·b + waits = 2.5·10 + 7.5·20 + 15 = 190 ms; 500 ms of reductions: 310 exposed
    assert float(dp_.streamed_exposed(0.030, 0.500, b, f, c, 0.0)) == pytest.approx(0.500 - 0.190)


def test_prefetched_parameter_gather_waits_for_the_first_chunk_only():
    c = _interleaved()
    # a 100 ms gather beside 5.5 warm-up forwards: 10 ms each hide 55 ms, so the first chunk's half (50 ms) waits
    assert float(dp_.prefetched_gather(0.100, 0.010, c, 0.0)) == pytest.approx(0.050)
    # 1 ms forwards hide 5.5 ms of it: 94.5 ms exposed, plus 20% slowdown of the compute over the 5.5 ms
    assert float(dp_.prefetched_gather(0.100, 0.001, c, 0.0, 0.2)) == pytest.approx(0.0945 + 0.2 * 0.0055)
    # the stack of the Llama 3 rows prefetches (megatron, zero 2); DeepSpeed's ZeRO-2 waits for the whole gather
    ds = dp_.zero12_time(COLL, LAY, dataclasses.replace(c, framework="deepspeed", micro_batches=1.0), P, 0.0)
    assert float(ds) == pytest.approx(RS + AG)
