"""The data-parallel CNN check set (perfmodel/data/published_cnn_ddp_runs.csv) and its scorer."""

from __future__ import annotations

import dataclasses
import math

import pytest

from perfmodel.predict import predict
from perfmodel.validate import cnn_ddp


@pytest.fixture(scope="module")
def rows():
    return cnn_ddp.load_rows()


def test_each_row_is_priced_on_its_sites_cluster(rows):
    assert len(rows) == 5 and {r["setting"] for r in rows} == {"pytorch-examples-fp32"}
    for r in rows:
        model, c, s = cnn_ddp.row_inputs(r)
        assert c.n_gpus == s.dp == int(r["gpus"]) and c.gpus_per_node == min(int(r["gpus"]), 8)
        # one 100 Gb/s EDR port per server, not the DGX-1 preset's four
        assert c.node.nics_per_node == 1 and c.node.nic.name == "ib-edr"
        assert s.memory_format == "contiguous" and model.name == "resnet50"


def test_one_port_per_server_prices_the_multi_server_rows_slower(rows):
    r = next(r for r in rows if r["gpus"] == 32)
    model, c, s = cnn_ddp.row_inputs(r)
    four = dataclasses.replace(c, node=dataclasses.replace(c.node, nics_per_node=4))
    one_port, four_ports = predict(model, c, s), predict(model, four, s)
    assert one_port.breakdown["dp_comm"] >= four_ports.breakdown["dp_comm"]
    assert one_port.step_time >= four_ports.step_time


def test_speed_ups_are_over_the_one_gpu_row_of_the_same_setting(rows):
    scored = cnn_ddp.score(rows)
    assert len(scored) == 5
    solo = {r.setting: r for r in scored if r.gpus == 1}
    for r in scored:
        if r.gpus == 1:
            assert math.isnan(r.speedup_error)
        else:
            assert r.measured_speedup == pytest.approx(r.measured / solo[r.setting].measured)
            assert r.predicted_speedup == pytest.approx(r.predicted / solo[r.setting].predicted)
            assert 1 < r.predicted_speedup <= r.gpus  # data parallelism adds time, never removes it
    s = cnn_ddp.summary(scored)
    assert s["all"][2] == 5 and all(math.isfinite(v) for v in s["all"][:2])


def test_the_report_prints_every_row(capsys):
    assert cnn_ddp.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("pytorch-examples-fp32") >= 5 and "median |error|" in out
