"""CNN kernel classes: classification, pricing against hand-computed reference times, fitting, seeds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

import perfmodel as pm
from perfmodel.costs.cnn import (
    class_entry,
    cnn_kernel_time,
    conv_kind,
    conv_label,
    conv_pass_kernel,
    output_fill,
    pooled_label,
    reference_seconds,
    unmeasured,
    winograd_eligible,
)
from perfmodel.fit.compute import ComputeFitter
from perfmodel.fit.tables import COMPUTE_COLUMNS
from perfmodel.fit.conv import class_rows, fit_classes
from perfmodel.forms.registry import get_form
from perfmodel.workload.ops import Kernel


@pytest.fixture(scope="module")
def h200():
    return pm.load_profile("h200-sxm-141gb")


def test_convolutions_are_classed_by_kind_kernel_and_stride():
    assert conv_kind(1, 64) == "dense"
    assert conv_kind(32, 128) == "grouped"  # ResNeXt: 4 channels per group
    assert conv_kind(144, 144) == "depthwise"
    assert conv_label(5, 5, 2, 144, 144) == "depthwise-k5x5-s2"
    assert conv_label(1, 7, 1, 1, 768) == "dense-k1x7-s1"


def _gemm_seconds(profile, m, n, k, dtype="bf16"):
    entry = profile.entry(f"gemm:{dtype}")
    return float(get_form(entry["form"]).evaluate({**entry["params"], "t_cpu": 0.0}, m=m, n=n, k=k))


def _copy_seconds(profile, nbytes):
    entry = profile.entry("copy:fp32:fwd")
    return float(get_form(entry["form"]).evaluate({**entry["params"], "t_cpu": 0.0}, x=nbytes / 8.0))


def test_an_unmeasured_dense_pass_is_its_implicit_gemm(h200):
    # 3x3, 64 -> 64 channels, 56x56, batch 32: dgrad GEMM m = 32*56*56, n = 64*9, k = 64
    kern = conv_pass_kernel("c", "bwd", "dgrad", 32, 64, 64, 56, 3, 1, dtype="bf16")
    assert class_entry(h200, kern) == (None, None)
    gpu, _ = cnn_kernel_time(h200, kern)
    assert float(gpu) == pytest.approx(_gemm_seconds(h200, 32 * 56 * 56, 64 * 9, 64), rel=1e-12)
    assert unmeasured(h200, [kern]) == ["conv.dense-k3x3-s1:bf16:dgrad"]


def test_a_depthwise_conv_is_bandwidth_bound_not_a_k9_gemm(h200):
    # depthwise 3x3 over 144 channels at 56x56, batch 64: moves X + W + Y = 2*64*144*56*56 + 144*9 elements
    kern = conv_pass_kernel("dw", "fwd", "fwd", 64, 144, 144, 56, 3, 1, groups=144, dtype="bf16")
    moved = (2 * 64 * 144 * 56 * 56 + 144 * 9) * 2
    t_ref, _ = reference_seconds(h200, kern)
    assert float(t_ref) == pytest.approx(_copy_seconds(h200, moved), rel=1e-12)
    as_gemm = _gemm_seconds(h200, 64 * 56 * 56, 144, 9)  # k = 9: the misaligned-GEMM price it used to get
    assert float(t_ref) < as_gemm


def test_a_fitted_class_corrects_its_reference(h200):
    kern = conv_pass_kernel("c", "fwd", "fwd", 64, 256, 256, 14, 3, 1, dtype="bf16")
    entry = {"form": "scaled_ref", "params": {"t0": 2e-6, "c": 0.5, "t_cpu": 0.0}, "cv_mape": 0.1,
             "n_points": 5, "source": "test"}
    prof = dataclasses.replace(h200, compute={**h200.compute, "conv.dense-k3x3-s1:bf16:fwd": entry})
    t_ref, _ = reference_seconds(prof, kern)
    gpu, _ = cnn_kernel_time(prof, kern)
    assert float(gpu) == pytest.approx(2e-6 + 0.5 * float(t_ref), rel=1e-12)
    # a kind-level entry serves classes of that kind fitted nowhere else; another kind is untouched
    pooled = dataclasses.replace(h200, compute={**h200.compute, "conv.depthwise:bf16:fwd": entry})
    dw = conv_pass_kernel("dw", "fwd", "fwd", 64, 96, 96, 112, 3, 2, groups=96, dtype="bf16")
    assert class_entry(pooled, dw)[1] == "conv.depthwise:bf16:fwd"
    assert class_entry(pooled, kern)[1] != "conv.depthwise:bf16:fwd"


def test_batch_norm_is_priced_by_its_bytes_at_copy_bandwidth(h200):
    kern = Kernel("bn", "batchnorm", "fwd", {"bytes": 3 * 64 * 256 * 56 * 56 * 2.0}, 1, 0.0, "fwd", "bf16")
    gpu, _ = cnn_kernel_time(h200, kern)
    assert float(gpu) == pytest.approx(_copy_seconds(h200, kern.size["bytes"]), rel=1e-12)


def test_fit_recovers_a_known_correction(h200):
    """Rows timed at 0.6 x their implicit GEMM + 3 µs: the fit finds c and the CV error is small."""
    rng = np.random.default_rng(0)
    shapes = [(b, c, hw) for b in (32, 64, 128) for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7))]
    rows = []
    for b, c, hw in shapes:
        kern = conv_pass_kernel("c", "bwd", "wgrad", b, c, c, hw, 3, 1, dtype="bf16")
        t = 3e-6 + 0.6 * float(reference_seconds(h200, kern)[0])
        rows.append({"op": "conv2d", "phase": "wgrad", "timing": "eager", "dtype": "bf16", "batch": b, "cin": c,
                     "cout": c, "hw": hw, "kernel": 3, "stride": 1, "groups": 1,
                     "bytes": np.nan, "time_s": t * rng.uniform(0.98, 1.02)})
    entries = fit_classes(pd.DataFrame(rows), h200)
    entry = entries["conv.dense-k3x3-s1:bf16:wgrad"]
    assert entry["params"]["c"] == pytest.approx(0.6, rel=0.05)
    assert entry["cv_mape"] < 0.03
    assert "conv.dense:bf16:wgrad" in entries  # pooled per kind as well


def test_cnn_presets_have_torchvision_parameter_counts_and_their_classes():
    b0, rx = pm.preset("efficientnet-b0"), pm.preset("resnext50-32x4d")
    assert b0.params == 5_288_548 and rx.params == 25_028_904
    kinds = {op.op: op for op in b0.ops if op.cls == "conv"}
    assert any(op.size["groups"][0] > 1 and op.size["cin"][0] == op.size["groups"][0] for op in kinds.values())
    assert {"silu", "sigmoid", "batchnorm", "se_pool"} <= {op.cls for op in b0.ops}
    assert any(1 < op.size["groups"][0] < op.size["cin"][0] for op in rx.ops if op.cls == "conv")


def test_predictions_name_unmeasured_cnn_classes(h200):
    p = pm.predict("efficientnet-b0", "h200", pm.Strategy(micro_batch=32))
    assert len(p.caveats) == 1 and "conv.depthwise-k3x3-s1:bf16:fwd" in p.caveats[0]
    assert pm.predict("gpt2-small", "h200", pm.Strategy(micro_batch=4)).caveats == ()


def _wgrad_rows(h200, a: float):
    """Weight-gradient rows timed at 0.6 x their implicit GEMM x max(1, SMs / output tiles)^a + 3 µs, from
    channel counts whose output fills two tiles (16 channels) to many (512)."""
    rng = np.random.default_rng(1)
    rows = []
    for b in (32, 64, 128):
        for c, hw in ((16, 32), (32, 32), (64, 56), (128, 28), (256, 14), (512, 7)):
            kern = conv_pass_kernel("c", "bwd", "wgrad", b, c, c, hw, 3, 1, dtype="bf16")
            t = 3e-6 + 0.6 * float(reference_seconds(h200, kern)[0]) * float(output_fill(h200, kern)) ** a
            rows.append({"op": "conv2d", "phase": "wgrad", "timing": "eager", "dtype": "bf16", "batch": b,
                         "cin": c, "cout": c, "hw": hw, "kernel": 3, "stride": 1, "groups": 1,
                         "bytes": np.nan, "time_s": t * rng.uniform(0.98, 1.02)})
    return pd.DataFrame(rows)


def test_a_pass_of_few_output_tiles_takes_its_sm_shortfall_only_where_cv_shows_it(h200):
    # 132 SMs: a 16-channel 3x3 weight gradient (m = 16, n = 144) is two 128x128 tiles, a 512-channel one 144
    few = conv_pass_kernel("c", "bwd", "wgrad", 64, 16, 16, 32, 3, 1, dtype="bf16")
    many = conv_pass_kernel("c", "bwd", "wgrad", 64, 512, 512, 7, 3, 1, dtype="bf16")
    assert float(output_fill(h200, few)) == pytest.approx(66.0) and float(output_fill(h200, many)) == 1.0
    shortfall = fit_classes(_wgrad_rows(h200, 0.5), h200)["conv.dense-k3x3-s1:bf16:wgrad"]
    assert shortfall["form"] == "scaled_ref_fill" and shortfall["params"]["a"] == pytest.approx(0.5, abs=0.05)
    plain = fit_classes(_wgrad_rows(h200, 0.0), h200)["conv.dense-k3x3-s1:bf16:wgrad"]
    assert plain["form"] == "scaled_ref"  # no shortfall in the rows: the extra exponent does not pay
    # priced: the two-tile pass runs 66^a slower than its scaled reference, the full one not at all
    prof = dataclasses.replace(h200, compute={**h200.compute, "conv.dense-k3x3-s1:bf16:wgrad": shortfall})
    p = shortfall["params"]
    for kern, fill in ((few, 66.0), (many, 1.0)):
        t_ref = float(reference_seconds(prof, kern)[0])
        assert float(cnn_kernel_time(prof, kern)[0]) == pytest.approx(p["t0"] + p["c"] * t_ref * fill ** p["a"])


def test_the_v100_profile_is_seeded_from_deepbench():
    v100 = pm.load_profile("v100-sxm2-32gb")
    entry = v100.entry("conv.dense-k3x3-s1:fp16:fwd")
    assert entry["source"] == "measured (published): deepbench-v100"
    assert entry["n_points"] >= 20 and 0 < entry["cv_mape"] < entry["reference_only_mape"]
    assert v100.meta["seeded_from"] == "deepbench-v100"


def test_a_conv_op_without_its_sizes_is_refused_by_name(h200):
    kern = Kernel("aten.convolution", "conv", "fwd", {"m": 8.0, "n": 8.0, "k": 8.0}, 1, 0.0, "fwd", "bf16")
    with pytest.raises(pm.UnsupportedError, match=r"lacks sizes \['x', 'kh', 'kw', 'stride', 'groups', 'cin'\]"):
        cnn_kernel_time(h200, kern)


def test_the_prediction_table_prints_the_caveat():
    from perfmodel.report.tables import prediction_table

    text = prediction_table(pm.predict("efficientnet-b0", "h200", pm.Strategy(micro_batch=32)))
    assert "caveat     " in text and "CNN kernel classes not measured on h200-sxm-141gb" in text


def _per_sample(pair):
    return pair[0] + pair[1]  # (constant, per-sample) at batch 1


def test_every_pass_of_a_grouped_conv_counts_the_forward_flops():
    # torch's flop counter ignores groups in the weight gradient; the tracer counts N·PQ·Cout·Cin/g·RS per pass
    for name in ("efficientnet-b0", "resnext50-32x4d"):
        convs = [op for op in pm.preset(name).ops if op.cls == "conv" and op.size["groups"][0] > 1]
        assert {op.variant for op in convs} == {"fwd", "dgrad", "wgrad"}
        for op in convs:
            m, n, k = (_per_sample(op.size[d]) for d in ("m", "n", "k"))
            assert _per_sample(op.flops) == pytest.approx(2.0 * m * n * k, rel=1e-9), (name, op.op)


@pytest.fixture(scope="module")
def se_block():
    """Batch norm, SiLU, a depthwise 3x3 and a squeeze-excitation gate over 16 x 8 x 8 activations, traced."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bn, self.fc1, self.fc2 = torch.nn.BatchNorm2d(16), torch.nn.Conv2d(16, 4, 1), torch.nn.Conv2d(4, 16, 1)
            self.head = torch.nn.Conv2d(16, 4, 1)
            self.dw = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False)

        def forward(self, x):
            x = self.dw(F.silu(self.bn(x)))
            gate = torch.sigmoid(self.fc2(F.silu(self.fc1(x.mean((2, 3), keepdim=True)))))
            return self.head(x * gate).mean((2, 3))

    graph = pm.from_torch(Block(), torch.randn(2, 16, 8, 8), name="se-block")
    return graph.ops


