"""Activation-checkpointing policies: which forward work a block repeats in backward.

* ``none``, ``full`` (``torch.utils.checkpoint`` around every block) and ``selective``
  (the attention core, Korthikanti et al. 2022 §5; Megatron-LM ``--recompute-activations``)
  are priced in ``perfmodel.workload.kernels.layer_kernels``;
* ``selective-op``: torchtitan's per-op policy (``torchtitan/distributed/activation_checkpoint.py``,
  ``_apply_op_sac``, v0.2.2): inside a checkpointed block the outputs of the ops in
  ``_op_sac_save_list`` (``torchtitan/models/llama3/infra/parallelize.py``: ``aten.mm``, the SDPA
  kernels, ``reduce_scatter_tensor``, ``aten.max``) are saved, except every second ``mm``;
  everything else is recomputed;
* ``every-<k>``: torchtitan's layer policy (``selective_ac_option = "k"``, ``_apply_layer_sac``):
  every k-th block is fully checkpointed, the others keep all their activations.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from perfmodel.core.errors import InvalidInputError, unknown_name

POLICIES = ("none", "selective", "full", "selective-op")
EVERY_PREFIX = "every-"


def every_k(recompute: str) -> int | None:
    """k of an ``every-<k>`` policy, or None for the named policies."""
    if isinstance(recompute, str) and recompute.startswith(EVERY_PREFIX):
        tail = recompute[len(EVERY_PREFIX):]
        if tail.isdigit() and int(tail) >= 1:
            return int(tail)
    return None


def check_recompute(recompute) -> str:
    """Return ``recompute`` if it names a policy; else say which ones exist."""
    if recompute in POLICIES or every_k(recompute) is not None:
        return recompute
    if isinstance(recompute, str) and recompute.startswith(EVERY_PREFIX):
        raise InvalidInputError(f"'recompute'={recompute!r}: every-<k> needs a whole k >= 1 (every k-th block "
                                f"fully checkpointed, e.g. every-2)")
    raise unknown_name("recompute", recompute, [*POLICIES, "every-<k>"])


def checkpointed_share(recompute: str) -> float:
    """Share of the blocks wrapped in a full checkpoint (1 for ``full``, 1/k for ``every-<k>``)."""
    k = every_k(recompute)
    if k is not None:
        return 1.0 / k
    return 1.0 if recompute == "full" else 0.0


def _mm_sequence(fwd, model):
    """The forward GEMMs of a block split into the ``aten.mm`` calls torchtitan's Llama issues.

    torchtitan's ``Attention`` has separate wq, wk, wv (one fused ``attn.qkv`` GEMM here) and
    ``FeedForward`` separate w1 and w3 (one fused ``mlp.fc1`` of width 2f under SwiGLU): the
    order is wq, wk, wv, wo, w1, w3, w2 (``torchtitan/models/llama3/model/model.py``).
    Returns (kernel, share of its n) per ``mm`` call, in that order.
    """
    out = []
    for k in fwd:
        if k.cls != "gemm":
            continue
        if k.name == "attn.qkv":
            q = model.heads / (model.heads + 2 * model.kv_heads)
            kv = model.kv_heads / (model.heads + 2 * model.kv_heads)
            out += [(k, q), (k, kv), (k, kv)]
        elif k.name == "mlp.fc1" and model.activation == "swiglu":
            out += [(k, 0.5), (k, 0.5)]
        else:
            out.append((k, 1.0))
    return out


def op_sac_recomputed(fwd, model) -> list:
    """Forward kernels torchtitan's per-op policy repeats in backward.

    Every memory-bound op of the block, and the 2nd, 4th, 6th ... ``mm`` (wk, wo, w3 of a Llama
    block); the SDPA kernel and the odd-numbered ``mm`` outputs are saved.
    """
    mms = _mm_sequence(fwd, model)
    redo = []
    for i, (k, share) in enumerate(mms, start=1):
        if i % 2 == 0:
            n = np.multiply(k.size["n"], share)
            redo.append(replace(k, name=f"{k.name}.mm{i}.recompute", phase="bwd", size={**k.size, "n": n},
                                flops=np.multiply(k.flops, share)))
    rest = [replace(k, name=k.name + ".recompute", phase="bwd") for k in fwd if k.cls not in ("gemm", "sdpa")]
    return rest + redo


def recomputed_kernels(fwd, recompute: str, model) -> list:
    """The forward kernels a block repeats in backward under ``recompute`` (counts scaled for every-k)."""
    if recompute == "full":  # torch.utils.checkpoint re-runs the whole block forward in backward
        return [replace(k, name=k.name + ".recompute", phase="bwd") for k in fwd]
    if recompute == "selective":  # Korthikanti et al. 2022: recompute the attention core only
        return [replace(k, name=k.name + ".recompute", phase="bwd") for k in fwd if k.cls in ("sdpa", "softmax")]
    if recompute == "selective-op":
        return op_sac_recomputed(fwd, model)
    share = checkpointed_share(recompute)
    if share > 0.0:  # every-k: the average block repeats 1/k of a full forward
        return [replace(k, name=k.name + ".recompute", phase="bwd", count=np.multiply(k.count, share)) for k in fwd]
    return []
