"""Fitting collective tables: form choice by CV, rejected rows, levels, bundled NVLink entries."""

import json

import numpy as np
import pandas as pd
import pytest

from perfmodel.costs.comm import BUSBW_FACTOR, ENTRY_KEYS, busbw_from_time, collective_time
from perfmodel.core.errors import InvalidInputError, ProfileError, UnknownNameError
from perfmodel.fit.comm import (
    BUNDLED_SYSTEMS,
    TABLE_COLUMNS,
    bundled_allreduce_entry,
    cv_mape,
    fit_collective,
    fit_collectives,
    fit_reference_allreduce,
    load_reference_allreduce,
    profile_entry,
)

SIZES = 2.0 ** np.arange(10, 34, 1)  # 1 KiB .. 8 GiB


def table(collective, sizes, n, entry, *, nodes=1, scope="world", backend="nccl"):
    t = collective_time(entry, collective, sizes, n)
    return pd.DataFrame({
        "collective": collective, "backend": backend, "scope": scope, "group_size": n,
        "nodes": nodes, "ranks_per_node": n // nodes, "size_bytes": sizes, "dtype": "float32",
        "time_s": t, "time_min_s": np.nan, "algbw_GBps": sizes / t / 1e9, "busbw_GBps": np.nan,
        "reps": 20, "world_size": n,
    })


TRUE_LOGISTIC = {"form": "comm_logistic", "params": {
    "alpha_s": 20e-6, "alpha_rank_s": 0.0, "busbw_bytes_per_s": 300e9,
    "half_size_bytes": 8e6, "exponent": 0.7}}
TRUE_AB = {"form": "comm_alpha_beta", "params": {
    "alpha_s": 10e-6, "alpha_rank_s": 2e-6, "busbw_bytes_per_s": 40e9}}


def test_recovers_logistic_parameters_and_prefers_it():
    entry = fit_collective(table("all_gather", SIZES, 8, TRUE_LOGISTIC), "all_gather", source="synthetic")
    assert entry["form"] == "comm_logistic"
    for name, value in TRUE_LOGISTIC["params"].items():
        assert entry["params"][name] == pytest.approx(value, rel=0.01, abs=1e-9)
    assert entry["cv_mape"] < 0.001
    assert entry["candidates"]["comm_alpha_beta"] > 10 * entry["candidates"]["comm_logistic"]
    assert entry["n_points"] == len(SIZES) and entry["range_bytes"] == [1024.0, 2.0**33]
    assert entry["source"] == "synthetic" and entry["rejected"] == {}


def test_rank_latency_fitted_over_several_group_sizes():
    rows = pd.concat([table("broadcast", SIZES[::3], n, TRUE_AB) for n in (2, 4, 8)])
    entry = fit_collective(rows, "broadcast", forms=["comm_alpha_beta"])
    assert entry["form"] == "comm_alpha_beta"
    for name, value in TRUE_AB["params"].items():
        assert entry["params"][name] == pytest.approx(value, rel=0.01)


def test_bad_rows_are_counted_not_fatal():
    rows = table("all_reduce", SIZES, 8, TRUE_LOGISTIC)
    rows.loc[0, "time_s"] = np.nan
    rows.loc[1, "time_s"] = -1.0
    rows.loc[2, "size_bytes"] = -5
    rows.loc[3, "collective"] = "allreduce"
    rows.loc[4, "group_size"] = 1
    entry = fit_collective(rows, "all_reduce")
    assert entry["rejected"] == {"time_s missing or <= 0": 2, "size_bytes missing or <= 0": 1,
                                 "unknown collective": 1, "group_size missing or < 2": 1}
    assert entry["n_points"] == len(SIZES) - 5 and entry["form"] == "comm_logistic"


def test_too_few_sizes_keep_the_datasheet_entry():
    entry = fit_collective(table("all_reduce", SIZES[:3], 8, TRUE_AB), "all_reduce")
    assert entry["form"] is None and entry["n_points"] == 3
    assert entry["note"] == "3 distinct sizes (< 4): not fitted; keep the datasheet entry"
    with pytest.raises(ProfileError, match=r"was not fitted: 3 distinct sizes"):
        collective_time(entry, "all_reduce", 1e6, 8)


def test_four_sizes_fit_the_simple_form():
    entry = fit_collective(table("all_reduce", SIZES[::6], 8, TRUE_AB), "all_reduce")
    assert entry["form"] == "comm_alpha_beta" and entry["candidates"]["comm_logistic"] is None
    assert entry["params"]["busbw_bytes_per_s"] == pytest.approx(40e9, rel=0.01)


