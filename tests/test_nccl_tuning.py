"""NCCL's cost model across nodes (costs/nccl_tuning.py): hand-worked latencies, bandwidths and the
protocol crossovers of NVIDIA/nccl v2.18.5-1 src/graph/tuning.cc, and its use by hierarchical_time."""

from __future__ import annotations

import numpy as np
import pytest
import sympy as sp

import perfmodel as pm
from perfmodel.costs.comm import hierarchical_time, lookup_entry, ring_formula
from perfmodel.costs.nccl_tuning import candidates, nccl_choice, nccl_expression, nccl_time
from perfmodel.core.errors import InvalidInputError
from perfmodel.hardware.catalog import load_link
from perfmodel.parallel.fabric import cluster_collectives
from perfmodel.predict import default_profile
from perfmodel.validate.nccl_multinode import score

B = 47e9  # per-rank inter-node busbw of an NDR rail; NCCL's busBw is 8 x 47 = 376 GB/s with 8 ranks per node


def _crossover(lat_a, bw_a, lat_b, bw_b, k):
    """Size (bytes) where lat_a + S k / bw_a = lat_b + S k / bw_b (latencies in s, bandwidths in B/s)."""
    return (lat_b - lat_a) / (k * (1 / bw_a - 1 / bw_b))


def test_ring_all_gather_latencies_and_bandwidths_by_hand():
    """8 ranks on each of 4 nodes: nsteps 31, nInterSteps 3; intra steps pay max(NVLink hwLat, net overhead)."""
    t = candidates("all_gather", 0.0, 8.0, 4.0, B)
    assert float(t["ring", "LL"]) == pytest.approx((6.6 + 28 * 1.0 + 3 * 2.7) * 1e-6)  # overhead 1 us > 0.6
    assert float(t["ring", "LL128"]) == pytest.approx((14.0 + 28 * 1.9 + 3 * 4.0) * 1e-6)
    assert float(t["ring", "Simple"]) == pytest.approx((8.4 + 28 * 3.4 + 3 * 14.0) * 1e-6)  # 3.4 > 3 x 1 us
    assert ("tree", "LL") not in t  # v2.18 runs all-gather on rings only
    size = 2.0**33  # bandwidth: algbw = busBw x nRanks / nsteps; LL capped at llMaxBw (20.4 GB/s, > 2 nodes)
    t = candidates("all_gather", size, 8.0, 4.0, B)
    assert float(t["ring", "Simple"]) == pytest.approx(145.6e-6 + size * 31 / 32 / 376e9)
    assert float(t["ring", "LL"]) == pytest.approx(42.7e-6 + size * 31 / 32 / 20.4e9)
    assert float(t["ring", "LL128"]) == pytest.approx(79.2e-6 + size * 31 / 32 / (0.92 * 376e9))


def test_ll_to_ll128_to_simple_crossovers():
    k = 31 / 32
    ll_ll128 = _crossover(42.7e-6, 20.4e9, 79.2e-6, 0.92 * 376e9, k)  # ~0.82 MB
    assert 0.7e6 < ll_ll128 < 0.9e6
    assert nccl_choice("all_gather", 0.9 * ll_ll128, 8, 4, B) == ("ring", "LL")
    assert nccl_choice("all_gather", 1.1 * ll_ll128, 8, 4, B) == ("ring", "LL128")
    at = candidates("all_gather", ll_ll128, 8.0, 4.0, B)
    assert float(at["ring", "LL"]) == pytest.approx(float(at["ring", "LL128"]))
    ll128_simple = _crossover(79.2e-6, 0.92 * 376e9, 145.6e-6, 376e9, k)  # ~0.29 GB: Simple only for huge buffers
    assert nccl_choice("all_gather", 0.9 * ll128_simple, 8, 4, B) == ("ring", "LL128")
    assert nccl_choice("all_gather", 1.1 * ll128_simple, 8, 4, B) == ("ring", "Simple")
    # LL128 off (no NVLink inside the node): LL hands over to Simple at ~2.3 MB
    ll_simple = _crossover(42.7e-6, 20.4e9, 145.6e-6, 376e9, k)
    assert 2.0e6 < ll_simple < 2.6e6
    assert nccl_choice("all_gather", 0.9 * ll_simple, 8, 4, B, ll128=False) == ("ring", "LL")
    assert nccl_choice("all_gather", 1.1 * ll_simple, 8, 4, B, ll128=False) == ("ring", "Simple")


def test_tree_latency_grows_with_log2_nodes_and_wins_small_all_reduces_at_scale():
    # tree LL: baseLat 6.8 + 2((ppn - 1) 0.6 + log2i(nodes) 5.0); log2i(280) = 8
    t = candidates("all_reduce", 64.0, 8.0, 280.0, B)
    assert float(t["tree", "LL"]) == pytest.approx((6.8 + 2 * (7 * 0.6 + 8 * 5.0)) * 1e-6 + 64 / (20.4e9 * 0.5))
    assert float(candidates("all_reduce", 64.0, 8.0, 512.0, B)["tree", "LL"]) > float(t["tree", "LL"])
    assert nccl_choice("all_reduce", 1e6, 8, 280, B)[0] == "tree"
    # the ring's latency grows with every rank: 2 x 2239 steps
    assert float(t["ring", "LL"]) > 2e-3


