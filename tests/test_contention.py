"""Co-located jobs on one device: hand-worked sharing, MIG scaling, memory, errors."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.analysis import mig
from perfmodel.analysis.contention import solve_sharing
from perfmodel.analysis.interference import load_interference, table_from_dict
from perfmodel.core.errors import InvalidInputError, ProfileError, UnknownNameError, UnsupportedError

GPU_TABLE = load_interference("gpu-default")
BIG = pm.transformer(layers=4, hidden=8192, heads=64, seq=2048, vocab=32768)  # GEMM-bound
S = pm.Strategy(micro_batch=4)


@pytest.mark.parametrize("k", [2, 3, 5])
def test_k_compute_bound_jobs_time_sliced_take_k_times_plus_switching(k):
    # always ready (no free time): each gets 1/k of the device and loses 5% per slice to switching
    step = solve_sharing([[1.0, 0.0, 0.0]] * k, [0.0] * k, GPU_TABLE, slots=1.0, switch=0.05)
    np.testing.assert_allclose(step, k * 1.05, rtol=1e-9)


@pytest.mark.parametrize("k", [2, 3])
def test_k_identical_gemm_bound_predictions_time_sliced_at_least_k_times_solo(k):
    r = pm.predict_shared([(BIG, S)] * k, "h100", mode="time-slice")
    solo = pm.predict(BIG, "h100", S).step_time
    # no idle launch gaps here: each waits for the k - 1 others and loses 5% per slice switching
    assert all(j.slowdown >= k and j.step_time >= k * solo for j in r.jobs)
    assert [j.slowdown for j in r.jobs] == pytest.approx([k * 1.05] * k)
    assert r.throughput == pytest.approx(sum(1 / j.slowdown for j in r.jobs))


def test_time_slice_slowdown_depends_on_the_others_busy_fraction():
    # A: 1 s device + 3 s host; B: 1 s device only. B always ready: A waits its whole turn,
    # D_A = 2, T_A = 5, p_A = 2/5; B finds A ready 40% of the time: T_B = 1.4.
    step = solve_sharing([[1.0, 0, 0], [1.0, 0, 0]], [3.0, 0.0], GPU_TABLE, slots=1.0, switch=0.0)
    np.testing.assert_allclose(step, [5.0, 1.4], rtol=1e-6)


def test_mps_same_class_shares_different_classes_overlap():
    both_compute = solve_sharing([[1.0, 0, 0], [1.0, 0, 0]], [0, 0], GPU_TABLE, slots=2.0, switch=0.0)
    np.testing.assert_allclose(both_compute, [2.0, 2.0])
    mixed = solve_sharing([[1.0, 0, 0], [0, 1.0, 0]], [0, 0], GPU_TABLE, slots=2.0, switch=0.0)
    np.testing.assert_allclose(mixed, [1.0, 1.0])  # roofline default: GEMM beside a copy is not slowed
    table = table_from_dict({"coefficients": {"compute|memory": 0.2, "memory|compute": 0.5}})
    np.testing.assert_allclose(solve_sharing([[1.0, 0, 0], [0, 1.0, 0]], [0, 0], table, 2.0, 0.0), [1.2, 1.5])


def test_jobs_with_a_share_of_a_hosts_cores_still_run_beside_each_other():
    # two one-thread compute jobs on 2 cores, given 2/3 of a core between them by other users: each
    # holds its own core 1/3 of the time, so waits 2 / (2/3) = 3x and runs beside the other 1/3 of
    # its time: with compute|compute 0.3, 3 * (1 + 0.3 / 3) = 3.3 (taken as 2/3 of one core: 3.0)
    table = table_from_dict({"coefficients": {"compute|compute": 0.3}})
    jobs = [[1.0, 0, 0], [1.0, 0, 0]]
    np.testing.assert_allclose(solve_sharing(jobs, [0, 0], table, 2 / 3, 0.0, units=2), [3.3, 3.3], rtol=1e-9)
    np.testing.assert_allclose(solve_sharing(jobs, [0, 0], table, 2 / 3, 0.0), [3.0, 3.0], rtol=1e-9)
    # units as many as the slots: the same as without them (3 jobs on 2 cores: each waits 1.5x and
    # always has one of the other two beside it, 1 + 0.3)
    three = [[1.0, 0, 0]] * 3
    np.testing.assert_allclose(solve_sharing(three, [0] * 3, table, 2.0, 0.0, units=2),
                               solve_sharing(three, [0] * 3, table, 2.0, 0.0), rtol=1e-12)
    np.testing.assert_allclose(solve_sharing(three, [0] * 3, table, 2.0, 0.0), 1.5 * 1.3, rtol=1e-9)


def test_other_users_work_fills_the_units_the_jobs_leave():
    # 2 cores, two always-busy compute jobs given 2/3 of a core between them, 5 other sessions: while
    # one runs, the other job is beside it 1/3 of the time and other users' work the remaining 2/3:
    # 3 * (1 + 0.3 / 3 + 0.1 * 2 / 3) = 3.5 with compute|compute 0.3 and compute|other 0.1
    table = table_from_dict({"coefficients": {"compute|compute": 0.3, "compute|other": 0.1}})
    jobs = [[1.0, 0, 0], [1.0, 0, 0]]
    np.testing.assert_allclose(solve_sharing(jobs, [0, 0], table, 2 / 3, 0.0, units=2, foreign=5), [3.5, 3.5])
    # alone on an otherwise idle host nothing is beside it; with one other session always beside it
    np.testing.assert_allclose(solve_sharing([jobs[0]], [0], table, 2.0, 0.0, foreign=0.0), [1.0])
    np.testing.assert_allclose(solve_sharing([jobs[0]], [0], table, 2.0, 0.0, foreign=1.0), [1.1])
    # half a session's worth keeps the spare core busy half the time; one device unit has no spare
    np.testing.assert_allclose(solve_sharing([jobs[0]], [0], table, 2.0, 0.0, foreign=0.5), [1.05])
    np.testing.assert_allclose(solve_sharing([jobs[0]], [0], table, 1.0, 0.0, foreign=3.0), [1.0])
    assert table.coefficient("compute", "other") == 0.1
    with pytest.raises(UnknownNameError, match="kernel class"):
        table.coefficient("other", "compute")


def test_mps_beats_time_slicing_for_jobs_with_idle_gaps():
    jobs = [("gpt2-small", pm.Strategy(micro_batch=1))] * 2
    ts = pm.predict_shared(jobs, "h100", mode="time-slice")
    mps = pm.predict_shared(jobs, "h100", mode="mps")
    assert all(1.0 < m.slowdown < t.slowdown for m, t in zip(mps.jobs, ts.jobs))
    assert mps.throughput > ts.throughput


def test_mig_slice_prices_as_the_scaled_profile():
    gpu = pm.load_gpu("h100")
    inst = mig.mig_profile(gpu, "1g.10gb")
    whole = pm.load_profile("h100-sxm5-80gb")
    before = whole.to_dict()
    part = mig.slice_profile(whole, gpu, inst)
    assert whole.to_dict() == before  # the loaded profile is untouched
    assert part.entry("gemm:bf16")["params"]["R"] == pytest.approx(whole.entry("gemm:bf16")["params"]["R"] * 16 / 132)
    assert part.entry("gemm:bf16")["params"]["sms"] == 16
    assert part.entry("copy:fp32:fwd")["params"]["beta"] == pytest.approx(whole.entry("copy:fp32:fwd")["params"]["beta"] * 8)
    g = mig.slice_gpu(gpu, inst)
    assert (g.sm_count, g.mem_bytes, g.mem_bw_bytes_per_s) == (16, gpu.mem_bytes / 8, gpu.mem_bw_bytes_per_s / 8)
    r = pm.predict_shared([("gpt2-small", S)], "h100", mode="mig", mig_profile="1g.10gb")
    direct = pm.predict("gpt2-small", mig.slice_cluster(gpu, inst), S, profile=part)
    assert r.jobs[0].step_time == pytest.approx(direct.step_time)
    assert r.jobs[0].instance == "1g.10gb" and r.jobs[0].gpu_share == pytest.approx(16 / 132)
    assert r.jobs[0].slowdown > 1.0


def test_mig_default_is_the_equal_split_that_holds_the_jobs():
    assert mig.equal_split("h100-sxm5-80gb", 7).name == "1g.10gb"
    assert mig.equal_split("h100-sxm5-80gb", 2).name == "3g.40gb"
    assert mig.equal_split("a100-sxm4-40gb", 3).name == "2g.10gb"
    r = pm.predict_shared([("gpt2-small", pm.Strategy(micro_batch=1))] * 7, "h100", mode="mig")
    assert {j.instance for j in r.jobs} == {"1g.10gb"}


def test_h200_instances_price_by_their_listed_sms():
    # nvidia-smi mig -lgip on an H200 (data/mig_profiles.csv): a 1g.35gb holds 26 SMs, a 1g.18gb 16
    assert {n: p.sms for n, p in mig.mig_profiles("h200-sxm-141gb").items()} == {
        "1g.18gb": 16, "1g.35gb": 26, "2g.35gb": 32, "3g.71gb": 60, "4g.71gb": 64, "7g.141gb": 132}
    assert mig.equal_split("h200-sxm-141gb", 7).name == "1g.18gb"
    small, wide = (pm.predict_shared([("gpt2-small", S)], "h200", mode="mig", mig_profile=n).jobs[0]
                   for n in ("1g.18gb", "1g.35gb"))
    assert (small.gpu_share, wide.gpu_share) == (pytest.approx(16 / 132), pytest.approx(26 / 132))
    assert wide.step_time < small.step_time


def test_memory_fits_alone_but_not_together():
    job = ("gpt2-xl", pm.Strategy(micro_batch=8))
    alone = pm.predict(*job[:1], "h100", job[1])
    n = int(80e9 // alone.peak_memory) + 1
    r = pm.predict_shared([job] * n, "h100")
    assert alone.fits and all(j.fits for j in r.jobs)
    assert not r.fits and r.memory_bytes > r.memory_capacity


def test_bad_mode_names_the_valid_ones():
    with pytest.raises(UnknownNameError, match="mode 'gang'.*mig, mps, time-slice"):
        pm.predict_shared(["gpt2-small"], "h100", mode="gang")


def test_bad_mig_profiles_name_the_valid_ones():
    with pytest.raises(UnknownNameError, match="MIG profile of h100-sxm5-80gb '2g.5gb'.*1g.10gb"):
        pm.predict_shared(["gpt2-small"], "h100", mode="mig", mig_profile="2g.5gb")
    with pytest.raises(UnsupportedError, match="t4 has no MIG profile table.*h100-sxm5-80gb"):
        pm.predict_shared(["gpt2-small"], "t4", mode="mig")
    with pytest.raises(UnsupportedError, match="4g.40gb, 4g.40gb need 8/7 compute"):
        pm.predict_shared(["gpt2-small"] * 2, "h100", mode="mig", mig_profile="4g.40gb")
    with pytest.raises(UnsupportedError, match="8 jobs do not fit.*at most 7"):
        pm.predict_shared(["gpt2-small"] * 8, "h100", mode="mig")
    with pytest.raises(InvalidInputError, match="one name or one per job"):
        pm.predict_shared(["gpt2-small"] * 2, "h100", mode="mig", mig_profile=["1g.10gb"])
    with pytest.raises(InvalidInputError, match="applies to mode='mig' only"):
        pm.predict_shared(["gpt2-small"], "h100", mig_profile="1g.10gb")


def test_bad_jobs_and_tables():
    with pytest.raises(InvalidInputError, match="non-empty list"):
        pm.predict_shared([], "h100")
    with pytest.raises(InvalidInputError, match="'slots' must be a number > 0"):
        pm.predict_shared(["gpt2-small"], "h100", slots=0)
    with pytest.raises(ProfileError, match="'a\\|b' with a, b in compute, memory, launch"):
        table_from_dict({"coefficients": {"gemm|copy": 1.0}})
    with pytest.raises(UnknownNameError, match="interference table.*cpu, cpu-busy, gpu-default"):
        load_interference("nope")


def test_predictions_are_accepted_as_jobs():
    p = pm.predict("gpt2-small", "h100", S)
    a = pm.predict_shared([p, p], "h100")
    b = pm.predict_shared([("gpt2-small", S)] * 2, "h100")
    assert a.jobs[0].step_time == pytest.approx(b.jobs[0].step_time)
