"""Transient (spot / preemptible) training: intervals, closed form, Monte Carlo, cost."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

import numpy as np
import pytest

from perfmodel.core.errors import InvalidInputError, UnknownNameError
from perfmodel.analysis.transient import (
    Exponential,
    PiecewiseHazard,
    Weibull,
    expected_revocations,
    expected_time,
    expected_time_async,
    load_prices,
    load_revocation,
    mtbf_from_monthly_interruption,
    plan_training,
    simulate,
    simulate_time,
    young_daly_interval,
)
from perfmodel.analysis.transient.prices import gpu_key
from perfmodel.report.transient_plots import plot_time_distribution

# --- checkpoint interval: golden values by hand -------------------------------------------


def test_young_interval_by_hand():
    # √(2 δ M) = √(2 · 2 · 100) = 20
    assert young_daly_interval(2.0, 100.0, method="young") == pytest.approx(20.0)


def test_daly_interval_by_hand():
    # δ=2, M=100: δ/2M = 0.01; 20 · (1 + 0.1/3 + 0.01/9) − 2 = 18.688889
    assert young_daly_interval(2.0, 100.0) == pytest.approx(18.688888889, rel=1e-9)
    # δ=50, M=1e4: √(1e6)=1000; δ/2M=0.0025; 1000 · (1 + 0.05/3 + 0.0025/9) − 50 = 966.944444
    assert young_daly_interval(50.0, 1e4, method="daly") == pytest.approx(966.9444444, rel=1e-9)


def test_daly_interval_is_mtbf_when_checkpoint_exceeds_twice_mtbf():
    assert young_daly_interval(300.0, 100.0) == 100.0


def test_exact_interval_minimises_the_closed_form():
    delta, m = 60.0, 7200.0
    tau = young_daly_interval(delta, m, method="exact")
    grid = np.linspace(0.5 * tau, 1.5 * tau, 2001)
    per_work = np.expm1((grid + delta) / m) / grid  # cost per unit of work
    assert abs(grid[per_work.argmin()] - tau) <= grid[1] - grid[0]
    # Young and Daly approximate it for δ << M
    assert young_daly_interval(delta, m) == pytest.approx(tau, rel=0.01)


def test_interval_broadcasts():
    out = young_daly_interval(np.array([2.0, 8.0]), 100.0, method="young")
    np.testing.assert_allclose(out, [20.0, 40.0])


# --- closed form ---------------------------------------------------------------------------


def test_expected_time_by_hand():
    # (M + R)(e^{(τ+δ)/M} − 1) W/τ = 110 · (e^{0.22} − 1) · 50
    by_hand = 110.0 * (math.exp(0.22) - 1.0) * 50
    got = expected_time(1000.0, mtbf_s=100.0, checkpoint_s=2.0, restart_s=10.0, interval_s=20.0)
    assert got == pytest.approx(by_hand, rel=1e-12)
    assert got == pytest.approx(1353.42202, rel=1e-8)


def test_expected_time_last_segment_holds_the_remainder():
    # 50 full segments + one of 10 s work: + 110 · (e^{0.12} − 1)
    by_hand = 110.0 * ((math.exp(0.22) - 1.0) * 50 + (math.exp(0.12) - 1.0))
    got = expected_time(1010.0, mtbf_s=100.0, checkpoint_s=2.0, restart_s=10.0, interval_s=20.0)
    assert got == pytest.approx(by_hand, rel=1e-12)


def test_expected_time_without_revocations_is_work_plus_checkpoints():
    got = expected_time(1000.0, mtbf_s=1e13, checkpoint_s=2.0, restart_s=10.0, interval_s=20.0)
    assert got == pytest.approx(1000.0 + 50 * 2.0, rel=1e-6)


def test_expected_time_broadcasts_over_arrays():
    got = expected_time(np.array([1000.0, 2000.0]), mtbf_s=np.array([[100.0], [200.0]]),
                        checkpoint_s=2.0, restart_s=10.0, interval_s=20.0)
    assert got.shape == (2, 2)
    assert got[0, 1] == pytest.approx(2 * got[0, 0])


def test_expected_revocations_by_hand():
    got = expected_revocations(1000.0, mtbf_s=100.0, checkpoint_s=2.0, interval_s=20.0)
    assert got == pytest.approx(50 * (math.exp(0.22) - 1.0), rel=1e-12)


# --- Monte Carlo against the closed form ---------------------------------------------------


def _agree(samples, expected, sigmas=4.0):
    se = samples.std(ddof=1) / math.sqrt(samples.size)
    assert abs(samples.mean() - expected) <= sigmas * se, (samples.mean(), expected, se)
    assert abs(samples.mean() / expected - 1.0) < 0.02


def test_monte_carlo_mean_matches_closed_form_sync():
    work, m, n, delta, restart = 36000.0, 8 * 3600.0, 4, 60.0, 300.0
    sim = simulate(work, revocation=m, workers=n, checkpoint_s=delta, restart_s=restart,
                   trials=20000, seed=1)
    closed = expected_time(work, mtbf_s=m / n, checkpoint_s=delta, restart_s=restart,
                           interval_s=sim.interval_s)
    _agree(sim.times_s, closed)
    _agree(sim.revocations.sum(axis=1).astype(float),
           expected_revocations(work, mtbf_s=m / n, checkpoint_s=delta, interval_s=sim.interval_s))


def test_monte_carlo_per_worker_rates_use_the_summed_rate():
    mtbfs = [3600.0 * 10, 3600.0 * 20, 3600.0 * 40]
    cluster = 1.0 / sum(1.0 / m for m in mtbfs)
    times = simulate_time(20000.0, revocation=mtbfs, workers=3, checkpoint_s=30.0,
                          restart_s=200.0, interval_s=900.0, trials=20000, seed=2)
    _agree(times, expected_time(20000.0, mtbf_s=cluster, checkpoint_s=30.0, restart_s=200.0,
                                interval_s=900.0))


def test_monte_carlo_general_path_matches_closed_form():
    # Weibull with shape 1 is exponential but goes through the age-based sampler
    work, m = 20000.0, 5000.0
    times = simulate_time(work, revocation=Weibull(scale_s=m, shape=1.0), workers=2,
                          checkpoint_s=20.0, restart_s=100.0, interval_s=500.0, trials=20000,
                          seed=3)
    _agree(times, expected_time(work, mtbf_s=m / 2, checkpoint_s=20.0, restart_s=100.0,
                                interval_s=500.0))


def test_monte_carlo_async_matches_renewal_limit():
    work, m, restart = 200 * 3600.0, 8 * 3600.0, 1800.0
    sim = simulate(work, revocation=m, workers=4, checkpoint_s=30.0, restart_s=restart,
                   interval_s=3600.0, trials=4000, seed=4, mode="async")
    closed = expected_time_async(work, mtbf_s=m, checkpoint_s=30.0, restart_s=restart,
                                 interval_s=3600.0)
    # W / (M/(M+R)) + 200 checkpoints of 30 s
    assert closed == pytest.approx(work * (m + restart) / m + 200 * 30.0)
    assert abs(sim.times_s.mean() / closed - 1.0) < 0.01
    # each worker is revoked about W'/(M+R) times
    assert sim.revocations.mean() == pytest.approx(closed / (m + restart), rel=0.05)


def test_async_is_faster_than_sync_rollback():
    kw = dict(revocation=3600.0 * 6, workers=8, checkpoint_s=60.0, restart_s=600.0,
              trials=2000, seed=5)
    sync = simulate_time(50000.0, mode="sync", **kw)
    asyn = simulate_time(50000.0, mode="async", **kw)
    assert asyn.mean() < sync.mean()
    assert np.all(sync >= 50000.0) and np.all(asyn >= 50000.0)


def test_monte_carlo_is_seeded():
    kw = dict(revocation=3600.0, workers=2, checkpoint_s=10.0, restart_s=60.0, trials=500)
    a = simulate_time(7200.0, seed=7, **kw)
    np.testing.assert_array_equal(a, simulate_time(7200.0, seed=7, **kw))
    assert not np.array_equal(a, simulate_time(7200.0, seed=8, **kw))


def test_preemptible_limit_caps_lifetimes_and_simulates():
    life = PiecewiseHazard((0.0, 3600.0), (1e-4, 1e-5), max_lifetime_s=86400.0)
    rng = np.random.default_rng(0)
    ages = np.full(10000, 80000.0)
    resid = life.sample_residual(ages, rng)
    assert resid.max() <= 6400.0 + 1e-9
    times = simulate_time(3 * 86400.0, revocation=life, workers=4, checkpoint_s=60.0,
                          restart_s=300.0, trials=300, seed=0)
    assert times.min() > 3 * 86400.0


# --- lifetime models -----------------------------------------------------------------------


def test_mean_lifetimes_by_hand():
    # ∫₀³⁶⁰⁰ e^{-t/3600} dt + e^{-1} · 7200 = 3600 (1 + e^{-1})
    pw = PiecewiseHazard((0.0, 3600.0), (1 / 3600, 1 / 7200))
    assert pw.mean_lifetime_s == pytest.approx(3600 * (1 + math.exp(-1)))
    # capped exponential: M (1 − e^{-L/M})
    assert Exponential(3600.0, max_lifetime_s=3600.0).mean_lifetime_s == pytest.approx(
        3600 * (1 - math.exp(-1)))
    # Weibull k=2, η=1: Γ(3/2) = √π / 2
    assert Weibull(1.0, 2.0).mean_lifetime_s == pytest.approx(math.sqrt(math.pi) / 2)


def test_sampled_lifetimes_have_the_model_mean():
    pw = PiecewiseHazard((0.0, 3600.0, 79200.0), (1e-4, 2e-5, 1e-4), max_lifetime_s=86400.0)
    draws = pw.sample_residual(np.zeros(200000), np.random.default_rng(1))
    se = draws.std() / math.sqrt(draws.size)
    assert abs(draws.mean() - pw.mean_lifetime_s) < 4 * se


def test_mtbf_from_monthly_interruption_by_hand():
    # 20 % revoked within 30 days: M = 30 d / −ln(0.8)
    assert mtbf_from_monthly_interruption(0.2) == pytest.approx(30 * 86400 / -math.log(0.8))


# --- data tables ---------------------------------------------------------------------------


def test_bundled_tables_carry_sources_and_dates():
    for table in (load_prices(), load_revocation()):
        assert table["source"].map(bool).all()
        assert table["date"].map(bool).all()
    rev = load_revocation()
    assert set(rev["quality"]) <= {"documented", "illustrative"}
    assert rev.loc[rev["quality"] == "illustrative", "source"].str.contains("illustrative").all()
    prices = load_prices()
    guessed = prices["spot_quality"] == "illustrative"
    assert prices.loc[guessed, "spot_source"].str.contains("illustrative").all()
    v100 = prices[(prices.provider == "gcp") & (prices.gpu == "V100")].iloc[0]
    assert (v100.on_demand_usd_per_gpu_hour, v100.spot_usd_per_gpu_hour) == (2.48, 0.74)


def test_user_prices_merge_over_bundled(tmp_path):
    user = tmp_path / "prices.toml"
    user.write_text(
        '[[price]]\nprovider = "gcp"\nregion = "us-central1"\ngpu = "V100"\n'
        "on_demand_usd_per_gpu_hour = 2.0\nspot_usd_per_gpu_hour = 0.5\n"
        'source = "my invoice"\ndate = "2026-11-01"\n'
        '[[price]]\nprovider = "lab"\nregion = "basement"\ngpu = "H200"\n'
        "on_demand_usd_per_gpu_hour = 1.0\nspot_usd_per_gpu_hour = 1.0\n"
        'source = "power bill"\ndate = "2026-11-01"\n'
    )
    table = load_prices(user)
    v100 = table[(table.provider == "gcp") & (table.gpu == "V100")]
    assert len(v100) == 1 and v100.iloc[0].spot_usd_per_gpu_hour == 0.5
    assert len(table) == len(load_prices()) + 1


@pytest.mark.parametrize(("load", "text", "match"), [
    (load_prices, '[[price]]\nprovider = "x"\nregion = "y"\ngpu = "V100"\n'
                  "on_demand_usd_per_gpu_hour = 2.0\nspot_usd_per_gpu_hour = -1.0\n",
     r"x/y/V100: 'spot_usd_per_gpu_hour' must be a finite number >= 0: got -1.0"),
    (load_revocation, '[[revocation]]\nprovider = "x"\nregion = "y"\ngpu = "V100"\n'
                      'model = "piecewise"\nedges_s = [0.0, 10.0]\nrates_per_s = [1e-4, -1e-4]\n',
     r"'rates_per_s' must be finite and >= 0 \(revocations per second\): got -0.0001 at index 1"),
])
def test_negative_price_or_revocation_rate_is_rejected(tmp_path, load, text, match):
    user = tmp_path / "user.toml"
    user.write_text(text)
    with pytest.raises(InvalidInputError, match=match):
        load(user)


def test_gpu_names_match_whole_tokens():
    known = ["A100", "V100", "H100"]
    assert gpu_key("dgx-a100-80gb", known) == "A100"
    assert gpu_key("Tesla V100-SXM2", known) == "V100"
    assert gpu_key("A10", known) is None


# --- bad input ------------------------------------------------------------------------------


def test_negative_mtbf_names_field():
    with pytest.raises(InvalidInputError, match=r"'Exponential.mtbf_s' must be > 0: got -5"):
        Exponential(-5)
    with pytest.raises(InvalidInputError, match=r"'mtbf_s' must be finite and > 0 \(seconds\)"):
        expected_time(100.0, mtbf_s=-1.0, checkpoint_s=1.0, restart_s=1.0)


def test_checkpoint_longer_than_mtbf_is_rejected():
    with pytest.raises(InvalidInputError, match=r"'checkpoint_s'=150 s must be shorter than the "
                                                r"mean time between revocations .*\(100 s\)"):
        expected_time(1000.0, mtbf_s=100.0, checkpoint_s=150.0, restart_s=1.0)
    # four workers of MTBF 400 s revoke the cluster every 100 s on average
    with pytest.raises(InvalidInputError, match=r"of the cluster of 4 worker\(s\) \(100 s\)"):
        simulate_time(1000.0, revocation=400.0, workers=4, checkpoint_s=150.0, restart_s=1.0)


def test_zero_workers_and_bad_mode_are_rejected():
    with pytest.raises(InvalidInputError, match=r"'workers' must be an integer >= 1: got 0"):
        simulate_time(100.0, revocation=1000.0, workers=0, checkpoint_s=1.0, restart_s=1.0)
    with pytest.raises(UnknownNameError, match=r"unknown mode 'batch'.*\(known: async, sync\)"):
        simulate_time(100.0, revocation=1000.0, workers=1, checkpoint_s=1.0, restart_s=1.0,
                      mode="batch")
    with pytest.raises(InvalidInputError, match=r"one model per worker \(2\): got 3"):
        simulate_time(100.0, revocation=[1e3, 1e3, 1e3], workers=2, checkpoint_s=1.0,
                      restart_s=1.0)


def test_empty_cluster_is_rejected():
    model = NS(params=1e6)
    with pytest.raises(InvalidInputError, match=r"'cluster.nodes' \(workers\) must be an integer "
                                                r">= 1: got 0"):
        plan_training(model, NS(gpu="V100", nodes=0), None, 10, step_time_s=1.0)
    with pytest.raises(InvalidInputError, match=r"'cluster.worker_gpus' must list one GPU name "
                                                r"per worker"):
        plan_training(model, NS(worker_gpus=[]), None, 10, step_time_s=1.0)


def test_unknown_gpu_lists_known_ones_and_says_how_to_add_it(tmp_path):
    with pytest.raises(UnknownNameError, match=r"unknown GPU in the prices table 'TPU'.*known: .*"
                                               r"prices=PATH, one \[\[price\]\] table"):
        plan_training(NS(params=1e6), NS(gpu="TPU"), None, 10, step_time_s=1.0)
    # with its price given, the next table it lacks says the same of itself
    own = tmp_path / "prices.toml"
    own.write_text('[[price]]\nprovider = "gcp"\nregion = "us-central1"\ngpu = "TPU"\n'
                   'on_demand_usd_per_gpu_hour = 1.0\nspot_usd_per_gpu_hour = 0.4\nsource = "test"\n'
                   'date = "2026-12-07"\n')
    with pytest.raises(UnknownNameError, match=r"revocation table 'TPU'.*revocation=PATH, one \[\[revocation\]\]"):
        plan_training(NS(params=1e6), NS(gpu="TPU"), None, 10, step_time_s=1.0, prices=str(own))


def test_checkpoint_without_params_needs_bytes():
    with pytest.raises(InvalidInputError, match=r"'checkpoint_bytes' is required when the model "
                                                r"has no 'params'"):
        plan_training(object(), NS(gpu="V100"), None, 10, step_time_s=1.0)


# --- plan: cost arithmetic by hand ----------------------------------------------------------


@pytest.fixture
def tables(tmp_path):
    prices = tmp_path / "prices.toml"
    prices.write_text('[[price]]\nprovider = "test"\nregion = "r1"\ngpu = "V100"\n'
                      "on_demand_usd_per_gpu_hour = 2.0\nspot_usd_per_gpu_hour = 0.5\n"
                      '[[price]]\nprovider = "test"\nregion = "r1"\ngpu = "K80"\n'
                      "on_demand_usd_per_gpu_hour = 1.0\nspot_usd_per_gpu_hour = 0.25\n")
    rev = tmp_path / "rev.toml"
    rev.write_text('[[revocation]]\nprovider = "test"\nregion = "r1"\ngpu = "V100"\n'
                   "mtbf_s = 1e15\nreplacement_wait_s = 100.0\nrestart_s = 50.0\n"
                   "storage_bw_bytes_per_s = 1e9\n"
                   '[[revocation]]\nprovider = "test"\nregion = "r1"\ngpu = "K80"\n'
                   "mtbf_s = 7200.0\nreplacement_wait_s = 100.0\nrestart_s = 50.0\n"
                   "storage_bw_bytes_per_s = 1e9\n")
    return prices, rev


def test_plan_cost_by_hand_without_revocations(tables):
    prices, rev = tables
    plan = plan_training(None, NS(gpu="V100", nodes=4, gpus_per_node=2), None, 3600,
                         step_time_s=1.0, checkpoint_bytes=1e9, prices=prices, revocation=rev,
                         provider="test", trials=200).set_index("scenario")
    # on-demand: 3600 s x 8 GPUs x $2/GPU-h = $16
    assert plan.loc["on-demand", "expected_cost_usd"] == pytest.approx(16.0)
    # spot: one segment (interval > work) = 3600 s work + 1 s checkpoint (1 GB at 1 GB/s)
    spot = plan.loc["spot sync, Daly interval"]
    assert spot.expected_time_s == pytest.approx(3601.0)
    assert spot.expected_cost_usd == pytest.approx(3601 / 3600 * 8 * 0.5)
    assert spot.savings_pct == pytest.approx(100 * (1 - 3601 / 3600 * 4.0 / 16.0))
    assert spot.on_demand_cost_usd == pytest.approx(16.0)
    assert spot.revocations_expected == 0.0
    assert list(plan.index) == ["on-demand", "spot sync, Daly interval",
                                "spot sync, optimal interval", "spot async (parameter server)"]


def test_plan_cost_counts_gpu_hours_less_replacement_waits(tables):
    prices, rev = tables
    kw = dict(step_time_s=2.0, checkpoint_bytes=2e9, prices=prices, revocation=rev,
              provider="test", region="r1", interval_s=600.0, trials=2000, seed=3)
    plan = plan_training(None, NS(gpu="K80", nodes=3), None, 5000, **kw).set_index("scenario")
    row = plan.loc["spot sync, given interval"]
    # same Monte Carlo by hand: δ = 2 s, downtime = 100 + 50 + 2 (restore) s
    sim = simulate(10000.0, revocation=[Exponential(7200.0)] * 3, workers=3, checkpoint_s=2.0,
                   restart_s=152.0, interval_s=600.0, trials=2000, seed=3)
    gpu_s = sim.times_s.mean() * 3 - 100.0 * sim.revocations.sum(axis=1).mean()
    assert row.expected_cost_usd == pytest.approx(gpu_s / 3600 * 0.25)
    assert row.expected_time_s == pytest.approx(sim.times_s.mean())
    assert row.p90_s == pytest.approx(np.percentile(sim.times_s, 90))
    assert row.closed_form_time_s == pytest.approx(
        expected_time(10000.0, mtbf_s=2400.0, checkpoint_s=2.0, restart_s=152.0, interval_s=600.0))


def test_plan_accepts_a_gpu_type_per_worker(tables):
    prices, rev = tables
    plan = plan_training(NS(params=1e8), NS(worker_gpus=["V100", "V100", "K80"]), None, 1000,
                         step_time_s=1.0, prices=prices, revocation=rev, provider="test",
                         trials=300).set_index("scenario")
    assert plan.loc["on-demand", "gpu"] == "K80+V100"
    assert plan.loc["on-demand", "workers"] == 3
    assert plan.loc["on-demand", "expected_cost_usd"] == pytest.approx(1000 / 3600 * (2 + 2 + 1))
    # only the K80 is ever revoked (V100 MTBF 1e15 s)
    assert plan.loc["spot sync, Daly interval", "revocations_expected"] > 0


def test_plan_with_bundled_tables_runs():
    plan = plan_training(NS(params=1.5e9), NS(gpu="V100", nodes=8), None, 20000,
                         step_time_s=0.5, trials=500)
    assert (plan["p99_s"] >= plan["p50_s"]).all()
    assert (plan.loc[1:, "expected_cost_usd"] < plan.loc[0, "expected_cost_usd"]).all()
    assert plan.loc[0, "provider"] == "gcp"


def test_plan_on_the_default_gpu_with_bundled_tables():
    import perfmodel as pm

    plan = plan_training(pm.preset("gpt2-small"), pm.cluster("hgx-h200"), pm.Strategy(dp=8), 1000, trials=200)
    on_demand = plan.iloc[0]
    assert on_demand["provider"] == "aws" and on_demand["region"] == "us-east-2"
    assert on_demand["expected_cost_usd"] == pytest.approx(on_demand["expected_time_s"] * 8 / 3600 * 5.408)


# --- plot -----------------------------------------------------------------------------------


def test_plot_time_distribution_writes_png(tmp_path):
    times = simulate_time(7200.0, revocation=3600.0, workers=2, checkpoint_s=10.0,
                          restart_s=60.0, trials=500)
    out = plot_time_distribution(times, tmp_path / "times.png", on_demand_s=7200.0)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(InvalidInputError, match=r"'trials' must be a non-empty array"):
        plot_time_distribution([], tmp_path / "empty.png")


def test_a_run_meeting_too_many_revocations_is_refused_not_simulated_for_ever():
    from perfmodel.analysis.transient.montecarlo import simulate

    with pytest.raises(InvalidInputError, match=r"would meet about 1.01e\+06 revocations"):
        simulate(1e9, revocation=1e3, workers=1, checkpoint_s=1.0, restart_s=10.0, interval_s=100.0, trials=10)


def test_segments_no_server_outlives_are_refused_not_simulated_for_ever():
    from perfmodel.analysis.transient import Exponential, simulate_time

    with pytest.raises(InvalidInputError, match="outlasts the servers' max_lifetime_s = 100 s"):
        simulate_time(3600, revocation=Exponential(7200, max_lifetime_s=100), workers=1, checkpoint_s=10,
                      restart_s=60, interval_s=500, trials=10)
    with pytest.raises(InvalidInputError, match="'seed' must be an integer >= 0"):
        simulate_time(3600, revocation=7200, workers=1, checkpoint_s=10, restart_s=60, trials=10, seed=-1)


def test_closed_forms_never_return_nan_or_inf():
    from perfmodel.analysis.transient import expected_time, young_daly_interval

    assert expected_time(100, mtbf_s=1e4, checkpoint_s=1, restart_s=1, interval_s=1e9) == pytest.approx(
        expected_time(100, mtbf_s=1e4, checkpoint_s=1, restart_s=1, interval_s=100))  # one short segment
    with pytest.raises(InvalidInputError, match="practically never finishes"):
        expected_time(1e9, mtbf_s=100, checkpoint_s=60, restart_s=120, interval_s=1e6)
    tiny = young_daly_interval(1e-14, 3600, method="exact")
    assert tiny == pytest.approx(math.sqrt(2 * 1e-14 * 3600), rel=1e-6)
    with pytest.raises(InvalidInputError, match="'checkpoint_s' must be a number of seconds"):
        young_daly_interval("abc", 3600)
