"""The memory format of a CNN's activations, and the transposes cuDNN adds for NCHW tensors.

``Strategy.memory_format``:

* ``"channels_last"`` (NHWC; ``model.to(memory_format=torch.channels_last)``, TensorFlow's
  ``data_format="channels_last"``): the layout cuDNN's tensor-core convolution kernels run in, and the
  one the bundled convolution measurements used (``calibration``: ``torch.channels_last``). The default,
  so a prediction prices what the measured kernels do.
* ``"contiguous"`` (NCHW: PyTorch's default ``torch.contiguous_format``, tf_cnn_benchmarks'
  ``data_format=NCHW``): on tensor cores cuDNN transposes each convolution's activation operands to NHWC
  and its result back ("Tensor Layouts In Memory: NCHW vs NHWC", NVIDIA Convolutional Layers User's
  Guide, docs.nvidia.com/deeplearning/performance/dl-performance-convolutional; PyTorch's channels-last
  tutorial: "every time a convolution operation is called ... cuDNN performs a transpose"). Each pass
  of a dense or grouped convolution reads and writes its two activation tensors once more (forward: x
  and y; data gradient: dy and dx; weight gradient: x and dy), priced as copies of those bytes at the
  profile's measured copy bandwidth. Without tensor cores (fp32 math, a P100's fp16) cuDNN runs NCHW
  kernels natively, and depthwise convolutions never run on tensor cores: neither pays a transpose.
  The filters' transposes (the weights, a few MB per step) are left out.
"""

from __future__ import annotations

import numpy as np

from perfmodel.core.checks import check_choice
from perfmodel.workload.graph import conv_kind
from perfmodel.workload.ops import Kernel, mem

MEMORY_FORMATS = ("channels_last", "contiguous")
DEFAULT_MEMORY_FORMAT = "channels_last"
# the names frameworks use for the same two layouts
MEMORY_FORMAT_ALIASES = {"nhwc": "channels_last", "channels-last": "channels_last", "nchw": "contiguous",
                         "contiguous_format": "contiguous"}
TRANSPOSE_TAG = ".nchw_transpose"


def check_memory_format(value) -> str:
    """``value`` as one of :data:`MEMORY_FORMATS` (aliases ``nhwc``/``nchw`` accepted)."""
    key = MEMORY_FORMAT_ALIASES.get(str(value).strip().lower(), value) if isinstance(value, str) else value
    check_choice("memory_format", key, MEMORY_FORMATS)
    return key


def transposed_elements(k: Kernel):
    """Activation elements one pass of a convolution reads or writes: its moved elements less the weight's.

    ``size["x"]`` counts input + weight + output (``graph.conv_elements``); the weight is n·k of the
    forward and data-gradient GEMMs and m·n of the weight gradient's (``graph.conv_gemm_shapes``).
    """
    s = k.size
    weight = np.multiply(s["m"], s["n"]) if k.variant == "wgrad" else np.multiply(s["n"], s["k"])
    return np.maximum(np.subtract(s["x"], weight), 0.0)


def nchw_transpose(k: Kernel, dtype_bytes: float) -> Kernel:
    """The transposes of one convolution pass on NCHW tensors: each activation element read and written
    once more, as a copy (the copy class's x is the bytes over 8: an fp32 copy reads and writes 4 B)."""
    moved = np.multiply(transposed_elements(k), 2.0 * dtype_bytes)
    return mem(k.name + TRANSPOSE_TAG, "copy", k.phase, np.divide(moved, 8.0), count=k.count, variant="fwd")


def transposes_conv(k: Kernel, tensor_core_dtypes) -> bool:
    """Whether cuDNN transposes ``k`` under NCHW: a dense or grouped convolution in a tensor-core dtype."""
    if k.cls != "conv" or k.dtype not in tensor_core_dtypes:
        return False
    s = k.size
    groups, cin = float(np.ravel(s["groups"])[0]), float(np.ravel(s["cin"])[0])
    return conv_kind(groups, cin) != "depthwise"
