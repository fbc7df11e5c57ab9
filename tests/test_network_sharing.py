"""Jobs sharing a cluster's links: max-min fair sharing, the two-jobs-on-one-link example, offsets."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.analysis.network import Phases, max_min_rates, simulate
from perfmodel.core.errors import InvalidInputError, UnsupportedError

LINK = {"node0.nic": 1.0, "node1.nic": 1.0}


def test_max_min_progressive_filling_by_hand():
    # A on l1, B on l1+l2, C on l2; l1 = 1, l2 = 2: l1 splits 0.5/0.5, C takes its cap of 1 on l2
    flows = [Phases("A", 1, 1, 1.0, ("l1",)), Phases("B", 1, 1, 1.0, ("l1", "l2")), Phases("C", 1, 1, 1.0, ("l2",))]
    np.testing.assert_allclose(max_min_rates(flows, {"l1": 1.0, "l2": 2.0}), [0.5, 0.5, 1.0])


def test_two_jobs_on_one_link_worked_example():
    # each: 1 s compute then 1 s at the full link. Together: both send at half rate for 2 s -> 3 s steps.
    jobs = [Phases("a", 1.0, 1.0, 1.0, tuple(LINK)), Phases("b", 1.0, 1.0, 1.0, tuple(LINK))]
    steps, busy = simulate(jobs, LINK)
    np.testing.assert_allclose(steps, [3.0, 3.0])
    assert busy["node0.nic"] == pytest.approx(2 / 3, rel=1e-6)
    # b started 1 s late sends while a computes: no overlap, 2 s steps, the link always busy
    steps, busy = simulate(jobs, LINK, [0.0, 1.0])
    np.testing.assert_allclose(steps, [2.0, 2.0])
    # half a phase late: they overlap for 0.5 s of every step
    np.testing.assert_allclose(simulate(jobs, LINK, [0.0, 0.5])[0], [2.5, 2.5])


def test_two_predicted_jobs_on_one_nic_match_the_example():
    c = pm.cluster("h100", nodes=2, gpus_per_node=8)  # one 25 GbE NIC per node, shared by both jobs
    s = pm.Strategy(dp=8, micro_batch=8)
    r = pm.predict_cluster([("gpt2-small", s, [0, 1]), ("gpt2-small", s, [0, 1], "second")], c, search_offsets=True)
    j = r.jobs[0]
    comm, compute = j.comm_s, j.solo_step_time - j.comm_s
    assert comm > 0 and r.jobs[1].name == "second"
    # started together: both communicate at half rate; compute < comm so they stay aligned
    assert r.aligned_slowdowns[0] == pytest.approx((compute + 2 * comm) / (compute + comm), rel=1e-6)
    # offset: never faster than the link allows (2 comm phases per step of each), better than aligned
    assert j.step_time == pytest.approx(max(2 * comm, compute + comm), rel=1e-3)
    assert r.gain > 1.0 and r.hottest_links[0][0] in ("node0.nic", "node1.nic")


def test_jobs_on_disjoint_nodes_do_not_interact():
    c = pm.cluster("h100", nodes=4, gpus_per_node=8)
    s = pm.Strategy(dp=16, micro_batch=8)
    r = pm.predict_cluster([("gpt2-small", s, [0, 1]), ("gpt2-small", s, [2, 3])], c)
    assert [x.slowdown for x in r.jobs] == pytest.approx([1.0, 1.0])


def test_placement_errors():
    c = pm.cluster("h100", nodes=2, gpus_per_node=8)
    s = pm.Strategy(dp=8)
    with pytest.raises(InvalidInputError, match="distinct node indices in 0..1"):
        pm.predict_cluster([("gpt2-small", s, [0, 2])], c)
    with pytest.raises(InvalidInputError, match="do not spread evenly"):
        pm.predict_cluster([("gpt2-small", pm.Strategy(dp=3), [0, 1])], c)
    with pytest.raises(UnsupportedError, match="more GPUs than nodes \\[0, 1\\]"):
        pm.predict_cluster([("gpt2-small", pm.Strategy(dp=16), [0, 1])] * 2, c)
    with pytest.raises(InvalidInputError, match="'offsets' must be 1 seconds"):
        pm.predict_cluster([("gpt2-small", s, [0, 1])], c, offsets=[0, 1])
    with pytest.raises(InvalidInputError, match="'oversubscription' must be a number >= 1"):
        pm.predict_cluster([("gpt2-small", s, [0, 1])], c, oversubscription=0.5)


def test_oversubscribed_rack_uplink_slows_even_a_lone_job_by_hand():
    # 4 nodes, 2 per rack, uplinks of 2 NICs' worth / 4 = 0.5: a job on nodes 0 and 2 crosses both
    # uplinks, so its communication runs at half its solo rate: step = compute + 2 * comm
    c = pm.cluster("h100", nodes=4, gpus_per_node=8)
    r = pm.predict_cluster([("gpt2-small", pm.Strategy(dp=16, micro_batch=8), [0, 2])], c,
                           nodes_per_rack=2, oversubscription=4)
    j = r.jobs[0]
    assert j.step_time == pytest.approx(j.solo_step_time + j.comm_s, rel=1e-3)
    assert {name for name, _ in r.hottest_links} >= {"rack0.uplink", "rack1.uplink"}


def test_tensor_parallel_traffic_across_nodes_shares_the_nics():
    c = pm.cluster("h100", nodes=2, gpus_per_node=4)
    wide = pm.Strategy(tp=4, dp=1, micro_batch=8)          # 2 GPUs a node: each TP group spans both nodes
    r = pm.predict_cluster([("gpt2-small", wide, [0, 1]), ("gpt2-small", wide, [0, 1], "b")], c)
    alone = pm.predict("gpt2-small", pm.cluster("h100", nodes=2, gpus_per_node=2), wide)
    assert r.jobs[0].comm_s == pytest.approx(alone.breakdown["tp_comm"] + alone.breakdown["dp_comm"])
    assert alone.breakdown["tp_comm"] > 0 and all(j.slowdown > 1.05 for j in r.jobs)
    # TP inside each job's node share of GPUs (tp=2 on 2 GPUs a node) stays off the NICs
    narrow = pm.Strategy(tp=2, dp=2, micro_batch=8)
    n = pm.predict_cluster([("gpt2-small", narrow, [0, 1])], c).jobs[0]
    solo = pm.predict("gpt2-small", pm.cluster("h100", nodes=2, gpus_per_node=2), narrow)
    assert n.comm_s == pytest.approx(solo.breakdown["dp_comm"] + solo.breakdown["p2p"])
