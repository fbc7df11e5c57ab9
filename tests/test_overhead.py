"""The host cost a whole step adds around its kernels, fitted to tiny-model steps."""

import copy

import numpy as np
import pandas as pd
import pytest

import perfmodel as pm
from perfmodel.costs.compute import phase_time
from perfmodel.fit.overhead import fit_step_overhead, kernel_count
from perfmodel.profiles.profile import Profile
from perfmodel.workload.kernels import step_kernels

GPU = "h200-sxm-141gb"


def _tiny(layers):
    return pm.transformer(layers=layers, hidden=64, heads=2, seq=16, vocab=256)


def _rows(profile, per_kernel, per_step, layers=(1, 2, 4, 8)):
    rows = []
    for n in layers:
        base = pm.predict(_tiny(n), pm.cluster(GPU), pm.Strategy(dp=1, micro_batch=1), profile=profile).step_time
        rows.append({"op": "train_step", "phase": "step", "timing": "eager", "dtype": "bf16", "layers": n,
                     "hidden": 64, "heads": 2, "seq": 16, "vocab": 256, "batch": 1,
                     "time_s": base + per_step + per_kernel * kernel_count(_tiny(n), 1, "bf16-mixed")})
    return pd.DataFrame(rows)


def test_fit_recovers_a_known_per_kernel_and_per_step_cost():
    prof = pm.load_profile(GPU)
    found = fit_step_overhead(prof, _rows(prof, 7e-6, 4e-4), GPU)
    assert found["cpu_extra_per_kernel_s"] == pytest.approx(7e-6, rel=1e-6)
    assert found["step_extra_s"] == pytest.approx(4e-4, rel=1e-6)


def test_too_few_sizes_or_faster_steps_add_nothing():
    prof = pm.load_profile(GPU)
    assert fit_step_overhead(prof, _rows(prof, 7e-6, 4e-4, layers=(2,)), GPU) == {}
    found = fit_step_overhead(prof, _rows(prof, -1e-6, -1e-4), GPU)  # never makes a profile faster
    assert found["cpu_extra_per_kernel_s"] == 0.0 and found["step_extra_s"] == 0.0


def test_per_kernel_cost_adds_to_the_host_side_and_to_serial_walls():
    prof = pm.load_profile(GPU)
    fwd, _ = step_kernels(_tiny(2), 1)
    n = sum(np.asarray(k.count, float).sum() for k in fwd)
    extra = 1e-5
    plus = Profile(prof.name, prof.gpu, prof.compute, prof.collectives, {**prof.host, "cpu_extra_per_kernel_s": extra},
                   prof.meta)
    (_, g0, c0), (_, g1, c1) = phase_time(prof, fwd), phase_time(plus, fwd)
    assert float(c1 - c0) == pytest.approx(n * extra) and float(g1) == float(g0)
    serial = Profile(prof.name, prof.gpu, prof.compute, prof.collectives, {**prof.host, "serial": True}, prof.meta)
    serial_plus = Profile(prof.name, prof.gpu, prof.compute, prof.collectives,
                          {**prof.host, "serial": True, "cpu_extra_per_kernel_s": extra}, prof.meta)
    assert float(phase_time(serial_plus, fwd)[0] - phase_time(serial, fwd)[0]) == pytest.approx(n * extra)


def test_side_by_side_factor_scales_every_op_on_a_serial_host_only():
    prof = pm.load_profile(GPU)
    fwd, _ = step_kernels(_tiny(2), 1)

    def with_host(**host):
        return Profile(prof.name, prof.gpu, prof.compute, prof.collectives, {**prof.host, **host}, prof.meta)

    alone = phase_time(with_host(serial=True, cpu_extra_per_kernel_s=1e-5), fwd)
    shared = phase_time(with_host(serial=True, cpu_extra_per_kernel_s=1e-5, side_by_side_factor=1.5), fwd)
    assert [float(b) for b in shared] == pytest.approx([1.5 * float(a) for a in alone])
    gpu = phase_time(with_host(side_by_side_factor=1.5), fwd)  # GPUs are not shared by processes
    assert [float(b) for b in gpu] == pytest.approx([float(a) for a in phase_time(prof, fwd)])


