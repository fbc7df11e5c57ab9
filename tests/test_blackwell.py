"""Blackwell in the catalog: the B200 (HGX/DGX B200) and the GB200 (NVL72), their nodes and how their
datasheet-scaled profiles take the published measurements there are (docs/hardware.md, "Blackwell")."""

from __future__ import annotations

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.core.errors import UnsupportedError
from perfmodel.costs.compute import kernel_time
from perfmodel.hardware import load_gpu
from perfmodel.profiles.datasheet import bundled_allreduce_entry, datasheet_profile
from perfmodel.profiles.profile import load_profile
from perfmodel.profiles.published import attention_flops, attention_rows, carried_attention
from perfmodel.profiles.mamf import calibrate_mamf, mamf_calibrates, mamf_fraction, own_gemm_dtypes
from perfmodel.profiles.reference import gemm_rate_at, mamf_row, measured_gemms
from perfmodel.validate.kernels import generation_checks
from perfmodel.workload.ops import Kernel

B200, GB200 = "b200-sxm-180gb", "gb200-186gb"


def test_catalog_entries():
    b, g = load_gpu("b200"), load_gpu("gb200")
    assert (b.name, g.name) == (B200, GB200)
    assert b.compute_capability == g.compute_capability == 10.0
    assert b.sm_count == 148 and b.mem_bytes == 182642 * 2**20  # what CUDA reports on a B200
    assert b.peak_flops["bf16"] == 2250e12 and g.peak_flops["bf16"] == 2500e12
    assert b.peak_flops["fp8"] == 2 * b.peak_flops["bf16"]
    dgx, nvl = pm.cluster("dgx-b200"), pm.cluster("gb200-nvl72")
    assert dgx.n_gpus == 8 and dgx.gpu.name == B200
    assert nvl.n_gpus == 72 and nvl.gpu.name == GB200  # one NVLink domain of 72


@pytest.mark.parametrize("gpu", [B200, GB200])
def test_bf16_gemm_runs_the_reference_fraction_of_its_mamf_times_the_boards_fp8_bias(gpu):
    """No bf16 GEMMs of either Blackwell GPU are published, fp8 ones are (Azure's, the B200's carried): at its own
    bf16 MAMF shape the GPU runs the fraction of MAMF the H200's fit runs at the H200's (the H100 row, the same
    die), times how much further below its fp8 MAMF the published fp8 rate runs than the H200's does."""
    h200 = load_profile("h200-sxm-141gb").compute
    ref_bf16, ref_fp8 = (mamf_fraction(h200, "h200-sxm-141gb", d) for d in ("bf16", "fp8"))
    assert 0.80 < ref_bf16 < 0.90 and 0.80 < ref_fp8 < 0.90  # the fits run 10-20% below a best-of-search rate
    own = load_profile(gpu).compute
    bias = mamf_fraction(own, gpu, "fp8") / ref_fp8
    assert 0.75 < bias < 0.95  # the search runs further above Azure's sustained fp8 rate on Blackwell
    # rel 1.5%: the bundled H200 profile is the fit after its published terms joined (two of its fractions here),
    # the Blackwell ones were scaled from it before
    assert mamf_fraction(own, gpu, "bf16") == pytest.approx(ref_bf16 * bias, rel=1.5e-2)


def test_blackwell_over_hopper_bf16_rate_is_near_xlas_measured_ratio():
    """XLA's matmul tables measure bf16 GEMMs of sm_100 and sm_90 with one generator: 1.82-2.12x at 4096^3 batches
    of 1-4. Priced by MAMF alone the profiles gave 2.25-2.49x (+17...+36%); with the fp8 bias, within 12%."""
    checks = generation_checks()
    assert set(checks.gpu) == {B200, GB200} and len(checks) == 6
    assert checks.error.abs().max() < 0.12
    assert (checks.predicted < 2.1).all()  # not the 2.5x the datasheet peak ratio gives


def test_mamf_calibration_moves_rates_and_leaves_published_gpus_alone():
    h200 = load_profile("h200-sxm-141gb")
    plain = datasheet_profile(B200, h200, published=False).compute
    row = mamf_row(B200, "bf16")
    scaled = dict(plain)
    calibrate_mamf(scaled, B200, h200.compute, h200.gpu)
    # the datasheet ratio alone would run the B200 at another fraction: the calibration moved it
    assert gemm_rate_at(scaled["gemm:bf16"], row) != pytest.approx(gemm_rate_at(plain["gemm:bf16"], row), rel=0.01)
    assert scaled["gemm:fp16"]["params"]["R"] / plain["gemm:fp16"]["params"]["R"] == pytest.approx(
        scaled["gemm:bf16"]["params"]["R"] / plain["gemm:bf16"]["params"]["R"])  # one tensor-core rate
    assert mamf_calibrates(B200, "bf16") and not mamf_calibrates("a100-sxm4-80gb", "bf16")
    assert not mamf_calibrates("h100-sxm5-80gb")  # Azure's fp8 and the published bf16 shapes set both
    a100 = datasheet_profile("a100-sxm4-80gb", h200, published=False).compute
    before = {k: dict(v["params"]) for k, v in a100.items() if k.startswith("gemm:")}
    calibrate_mamf(a100, "a100-sxm4-80gb", h200.compute, h200.gpu)  # Azure's GEMMs calibrate it: untouched
    assert {k: v["params"] for k, v in a100.items() if k.startswith("gemm:")} == before


