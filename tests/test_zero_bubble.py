"""torch's zero-bubble pipeline schedules: the priced forms against torch's own action orders, run as durations."""

from __future__ import annotations

import random

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.errors import InvalidInputError, UnsupportedError
from perfmodel.parallel.config import Schedule, StepConfig
from perfmodel.parallel.pipeline import in_flight, stages
from perfmodel.parallel.zero_bubble import drain_ratio, interleaved_zb_drain, zbv_drain

TORCH_NAMES = {"interleaved-zb": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble", "interleaved": "Interleaved1F1B",
               "dualpipev": "DualPipeV"}


def _orders(schedule, pp, m, v):
    """torch's actions per rank; a paired forward and backward (DualPipeV's OVERLAP_F_B) as its two actions in
    the order torch's runtime performs them (``_PipelineScheduleRuntime``: one after the other)."""
    visualizer = pytest.importorskip("torch.distributed.pipelining._schedule_visualizer")
    ops = visualizer.get_schedule_ops(TORCH_NAMES[schedule], pp, m, num_stages_per_rank=v)
    return [[sub for a in rank if a is not None for sub in (a.sub_actions or (a,))] for rank in ops]


def _run(orders, f, b, w, whole=None):
    """Each rank runs its actions in order; an action starts when its rank is free and its inputs are done:
    F(s) after F(s-1); the input gradient I (or a whole backward B) of s after F(s) and the input gradient
    of s+1; W(s) after I(s). A whole backward takes b + w unless ``whole`` is given. Returns the last finish time."""
    last = max(a.stage_index for rank in orders for a in rank)
    seconds = {"F": f, "I": b, "W": w, "B": b + w if whole is None else whole}
    done, clock, at = {}, [0.0] * len(orders), [0] * len(orders)
    moved = True
    while moved:
        moved = False
        for r, rank in enumerate(orders):
            while at[r] < len(rank):
                a = rank[at[r]]
                kind, s, mb = a.computation_type.value, a.stage_index, a.microbatch_index
                if kind not in seconds:  # the gradient reduction: no compute here
                    at[r] += 1
                    continue
                needs = {"F": [("F", s - 1)] if s else [], "W": [("grad", s)]}.get(
                    kind, [("F", s)] + ([("grad", s + 1)] if s < last else []))
                starts = [done.get((k, st, mb)) for k, st in needs]
                if any(t is None for t in starts):
                    break
                end = max([clock[r], *starts]) + seconds[kind]
                done[(kind, s, mb)] = clock[r] = end
                if kind in ("I", "B"):
                    done[("grad", s, mb)] = end
                at[r] += 1
                moved = True
    assert all(at[r] == len(rank) for r, rank in enumerate(orders))
    return max(clock)


