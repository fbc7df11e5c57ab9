"""One formula, one implementation: the symbolic and heterogeneous paths give ``predict``'s step.

``symbolic_step_time`` runs the pricing functions on sympy inputs and ``predict_mixed`` prices its
gradient exchange with the core's DDP; both must equal ``predict`` for every bundled profile and
for profiles whose host terms are set (what a profile fitted from whole steps carries).
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest

import perfmodel as pm
from perfmodel.analysis.hetero import predict_mixed
from perfmodel.analysis.symbolic import symbol, symbolic_step_time
from perfmodel.profiles.profile import list_profiles, load_profile

MODEL = pm.transformer(layers=2, hidden=256, heads=4, seq=256, vocab=8192)
FREE = ("micro_batch", "dp", "micro_batches")


def _precision(prof) -> str:
    """A mixed precision the profile's GPU runs (fp32 on GPUs without 16-bit tensor cores)."""
    peak = pm.cluster(prof.gpu).gpu.peak_flops
    return "bf16-mixed" if "bf16" in peak else "fp16-mixed" if "fp16" in peak else "fp32"


def _with_host(prof, **host):
    return dataclasses.replace(prof, name=prof.name + "+host", host={**prof.host, **host})


def _profiles():
    bundled = [load_profile(name) for name in list_profiles()]
    h200 = load_profile("h200-sxm-141gb")
    return bundled + [
        _with_host(h200, cpu_extra_per_kernel_s=2e-5),  # a profile fitted from the default calibration grid
        _with_host(h200, serial=True, cpu_extra_per_kernel_s=3e-6, in_step_compute_factor=1.3,
                   side_by_side_factor=1.7, step_extra_s=2e-4, ddp_bucket_extra_s=5e-5),  # a CPU host's terms
    ]


PROFILES = _profiles()


@pytest.mark.parametrize("prof", PROFILES, ids=[p.name for p in PROFILES])
def test_symbolic_step_time_equals_predict(prof):
    cluster = pm.cluster(prof.gpu, 1, 2)
    s = pm.Strategy(dp=2, micro_batch=4, global_batch=16, precision=_precision(prof))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a profile of another GPU than the cluster's warns once
        expected = pm.predict(MODEL, cluster, s, profile=prof).step_time
        # every symbol free where host terms are set; micro_batch alone elsewhere (sympy's Max is slow)
        free = FREE if prof.name.endswith("+host") else ("micro_batch",)
        expr = symbolic_step_time(MODEL, cluster, s, free=free, profile=prof)
    value = float(expr.subs({symbol("micro_batch"): 4, symbol("dp"): 2, symbol("micro_batches"): 2}))
    assert value == pytest.approx(expected, rel=1e-9)


def test_symbolic_step_time_includes_the_host_terms():
    """gpt2-small at micro-batch 8 with 20 us of module/autograd CPU per kernel: launch-bound phases
    grow by it in both paths (38.74 ms without it, 42.58 ms with it on the bundled H200 profile)."""
    base = load_profile("h200-sxm-141gb")
    host = _with_host(base, cpu_extra_per_kernel_s=2e-5)
    s = pm.Strategy(micro_batch=8)
    plain, slow = (float(symbolic_step_time("gpt2-small", "h200", s, free=(), profile=p)) for p in (base, host))
    assert slow > plain * 1.05
    assert slow == pytest.approx(pm.predict("gpt2-small", "h200", s, profile=host).step_time, rel=1e-9)


@pytest.mark.parametrize("options", [dict(compile=True, loss="fused"), dict(compile=True, recompute="full")])
def test_symbolic_step_time_equals_predict_under_torch_compile(options):
    """The fused kernels torch.compile runs (sizes of the free micro-batch among them) price alike."""
    cluster = pm.cluster("h100-sxm5-80gb", 1, 2)
    s = pm.Strategy(dp=2, micro_batch=4, global_batch=16, **options)
    expr = symbolic_step_time(MODEL, cluster, s, free=("micro_batch",))
    assert float(expr.subs({symbol("micro_batch"): 4})) == pytest.approx(pm.predict(MODEL, cluster, s).step_time,
                                                                         rel=1e-9)


@pytest.mark.parametrize("prof", PROFILES, ids=[p.name for p in PROFILES])
def test_mixed_workers_of_one_type_equal_predict(prof):
    s = pm.Strategy(micro_batch=4, precision=_precision(prof))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        row = predict_mixed(MODEL, {prof.gpu: 4}, s, profile={prof.gpu: prof}, mode="equal").iloc[0]
        ref = pm.predict(MODEL, pm.cluster(prof.gpu, nodes=4), s.replace(dp=4), profile=prof)
    assert row.step_time_s == pytest.approx(ref.step_time, rel=1e-9)
    assert row.comm_s == pytest.approx(ref.breakdown["dp_comm"], rel=1e-9, abs=1e-15)
