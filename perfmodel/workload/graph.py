"""Workloads of any architecture: the ops of one training step, as data.

A :class:`GraphModel` holds the aten ops one training step of a model runs
(forward, loss, backward), each tagged with the cost class the Profile prices
(``gemm``, ``sdpa``, ``conv2d``, ``layernorm``...) and its sizes. Every size is
an affine function of the micro-batch, ``value = a + s · batch``: traces at two
batch sizes tell which terms scale (GEMM m, a convolution's implicit-GEMM M,
activation bytes) and which do not (weights, weight gradients' output size).
It plugs into the predictor exactly where a :class:`~perfmodel.workload.model.Transformer`
does (``layers`` = 1, ``seq`` = 1: one "token" per sample, ``hidden`` = 0 so
tensor-parallel and pipeline activation bytes vanish, ``vocab`` = classes).

Build one with :func:`perfmodel.from_torch`, load a shipped one with
``pm.preset("resnet50")``, or read a JSON file with :func:`load_graph`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from perfmodel.core.errors import ProfileError, UnsupportedError
from perfmodel.core.units import DTYPE_BYTES
from perfmodel.core.checks import check_choice, read_json_file
from perfmodel.workload.ops import Kernel
from perfmodel.workload.kernels import PRECISIONS, gemm_dtype, is_mixed
from perfmodel.workload.stacks import GRAPH_FRAMEWORKS, stack

SCHEMA_VERSION = 1
# Cost classes an op can carry: priced by perfmodel.costs.compute.kernel_time ("bytes" -> the
# 'copy' bandwidth curve; "conv2d" -> its implicit GEMMs are separate 'gemm' ops, this is the rest).
# "conv" -> one convolution pass (fwd/dgrad/wgrad) priced by its class (perfmodel/costs/cnn.py); the
# bandwidth-bound CNN layers below -> their own classes over the bytes they move
CNN_MEM_CLASSES = ("batchnorm", "relu", "silu", "sigmoid", "maxpool", "avgpool", "se_pool", "se_scale")
OP_CLASSES = ("gemm", "sdpa", "conv2d", "layernorm", "gelu", "softmax", "cross_entropy", "embedding",
              "sum", "bytes", "cast_fp32_to_bf16", "cast_bf16_to_fp32", "conv") + CNN_MEM_CLASSES
OP_PHASES = ("fwd", "bwd", "loss_fwd", "loss_bwd")
# element width of an op's tensors: "gemm" = the precision's GEMM dtype, "low" = activations
# (bf16/fp16 under autocast, fp32 otherwise), "f32" = fp32 whatever the precision
DTYPE_KINDS = ("gemm", "low", "f32")
RECOMPUTE = ("none", "selective", "full")


def conv_gemm_shapes(batch, cin, cout, in_spatial, out_spatial, kernel, groups=1) -> dict:
    """Implicit-GEMM shapes (m, n, k) of a convolution's forward, data and weight gradients.

    Spatial arguments are products over the spatial dimensions (H·W, P·Q, R·S).
    forward  Y[N·PQ, Cout]      = X_col[N·PQ, Cin/g·RS] · W^T       (m=N·PQ, n=Cout,      k=Cin/g·RS)
    dgrad    dX_col[N·PQ, Cin·RS] = dY[N·PQ, Cout/g] · W             (m=N·PQ, n=Cin·RS,    k=Cout/g)
    wgrad    dW[Cout, Cin/g·RS]  = dY^T[Cout, N·PQ] · X_col          (m=Cout, n=Cin/g·RS,  k=N·PQ)
    (Chetlur et al. 2014, cuDNN, §3: convolution as GEMM over the lowered input; a group of g
    splits it into g GEMMs of 1/g the width, counted here as one GEMM of the same FLOPs.)
    Ungrouped channel counts are padded to a multiple of 8 as cuDNN's NHWC tensor-core
    kernels do (a 3-channel stem runs as 8 channels), so the shapes time the work done.
    ``in_spatial`` is kept for the element count of the lowered input's source.
    """
    del in_spatial
    if np.ndim(groups) == 0:
        if groups == 1:  # NHWC tensor-core kernels pad channels to a multiple of 8 (cuDNN developer guide)
            cin, cout = _pad8(cin), _pad8(cout)
    else:  # rows of a table: pad the ungrouped ones
        dense = np.asarray(groups) == 1
        cin, cout = np.where(dense, _pad8(cin), cin), np.where(dense, _pad8(cout), cout)
    rows = np.multiply(batch, out_spatial)
    return {"fwd": (rows, cout, np.multiply(cin / groups, kernel)),
            "dgrad": (rows, np.multiply(cin, kernel), cout / groups),
            "wgrad": (cout, np.multiply(cin / groups, kernel), rows)}


def conv_kind(groups, cin) -> str:
    """``dense`` (one group), ``depthwise`` (one input channel per group) or ``grouped``."""
    groups, cin = int(groups), int(cin)
    if groups <= 1:
        return "dense"
    return "depthwise" if cin // groups == 1 else "grouped"


def _pad8(c):
    return np.ceil(np.asarray(c, float) / 8.0) * 8.0


def conv_elements(batch, cin, cout, in_spatial, out_spatial, kernel, groups=1, *, passes=1):
    """Elements a convolution GEMM pass reads and writes: input + weight + output.

    Forward reads X and W and writes Y; data gradient reads dY and W and writes dX;
    weight gradient reads dY and X and writes dW: each pass moves |X| + |W| + |Y|.
    """
    x = np.multiply(batch, np.multiply(cin, in_spatial))
    y = np.multiply(batch, np.multiply(cout, out_spatial))
    w = np.multiply(cout, np.multiply(cin / groups, kernel))
    return passes * (x + y + w)


@dataclass(frozen=True)
class GraphOp:
    """One kind of op launched ``count`` times per step; sizes are ``(a, s)``: a + s·batch."""

    op: str
    cls: str
    phase: str
    size: dict = field(default_factory=dict)
    flops: tuple = (0.0, 0.0)
    count: int = 1
    variant: str = "fwd"
    dtype: str = "low"
    mixed_only: bool = False

    def at(self, key: str, batch):
        a, s = self.size[key]
        return a + s * np.asarray(batch, float)

    def flops_at(self, batch):
        return self.flops[0] + self.flops[1] * np.asarray(batch, float)

    def to_dict(self) -> dict:
        out = {"op": self.op, "cls": self.cls, "phase": self.phase,
               "size": {k: [_num(a), _num(s)] for k, (a, s) in self.size.items()},
               "flops": [_num(self.flops[0]), _num(self.flops[1])], "count": int(self.count),
               "variant": self.variant, "dtype": self.dtype}
        if self.mixed_only:
            out["mixed_only"] = True
        return out

    @classmethod
    def from_dict(cls, d: dict) -> GraphOp:
        check_choice("op class", d["cls"], OP_CLASSES)
        check_choice("op phase", d["phase"], OP_PHASES)
        check_choice("op dtype", d.get("dtype", "low"), DTYPE_KINDS)
        size = {k: (float(v[0]), float(v[1])) for k, v in d.get("size", {}).items()}
        flops = tuple(float(v) for v in d.get("flops", (0.0, 0.0)))
        return cls(str(d["op"]), d["cls"], d["phase"], size, flops, int(d.get("count", 1)),
                   d.get("variant", "fwd"), d.get("dtype", "low"), bool(d.get("mixed_only", False)))


def _num(v: float):
    v = float(v)
    return int(v) if v.is_integer() and abs(v) < 2**53 else v


def _dtypes(precision: str) -> dict:
    """Element dtype of each kind under ``precision`` (autocast keeps fp32 master weights)."""
    low = ("fp16" if precision == "fp16-mixed" else "bf16") if is_mixed(precision) else "fp32"
    return {"gemm": gemm_dtype(precision), "low": low, "f32": "fp32"}




@dataclass(frozen=True)
class GraphModel:
    """A traced model: ops per step as affine functions of the micro-batch, plus parameter counts.

    ``classes`` counts the loss input's elements per sample (the classes of a classifier;
    positions × vocabulary for a language model), which sizes the predictor's loss memory.

    ``activation`` holds the elements autograd saves for backward per sample, by width
    (``low``: activations, ``f32``: always 4 bytes, ``bytes``: integer tensors' bytes);
    ``input_bytes`` is one sample's input (what full recomputation keeps).
    """

    name: str
    ops: tuple
    params: int
    gemm_params: int
    classes: int
    activation: dict
    input_bytes: float = 0.0
    traced_batches: tuple = (2, 4)
    source: str = ""
    notes: tuple = ()

    # -- the attributes the predictor reads (duck-typed like Transformer) ---------
    @property
    def layers(self) -> int:
        return 1

    @property
    def seq(self) -> int:
        return 1

    @property
    def hidden(self) -> int:
        return 0

    @property
    def vocab(self) -> int:
        return self.classes

    def __repr__(self) -> str:
        return (f"GraphModel(name={self.name!r}, ops={sum(o.count for o in self.ops)}, "
                f"params={self.params / 1e6:.2f}M, classes={self.classes})")

    def check_strategy(self, strategy) -> None:
        """Only data parallelism (DDP, ZeRO, FSDP, parameter servers) splits a traced graph, and only a stack
        that wraps any module (``GRAPH_FRAMEWORKS``) trains it."""
        if strategy.framework not in GRAPH_FRAMEWORKS:
            raise UnsupportedError(
                f"{self.name!r} is a traced graph: framework={strategy.framework!r} trains its own transformer "
                f"code, not a traced module; use framework={' or '.join(map(repr, GRAPH_FRAMEWORKS))}")
        cp = strategy.cp
        if strategy.tp > 1 or strategy.pp > 1 or cp > 1 or strategy.sequence_parallel:
            raise UnsupportedError(
                f"{self.name!r} is a traced graph: only data parallelism is modelled for it "
                f"(got tp={strategy.tp}, pp={strategy.pp}, cp={cp}); use tp=1, pp=1, cp=1 and scale with dp")
        # the builder's choice of attention kernels; a graph keeps its own (the framework's default passes)
        if strategy.attention not in ("flash", stack(strategy.framework).default_attention):
            raise UnsupportedError(
                f"{self.name!r} is a traced graph: it runs the attention kernels it was traced with, so "
                f"'attention'={strategy.attention!r} does not apply; use attention='flash' (the default)")

    def _check_parallel(self, tp, sp) -> None:
        if np.any(np.asarray(tp) > 1) or np.any(np.asarray(sp, bool)):
            raise UnsupportedError(f"{self.name!r} is a traced graph: tensor/sequence parallelism "
                                   "cannot split it (use tp=1 and data parallelism)")

    # -- kernels ------------------------------------------------------------------
    def _kernels(self, phase: str, batch, precision: str) -> list[Kernel]:
        check_choice("precision", precision, PRECISIONS)
        dt, mixed = _dtypes(precision), is_mixed(precision)
        out = []
        for op in self.ops:
            if op.phase == phase and (mixed or not op.mixed_only):
                out.append(_kernel(op, batch, dt))
        return out

    def layer_kernels(self, micro_batch, *, tp=1, sp=False, precision="bf16-mixed", recompute="none", ep=1, etp=None):
        """(forward, backward) kernels of the whole model for one micro-batch (loss excluded; no experts: ep and etp
        change nothing)."""
        self._check_parallel(tp, sp)
        check_choice("recompute", recompute, RECOMPUTE)
        fwd = self._kernels("fwd", micro_batch, precision)
        bwd = self._kernels("bwd", micro_batch, precision)
        redo = {"none": [], "full": fwd, "selective": [k for k in fwd if k.cls in ("sdpa", "softmax")]}[recompute]
        bwd = [replace(k, name=k.name + ".recompute", phase="bwd")
               for k in redo] + bwd
        return fwd, bwd

    def embedding_kernels(self, micro_batch, *, tp=1, precision="bf16-mixed", vocab_multiple=1):
        """Traced graphs have no separate embedding stage (an embedding op is part of the graph)."""
        self._check_parallel(tp, False)
        return [], []

    def head_kernels(self, micro_batch, *, tp=1, sp=False, precision="bf16-mixed", vocab_multiple=1):
        """The loss: its forward ops and the backward ops that run before the model's own."""
        self._check_parallel(tp, sp)
        return (self._kernels("loss_fwd", micro_batch, precision),
                self._kernels("loss_bwd", micro_batch, precision))

    # -- parameters, memory, FLOPs --------------------------------------------------
    def param_parts(self) -> dict:
        """Parameter counts as the predictor splits them (everything is one 'layer')."""
        return {"layer": float(self.params), "embed": 0.0, "head": 0.0,
                "gemm_layer": float(self.gemm_params), "gemm_head": 0.0}

    def activation_bytes_per_token(self, *, tp=1, sp=False, precision="bf16-mixed", recompute="none"):
        """Bytes saved for backward per sample (a sample is this workload's 'token')."""
        self._check_parallel(tp, sp)
        if recompute == "full":  # torch.utils.checkpoint around the model keeps only its input
            return float(self.input_bytes)
        low = DTYPE_BYTES[_dtypes(precision)["low"]]
        a = self.activation
        return float(a.get("low", 0.0) * low + a.get("f32", 0.0) * 4.0 + a.get("bytes", 0.0))

    def flops_per_step(self, batch) -> float:
        """Training FLOPs of one step at ``batch`` samples, as torch.utils.flop_counter counts them."""
        return float(sum(op.flops_at(batch) * op.count for op in self.ops))

    def flops_by_class(self, batch) -> dict:
        out: dict = {}
        for op in self.ops:
            out[op.cls] = out.get(op.cls, 0.0) + float(op.flops_at(batch) * op.count)
        return {k: v for k, v in out.items() if v}

    # -- JSON -------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "kind": "graph", "name": self.name,
                "params": int(self.params), "gemm_params": int(self.gemm_params),
                "classes": int(self.classes), "activation": {k: _num(v) for k, v in self.activation.items()},
                "input_bytes": _num(self.input_bytes), "traced_batches": list(self.traced_batches),
                "source": self.source, "notes": list(self.notes), "ops": [o.to_dict() for o in self.ops]}

    @classmethod
    def from_dict(cls, d: dict, *, origin: str = "graph") -> GraphModel:
        if not isinstance(d, dict) or d.get("kind") != "graph":
            raise ProfileError(f"{origin}: not a graph workload (needs \"kind\": \"graph\")")
        if d.get("schema_version", 0) > SCHEMA_VERSION:
            raise ProfileError(f"{origin}: schema_version {d.get('schema_version')} is newer than this "
                               f"perfmodel understands ({SCHEMA_VERSION})")
        missing = [k for k in ("name", "params", "classes", "ops") if k not in d]
        if missing:
            raise ProfileError(f"{origin}: missing fields {missing}")
        return cls(str(d["name"]), tuple(GraphOp.from_dict(o) for o in d["ops"]), int(d["params"]),
                   int(d.get("gemm_params", 0)), int(d["classes"]),
                   {k: float(v) for k, v in d.get("activation", {}).items()}, float(d.get("input_bytes", 0.0)),
                   tuple(d.get("traced_batches", (2, 4))), str(d.get("source", "")), tuple(d.get("notes", ())))

    def save(self, path) -> None:
        """Write JSON: the header indented, then one op per line (diff-friendly)."""
        data = self.to_dict()
        ops = data.pop("ops")
        head = json.dumps(data, indent=1)[:-2]
        lines = ",\n".join(" " + json.dumps(op, separators=(",", ":")) for op in ops)
        Path(path).write_text(f'{head},\n "ops": [\n{lines}\n ]\n}}\n')

    def with_name(self, name: str) -> GraphModel:
        return replace(self, name=str(name))

    def with_(self, **overrides) -> GraphModel:
        """A transformer's shape overrides (seq, hidden, ...) do not apply to a traced graph."""
        if not overrides:
            return self
        raise UnsupportedError(f"{self.name!r} is a traced graph and takes no overrides: got "
                               f"{', '.join(sorted(overrides))} (trace a modified model with perfmodel.from_torch)")


