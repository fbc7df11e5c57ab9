"""Packing advice: every grouping is priced and ranked; placements ranked by network sharing."""

import pytest

import perfmodel as pm
from perfmodel.analysis.packing import _partitions, rank_placements
from perfmodel.core.errors import InvalidInputError, UnknownNameError, UnsupportedError

SMALL = pm.Strategy(micro_batch=1)


def test_partitions_are_counted_by_bell_numbers():
    assert len(list(_partitions(list(range(4)), 4))) == 15  # Bell(4)
    assert len(list(_partitions(list(range(4)), 2))) == 8   # S(4,1) + S(4,2) = 1 + 7


def test_two_gpus_three_jobs_best_throughput_and_slowest():
    jobs = [("gpt2-small", SMALL, "a"), ("gpt2-small", SMALL, "b"), ("gpt2-medium", pm.Strategy(micro_batch=4), "c")]
    best = pm.advise_packing(jobs, pm.cluster("h100", gpus_per_node=2), modes=("time-slice", "mps"))
    assert len(best) == 4  # the groupings of 3 jobs on at most 2 GPUs
    assert best[0].throughput >= best[-1].throughput
    assert all(len(c.groups) <= 2 for c in best)
    slow = pm.advise_packing(jobs, pm.cluster("h100", gpus_per_node=2), objective="slowest", modes=("mps",))
    assert slow[0].slowest_s <= slow[-1].slowest_s
    # a single GPU: the one grouping, with the mode that serves the objective best
    one = pm.advise_packing(jobs[:2], "h100", modes=("time-slice", "mps"))
    assert len(one) == 1 and one[0].modes == ("mps",)


def test_rank_placements_prefers_disjoint_nodes():
    c = pm.cluster("h100", nodes=4, gpus_per_node=8)
    s = pm.Strategy(dp=8, micro_batch=8)  # 4 GPUs on each of 2 nodes
    shared = [("gpt2-small", s, [0, 1]), ("gpt2-small", s, [0, 1])]  # both on one NIC per node
    apart = [("gpt2-small", s, [0, 1]), ("gpt2-small", s, [2, 3])]
    ranked = rank_placements([shared, apart], c)
    assert ranked[0][0] == 1


def test_packing_errors():
    with pytest.raises(UnknownNameError, match="objective 'fast'"):
        pm.advise_packing(["gpt2-small"], "h100", objective="fast")
    with pytest.raises(InvalidInputError, match="distinct labels"):
        pm.advise_packing(["gpt2-small", "gpt2-small"], "h100")
    with pytest.raises(UnsupportedError, match="uses several GPUs"):
        pm.advise_packing([("gpt2-small", pm.Strategy(dp=2), "x")], pm.cluster("h100", gpus_per_node=2))
    with pytest.raises(InvalidInputError, match="'steps' must hold one integer"):
        pm.advise_packing(["gpt2-small"], "h100", steps=[0])
