"""The aten ops of CNN layers that have a cost class of their own (priced by perfmodel/costs/cnn.py).

Batch norm in training mode, ReLU, SiLU, sigmoid (the squeeze-excitation gate), max and
average pooling: each traced op maps to (class, pass); its size is the bytes it moves,
counted like any memory-bound op of a traced graph. Spatial means (squeeze-excitation's
squeeze, global average pooling) are recognised by shape in the tracer (class ``se_pool``).
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
