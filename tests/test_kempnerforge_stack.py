"""KempnerForge's stack: torchtitan's FSDP2 with its own tensor-parallel plan (one input all-gather per
column-parallel linear, the logits gathered for the loss), counted by hand."""

import dataclasses

import pytest

import perfmodel as pm
from perfmodel.core.errors import UnsupportedError
from perfmodel.costs.comm import hierarchical_time
from perfmodel.explore.stack_options import TRANSFORMER_FRAMEWORKS
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.tensor import loss_parallel_time, tp_comm_times
from perfmodel.predict import _collectives, default_profile
from perfmodel.workload.stacks import stack

MODEL = dataclasses.replace(pm.preset("llama-3-8b"), seq=4096)
CLUSTER = pm.cluster("hgx-h200")
LAY = {"tp": (4.0, 1.0)}


def _times(framework, recompute="none"):
    s = pm.Strategy(tp=4, dp=1, micro_batch=2, sequence_parallel=True, framework=framework, recompute=recompute)
    coll = _collectives(CLUSTER, default_profile(CLUSTER))
    c = StepConfig.from_strategy(s)
    return tp_comm_times(MODEL, coll, LAY, c, precision="bf16-mixed", recompute=recompute), coll, c


def test_record_says_what_its_code_does():
    kf = stack("kempnerforge")
    assert (kf.sharding, kf.reduce_bytes, kf.tp_input_gathers, kf.tp_regathers, kf.loss_parallel) == \
        ("fsdp2", 4.0, 5, 0, False)
    assert stack("torchtitan").tp_input_gathers == 2 and stack("torchtitan").loss_parallel
    assert "kempnerforge" not in TRANSFORMER_FRAMEWORKS  # named, never searched by default
    with pytest.raises(UnsupportedError, match="not a checkpointing policy of framework='kempnerforge'"):
        pm.Strategy(framework="kempnerforge", recompute="selective-op")


def test_five_gathers_forward_and_five_reduce_scatters_backward():
    kf, coll, c = _times("kempnerforge")
    tt, _, _ = _times("torchtitan")
    act = 2 * 4096 * 4096 * 2.0  # b·s·h bf16
    ag, rs = (hierarchical_time(coll, k, act, 4.0, 1.0, algorithm="ring") for k in ("all_gather", "reduce_scatter"))
    assert float(tt.layer_f) == pytest.approx(2 * ag + 2 * rs)
    assert float(kf.layer_f) == pytest.approx(5 * ag + 2 * rs)   # q, k, v, gate, up gather; o, down scatter
    assert float(kf.layer_b) == pytest.approx(2 * ag + 5 * rs)   # and the reverse in backward
    full, _, _ = _times("kempnerforge", recompute="full")
    assert float(full.layer_b) == pytest.approx(2 * ag + 5 * rs + 5 * ag + 2 * rs)  # the forward again


def test_logits_are_gathered_instead_of_loss_parallel():
    kf, coll, c = _times("kempnerforge")
    tt, _, _ = _times("torchtitan")
    act = 2 * 4096 * 4096 * 2.0
    ag = hierarchical_time(coll, "all_gather", act, 4.0, 1.0, algorithm="ring")
    logits = hierarchical_time(coll, "all_gather", 2 * 4096 * MODEL.vocab * 2.0, 4.0, 1.0, algorithm="ring")
    assert float(kf.head_f) == pytest.approx(ag + logits)
    assert float(tt.head_f) == pytest.approx(ag + loss_parallel_time(MODEL, coll, LAY, c))
