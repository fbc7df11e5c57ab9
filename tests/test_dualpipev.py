"""torch's DualPipeV schedule: the priced fill and drain and memory against torch's own action orders."""

from __future__ import annotations

import random

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.errors import InvalidInputError, UnsupportedError
from perfmodel.explore import strategy_of
from perfmodel.parallel.config import Schedule, StepConfig
from perfmodel.parallel.pipeline import in_flight, stages
from perfmodel.parallel.zero_bubble import drain_ratio, dualpipev_drain, zbv_drain
from test_zero_bubble import _orders, _run


def test_the_form_is_torchs_orders_run_with_those_durations():
    rng = random.Random(20261207)
    for _ in range(40):
        pp = rng.choice([2, 3, 4, 5, 6, 8])
        m = rng.randint(2 * pp, 4 * pp)
        f, b, w = (10 ** rng.uniform(-1.5, 1.5) for _ in range(3))  # ratios far from 1 reach every form
        step = _run(_orders("dualpipev", pp, m, 2), f, b, w)
        assert step == pytest.approx(2 * m * (f + b + w) + dualpipev_drain(f, b, w, pp), rel=1e-12)


def test_at_equal_times_it_leaves_what_zbv_leaves_and_elsewhere_more_or_less():
    assert dualpipev_drain(1.0, 1.0, 1.0, 8) == zbv_drain(1.0, 1.0, 1.0, 8) == 7.0
    assert dualpipev_drain(1.0, 2.0, 2.0, 8) < zbv_drain(1.0, 2.0, 2.0, 8)  # long weight gradients: shorter
    assert dualpipev_drain(1.0, 2.0, 1.0, 8) > zbv_drain(1.0, 2.0, 1.0, 8)  # long input gradients: longer
    # the ratio to interleaved 1F1B's (p - 1)(f + b + w) takes the whole backward b + w
    assert float(drain_ratio(1.0, 2.0, 1.0, 8, False, True)) == pytest.approx(1 / 3)


def test_every_rank_holds_two_p_plus_one_chunk_forwards():
    for pp, m in ((2, 4), (4, 8), (4, 13), (8, 16)):
        for rank in _orders("dualpipev", pp, m, 2):
            live = peak = 0
            for a in rank:
                live += {"F": 1, "W": -1, "B": -1}.get(a.computation_type.value, 0)
                peak = max(peak, live)
            assert peak == 2 * pp + 1  # chunk forwards; each chunk is half the rank's layers
        c = StepConfig.from_strategy(_strategy(pp=pp, global_batch=m))
        assert [float(in_flight(c, i)) for i in range(pp)] == [pp + 0.5] * pp


def _strategy(pp=4, global_batch=16, dp=1, **kw):
    return pm.Strategy(dp=dp, pp=pp, micro_batch=1, global_batch=global_batch, framework=kw.pop("framework", "torchtitan"),
                       schedule=kw.pop("schedule", "dualpipev"), virtual_stages=kw.pop("v", 2), **kw)


def test_a_plan_differs_from_zbv_by_its_bubble_and_half_a_micro_batch():
    model, cl = pm.preset("llama-3-8b"), pm.cluster("dgx-h100", nodes=1)
    c = StepConfig.from_strategy(_strategy())
    assert c.schedule == Schedule.DUALPIPEV
    first, _, last = stages(model, c)
    assert bool(first.embed) and bool(first.head) and not bool(last.head)  # the V: the head on the first rank
    dpv, zbv = (pm.predict(model, cl, _strategy(schedule=s, dp=2, pp=4, global_batch=32, recompute="none"))
                for s in ("dualpipev", "zbv"))  # no checkpointing: ZBV's weight pass would recompute it
    bubble = {k: p.breakdown["pipeline_bubble"] for k, p in (("dpv", dpv), ("zbv", zbv))}
    assert dpv.step_time - zbv.step_time == pytest.approx(bubble["dpv"] - bubble["zbv"])
    act = {k: p.memory["activations"] for k, p in (("dpv", dpv), ("zbv", zbv))}
    assert act["dpv"] / act["zbv"] == pytest.approx(4.5 / 4, rel=0.02)


def test_bad_dualpipev_strategies_say_what_would_do():
    with pytest.raises(UnsupportedError, match="dualpipev.*ScheduleDualPipeV.*framework='megatron'.*torchtitan, pytorch"):
        _strategy(framework="megatron")
    with pytest.raises(InvalidInputError, match="virtual_stages=2"):
        _strategy(v=3)
    model, cl = pm.preset("llama-3-8b"), pm.cluster("dgx-h100", nodes=1)
    with pytest.raises(InvalidInputError, match="2·pp = 8 .*got 7"):
        pm.predict(model, cl, _strategy(dp=2, global_batch=14))
    assert np.isfinite(pm.predict(model, cl, _strategy(dp=2, global_batch=16)).step_time)


def test_search_prices_its_rows_as_predict_does():
    model = pm.transformer(layers=8, hidden=1024, heads=16, seq=1024, vocab=32000, name="eight")
    h100 = pm.cluster("dgx-h100", nodes=1)
    df = pm.search(model, h100, 32, framework="torchtitan", schedule=["dualpipev"], top_k=2000, max_micro_batch=2,
                   max_virtual_stages=2)
    assert set(df["schedule"]) == {"dualpipev"}
    assert (df["virtual_stages"] == 2).all() and (df["micro_batches"] >= 2 * df["pp"]).all()
    for _, row in df.head(3).iterrows():
        s = strategy_of(row)
        assert s.schedule == "dualpipev" and pm.predict(model, h100, s).step_time == row["step_time"]
    with pytest.raises(InvalidInputError, match=r"no framework .* together \(framework=\('megatron',\), "
                                                r"schedule=\('dualpipev',\)\)"):
        pm.search(model, h100, 32, framework="megatron", schedule="dualpipev")
