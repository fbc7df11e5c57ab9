"""Training across datacenters: WAN levels, DiLoCo, the inverse questions, site files, bad input."""

import json
import math

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.analysis.multisite import diloco_period, outer_sync_s, site_steps
from perfmodel.analysis.multisite_inverse import diloco_bandwidth_closed_form
from perfmodel.costs.comm import datasheet_entry, hierarchical_time
from perfmodel.costs.wan import curve_time, three_level_time, wan_time
from perfmodel.core.errors import InfeasibleError, InvalidInputError, UnknownNameError, UnsupportedError

GBPS10 = 1.25e9  # 10 Gb/s in bytes/s


@pytest.fixture(scope="module")
def node():
    return pm.cluster("dgx-h100")


def _sites(node, n=2, bw="10Gb/s", latency="40ms"):
    return pm.multi_cluster([node] * n, wan=pm.wan_link(bw, latency), names=[f"s{i}" for i in range(n)])


def _flat_site():
    """Two-level site collectives a person can price by hand: 100 GB/s inside a node, 10 GB/s out."""
    intra = datasheet_entry(100e9, 0.0, source="hand")
    inter = datasheet_entry(10e9, 0.0, source="hand")
    names = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "sendrecv")
    return {"intra": {k: intra for k in names}, "inter": {k: inter for k in names}}


# --- the three-level collective, by hand ---------------------------------------------------------


def test_wan_ring_all_reduce_by_hand(node):
    sites = _sites(node)
    # ring of 2: latency n x 40 ms = 80 ms; bytes 1 GB x 2(n-1)/n = 1 GB at 1.25 GB/s = 0.8 s
    assert float(wan_time(sites, "all_reduce", 1e9)) == pytest.approx(0.88)
    three = _sites(node, 3)
    assert float(wan_time(three, "all_reduce", 1e9)) == pytest.approx(0.12 + 1e9 * 4 / 3 / GBPS10)
    # tree over 3 sites: depth one edge, reduce up + broadcast down = 2 x 40 ms; same bus bandwidth
    assert float(wan_time(three, "all_reduce", 1e9, algorithm="tree")) == pytest.approx(0.08 + 1e9 * 4 / 3 / GBPS10)


def test_three_level_all_reduce_by_hand(node):
    sites = _sites(node)
    coll = {"s0": _flat_site(), "s1": _flat_site()}
    lay = {"s0": (4, 2), "s1": (4, 2)}  # 4 ranks on each of 2 nodes in each site
    # inside: reduce-scatter 1 GB x 3/4 at 100 GB/s = 7.5 ms, then 1/4 GB x 1/2 across nodes at 10 GB/s = 12.5 ms;
    # the all-gather mirrors it; the WAN carries the whole 1 GB: 0.88 s
    t = float(three_level_time(sites, coll, "all_reduce", 1e9, lay))
    assert t == pytest.approx(0.020 + 0.88 + 0.020)
    assert float(three_level_time(sites, coll, "reduce_scatter", 1e9, lay)) == pytest.approx(
        0.020 + 0.04 * 2 + 1e9 * 0.5 / GBPS10)
    # two shards' groups crossing at once share the uplink: the WAN part doubles its bytes
    two = float(three_level_time(sites, coll, "all_reduce", 1e9, lay, concurrent_groups=2))
    assert two == pytest.approx(0.040 + 0.08 + 1.6)
    # the in-site part is the two-level model itself
    assert 0.020 == pytest.approx(float(hierarchical_time(_flat_site(), "reduce_scatter", 1e9, 4, 2)))
    with pytest.raises(UnsupportedError, match="expert groups stay inside"):
        three_level_time(sites, coll, "all_to_all", 1e9, lay)


def test_wan_ring_latency_follows_the_site_levels_rule():
    from perfmodel.costs.wan import ring_entry
    from perfmodel.parallel.fabric import datasheet_entry as site_entry

    assert ring_entry(1e9, 0.03, source="x")["params"] == site_entry(1e9, 0.03, source="x")["params"]


