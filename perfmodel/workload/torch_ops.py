"""Classify the aten ops of a traced training step into cost classes with numeric sizes.

:func:`perfmodel.workload.torch_import.from_torch` runs the step under ``Classifier.mode()``;
each op becomes records of the classes the predictor prices (GEMM, convolution, attention,
norms, memory-bound bytes, casts), its tensors' dtypes following autocast's rules (torch.amp
docs) and its FLOPs ``torch.utils.flop_counter``'s. Op classes and dtype rules: docs/workloads.md.
"""

from __future__ import annotations

from math import prod

from perfmodel.workload.cnn_ops import CNN_MEM_OPS, is_channel_scale
from perfmodel.workload.graph import conv_elements, conv_gemm_shapes


def tensors_in(tree) -> list:
    """The tensors in a nested structure of arguments or outputs."""
    import torch
    from torch.utils._pytree import tree_flatten

    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


# -- op classification ---------------------------------------------------------------------------
GEMM_ARGS = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2), "_scaled_mm": (0, 1)}
CONV = {"convolution", "_convolution", "cudnn_convolution", "convolution_overrideable", "_slow_conv2d_forward",
        "mkldnn_convolution"}
SDPA = {"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward"}
SDPA_BWD = {n + "_backward" for n in SDPA}
NORM = {"native_layer_norm": "fwd", "native_group_norm": "fwd", "native_layer_norm_backward": "bwd",
        "native_group_norm_backward": "bwd"}
BATCH_NORM = {"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
              "_native_batch_norm_legit_no_training", "_batch_norm_with_update", "cudnn_batch_norm",
              "native_batch_norm_backward", "cudnn_batch_norm_backward", "batch_norm_backward"}
REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "var", "var_mean", "std", "std_mean", "norm",
              "linalg_vector_norm", "prod", "argmax", "argmin", "logsumexp", "all", "any"}
BYTES_OPS = {  # data movement, pooling, dropout, losses, fills: priced by bytes at copy bandwidth
    "cat", "stack", "clone", "copy_", "_to_copy", "index_select", "gather", "scatter", "scatter_add",
    "scatter_reduce", "index", "index_put", "index_put_", "_index_put_impl_", "index_add", "index_copy",
    "repeat", "repeat_interleave", "roll", "flip", "constant_pad_nd", "masked_fill", "masked_fill_",
    "masked_scatter", "fill", "fill_", "zero_", "zeros", "ones", "full", "zeros_like", "ones_like",
    "full_like", "new_zeros", "new_ones", "new_full", "scalar_tensor", "tril", "triu", "native_dropout",
    "native_dropout_backward", "bernoulli", "bernoulli_", "rand", "randn", "rand_like", "randn_like",
    "randint", "arange", "slice_backward", "select_backward", "index_select_backward", "unfold_backward",
    "_unsafe_index", "_unsafe_index_put", "sort", "topk", "cumsum", "cumprod", "_softmax_backward_data",
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "max_pool3d_with_indices",
    "max_pool3d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward", "avg_pool3d",
    "avg_pool3d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d",
    "_adaptive_avg_pool3d_backward", "adaptive_max_pool2d", "adaptive_max_pool2d_backward",
    "upsample_nearest2d", "upsample_nearest2d_backward", "upsample_bilinear2d", "upsample_bilinear2d_backward",
    "im2col", "col2im", "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward",
    "mse_loss", "mse_loss_backward", "l1_loss", "smooth_l1_loss", "smooth_l1_loss_backward", "huber_loss",
    "huber_loss_backward", "binary_cross_entropy", "binary_cross_entropy_backward",
    "binary_cross_entropy_with_logits", "kl_div", "hardtanh_backward", "leaky_relu_backward",
    "hardswish_backward", "hardsigmoid_backward", "elu_backward", "softplus_backward", "mish_backward",
} | BATCH_NORM
ALLOCATES = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}  # fresh storage, no kernel
FREE = {"detach", "alias", "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
        "_unsafe_view", "_reshape_alias", "resize_", "set_", "_local_scalar_dense", "sym_size", "sym_stride",
        "sym_numel", "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type"}
