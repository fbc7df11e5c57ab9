"""Fitting tables into a profile: reproducibility, CV targets, bad rows, schema."""

import json
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import perfmodel as pm
from perfmodel.fit.build import BUNDLED_H200_TABLES, build_profile, fit_tables
from perfmodel.fit.compute import ComputeFitter
from perfmodel.fit.tables import legacy_h200_to_tidy, read_compute_table
from perfmodel.profiles.profile import SCHEMA_VERSION, Profile


@pytest.fixture(scope="module")
def h200_fit():
    return fit_tables([BUNDLED_H200_TABLES], gpu="h200")


def test_bundled_csv_is_the_converted_jsonl():
    tidy = legacy_h200_to_tidy(BUNDLED_H200_TABLES)
    stored = read_compute_table(BUNDLED_H200_TABLES)
    assert len(tidy) == len(stored)
    np.testing.assert_allclose(tidy.time_s.to_numpy(float), stored.time_s.to_numpy(float))


FORM_TIE = 0.005  # CV MAPE within which two forms fit a table equally well: which wins varies by machine


def test_fit_reproduces_the_bundled_profile(h200_fit):
    """Refitting the bundled tables fits each class as well as the bundled profile does: the same form, or one
    whose CV error ties the bundled form's on this machine, and the same errors. Parameters are not compared:
    the optima of sloppy ones (gemm:fp32's p2, a t_cpu below every row's time) move across BLAS builds and
    CPUs while the fitted curve stays (seen: gemm:fp32 p2 0.03 against 0.79 with equal fit errors)."""
    bundled = pm.load_profile("h200-sxm-141gb")
    assert set(h200_fit.entries_) <= set(bundled.compute)
    for key, entry in h200_fit.entries_.items():
        want = bundled.compute[key]
        same = entry["form"] == want["form"]
        if not same:
            scores = entry["candidates"]
            assert scores[want["form"]] - scores[entry["form"]] <= FORM_TIE, (key, scores)
        if want.get("cv_mape") is not None and np.isfinite(want["cv_mape"]):
            assert abs(entry["cv_mape"] - want["cv_mape"]) <= FORM_TIE, (key, entry["cv_mape"], want["cv_mape"])
        if same and want.get("fit_mape") is not None:  # another form fits the rows another way
            assert abs(entry["fit_mape"] - want["fit_mape"]) <= 1e-3, (key, entry["fit_mape"], want["fit_mape"])


def test_cv_targets_met(h200_fit):
    report = h200_fit.report_.set_index("class")
    assert report.loc["gemm:bf16", "cv_mape"] <= 0.08      # GEMMs >= 1 GFLOP, misaligned included
    assert report.loc["gemm:fp32", "cv_mape"] <= 0.08
    # attention by 128-row blocks with the longest program's tail: 4.3% forward (9.0% with FLOPs alone)
    assert report.loc["sdpa:fwd", "cv_mape"] <= 0.08
    assert report.loc["sdpa:bwd", "cv_mape"] <= 0.08
    assert report.loc["softmax:bf16:fwd", "cv_mape"] <= 0.08  # row-length form (22% with bytes alone)
    assert report.loc["sum:fp32:fwd", "cv_mape"] <= 0.08
    mem = report[report.index.str.contains(":f") | report.index.str.contains(":b")]
    mem = mem[~mem.index.str.startswith(("gemm", "sdpa", "adamw"))]["cv_mape"].dropna()
    assert mem.median() <= 0.08
    used = ["layernorm:fp32:fwd", "layernorm:fp32:bwd", "residual_add:fp32:fwd", "gelu:bf16:fwd", "gelu:bf16:bwd",
            "swiglu:bf16:fwd", "cross_entropy:fp32:fwd", "cross_entropy:fp32:bwd",
            "cast_bf16_to_fp32:fp32:fwd", "cast_fp32_to_bf16:fp32:fwd"]
    assert (report.loc[used, "cv_mape"] <= 0.10).all()


