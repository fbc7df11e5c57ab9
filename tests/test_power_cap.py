"""The power-capped H100 of the TorchTitan paper's hosts: catalog entry, node, and the clock model."""

import dataclasses

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.core.errors import InvalidInputError
from perfmodel.costs.compute import kernel_time
from perfmodel.hardware import load_gpu, load_node
from perfmodel.hardware.catalog import gpu_from_dict
from perfmodel.profiles.power_cap import (burst_gemm, cube_law_ratio, measured_curves, power_capped_profile,
                                         sustained_clock_ratio, sustained_fraction, sustained_gemm)
from perfmodel.workload.ops import Kernel

CAPPED = "h100-sxm5-96gb-hbm2e-500w"
GiB = 2**30


@pytest.fixture(scope="module")
def profiles():
    return pm.load_profile(CAPPED), pm.load_profile("h100-sxm5-80gb")


def test_catalog_entry_has_the_published_figures():
    gpu = load_gpu(CAPPED)
    assert gpu.mem_bytes == 94 * GiB and gpu.mem_bw_bytes_per_s == 2.4e12
    assert gpu.power_limit_w == 500 and gpu.tdp_w == 700 and gpu.sm_count == 132
    assert gpu.peak("bf16") == load_gpu("h100-sxm5-80gb").peak("bf16")
    assert "torchtitan docs/performance.md" in gpu.source_of("power_limit_w")
    assert "2604.11391" in gpu.source_of("memory_usable")
    node = load_node("grand-teton-h100")
    assert (node.gpu.name, node.gpus_per_node, node.intra.name, node.nic.name, node.nics_per_node) == \
        (CAPPED, 8, "nvlink4-nvswitch", "eth400", 8)


def test_sustained_clock_by_hand():
    # Mayr et al. 2026 (arXiv 2603.16164) Table 4, H100 94 GB HBM2e: 27,705.3 tokens/s at 500 W, 30,271.0 at 700 W
    assert sustained_clock_ratio(CAPPED) == pytest.approx(27705.3 / 30271.0, rel=1e-9)
    assert sustained_clock_ratio("h100-sxm5-80gb") == 1.0  # runs at its TDP
    # (500 W / 700 W)^(1/3) = 0.8939: dynamic power ~ clock^3, where no curve is published
    assert cube_law_ratio(500, 700) == pytest.approx(0.893904, rel=1e-6)


def test_measured_curve_is_interpolated_and_cube_law_outside_it():
    gpu = load_gpu(CAPPED)
    at_450 = sustained_clock_ratio(dataclasses.replace(gpu, power_limit_w=450.0))
    assert at_450 == pytest.approx((24853.4 + 27705.3) / 2 / 30271.0, rel=1e-9)  # halfway between 400 and 500 W
    assert sustained_clock_ratio(dataclasses.replace(gpu, power_limit_w=150.0)) == pytest.approx(
        cube_law_ratio(150, 700))  # below the lowest measured limit
    watts, ratio, source = measured_curves()[CAPPED]
    assert watts[-1] == 700 and ratio[-1] == 1.0 and np.all(np.diff(ratio) > 0) and "2603.16164" in source
    # the cube law is within 2.5% of the measured curve from 400 to 700 W, far above it at 200 W (static power)
    assert np.all(np.abs(cube_law_ratio(watts[2:], 700) / ratio[2:] - 1) < 0.025)
    assert cube_law_ratio(200, 700) > 2 * ratio[0]


def _gemm(profile, n=8192):
    k = Kernel("mm", "gemm", "fwd", {"m": float(n), "n": float(n), "k": float(n)}, 1, 2.0 * n**3, "fwd", "bf16")
    return float(kernel_time(profile, k)[0])


def _copy(profile, elems=2**28):
    return float(kernel_time(profile, Kernel("cp", "copy", "fwd", {"x": float(elems)}, 1, 0.0, "fwd", "fp32"))[0])


def test_compute_bound_gemm_slower_by_the_clock_and_sustained_ratios(profiles):
    capped, full = profiles
    both = sustained_clock_ratio(CAPPED) * sustained_fraction(full)
    assert _gemm(capped) / _gemm(full) == pytest.approx(1 / both, rel=0.01)
    assert capped.meta["power_cap"]["clock_ratio"] == pytest.approx(sustained_clock_ratio(CAPPED))
    assert capped.meta["power_cap"]["sustained_fraction"] == pytest.approx(sustained_fraction(full))


def test_sustained_fraction_by_hand(profiles):
    _, full = profiles
    rate, size, dtype = sustained_gemm()
    # sustained.csv: 23 samples from 1 s on, 653-675 TFLOP/s at 1470-1545 MHz; the first (125 W) is the burst
    assert (dtype, size) == ("bf16", {"m": 8192.0, "n": 8192.0, "k": 8192.0})
    assert 653e12 < rate < 676e12
    assert burst_gemm() == pytest.approx(785.70e12, rel=1e-4)
    # one run's ratio, 664 / 786 = 0.845: a property of the die, whatever the bf16 curve of the profile
    assert sustained_fraction(full) == pytest.approx(rate / burst_gemm(), rel=1e-9)
    assert 0.83 < sustained_fraction(full) < 0.86
    slower = dataclasses.replace(full, compute={**full.compute, "gemm:bf16": {
        **full.compute["gemm:bf16"], "params": {**full.compute["gemm:bf16"]["params"],
                                                "R": 0.5 * full.compute["gemm:bf16"]["params"]["R"]}}})
    assert sustained_fraction(slower) == sustained_fraction(full)
    assert sustained_fraction(pm.load_profile("a100-sxm4-80gb")) == 1.0  # no sustained run of that die


def test_memory_bound_copy_slower_by_the_bandwidth_ratio(profiles):
    capped, full = profiles
    assert _copy(capped) / _copy(full) == pytest.approx(3.35 / 2.4, rel=0.01)


def test_reference_must_be_the_same_die_at_tdp():
    with pytest.raises(InvalidInputError, match="'reference' for h100-sxm5-96gb-hbm2e-500w must be the "
                                                "profile of 'h100-sxm5-80gb': got 'h200-sxm-141gb'"):
        power_capped_profile(CAPPED, pm.load_profile("h200-sxm-141gb"))


def test_power_limit_above_tdp_is_refused():
    data = {"peak_flops": {"bf16": "989TFLOPS"}, "memory_bandwidth": "2TB/s", "memory": "80GB",
            "sm_count": 132, "tdp_w": 700, "power_limit_w": 800}
    with pytest.raises(InvalidInputError, match="'power_limit_w' must be at most tdp_w=700: got 800"):
        gpu_from_dict(data, "x.toml", "x")


def test_torchtitan_paper_row_is_slower_on_its_own_hosts():
    m = dataclasses.replace(pm.preset("llama-3-8b"), seq=8192)
    s = pm.Strategy(dp=8, micro_batch=2, framework="torchtitan", recompute="selective-op")
    capped, full = (pm.predict(m, pm.cluster(n), s).step_time for n in ("grand-teton-h100", "dgx-h100"))
    # between the compute-bound slowdown (the clock, from the sustained rate) and the memory-bound one (the bandwidth)
    compute = sustained_clock_ratio(CAPPED) * sustained_fraction(pm.load_profile("h100-sxm5-80gb"))
    assert 0.99 / compute < capped / full < 3.35 / 2.4
