"""tools.fsdp_overlap: the FSDP collectives of a micro-batch it adds up are the ones the step prices."""

import dataclasses

import pytest

from perfmodel.validate.published import read_published_checks
from tools.fsdp_overlap import collectives_per_micro_batch, rows


def _case(name):
    return next(c for c in read_published_checks() if c.label == name)


@pytest.mark.parametrize("name", ["fms-fsdp-llama2-7b-128", "olmo-core-olmo-1b-bf16"])
def test_unhidden_collectives_are_the_priced_exposed_seconds(name):
    # with dp_overlap off no compute hides a gather or a reduce-scatter: the priced data-parallel seconds are
    # the tool's sum over micro-batches (FSDP2 adds its copies on the compute stream, docs/stacks.md)
    case = _case(name)
    serial = dataclasses.replace(case, strategy=dataclasses.replace(case.strategy, dp_overlap=False))
    total, p = collectives_per_micro_batch(serial)
    per_micro_batch = p.breakdown["dp_comm"] / serial.strategy.micro_batches
    if serial.strategy.framework == "fsdp1":
        assert per_micro_batch == pytest.approx(total, rel=1e-9)
    else:  # and the copies FSDP2 runs on the compute stream beside them
        assert per_micro_batch > total
    overlapped, q = collectives_per_micro_batch(case)
    assert overlapped == pytest.approx(total) and q.step_time < p.step_time


def test_every_fsdp_check_row_is_listed_with_positive_collectives():
    out = rows()
    names = {r["name"] for r in out}
    assert {"fms-fsdp-llama2-70b-464-h100", "olmo-core-olmo-13b-bf16", "torchtitan-8b-fsdp"} <= names
    assert all(r["all_s"] > 0 and r["micro_batches"] >= 1 for r in out)
    assert not any(n.startswith("torchtitan-8b-cp") and not n.endswith("cp1-32k") for n in names)  # no ring
