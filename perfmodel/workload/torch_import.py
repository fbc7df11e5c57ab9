"""Trace one training step of a PyTorch module into a :class:`~perfmodel.workload.graph.GraphModel`.

    import perfmodel as pm
    g = pm.from_torch(model, torch.randn(8, 3, 224, 224))   # any nn.Module, any device
    pm.predict(g, pm.cluster("h200"), pm.Strategy(micro_batch=64))

    python -m tools.cnn_models --write-presets   # regenerate the shipped graphs (from a checkout)

How: the module runs forward, loss and backward on the **meta device** (shapes
and dtypes only: no memory, no arithmetic, any model size) under a
``TorchDispatchMode`` that sees every aten op autograd issues, forward and
backward, after composite ops are decomposed: exactly the ops an eager step
launches. ``saved_tensors_hooks`` report what autograd keeps for backward.
FLOPs come from ``torch.utils.flop_counter``'s own formulas, so they equal
``FlopCounterMode`` on the same step. The step is traced at two batch sizes;
each size is then an affine function of the batch (see graph.py).
Op classes and autocast dtype rules: see ``torch_ops.Classifier`` and docs/workloads.md.
"""

from __future__ import annotations

import warnings
from collections import Counter

from perfmodel.core.errors import InvalidInputError, UnsupportedError
from perfmodel.workload.graph import GraphModel, GraphOp
from perfmodel.workload.torch_ops import Classifier, tensors_in

FORWARD_HINT = ("perfmodel.from_torch: the module's forward failed on the example inputs while tracing "
                "on the meta device; check that example_inputs match forward's arguments and that "
                "forward does not read tensor values (.item(), data-dependent branches)")
LOSS_HINT = ("perfmodel.from_torch: the loss failed on the module's output while tracing on the meta "
             "device; pass loss=callable(output) -> scalar tensor")


