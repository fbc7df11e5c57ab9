"""The P100, T4 and K80 GEMM and convolution classes seeded from public kernel benchmarks.

Fitted: ``perfmodel/profiles/data/reference/gemm_published.csv`` (the P100 rows) and
``perfmodel/data/deepbench-p100/compute.csv``, both converted from baidu-research/DeepBench
``results/train/DeepBench_NV_P100.xlsx`` @da81ba7 by ``tools/deepbench_gemm.py`` and
``tools/deepbench_conv.py``. The K80 has no kernel table of its own: its ``gemm:fp32`` is fitted to
cuBLAS 7.0 sgemm on a Tesla K40 (``gemm_same_architecture.csv``), its convolution classes are the P100's
(cuDNN 6.0.21) fitted one kernel shape at a time, as corrections of that Kepler GEMM (``fit.build.carried_conv``).
"""

from __future__ import annotations

import pytest

import perfmodel as pm
from perfmodel.profiles.datasheet import REFERENCE_PROFILE, datasheet_profile
from perfmodel.profiles.published import gemm_rows
from tools.deepbench_conv import conv_rows, data_cells
from tools.deepbench_gemm import gemm_rows as workbook_gemm_rows
from tools.p100_tf_check import score

P100 = "p100-pcie-16gb"


@pytest.fixture(scope="module")
def p100():
    return pm.load_profile(P100)


def test_rows_with_and_without_an_application_column_read_alike():
    assert data_cells(["DeepSpeech", "1760", "16"]) == ["1760", "16"]
    assert data_cells(["1760", "16"]) == ["1760", "16"]
    head = [["Convolution"], ["W", "H", "C", "N", "K ", "R", "S"]]
    shape = ["54", "54", "64", "8", "64", "3", "3", "1", "1", "1", "1", "0.5", "N/A*", "0.75", "54"]
    labelled = conv_rows(head + [["ResNet"] + shape], "fp32", "gpu")
    bare = conv_rows(head + [shape], "fp32", "gpu")
    assert labelled == bare
    assert [(r["phase"], r["time_s"]) for r in bare] == [("fwd", 0.0005), ("wgrad", 0.00075)]


def test_the_gemm_block_keeps_aligned_shapes_and_skips_empty_cells():
    sheet = [["Dense Matrix Multiplication", "M", "N", "K"],
             ["1760", "16", "1760", "N", "N", "0.055", "1.8"],
             ["512", "48000", "2048", "T", "N", None, "11.711", "8.6"],
             ["35", "700", "2048", "N", "N", "0.5", "0.2"],  # n = 700: not a multiple of 8
             ["Recurrent Layers", "Hidden Units"]]
    rows = workbook_gemm_rows(sheet, "fp32", P100, "src")
    assert [(r["m"], r["n"], r["k"]) for r in rows] == [(1760, 16, 1760), (512, 48000, 2048)]
    assert rows[1]["tflops"] == pytest.approx(2 * 512 * 48000 * 2048 / 11.711e-3 / 1e12, rel=1e-4)
    assert rows[1]["source"] == "src; transposes TN"


def test_no_published_p100_rate_passes_the_fp32_peak():
    rows = gemm_rows(P100)
    assert set(rows.dtype) == {"fp32", "fp16"} and len(rows) == 176
    rate = 2.0 * rows.m * rows.n * rows.k / rows.time_s
    # GP100 has no tensor cores; DeepBench's 16-bit sheet multiplies in fp32 too
    assert rate.max() <= pm.load_gpu(P100).peak_flops["fp32"]


def test_the_p100_gemms_are_fitted_to_deepbench(p100):
    for dtype in ("fp32", "fp16"):
        entry = p100.entry(f"gemm:{dtype}")
        assert entry["n_points"] == 88 and "DeepBench_NV_P100.xlsx" in entry["source"]
        assert entry["cv_mape"] < 0.25
        assert 8e12 < entry["params"]["R"] <= pm.load_gpu(P100).peak_flops["fp32"]


def test_the_p100_convolutions_are_seeded_from_deepbench(p100):
    entry = p100.entry("conv.dense-k3x3-s1:fp32:fwd")
    assert entry["source"] == "measured (published): deepbench-p100"
    assert entry["n_points"] >= 20 and 0 < entry["cv_mape"] < entry["reference_only_mape"]
    assert p100.meta["seeded_from"] == "deepbench-p100"
    assert "seeded_from" not in pm.load_profile("k80").meta


