"""CNN layers the compute calibration times: batch norm (training mode), ReLU, SiLU, sigmoid, pooling.

Each case is a channels-last activation ``batch x cin x hw x hw`` in the autocast
precision (batch norm with fp32 weights and statistics, as autocast runs it).
Phase 'fwd' times the forward op, 'bwd' the backward op alone (the aten backward
functions autograd calls: native_batch_norm_backward, threshold_backward,
silu_backward, sigmoid_backward, max_pool2d_with_indices_backward,
avg_pool2d_backward), so neither pays ``torch.autograd.grad``'s per-call CPU cost.
Convolutions are ``calibration.ops.conv2d`` (phases fwd, dgrad, wgrad).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from calibration.ops import DTYPES, Bench, _rotate

aten = torch.ops.aten
EPS = 1e-5


def _act(case, device):
    x = torch.randn(case["batch"], case["cin"], case["hw"], case["hw"], device=device, dtype=DTYPES[case["dtype"]])
    return x.contiguous(memory_format=torch.channels_last)


def _bench(case, device, copies, make: Callable[[torch.Tensor], Callable]) -> Bench:
    return Bench(_rotate(lambda: make(_act(case, device)), copies))


def batchnorm(case, device, copies) -> Bench:
    """Training-mode batch norm: batch statistics, running-stat update; backward for x, weight and bias."""
    def make(x):
        c = x.shape[1]
        w, b = torch.ones(c, device=x.device), torch.zeros(c, device=x.device)
        rm, rv = torch.zeros(c, device=x.device), torch.ones(c, device=x.device)
        if case["phase"] == "fwd":
            return partial(F.batch_norm, x, rm, rv, w, b, True, 0.1, EPS)
        _, mean, invstd = aten.native_batch_norm(x, w, b, rm, rv, True, 0.1, EPS)
        dy = torch.randn_like(x)
        return partial(aten.native_batch_norm_backward, dy, x, w, rm, rv, mean, invstd, True, EPS,
                       [True, True, True])
    return _bench(case, device, copies, make)


def _pointwise(fwd: Callable, bwd: Callable, bwd_on_output: bool):
    def builder(case, device, copies) -> Bench:
        def make(x):
            if case["phase"] == "fwd":
                return partial(fwd, x)
            saved = fwd(x) if bwd_on_output else x
            return partial(bwd, torch.randn_like(x), saved)
        return _bench(case, device, copies, make)
    return builder


relu = _pointwise(torch.relu, lambda dy, y: aten.threshold_backward(dy, y, 0), True)
silu = _pointwise(F.silu, aten.silu_backward, False)
sigmoid = _pointwise(torch.sigmoid, aten.sigmoid_backward, True)


def maxpool(case, device, copies) -> Bench:
    """3x3 stride-2 max pooling with indices (the ResNet stem's)."""
    args = ([3, 3], [2, 2], [1, 1])

    def make(x):
        if case["phase"] == "fwd":
            return partial(aten.max_pool2d_with_indices, x, *args)
        y, idx = aten.max_pool2d_with_indices(x, *args)
        return partial(aten.max_pool2d_with_indices_backward, torch.randn_like(y), x, *args, [1, 1], False, idx)
    return _bench(case, device, copies, make)


def avgpool(case, device, copies) -> Bench:
    """3x3 stride-1 average pooling, padding 1 (Inception's pooling branches)."""
    def make(x):
        if case["phase"] == "fwd":
            return partial(F.avg_pool2d, x, 3, 1, 1)
        return partial(aten.avg_pool2d_backward, torch.randn_like(x), x, [3, 3], [1, 1], [1, 1], False, True, None)
    return _bench(case, device, copies, make)


def se_pool(case, device, copies) -> Bench:
    """The spatial mean of squeeze-excitation and global average pooling (forward only: its backward
    is a broadcast division the traced graphs price by bytes)."""
    return _bench(case, device, copies, lambda x: partial(torch.mean, x, (2, 3), True))


def se_scale(case, device, copies) -> Bench:
    """Squeeze-excitation's excitation: the activation times an N x C x 1 x 1 gate, broadcast over H x W
    (forward only: its backward's dy · gate is the same kernel)."""
    def make(x):
        gate = torch.rand(x.shape[0], x.shape[1], 1, 1, device=x.device, dtype=x.dtype)
        return partial(torch.mul, x, gate)
    return _bench(case, device, copies, make)


CNN_BUILDERS: dict[str, Callable[[dict, str, int], Bench]] = {
    "batchnorm": batchnorm, "relu": relu, "silu": silu, "sigmoid": sigmoid, "maxpool": maxpool,
    "avgpool": avgpool, "se_pool": se_pool, "se_scale": se_scale,
}