def test_cv_targets_on_the_tables_this_project_measured():
    """The H200 tables of calibration.compute (perfmodel/data/h200-calibration-2026-11-30)."""
    from perfmodel.fit.build import CALIBRATED_H200_TABLES

    report = fit_tables([CALIBRATED_H200_TABLES], gpu="h200").report_.set_index("class")
    assert report.loc["sdpa:fwd", "cv_mape"] <= 0.08 and report.loc["sdpa:bwd", "cv_mape"] <= 0.08
    assert report.loc["gemm:fp8", "cv_mape"] <= 0.08
    assert report.loc["gemm:fp16", "cv_mape"] <= 0.08  # gemm_tiles (12.3% with the smooth form)
    assert report.loc["gemm:fp32", "cv_mape"] <= 0.08
    assert report.loc["gemm:bf16", "cv_mape"] <= 0.10  # 9.4%: the 8% target is not met here
    step_ops = ["layernorm:fp32:fwd", "layernorm:fp32:bwd", "rmsnorm:fp32:fwd", "rmsnorm:fp32:bwd",
                "gelu:bf16:fwd", "gelu:bf16:bwd", "swiglu:bf16:fwd", "swiglu:bf16:bwd", "softmax:bf16:fwd",
                "softmax:bf16:bwd", "softmax:fp32:fwd", "softmax:fp32:bwd", "residual_add:fp32:fwd",
                "cross_entropy:fp32:bwd", "add:fp32:fwd", "scale:fp32:fwd", "sum:fp32:fwd"]
    assert (report.loc[step_ops, "cv_mape"] <= 0.09).all(), report.loc[step_ops, "cv_mape"]


def test_bad_rows_are_rejected_with_reasons():
    table = read_compute_table(BUNDLED_H200_TABLES)
    gemm = table[(table.op == "gemm") & (table.dtype == "fp32")].copy()
    gemm.iloc[0, gemm.columns.get_loc("time_s")] = np.nan
    gemm.iloc[1, gemm.columns.get_loc("time_s")] = -1.0
    gemm = gemm.astype({"m": object})
    gemm.iloc[2, gemm.columns.get_loc("m")] = "big"
    gemm.iloc[3, gemm.columns.get_loc("time_s")] = np.inf
    fitter = ComputeFitter(sms=132).fit(gemm)
    assert fitter.rejected_ == {"missing or non-numeric time_s": 1, "non-positive time_s": 1, "infinite time_s": 1,
                                "non-numeric m": 1}
    assert "gemm:fp32" in fitter.entries_


def test_an_empty_or_unreadable_table_is_named(tmp_path):
    (tmp_path / "compute.csv").write_text("")
    with pytest.raises(pm.PerfModelError, match="'table' .*compute.csv' is empty"):
        read_compute_table(tmp_path)
    (tmp_path / "compute.csv").write_bytes(b"op,time_s\n\xff\xfe,1\n")
    with pytest.raises(pm.PerfModelError, match="is not UTF-8 text"):
        read_compute_table(tmp_path)


def test_too_few_points_fall_back_and_say_so():
    table = read_compute_table(BUNDLED_H200_TABLES)
    few = table[(table.op == "gemm") & (table.dtype == "bf16")].head(3)
    fitter = ComputeFitter(sms=132).fit(few)
    assert "gemm:bf16" not in fitter.entries_
    assert "datasheet fallback" in fitter.report_.set_index("class").loc["gemm:bf16", "form"]


@pytest.fixture(scope="module")
def cli_fit(tmp_path_factory):
    """`perfmodel fit` on a part of the bundled H200 table (its bf16 GEMMs and fp32 layer norms)."""
    folder = tmp_path_factory.mktemp("tables")
    table = pd.read_csv(BUNDLED_H200_TABLES / "compute.csv")
    keep = ((table.op == "gemm") & (table.dtype == "bf16")) | ((table.op == "layernorm") & (table.dtype == "fp32"))
    table[keep].to_csv(folder / "compute.csv", index=False)
    out, plots = folder / "p.json", folder / "plots"
    proc = subprocess.run([sys.executable, "-m", "perfmodel.cli", "fit", str(folder), "--gpu", "h200", "-o", str(out),
                           "--plots", str(plots)], capture_output=True, text=True, timeout=300)
    return proc, out, plots


def test_cli_fit_prints_report_and_writes_profile(cli_fit):
    proc, out, plots = cli_fit
    assert proc.returncode == 0, proc.stderr
    assert "gemm:bf16" in proc.stdout and "cv_mape" in proc.stdout
    assert re.search(r"CV MAPE <= 8%: \d+ of \d+ cross-validated classes; above it: ", proc.stdout)
    assert (plots / "gemm_bf16.png").stat().st_size > 1000
    prof = pm.load_profile(str(out))
    assert prof.has("gemm:bf16") and prof.has("layernorm:fp32:fwd")


