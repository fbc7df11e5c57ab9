"""CNN calibration on a CPU: convolution passes timed alone, layers forward and backward, a table the fitter reads."""

from __future__ import annotations

import pytest

from calibration import compute, grids
from calibration.cnn_ops import CNN_BUILDERS
from calibration.ops import BUILDERS, layer_bytes
from perfmodel.fit.conv import class_rows
from perfmodel.fit.tables import read_compute_table


def test_the_gpu_grid_covers_every_class_in_every_precision():
    req = grids.Request(device="cuda:0", dtypes=("bf16", "fp16", "tf32", "fp32"), timings=("eager",))
    cases = grids.cnn_cases(req)
    convs = [c for c in cases if c["op"] == "conv2d"]
    assert {c["dtype"] for c in convs} == {"bf16", "fp16", "tf32", "fp32"}
    assert {c["phase"] for c in convs} == {"fwd", "dgrad", "wgrad"}
    assert {c["kernel"] for c in convs} == {1, 3, 5, 7} and {c["stride"] for c in convs} == {1, 2}
    kinds = {"dense" if c["groups"] == 1 else "depthwise" if c["groups"] == c["cin"] else "grouped" for c in convs}
    assert kinds == {"dense", "grouped", "depthwise"}
    assert {c["op"] for c in cases} - {"conv2d"} == set(CNN_BUILDERS)


def test_a_gradient_pass_returns_only_its_gradient():
    case = {"op": "conv2d", "phase": "dgrad", "dtype": "fp32", "batch": 2, "cin": 8, "cout": 8, "hw": 8,
            "kernel": 3, "stride": 1, "groups": 8}
    dx, dw, db = BUILDERS["conv2d"](case, "cpu", 1).calls[0]()
    assert dx.shape == (2, 8, 8, 8) and dw is None and db is None
    dx, dw, _ = BUILDERS["conv2d"]({**case, "phase": "wgrad"}, "cpu", 1).calls[0]()
    assert dx is None and dw.shape == (8, 1, 3, 3)  # depthwise: one input channel per group


def test_layer_bytes_are_hand_checkable():
    # batch norm forward over 2 x 8 x 8 x 8 = 1024 fp32 elements: x read twice, y written = 3 * 1024 * 4 bytes
    assert layer_bytes({"op": "batchnorm", "phase": "fwd", "dtype": "fp32", "batch": 2, "cin": 8, "hw": 8}) == 12288
    # max pooling 3x3/2 backward: dy (256) + x (1024) read, dx (1024) written, 256 int64 indices
    assert layer_bytes({"op": "maxpool", "phase": "bwd", "dtype": "fp32", "batch": 2, "cin": 8, "hw": 8}) == \
        (256 + 1024 + 1024) * 4 + 256 * 8
    # squeeze-excitation's x · gate in bf16: x read (1024), the 2 x 8 gate read, y written (1024)
    assert layer_bytes({"op": "se_scale", "phase": "fwd", "dtype": "bf16", "batch": 2, "cin": 8, "hw": 8}) == \
        (1024 + 16 + 1024) * 2


def test_the_excitation_builder_multiplies_by_a_channel_gate():
    y = CNN_BUILDERS["se_scale"]({"op": "se_scale", "phase": "fwd", "dtype": "fp32", "batch": 2, "cin": 4, "hw": 6},
                                 "cpu", 1).calls[0]()
    assert y.shape == (2, 4, 6, 6)


def test_a_quick_cpu_run_writes_rows_the_class_fitter_reads(tmp_path):
    ops = frozenset({"conv2d", *grids.CNN_LAYERS})
    req = grids.Request(device="cpu", dtypes=("fp32",), timings=("eager",), quick=True, ops=ops)
    summary = compute.run(req, tmp_path, compute.QUICK_PLAN, progress=False)
    assert summary.failed == [] and summary.written == summary.planned
    table = read_compute_table(tmp_path)
    rows = class_rows(table)
    assert set(rows.key) >= {"conv.dense-k3x3-s2:fp32:fwd", "conv.depthwise-k3x3-s1:fp32:wgrad",
                             "batchnorm:fp32:bwd", "silu:fp32:fwd", "se_pool:fp32:fwd", "se_scale:fp32:fwd"}
    assert (rows.time_s > 0).all()


@pytest.mark.parametrize("op", sorted(CNN_BUILDERS))
def test_every_layer_builder_runs_forward_and_backward(op):
    phases = ("fwd",) if op in grids.FORWARD_ONLY else ("fwd", "bwd")
    for phase in phases:
        out = CNN_BUILDERS[op]({"op": op, "phase": phase, "dtype": "fp32", "batch": 1, "cin": 4, "hw": 6},
                               "cpu", 1).calls[0]()
        assert out is not None


def test_every_depthwise_class_has_the_rows_of_its_own_fit():
    from perfmodel.fit.conv import MIN_POINTS

    req = grids.Request(device="cuda:0", dtypes=("bf16", "fp16", "tf32", "fp32"), timings=("eager",))
    convs = [c for c in grids.cnn_cases(req) if c["op"] == "conv2d" and c["groups"] == c["cin"]]
    for dtype in ("bf16", "fp16", "tf32", "fp32"):
        for phase in ("fwd", "dgrad", "wgrad"):
            for kernel in (3, 5):
                for stride in (1, 2):
                    rows = [c for c in convs if (c["dtype"], c["phase"], c["kernel"], c["stride"]) ==
                            (dtype, phase, kernel, stride)]
                    assert len(rows) >= MIN_POINTS, (dtype, phase, kernel, stride)


def test_the_gpu_grid_measures_the_dense_3x3_class_down_to_a_cifar_networks_16_channels():
    import pandas as pd

    from perfmodel.fit.conv import channel_range, class_subset

    req = grids.Request(device="cuda:0", dtypes=("fp32",), timings=("eager",))
    convs = [c for c in grids.cnn_cases(req) if c["op"] == "conv2d"]
    rows = class_rows(pd.DataFrame([{**c, "time_s": 1e-3, "bytes": float("nan")} for c in convs]))
    # a profile fitted on this grid lends its 3x3 Winograd class to a CIFAR ResNet's 16-channel layers
    # (costs.cnn.within_channels), instead of the GEMM-family pool a 64-channel minimum sends them to
    for phase in ("fwd", "dgrad", "wgrad"):
        assert channel_range(class_subset(rows, f"conv.dense-k3x3-s1:fp32:{phase}")) == \
            {"cin_min": 16.0, "cout_min": 16.0}
    layers = [c for c in grids.cnn_cases(req) if c["op"] == "batchnorm"]
    assert min(c["cin"] for c in layers) == 16