def test_per_pair_links_ring_takes_the_slowest_edge_and_tree_its_paths(node):
    link = pm.wan_link
    sites = pm.multi_cluster([node] * 3, names=["a", "b", "c"], links={
        ("a", "b"): link("10Gb/s", "10ms"), ("b", "c"): link("5Gb/s", "20ms"), ("c", "a"): link("10Gb/s", "30ms")})
    # ring a-b-c-a: 5 Gb/s and 30 ms pace it: 3 x 30 ms + 1 GB x 4/3 / 0.625 GB/s
    assert float(wan_time(sites, "all_reduce", 1e9)) == pytest.approx(0.09 + 1e9 * 4 / 3 / 0.625e9)
    # tree rooted at a (children b, c): edges a-b, a-c at 10 Gb/s; deepest path 30 ms, twice
    assert float(wan_time(sites, "all_reduce", 1e9, algorithm="tree")) == pytest.approx(0.06 + 1e9 * 4 / 3 / GBPS10)


def test_measured_curve_interpolates_log_log_and_extends_at_the_last_bus_bandwidth(node):
    curve = ((1e6, 0.1), (1e8, 1.0))
    assert float(curve_time(curve, 1e7)) == pytest.approx(math.sqrt(0.1))
    assert float(curve_time(curve, 1e9)) == pytest.approx(10.0)
    sites = pm.multi_cluster([node] * 2, wan=pm.wan_link("10Gb/s", "40ms", curve=curve))
    assert float(wan_time(sites, "all_reduce", 1e8)) == pytest.approx(1.0)
    # all_gather of 2 sites moves half an all-reduce's bus bytes
    assert float(wan_time(sites, "all_gather", 2e8)) == pytest.approx(1.0)


# --- DiLoCo and Streaming DiLoCo ---------------------------------------------------------------


def test_diloco_period_by_hand():
    s = pm.MultiSiteStrategy(sync="diloco", inner_steps=100)
    assert diloco_period(1.0, 10.0, s) == (110.0, 10.0)  # utilisation 100/110
    streaming = s.replace(streaming_fragments=10, overlap_steps=5)
    assert diloco_period(1.0, 1.0, streaming) == (100.0, 0.0)  # each fragment hides behind 5 steps
    assert diloco_period(1.0, 8.0, streaming) == (130.0, 30.0)  # 10 fragments x (8 - 5) s exposed
    assert diloco_period(1.0, 15.0, streaming) == (200.0, 100.0)
    busy_wan = s.replace(streaming_fragments=10, overlap_steps=50)  # every sync hidden, but the WAN
    assert diloco_period(1.0, 11.0, busy_wan) == (110.0, 10.0)  # carries 10 x 11 s per 100 steps at most


def test_diloco_step_utilisation(node):
    sites = _sites(node)
    model = pm.preset("gpt2-small")
    s = pm.MultiSiteStrategy(pm.Strategy(dp=8, micro_batch=8), sync="diloco", inner_steps=50,
                             outer_precision="int8")
    p = pm.predict_multisite(model, sites, s)
    inner = pm.predict(model, node, pm.Strategy(dp=8, micro_batch=8)).step_time
    st = site_steps(model, sites, s)
    gather = float(hierarchical_time(st[0].collectives, "all_gather", model.params * 1.0, *st[0].dp_layout))
    # one int8 byte per parameter through the 10 Gb/s ring of 2 sites, 2 x 40 ms, then the in-site gather
    sync = 0.08 + model.params / GBPS10 + gather
    assert p.outer_sync_s == pytest.approx(sync)
    assert p.compute_utilization == pytest.approx(50 * inner / (50 * inner + sync))
    assert p.step_time == pytest.approx(inner + sync / 50)
    assert p.tokens_per_second == pytest.approx(2 * 64 * model.seq / p.step_time)
    fp32 = pm.predict_multisite(model, sites, s.replace(outer_precision="fp32"))
    assert fp32.compute_utilization < p.compute_utilization
    assert fp32.wan_bytes_per_sync == pytest.approx(4 * p.wan_bytes_per_sync)


