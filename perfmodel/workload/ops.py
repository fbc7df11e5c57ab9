"""Kernels: the unit of work the cost model prices.

A workload is described as the list of kernels one training step launches on
one GPU, forward and backward, each tagged with a cost class (``gemm``,
``sdpa``, ``layernorm``...) that the Profile knows how to price, its sizes
and its FLOPs. Sizes are numpy arrays (or scalars) so that a whole sweep of
configurations is priced in one pass: every field broadcasts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

PHASES = ("fwd", "bwd")


@dataclass(frozen=True)
class Kernel:
    """One kind of kernel launched ``count`` times per step.

    ``cls`` names the cost class; ``variant`` selects its forward or backward
    curve where the class was measured as a pair (norms, activations, loss).
    ``size`` holds the class's variables (e.g. ``m, n, k`` for ``gemm``;
    ``elems`` for memory-bound classes). ``flops`` counts one launch.
    """

    name: str
    cls: str
    phase: str
    size: dict = field(default_factory=dict)
    count: object = 1
    flops: object = 0.0
    variant: str = "fwd"
    dtype: str = "bf16"
    autocast: bool = False  # a cast autocast adds (weights, bias, inputs); a 16-bit-weight stack has none

    def scaled(self, factor) -> Kernel:
        """The same kernel launched ``factor`` times as often."""
        return replace(self, count=np.multiply(self.count, factor))


GEMM_TN = "tn"  # variant of a GEMM whose A operand is a transposed view (a weight gradient dy.T @ x)


def gemm(name: str, phase: str, m, n, k, *, count=1, dtype="bf16", variant="fwd") -> Kernel:
    """``C[m, n] = A[m, k] @ B[k, n]``: 2·m·n·k FLOPs. ``variant`` "fwd": A and B row-major (their
    leading dimensions are k and n); ``GEMM_TN``: A is the transpose of a row-major [k, m] tensor
    (its leading dimension is m)."""
    flops = 2.0 * np.multiply(np.multiply(m, n), k)
    return Kernel(name, "gemm", phase, {"m": m, "n": n, "k": k}, count, flops, variant, dtype)


def aligned_view(kern: Kernel) -> dict:
    """The (m, n, k) to price ``kern`` with: the GEMM microbenchmarks are row-major products, slow
    when k or n (the operands' leading dimensions) is misaligned; a TN product's leading dimensions
    are m and n, so it is priced as the row-major product with m and k exchanged (same FLOPs)."""
    size = dict(kern.size)
    if kern.variant == GEMM_TN:
        size["m"], size["k"] = size["k"], size["m"]
    return size


def linear(name: str, tokens, d_in, d_out, *, count=1, dtype="bf16", weight_grad=True,
           input_grad=True) -> tuple[list[Kernel], list[Kernel]]:
    """Forward and backward GEMMs of ``y = x @ W.T`` as PyTorch issues them.

    forward  y[T, out]  = x[T, in] @ W.T      -> mm(M=T,   N=out, K=in)
    dgrad    dx[T, in]  = dy[T, out] @ W      -> mm(M=T,   N=in,  K=out)
    wgrad    dW[out, in] = dy.T @ x           -> mm(M=out, N=in,  K=T), A = dy.T (TN)
    (torch/nn/modules/linear.py and aten's addmm backward; the layout matters
    because cuBLAS is slow when an operand's leading dimension is misaligned:
    k and n for the first two, m and n for the weight gradient, whose A is the
    transposed view of dy with leading dimension out.)
    """
    fwd = [gemm(name, "fwd", tokens, d_out, d_in, count=count, dtype=dtype)]
    bwd = []
    if input_grad:
        bwd.append(gemm(name + ".dgrad", "bwd", tokens, d_in, d_out, count=count, dtype=dtype))
    if weight_grad:
        bwd.append(gemm(name + ".wgrad", "bwd", d_out, d_in, tokens, count=count, dtype=dtype, variant=GEMM_TN))
    return fwd, bwd


def mem(name: str, cls: str, phase: str, elems, *, rows=None, count=1, variant=None, dtype="fp32",
        autocast=False) -> Kernel:
    """A memory-bound kernel of class ``cls`` over ``elems`` elements (form variable ``x``).

    ``rows`` (tokens) lets row-wise kernels (norms, softmax, loss) pay a per-row cost.
    """
    size = {"x": elems} if rows is None else {"x": elems, "rows": rows}
    return Kernel(name, cls, phase, size, count, 0.0, variant or phase, dtype, autocast)

