"""StepConfig: the typed record of the configurations one step.evaluate prices."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.core.errors import PerfModelError
from perfmodel.explore.space import enumerate_space
from perfmodel.parallel.config import Schedule, StepConfig


def test_from_strategy_names_every_field_and_the_schedule():
    s = pm.Strategy(dp=4, tp=2, pp=2, micro_batch=2, global_batch=32, zero=1, schedule="interleaved",
                    virtual_stages=2, sequence_parallel=True, fsdp=None, framework="megatron")
    c = StepConfig.from_strategy(s)
    assert (c.dp, c.tp, c.pp, c.micro_batch, c.micro_batches, c.virtual_stages) == (4, 2, 2, 2, 4, 2)
    assert c.shard_stage == 1 and c.sequence_parallel and not c.hybrid and not c.fsdp
    assert c.schedule == Schedule.INTERLEAVED and c.framework == "megatron" and c.bucket_bytes == 4 * 40_000_000  # Megatron-Core default at dp 4
    assert StepConfig.from_strategy(pm.Strategy(fsdp="hybrid", dp=8)).hybrid
    assert Schedule.named("gpipe") is Schedule.GPIPE


def test_from_strategy_carries_the_software_stack():
    s = pm.Strategy(dp=8, tp=2, sequence_parallel=True, framework="torchtitan", compile=True,
                    tp_comm_overlap="async", fsdp="shard-grad-op")
    c = StepConfig.from_strategy(s)
    assert (c.framework, c.compile, c.loss, c.tp_comm_overlap) == ("torchtitan", True, "compiled", "async")
    assert c.fsdp and not c.reshard and StepConfig.from_strategy(pm.Strategy(dp=8)).tp_comm_overlap == ""
    with pytest.raises(PerfModelError, match="must share 'loss'"):
        StepConfig.stack([c, dataclasses.replace(c, loss="chunked")])


def test_from_space_takes_the_varied_fields_and_the_base_for_the_rest():
    model = pm.preset("gpt2-medium")
    space = enumerate_space(model, 16, 8, 64)
    base = pm.Strategy(bucket_mib=50.0, dp_overlap=False)
    c = space.step_config(base)
    a = space.arrays
    assert np.array_equal(c.dp, a["dp"]) and np.array_equal(c.micro_batches, a["micro_batches"])
    assert np.array_equal(c.shard_stage, a["zero"]) and c.bucket_bytes == 50 * 2**20 and not c.dp_overlap
    assert np.array_equal(c.schedule == Schedule.INTERLEAVED, a["virtual_stages"] > 1)
    with pytest.raises(ValueError):  # the arrays are read-only: one record, shared safely
        c.dp[0] = 3.0


def test_stack_prices_side_by_side_and_refuses_mixed_shared_fields():
    one, two = (StepConfig.from_strategy(pm.Strategy(dp=d)) for d in (2, 4))
    both = StepConfig.stack([one, two])
    assert np.array_equal(both.dp, [2.0, 4.0]) and both.framework == "pytorch"
    other = dataclasses.replace(two, framework="megatron")
    with pytest.raises(PerfModelError, match="configurations priced together must share 'framework'"):
        StepConfig.stack([one, other])