def _elements_per_image(op):
    return sum(op.size[k][1] for k in ("low", "f32") if k in op.size)


def _moved(ops, name, phase) -> list:
    """Elements per image of each traced op ``name`` in ``phase``, sorted."""
    return sorted(_elements_per_image(op) for op in ops if op.op == name and op.phase == phase)


def test_batch_norm_silu_and_squeeze_excitation_move_the_bytes_aten_moves(se_block):
    x, c = 16 * 8 * 8, 16  # elements of one image's activation, channels
    ops = se_block
    # training batch norm: statistics pass and normalise pass read x twice, write y; backward reads dy and x
    # twice (reduce, then elementwise) and writes dx (native_batch_norm / _backward, channels-last kernels)
    assert _moved(ops, "aten.native_batch_norm", "fwd") == [3 * x]
    assert _moved(ops, "aten.native_batch_norm_backward", "bwd") == [5 * x]
    # SiLU: y = f(x) reads and writes; dx = f'(x)·dy reads two. The small ones are the gate's, on N·C/4
    assert _moved(ops, "aten.silu", "fwd") == [2 * c // 4, 2 * x]
    assert _moved(ops, "aten.silu_backward", "bwd") == [3 * c // 4, 3 * x]
    assert {op.cls for op in ops if op.op.startswith("aten.silu")} == {"silu"}
    # squeeze: read x, write N·C (and the head's global pool over its 4 x 8 x 8 output)
    assert _moved(ops, "aten.mean", "fwd") == [4 * 64 + 4, x + c]
    assert {op.cls for op in ops if op.op == "aten.mean"} == {"se_pool"}
    assert _moved(ops, "aten.sigmoid", "fwd") == [2 * c]  # the gate: N·C only
    # excitation: x · gate reads x and the N·C gate, writes x: a class of its own (a broadcast, not a copy)
    assert _moved(ops, "aten.mul", "fwd") == [2 * x + c]
    assert {op.cls for op in ops if op.op == "aten.mul" and op.phase == "fwd"} == {"se_scale"}


def test_a_traced_depthwise_backward_has_the_forward_flops(se_block):
    flops = {op.variant: op.flops[1] for op in se_block if op.cls == "conv" and op.size["groups"][0] > 1}
    assert flops["fwd"] == pytest.approx(2 * 8 * 8 * 16 * 9)  # per image: P·Q·C·R·S multiply-adds
    assert flops["dgrad"] == pytest.approx(flops["fwd"]) and flops["wgrad"] == pytest.approx(flops["fwd"])


def test_squeeze_excitation_backward_is_priced_as_aten_runs_it(se_block):
    x = 16 * 8 * 8
    assert _moved(se_block, "aten.mul", "bwd") == [2 * x + 16, 3 * x]  # dy·gate -> dx; dy·x for the gate's grad
    by_class = {op.cls: _elements_per_image(op) for op in se_block if op.op == "aten.mul" and op.phase == "bwd"}
    assert by_class == {"se_scale": 2 * x + 16, "bytes": 3 * x}  # dy·gate is the excitation's own kernel
    sums = [op for op in se_block if op.op == "aten.sum" and op.phase == "bwd"]
    assert [op.size["x"][1] for op in sums] == [x]  # dy·x summed over H·W
    assert _moved(se_block, "aten.div", "bwd") == [4 * 64 + 4, x + 16]  # the means' backward: N·C spread over H·W


def test_a_measured_depthwise_efficiency_reaches_the_prediction(h200):
    """Depthwise weight-gradient rows timed at 40% of copy bandwidth + 2 µs (what calibrate would write):
    the fit finds c = 2.5, and an EfficientNet-B0 step priced on the profile carrying it is slower and no
    longer names the class as unmeasured."""
    shapes = [(64, 32, 112), (64, 144, 56), (128, 144, 56), (64, 480, 14), (64, 1152, 7)]  # 3x3, stride 1
    rows = []
    for b, c, hw in shapes:
        kern = conv_pass_kernel("dw", "bwd", "wgrad", b, c, c, hw, 3, 1, groups=c, dtype="bf16")
        rows.append({"op": "conv2d", "phase": "wgrad", "timing": "eager", "dtype": "bf16", "batch": b, "cin": c,
                     "cout": c, "hw": hw, "kernel": 3, "stride": 1, "groups": c, "bytes": np.nan,
                     "time_s": 2e-6 + 2.5 * float(reference_seconds(h200, kern)[0])})
    entries = fit_classes(pd.DataFrame(rows), h200, folds=2)
    key = "conv.depthwise-k3x3-s1:bf16:wgrad"
    assert entries[key]["params"]["c"] == pytest.approx(2.5, rel=0.05)
    assert entries[key]["reference"] == "bytes moved at copy:fp32:fwd"
    measured = dataclasses.replace(h200, compute={**h200.compute, key: entries[key]})
    strategy = pm.Strategy(micro_batch=128, precision="bf16-mixed", optimizer="sgd")
    before = pm.predict(pm.preset("efficientnet-b0"), "h200", strategy, profile=h200)
    after = pm.predict(pm.preset("efficientnet-b0"), "h200", strategy, profile=measured)
    assert after.step_time > before.step_time * 1.005
    assert key in " ".join(before.caveats) and key not in " ".join(after.caveats)


def test_a_class_without_its_reference_fits_is_reported_skipped_with_the_reason(h200):
    """Depthwise rows measured without the run's GEMM and copy rows cannot be fitted (a class is a
    correction of those): the fit report says why, rather than listing a silent datasheet fallback."""
    rows = []
    for b, c, hw in [(64, 32, 112), (64, 144, 56), (128, 144, 56), (64, 480, 14), (64, 1152, 7)]:
        kern = conv_pass_kernel("dw", "bwd", "wgrad", b, c, c, hw, 3, 1, groups=c, dtype="bf16")
        rows.append({"op": "conv2d", "phase": "wgrad", "timing": "eager", "dtype": "bf16", "batch": b, "cin": c,
                     "cout": c, "hw": hw, "kernel": 3, "stride": 1, "groups": c, "bytes": np.nan, "reps": 10,
                     "inner": 1, "time_s": 2e-6 + 2.5 * float(reference_seconds(h200, kern)[0])})
    table = pd.DataFrame(rows).reindex(columns=list(dict.fromkeys([*COMPUTE_COLUMNS, *rows[0]])))
    report = ComputeFitter(folds=2).fit(table).report_.set_index("class")
    assert "measure --ops gemm,copy" in report.loc["conv.depthwise-k3x3-s1:bf16:wgrad", "form"]


def test_only_3x3_and_5x5_at_stride_1_are_winograd_shapes():
    # cuDNN's WINOGRAD (3x3) and WINOGRAD_NONFUSED (3x3, 5x5) algorithms, stride 1 only
    assert winograd_eligible(3, 3, 1) and winograd_eligible(5, 5, 1)
    assert not any(winograd_eligible(kh, kw, s) for kh, kw, s in ((1, 7, 1), (7, 1, 1), (3, 1, 1), (1, 1, 1),
                                                                   (3, 3, 2), (7, 7, 2), (5, 5, 2)))
    assert pooled_label(1, 7, 1, 1, 768) == "dense-gemm" and pooled_label(3, 3, 1, 1, 64) == "dense"
    assert pooled_label(3, 3, 2, 96, 96) == "depthwise"  # only dense shapes take the GEMM-only pool
    assert pooled_label(3, 3, 2, 1, 64) == pooled_label(1, 1, 2, 1, 64) == "dense-gemm-strided"


def test_a_shape_winograd_cannot_run_takes_the_gemm_only_pool_not_the_kind_pool(h200):
    def entry(c):
        return {"form": "scaled_ref", "params": {"t0": 0.0, "c": c, "t_cpu": 0.0}, "n_points": 5, "source": "t"}
    both = {"conv.dense:bf16:fwd": entry(0.6), "conv.dense-gemm:bf16:fwd": entry(1.3)}
    prof = dataclasses.replace(h200, compute={**h200.compute, **both})
    row = conv_pass_kernel("c", "fwd", "fwd", 64, 128, 128, 17, 1, 1, dtype="bf16")
    row = dataclasses.replace(row, size={**row.size, "kh": 1.0, "kw": 7.0})  # a 1x7 (InceptionV3's C blocks)
    square = conv_pass_kernel("c", "fwd", "fwd", 64, 128, 128, 17, 5, 1, dtype="bf16")  # Winograd's 5x5
    assert class_entry(prof, row)[1] == "conv.dense-gemm:bf16:fwd"
    assert class_entry(prof, square)[1] == "conv.dense:bf16:fwd"
    t_ref, _ = reference_seconds(prof, row)
    assert float(cnn_kernel_time(prof, row)[0]) == pytest.approx(1.3 * float(t_ref), rel=1e-12)
    # without a GEMM-only entry such a shape runs at its implicit GEMM, never at the Winograd-heavy pool's c
    others = {k: v for k, v in h200.compute.items() if not k.startswith("conv.dense-gemm")}
    kind_only = dataclasses.replace(h200, compute={**others, "conv.dense:bf16:fwd": entry(0.6)})
    assert class_entry(kind_only, row) == (None, None)


def test_the_gemm_only_pools_are_fitted_on_the_shapes_winograd_cannot_run_by_stride(h200):
    rows = []
    shapes = {1.5: ((1, 1, 64), (1, 1, 128), (1, 1, 256), (1, 1, 512)),  # stride 1, no Winograd
              2.5: ((1, 2, 128), (3, 2, 64), (3, 2, 128), (7, 2, 64)),  # strided
              0.6: ((3, 1, 64), (3, 1, 128), (7, 2, 3))}  # Winograd's 3x3, and a 3-channel stem
    for scale, group in shapes.items():
        for kernel, stride, c in group:
            kern = conv_pass_kernel("c", "fwd", "fwd", 32, c, c, 28, kernel, stride, dtype="bf16")
            rows.append({"op": "conv2d", "phase": "fwd", "timing": "eager", "dtype": "bf16", "batch": 32, "cin": c,
                         "cout": c, "hw": 28, "kernel": kernel, "stride": stride, "groups": 1, "bytes": np.nan,
                         "time_s": scale * float(reference_seconds(h200, kern)[0])})
    table = class_rows(pd.DataFrame(rows))
    # 3x3 at stride 1 runs by Winograd; a 3-channel stem is no GEMM-shaped layer: neither joins a pool
    assert list(table.gemm_only_key) == ["conv.dense-gemm:bf16:fwd"] * 4 + ["conv.dense-gemm-strided:bf16:fwd"] * 4 \
        + [""] * 3
    entries = fit_classes(pd.DataFrame(rows), h200)
    for key, c in (("conv.dense-gemm:bf16:fwd", 1.5), ("conv.dense-gemm-strided:bf16:fwd", 2.5)):
        assert entries[key]["n_points"] == 4
        assert entries[key]["params"]["c"] == pytest.approx(c, rel=0.05)
    assert entries["conv.dense:bf16:fwd"]["n_points"] == 11


def test_a_strided_shape_takes_the_strided_pool_else_the_stride_1_pool(h200):
    def entry(c):
        return {"form": "scaled_ref", "params": {"t0": 0.0, "c": c, "t_cpu": 0.0}, "n_points": 5, "source": "t"}
    others = {k: v for k, v in h200.compute.items() if not k.startswith("conv.dense-gemm")}
    pools = {"conv.dense-gemm:bf16:dgrad": entry(0.9), "conv.dense-gemm-strided:bf16:dgrad": entry(2.4)}
    prof = dataclasses.replace(h200, compute={**others, **pools})
    down = conv_pass_kernel("c", "bwd", "dgrad", 64, 128, 128, 56, 3, 2, dtype="bf16")  # ResNet v1.5's 3x3 s2
    seven = conv_pass_kernel("c", "bwd", "dgrad", 64, 128, 128, 17, 7, 1, dtype="bf16")
    assert class_entry(prof, down)[1] == "conv.dense-gemm-strided:bf16:dgrad"
    assert class_entry(prof, seven)[1] == "conv.dense-gemm:bf16:dgrad"
    t_ref, _ = reference_seconds(prof, down)
    assert float(cnn_kernel_time(prof, down)[0]) == pytest.approx(2.4 * float(t_ref), rel=1e-12)
    # a profile fitted without strided rows prices them by its stride-1 pool, not at c = 1
    stride_1_only = dataclasses.replace(h200, compute={**others, "conv.dense-gemm:bf16:dgrad": entry(0.9)})
    assert class_entry(stride_1_only, down)[1] == "conv.dense-gemm:bf16:dgrad"


def test_the_k80_carries_the_p100s_gemm_only_pool():
    k80, p100 = pm.load_profile("k80"), pm.load_profile("p100-pcie-16gb")
    for key in (f"conv.dense-gemm{s}:fp32:{part}" for s in ("", "-strided") for part in ("fwd", "dgrad", "wgrad")):
        assert k80.entry(key)["params"]["c"] == p100.entry(key)["params"]["c"]
        assert k80.entry(key)["source"].startswith("carried from p100-pcie-16gb")
    # DeepBench's P100: a strided data gradient costs more over its implicit GEMM than a stride-1 one
    assert p100.entry("conv.dense-gemm-strided:fp32:dgrad")["params"]["c"] > \
        1.5 * p100.entry("conv.dense-gemm:fp32:dgrad")["params"]["c"]
    assert "conv.dense:fp32:fwd" not in k80.compute  # the Winograd-heavy kind pool is not carried


def test_a_winograd_saving_is_lent_only_as_wide_as_its_rows_were(h200):
    def entry(c, channels=None):
        e = {"form": "scaled_ref", "params": {"t0": 0.0, "c": c, "t_cpu": 0.0}, "n_points": 5, "source": "t"}
        return {**e, "channels": channels} if channels else e
    wide = {"cin_min": 64.0, "cout_min": 64.0}
    others = {k: v for k, v in h200.compute.items() if not k.startswith("conv.dense")}
    prof = dataclasses.replace(h200, compute={**others, "conv.dense-k3x3-s1:bf16:fwd": entry(0.55, wide),
                                              "conv.dense:bf16:fwd": entry(0.6, wide),
                                              "conv.dense-gemm:bf16:fwd": entry(1.25)})
    resnet = conv_pass_kernel("c", "fwd", "fwd", 128, 64, 64, 56, 3, 1, dtype="bf16")
    cifar = conv_pass_kernel("c", "fwd", "fwd", 128, 16, 16, 32, 3, 1, dtype="bf16")  # a CIFAR ResNet's first stage
    widening = conv_pass_kernel("c", "fwd", "fwd", 128, 32, 64, 16, 3, 1, dtype="bf16")  # input narrower only
    stem = conv_pass_kernel("c", "fwd", "fwd", 128, 3, 64, 32, 3, 1, dtype="bf16")  # an RGB stem: its outputs count
    assert class_entry(prof, resnet)[1] == "conv.dense-k3x3-s1:bf16:fwd"
    assert class_entry(prof, stem)[1] == "conv.dense-k3x3-s1:bf16:fwd"
    for narrow in (cifar, widening):  # priced as cuDNN's GEMM-family kernels measured, not at the Winograd c
        assert class_entry(prof, narrow)[1] == "conv.dense-gemm:bf16:fwd"
    t_ref, _ = reference_seconds(prof, cifar)
    assert float(cnn_kernel_time(prof, cifar)[0]) == pytest.approx(1.25 * float(t_ref), rel=1e-12)
    # the data and weight gradients read their output channels back from their GEMMs
    for part in ("dgrad", "wgrad"):
        narrow = conv_pass_kernel("c", "bwd", part, 128, 64, 16, 32, 3, 1, dtype="bf16")
        keyed = {**prof.compute, f"conv.dense-k3x3-s1:bf16:{part}": entry(0.5, wide)}
        assert class_entry(dataclasses.replace(prof, compute=keyed), narrow) == (None, None)
    # an entry without a record (a class bundled before ranges were kept) applies at every width
    unbounded = dataclasses.replace(prof, compute={**others, "conv.dense-k3x3-s1:bf16:fwd": entry(0.55)})
    assert class_entry(unbounded, cifar)[1] == "conv.dense-k3x3-s1:bf16:fwd"


def test_fitted_winograd_classes_record_the_narrowest_rows_they_saw(h200):
    rows = []
    for kernel, stride, cin, cout in ((3, 1, 64, 64), (3, 1, 128, 96), (3, 1, 256, 256), (3, 1, 3, 64),
                                      (1, 1, 16, 64), (1, 1, 64, 16), (1, 1, 128, 128), (1, 1, 256, 512)):
        kern = conv_pass_kernel("c", "fwd", "fwd", 32, cin, cout, 28, kernel, stride, dtype="bf16")
        rows.append({"op": "conv2d", "phase": "fwd", "timing": "eager", "dtype": "bf16", "batch": 32, "cin": cin,
                     "cout": cout, "hw": 28, "kernel": kernel, "stride": stride, "groups": 1, "bytes": np.nan,
                     "time_s": 0.7 * float(reference_seconds(h200, kern)[0])})
    entries = fit_classes(pd.DataFrame(rows), h200)
    # the 3-channel stem does not widen the input range; 1x1 rows cannot run by Winograd: no range kept on their
    # classes, and none drawn from them on the kind's pool
    assert entries["conv.dense-k3x3-s1:bf16:fwd"]["channels"] == {"cin_min": 64.0, "cout_min": 64.0}
    assert entries["conv.dense:bf16:fwd"]["channels"] == {"cin_min": 64.0, "cout_min": 64.0}
    assert "channels" not in entries["conv.dense-k1x1-s1:bf16:fwd"]
    assert "channels" not in entries["conv.dense-gemm:bf16:fwd"]


def test_the_bundled_winograd_classes_carry_their_deepbench_channel_range():
    p100 = pm.load_profile("p100-pcie-16gb")
    for part in ("fwd", "dgrad", "wgrad"):
        assert p100.entry(f"conv.dense-k3x3-s1:fp32:{part}")["channels"] == {"cin_min": 64.0, "cout_min": 64.0}
        assert "channels" not in p100.entry(f"conv.dense-gemm:fp32:{part}")
    s = pm.Strategy(dp=1, micro_batch=128, precision="fp32", optimizer="sgd", framework="tensorflow")
    narrow = [c for c in pm.predict("resnet-cifar32", pm.cluster("p100-pcie-16gb"), s).caveats
              if "fewer channels than any Winograd row" in c]
    assert len(narrow) == 1 and "conv.dense-k3x3-s1:fp32:fwd" in narrow[0]