def test_diloco_over_sites_of_different_gpus_waits_for_the_slowest():
    model = pm.preset("gpt2-small")
    h100, a100 = pm.cluster("dgx-h100"), pm.cluster("dgx-a100-80gb")
    sites = pm.multi_cluster([h100, a100], wan=pm.wan_link("10Gb/s", "40ms"), names=["h", "a"])
    p = pm.predict_multisite(model, sites, pm.Strategy(dp=8, micro_batch=8), sync="diloco", inner_steps=50)
    fast, slow = p.inner_step_s["h"], p.inner_step_s["a"]
    assert fast < slow
    assert p.period_s == pytest.approx(50 * slow + p.outer_sync_s)
    # the faster site idles while the slower computes: GPU-weighted share of the period in own steps
    assert p.compute_utilization == pytest.approx(50 * (fast + slow) / 2 / p.period_s)


def test_synchronous_dp_across_sites_is_bound_by_the_wan(node):
    model = pm.preset("gpt2-small")
    s = pm.Strategy(dp=8, micro_batch=8)
    slow = pm.predict_multisite(model, _sites(node, bw="1Gb/s"), s)
    fast = pm.predict_multisite(model, _sites(node, bw="400Gb/s", latency="1ms"), s)
    inside = pm.predict(model, node, s)
    assert slow.step_time > fast.step_time > inside.step_time - inside.breakdown["dp_comm"]
    assert 0 < slow.compute_utilization < fast.compute_utilization <= 1
    # fp32 gradients cross the WAN once per step: at 1 Gb/s that alone is about 4 x params / 125 MB/s
    assert slow.step_time > 4 * model.params / 125e6
    diloco = pm.predict_multisite(model, _sites(node, bw="1Gb/s"), s, sync="diloco", inner_steps=100)
    assert diloco.compute_utilization > slow.compute_utilization


def test_pipeline_across_sites_pays_the_wan_at_the_boundary(node):
    model = pm.preset("gpt2-small")
    sites = _sites(node, bw="10Gb/s", latency="20ms")
    s = pm.Strategy(dp=4, pp=4, micro_batch=4, global_batch=64)
    p = pm.predict_multisite(model, sites, s, across="pp")
    whole = pm.predict(model, pm.cluster("dgx-h100", nodes=2), s.replace(placement="tp-dp-pp"))
    size = 4 * model.seq * model.hidden * 2  # bf16 activations of one micro-batch
    t_wan = 0.02 + size / (GBPS10 / 4)  # 4 replicas send across the boundary at once
    m = 64 // (4 * 4)
    # the bottleneck stage waits on 2 m transfers and the fill/drain crosses once each way, each
    # now at the WAN's price instead of the network between nodes
    assert p.step_time - whole.step_time == pytest.approx(2 * (m + 1) * t_wan, rel=0.05)
    bw = pm.required_wan_bandwidth(model, sites, s, target=0.2, across="pp")
    at = pm.predict_multisite(model, sites.with_wan(pm.wan_link(bw, "20ms")), s, across="pp")
    assert at.compute_utilization == pytest.approx(0.2, abs=1e-6)
    with pytest.raises(InfeasibleError, match=r"reaches \d+\.\d% at most .*bucket_mib, micro_batch"):
        pm.required_wan_bandwidth(model, sites, s, target=0.5, across="pp")
    with pytest.raises(InvalidInputError, match="multiple of the number of sites"):
        pm.predict_multisite(model, _sites(node, 3), pm.Strategy(dp=6, pp=4, micro_batch=4), across="pp")


# --- the inverse questions ---------------------------------------------------------------------


def test_required_bandwidth_matches_the_closed_form_and_reaches_the_target(node):
    model = pm.preset("gpt2-small")
    sites = _sites(node)
    s = pm.MultiSiteStrategy(pm.Strategy(dp=8, micro_batch=8), sync="diloco", inner_steps=100,
                             outer_precision="bf16")
    bw = pm.required_wan_bandwidth(model, sites, s, target=0.95)
    steps = site_steps(model, sites, s)
    inner = steps[0].prediction.step_time
    gather = outer_sync_s(model, sites, s, steps)[0] - float(wan_time(sites, "all_reduce", 2.0 * model.params))
    closed = diloco_bandwidth_closed_form(inner, 2.0 * model.params, 2, 0.04, 100, 0.95, gather)
    assert bw == pytest.approx(closed, rel=1e-6)
    at = pm.predict_multisite(model, sites.with_wan(pm.wan_link(bw, "40ms")), s)
    assert at.compute_utilization == pytest.approx(0.95, abs=1e-6)
    with pytest.raises(InfeasibleError, match="out of reach at any bandwidth"):
        pm.required_wan_bandwidth(model, _sites(node, latency="5s"), s, target=0.95)