def load_graph(path) -> GraphModel:
    """Read a GraphModel from a JSON file written by :meth:`GraphModel.save`."""
    data = read_json_file(path, field="path", error=ProfileError, expect="a GraphModel JSON file")
    return GraphModel.from_dict(data, origin=str(path))


def _kernel(op: GraphOp, batch, dt: dict) -> Kernel:
    """The predictor's Kernel for one graph op at ``batch`` samples."""
    dtype = dt[op.dtype]
    flops = op.flops_at(batch)
    if op.cls == "gemm":
        size = {k: op.at(k, batch) for k in ("m", "n", "k")}
        return Kernel(op.op, "gemm", _phase(op), size, op.count, flops, "fwd", dt["gemm"])
    if op.cls == "sdpa":
        size = {k: op.at(k, batch) for k in ("batch", "heads", "kv_heads", "seq", "head_dim", "causal")}
        return Kernel(op.op, "sdpa", _phase(op), size, op.count, flops, op.variant, dtype)
    if op.cls == "bytes":  # generic memory-bound op: bytes moved at the 'copy' bandwidth (8 B per x)
        moved = op.at("low", batch) * DTYPE_BYTES[dt["low"]] + op.at("f32", batch) * 4.0
        return Kernel(op.op, "copy", _phase(op), {"x": moved / 8.0}, op.count, flops, "fwd", "fp32")
    if op.cls in CNN_MEM_CLASSES:  # batch norm, activations, pooling: their class over the bytes moved
        moved = op.at("low", batch) * DTYPE_BYTES[dt["low"]] + op.at("f32", batch) * 4.0
        return Kernel(op.op, op.cls, _phase(op), {"bytes": moved}, op.count, flops, op.variant, dt["low"])
    if op.cls == "conv":  # one pass of a convolution, classed by kind, kernel and stride
        size = {k: op.at(k, batch) for k in op.size}
        return Kernel(op.op, "conv", _phase(op), size, op.count, flops, op.variant, dt["gemm"])
    size = {k: op.at(k, batch) for k in op.size}
    return Kernel(op.op, op.cls, _phase(op), size, op.count, flops, op.variant, dtype)


def _phase(op: GraphOp) -> str:
    return "fwd" if op.phase in ("fwd", "loss_fwd") else "bwd"
