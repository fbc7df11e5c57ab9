"""The host cost a whole step adds around its kernels, fitted to tiny-model steps."""

import numpy as np
import pandas as pd
import pytest

import perfmodel as pm
from perfmodel.costs.compute import phase_time
from perfmodel.fit.overhead import fit_step_overhead, kernel_count
from perfmodel.profile import Profile
from perfmodel.workload.step import step_kernels

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