def test_inner_steps_for_is_the_fewest_that_reach_the_target(node):
    model = pm.preset("gpt2-small")
    sites = _sites(node, bw="1Gb/s")
    s = pm.MultiSiteStrategy(pm.Strategy(dp=8, micro_batch=8), sync="diloco", outer_precision="fp4")
    h = pm.inner_steps_for(model, sites, s, target=0.9)
    cu = [pm.predict_multisite(model, sites, s.replace(inner_steps=k)).compute_utilization for k in (h - 1, h)]
    assert cu[0] < 0.9 <= cu[1]
    p = pm.predict_multisite(model, sites, s)  # H = 1: one step, one sync
    inner, sync = p.inner_step_s["s0"], p.outer_sync_s
    assert h == math.ceil(0.9 * sync / (0.1 * inner))
    with pytest.raises(InvalidInputError, match="sync='diloco'"):
        pm.inner_steps_for(model, sites, pm.Strategy(dp=8, micro_batch=8), target=0.9)


# --- describing sites ----------------------------------------------------------------------------


SITES_TOML = """
name = "two regions"
[[sites]]
name = "us"
cluster = "dgx-h100"
nodes = 2
price_usd_per_gpu_hour = 3.0
[[sites]]
name = "eu"
cluster = "h200"
gpus_per_node = 8
[[sites]]
name = "asia"
cluster = "dgx-a100-80gb"
[wan]
bandwidth = "100Gb/s"
latency = "35ms"
[[wan.links]]
sites = ["us", "asia"]
bandwidth = "10Gb/s"
latency = "80ms"
curve = "wan.csv"
"""


def test_sites_toml(tmp_path):
    (tmp_path / "wan.csv").write_text(
        "collective,scope,size_bytes,time_s\nall_reduce,cross-site,1000000,0.2\nall_reduce,cross-site,1000000,0.3\n"
        "all_reduce,cross-site,100000000,1.0\nall_reduce,inter,1000000,0.001\n")
    path = tmp_path / "sites.toml"
    path.write_text(SITES_TOML)
    sites = pm.multi_cluster(str(path))
    assert sites.name == "two regions" and sites.names == ("us", "eu", "asia")
    assert sites.n_gpus == 16 + 8 + 8
    assert sites.site("us").price_usd_per_gpu_hour == 3.0
    assert sites.site("eu").cluster.gpu.name != sites.site("us").cluster.gpu.name
    assert sites.link("eu", "us").bw_bytes_per_s == pytest.approx(12.5e9)
    link = sites.link("asia", "us")
    assert (link.bw_bytes_per_s, link.latency_s) == (pytest.approx(GBPS10), pytest.approx(0.08))
    assert link.curve == ((1e6, 0.25), (1e8, 1.0))  # the cross-site all-reduce rows, median per size
    with pytest.raises(InvalidInputError, match="pm.multi_cluster"):
        pm.cluster(str(path))


def test_iperf_reports():
    text = ("[ ID] Interval           Transfer     Bitrate         Retr\n"
            "[SUM]   0.00-10.00  sec  11.0 GBytes  9.45 Gbits/sec  120             sender\n"
            "[SUM]   0.00-10.04  sec  11.0 GBytes  9.41 Gbits/sec                  receiver\n")
    ping = "rtt min/avg/max/mdev = 70.1/72.0/75.3/1.2 ms\n"
    link = pm.wan_from_iperf(text, ping=ping)
    assert link.bw_bytes_per_s == pytest.approx(9.41e9 / 8)
    assert link.latency_s == pytest.approx(0.036)
    report = json.dumps({"end": {"sum_received": {"bits_per_second": 2e9},
                                 "streams": [{"sender": {"mean_rtt": 60000}}]}})
    link = pm.wan_from_iperf(report)
    assert (link.bw_bytes_per_s, link.latency_s) == (pytest.approx(2.5e8), pytest.approx(0.03))
    assert pm.wan_from_iperf(text, latency="10ms").latency_s == pytest.approx(0.01)
    with pytest.raises(InvalidInputError, match="'latency' is needed"):
        pm.wan_from_iperf(text)
    iperf2 = "[  3]  0.0- 5.0 sec   560 MBytes   940 Mbits/sec\n[SUM]  0.0-10.0 sec  2.2 GBytes  1.88 Gbits/sec\n"
    assert pm.wan_from_iperf(iperf2, latency="5ms").bw_bytes_per_s == pytest.approx(1.88e9 / 8)
    with pytest.raises(InvalidInputError, match="no iperf rate line"):
        pm.wan_from_iperf("nothing here")