# autocast (CUDA) runs these in bf16/fp16, and these in fp32, whatever their inputs (torch.amp docs,
# "CUDA Ops that can autocast to float16" / "... to float32"); other ops keep the widest input type
LOW_OUT = set(GEMM_ARGS) | CONV | SDPA | SDPA_BWD | {"convolution_backward"}
F32_FORWARD = {"native_layer_norm", "native_group_norm", "_softmax", "_safe_softmax", "_log_softmax",
               "nll_loss_forward", "nll_loss2d_forward", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
               "binary_cross_entropy_with_logits", "kl_div", "sum", "prod", "cumsum", "cumprod", "exp", "expm1",
               "log", "log1p", "log2", "log10", "pow", "rsqrt", "reciprocal", "softplus", "logsumexp",
               "linalg_vector_norm", "norm", "acos", "asin", "cosh", "sinh", "tan", "erfinv"}
F32_BACKWARD = {"native_layer_norm_backward", "native_group_norm_backward", "_softmax_backward_data",
                "_log_softmax_backward_data", "nll_loss_backward", "nll_loss2d_backward", "mse_loss_backward"}
FORWARD_PHASES = ("fwd", "loss_fwd")


def _key(t) -> int:
    """Identity of a tensor's storage (views share it)."""
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return id(t)


def _bind(func, args, kwargs) -> dict:
    bound = {a.name: a.default_value for a in func._schema.arguments if a.has_default_value()}
    bound.update(zip((a.name for a in func._schema.arguments), args))
    bound.update(kwargs)
    return bound


