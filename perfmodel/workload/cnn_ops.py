"""The aten ops of CNN layers that have a cost class of their own (priced by perfmodel/costs/cnn.py).

Batch norm in training mode, ReLU, SiLU, sigmoid (the squeeze-excitation gate), max and
average pooling: each traced op maps to (class, pass); its size is the bytes it moves,
counted like any memory-bound op of a traced graph. Spatial means (squeeze-excitation's
squeeze, global average pooling) are recognised by shape in the tracer (class ``se_pool``),
and so is the excitation: an N x C x H x W tensor times an N x C x 1 x 1 gate (class ``se_scale``,
also its backward's dy times the gate), a broadcast that elementwise kernels do not run at a
contiguous copy's rate, so it is measured apart.
"""

from __future__ import annotations

_BN_FORWARD = ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
               "_batch_norm_with_update", "cudnn_batch_norm")
_BN_BACKWARD = ("native_batch_norm_backward", "cudnn_batch_norm_backward", "batch_norm_backward")

CNN_MEM_OPS: dict[str, tuple[str, str]] = {
    **{n: ("batchnorm", "fwd") for n in _BN_FORWARD}, **{n: ("batchnorm", "bwd") for n in _BN_BACKWARD},
    "relu": ("relu", "fwd"), "relu_": ("relu", "fwd"), "threshold_backward": ("relu", "bwd"),
    "silu": ("silu", "fwd"), "silu_": ("silu", "fwd"), "silu_backward": ("silu", "bwd"),
    "sigmoid": ("sigmoid", "fwd"), "sigmoid_": ("sigmoid", "fwd"), "sigmoid_backward": ("sigmoid", "bwd"),
    "max_pool2d_with_indices": ("maxpool", "fwd"), "max_pool2d_with_indices_backward": ("maxpool", "bwd"),
    "avg_pool2d": ("avgpool", "fwd"), "avg_pool2d_backward": ("avgpool", "bwd"),
    "_adaptive_avg_pool2d": ("se_pool", "fwd"), "_adaptive_avg_pool2d_backward": ("se_pool", "bwd"),
}


def is_channel_scale(name: str, ins) -> bool:
    """True for squeeze-excitation's excitation: ``mul`` of an N x C x H x W tensor (H·W > 1) and an
    N x C x 1 x 1 gate."""
    if name not in ("mul", "mul_") or len(ins) != 2 or any(t.dim() != 4 for t in ins):
        return False
    big, small = sorted(ins, key=lambda t: -t.numel())
    return (tuple(small.shape[2:]) == (1, 1) and tuple(small.shape[:2]) == tuple(big.shape[:2])
            and big.shape[2] * big.shape[3] > 1)