def test_plan_over_sites_adds_per_site_costs(node):
    model = pm.preset("gpt2-small")
    us = pm.cluster("dgx-h100")
    from perfmodel.hardware.sites import Site

    sites = pm.multi_cluster([Site("us", us, price_usd_per_gpu_hour=2.0), Site("eu", us)],
                             wan=pm.wan_link("10Gb/s", "40ms"))
    s = pm.MultiSiteStrategy(pm.Strategy(dp=8, micro_batch=8), sync="diloco", inner_steps=50)
    plan = pm.plan_multisite(model, sites, s, steps=1000, trials=200)
    step = pm.predict_multisite(model, sites, s).step_time
    od = plan[plan["scenario"] == "on-demand"].set_index("site")
    assert od.loc["us", "expected_time_s"] == pytest.approx(1000 * step)
    assert od.loc["us", "expected_cost_usd"] == pytest.approx(2.0 * 8 * 1000 * step / 3600)
    assert od.loc["all sites", "expected_cost_usd"] == pytest.approx(od.loc["us", "expected_cost_usd"]
                                                                     + od.loc["eu", "expected_cost_usd"])


# --- bad input ---------------------------------------------------------------------------------


def test_bad_input_names_the_field(node, tmp_path):
    with pytest.raises(InvalidInputError, match="wan bandwidth"):
        pm.wan_link("fast", "10ms")
    with pytest.raises(InvalidInputError, match="'wan latency' must be a duration"):
        pm.wan_link("10Gb/s", -1.0)
    with pytest.raises(InvalidInputError, match="at least 2 Site"):
        pm.multi_cluster([node], wan=pm.wan_link("10Gb/s", "1ms"))
    with pytest.raises(InvalidInputError, match="no link joins sites 'a' and 'c'"):
        pm.multi_cluster([node] * 3, names=["a", "b", "c"], links={("a", "b"): pm.wan_link("1Gb/s", "1ms")})
    with pytest.raises(UnknownNameError, match="unknown sync 'dilco'; did you mean 'diloco'"):
        pm.MultiSiteStrategy(sync="dilco")
    with pytest.raises(UnknownNameError, match="outer_precision"):
        pm.MultiSiteStrategy(sync="diloco", outer_precision="int4")
    with pytest.raises(InvalidInputError, match="need sync='diloco'"):
        pm.MultiSiteStrategy(inner_steps=10)
    with pytest.raises(InvalidInputError, match="'overlap_steps'=10 must be < inner_steps=10"):
        pm.MultiSiteStrategy(sync="diloco", inner_steps=10, overlap_steps=10)
    with pytest.raises(InvalidInputError, match="'target' compute utilisation"):
        pm.required_wan_bandwidth("gpt2-small", _sites(node), pm.Strategy(dp=8), target=1.5)
    with pytest.raises(InvalidInputError, match="'site' strategies must name every site: 's1'"):
        pm.predict_multisite("gpt2-small", _sites(node), {"s0": pm.Strategy(dp=8)})
    with pytest.raises(InvalidInputError, match=r"'profile' names sites that are not in .*\['mars'\]"):
        pm.predict_multisite("gpt2-small", _sites(node), pm.Strategy(dp=8), profile={"mars": "h100-sxm5-80gb"})
    bad = tmp_path / "bad.toml"
    bad.write_text('[[sites]]\nname = "a"\ncluster = "h200"\nprice = 2\n')
    with pytest.raises(InvalidInputError, match=r"\[\[sites\]\] #1: unknown field 'price'"):
        pm.multi_cluster(str(bad))
    bad.write_text('[[sites]]\nname = "a"\ncluster = "h200"\n[[sites]]\nname = "b"\ncluster = "h200"\n'
                   '[wan]\nbandwidth = "1Gb/s"\n')
    with pytest.raises(InvalidInputError, match=r"\[wan\]: missing field 'latency'"):
        pm.multi_cluster(str(bad))
    zero = pm.MultiSiteStrategy(pm.Strategy(dp=8, zero=1))
    with pytest.raises(UnsupportedError, match="zero=1"):
        pm.predict_multisite("gpt2-small", _sites(node), zero)
    assert np.isfinite(pm.predict_multisite("gpt2-small", _sites(node), pm.Strategy(dp=8)).step_time)