def _profile_dict():
    return pm.load_profile("h200-sxm-141gb").to_dict()


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(schema_version=SCHEMA_VERSION + 1), "newer than this perfmodel understands"),
    (lambda d: d.pop("gpu"), "field 'gpu' missing"),
    (lambda d: d["compute"]["gemm:bf16"].update(form="gemm_magic"), "unknown closed form 'gemm_magic'"),
    (lambda d: d["compute"]["gemm:bf16"]["params"].pop("R"), "parameters ['R'] missing"),
    (lambda d: d["compute"].update(bad={"params": {}}), "needs fields ['form', 'params']"),
    (lambda d: d.update(schema_version=0), "'schema_version' missing or not an integer >= 1: got 0"),
    (lambda d: d.update(schema_version=True), "'schema_version' missing or not an integer >= 1: got True"),
    (lambda d: d["compute"]["gemm:bf16"]["params"].update(R=float("nan")), "parameters ['R'] missing or not finite"),
    (lambda d: d["compute"]["gemm:bf16"]["params"].update(R=True), "parameters ['R'] missing or not finite"),
    (lambda d: d["compute"]["gemm:bf16"]["params"].update(R=0.0), "parameter 'R' must be > 0: got 0.0"),
    (lambda d: d["compute"]["gemm:bf16"]["params"].update(t0=-1e-6), "parameter 't0' must be >= 0"),
    (lambda d: d["compute"]["gemm:bf16"].update(params=[1, 2]), "'params' must be an object"),
    (lambda d: d["compute"]["gemm:bf16"].update(form=["a"]), "'form' must be a form name"),
    (lambda d: d.update(collectives=[1]), "'collectives' must be an object"),
    (lambda d: d.update(host={"cpu_per_kernel_s": float("inf")}), "host.cpu_per_kernel_s must be a number of seconds"),
    (lambda d: d.update(host={"cpu_per_kernel_s": "abc"}), "host.cpu_per_kernel_s must be a number of seconds"),
    (lambda d: d.update(host={"cpu_per_kernel_s": 1e300}), "host.cpu_per_kernel_s must be a number of seconds"),
    (lambda d: d["collectives"].update(moon={}), "unknown collectives level 'moon' (valid: intra, inter)"),
    (lambda d: d["collectives"]["intra"].update(all_reduce2=d["collectives"]["intra"]["all_reduce"]),
     "unknown collective 'all_reduce2'"),
    (lambda d: d["collectives"]["intra"].update(all_gather=d["compute"]["gemm:bf16"]),
     "form 'gemm_two' is not a communication form"),
])
def test_profile_schema_errors_name_the_field(tmp_path, mutate, message):
    data = _profile_dict()
    mutate(data)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(pm.PerfModelError) as err:
        pm.load_profile(str(path))
    assert message in str(err.value)


def test_profile_round_trip_and_garbage(tmp_path):
    prof = pm.load_profile("h200-sxm-141gb")
    path = tmp_path / "again.json"
    prof.save(path)
    assert Profile.from_dict(json.loads(path.read_text())).compute == json.loads(json.dumps(prof.compute))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(pm.ProfileError, match="not valid JSON"):
        pm.load_profile(str(bad))
    with pytest.raises(pm.UnknownNameError, match="unknown profile"):
        pm.load_profile("h300")


def test_build_profile_derives_fp8_from_the_datasheet(cli_fit):
    proc, out, _ = cli_fit  # the tables hold no fp8 GEMM: it is the bf16 fit scaled by the datasheet
    assert proc.returncode == 0, proc.stderr
    assert pm.load_profile(str(out)).compute["gemm:fp8"]["source"].startswith("derived")