def test_the_forms_are_torchs_orders_run_with_those_durations():
    rng = random.Random(20261206)
    for _ in range(60):
        schedule = rng.choice(["interleaved-zb", "zbv"])
        pp = rng.choice([2, 3, 4, 6, 8])
        v = 2 if schedule == "zbv" else rng.choice([2, 3])
        if schedule == "zbv":
            m = rng.randint(2 * pp - 1, 4 * pp)
        else:
            m = rng.choice([k for k in range(pp, 4 * pp + 1) if k % max(1, k // pp) == 0])
        f, b, w = (rng.uniform(0.1, 3.0) for _ in range(3))
        drain = (zbv_drain if schedule == "zbv" else interleaved_zb_drain)(f, b, w, pp)
        assert _run(_orders(schedule, pp, m, v), f, b, w) == pytest.approx(m * v * (f + b + w) + drain, abs=1e-9)
    # interleaved 1F1B, for reference: the (p - 1)(f + b + w) fill and drain the ratio is taken against
    assert _run(_orders("interleaved", 4, 8, 2), 1.0, 1.2, 0.7) == pytest.approx(8 * 2 * 2.9 + 3 * 2.9)


def test_zero_bubble_orders_hold_p_micro_batches_on_every_rank():
    for schedule, pp, m, v in (("interleaved-zb", 4, 8, 2), ("interleaved-zb", 4, 12, 3), ("zbv", 8, 16, 2)):
        for rank in _orders(schedule, pp, m, v):
            live = peak = 0
            for a in rank:
                live += {"F": 1, "W": -1, "B": -1}.get(a.computation_type.value, 0)
                peak = max(peak, live)
            assert peak == pp * v  # chunk forwards; each chunk is 1/v of the rank's layers
        c = StepConfig.from_strategy(pm.Strategy(dp=1, pp=pp, micro_batch=1, global_batch=m, framework="torchtitan",
                                                 schedule=schedule, virtual_stages=v))
        assert [float(in_flight(c, i)) for i in range(pp)] == [pp] * pp


def test_equal_forward_and_gradients_leave_a_third_of_the_interleaved_drain():
    for zbv in (False, True):
        assert float(drain_ratio(1.0, 2.0, 1.0, 8, zbv)) == pytest.approx(1 / 3)
    # weight gradients cost nothing to defer when they are free: interleaved ZB keeps max(f + b, ...) = all of it
    assert float(drain_ratio(1.0, 2.0, 0.0, 8, False)) == pytest.approx(1.0)


def _strategy(schedule, v=2, global_batch=16, **kw):
    return pm.Strategy(dp=2, pp=4, micro_batch=1, global_batch=global_batch, framework=kw.pop("framework", "torchtitan"),
                       schedule=schedule, virtual_stages=v, **kw)


def test_zero_bubble_steps_are_shorter_by_their_bubble_only():
    # no checkpointing: torch's weight-gradient pass recomputes a checkpointed block (test_compiled_split_backward.py)
    model, cl = pm.preset("llama-3-8b"), pm.cluster("dgx-h100", nodes=1)
    base = pm.predict(model, cl, _strategy("interleaved", recompute="none"))
    izb = pm.predict(model, cl, _strategy("interleaved-zb", recompute="none"))
    bubble = {k: p.breakdown["pipeline_bubble"] for k, p in (("base", base), ("izb", izb))}
    assert bubble["izb"] < 0.8 * bubble["base"]
    assert izb.step_time - base.step_time == pytest.approx(bubble["izb"] - bubble["base"])
    zbv = pm.predict(model, cl, _strategy("zbv", recompute="none"))
    assert zbv.breakdown["pipeline_bubble"] < 0.8 * bubble["base"]


def test_zbv_puts_the_head_on_the_first_rank():
    c = StepConfig.from_strategy(_strategy("zbv"))
    assert c.schedule == Schedule.ZBV
    first, _, last = stages(pm.preset("llama-3-8b"), c)
    assert bool(first.embed) and bool(first.head) and not bool(last.head)
    first, _, last = stages(pm.preset("llama-3-8b"), StepConfig.from_strategy(_strategy("interleaved")))
    assert not bool(first.head) and bool(last.head)


def test_bad_zero_bubble_strategies_say_what_would_do():
    with pytest.raises(UnsupportedError, match="zbv.*framework='megatron'.*torchtitan, pytorch"):
        _strategy("zbv", framework="megatron")
    with pytest.raises(InvalidInputError, match="virtual_stages=2"):
        _strategy("zbv", v=3)
    with pytest.raises(InvalidInputError, match="virtual_stages >= 2"):
        _strategy("interleaved-zb", v=1)
    model, cl = pm.preset("llama-3-8b"), pm.cluster("dgx-h100", nodes=1)
    with pytest.raises(InvalidInputError, match="2·pp − 1 = 7"):
        pm.predict(model, cl, _strategy("zbv", global_batch=12))  # 6 micro-batches on 4 stages
    with pytest.raises(InvalidInputError, match="multiple of its rounds"):
        pm.predict(model, cl, _strategy("interleaved-zb", global_batch=18))  # 9 micro-batches, 2 rounds
    assert np.isfinite(pm.predict(model, cl, _strategy("interleaved-zb", global_batch=10)).step_time)  # 5: 1 round