def test_cross_site_calibration_scope_and_iperf_table(tmp_path):
    pytest.importorskip("torch")
    from calibration.collectives import Layout, main

    layout = Layout(rank=0, world_size=6, hosts=("a", "a", "b", "b", "c", "c"),
                    sites=("us", "us", "us", "us", "eu", "eu"))
    assert layout.scope_groups("cross-site") == [((0, 4),)]  # one rank per site
    assert Layout(rank=0, world_size=2, hosts=("a", "b")).scope_groups("cross-site") == []
    report = tmp_path / "iperf.txt"
    report.write_text("[SUM]   0.00-10.04  sec  11.0 GBytes  9.41 Gbits/sec                  receiver\n")
    assert main(["--iperf", str(report), "--latency", "35ms", "--out", str(tmp_path / "wan")]) == 0
    (tmp_path / "sites.toml").write_text('[[sites]]\nname = "a"\ncluster = "h200"\n[[sites]]\nname = "b"\n'
                                         'cluster = "h200"\n' + (tmp_path / "wan" / "wan.toml").read_text())
    link = pm.multi_cluster(str(tmp_path / "sites.toml")).wan
    assert (link.bw_bytes_per_s, link.latency_s) == (pytest.approx(9.41e9 / 8), pytest.approx(0.035))


def test_streaming_diloco_simulated_bandwidth_table():
    """Douillard et al. 2025 (arXiv:2501.18512) Table 4, priced by the same functions (docs/datacenters.md).

    The table gives the smallest bandwidth of a ~x1.2 grid reaching each utilisation, so a
    faithful model lands within about a grid step of it.
    """
    from perfmodel.validate.multisite import compare

    table = compare()
    diloco = table[table["method"] != "data-parallel"]
    assert diloco["ratio"].between(0.65, 1.25).all()
    assert abs(np.log(diloco["ratio"]).median()) < 0.1
    points = (diloco["ours_cu_at_paper_gbps"] - diloco["target_cu"]) * 100
    assert abs(points.median()) <= 3.0 and (points.abs() <= 3.0).mean() >= 0.75


def test_sites_command(tmp_path, capsys):
    from perfmodel.cli import main

    path = tmp_path / "sites.toml"
    path.write_text('[[sites]]\nname = "us"\ncluster = "dgx-h100"\n[[sites]]\nname = "eu"\ncluster = "dgx-h100"\n'
                    '[wan]\nbandwidth = "10Gb/s"\nlatency = "40ms"\n')
    assert main(["sites", "--sites", str(path), "--model", "gpt2-small", "--sync", "diloco", "--inner-steps", "50",
                 "--outer-precision", "int8", "--target", "0.9", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    s = pm.MultiSiteStrategy(pm.Strategy(dp=8), sync="diloco", inner_steps=50, outer_precision="int8")
    assert out["compute_utilization"] == pytest.approx(
        pm.predict_multisite("gpt2-small", str(path), s).compute_utilization)
    assert out["inner_steps_for_target"] == pm.inner_steps_for("gpt2-small", str(path), s, target=0.9)
    assert main(["sites", "--sites", str(path), "--sync", "diloco", "--overlap-steps", "3"]) == 2
    assert "'overlap_steps'=3 must be < inner_steps=1" in capsys.readouterr().err


def test_cross_site_rows_are_no_level_of_a_site_profile():
    import pandas as pd

    from perfmodel.fit.comm import clean_table

    table = pd.DataFrame({"collective": ["all_reduce"] * 2, "scope": ["cross-site", "inter"],
                          "group_size": [2, 2], "nodes": [2, 2], "size_bytes": [1e6, 1e6], "time_s": [0.1, 1e-3]})
    rows, rejected = clean_table(table)
    assert list(rows["scope"]) == ["inter"] and sum(rejected.values()) == 1