def test_table_and_argument_errors():
    with pytest.raises(InvalidInputError, match=r"collective table lacks columns \['time_s'\]"):
        fit_collective(pd.DataFrame({"collective": [], "group_size": [], "size_bytes": []}), "all_reduce")
    rows = table("all_reduce", SIZES, 8, TRUE_AB)
    with pytest.raises(UnknownNameError, match=r"unknown form 'comm_cubic'"):
        fit_collective(rows, "all_reduce", forms=["comm_cubic"])
    mixed = pd.concat([rows, table("all_reduce", SIZES, 8, TRUE_AB, backend="gloo")])
    with pytest.raises(InvalidInputError, match=r"mixes backends \['gloo', 'nccl'\]: fit one at a time"):
        fit_collectives(mixed)


def test_fit_collectives_sorts_rows_into_levels():
    rows = pd.concat([
        table("all_reduce", SIZES, 8, TRUE_LOGISTIC),  # one node
        table("all_reduce", SIZES, 4, TRUE_AB, nodes=4),  # one rank per node
        table("all_gather", SIZES, 16, TRUE_AB, nodes=2),  # 8 ranks on each of 2 nodes
        table("sendrecv", SIZES, 2, TRUE_AB, nodes=np.nan, scope="inter"),
        table("broadcast", SIZES[:5], 8, TRUE_AB, nodes=np.nan),  # level unknown
    ])
    fitted = fit_collectives(rows, source="cluster x")
    assert {lvl: sorted(v) for lvl, v in fitted.items()} == {
        "intra": ["all_reduce"], "inter": ["all_reduce", "sendrecv"], "world": ["all_gather"]}
    assert fitted["inter"]["all_reduce"]["rejected"] == {
        "fabric level unknown (no nodes, scope not intra/inter)": 5}
    assert fitted["intra"]["all_reduce"]["form"] == "comm_logistic"
    stored = profile_entry(fitted["inter"]["sendrecv"])
    assert tuple(stored) == ENTRY_KEYS and json.loads(json.dumps(stored)) == stored


# --- published nccl-tests curves -------------------------------------------------------------


def test_reference_table_follows_the_schema():
    ref = load_reference_allreduce()
    assert set(TABLE_COLUMNS) <= set(ref.columns) and len(ref) == 96
    assert sorted(ref.groupby("system").size()) == [24, 24, 24, 24]
    busbw = busbw_from_time("all_reduce", ref["size_bytes"], ref["group_size"], ref["time_s"])
    np.testing.assert_allclose(busbw, ref["busbw_GBps"] * 1e9, rtol=1e-12)


@pytest.mark.parametrize("system", sorted(BUNDLED_SYSTEMS))
def test_published_allreduce_fits_within_10_percent(system):
    """8-GPU NVSwitch all_reduce, 1 KiB..8 GiB (Azure AI-benchmarking-guide): CV MAPE <= 10%."""
    entry = fit_reference_allreduce(system)
    assert entry["form"] == "comm_logistic"
    assert entry["cv_mape"] <= 0.10
    assert entry["candidates"]["comm_alpha_beta"] > entry["cv_mape"]
    ref = load_reference_allreduce()
    rows = ref[ref["system"].str.startswith(BUNDLED_SYSTEMS[system])]
    size, n, t = (rows[c].to_numpy(float) for c in ("size_bytes", "group_size", "time_s"))
    big = cv_mape(entry["form"], size, n, BUSBW_FACTOR["all_reduce"](n), t, score_mask=size >= 2**20)
    assert big <= 0.10  # 1 MiB .. 8 GiB


@pytest.mark.parametrize("system, busbw_1gib, gpus", [("a100", 228.10, 8), ("h100", 466.35, 8), ("h200", 467.58, 8),
                                                      ("gb200", 646.87, 4)])
def test_bundled_entries_match_refit_and_published_points(system, busbw_1gib, gpus):
    entry = bundled_allreduce_entry(system)
    assert tuple(entry) == ENTRY_KEYS and entry["n_points"] == 24
    refit = fit_reference_allreduce(system)
    for name, value in entry["params"].items():
        assert refit["params"][name] == pytest.approx(value, rel=1e-3, abs=1e-12)
    t = collective_time(entry, "all_reduce", 2**30, gpus)
    assert float(busbw_from_time("all_reduce", 2**30, gpus, t)) == pytest.approx(busbw_1gib * 1e9, rel=0.10)
    algorithm = {"a100": "ring/tree", "gb200": "ring"}.get(system, "NVLS")
    assert f"NCCL algorithm {algorithm}" in entry["source"]


def test_bundled_entry_aliases_and_unknown_system():
    assert bundled_allreduce_entry("HGX-H200") == bundled_allreduce_entry("h200")
    with pytest.raises(UnknownNameError, match=r"unknown system 'b200'.*a100, dgx-a100"):
        bundled_allreduce_entry("b200")