def test_large_messages_keep_the_measured_bus_bandwidth():
    size, n = 2.0**33, 32
    t = float(nccl_time("all_reduce", size, 8, 4, B))
    busbw_per_rank = size * 2 * (n - 1) / n / t / 8
    assert busbw_per_rank == pytest.approx(B, rel=0.01)
    assert busbw_per_rank < B


def test_vectorised_matches_one_at_a_time_and_zero_bytes_cost_nothing():
    sizes = np.array([0.0, 1e3, 1e6, 1e8, 4e9])
    nodes = np.array([2.0, 4.0, 16.0, 64.0, 280.0])
    many = nccl_time("reduce_scatter", sizes, 8.0, nodes, B)
    one = [float(nccl_time("reduce_scatter", s, 8, n, B)) for s, n in zip(sizes, nodes)]
    assert many == pytest.approx(one) and many[0] == 0.0


def test_sympy_twin_matches_numbers():
    s, n = sp.Symbol("S", positive=True), sp.Symbol("n", positive=True)
    for collective, size in (("all_reduce", 3e5), ("all_reduce", 5e8), ("reduce_scatter", 2e7)):
        expr = nccl_expression(collective, sp.Float(size), 8, 16, n, B)  # a known size, the group a symbol
        assert float(expr.subs(n, 128)) == pytest.approx(float(nccl_time(collective, size, 8, 16, B)))
    free = sp.lambdify((s, n), nccl_expression("all_reduce", s, 8, 16, n, B), "numpy")  # size a symbol too
    assert free(3e5, 128) == pytest.approx(float(nccl_time("all_reduce", 3e5, 8, 16, B)))


def test_bad_input_names_the_field():
    with pytest.raises(InvalidInputError, match="'collective'.*all_reduce"):
        candidates("broadcast", 1e6, 8.0, 4.0, B)
    with pytest.raises(InvalidInputError, match="'hw'"):
        candidates("all_reduce", 1e6, 8.0, 4.0, B, hw="nvme")


@pytest.fixture(scope="module")
def dgx_h100():
    cl = pm.cluster("dgx-h100", nodes=4)
    return cluster_collectives(cl, default_profile(cl))


def test_hierarchical_time_uses_nccl_across_nodes(dgx_h100):
    entry = lookup_entry(dgx_h100, "inter", "all_gather")
    assert entry["nccl"] == {"hw": "nvlink", "ll128": True}
    bw = entry["params"]["busbw_bytes_per_s"]
    for size in (1e4, 3e6, 1e9):
        ring = float(hierarchical_time(dgx_h100, "all_gather", size, 8, 4, algorithm="ring"))
        assert ring >= float(nccl_time("all_gather", size, 8, 4, bw))
        one = float(hierarchical_time(dgx_h100, "reduce_scatter", size, 1, 4))  # one rank per node: ppn 1
        assert one == pytest.approx(float(nccl_time("reduce_scatter", size, 1, 4, bw)))
    arrays = hierarchical_time(dgx_h100, "all_reduce", np.array([1e4, 1e9]), np.array([8, 1]), np.array([4, 4]),
                               algorithm="ring")
    assert arrays == pytest.approx([float(hierarchical_time(dgx_h100, "all_reduce", 1e4, 8, 4, algorithm="ring")),
                                    float(hierarchical_time(dgx_h100, "all_reduce", 1e9, 1, 4, algorithm="ring"))])
    n = sp.Symbol("n", positive=True)
    expr = ring_formula(dgx_h100, "all_reduce", sp.Float(3e6), 8, 4, n)
    assert float(expr.subs(n, 32)) == pytest.approx(
        float(hierarchical_time(dgx_h100, "all_reduce", 3e6, 8, 4, algorithm="ring")))


def test_tcp_sockets_keep_their_own_latency():
    cl = pm.cluster("dgx-h100", nodes=2, nic=load_link("eth25"))
    entry = lookup_entry(cluster_collectives(cl, default_profile(cl)), "inter", "all_reduce")
    assert "nccl" not in entry and entry["params"]["alpha_rank_s"] == pytest.approx(10e-6)


def test_memo_keeps_clusters_with_different_nics_apart():
    prof = default_profile(pm.cluster("dgx-h100", nodes=4))
    ib = cluster_collectives(pm.cluster("dgx-h100", nodes=4), prof)
    tcp = cluster_collectives(pm.cluster("dgx-h100", nodes=4, nic=load_link("eth25")), prof)
    first = float(hierarchical_time(ib, "all_gather", 1e5, 1, 4))
    assert float(hierarchical_time(tcp, "all_gather", 1e5, 1, 4)) != pytest.approx(first)
    assert float(hierarchical_time(ib, "all_gather", 1e5, 1, 4)) == first


def test_reported_multi_node_points_are_bandwidth_bound():
    table = score()
    assert len(table) == 4 and table.nccl_model_GBps.gt(0).all()
    # large messages: NCCL's model and the constant-latency ring agree within 1%, below the NIC's busbw
    assert (table.nccl_model_GBps / table.constant_latency_GBps).between(0.99, 1.0).all()
