"""Time of a 2-D convolution: its implicit GEMMs on the GEMM fit plus a fitted overhead class.

cuDNN runs a convolution as an implicit GEMM over the lowered input (Chetlur et
al. 2014): forward m = N·P·Q, n = Cout, k = Cin/g·R·S; backward one data-gradient
and one weight-gradient GEMM of the same FLOPs (shapes in
:func:`perfmodel.workload.graph.conv_gemm_shapes`). Each GEMM is priced by the
profile's ``gemm:<dtype>`` fit, which already knows tile waves, K saturation
and the penalty for n or k not a multiple of 8 (a 3-channel stem has k = 147).
What cuDNN adds on top of a plain GEMM (lowering the input, layout and
epilogue passes, algorithm dispatch) is a memory-bound class ``conv2d:<dtype>:<fwd|bwd>``
over ``x`` = elements moved per GEMM pass (input + weight + output):

    t_conv = Σ_parts t_gemm(m, n, k) + t0 + beta · x        (mem_affine / mem_power)

Both parts scale to other GPUs the way the datasheet profile builder scales
their classes: GEMMs by peak FLOP/s, the overhead by memory bandwidth.
"""

from __future__ import annotations

import numpy as np

from perfmodel.costs.compute import kernel_time
from perfmodel.forms.registry import get_form
from perfmodel.workload.graph import conv_elements, conv_gemm_shapes
from perfmodel.workload.ops import Kernel

PARTS = {"fwd": ("fwd",), "bwd": ("dgrad", "wgrad")}


def conv_output_size(hw, kernel, stride=1, padding=None):
    """Output height/width of a square convolution (PyTorch's formula, dilation 1)."""
    padding = np.floor_divide(kernel, 2) if padding is None else padding
    return np.floor_divide(np.add(hw, 2 * np.asarray(padding)) - kernel, stride) + 1


def conv_kernels(batch, cin, cout, hw, kernel, stride=1, *, groups=1, padding=None, phase="fwd",
                 dtype="bf16", parts=None) -> list[Kernel]:
    """The GEMM kernels and the overhead kernel of one square convolution (fwd or bwd)."""
    out_hw = conv_output_size(hw, kernel, stride, padding)
    in_sp, out_sp, ksz = np.square(hw), np.square(out_hw), np.square(kernel)
    shapes = conv_gemm_shapes(batch, cin, cout, in_sp, out_sp, ksz, groups)
    parts = PARTS[phase] if parts is None else parts
    out = []
    for part in parts:
        m, n, k = shapes[part]
        out.append(Kernel(f"conv.{part}", "gemm", phase, {"m": m, "n": n, "k": k}, 1, 2.0 * m * n * k, "fwd", dtype))
    moved = conv_elements(batch, cin, cout, in_sp, out_sp, ksz, groups, passes=len(parts))
    out.append(Kernel("conv.overhead", "conv2d", phase, {"x": moved}, 1, 0.0, phase, dtype))
    return out


def gemm_part_seconds(gemm_entry: dict, batch, cin, cout, hw, kernel, stride=1, *, groups=1, padding=None,
                      phase="fwd"):
    """GPU seconds of the implicit GEMMs alone, from a ``gemm:<dtype>`` profile entry."""
    form = get_form(gemm_entry["form"])
    params = {**gemm_entry["params"], "t_cpu": 0.0}
    total = 0.0
    for kern in conv_kernels(batch, cin, cout, hw, kernel, stride, groups=groups, padding=padding, phase=phase):
        if kern.cls == "gemm":
            total = total + form.evaluate(params, **kern.size)
    return np.asarray(total, float)


def conv_time(profile, batch, cin, cout, hw, kernel, stride=1, *, groups=1, padding=None, phase="fwd",
              dtype="bf16"):
    """GPU seconds of one convolution's forward or backward (both gradients) on ``profile``."""
    total = 0.0
    for kern in conv_kernels(batch, cin, cout, hw, kernel, stride, groups=groups, padding=padding,
                             phase=phase, dtype=dtype):
        gpu, _ = kernel_time(profile, kern)
        total = total + gpu
    return np.asarray(total, float)
