"""``torch.compile`` (Inductor) of each block: chains of memory-bound kernels become one kernel.

torchtitan v0.2.2 ``apply_compile`` compiles every TransformerBlock with ``fullgraph=True``;
Inductor's scheduler fuses pointwise and reduction nodes that follow one another
(``torch/_inductor/scheduler.py``, ``Scheduler.fuse_nodes``) so the intermediate tensors of a
chain (residual add -> norm, gate -> silu -> product, cast -> softmax) never reach memory.
A fused group is priced by the bytes it moves once: every member's reads and writes, less
one write and one read of each tensor passed from a member to the next, as a copy kernel
(one launch). GEMMs, attention and embeddings stay library kernels and end a group.
"""

from __future__ import annotations

import numpy as np

from perfmodel.core.algebra import equal, maximum, minimum, where
from perfmodel.core.units import DTYPE_BYTES
from perfmodel.workload.ops import Kernel, mem

LIBRARY = ("gemm", "sdpa", "embedding", "conv2d", "conv")  # cuBLAS / FlashAttention / ATen kernels Inductor calls
# tensors read and written per output element, (forward, backward): a norm reads x (and dy), a
# residual add two inputs, SwiGLU gate and up (backward: both and dy, writing two gradients)
TENSORS = {"residual_add": ((2, 1), (2, 1)), "layernorm": ((1, 1), (2, 1)), "rmsnorm": ((1, 1), (2, 1)),
           "gelu": ((1, 1), (2, 1)), "swiglu": ((2, 1), (3, 2)), "rope": ((1, 1), (1, 1)),
           "softmax": ((1, 1), (2, 1)), "cross_entropy": ((1, 0), (1, 1)), "add": ((2, 1), (2, 1)),
           "scale": ((1, 1), (1, 1)), "sum": ((1, 0), (1, 0)), "copy": ((1, 1), (1, 1))}
CASTS = ("cast_fp32_to_bf16", "cast_bf16_to_fp32")
COPY_BYTES = 8.0  # an fp32 copy reads and writes 4 bytes per element


def _bytes(k: Kernel):
    """(bytes moved by one launch, bytes of its output tensor)."""
    x = k.size["x"]
    if k.cls in CASTS:
        return np.multiply(x, 6.0), np.multiply(x, 2.0 if k.cls.endswith("bf16") else 4.0)
    reads, writes = TENSORS.get(k.cls, ((1, 1), (1, 1)))[0 if k.variant == "fwd" else 1]
    per = DTYPE_BYTES.get(k.dtype, 4)
    return np.multiply(x, per * (reads + writes)), np.multiply(x, per * max(writes, 1))


def _fused(group: list[Kernel]) -> Kernel:
    moved, passed = 0.0, 0.0
    previous = None
    for k in group:
        b, out = _bytes(k)
        moved = moved + b * np.asarray(k.count, float)
        if previous is not None:  # a member over the same elements reads the previous one's output
            # from registers: neither written nor read back (a weight cast beside a norm shares nothing)
            prev_x, prev_out = previous
            passed = passed + where(equal(prev_x, k.size["x"]), 2.0 * minimum(prev_out, out), 0.0)
        previous = (k.size["x"], out)
    first = group[0]
    return mem(f"fused[{'+'.join(k.name for k in group)}]", "copy", first.phase,
               maximum(moved - passed, 0.0) / COPY_BYTES, variant="fwd")


def fuse_memory_bound(kernels: list[Kernel], keep=None) -> list[Kernel]:
    """The kernel list Inductor runs: each maximal run of memory-bound kernels as one fused kernel.
    ``keep(kernel)`` true: a kernel outside the compiled region, run as it is (it ends a group)."""
    out, group = [], []
    for k in kernels:
        if k.cls in LIBRARY or "x" not in k.size or k.phase == "opt" or (keep is not None and keep(k)):
            if group:
                out.append(_fused(group) if len(group) > 1 else group[0])
                group = []
            out.append(k)
        else:
            group.append(k)
    if group:
        out.append(_fused(group) if len(group) > 1 else group[0])
    return out