def _rate_over_published(gpu: str) -> tuple[float, float]:
    """(median profile rate, median published rate) in fp8 over the published shapes of at least 4096^3."""
    rows = measured_gemms(gpu)
    rows = rows[(rows.dtype == "fp8") & (rows[["m", "n", "k"]] >= 4096).all(axis=1)]
    entry = load_profile(gpu).compute["gemm:fp8"]
    flops = 2.0 * rows.m * rows.n * rows.k
    return (float(np.median([gemm_rate_at(entry, r) for _, r in rows.iterrows()])),
            float(np.median(flops / rows.time_s)))


def test_fp8_gemms_are_azures_sustained_rates_not_themamf_fraction():
    """Azure's cuBLASLt fp8 GEMMs on the GB200 (random data, 10,000 warm-up calls) run 2.83-2.91 PFLOP/s at
    4096^3 and above, 80% of the 3.62 the MAMF search found: they set the fp8 rate, MAMF only the bf16 one."""
    assert own_gemm_dtypes(GB200) == {"fp8"} and not mamf_calibrates(GB200, "fp8") and mamf_calibrates(GB200, "bf16")
    fitted, published = _rate_over_published(GB200)
    assert 2.8e15 < published < 2.95e15
    assert fitted == pytest.approx(published, rel=0.03)


def test_the_b200_takes_the_gb200s_fp8_gemms_at_their_mamf_ratio():
    ratio = float(mamf_row(B200, "fp8").tflops) / float(mamf_row(GB200, "fp8").tflops)
    carried, donor = measured_gemms(B200), measured_gemms(GB200)
    assert len(carried) == len(donor) and (carried.dtype == "fp8").all()
    assert carried.time_s.values == pytest.approx(donor.time_s.values / ratio)
    fitted, published = _rate_over_published(B200)
    assert fitted == pytest.approx(published, rel=0.03) and published < _rate_over_published(GB200)[1]


def _fa2_fwdbwd_tflops(gpu: str) -> float:
    p = load_profile(gpu)
    size = {"batch": 2.0, "heads": 16.0, "kv_heads": 16.0, "seq": 8192.0, "head_dim": 128.0, "causal": True}
    fwd, bwd = (float(kernel_time(p, Kernel("sdpa", "sdpa", w, size, variant=f"fa2.{w}", dtype="bf16"))[0])
                for w in ("fwd", "bwd"))
    return float(attention_flops(2, 16, 8192, 128, True, "fwd")) * 3.5 / (fwd + bwd) / 1e12


def test_flash_attention_2_runs_near_its_hopper_rate():
    """Azure's same FlashAttention-2 benchmark: 373.9 TFLOP/s on a GB200 against 327.9 on an H100 (x1.14),
    where the datasheet peak ratio is 2.53: the carried curves keep the measured ratio."""
    donor, factor, _ = carried_attention(GB200, "fa2")
    assert donor == "h100-sxm5-80gb" and factor == pytest.approx(373.9 / 327.9)
    assert len(attention_rows(GB200, "fa2")) == len(attention_rows(donor, "fa2"))
    h100 = _fa2_fwdbwd_tflops("h100-sxm5-80gb")
    assert _fa2_fwdbwd_tflops(GB200) / h100 == pytest.approx(373.9 / 327.9, rel=0.05)
    assert _fa2_fwdbwd_tflops(B200) / h100 == pytest.approx(373.9 / 327.9 * 1965 / 2062, rel=0.05)


def test_flash_attention_3_is_refused_on_blackwell():
    with pytest.raises(UnsupportedError, match="Hopper GPUs only"):
        pm.predict("llama-3-8b", pm.cluster("dgx-b200"), pm.Strategy(attention="flash3", micro_batch=1))


def test_nvlink5_all_reduce_curve_is_the_gb200s():
    want = bundled_allreduce_entry("gb200")["params"]
    for gpu in (B200, GB200):
        assert load_profile(gpu).collectives["intra"]["all_reduce"]["params"] == want


def test_a_step_on_blackwell_is_faster_and_says_it_is_datasheet_scaled():
    s = pm.Strategy(framework="torchtitan", micro_batch=2, recompute="selective-op")
    h200 = pm.predict("llama-3-8b", pm.cluster("hgx-h200"), s)
    b200 = pm.predict("llama-3-8b", pm.cluster("dgx-b200"), s)
    fa2 = pm.predict("llama-3-8b", pm.cluster("dgx-b200"), pm.Strategy(framework="torchtitan", micro_batch=2,
                                                                      recompute="selective-op", attention="flash2"))
    assert 1.5 < h200.step_time / b200.step_time < 2.5
    assert b200.step_time < fa2.step_time  # FlashAttention-2 does not scale to Blackwell; cuDNN is priced so
    lo, hi = b200.interval
    assert (hi - lo) / b200.step_time > (h200.interval[1] - h200.interval[0]) / h200.step_time  # less known
