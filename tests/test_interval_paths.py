"""A step taking a pricing path no validation row ran gets the labelled, wider uncalibrated interval."""

from __future__ import annotations

import math

import pytest

import perfmodel as pm
from perfmodel import interval as iv
from perfmodel.explore.search import strategy_of
from perfmodel.parallel.paths import OFF, PATHS, placement_path, priced_paths, schedule_path
from perfmodel.predict import default_profile
from perfmodel.profiles.profile import load_profile
from perfmodel.validate.interval_rows import validation_cases

MODEL, CLUSTER = pm.preset("llama-3-8b"), pm.cluster("h200", gpus_per_node=8)


def _relative_half_width(p) -> float:
    low, high = p.interval
    return math.log(high / low) / 2


def _predict(**kw):
    fields = {"framework": "torchtitan", "micro_batch": 1, "global_batch": 64, **kw}
    return pm.predict(MODEL, CLUSTER, pm.Strategy(**fields))


@pytest.mark.parametrize("fields, path", [
    ({"pp": 2, "virtual_stages": 2, "schedule": "zbv"}, "schedule=zbv"),
    ({"tp": 2, "sequence_parallel": True, "compile": True, "tp_comm_overlap": "async"}, "tp_comm_overlap=async"),
    ({"cp": 2, "cp_comm": "all_to_all"}, "cp_comm=torch:all_to_all"),
    ({"precision": "fp8-mixed", "float8_recipe": "rowwise_with_gw_hp"}, "float8_recipe=torchao:rowwise_with_gw_hp"),
    ({"tp": 2, "pp": 2, "placement": "dp-tp-pp"}, "placement=dp-tp-pp"),
    ({"framework": "pytorch", "offload_layers": 4}, "activation_offload=on"),
    ({"framework": "pytorch", "ps_servers": 2}, "parameter_servers=sync"),
])
def test_a_path_no_validation_row_ran_is_labelled_uncalibrated_and_wider(fields, path):
    base = _predict()
    assert not base.interval_regime.startswith(iv.UNCALIBRATED)  # torchtitan on the measured H200: calibrated
    p = _predict(**fields)
    assert p.interval_regime == f"{iv.UNCALIBRATED}: {path} in no validation row"
    assert _relative_half_width(p) > _relative_half_width(base)


def test_a_path_the_rows_ran_keeps_the_calibrated_regime():
    for fields in ({"pp": 2, "virtual_stages": 2, "schedule": "interleaved"}, {"placement": "dp-tp-pp"},
                   {"precision": "fp8-mixed"}, {"cp": 2}):  # placement with one parallel group: it does not act
        assert not _predict(**fields).interval_regime.startswith(iv.UNCALIBRATED), fields


def test_the_table_records_exactly_the_paths_its_validation_rows_ran():
    ran = {name: set() for name in PATHS}
    for _, case in validation_cases():
        gpu = (load_profile(case.profile) if case.profile else default_profile(case.cluster)).gpu
        for name, value in priced_paths(case.strategy, case.model, gpu).items():
            ran[name].add(value)
    table = iv.calibration_table()["validated_paths"]
    assert {k: set(v) for k, v in table.items()} == ran  # stale after the rows change: regenerate the table
    assert list(table) == list(PATHS)


def test_paths_that_do_not_act_are_off():
    assert schedule_path(1, 1, "zbv") == OFF and schedule_path(4, 1, "interleaved") == "1f1b"
    assert schedule_path(4, 1, "gpipe") == "gpipe" and schedule_path(4, 2, "zbv") == "zbv"
    assert placement_path("dp-tp-pp", 1, 1, 64) == OFF and placement_path("dp-tp-pp", 8, 1, 64) == "dp-tp-pp"
    assert set(priced_paths(pm.Strategy()).values()) == {OFF}


def test_search_labels_only_its_rows_that_take_an_unvalidated_path():
    rows = pm.search(MODEL, CLUSTER, 32, framework="torchtitan", top_k=3000, schedule=("interleaved", "zbv"),
                     compile=True, recompute="none")
    zero_bubble = (rows.virtual_stages > 1) & (rows.schedule == "zbv")
    async_tp = rows.tp_comm_overlap == "async"
    assert zero_bubble.any() and async_tp.any() and (~zero_bubble & ~async_tp).any()
    regime = rows.interval_regime.astype(str)
    assert (regime[zero_bubble] == f"{iv.UNCALIBRATED}: schedule=zbv in no validation row").all()
    assert (regime[async_tp & ~zero_bubble] == f"{iv.UNCALIBRATED}: tp_comm_overlap=async in no validation row").all()
    assert not regime[~zero_bubble & ~async_tp].str.startswith(iv.UNCALIBRATED).any()
    for _, row in rows[zero_bubble | async_tp].head(3).iterrows():  # as predict gives each row
        assert pm.predict(MODEL, CLUSTER, strategy_of(row)).interval_regime == row.interval_regime
