"""Strategy.memory_format: NCHW activations pay cuDNN's transposes around each tensor-core convolution."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.costs.cnn import conv_pass_kernel
from perfmodel.errors import UnknownNameError
from perfmodel.workload.stack import adapt_kernels
from perfmodel.workload.stacks.layout import TRANSPOSE_TAG, nchw_transpose, transposes_conv


def test_the_field_takes_both_layouts_and_their_other_names():
    assert pm.Strategy().memory_format == "channels_last"
    assert pm.Strategy(memory_format="nchw").memory_format == "contiguous"
    assert pm.Strategy(memory_format="NHWC").memory_format == "channels_last"
    with pytest.raises(UnknownNameError, match="memory_format .chw. .known: channels_last, contiguous"):
        pm.Strategy(memory_format="chw")


def test_tensor_core_dtypes_follow_the_datasheets():
    assert pm.load_gpu("p100-pcie-16gb").tensor_core_dtypes == ()  # paired fp16 in CUDA cores: 2x fp32
    assert pm.load_gpu("k80").tensor_core_dtypes == ()
    assert pm.load_gpu("v100-sxm2-32gb").tensor_core_dtypes == ("fp16",)
    assert pm.load_gpu("t4").tensor_core_dtypes == ("fp16",)
    assert pm.load_gpu("rtx-3090").tensor_core_dtypes == ("tf32", "bf16", "fp16")  # fp16 only 2x its fp32
    assert pm.load_gpu("h200-sxm-141gb").tensor_core_dtypes == ("tf32", "bf16", "fp16", "fp8")


def test_a_transpose_moves_each_activation_element_once_more_by_hand():
    # 3x3 convolution, batch 2, 64 -> 128 channels at 56x56, stride 1, fp16: x = 2*64*3136 = 401,408,
    # y = 2*128*3136 = 802,816 elements; each pass reads and writes both once more: 2 B x 2 x 1,204,224
    # = 4,816,896 bytes, a copy of x = bytes / 8 = 602,112 (an fp32 copy moves 8 B per x)
    for part in ("fwd", "dgrad", "wgrad"):
        k = conv_pass_kernel("c", "fwd", part, 2, 64, 128, 56, 3, dtype="fp16")
        t = nchw_transpose(k, 2.0)
        assert (t.cls, t.dtype, t.name) == ("copy", "fp32", "c" + TRANSPOSE_TAG)
        assert float(t.size["x"]) == pytest.approx(602_112)


def test_only_dense_and_grouped_convolutions_in_tensor_core_dtypes_are_transposed():
    dense = conv_pass_kernel("d", "fwd", "fwd", 8, 64, 64, 28, 3, dtype="bf16")
    grouped = conv_pass_kernel("g", "fwd", "fwd", 8, 128, 128, 28, 3, groups=32, dtype="bf16")
    depthwise = conv_pass_kernel("w", "fwd", "fwd", 8, 128, 128, 28, 3, groups=128, dtype="bf16")
    tc = ("tf32", "bf16", "fp16")
    assert transposes_conv(dense, tc) and transposes_conv(grouped, tc)
    assert not transposes_conv(depthwise, tc)
    assert not transposes_conv(dataclasses.replace(dense, dtype="fp32"), tc)
    out = adapt_kernels([dense, grouped, depthwise], precision="bf16-mixed", tensor_cores=tc,
                        memory_format="contiguous")
    assert [k.name for k in out] == ["d" + TRANSPOSE_TAG, "d", "g" + TRANSPOSE_TAG, "g", "w"]
    assert adapt_kernels([dense], precision="bf16-mixed", tensor_cores=tc) == [dense]


def _step(model, gpu, fmt, precision="bf16-mixed", batch=64):
    s = pm.Strategy(micro_batch=batch, precision=precision, optimizer="sgd", memory_format=fmt)
    return pm.predict(model, gpu, s).step_time


def test_nchw_is_slower_only_where_cudnn_transposes():
    # tensor cores: slower by the transposes' copies
    assert _step("resnet50", "a100-sxm4-80gb", "contiguous") > 1.1 * _step("resnet50", "a100-sxm4-80gb",
                                                                             "channels_last")
    assert _step("resnet50", "a100-sxm4-80gb", "contiguous", "tf32") > _step("resnet50", "a100-sxm4-80gb",
                                                                           "channels_last", "tf32")
    # fp32 math (a V100 has no tf32) and a P100's fp16 run NCHW natively: the same step
    for gpu, precision in (("v100-sxm2-32gb", "fp32"), ("p100-pcie-16gb", "fp16-mixed")):
        assert _step("resnet50", gpu, "contiguous", precision) == _step("resnet50", gpu, "channels_last", precision)
    # a transformer has no convolutions
    assert _step("gpt2-small", "h200-sxm-141gb", "contiguous", batch=4) == \
        _step("gpt2-small", "h200-sxm-141gb", "channels_last", batch=4)


def test_the_difference_is_the_priced_transposes():
    from perfmodel.costs.compute import phase_time
    from perfmodel.profiles.profile import load_profile

    model, prof = pm.preset("resnext50-32x4d"), load_profile("rtx-3090")
    fwd, bwd = model.layer_kernels(32, precision="fp16-mixed")
    tc = pm.load_gpu("rtx-3090").tensor_core_dtypes
    extra = [k for k in adapt_kernels(fwd + bwd, precision="fp16-mixed", tensor_cores=tc, memory_format="contiguous")
             if k.name.endswith(TRANSPOSE_TAG)]
    n_conv = sum(1 for k in fwd + bwd if k.cls == "conv" and transposes_conv(k, tc))
    assert len(extra) == n_conv > 0
    seconds = phase_time(prof, extra)[1]
    gap = _step(model, "rtx-3090", "contiguous", "fp16-mixed", 32) - _step(model, "rtx-3090", "channels_last",
                                                                          "fp16-mixed", 32)
    assert gap == pytest.approx(seconds, rel=1e-9)
    assert np.isfinite(gap) and gap > 0


def test_pytorch_runs_fp32_convolutions_as_tf32_where_the_gpu_has_it():
    # torch.backends.cudnn.allow_tf32 defaults to True (matmuls' allow_tf32 to False): the convolutions of an
    # fp32 step run on the tf32 tensor cores, the classifier's GEMM stays fp32; TensorFlow 1.x has no TF32
    model = pm.preset("resnet50")
    fwd, bwd = model.layer_kernels(8, precision="fp32")
    tc = pm.load_gpu("a100-sxm4-80gb").tensor_core_dtypes
    out = adapt_kernels(fwd + bwd, precision="fp32", tensor_cores=tc)
    assert {k.dtype for k in out if k.cls == "conv"} == {"tf32"}
    assert {k.dtype for k in out if k.cls == "gemm"} == {"fp32"}
    kept = adapt_kernels(fwd + bwd, precision="fp32", framework="tensorflow", tensor_cores=tc)
    assert {k.dtype for k in kept if k.cls == "conv"} == {"fp32"}
    assert {k.dtype for k in adapt_kernels(fwd + bwd, precision="fp32", tensor_cores=("fp16",))
            if k.cls == "conv"} == {"fp32"}
    # so an fp32 ResNet-50 step on the A100 is priced between its fp32 and its all-tf32 rates
    fp32, tf32 = _step(model, "a100-sxm4-80gb", "channels_last", "fp32"), _step(model, "a100-sxm4-80gb",
                                                                                "channels_last", "tf32")
    assert tf32 <= fp32 < 1.2 * tf32