def test_collectives_only_folder_fits_communication_and_falls_back_for_compute(tmp_path):
    from pathlib import Path

    from perfmodel.fit.nccl_tests import import_logs

    log = Path(__file__).parent / "fixtures" / "nccl_tests" / "all_reduce_perf_1node_8gpu.log"
    import_logs([str(log)], str(tmp_path))
    prof, report = build_profile([tmp_path], gpu="h100")
    assert "all_reduce" in prof.collectives["intra"]
    assert prof.compute["gemm:bf16"]["source"].startswith("datasheet fallback")
    compute = ~report["class"].str.contains("@")  # the collectives' rows are named collective@level
    assert (report.loc[compute, "form"] == "(datasheet fallback)").all()
    assert report.loc[~compute, "class"].tolist() == ["all_reduce@intra"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(pm.InvalidInputError, match="holds neither compute.csv nor collectives.csv"):
        build_profile([empty], gpu="h100")


def test_a_fit_with_no_usable_rows_is_refused(tmp_path):
    (tmp_path / "compute.csv").write_text("op,time_s,m,n,k,dtype\ngemm,abc,64,64,64,bf16\ngemm,-1,64,64,64,bf16\n")
    with pytest.raises(pm.InvalidInputError, match=r"no compute class could be fitted .*1 non-positive time_s"):
        build_profile([tmp_path], gpu="h200")


def test_a_partial_h200_table_keeps_the_bundled_classes_it_lacks(tmp_path):
    from perfmodel.fit.build import CALIBRATED_H200_TABLES

    table = read_compute_table(CALIBRATED_H200_TABLES)
    table[(table.op == "gemm") & (table.dtype == "bf16")].to_csv(tmp_path / "compute.csv", index=False)
    prof, report = build_profile([tmp_path], gpu="h200")
    assert prof.compute["gemm:bf16"]["n_points"] > 100
    assert prof.compute["layernorm:fp32:fwd"]["source"].startswith("bundled fallback")
    assert "(bundled fallback)" in set(report["form"])
    assert pm.predict(pm.preset("gpt2-small"), pm.cluster("h200"), pm.Strategy(), profile=prof).step_time > 0


SYNTHETIC_GEMM = {"R": 8e14, "k_half": 80.0, "m_half": 60.0, "n_half": 60.0, "t0": 4e-6, "t_cpu": 1.5e-5,
                  "p16": 0.95, "p8": 0.4, "p4": 0.3, "p2": 0.2, "p_both": 0.9, "bw": 4e12, "elem_bytes": 2.0}


def _synthetic_gemm_table(seed, points, log2_range, time_of):
    """A compute table of bf16 products m, n, k (multiples of 16); ``time_of(t_gpu, t_eager)`` -> rows."""
    from perfmodel.forms.registry import get_form
    from perfmodel.fit.tables import COMPUTE_COLUMNS

    rng = np.random.default_rng(seed)
    form = get_form("gemm_smooth")
    rows = []
    for _ in range(points):
        m, n, k = (int(2 ** rng.uniform(*log2_range)) // 16 * 16 for _ in range(3))
        gpu = float(form.evaluate({**SYNTHETIC_GEMM, "t_cpu": 0.0}, m=m, n=n, k=k))
        for extra in time_of(gpu, max(gpu, SYNTHETIC_GEMM["t_cpu"])):
            rows.append({"op": "gemm", "phase": "fwd", "dtype": "bf16", "m": m, "n": n, "k": k,
                         **extra, "time_s": extra["time_s"] * rng.normal(1, 0.01)})
    return pd.DataFrame(rows).reindex(columns=list(COMPUTE_COLUMNS))


def test_graph_timed_gemm_rows_are_fitted_without_the_eager_floor():
    """A product replayed in a CUDA graph measures GPU time alone: the CPU floor must not apply."""
    table = _synthetic_gemm_table(0, 60, (7, 14), lambda gpu, eager: [{"timing": "eager", "time_s": eager},
                                                                      {"timing": "graph", "time_s": gpu}])
    entry = ComputeFitter().fit(table).entries_["gemm:bf16"]
    assert entry["fit_mape"] < 0.03, entry
    assert entry["params"]["t_cpu"] == pytest.approx(SYNTHETIC_GEMM["t_cpu"], rel=0.15)


def test_power_limited_rows_leave_the_burst_rate_in_the_profile():
    """Products timed after long back-to-back load run at a fraction of the burst rate (the power
    limit); the fit keeps the burst rate and reports the fraction."""
    def throttled(gpu, eager):  # 13 calls of load: warm-up, probe and 10 reps of one call
        return [{"timing": "eager", "reps": 10, "inner": 1, "time_s": eager / (0.85 if eager * 13 > 0.03 else 1)}]

    table = _synthetic_gemm_table(1, 80, (9, 15), throttled)
    assert (table.time_s * 13 > 0.03).sum() >= 8
    entry = ComputeFitter().fit(table).entries_["gemm:bf16"]
    assert entry["params"]["R"] == pytest.approx(SYNTHETIC_GEMM["R"], rel=0.05)
    assert entry["power_limited"]["rate_fraction"] == pytest.approx(0.85, abs=0.03)
    assert "p_power" not in entry["params"]
    cpu = ComputeFitter(power_limited=False).fit(table).entries_["gemm:bf16"]
    assert "power_limited" not in cpu


def test_graph_rows_that_removed_no_floor_give_way_to_the_eager_rows():
    """Cross-entropy forward on this project's tables: five graph rows (0.26-1 GB) within 2% of their
    eager twins, twenty eager rows to 33 GB: the fit uses the eager rows. Copy's graph rows remove a
    floor at small sizes and are kept."""
    from perfmodel.fit.build import CALIBRATED_H200_TABLES
    from perfmodel.fit.compute import _floor_never_showed

    table = read_compute_table(CALIBRATED_H200_TABLES)
    fwd = table[table.phase == "fwd"]
    ce, copy = fwd[fwd.op == "cross_entropy"], fwd[fwd.op == "copy"]
    assert _floor_never_showed(ce[ce.timing == "graph"], ce[ce.timing == "eager"])
    assert not _floor_never_showed(copy[copy.timing == "graph"], copy[copy.timing == "eager"])
    slow = ce.assign(time_s=np.where(ce.timing == "eager", ce.time_s * 1.2, ce.time_s))
    assert not _floor_never_showed(slow[slow.timing == "graph"], slow[slow.timing == "eager"])