def test_the_one_gpu_tensorflow_p100_runs_are_checked_within_20_percent():
    # check data (TensorFlow's performance page, DGX-1, May 2017): nothing is fitted to it; the
    # datasheet-scaled P100 was 19.1% off at the median, VGG16 -56% (docs/validation.md)
    errors = sorted(abs(pred / meas - 1) for _, _, meas, pred in score())
    assert len(errors) == 8
    assert errors[len(errors) // 2] < 0.20


def test_the_k80_takes_its_kepler_sibling_gemms_at_the_same_fraction_of_peak():
    # cuBLAS 7.0 sgemm on a Tesla K40 (5.04 TFLOP/s at 875 MHz); one GK210 of a K80: 4.37
    rows = gemm_rows("k80")
    assert len(rows) == 180 and "measured on tesla-k40" in rows.source.iloc[0]
    big = rows[rows.m == 4096].iloc[0]
    assert 2.0 * 4096**3 / big.time_s == pytest.approx(3.27529e12 * 4.37e12 / 5.04e12, rel=1e-3)
    assert gemm_rows("l4").empty  # no rows of its own and no sibling's


def test_the_k80_gemm_is_fitted_to_the_kepler_rows():
    entry = pm.load_profile("k80").entry("gemm:fp32")
    assert entry["n_points"] == 180 and "Tesla_K40/sgemm.csv" in entry["source"]
    assert entry["cv_mape"] < 0.05
    assert entry["params"]["R"] < 0.75 * pm.load_gpu("k80").peak_flops["fp32"]
    # cubes cannot split saturation over m, n and k: the split stays the scaled entry's
    scaled = datasheet_profile("k80", pm.load_profile(REFERENCE_PROFILE)).compute["gemm:fp32"]["params"]
    assert {k: entry["params"][k] for k in ("k_half", "m_half", "n_half")} == pytest.approx(
        {k: scaled[k] for k in ("k_half", "m_half", "n_half")})


def test_the_k80_convolutions_are_the_p100_shape_classes_over_its_own_gemm(p100):
    from perfmodel.costs.cnn import cnn_kernel_time, conv_pass_kernel, reference_seconds, unmeasured

    k80 = pm.load_profile("k80")
    assert k80.meta["conv_carried_from"] == P100
    convs = sorted(k for k in k80.compute if k.startswith("conv."))
    # the P100's one-shape classes in fp32 only, and its pool of the shapes no Winograd algorithm runs
    # (conv.dense-gemm): no H200 bf16 class, no pooled kind entry
    assert convs == sorted(k for k in p100.compute if k.startswith("conv.dense-") and ":fp32:" in k)
    assert {f"conv.dense-gemm:fp32:{p}" for p in ("fwd", "dgrad", "wgrad")} <= set(convs)
    entry = k80.compute["conv.dense-k3x3-s1:fp32:fwd"]
    assert entry["params"] == p100.compute["conv.dense-k3x3-s1:fp32:fwd"]["params"]
    assert entry["source"].startswith("carried from p100-pcie-16gb (measured (published): deepbench-p100")
    # t = t0 + c · t_ref, t_ref the implicit GEMM on the K80's own (Kepler) gemm:fp32
    kern = conv_pass_kernel("c", "fwd", "fwd", 32, 256, 256, 28, 3, dtype="fp32")
    t_ref, ref_entry = reference_seconds(k80, kern)
    assert ref_entry is k80.entry("gemm:fp32")
    t, _ = cnn_kernel_time(k80, kern)
    assert float(t) == pytest.approx(entry["params"]["t0"] + entry["params"]["c"] * float(t_ref))
    # a Winograd shape the P100 table did not measure alone runs at its implicit GEMM, and is named so
    five = conv_pass_kernel("c", "fwd", "fwd", 32, 128, 128, 17, 5, dtype="fp32")
    assert float(cnn_kernel_time(k80, five)[0]) == pytest.approx(float(reference_seconds(k80, five)[0]))
    assert unmeasured(k80, [five]) == ["conv.dense-k5x5-s1:fp32:fwd"]
    # one no Winograd algorithm runs takes the measured GEMM-only pool
    seven = conv_pass_kernel("c", "fwd", "fwd", 32, 128, 128, 17, 7, dtype="fp32")
    pool = k80.compute["conv.dense-gemm:fp32:fwd"]["params"]
    assert float(cnn_kernel_time(k80, seven)[0]) == pytest.approx(
        pool["t0"] + pool["c"] * float(reference_seconds(k80, seven)[0]))
    assert unmeasured(k80, [seven]) == []


def test_the_bundled_k80_is_its_carried_profile(p100):
    from perfmodel.fit.build import carried_conv

    k80 = pm.load_profile("k80")
    again = carried_conv(k80, p100)  # the datasheet's conv classes are already gone; carrying twice is a no-op
    assert again.compute == k80.compute


def test_two_workbooks_compare_on_the_shapes_both_timed(monkeypatch):
    import tools.deepbench_compare as dc

    conv = [["Convolution"], ["W", "H", "C", "N", "K ", "R", "S"]]
    shape = ["14", "14", "64", "8", "64", "3", "3", "1", "1", "1", "1"]
    gemm = [["Dense Matrix Multiplication", "M", "N", "K"]]
    sheets = {"a": conv + [shape + ["2.0", "N/A*", "4.0", "x"], ["28"] + shape[1:] + ["1", "1", "1", "x"]]
              + gemm + [["1024", "1024", "1024", "N", "N", "1.0", "x"]],
              "b": conv + [shape + ["1.0", "N/A*", "1.0", "x"]] + gemm + [["1024", "1024", "1024", "N", "N", "0.5", "x"]]}
    monkeypatch.setattr(dc, "_fp32_sheet", lambda path: sheets[path])
    table = dc.compare("a", 1e12, "b", 2e12)
    flops = 2.0 * 8 * 64 * 14**2 * 64 * 9  # the forward's FLOPs, every pass
    assert table.loc["conv k3 s1 fwd", "a"] == pytest.approx(flops / 2e-3 / 1e12)
    assert table.loc["conv k3 s1 fwd", "ratio"] == pytest.approx(1.0)  # half the time at half the peak
    assert table.loc["conv k3 s1 wgrad", "ratio"] == pytest.approx(0.5)
    assert table.loc["gemm", "ratio"] == pytest.approx(1.0) and table.loc["conv k3 s1 fwd", "shapes"] == 1


def test_the_k80_memory_classes_follow_its_published_copies():
    from perfmodel.forms.registry import get_form
    from perfmodel.profiles.reference import stream_copy_bw

    # eight GK210 of one server (p2pBandwidthLatencyTest diagonal) and one ECC-on GCE VM (bandwidthTest)
    assert stream_copy_bw("k80") == pytest.approx(172.79e9)
    k80, h200 = pm.load_profile("k80"), pm.load_profile(REFERENCE_PROFILE)

    def seconds(profile):
        e = profile.entry("copy:fp32:fwd")
        return float(get_form(e["form"]).evaluate({**e["params"], "t_cpu": 0.0}, x=1e8))

    # a datasheet class scales by the measured copies' ratio, not 240 GB/s against the H200's 4.8 TB/s
    assert seconds(k80) / seconds(h200) == pytest.approx(stream_copy_bw(REFERENCE_PROFILE) / 172.79e9, rel=0.02)


def test_the_k80_gemm_fit_meets_a_k80s_own_sgemm():
    # check data, not fitted: CUDA 8.0 batchCUBLAS, 100 back-to-back sgemm 1536^3 on each GK210 of a
    # 4-board K80 server (flyliu2017/pai210 tests/PerformanceTest/gpu105-test-result.txt @5b08b980)
    from perfmodel.forms.registry import get_form

    published = [3032.22, 2523.84, 2709.37, 2620.09, 2616.45, 2496.43, 2588.1, 2527.11]  # GFLOP/s
    e = pm.load_profile("k80").entry("gemm:fp32")
    n = 1536.0
    rate = 2.0 * n**3 / float(get_form(e["form"]).evaluate({**e["params"], "t_cpu": 0.0}, m=n, n=n, k=n))
    median = sorted(published)[3:5]
    assert rate / (sum(median) / 2 * 1e9) - 1 == pytest.approx(0.0, abs=0.05)


def test_the_t4_convolutions_are_seeded_from_deepbench_over_its_own_fp32_gemm():
    t4 = pm.load_profile("t4")
    assert t4.meta["seeded_from"] == "deepbench-t4"
    for dtype in ("fp32", "fp16"):  # Turing has no bf16: the table's two sheets
        entry = t4.entry(f"conv.dense-k3x3-s1:{dtype}:fwd")
        assert entry["source"] == "measured (published): deepbench-t4" and entry["n_points"] == 24
        assert 0 < entry["cv_mape"] < entry["reference_only_mape"]
    # the strided data gradient costs more over its implicit GEMM than the stride-1 one, as on the P100 and V100
    for dtype in ("fp32", "fp16"):
        assert t4.entry(f"conv.dense-gemm-strided:{dtype}:dgrad")["params"]["c"] > \
            1.5 * t4.entry(f"conv.dense-gemm:{dtype}:dgrad")["params"]["c"]


def test_the_profile_origin_names_where_the_convolution_classes_come_from():
    from perfmodel.profiles.origin import profile_origin

    assert profile_origin(pm.load_profile("t4")).endswith("; convolution classes fitted to deepbench-t4")
    assert profile_origin(pm.load_profile("k80")).endswith("; convolution classes carried from p100-pcie-16gb")
    assert "convolution classes" not in profile_origin(pm.load_profile("h100-sxm5-80gb"))
