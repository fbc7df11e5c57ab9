"""Which moment of the step sets the memory peak (costs/memory.py ``peak_terms``), and the reserved bytes
that follow from it (parallel/stage_memory.py)."""

import dataclasses
import importlib

import numpy as np
import pytest

import perfmodel as pm
from perfmodel import step
from perfmodel.costs import memory as mem
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.strategy import fill_dp

predict_module = importlib.import_module("perfmodel.predict")

GIB = 2**30


def _terms(grads):
    return {"weights": 1.0, "weight_copies": 2.0, "optimizer": 3.0, "gradients": grads}


def test_each_moment_wins_where_its_bytes_are_the_most():
    # activations 10, loss backward 4 (forward 3), gradients 1 then 20, recomputed block 12
    acts, loss = np.array([10.0, 10.0, 10.0, 0.0]), np.array([4.0, 0.0, 0.0, 0.0])
    grads = np.array([1.0, 1.0, 1.0, 20.0])
    transient = np.array([0.0, 0.0, 12.0, 0.0])
    peak, alive, moment = mem.peak_terms(_terms(grads), acts, loss, False, loss_forward=np.array([3.0, 0, 0, 0]),
                                         transient=transient)
    names = [mem.PEAK_MOMENTS[i] for i in moment]
    assert names == ["loss_backward", "forward_end", "recompute", "optimizer_step"]  # (no block rebuilt: a tie)
    # base 1 + 3; loss backward 2 + 10 + 4; forward end 2 + 10; recompute 10 + 12; the end of backward 20
    assert peak.tolist() == [20.0, 16.0, 26.0, 24.0]
    assert sum(alive.values()).tolist() == peak.tolist()


def test_a_tie_is_the_end_of_the_forwards():
    # a stage without the loss: the loss forward and backward hold the same bytes, so the label is the forward's
    _, _, moment = mem.peak_terms(_terms(0.0), 10.0, 0.0, False)
    assert mem.PEAK_MOMENTS[int(moment)] == "forward_end"


def _evaluate(model, cluster, s):
    cl = pm.cluster(cluster) if isinstance(cluster, str) else cluster
    prof = predict_module.default_profile(cl)
    s = fill_dp(s, cl.n_gpus)
    return step.evaluate(model, cl, prof, predict_module._collectives(cl, prof), StepConfig.from_strategy(s),
                         precision=s.precision, recompute=s.recompute, optimizer=s.optimizer)


@pytest.fixture(scope="module")
def small():
    return dataclasses.replace(pm.preset("llama-3-8b"), layers=2, seq=2048)


def test_eager_loss_backward_peak_keeps_the_freed_logits_reserved(small):
    # eager autocast, one GPU: the loss backward is the peak and the freed bf16 logits (2 B each) stay reserved
    out = _evaluate(small, "h100", pm.Strategy(micro_batch=1))
    assert mem.PEAK_MOMENTS[int(out["peak_moment"])] == "loss_backward"
    hole = 2.0 * 2048 * small.vocab
    assert float(out["reserved_memory"]) == pytest.approx(1.05 * float(out["peak_memory"]) + hole, rel=1e-12)


def test_a_peak_elsewhere_reserves_no_freed_logits(small):
    # 128-token sequences: the fp32 gradients of 1.5e9 parameters outweigh every activation and the loss,
    # so the peak is the end of backward, where no logits are alive: nothing beyond the 5%
    short = dataclasses.replace(small, seq=128)
    out = _evaluate(short, "h100", pm.Strategy(micro_batch=1))
    assert mem.PEAK_MOMENTS[int(out["peak_moment"])] == "optimizer_step" and float(out["memory"]["loss"]) == 0.0
    assert float(out["reserved_memory"]) == pytest.approx(1.05 * float(out["peak_memory"]), rel=1e-12)
    one = _evaluate(small, "h100", pm.Strategy(micro_batch=1, loss="chunked"))  # no logits tensor: no hole
    assert float(one["reserved_memory"]) == pytest.approx(1.05 * float(one["peak_memory"]), rel=1e-12)


def test_prediction_names_its_peak_moment(small):
    p = pm.predict(small, "h100", pm.Strategy(micro_batch=1))
    assert p.peak_moment == "loss_backward" == p.to_dict()["peak_moment"]
    deep = pm.predict(dataclasses.replace(small, seq=128), "h100", pm.Strategy(micro_batch=1))
    assert deep.peak_moment == "optimizer_step"