def from_torch(module, example_inputs, loss=None, name=None) -> GraphModel:
    """Trace one training step (forward, ``loss(output)``, backward) of ``module``.

    ``example_inputs``: a tensor, a tuple of positional arguments or a dict of keyword
    arguments; the first dimension of the first tensor is the batch. ``loss``: a callable
    ``loss(output) -> scalar``; by default cross-entropy over the last dimension of the
    output (its ``.logits`` or first tensor when it is a structure). The optimizer step is
    not traced: the predictor prices it from the parameter count, as for transformers.
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise InvalidInputError(f"'module' must be a torch.nn.Module: got {type(module).__name__}")
    args, kwargs = _split_inputs(example_inputs)
    batch = _batch_size(args, kwargs)
    devices = sorted({str(t.device) for t in tensors_in((args, kwargs)) if t.device.type != "meta"})
    was_training = module.training
    module.train()
    try:
        small = _trace(module, *_resize(args, kwargs, batch, batch), loss)
        large = _trace(module, *_resize(args, kwargs, batch, 2 * batch), loss)
    finally:
        module.train(was_training)
    ops = _combine(small, large, batch, 2 * batch)
    notes = ["traced on the meta device (shapes and dtypes only)"]
    if any(d != "cpu" for d in devices):
        notes.append(f"the example inputs lived on {', '.join(devices)}; only their shapes and dtypes were used")
        warnings.warn(f"from_torch traces on the meta device: the inputs on {', '.join(devices)} were not used "
                      "(only their shapes and dtypes)", stacklevel=2)
    if small["unknown"]:
        listed = ", ".join(f"aten.{k} (x{v})" for k, v in sorted(small["unknown"].items()))
        notes.append(f"unclassified ops priced as memory-bound by bytes: {listed}")
        warnings.warn(f"from_torch: ops not classified, counted as memory-bound by the bytes they read and "
                      f"write: {listed}", stacklevel=2)
    per_sample = {k: (large["saved"][k] - small["saved"][k]) / batch for k in small["saved"]}
    return GraphModel(
        name=str(name or type(module).__name__.lower()), ops=ops, params=_param_count(module),
        gemm_params=int(small["gemm_params"]), classes=int(small["classes"]),
        activation={k: max(v, 0.0) for k, v in per_sample.items()},
        input_bytes=(large["input_bytes"] - small["input_bytes"]) / batch,
        traced_batches=(batch, 2 * batch), source=f"perfmodel.from_torch({type(module).__name__})",
        notes=tuple(notes))


# -- inputs ---------------------------------------------------------------------------------------
def _split_inputs(example_inputs):
    import torch

    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise InvalidInputError("'example_inputs' must be a tensor, a tuple of positional arguments or a dict "
                            f"of keyword arguments: got {type(example_inputs).__name__}")


def _batch_size(args, kwargs) -> int:
    for t in tensors_in((args, kwargs)):
        if t.dim() >= 1 and t.shape[0] >= 1:
            return int(t.shape[0])
    raise InvalidInputError("'example_inputs' must hold a tensor whose first dimension is the batch")


def _resize(args, kwargs, batch: int, new: int):
    """Meta copies of the inputs with the batch dimension set to ``new``."""
    import torch
    from torch.utils._pytree import tree_map

    def meta(x):
        if not isinstance(x, torch.Tensor):
            return x
        shape = list(x.shape)
        if shape and shape[0] == batch:
            shape[0] = new
        return torch.empty(shape, dtype=x.dtype, device="meta").requires_grad_(x.requires_grad)
    return tree_map(meta, args), tree_map(meta, kwargs)


def _param_count(module) -> int:
    return int(sum(p.numel() for p in module.parameters()))  # parameters() skips tied duplicates


# -- one traced step ---------------------------------------------------------------------------------
def _logits(output):
    import torch

    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, dict):
        return output["logits"] if "logits" in output else next(iter(tensors_in(output)))
    found = [t for t in tensors_in(output) if t.is_floating_point()]
    if not found:
        raise UnsupportedError("the module's output holds no floating-point tensor to take a loss of; pass loss=")
    return found[0]


def _default_loss(output):
    """Cross-entropy over the last dimension (classification / language modelling)."""
    import torch
    import torch.nn.functional as F

    logits = _logits(output)
    if logits.dim() < 2:
        return logits.sum()
    flat = logits.reshape(-1, logits.shape[-1])
    return F.cross_entropy(flat, torch.zeros(flat.shape[0], dtype=torch.long, device=logits.device))


def _trace(module, args, kwargs, loss) -> dict:
    """Run forward, loss and backward on meta tensors; return the classified ops."""
    import torch
    from torch.func import functional_call

    params = {n: torch.empty_like(p, device="meta").requires_grad_(p.requires_grad)
              for n, p in module.named_parameters()}
    buffers = {n: torch.empty_like(b, device="meta") for n, b in module.named_buffers()}
    clf = Classifier(params.values())
    clf.mark_inputs(tensors_in((args, kwargs)))
    input_bytes = sum(t.numel() * t.element_size() for t in tensors_in((args, kwargs)))
    with _flash_routing(), torch.autograd.graph.saved_tensors_hooks(clf.pack, lambda t: t), clf.mode():
        clf.phase = "fwd"
        try:
            out = functional_call(module, {**params, **buffers}, args, kwargs)
        except Exception as exc:
            _add_hint(exc, FORWARD_HINT)
            raise
        clf.phase = "loss_fwd"
        logits = _logits(out)
        try:
            value = (loss or _default_loss)(out)
        except Exception as exc:
            _add_hint(exc, LOSS_HINT)
            raise
        if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.requires_grad:
            raise UnsupportedError("the loss must be a scalar tensor that depends on the module's parameters: "
                                   f"got {type(value).__name__} {tuple(getattr(value, 'shape', ()))}")
        for t in tensors_in(out):
            if t.requires_grad:
                t.register_hook(clf.enter_backward)
        clf.phase = "loss_bwd"
        value.backward()
    # loss-input elements per sample: classes for a classifier, positions × vocabulary for a language model
    classes = max(1, logits.numel() // max(int(logits.shape[0]), 1)) if logits.dim() >= 2 else 1
    return {"records": clf.records, "saved": dict(clf.saved), "unknown": Counter(clf.unknown),
            "gemm_params": clf.gemm_param_elems, "classes": classes, "input_bytes": input_bytes}


def _add_hint(exc: BaseException, hint: str) -> None:
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(hint)
    elif exc.args and isinstance(exc.args[0], str):
        exc.args = (f"{exc.args[0]}\n{hint}",) + exc.args[1:]


class _flash_routing:
    """Route ``F.scaled_dot_product_attention`` to the fused kernels a GPU runs in training.

    On the meta device SDPA would decompose into bmm + softmax (the math path); a GPU
    runs FlashAttention-2 (no mask) or memory-efficient attention (with a mask). The
    module attribute is swapped for the duration of the trace (nn.MultiheadAttention
    reaches it through the same attribute) and restored afterwards.
    """

    def __enter__(self):
        import torch.nn.functional as F

        self.original = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = _fused_sdpa
        return self

    def __exit__(self, *exc):
        import torch.nn.functional as F

        F.scaled_dot_product_attention = self.original
        return False


def _fused_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    import torch

    aten = torch.ops.aten
    if query.dim() != 4:
        raise UnsupportedError(f"scaled_dot_product_attention on {query.dim()}-d inputs: the tracer "
                               "expects (batch, heads, seq, head_dim)")
    if attn_mask is None and query.shape[-1] == value.shape[-1]:
        return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                        scale=scale)[0]
    if key.shape[1] != query.shape[1]:  # memory-efficient attention needs as many k/v heads as q heads
        rep = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(rep, 1), value.repeat_interleave(rep, 1)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype, device=query.device)
    if attn_mask is not None:
        attn_mask = attn_mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    return aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, True, dropout_p,
                                                        is_causal, scale=scale)[0]


# -- two traces -> affine sizes ----------------------------------------------------------------------
def _combine(small: dict, large: dict, b1: int, b2: int) -> tuple:
    """Pair the two traces' records op by op; each number becomes (a, s) with value = a + s·batch."""
    r1, r2 = small["records"], large["records"]
    sig = [(r["op"], r["cls"], r["phase"]) for r in r1]
    if sig != [(r["op"], r["cls"], r["phase"]) for r in r2]:
        first = next((i for i, (a, b) in enumerate(zip(r1, r2)) if a["op"] != b["op"]), min(len(r1), len(r2)))
        raise UnsupportedError(
            f"the module runs different ops at batch {b1} and {b2} (first difference at op #{first}); "
            "from_torch needs a step whose op sequence does not depend on the batch size")
    merged: dict = {}
    for x, y in zip(r1, r2):
        size = {k: _affine(x["size"][k], y["size"][k], b1, b2) for k in x["size"]}
        flops = _affine(x["flops"], y["flops"], b1, b2)
        key = (x["op"], x["cls"], x["phase"], x["variant"], x["dtype"], x["mixed_only"],
               tuple(sorted(size.items())), flops)
        merged[key] = merged.get(key, 0) + 1
    return tuple(GraphOp(op, cls, phase, dict(size), flops, count, variant, dtype, mixed)
                 for (op, cls, phase, variant, dtype, mixed, size, flops), count in merged.items())


def _affine(v1: float, v2: float, b1: int, b2: int) -> tuple:
    s = (float(v2) - float(v1)) / (b2 - b1)
    return (float(v1) - s * b1, s)


# -- shipped presets --------------------------------------------------------------------------------
