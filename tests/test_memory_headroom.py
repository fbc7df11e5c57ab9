"""memory_headroom: a plan fits only when it leaves that fraction of each GPU's memory free."""

import math

import pytest

import perfmodel as pm
from perfmodel.cli import main
from perfmodel.core.errors import InfeasibleError, InvalidInputError
from perfmodel.explore import strategy_of

MODEL = pm.preset("llama-3-8b")
CLUSTER = pm.cluster("h100", gpus_per_node=8)
PLAN = pm.Strategy(micro_batch=1, global_batch=8, fsdp="full", framework="torchtitan")


def test_fits_against_the_capacity_less_the_headroom():
    whole = pm.predict(MODEL, CLUSTER, PLAN)
    assert whole.fits and whole.memory_headroom == 0.0
    tight = pm.predict(MODEL, CLUSTER, PLAN, memory_headroom=0.5)
    assert not tight.fits
    need = tight.over_capacity + 0.5 * tight.memory_capacity  # what the plan needs, from the budget it misses
    assert need > tight.peak_memory  # allocator and CUDA context on top of the allocated peak
    h = 1.0 - need / whole.memory_capacity  # the largest headroom it fits under
    assert pm.predict(MODEL, CLUSTER, PLAN, memory_headroom=h * 0.99).fits
    assert not pm.predict(MODEL, CLUSTER, PLAN, memory_headroom=min(h * 1.01 + 1e-6, 0.99)).fits
    # everything else is the same prediction
    assert tight.step_time == whole.step_time and tight.peak_memory == whole.peak_memory
    assert tight.to_dict()["memory_headroom"] == 0.5


@pytest.mark.parametrize("bad", [1.0, 1.5, -0.1, math.nan, math.inf, True, "0.1"])
def test_bad_headroom_is_refused_naming_the_field(bad):
    with pytest.raises(InvalidInputError, match="memory_headroom"):
        pm.predict(MODEL, CLUSTER, PLAN, memory_headroom=bad)
    with pytest.raises(InvalidInputError, match="memory_headroom"):
        pm.search(MODEL, CLUSTER, 64, framework="torchtitan", memory_headroom=bad)


def test_search_keeps_only_plans_that_leave_the_headroom_free():
    free = pm.search(MODEL, CLUSTER, 64, top_k=3, framework="torchtitan")
    kept = pm.search(MODEL, CLUSTER, 64, top_k=3, framework="torchtitan", memory_headroom=0.3)
    assert free.iloc[0]["peak_memory"] > 0.7 * free.iloc[0]["memory_capacity"]  # the plain best uses the room
    for _, row in kept.iterrows():
        p = pm.predict(MODEL, CLUSTER, strategy_of(row), memory_headroom=0.3)
        assert p.fits and p.step_time == pytest.approx(row["step_time"])
    assert kept.iloc[0]["step_time"] >= free.iloc[0]["step_time"]  # a smaller space: never faster
    assert kept.iloc[0]["peak_memory"] < free.iloc[0]["peak_memory"]


def test_search_that_nothing_fits_names_the_headroom():
    with pytest.raises(InfeasibleError, match="97% memory_headroom.*smaller memory_headroom"):
        pm.search(MODEL, CLUSTER, 64, top_k=3, framework="torchtitan", memory_headroom=0.97)


def test_compare_and_sweep_mark_fits_with_the_headroom():
    df = pm.compare(MODEL, CLUSTER, [PLAN], memory_headroom=0.5)
    assert not bool(df.iloc[0]["fits"])
    sw = pm.sweep(MODEL, "micro_batch", [1], cluster=CLUSTER, strategy=PLAN, memory_headroom=0.5)
    assert not bool(sw.iloc[0]["fits"])
    assert bool(pm.compare(MODEL, CLUSTER, [PLAN]).iloc[0]["fits"])


def test_cli_takes_a_fraction(capsys):
    args = ["predict", "--model", "llama-3-8b", "--gpu", "h100", "--gpus-per-node", "8", "--fsdp", "full",
            "--framework", "torchtitan", "--micro-batch", "1", "--global-batch", "8"]
    assert main([*args, "--memory-headroom", "0.5"]) == 0
    assert "(50% kept free)   DOES NOT FIT" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main([*args, "--memory-headroom", "1"])
    assert exc.value.code == 2
    assert "--memory-headroom: must be a fraction >= 0 and < 1" in capsys.readouterr().err