def test_serial_host_fits_how_much_slower_kernels_run_inside_a_step():
    """On a CPU the wide rows separate a per-kernel cost from a slowdown of the kernels themselves."""
    gpu_prof = pm.load_profile(GPU)
    slow = copy.deepcopy(gpu_prof.compute)  # CPU-like arithmetic: the wide steps' kernels now take time
    for key, entry in slow.items():
        if key.startswith(("gemm:", "sdpa:")):
            entry["params"]["R"] /= 3000
    prof = Profile(gpu_prof.name, gpu_prof.gpu, slow, gpu_prof.collectives, {**gpu_prof.host, "serial": True},
                   gpu_prof.meta)
    shapes = [dict(layers=n, hidden=64, heads=2, seq=16, vocab=256, batch=1) for n in (1, 2, 4, 8)]
    shapes += [dict(layers=2, hidden=h, heads=4, seq=s, vocab=512, batch=2)
               for h, s in ((160, 48), (192, 64), (224, 96), (256, 32))]
    rows = []
    for shape in shapes:
        model = pm.transformer(**{k: v for k, v in shape.items() if k != "batch"})
        base = pm.predict(model, pm.cluster(GPU), pm.Strategy(dp=1, micro_batch=shape["batch"]),
                          profile=prof).step_time
        fwd, bwd = step_kernels(model, shape["batch"], precision="bf16-mixed")
        kernels_s = float(phase_time(prof, [k for k in fwd + bwd if k.cls == "gemm"])[1])  # GEMM seconds
        time_s = base + 3e-4 + 5e-6 * kernel_count(model, shape["batch"], "bf16-mixed") + 0.2 * kernels_s
        rows.append({"op": "train_step", "phase": "step", "timing": "eager", "dtype": "bf16", **shape,
                     "time_s": time_s})
    found = fit_step_overhead(prof, pd.DataFrame(rows), GPU)
    assert found["in_step_compute_factor"] == pytest.approx(1.2, rel=1e-3)
    assert found["cpu_extra_per_kernel_s"] == pytest.approx(5e-6, rel=1e-3)
    assert found["step_extra_s"] == pytest.approx(3e-4, rel=1e-2)
    # one wide step timed while the machine was busy (+25%) moves the factor less (soft-L1 loss; plain
    # least squares: 1.43)
    busy = pd.DataFrame(rows)
    busy.loc[len(busy) - 2, "time_s"] *= 1.25
    assert fit_step_overhead(prof, busy, GPU)["in_step_compute_factor"] == pytest.approx(1.2, abs=0.06)
    # the factor scales each GEMM's compute on that host, and nothing else
    fwd, _ = step_kernels(pm.transformer(layers=2, hidden=224, heads=4, seq=96, vocab=512), 2)
    gemms, others = [k for k in fwd if k.cls == "gemm"], [k for k in fwd if k.cls != "gemm"]
    slower = Profile(prof.name, prof.gpu, prof.compute, prof.collectives, {**prof.host, **found}, prof.meta)
    assert float(phase_time(slower, gemms)[1]) == pytest.approx(1.2 * float(phase_time(prof, gemms)[1]))
    assert float(phase_time(slower, others)[1]) == pytest.approx(float(phase_time(prof, others)[1]))
    # a GPU's rows are launch-bound: no factor there
    launch_bound = Profile(prof.name, prof.gpu, slow, prof.collectives, dict(gpu_prof.host), prof.meta)
    assert "in_step_compute_factor" not in fit_step_overhead(launch_bound, pd.DataFrame(rows), GPU)


def test_ddp_buckets_follow_pytorch_first_bucket_then_cap():
    from perfmodel.parallel.data import ddp_buckets

    assert [float(ddp_buckets(b, 25e6)) for b in (0, 2**19, 2**20, 2**20 + 1, 2**20 + 50e6)] == [0, 1, 1, 2, 3]


def test_ddp_overhead_is_the_per_bucket_gap_of_measured_steps_and_reaches_the_prediction():
    from perfmodel.parallel.data import ddp_buckets
    from perfmodel.fit.overhead import fit_ddp_overhead
    from perfmodel.validate.measured import Case

    gpu = pm.load_profile(GPU)
    prof = Profile(gpu.name, gpu.gpu, gpu.compute, gpu.collectives, {**gpu.host, "serial": True}, gpu.meta)
    cl = pm.cluster("dgx-h100")
    cases = []
    for layers, hidden in ((2, 256), (4, 1024)):
        model = pm.transformer(layers=layers, hidden=hidden, heads=4, seq=64, vocab=512)
        s = pm.Strategy(dp=8, micro_batch=2, precision="fp32")
        buckets = float(ddp_buckets(4.0 * model.params, 25 * 2**20))  # torch DDP's default bucket
        base = pm.predict(model, cl, s, profile=prof).step_time
        cases.append(Case(1, "tiny", model, cl, s, "step_time_s", base + 2e-3 * buckets))
    found = fit_ddp_overhead(prof, cases)
    assert found["ddp_bucket_extra_s"] == pytest.approx(2e-3, rel=1e-6)
    plus = Profile(prof.name, prof.gpu, prof.compute, prof.collectives, {**prof.host, **found}, prof.meta)
    for case in cases:  # the fitted term reproduces the measured steps on a serial host
        assert pm.predict(case.model, cl, case.strategy, profile=plus).step_time == pytest.approx(case.measured)
    on_gpu = Profile(prof.name, prof.gpu, prof.compute, prof.collectives, {**gpu.host, **found}, prof.meta)
    assert pm.predict(cases[0].model, cl, cases[0].strategy, profile=on_gpu).step_time < cases[0].measured
    assert fit_ddp_overhead(prof, [Case(1, "x", cases[0].model, cl, pm.Strategy(dp=1, micro_batch=2), "step_time_s",
                                        1.0)]) == {}  # no data-parallel step: nothing fitted
