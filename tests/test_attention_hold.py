"""Attention above the longest measured sequence (16k) is priced at the rate measured at 16k."""

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.costs.compute import SDPA_SEQ_MEASURED, held_sequence, kernel_time
from perfmodel.workload.ops import Kernel


def _sdpa(batch, seq, variant="fa2.fwd"):
    size = {"batch": float(batch), "heads": 32.0, "kv_heads": 8.0, "seq": float(seq), "head_dim": 128.0,
            "causal": 1.0}
    return Kernel("attn", "sdpa", "fwd", size, 1, 0.0, variant, "bf16")


def test_held_sequence_by_hand():
    size = {"batch": 1.0, "heads": 32.0, "seq": 65536.0, "head_dim": 128.0, "causal": 1.0}
    held, longer = held_sequence(size, {})
    assert SDPA_SEQ_MEASURED == 16384
    assert (held["batch"], held["seq"], longer) == (4.0, 16384.0, 4.0)  # 4 sequences of 16k, 4x the keys each
    assert held_sequence({**size, "seq": 8192.0}, {}) == ({**size, "seq": 8192.0}, 1.0)
    assert held_sequence(size, {"seq_max": 65536})[1] == 1.0  # a profile measured that far keeps its fit
    arrays, factor = held_sequence({**size, "batch": np.array([1.0, 2.0])}, {})
    assert np.allclose(arrays["batch"], [4.0, 8.0]) and factor == 4.0


@pytest.mark.parametrize("variant", ["fa2.fwd", "fa3.bwd", "cudnn.fwd", "fwd"])
def test_rate_above_16k_is_the_rate_at_16k(variant):
    p = pm.load_profile("h100-sxm5-80gb")
    long_s, _ = kernel_time(p, _sdpa(1, 32768, variant))
    same_rows, _ = kernel_time(p, _sdpa(2, 16384, variant))
    assert float(long_s) == pytest.approx(2 * float(same_rows), rel=1e-12)
    # the causal rate stays within 2% of the non-causal one measured at 16k (FlashAttention-2: 370 TFLOP/s)
    flops = 2 * 32 * 32768**2 * 128  # 4·b·h·s²·d, halved when causal
    if variant == "fa2.fwd":
        assert flops / float(long_s) / 1e12 < 380
