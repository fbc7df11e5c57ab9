"""torch's breadth-first looped schedule (``schedule="looped-bfs"``, parallel/looped_bfs.py): its step read off torch's
own orders, its memory, and the strategies it refuses."""

from __future__ import annotations

import random

import pytest
from test_zero_bubble import _run

import perfmodel as pm
from perfmodel.errors import InvalidInputError, UnsupportedError
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.looped_bfs import late_chunk_waits
from perfmodel.parallel.pipeline import in_flight


def _orders(pp, m, v):
    visualizer = pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")
    return [[a for a in rank if a is not None] for rank in visualizer.get_schedule_ops("LoopedBFS", pp, m,
                                                                                      num_stages_per_rank=v)]


def test_the_form_is_torchs_order_run_with_those_durations():
    rng = random.Random(20261207)
    for _ in range(40):
        pp, v = rng.choice([2, 3, 4, 8]), rng.choice([2, 3, 4])
        m = rng.randint(1, 3 * pp)
        f, b = rng.uniform(0.1, 3.0), rng.uniform(0.1, 3.0)
        form = (m * v + pp - 1 + float(late_chunk_waits(pp, m, v))) * (f + b)
        assert _run(_orders(pp, m, v), f, b, 0.0) == pytest.approx(form, abs=1e-9)


def test_every_rank_holds_every_micro_batch():
    for pp, m, v in ((4, 8, 2), (4, 3, 3), (8, 16, 4)):
        for rank in _orders(pp, m, v):
            live = peak = 0
            for a in rank:
                live += {"F": 1, "B": -1}.get(a.computation_type.value, 0)
                peak = max(peak, live)
            assert peak == m * v  # chunk forwards: m micro-batches of the rank's layers
        s = pm.Strategy(dp=1, pp=pp, micro_batch=1, global_batch=m, framework="torchtitan", schedule="looped-bfs",
                        virtual_stages=v)
        assert [float(in_flight(StepConfig.from_strategy(s), i)) for i in range(pp)] == [m] * pp


def _plan(schedule, global_batch=16, v=2):
    s = pm.Strategy(dp=2, pp=4, micro_batch=1, global_batch=global_batch, framework="torchtitan", schedule=schedule,
                    virtual_stages=v)
    return pm.predict("llama-3-8b", pm.cluster("dgx-h100", nodes=1), s)


def test_interleaved_time_with_gpipe_memory():
    bfs, interleaved, gpipe = _plan("looped-bfs"), _plan("interleaved"), _plan("gpipe", v=1)
    assert bfs.step_time == pytest.approx(interleaved.step_time, rel=1e-9)
    assert bfs.memory["activations"] == pytest.approx(gpipe.memory["activations"], rel=1e-9)
    assert bfs.memory["activations"] > 1.3 * interleaved.memory["activations"]


def test_fewer_micro_batches_than_ranks_wait_for_each_later_chunk():
    # m = 2 on pp = 4, v = 2: one later chunk pass waits p - m = 2 slots of a chunk's forward and backward
    few = _plan("looped-bfs", global_batch=4)
    enough = _plan("looped-bfs", global_batch=8)
    chunk = (enough.breakdown["forward"] + enough.breakdown["backward"]) / 4 / 2  # one micro-batch's chunk, f + b
    waited = few.breakdown["pipeline_bubble"] - enough.breakdown["pipeline_bubble"]
    assert waited == pytest.approx(2 * chunk, rel=0.05)


def test_bad_looped_strategies_say_what_would_do():
    with pytest.raises(UnsupportedError, match="torchtitan, pytorch"):
        pm.Strategy(dp=2, pp=4, micro_batch=1, global_batch=16, framework="megatron", schedule="looped-bfs",
                    virtual_stages=2)
    with pytest.raises(InvalidInputError, match="gpipe"):
        pm.Strategy(dp=2, pp=4, micro_batch=1, global_batch=16, framework="torchtitan", schedule="looped-bfs")
    with pytest.raises(InvalidInputError, match="pm.predict"):
        pm.search("llama-3-8b", pm.cluster("dgx-h100", nodes=1), 64, schedule="looped-bfs")
