"""NeMo's tuned userbuffers tables (``tp_comm_overlap="userbuffers-nemo"``) against TE's defaults."""

import pytest

import perfmodel as pm
from perfmodel.errors import UnsupportedError
from perfmodel.parallel import tp_overlap as ub
from perfmodel.validate.published import read_published, read_published_checks


def test_bulk_without_margin_costs_the_gemm_only_while_the_collective_runs():
    # 2 ms reduce-scatter on 4 of 132 SMs beside a 4 ms GEMM that keeps every SM: 2 ms at 128/132 speed
    assert ub.bulk(2e-3, 4e-3, 132, 4, False) == pytest.approx(2e-3 * 4 / 128)
    # with the margin the whole GEMM runs on 116 SMs (TE's default)
    assert ub.bulk(2e-3, 4e-3, 132) == pytest.approx(4e-3 * (132 / 116 - 1))
    # a ring exchange with a margin of one SM: the copy engines move it, one SM is lost for the GEMM
    o = ub.UbOverlap("ring_exchange", 1, True)
    assert ub.exposed(1e-3, 8e-3, o, 4, 132) == pytest.approx(8e-3 * (132 / 131 - 1))


def test_nemo_tables_are_picked_by_hidden_size_and_fall_back_to_te():
    assert ub.ub_config("userbuffers", 8192) is ub.TE_DEFAULT
    h8192 = ub.ub_config("userbuffers-nemo", 8192)
    assert h8192["fc1.dgrad"] == ub.UbOverlap("bulk", 2, False)      # NeMo v2.1.0, h8192 tp4
    assert ub.ub_config("userbuffers-nemo", 12288)["fc2"].method == "ring_exchange"
    assert ub.ub_config("userbuffers-nemo", 5120) is ub.TE_DEFAULT  # no NeMo table: TE's defaults


@pytest.fixture(scope="module")
def llama70b():
    m = pm.preset("llama-3-70b")
    c = pm.cluster("dgx-h100", nodes=2)
    s = pm.Strategy(dp=4, tp=4, micro_batch=1, global_batch=8, framework="megatron", sequence_parallel=True,
                    zero=1, recompute="full", tp_comm_overlap="userbuffers")
    return m, c, s


def test_tuned_tables_expose_less_than_te_defaults(llama70b):
    m, c, s = llama70b
    te, nemo = pm.predict(m, c, s), pm.predict(m, c, s.replace(tp_comm_overlap="userbuffers-nemo"))
    assert nemo.breakdown["tp_comm"] < te.breakdown["tp_comm"]
    assert nemo.breakdown["forward"] == te.breakdown["forward"]
    with pytest.raises(UnsupportedError, match=r"tp_comm_overlap='userbuffers-nemo' does not apply"):
        pm.Strategy(tp=2, sequence_parallel=True, tp_comm_overlap="userbuffers-nemo")


def test_published_nemo_rows_read_their_overlap():
    rows = {c.label: c.strategy for c in read_published()}
    assert rows["nemo-llama3-70B-64-cp2"].tp_comm_overlap == "userbuffers-nemo"
    assert rows["nemo-llama2-7B-8"].tp_comm_overlap is None  # tp 1: nothing to overlap


def test_nemotron_rows_run_what_nemo_code_sets():
    rows = [c.strategy for c in read_published_checks() if c.label.startswith("nemotron4-340B")]
    assert len(rows) == 3
    # NeMo-Framework-Launcher nemotron_340b.yaml: ub_tp_comm_overlap, no activation checkpointing
    assert all(s.tp_comm_overlap == "userbuffers" and s.recompute == "none" for s in rows)
    assert all((s.tp, s.pp, s.virtual_stages, s.micro_batch) == (8, 12, 8, 1) for s in rows)