class Classifier:
    """Turns each aten op of a traced step into records of cost classes with numeric sizes.

    Tracks, per storage, the dtype the tensor would have under autocast ("low" or "f32";
    parameters are fp32 masters), so bytes, casts and saved activations follow mixed precision.
    """

    def __init__(self, params):
        self.param_elems = {_key(p): p.numel() for p in params}
        self.kind: dict = {}
        self.records: list = []
        self.saved = {"low": 0.0, "f32": 0.0, "bytes": 0.0}
        self._saved_keys: set = set()
        self._cast_params: set = set()
        self.gemm_param_elems = 0
        self.unknown: list = []
        self.phase = "fwd"

    def mark_inputs(self, tensors) -> None:
        for t in tensors:
            if t.is_floating_point():
                self.kind[_key(t)] = "f32"

    def enter_backward(self, grad):
        self.phase = "bwd"  # the gradient of the model's output exists: the loss's backward is done

    def mode(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        record = self.record

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                record(func, args, kwargs, out)
                return out
        return _Mode()

    def pack(self, t):
        """saved_tensors_hooks: count each storage autograd keeps (forward of the model only)."""
        key = _key(t)
        if self.phase == "fwd" and key not in self.param_elems and key not in self._saved_keys:
            self._saved_keys.add(key)
            nbytes = t.untyped_storage().nbytes()
            if not t.is_floating_point():
                self.saved["bytes"] += nbytes
            else:
                self.saved["low" if self.kind.get(key) == "low" else "f32"] += nbytes / t.element_size()
        return t

    def _kind(self, t) -> str:
        if not t.is_floating_point():
            return "int"
        key = _key(t)
        return "param" if key in self.param_elems else self.kind.get(key, "f32")

    def record(self, func, args, kwargs, out) -> None:
        name = func.overloadpacket.__name__
        if name in ALLOCATES:
            self._fresh(args, kwargs, out)
        if func.is_view or name in FREE:
            return
        ins, outs = tensors_in((args, kwargs)), tensors_in(out)
        kinds = [self._kind(t) for t in ins]
        flops = _flops(func, args, kwargs, out)
        casts = self._casts(name, ins, kinds) if self.phase in FORWARD_PHASES else []
        out_kind = self._out_kind(name, kinds)
        for t in outs:
            if t.is_floating_point():
                self.kind[_key(t)] = out_kind
        recs = self._classify(name, func, args, kwargs, ins, outs, kinds, flops) + casts
        phase = self.phase
        self.records.extend({"phase": phase, "variant": "fwd", "dtype": "low", "mixed_only": False, "flops": 0.0, **r}
                            for r in recs)

    def _fresh(self, args, kwargs, out) -> None:
        """A new allocation may reuse a freed storage's address (``_key``), whose kind it would then inherit,
        so the trace would vary from run to run (dropout's ``empty_like`` mask): it takes its template's
        kind (``empty_like(x)``: x's; a parameter's as fp32), else fp32."""
        like = [t for t in tensors_in((args, kwargs)) if t.is_floating_point()]
        kind = self._kind(like[0]) if like else "f32"
        for t in tensors_in(out):
            if t.is_floating_point():
                self.kind[_key(t)] = "f32" if kind == "param" else kind

    def _out_kind(self, name, kinds) -> str:
        if name in LOW_OUT:
            return "low"
        if name in F32_BACKWARD or (name in F32_FORWARD and self.phase in FORWARD_PHASES):
            return "f32"
        data = [k for k in kinds if k != "int"]
        if name in BATCH_NORM and data:  # cuDNN batch norm keeps its input's dtype (fp32 weights)
            return "f32" if data[0] == "param" else data[0]
        return "f32" if any(k in ("f32", "param") for k in data) or not data else "low"

    def _classify(self, name, func, args, kwargs, ins, outs, kinds, flops) -> list:
        op = f"aten.{name}"
        if name in GEMM_ARGS:
            i, j = GEMM_ARGS[name]
            a, b = args[i], args[j]
            rows = a.shape[-2] * (a.shape[0] if a.dim() == 3 else 1)
            return [{"op": op, "cls": "gemm", "dtype": "gemm", "flops": flops,
                     "size": {"m": rows, "n": b.shape[-1], "k": a.shape[-1]}}]
        if name in CONV or name == "convolution_backward":
            return _conv_records(op, name, _bind(func, args, kwargs), outs)
        if name in SDPA or name in SDPA_BWD:
            b = _bind(func, args, kwargs)
            q, k = b["query"], b["key"]
            size = {"batch": q.shape[0], "heads": q.shape[1], "kv_heads": k.shape[1],
                    "seq": (q.shape[2] * k.shape[2]) ** 0.5, "head_dim": q.shape[3],
                    "causal": float(bool(b.get("is_causal", False)))}
            return [{"op": op, "cls": "sdpa", "variant": "bwd" if name in SDPA_BWD else "fwd", "dtype": "low",
                     "flops": flops, "size": size}]
        main = ins[0] if ins else None
        if name in NORM:
            return [{"op": op, "cls": "layernorm", "variant": NORM[name], "dtype": "f32",
                     "size": {"x": main.numel(), "rows": _norm_rows(name, _bind(func, args, kwargs), main)}}]
        dkind = "low" if kinds and kinds[0] == "low" else "f32"
        simple = {"gelu": ("gelu", "fwd", dkind), "gelu_backward": ("gelu", "bwd", dkind),
                  "_softmax": ("softmax", "fwd", "f32"), "_safe_softmax": ("softmax", "fwd", "f32"),
                  "_log_softmax": ("cross_entropy", "fwd", "f32"),
                  "_log_softmax_backward_data": ("cross_entropy", "bwd", "f32"), "embedding": ("embedding", "fwd", "f32")}
        if name in simple:
            cls, variant, dtype = simple[name]
            t = outs[0] if name == "embedding" else main
            rows = t.numel() // max(t.shape[-1], 1) if t.dim() else 1  # row-wise kernels pay per row
            return [{"op": op, "cls": cls, "variant": variant, "dtype": dtype, "size": {"x": t.numel(), "rows": rows}}]
        if name == "embedding_dense_backward":
            b = _bind(func, args, kwargs)
            grad = b["grad_output"]
            return [{"op": op, "cls": "embedding", "variant": "bwd", "dtype": "f32",
                     "size": {"x": grad.numel(), "y": b["num_weights"] * grad.shape[-1]}}]
        if name == "mean" and main is not None and main.dim() == 4 and outs[0].numel() == prod(main.shape[:2]):
            # a spatial mean: squeeze-excitation's squeeze, global average pooling
            return [{"op": op, "cls": "se_pool", "variant": "fwd", "size": self._moved(ins, outs, kinds, 1)}]
        if name in REDUCTIONS and main is not None:
            return [{"op": op, "cls": "sum", "dtype": dkind, "size": {"x": main.numel()}}]
        if is_channel_scale(name, ins):  # squeeze-excitation's x · gate (and dy · gate in backward)
            return [{"op": op, "cls": "se_scale", "variant": "fwd", "size": self._moved(ins, outs, kinds, 1)}]
        if name in CNN_MEM_OPS:  # batch norm, activations, pooling: their own class over the bytes moved
            cls, variant = CNN_MEM_OPS[name]
            return [{"op": op, "cls": cls, "variant": variant,
                     "size": self._moved(ins, outs, kinds, 2 if name in BATCH_NORM else 1)}]
        if name not in BYTES_OPS and not _pointwise(func):
            self.unknown.append(name)
        return [{"op": op, "cls": "bytes", "size": self._moved(ins, outs, kinds, 2 if name in BATCH_NORM else 1)}]

    def _moved(self, ins, outs, kinds, passes) -> dict:
        """Elements read (unique storages, ``passes`` times) and written, by width."""
        moved = {"low": 0.0, "f32": 0.0}
        seen = set()
        for t, kind in zip(ins, kinds):
            if _key(t) in seen:
                continue
            seen.add(_key(t))
            _add(moved, t, kind, passes, min(t.numel(), t.untyped_storage().nbytes() // max(t.element_size(), 1)))
        for t in outs:
            _add(moved, t, self.kind.get(_key(t), "f32") if t.is_floating_point() else "int", 1, t.numel())
        return moved

    def _casts(self, name, ins, kinds) -> list:
        """Autocast's casts: fp32 weights (once per step) and fp32 activations entering a bf16 op,
        bf16 activations entering an fp32 op; each with its gradient cast back in backward."""
        back = "bwd" if self.phase == "fwd" else "loss_bwd"
        to_low, to_f32 = "cast_fp32_to_bf16", "cast_bf16_to_fp32"
        recs = []
        if name in LOW_OUT:
            for t, kind in zip(ins, kinds):
                if kind == "param" and _key(t) not in self._cast_params:
                    self._cast_params.add(_key(t))
                    n = self.param_elems[_key(t)]
                    self.gemm_param_elems += n
                    recs += [_cast(f"{name}.weight_cast", to_low, self.phase, n),
                             _cast(f"{name}.weight_grad_cast", to_f32, back, n)]
                elif kind == "f32":
                    recs.append(_cast(f"{name}.input_cast", to_low, self.phase, t.numel()))
                    if t.requires_grad:
                        recs.append(_cast(f"{name}.input_grad_cast", to_f32, back, t.numel()))
        elif name in F32_FORWARD:
            for t, kind in zip(ins, kinds):
                if kind == "low":
                    recs.append(_cast(f"{name}.input_cast", to_f32, self.phase, t.numel()))
                    if t.requires_grad:
                        recs.append(_cast(f"{name}.input_grad_cast", to_low, back, t.numel()))
        return recs


def _norm_rows(name, b, x) -> int:
    """Rows a norm kernel reduces over: tokens for layer norm, batch × groups for group norm."""
    if "group" in name:
        return int(b.get("N", x.shape[0])) * int(b.get("group", 1))
    return x.numel() // max(prod(b["normalized_shape"]), 1)


def _cast(op, cls, phase, n) -> dict:
    return {"op": f"autocast.{op}", "cls": cls, "phase": phase, "dtype": "f32", "mixed_only": True,
            "size": {"x": n}}


def _add(moved, t, kind, passes, n) -> None:
    if kind == "int":
        moved["f32"] += passes * n * t.element_size() / 4.0
    else:
        moved["low" if kind == "low" else "f32"] += passes * n


def _pointwise(func) -> bool:
    import torch

    return torch.Tag.pointwise in func.tags


def _flops(func, args, kwargs, out) -> float:
    """FLOPs as torch.utils.flop_counter.FlopCounterMode counts this op (0 when it does not)."""
    from torch.utils.flop_counter import flop_registry

    fn = flop_registry.get(func.overloadpacket)
    return float(fn(*args, **kwargs, out_val=out)) if fn else 0.0


def _conv_records(op, name, b, outs) -> list:
    """A convolution as one record per pass (fwd, dgrad, wgrad), its implicit GEMM shape and its class."""
    x, w = b.get("input", b.get("self")), b["weight"]
    groups, transposed = int(b.get("groups", 1) or 1), bool(b.get("transposed", False))
    if name == "convolution_backward":
        grad = b["grad_output"]
        y_shape, parts = grad.shape, [p for p, on in zip(("dgrad", "wgrad"), b["output_mask"]) if on]
    else:
        y_shape, parts = outs[0].shape, ["fwd"]
    kernel, in_sp, out_sp = prod(w.shape[2:]), prod(x.shape[2:]), prod(y_shape[2:])
    cin, cout = x.shape[1], y_shape[1]
    if transposed:  # a transposed conv is the data gradient of the conv mapping its output to its input
        cin, cout, in_sp, out_sp = cout, cin, out_sp, in_sp
        parts = _transposed_parts(name, b)
    shapes = conv_gemm_shapes(x.shape[0], cin, cout, in_sp, out_sp, kernel, groups)
    gemm = [(p, shapes[p]) for p in parts]
    # every pass does the forward's multiply-adds, N·PQ·Cout·Cin/g·RS (Chetlur et al. 2014, §3), unpadded;
    # not torch's flop counter, which ignores groups in the weight gradient (C/g times too many)
    pass_flops = 2.0 * x.shape[0] * out_sp * cout * (cin // groups) * kernel
    # one record per pass, classed by kind, kernel and stride (perfmodel/costs/cnn.py)
    stride = max(int(v) for v in b.get("stride", (1,)))
    kh, kw = (int(w.shape[2]), int(w.shape[3])) if w.dim() == 4 else (int(kernel), 1)
    moved = conv_elements(x.shape[0], cin, cout, in_sp, out_sp, kernel, groups)
    recs = [{"op": f"{op}.{p}" if p != "fwd" else op, "cls": "conv", "variant": p, "dtype": "gemm",
             "flops": pass_flops,
             "size": {"m": m, "n": n, "k": k, "x": moved, "kh": kh, "kw": kw, "stride": stride, "groups": groups,
                      "cin": cin}} for p, (m, n, k) in gemm]
    if name == "convolution_backward" and b["output_mask"][2]:  # bias gradient: a reduction of dY
        recs.append({"op": f"{op}.bias_grad", "cls": "sum", "dtype": "low", "size": {"x": prod(y_shape)}})
    return recs


def _transposed_parts(name, b) -> list:
    if name != "convolution_backward":
        return ["dgrad"]
    return [p for p, on in zip(("fwd", "wgrad"), b["output_mask"]) if on]
