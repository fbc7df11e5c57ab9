"""float8 training with torchao as torchtitan runs it: which GEMMs run in fp8, what the casts move.

torchtitan v0.2.2 ``torchtitan/components/quantization/float8.py`` converts every ``nn.Linear``
with torchao ``Float8LinearConfig`` but those in ``filter_fqns``, which the Llama 3 recipes set to
the output layer (``models/llama3/train_configs/llama3_8b.toml``: ``filter_fqns = ["output"]``);
the default recipe is tensorwise dynamic scaling (``recipe_name=None``). torchao
``torchao/float8/float8_linear.py`` (``matmul_with_hp_or_float8_args``): forward casts the input
and the weight (an amax reduction over the 16-bit tensor, then the scaled cast: 2 + 2 bytes read,
1 written per element), dgrad casts the output gradient the same way and lays the fp8 weight out
for cuBLAS (1 byte read, 1 written), wgrad lays out the fp8 output gradient and input likewise.
All three GEMMs run in fp8; the LM head stays bf16.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from perfmodel.workload.ops import Kernel, mem

AMAX_CAST = 5.0 / 8.0   # bytes of amax + cast per element, as fp32 copies (8 bytes each)
LAYOUT = 2.0 / 8.0      # bytes of an fp8 transpose per element, as fp32 copies


def torchao_float8(k: Kernel) -> list[Kernel]:
    """A GEMM of a torchao ``Float8Linear`` (tensorwise scaling) and the casts it adds."""
    if k.name.startswith("lm_head"):
        return [replace(k, dtype="bf16")]
    m, n, kk = k.size["m"], k.size["n"], k.size["k"]
    a, b = np.multiply(m, kk), np.multiply(n, kk)  # the two operands' elements

    def cast(tag, elems, factor):
        return mem(f"{k.name}.{tag}", "copy", k.phase, np.multiply(elems, factor), count=k.count, variant="fwd")

    if k.name.endswith(".wgrad"):
        return [cast("fp8_layout", np.add(a, b), LAYOUT), k]
    if ".dgrad" in k.name:
        return [cast("fp8_grad_cast", a, AMAX_CAST), cast("fp8_w_layout", b, LAYOUT), k]
    return [cast("fp8_cast", a, AMAX_CAST), cast("fp8_w_cast", b, AMAX_CAST), k]
