"""Loaded profiles are read-only: one bundled profile is shared by every caller."""

import copy
from dataclasses import replace

import pytest

import perfmodel as pm


@pytest.mark.parametrize("change", [
    lambda p: p.host.__setitem__("cpu_per_kernel_s", 123.0),
    lambda p: p.compute["gemm:bf16"]["params"].__setitem__("R", 1.0),
    lambda p: p.collectives["intra"].pop("all_reduce"),
    lambda p: p.meta.update(x=1),
])
def test_a_loaded_profile_cannot_be_changed_in_place(change):
    profile = pm.load_profile("h200-sxm-141gb")
    with pytest.raises(TypeError, match="read-only"):
        change(profile)
    assert "x" not in pm.load_profile("h200-sxm-141gb").meta


def test_a_derived_profile_is_a_new_one_and_the_bundled_one_is_unchanged():
    bundled = pm.load_profile("h200-sxm-141gb")
    before = bundled.host.get("cpu_per_kernel_s")
    derived = replace(bundled, host={**bundled.host, "cpu_per_kernel_s": 5e-5})
    assert derived.host["cpu_per_kernel_s"] == 5e-5
    assert pm.load_profile("h200-sxm-141gb").host.get("cpu_per_kernel_s") == before
    plain = copy.deepcopy(bundled.compute)  # a deep copy is plain, mutable data
    plain["gemm:bf16"]["params"]["R"] = 1.0
    assert bundled.compute["gemm:bf16"]["params"]["R"] != 1.0
