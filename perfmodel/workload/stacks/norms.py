"""How the eager model code runs RMSNorm: one fused kernel each way, or composed of elementwise ops.

``Strategy.norm_kernels``:

* ``"fused"`` (default): one kernel forward and one backward, as the profile measured torch's
  ``F.rms_norm`` (and as Megatron-Core and Transformer Engine run their norms).
* ``"composite"``: the ops of Hugging Face transformers' ``LlamaRMSNorm.forward`` and fms's
  ``LayerNormParameterized`` with ``use_high_precision_pow=True`` (its LLaMA blocks), run eagerly:
  ``xf = x.float(); xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps); x = weight * xf.type_as(x)``.
  Forward, per element of a b-byte input: the cast to fp32 (b read, 4 written), ``pow`` (4, 4), ``mean``
  (4 read), the product with the broadcast rstd (4, 4), the cast back (4, b) and the weight's product
  (b, b). Backward, as autograd runs those ops' derivatives: the weight product's input gradient (b, b)
  and weight gradient (a product, b + b read and b written, then its sum over rows, b read), the cast's
  (b, 4), the rstd product's input gradient (4, 4) and rstd gradient (a product, 4 + 4 read and 4
  written, then its row sum, 4 read), ``pow``'s (the gradient and x read, 4 + 4, 4 written), the sum of the
  input's two gradients (4 + 4, 4) and the first cast's (4, b). With an fp32 input (the autocast stack's
  residual stream) the casts are no-ops. The row-wise ``mean``/``rsqrt`` steps on one number per row
  are left out. Each op is priced as a copy of the bytes it moves (the profile's copy curve). Autograd
  saves the fp32 copy (4 bytes per element, for ``pow`` and the product) and the normalized b-byte
  tensor (for the weight's gradient) where the fused kernel saves its b-byte input:
  ``composite_saved_bytes``.

Under ``compile=True`` Inductor fuses the ops into one kernel, so only eager steps decompose.
"""

from __future__ import annotations

import numpy as np

from perfmodel.core.checks import check_choice
from perfmodel.core.errors import UnsupportedError
from perfmodel.workload.ops import Kernel, mem
from perfmodel.workload.stacks import FRAMEWORKS, megatron_code

NORM_KERNELS = ("fused", "composite")


def check_norm_kernels(value, framework: str = "pytorch") -> str:
    """``value`` if one of ``NORM_KERNELS`` that ``framework``'s model code can run (Megatron-code stacks fuse theirs)."""
    check_choice("norm_kernels", value, NORM_KERNELS)
    if value == "composite" and megatron_code(framework):
        raise UnsupportedError(f"norm_kernels='composite' describes eager PyTorch model code: framework={framework!r} "
                               f"runs its own fused norms; stacks that take it: "
                               f"{', '.join(n for n in FRAMEWORKS if not megatron_code(n))}")
    return value


def _passes(b: float, phase: str) -> list:
    """(name, bytes per element) of each elementwise op of the composite RMSNorm; ``b`` the input's bytes."""
    cast = b < 4.0  # a 16-bit input is cast to fp32 and back; an fp32 one is not
    if phase == "fwd":
        ops = [("to_fp32", b + 4.0)] if cast else []
        ops += [("pow", 8.0), ("mean", 4.0), ("mul_rstd", 8.0)]
        ops += [("to_input", 4.0 + b)] if cast else []
        return ops + [("mul_weight", 2.0 * b)]
    ops = [("mul_weight.dgrad", 2.0 * b), ("mul_weight.wgrad", 3.0 * b), ("mul_weight.wgrad_sum", b)]
    ops += [("to_input.bwd", b + 4.0)] if cast else []
    ops += [("mul_rstd.dgrad", 8.0), ("mul_rstd.rstd_grad", 12.0), ("mul_rstd.rstd_sum", 4.0), ("pow.bwd", 12.0),
            ("grad_sum", 12.0)]
    return ops + ([("to_fp32.bwd", 4.0 + b)] if cast else [])


def bytes_per_element(b: float, phase: str) -> float:
    """Bytes the composite RMSNorm moves per element of its input, forward or backward."""
    return sum(n for _, n in _passes(b, phase))


def composite_rmsnorm(k: Kernel, dtype_bytes: float) -> list[Kernel]:
    """The eager ops of a composite RMSNorm in place of the fused ``rmsnorm`` kernel ``k`` (its variant: fwd or
    bwd), each a copy of the bytes it moves (the copy class's x is bytes over 8)."""
    elems = k.size["x"]
    return [mem(f"{k.name}.{name}", "copy", k.phase, np.multiply(elems, per / 8.0), count=k.count, variant="fwd")
            for name, per in _passes(dtype_bytes, "fwd" if k.variant == "fwd" else "bwd")]


def composite_saved_bytes(stream_bytes: float) -> float:
    """Bytes per element a composite RMSNorm saves for backward: the fp32 copy and the normalized input."""
    return 4.0 + stream_bytes
