"""Predictions served partly from the caches of perfmodel/core/memo.py equal uncached ones.

The caches (a layer's kernel times, each collective, a cluster's collective entries) are
keyed by what each piece depends on; a wrong key would hand one configuration another's
times. Seeded random configurations (drawn as in test_random_configurations.py) and the
published runs are priced once with every cache emptied before each call (the reference
path) and once in a shuffled order with the caches warm, sharing entries across calls.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.core.errors import PerfModelError
from perfmodel import step
from perfmodel.core.memo import clear_memos
from perfmodel.parallel.config import StepConfig
from perfmodel.predict import Prediction, _collectives, default_profile
from test_published_runs import cluster_of, load_rows, model_of, strategy_of
from test_random_configurations import NODES, _model, _strategy

FIELDS = ("step_time", "tokens_per_second", "tflops_per_gpu", "mfu", "peak_memory", "over_capacity", "model_flops")


def _cases(n: int, seed: int) -> list[tuple]:
    rng = random.Random(seed)
    cases = [(model_of(r), cluster_of(r), strategy_of(r)) for r in load_rows()]
    for _ in range(n):
        model = _model(rng)
        cluster = pm.cluster(rng.choice(NODES), nodes=rng.choice([1, 2, 16]))
        try:
            cases.append((model, cluster, _strategy(rng, cluster.n_gpus, getattr(model, "heads", None),
                                                    getattr(model, "experts", 1))))
        except PerfModelError:
            continue
    return cases


def _predict(case):
    try:
        return pm.predict(*case)
    except PerfModelError as e:
        return type(e), str(e)


def _same(a, b) -> None:
    if isinstance(a, tuple):
        assert a == b
        return
    for k in FIELDS:
        np.testing.assert_allclose(getattr(b, k), getattr(a, k), rtol=1e-12, atol=0)
    assert a.fits == b.fits and a.bottleneck == b.bottleneck and a.interval == pytest.approx(b.interval, rel=1e-12)
    for part in ("breakdown", "memory"):
        x, y = getattr(a, part), getattr(b, part)
        assert x.keys() == y.keys()
        np.testing.assert_allclose([y[k] for k in x], [x[k] for k in x], rtol=1e-12, atol=0)


def test_cached_predictions_equal_uncached_ones():
    cases = _cases(60, seed=7)
    reference = []
    for case in cases:
        clear_memos()
        reference.append(_predict(case))
    order = list(range(len(cases))) * 2
    random.Random(1).shuffle(order)
    for i in order:
        _same(reference[i], _predict(cases[i]))
    assert sum(not isinstance(r, tuple) for r in reference) >= 30  # most of the sample predicts


def test_same_micro_batch_and_tp_share_kernel_times_but_not_results():
    """Two strategies that differ only in dp and pp hit the kernel-time cache and still differ."""
    model, cluster = pm.preset("llama-3-8b"), pm.cluster("dgx-h100", nodes=4)
    a = pm.predict(model, cluster, pm.Strategy(dp=8, tp=4, micro_batch=1, global_batch=64))
    b = pm.predict(model, cluster, pm.Strategy(dp=4, tp=4, pp=2, micro_batch=1, global_batch=64))
    clear_memos()
    b_cold = pm.predict(model, cluster, pm.Strategy(dp=4, tp=4, pp=2, micro_batch=1, global_batch=64))
    assert a.step_time != b.step_time
    _same(b_cold, b)


def test_repeated_predictions_are_separate_records():
    """A repeated call shares the step's numbers, not the record: changing one prediction's breakdown
    or one ``evaluate`` result leaves the next call's untouched, and the record equals one built field by field."""
    model, cluster = pm.preset("llama-3-8b"), pm.cluster("dgx-h100", nodes=2)
    s = pm.Strategy(dp=4, tp=4, micro_batch=1, global_batch=32)
    first = pm.predict(model, cluster, s)
    first.breakdown["forward"] = -1.0
    first.memory.clear()
    again = pm.predict(model, cluster, s)
    assert again.breakdown["forward"] > 0 and again.memory and again is not first
    assert again == Prediction(**{f.name: getattr(again, f.name) for f in dataclasses.fields(Prediction)})
    prof = default_profile(cluster)
    c = StepConfig.from_strategy(s)
    out = step.evaluate(model, cluster, prof, _collectives(cluster, prof), c, precision=s.precision,
                        recompute=s.recompute, optimizer=s.optimizer)
    out["step_time"], out["memory"]["weights"] = -1.0, -1.0
    shared = step.step_quantities(model, cluster, prof, _collectives(cluster, prof), c, precision=s.precision,
                                  recompute=s.recompute, optimizer=s.optimizer)
    assert shared["step_time"] == again.step_time and shared["memory"].get("weights", 0.0) != -1.0
    with pytest.raises(TypeError, match="read-only"):
        shared["step_time"] = 0.0
    with pytest.raises(TypeError, match="unexpected keyword"):
        Prediction.of({"step_time": 1.0, "nonsense": 2})
