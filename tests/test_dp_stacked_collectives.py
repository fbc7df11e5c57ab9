"""Data-parallel collectives priced on their distinct (size, group) triples, stacked in one call and
remembered (``parallel.stacked.stacked_time``), give each element the number its own call gives: the
collectives alone, a bucket list, and a whole search against the one-call-per-size path."""

from __future__ import annotations

import importlib
from dataclasses import replace

import numpy as np
import pandas as pd
import perfmodel as pm
from perfmodel.core.memo import clear_memos
from perfmodel.costs.comm import _hierarchical_time, hierarchical_time
from perfmodel.parallel import data, stacked
from perfmodel.parallel.config import StepConfig
from perfmodel.predict import default_profile

chunks_module = importlib.import_module("perfmodel.explore.chunks")
H100 = pm.cluster("dgx-h100", nodes=2)
COLL = chunks_module._collectives(H100, default_profile(H100))


def _one_call_each(coll, collective, sizes, rpn, nodes, algorithm="ring"):
    """The reference: one ``hierarchical_time`` call per size, as before the stacking."""
    return [hierarchical_time(coll, collective, s, rpn, nodes, algorithm=algorithm) for s in sizes]


def test_stacked_distinct_collectives_equal_each_size_priced_alone():
    rng = np.random.default_rng(5)
    sizes = [rng.choice([1.0, 2**20, 2.5e7, 1e8, 3e9], size=(6, 1, 4)), np.full((1, 1, 4), 2.5e7),
             rng.choice([7.0, 4e8], size=(6, 1, 1))]
    # one node, one rank per node and spanning groups among the rows; rpn and nodes repeat too
    rpn = np.array([8.0, 1.0, 4.0, 8.0, 2.0, 1.0]).reshape(6, 1, 1)
    nodes = np.array([1.0, 4.0, 2.0, 3.0, 1.0, 1.0]).reshape(6, 1, 1)
    for algorithm in ("ring", "hierarchical"):
        for collective in ("all_reduce", "all_gather", "reduce_scatter"):
            clear_memos()
            for _ in range(2):  # priced, then remembered
                got = stacked.stacked_time(COLL, collective, sizes, rpn, nodes, algorithm)
                for s, g in zip(sizes, got):
                    alone = _hierarchical_time(COLL, collective, s, rpn, nodes, algorithm)
                    assert g.shape == alone.shape and np.array_equal(g, alone)
                    assert not g.flags.writeable  # shared with the memo: read-only
    # one group (a single prediction's numbers): the per-size calls themselves
    one = stacked.stacked_time(COLL, "all_reduce", [2.5e7, 1e3], 4.0, 2.0)
    assert [float(t) for t in one] == [float(hierarchical_time(COLL, "all_reduce", s, 4.0, 2.0, algorithm="ring"))
                                       for s in (2.5e7, 1e3)]


def test_bucket_list_priced_at_once_equals_its_sizes_one_by_one():
    rpn, nodes = np.array([8.0, 8.0, 4.0]).reshape(3, 1), np.array([2.0, 1.0, 4.0]).reshape(3, 1)
    price = data.ring_pricer(COLL, rpn, nodes)
    assert hasattr(price, "stacked") and not hasattr(data.ring_pricer(COLL, 8.0, 2.0), "stacked")  # one group: plain
    plain = lambda collective, nbytes: price(collective, nbytes)  # noqa: E731  (no stacked twin)
    total = np.array([[5e5, 3e8, 1.6e9, 2**20 + 3.0]] * 3)
    for collective, first in (("all_reduce", data.DDP_FIRST_BUCKET_BYTES), ("reduce_scatter", None)):
        for bucket in (2.5e7, np.array([[2.5e7, 1e8, 2.5e7, 4e8]])):
            fast = data._bucketed(price, collective, total, bucket, first)
            slow = data._bucketed(plain, collective, total, bucket, first)
            for a, b in zip(fast, slow):
                assert np.shape(a) == np.shape(b) and np.array_equal(a, b)


def test_search_with_stacked_collectives_equals_one_call_per_size(monkeypatch):
    """Every stack's search (DDP, ZeRO-1/2/3, FSDP full and hybrid, interleaved chunks), unpruned."""
    model = pm.transformer(layers=4, hidden=1024, heads=16, seq=1024, vocab=32000, name="small")

    def run():
        clear_memos()
        return pm.search(model, H100, 64, top_k=400, prune=False, max_micro_batch=2, max_virtual_stages=2,
                         bucket_mib=(25.0,), cp=(1,), tp_overlap=(False,))

    fast = run()
    monkeypatch.setattr(data, "stacked_time", _one_call_each)
    slow = run()
    assert len(fast) > 0
    pd.testing.assert_frame_equal(fast, slow, check_exact=True)


def test_zero3_units_a_stage_does_not_hold_add_nothing():
    """A unit whose count is a 0-d zero (a middle stage's embedding and head) is skipped: the same
    numbers and shape as the full expression over a zero count of the grid's shape."""
    rows = np.array([2.0, 4.0, 8.0, 16.0]).reshape(4, 1)
    c = StepConfig.from_strategy(pm.Strategy(dp=16, zero=3, fsdp="full", micro_batch=1, global_batch=64))
    c = replace(c, dp=rows, micro_batches=64.0 / rows, hybrid=np.array([[False, True]]))
    lay = {"dp": (np.minimum(rows, 8.0), np.maximum(rows / 8.0, 1.0))}
    f_s = np.array([[1e-3, 2e-2]]) * np.ones((4, 1))
    units = {"layer": (np.full((4, 1), 3.0), 2e8, f_s, 2 * f_s), "embed": (np.where(False, 1.0, 0.0), 5e8, 1e-3, 2e-3),
             "head": (np.where(False, 1.0, 0.0), 5e8, 1e-3, 2e-3)}
    zeros = {**units, **{n: (np.zeros((4, 1)), *units[n][1:]) for n in ("embed", "head")}}
    for starts in (False, True):
        skipped = data.zero3_time(COLL, lay, c, units, 2.0, starts, 0.1)
        full = data.zero3_time(COLL, lay, c, zeros, 2.0, starts, 0.1)
        assert skipped.shape == full.shape == (4, 2) and np.array_equal(skipped, full)
