"""The slowest of a synchronous step's GPUs sets its pace (perfmodel/parallel/stragglers.py)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import integrate, stats

import perfmodel as pm
from perfmodel.core.errors import InvalidInputError
from perfmodel.hardware.gpu import GPU
from perfmodel.parallel.stragglers import FLEET_SPREAD, expected_max_normal, slowest_device_lag


def exact_expected_max(n: int) -> float:
    """E[max of n standard normals] by integrating n x φ(x) Φ(x)^(n-1)."""
    f = lambda x: n * x * stats.norm.pdf(x) * stats.norm.cdf(x) ** (n - 1)  # noqa: E731
    return integrate.quad(f, -12, 12)[0]


def test_the_fleet_spread_is_the_published_variation_read_as_a_normal_sigma():
    # Sinha et al. SC22: 8% = 4 IQR / median; a normal's IQR is 1.349 sigma
    assert FLEET_SPREAD == pytest.approx(0.08 / (4 * 1.349))
    assert FLEET_SPREAD == pytest.approx(0.01483, abs=1e-5)


@pytest.mark.parametrize("n, tolerance", [(2, 0.05), (8, 0.01), (64, 0.01), (1024, 0.01)])
def test_blom_is_close_to_the_exact_expected_maximum(n, tolerance):
    assert expected_max_normal(n) == pytest.approx(exact_expected_max(n), rel=tolerance)


def test_one_device_waits_for_nobody_and_more_wait_longer():
    assert expected_max_normal(1) == 0.0
    lags = slowest_device_lag(np.array([1, 8, 64, 512, 4096, 16384]))
    assert lags[0] == 0.0 and np.all(np.diff(lags) > 0)
    assert lags[1] == pytest.approx(FLEET_SPREAD * 1.4342, rel=1e-3)  # 8 GPUs: about 2.1%
    assert lags[-1] < 0.06  # 16,384 GPUs: under 6%
    with pytest.raises(InvalidInputError):
        expected_max_normal(0)


def test_the_symbolic_form_agrees_with_the_numeric_one():
    import sympy as sp

    n = sp.Symbol("n", positive=True)
    expr = expected_max_normal(n)
    for k in (2, 8, 100):
        assert float(expr.subs(n, k)) == pytest.approx(expected_max_normal(k), rel=1e-9)


def _forward(cluster, strategy):
    return pm.predict("llama-3-8b", cluster, strategy).breakdown["forward"]


def test_eight_data_parallel_gpus_run_at_the_slowest_ones_pace():
    s = pm.Strategy(micro_batch=1, recompute="full")
    alone = _forward(pm.cluster("h100"), s)  # one GPU: its own pace
    eight = _forward(pm.cluster("dgx-h100"), s.replace(zero=3))  # the same kernels on each of 8 GPUs
    assert eight / alone == pytest.approx(1 + slowest_device_lag(8), rel=1e-9)


def test_a_device_file_without_spread_takes_none():
    c = pm.cluster("dgx-h100")
    steady = replace(c, node=replace(c.node, gpu=replace(c.node.gpu, speed_spread=0.0)))
    s = pm.Strategy(micro_batch=1, recompute="full", zero=3)
    assert _forward(steady, s) == pytest.approx(_forward(pm.cluster("h100"), pm.Strategy(micro_batch=1,
                                                                                         recompute="full")))
    p = pm.predict("llama-3-8b", steady, s)
    assert sum(p.breakdown.values()) == pytest.approx(p.step_time)


@pytest.mark.parametrize("bad", [-0.01, 0.9, math.nan, "1%", True])
def test_a_bad_spread_is_refused_naming_the_field(bad):
    with pytest.raises(InvalidInputError, match="speed_spread"):
        GPU(name="x", peak_flops={"bf16": 1e15}, mem_bw_bytes_per_s=3e12, mem_bytes=80e9, sm_count=132,
            speed_spread=bad)


def test_the_cpu_host_file_has_no_spread(tmp_path):
    from perfmodel.validate.interval_rows import CPU_RUNS

    assert pm.cluster(str(CPU_RUNS / "cpu-host.toml")).gpu.speed_spread == 0.0


def test_the_prediction_says_how_much_slower_its_kernels_run():
    s = pm.Strategy(micro_batch=1, recompute="full")
    assert pm.predict("llama-3-8b", pm.cluster("h100"), s).slowest_device_lag == 0.0
    eight = pm.predict("llama-3-8b", pm.cluster("dgx-h100"), s.replace(zero=3))
    assert eight.slowest_device_lag == pytest.approx(slowest_device_lag(8))
    assert eight.to_dict()["slowest_device_lag"] == eight.slowest_device_lag
    from perfmodel.report.tables import prediction_table

    assert "the slowest of the 8 GPUs sets the pace" in prediction_table(eight)


def test_asynchronous_workers_wait_for_nobody():
    from perfmodel.hardware.cloud import server_vm

    c = pm.cluster("v100", nodes=4, servers=server_vm(vcpus=4, provider="gcp", count=1))
    p = pm.predict("resnet-cifar32", c, pm.Strategy(micro_batch=128, precision="fp32", optimizer="sgd",
                                                     framework="tensorflow", ps_servers=1, ps_async=True))
    assert p.slowest_device_lag == 0.0


def test_exposed_host_time_hides_the_first_of_the_growth():
    from perfmodel.parallel.stragglers import lagged_seconds

    assert lagged_seconds(10.0, 0.1, 0.02) == pytest.approx((0.1, 0.0))  # 0.2 s more kernels, 0.1 s was idle
    assert lagged_seconds(10.0, 0.5, 0.02) == pytest.approx((0.0, 0.3))  # all of it under the host's time
    s = pm.Strategy(micro_batch=1)  # a launch-bound step: the host issues kernels slower than they run
    one = pm.predict("gpt2-small", pm.cluster("h100"), s)
    eight = pm.predict("gpt2-small", pm.cluster("dgx-h100"), s)
    assert one.breakdown["host_overhead"] > 0
    kernels = one.breakdown["forward"] + one.breakdown["backward"]
    grown = (eight.breakdown["forward"] + eight.breakdown["backward"] + eight.breakdown["host_overhead"]
             - kernels - one.breakdown["host_overhead"])
    assert grown == pytest.approx(max(slowest_device_lag(8) * kernels - one.breakdown["host_overhead"], 0.0),
                                  abs=1e-12)


def test_a_cluster_can_name_its_fleet_spread():
    s = pm.Strategy(micro_batch=1, recompute="full", zero=3)
    screened = pm.predict("llama-3-8b", pm.cluster("dgx-h100", speed_spread=0.0), s)
    wide = pm.predict("llama-3-8b", pm.cluster("dgx-h100", speed_spread=0.03), s)
    assert screened.slowest_device_lag == 0.0
    assert wide.slowest_device_lag == pytest.approx(0.03 * expected_max_normal(8))
    assert wide.step_time > pm.predict("llama-3-8b", pm.cluster("dgx-h100"), s).step_time > screened.step_time
    with pytest.raises(InvalidInputError, match="speed_spread"):
        pm.cluster("dgx-h100", speed_spread=0.9)


def test_the_command_line_takes_the_spread(capsys):
    from perfmodel.cli import main

    args = ["predict", "--model", "gpt2-small", "--gpu", "dgx-h100", "--micro-batch", "8", "--json"]
    assert main(args + ["--speed-spread", "0"]) == 0
    import json

    assert json.loads(capsys.readouterr().out)["slowest_device_lag"] == 0.0
    with pytest.raises(SystemExit):
        main(args + ["--speed-spread", "-1"])
    assert main(args + ["--speed-spread", "0.9"]) == 2
    assert "speed_spread" in capsys.readouterr().err
