"""Optimizers by the states they keep and the bytes a step moves (costs/optimizers.py)."""

from __future__ import annotations

import pytest

import perfmodel as pm
from perfmodel.costs.compute import kernel_time
from perfmodel.costs.memory import model_state_bytes
from perfmodel.costs.optimizers import OPTIMIZER_BYTES
from perfmodel.errors import UnknownNameError
from perfmodel.profiles.profile import load_profile
from perfmodel.workload.ops import Kernel


def test_bytes_per_parameter_by_hand():
    # AdamW reads w, g, m, v and writes w, m, v; SGD w, g, m / w, m; RMSprop w, g, square_avg, buf / w, square_avg, buf
    assert OPTIMIZER_BYTES == {"adamw": 28.0, "sgd": 20.0, "rmsprop": 28.0}
    assert [model_state_bytes(optimizer=o)["optimizer"] for o in ("adamw", "sgd", "rmsprop")] == [8.0, 4.0, 8.0]


def test_rmsprop_runs_the_foreach_kernel_adamw_measured():
    prof = load_profile("h200-sxm-141gb")
    step = {o: kernel_time(prof, Kernel("optimizer", o, "opt", {"params": 25e6}, 1, 0.0, "fwd", "fp32"))[0]
            for o in OPTIMIZER_BYTES}
    assert step["sgd"] < step["adamw"]
    assert step["rmsprop"] >= step["adamw"]  # no fused RMSprop in torch: the foreach kernel, the same bytes


def test_the_strategy_names_the_optimizers_it_takes():
    s = pm.Strategy(micro_batch=64, optimizer="rmsprop", precision="fp16-mixed")
    assert pm.predict("efficientnet-b0", "v100-sxm2-32gb", s).step_time > 0
    with pytest.raises(UnknownNameError, match="known: adamw, rmsprop, sgd"):
        pm.Strategy(optimizer="lamb")
