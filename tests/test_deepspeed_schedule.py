"""DeepSpeed v0.16.4 ``runtime/pipe/schedule.py`` TrainSchedule, run step by step with blocking sends,
against the pipeline engine's pricing (``pipeline.schedule_seconds``, ``deepspeed.p2p_seconds``)."""

import dataclasses

import pytest

import perfmodel as pm
from perfmodel.costs.comm import datasheet_entry
from perfmodel.parallel import deepspeed as ds
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.pipeline import Stage, schedule_seconds
from perfmodel.parallel.placement import layout

B, ACT = 100e9, 1e8  # one transfer: 1e8 B at 100 GB/s = 1 ms
COLL = {level: {"all_reduce": datasheet_entry(B, 0.0, source="test")} for level in ("intra", "inter")}
PAIR = {"send_act": ("recv_act", 1), "recv_act": ("send_act", -1), "send_grad": ("recv_grad", -1),
        "recv_grad": ("send_grad", 1)}


def commands(stage, stages, m):
    """TrainSchedule.steps() of one stage, as (command, micro-batch): its parity rule
    (``_step_to_micro_batch``) and its sends of the previous step's micro-batch."""
    out, prev = [], -1
    for step in range(2 * (m + stages - 1)):
        forward = step % 2 == stage % 2
        half = step // 2 if step % 2 == 0 else (step - 1) // 2
        if forward:
            mb = half - stage // 2
        else:
            mb = step // 2 - stages + (stage + 1) // 2 if step % 2 == 0 else half - stages + 1 + stage // 2
        ok = lambda i: 0 <= i < m  # noqa: E731
        if forward:
            out += [("send_grad", prev)] * (ok(prev) and stage > 0) + [("recv_act", mb)] * (ok(mb) and stage > 0)
            out += [("F", mb)] * ok(mb)
        else:
            last = stage == stages - 1
            out += [("recv_grad", mb)] * (ok(mb) and not last) + [("send_act", prev)] * (ok(prev) and not last)
            out += [("B", mb)] * ok(mb)
        prev = mb
    return out


def simulate(stages, m, f, b, transfer):
    """Makespan when each send and its receive start together and take ``transfer`` seconds."""
    ops = [commands(s, stages, m) for s in range(stages)]
    at, clock, posted = [0] * stages, [0.0] * stages, {}
    moved = True
    while moved:
        moved = False
        for s in range(stages):
            while at[s] < len(ops[s]):
                kind, mb = ops[s][at[s]]
                if kind in "FB":
                    clock[s] += f if kind == "F" else b
                    at[s] += 1
                    moved = True
                    continue
                other, step = PAIR[kind]
                peer = posted.pop((other, mb, s + step), None)
                if peer is None:
                    posted.setdefault((kind, mb, s), clock[s])
                    break
                clock[s] = clock[s + step] = max(peer, clock[s]) + transfer
                at[s] += 1
                at[s + step] += 1
                moved = True
    assert all(a == len(o) for a, o in zip(at, ops)), "the schedule deadlocked"
    return max(clock)


@pytest.mark.parametrize("stages,m", [(4, 8), (4, 32), (8, 16), (5, 7)])
def test_train_schedule_is_1f1b_and_its_sends_are_priced(stages, m):
    f, b = 0.002, 0.006
    # balanced stages: the 1F1B time of pipeline.schedule_seconds (slowest f + b, all stages p(f + b))
    assert simulate(stages, m, f, b, 0.0) == pytest.approx(float(schedule_seconds(f + b, stages * (f + b), m, 1)))
    c = dataclasses.replace(StepConfig.from_strategy(pm.Strategy(micro_batch=1, framework="deepspeed")),
                            pp=float(stages), dp=1.0, micro_batches=float(m))
    sts = [Stage(1.0, float(i), i == 0, i == stages - 1, True) for i in range(stages)]
    priced = float(ds.p2p_seconds(COLL, layout(1, 1, stages, 8), c, ACT, sts))
    waited = simulate(stages, m, f, b, ACT / B) - (m + stages - 1) * (f + b)
    # the blocking sends cost what the event run says, the fill and drain's crossings counted at most once more
    assert waited <= priced + 1e-12
    assert priced <= waited + 2 * (stages - 1) * ACT / B + 1e-12


def test_bf16_pass_inside_the_backward_rides_the_drain():
    # BF16_Optimizer's update_hp_grads runs inside each BackwardPass: the event run with a backward of
    # b + a takes (m + p - 1)(f + b + a), so m + p - 1 passes lie on the critical path, not m
    prof = pm.load_profile("a100-sxm4-80gb")
    base = StepConfig.from_strategy(pm.Strategy(micro_batch=1, framework="deepspeed", precision="bf16-mixed"))

    def priced(pp, m):
        c = dataclasses.replace(base, pp=float(pp), dp=1.0, micro_batches=float(m))
        return float(ds.accumulation_seconds(prof, c, 1e9, "bf16-mixed"))
    a = priced(1, 9) - priced(1, 8)
    assert a > 0
    f, b, stages, m = 0.002, 0.006, 4, 8
    with_pass = simulate(stages, m, f, b + a, 0.0)
    assert (m + stages - 1) * (f + b) + priced(stages, m) - priced(1, 0) == pytest.approx(with_pass, rel=1e-9)
