"""A GPU's interference tables: hand-worked rows fitted back per mode, bundled, and read by predict_shared."""

import pandas as pd
import pytest

import perfmodel as pm
from perfmodel.analysis import interference as tables
from perfmodel.core.errors import InvalidInputError
from perfmodel.fit import gpu_interference as gfit

# mps, hand-worked: a class-a job beside class-b jobs takes 1 + sum_b I(a, b)
TRUE = {"compute|compute": 0.8, "compute|memory": 0.3, "memory|compute": 0.1, "memory|memory": 0.9}
MPS_SLOWDOWNS = {"compute+compute": (1.8, 1.8), "compute+memory": (1.3, 1.1), "memory+memory": (1.9, 1.9),
                 "compute+launch": (1.0, 1.0), "memory+memory+memory": (2.8, 2.8, 2.8)}
# time-slice, hand-worked: k always-ready jobs take k (1 + switch) each; switch 0.1
SLICE_SLOWDOWNS = {"compute+compute": (2.2, 2.2), "compute+memory": (2.2, 2.2), "memory+memory": (2.2, 2.2),
                   "compute+compute+compute": (3.3, 3.3, 3.3), "launch+launch": (1.0, 1.0)}


def _rows(slowdowns, harness, repeats=2, noise=0.0):
    out = []
    for rep in range(repeats):
        for mix, sd in slowdowns.items():
            for slot, (job, s) in enumerate(zip(mix.split("+"), sd)):
                wobble = 1.0 + noise * (1 if (rep + slot) % 2 else -1)
                out.append({"mix": mix, "job": job, "slot": slot, "repeat": rep, "wall_alone_s": 1e-3,
                            "wall_together_s": 1e-3 * s * wobble, "slowdown": s * wobble, "other_alone": 0.0,
                            "other_together": 0.0, "device": "NVIDIA H200", "harness": harness})
    return pd.DataFrame(out)


def test_mps_slowdowns_by_hand_from_a_table():
    t = tables.InterferenceTable("t", tables.FrozenMap(TRUE))
    assert gfit.gpu_slowdown(t, ["compute", "memory"], 0, "mps") == pytest.approx(1.3)
    assert gfit.gpu_slowdown(t, ["compute", "memory", "memory"], 1, "mps") == pytest.approx(1.0 + 0.1 + 0.9)
    # a launch storm is host time on a GPU: it neither slows nor is slowed
    assert gfit.gpu_slowdown(t, ["compute", "launch"], 0, "mps") == pytest.approx(1.0)
    assert gfit.gpu_slowdown(t, ["compute", "launch"], 1, "mps") == pytest.approx(1.0)


def test_mps_fit_recovers_the_hand_worked_table():
    fit = gfit.fit_gpu_interference(_rows(MPS_SLOWDOWNS, "streams"), "H200", "mps", cv=False)
    for key, value in TRUE.items():
        assert fit.table.coefficient(*key.split("|")) == pytest.approx(value, abs=1e-4)
    assert fit.table.switch_fraction == 0.0
    assert fit.rows["error"].abs().max() < 1e-4
    assert fit.table.name == "h200-sxm-141gb/mps (measured)" and fit.table.meta["devices"] == "NVIDIA H200"


def test_time_slice_fit_recovers_the_switch_loss_and_noise_shows_in_the_cv_error():
    fit = gfit.fit_gpu_interference(_rows(SLICE_SLOWDOWNS, "processes"), "H200", "time-slice", cv=False)
    assert fit.table.switch_fraction == pytest.approx(0.1, abs=1e-4)
    assert fit.rows["predicted"].tolist() == pytest.approx(fit.rows["slowdown"].tolist(), rel=1e-4)
    noisy = gfit.fit_gpu_interference(_rows(SLICE_SLOWDOWNS, "processes", noise=0.05), "H200", "time-slice")
    # each repeat is off by +-5%, its mirror image in the other: the held-out error is about 5-10%
    assert 0.03 < noisy.cv_error < 0.12


def test_too_few_rows_or_a_bad_mode_are_refused():
    with pytest.raises(InvalidInputError, match="cannot fit the mps table"):
        gfit.fit_gpu_interference(_rows({"compute+compute": (1.8, 1.8)}, "streams", repeats=1), "H200", "mps")
    with pytest.raises(InvalidInputError, match="valid: time-slice, mps"):
        gfit.fit_gpu_interference(_rows(MPS_SLOWDOWNS, "streams"), "H200", "mig")


def test_folder_fit_bundles_a_table_per_mode_and_predict_shared_uses_it(tmp_path, monkeypatch, capsys):
    _rows(MPS_SLOWDOWNS, "streams").to_csv(tmp_path / "kernels-streams.csv", index=False)
    _rows(SLICE_SLOWDOWNS, "processes").to_csv(tmp_path / "kernels-processes.csv", index=False)
    out = tmp_path / "tables"
    assert gfit.main([str(tmp_path), "--gpu", "H200", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "compute+memory" in printed and printed.count("CV median |error| 0.0%); without launch storms 0.0%") == 2
    assert sorted(p.name for p in out.iterdir()) == ["interference-gpu-h200-sxm-141gb-mps.json",
                                                     "interference-gpu-h200-sxm-141gb-time-slice.json"]
    job = (pm.transformer(layers=2, hidden=4096, heads=32, seq=1024, vocab=32000), pm.Strategy(micro_batch=2))
    assert pm.predict_shared([job, job], "h200", mode="mps").interference == "gpu-default"
    monkeypatch.setattr(tables, "DATA", out)
    measured = pm.predict_shared([job, job], "h200", mode="mps")
    assert measured.interference == "h200-sxm-141gb/mps (measured)"
    sliced = pm.predict_shared([job, job], "h200", mode="time-slice")
    assert sliced.interference == "h200-sxm-141gb/time-slice (measured)"
    # mostly GEMM, always ready: each about 2 x (1 + 0.1) under the measured switch loss
    assert all(2.0 < j.slowdown <= 2.2 + 1e-9 for j in sliced.jobs)
    # another GPU was never measured: the bound prices it, and says so
    assert pm.predict_shared([job, job], "h100", mode="mps").interference == "gpu-default"


def test_a_mode_cut_short_is_reported_and_the_other_still_fitted(tmp_path, capsys):
    _rows({"compute+compute": (1.8, 1.8)}, "streams", repeats=1).to_csv(tmp_path / "kernels-streams.csv", index=False)
    _rows(SLICE_SLOWDOWNS, "processes").to_csv(tmp_path / "kernels-processes.csv", index=False)
    fits = gfit.fit_folder([tmp_path], "H200", cv=False)
    assert "cannot fit the mps table" in fits["mps"]
    assert fits["time-slice"].table.switch_fraction == pytest.approx(0.1, abs=1e-4)
    with pytest.raises(SystemExit, match="2"):
        gfit.main([str(tmp_path / "none.csv"), "--gpu", "H200"])
    assert "none.csv" in capsys.readouterr().err
