"""The operations the compute calibration times, one builder per op.

A builder takes a case (a row of ``compute.csv`` without its measurements),
the device and the number of input copies to rotate among, and returns a
:class:`Bench`: the zero-argument calls to time and the context (math mode,
attention backend, cuDNN autotuning) to time them in. ``phase`` 'fwd' times
the forward call; 'fwdbwd' the forward and ``torch.autograd.grad`` of its
output with respect to the inputs a training step differentiates; 'step'
one optimizer step.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F

from perfmodel.core.units import DTYPE_BYTES

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}
PARAM_CHUNK = 1 << 22  # optimizer parameters come as tensors of up to 4 Mi elements, like a model's


@dataclass
class Bench:
    calls: list[Callable[[], object]]
    context: Callable[[], contextlib.AbstractContextManager] = field(default=contextlib.nullcontext)


@contextlib.contextmanager
def _math_mode(tf32: bool):
    """TF32 on (dtype 'tf32') or off (strict 'fp32') for CUDA matmuls and convolutions."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


@contextlib.contextmanager
def _cudnn_benchmark():
    old = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = old


def _context(case: dict, device: str) -> Callable[[], contextlib.AbstractContextManager]:
    if not device.startswith("cuda"):
        return contextlib.nullcontext
    return partial(_math_mode, case["dtype"] == "tf32")


def _randn(shape, device, dtype, grad=False):
    return torch.randn(*shape, device=device, dtype=dtype, requires_grad=grad)


def _phase(fwd: Callable[[], torch.Tensor], inputs: tuple, phase: str) -> Callable[[], object]:
    """The forward call, or forward + gradients of its output w.r.t. ``inputs``."""
    if phase == "fwd":
        return fwd
    grad = torch.randn_like(fwd().detach())

    def fwdbwd():
        return torch.autograd.grad(fwd(), inputs, grad)
    return fwdbwd


def _rotate(make: Callable[[], Callable], copies: int) -> list[Callable]:
    return [make() for _ in range(max(1, copies))]


# --- matrix products -------------------------------------------------------------------------


def gemm(case, device, copies) -> Bench:
    m, n, k, dtype = case["m"], case["n"], case["k"], case["dtype"]
    if dtype == "fp8":
        return _gemm_fp8(m, n, k, device, copies)

    def make():
        a, b = _randn((m, k), device, DTYPES[dtype]), _randn((k, n), device, DTYPES[dtype])
        return partial(torch.mm, a, b)
    return Bench(_rotate(make, copies), _context(case, device))


def _gemm_fp8(m, n, k, device, copies) -> Bench:
    """e4m3 x e4m3 -> bf16 through ``torch._scaled_mm`` (the second operand column-major)."""
    def make():
        a = _randn((m, k), device, torch.float32).to(torch.float8_e4m3fn)
        b = _randn((n, k), device, torch.float32).to(torch.float8_e4m3fn).t()
        one = torch.ones((), device=device, dtype=torch.float32)
        return partial(torch._scaled_mm, a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    return Bench(_rotate(make, copies))


def bmm(case, device, copies) -> Bench:
    b, m, n, k, dtype = case["batch"], case["m"], case["n"], case["k"], DTYPES[case["dtype"]]

    def make():
        x, y = _randn((b, m, k), device, dtype), _randn((b, k, n), device, dtype)
        return partial(torch.bmm, x, y)
    return Bench(_rotate(make, copies), _context(case, device))


def sdpa(case, device, copies) -> Bench:
    b, h, kvh, s, d = case["batch"], case["heads"], case["kv_heads"], case["seq"], case["head_dim"]
    dtype, grad = DTYPES[case["dtype"]], case["phase"] == "fwdbwd"
    kwargs = {"is_causal": bool(case["causal"])}
    if kvh != h:
        kwargs["enable_gqa"] = True  # grouped-query attention: kv heads shared by heads/kv_heads

    def make():
        q = _randn((b, h, s, d), device, dtype, grad)
        k, v = _randn((b, kvh, s, d), device, dtype, grad), _randn((b, kvh, s, d), device, dtype, grad)
        return _phase(partial(F.scaled_dot_product_attention, q, k, v, **kwargs), (q, k, v), case["phase"])

    # the backend PyTorch picks for a model (on a CPU: its flash kernel, whose backward costs
    # ~15x its forward at GPT-2-like shapes), not one forced for the benchmark
    return Bench(_rotate(make, copies))


CONV_PASS_MASKS = {"dgrad": [True, False, False], "wgrad": [False, True, False]}  # convolution_backward


def conv2d(case, device, copies) -> Bench:
    """NCHW shapes in channels-last memory; padding k//2; cuDNN autotuning on GPU. Phase 'dgrad' /
    'wgrad' times one gradient alone (aten.convolution_backward with one output, as autograd calls it)."""
    nb, cin, cout, hw, ks, stride = (case[c] for c in ("batch", "cin", "cout", "hw", "kernel", "stride"))
    groups = int(case.get("groups") or 1)
    dtype, grad = DTYPES[case["dtype"]], case["phase"] == "fwdbwd"

    def make():
        x = _randn((nb, cin, hw, hw), device, dtype).to(memory_format=torch.channels_last)
        w = _randn((cout, cin // groups, ks, ks), device, dtype).to(memory_format=torch.channels_last)
        fwd = partial(F.conv2d, x, w, stride=stride, padding=ks // 2, groups=groups)
        if case["phase"] in CONV_PASS_MASKS:
            dy = torch.randn_like(fwd()).contiguous(memory_format=torch.channels_last)
            return partial(torch.ops.aten.convolution_backward, dy, x, w, None, [stride] * 2, [ks // 2] * 2,
                           [1, 1], False, [0, 0], groups, CONV_PASS_MASKS[case["phase"]])
        x.requires_grad_(grad)
        w.requires_grad_(grad)
        return _phase(fwd, (x, w), case["phase"])
    context = partial(_conv_context, case["dtype"] == "tf32") if device.startswith("cuda") else contextlib.nullcontext
    return Bench(_rotate(make, copies), context)


@contextlib.contextmanager
def _conv_context(tf32: bool):
    """cuDNN autotuning, with TF32 on (dtype 'tf32') or off (strict 'fp32')."""
    with _cudnn_benchmark(), _math_mode(tf32):
        yield


# --- memory-bound layers (tokens x hidden) --------------------------------------------------


def _rows_op(case, device, copies, fwd_of: Callable, params: int = 0) -> Bench:
    """A (tokens, hidden) op with ``params`` vectors of size hidden; ``fwd_of(x, w, b)`` is its call."""
    t, h, dtype, grad = case["tokens"], case["hidden"], DTYPES[case["dtype"]], case["phase"] == "fwdbwd"

    def make():
        x = _randn((t, h), device, dtype, grad)
        w = torch.ones(h, device=device, dtype=dtype, requires_grad=grad and params >= 1)
        b = torch.zeros(h, device=device, dtype=dtype, requires_grad=grad and params >= 2)
        return _phase(fwd_of(x, w, b), (x, w, b)[: 1 + params], case["phase"])
    return Bench(_rotate(make, copies))


def _rms_norm(x, w, eps=1e-6):
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def layernorm(case, device, copies) -> Bench:
    return _rows_op(case, device, copies, lambda x, w, b: partial(F.layer_norm, x, (x.shape[-1],), w, b),
                    params=2)


def rmsnorm(case, device, copies) -> Bench:
    return _rows_op(case, device, copies, lambda x, w, b: partial(_rms_norm, x, w), params=1)


def softmax(case, device, copies) -> Bench:
    return _rows_op(case, device, copies, lambda x, w, b: partial(F.softmax, x, dim=-1))


def gelu(case, device, copies) -> Bench:
    return _rows_op(case, device, copies, lambda x, w, b: partial(F.gelu, x))


def residual_add(case, device, copies) -> Bench:
    def make():
        x = _randn((case["tokens"], case["hidden"]), device, DTYPES[case["dtype"]])
        r = torch.randn_like(x)
        return partial(torch.add, x, r)
    return Bench(_rotate(make, copies))


def swiglu(case, device, copies) -> Bench:
    """silu(gate) * up, gate and up the two halves of one (tokens, 2 hidden) fc1 output.

    The halves are strided views (``chunk``), as in a Llama MLP; gradients flow to the fc1 output.
    """
    t, h, dtype, grad = case["tokens"], case["hidden"], DTYPES[case["dtype"]], case["phase"] == "fwdbwd"

    def make():
        a = _randn((t, 2 * h), device, dtype, grad)

        def fwd():
            gate, up = a.chunk(2, dim=-1)
            return F.silu(gate) * up
        return _phase(fwd, (a,), case["phase"])
    return Bench(_rotate(make, copies))


def rope(case, device, copies) -> Bench:
    """Rotary embedding as plain PyTorch, q*cos + rotate_half(q)*sin (cat/mul), on q as the model
    has it: a (batch, heads, seq, head_dim) transposed view of the fused QKV output."""
    b, h, s, d = case["batch"], case["heads"], case["seq"], case["head_dim"]
    dtype, grad = DTYPES[case["dtype"]], case["phase"] == "fwdbwd"

    def make():
        qkv = _randn((b, s, 3 * h * d), device, dtype, grad)
        q = qkv[..., : h * d].view(b, s, h, d).transpose(1, 2)  # gradients stop at this view
        cos, sin = _randn((s, d), device, dtype), _randn((s, d), device, dtype)

        def fwd():
            x1, x2 = q[..., : d // 2], q[..., d // 2:]
            return q * cos + torch.cat((-x2, x1), dim=-1) * sin
        return _phase(fwd, (q,), case["phase"])
    return Bench(_rotate(make, copies))


def cross_entropy(case, device, copies) -> Bench:
    """F.cross_entropy on fp32 logits (tokens, vocab), mean over tokens."""
    t, v, grad = case["tokens"], case["vocab"], case["phase"] == "fwdbwd"

    def make():
        logits = _randn((t, v), device, torch.float32, grad)
        target = torch.randint(0, v, (t,), device=device)
        return _phase(partial(F.cross_entropy, logits, target), (logits,), case["phase"])
    return Bench(_rotate(make, copies))


def _cast(case, device, copies, src: torch.dtype, dst: torch.dtype) -> Bench:
    if case.get("tokens"):
        shape = (case["tokens"], case["vocab"])  # the logits cast in front of cross-entropy
    else:
        shape = (case["bytes"] // 6,)  # 'bytes' = 4 + 2 bytes per element read and written

    def make():
        x = _randn(shape, device, src)
        return partial(x.to, dst)
    return Bench(_rotate(make, copies))


def cast_bf16_to_fp32(case, device, copies) -> Bench:
    return _cast(case, device, copies, torch.bfloat16, torch.float32)


def cast_fp32_to_bf16(case, device, copies) -> Bench:
    return _cast(case, device, copies, torch.float32, torch.bfloat16)


def embedding(case, device, copies) -> Bench:
    """Gather rows of a (vocab, hidden) fp32 table; backward = scatter-add into its gradient."""
    t, v, h, grad = case["tokens"], case["vocab"], case["hidden"], case["phase"] == "fwdbwd"

    def make():
        weight = _randn((v, h), device, torch.float32, grad)
        idx = torch.randint(0, v, (t,), device=device)
        return _phase(partial(F.embedding, idx, weight), (weight,), case["phase"])
    return Bench(_rotate(make, copies))


# --- raw memory traffic ----------------------------------------------------------------------

MEM_OPERANDS = {"copy": 2, "add": 3, "scale": 2, "sum": 1}  # tensors read or written per element


def memory(case, device, copies) -> Bench:
    """copy: y.copy_(x); add: x+z -> y; scale: 1.5*x -> y; sum: x.sum(); fp32, 'bytes' moved."""
    op, n = case["op"], max(1, case["bytes"] // (4 * MEM_OPERANDS[case["op"]]))

    def make():
        x = _randn((n,), device, torch.float32)
        y, z = torch.empty_like(x), torch.randn_like(x)
        return {"copy": partial(y.copy_, x), "add": partial(torch.add, x, z, out=y),
                "scale": partial(torch.mul, x, 1.5, out=y), "sum": x.sum}[op]
    return Bench(_rotate(make, copies))


def transfer(case, device, copies) -> Bench:
    """h2d / d2h copies of 'bytes' bytes; dtype 'pinned' (page-locked host) or 'pageable'."""
    n, pinned = case["bytes"], case["dtype"] == "pinned"
    host = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)
    gpu = torch.empty(n, dtype=torch.uint8, device=device)
    if case["op"] == "h2d":
        return Bench([partial(gpu.copy_, host, non_blocking=pinned)])
    return Bench([partial(host.copy_, gpu, non_blocking=pinned)])


# --- optimizers ------------------------------------------------------------------------------


def _params(count: int, device: str) -> list[torch.Tensor]:
    sizes = [PARAM_CHUNK] * (count // PARAM_CHUNK) + ([count % PARAM_CHUNK] if count % PARAM_CHUNK else [])
    params = [torch.zeros(s, device=device, requires_grad=True) for s in sizes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    return params


def adamw(case, device, copies) -> Bench:
    """One AdamW step over 'params' fp32 parameters: fused kernel, or foreach when fused=False."""
    fused = bool(case["fused"])
    opt = torch.optim.AdamW(_params(case["params"], device), lr=1e-4, fused=fused, foreach=not fused)
    return Bench([opt.step])


def sgd(case, device, copies) -> Bench:
    """One SGD step with momentum 0.9 over 'params' fp32 parameters (fused or foreach)."""
    fused = bool(case["fused"])
    opt = torch.optim.SGD(_params(case["params"], device), lr=1e-4, momentum=0.9, fused=fused,
                          foreach=not fused)
    return Bench([opt.step])


# --- per-call cost ---------------------------------------------------------------------------


def launch_add(case, device, copies) -> Bench:
    """A one-element add: the cost of launching one kernel from eager PyTorch. 'fwdbwd': the add
    and ``torch.autograd.grad`` of it, whose excess over two launches is what one backward call
    costs the autograd engine (paid once per ``backward()`` in a step, once per call in a benchmark)."""
    if case["phase"] == "fwdbwd":
        x = torch.ones(1, device=device, requires_grad=True)
        return Bench([_phase(lambda: x + 1.0, (x,), "fwdbwd")])
    x = torch.ones(1, device=device)
    y = torch.empty_like(x)
    return Bench([partial(torch.add, x, 1.0, out=y)])


def launch_mm(case, device, copies) -> Bench:
    """A 16x16x16 matrix product: the per-call floor of a GEMM."""
    a = _randn((16, 16), device, DTYPES[case["dtype"]])
    return Bench([partial(torch.mm, a, a)])


# --- what a training step adds around its kernels -------------------------------------------------


def train_step(case, device, copies) -> Bench:
    """One whole training step of a tiny transformer (``layers`` blocks, negligible arithmetic):
    module calls, autograd and the optimizer's host work, which kernel microbenchmarks miss.

    The same step as ``calibration.train`` (zero_grad, forward and backward under autocast on a
    GPU, fused AdamW); the fitter compares it with the kernels it predicts for that model.
    """
    import perfmodel as pm
    from calibration import train
    from perfmodel.fit.overhead import precision_of
    from perfmodel import Strategy

    model = pm.transformer(layers=case["layers"], hidden=case["hidden"], heads=case["heads"],
                           seq=case["seq"], vocab=case["vocab"])
    strategy = Strategy(dp=1, micro_batch=case["batch"], precision=precision_of(case["dtype"]))
    with torch.device(device):
        net = train.build_module(model)
    opt = train.make_optimizer(net, strategy, {"world": 1})
    return Bench([train.make_step(net, opt, strategy, model, {"rank": 0, "device": device}, 0)])


BUILDERS: dict[str, Callable[[dict, str, int], Bench]] = {
    "gemm": gemm, "bmm": bmm, "sdpa": sdpa, "conv2d": conv2d,
    "layernorm": layernorm, "rmsnorm": rmsnorm, "softmax": softmax, "gelu": gelu,
    "swiglu": swiglu, "rope": rope, "residual_add": residual_add, "cross_entropy": cross_entropy,
    "cast_bf16_to_fp32": cast_bf16_to_fp32, "cast_fp32_to_bf16": cast_fp32_to_bf16,
    "embedding": embedding, "copy": memory, "add": memory, "scale": memory, "sum": memory,
    "h2d": transfer, "d2h": transfer, "adamw": adamw, "sgd": sgd,
    "launch_add": launch_add, "launch_mm": launch_mm, "train_step": train_step,
}
# CNN layers (calibration/cnn_ops.py): shapes batch x cin x hw x hw, channels-last
CNN_LAYER_OPS = frozenset({"batchnorm", "relu", "silu", "sigmoid", "maxpool", "avgpool", "se_pool", "se_scale"})
ROTATE = (frozenset(BUILDERS) | CNN_LAYER_OPS) - {"h2d", "d2h", "adamw", "sgd", "launch_add", "launch_mm",
                                                   "train_step"}


def input_bytes(case: dict) -> int:
    """Bytes of the inputs one call reads (decides input rotation and what fits in memory)."""
    op, e = case["op"], DTYPE_BYTES.get(case.get("dtype"), 4)
    g = case.get
    if op == "gemm":
        return (g("m") * g("k") + g("k") * g("n")) * e
    if op == "bmm":
        return g("batch") * (g("m") * g("k") + g("k") * g("n")) * e
    if op == "sdpa":
        return g("batch") * g("seq") * g("head_dim") * (g("heads") + 2 * g("kv_heads")) * e
    if op == "conv2d":
        return (g("batch") * g("cin") * g("hw") ** 2 + g("cout") * g("cin") * g("kernel") ** 2) * e
    if op in CNN_LAYER_OPS:
        return g("batch") * g("cin") * g("hw") ** 2 * e
    if op in ("cross_entropy", "cast_bf16_to_fp32", "cast_fp32_to_bf16") and g("tokens"):
        return g("tokens") * g("vocab") * 4
    if op == "embedding":
        return g("vocab") * g("hidden") * 4
    if op == "rope":
        return 3 * g("batch") * g("heads") * g("seq") * g("head_dim") * e  # the fused QKV output
    if op in ("adamw", "sgd"):
        return g("params") * 16  # parameters, gradients and two states, fp32
    if g("tokens") and g("hidden"):
        return g("tokens") * g("hidden") * e * (2 if op in ("swiglu", "residual_add") else 1)
    return g("bytes") or 0


def copies_for(case: dict, device: str, l2_bytes: int | None) -> int:
    """How many input copies to rotate among so that the L2 cache does not hold them."""
    if not device.startswith("cuda") or case["op"] not in ROTATE or not l2_bytes:
        return 1
    size = max(1, input_bytes(case))
    if size >= 2 * l2_bytes:
        return 1
    return min(16, math.ceil(4 * l2_bytes / size))


def moved_bytes(case: dict) -> int | None:
    """The 'bytes' column: bytes a minimal kernel reads + writes (docs/calibration.md)."""
    op, phase, e, g = case["op"], case["phase"], DTYPE_BYTES.get(case.get("dtype"), 4), case.get
    both = phase == "fwdbwd"
    if op in ("layernorm", "rmsnorm", "softmax", "gelu"):
        return (5 if both else 2) * g("tokens") * g("hidden") * e  # fwd: x, y; bwd: x, dy, dx
    if op == "swiglu":
        return (8 if both else 3) * g("tokens") * g("hidden") * e  # fwd: g, u, y; bwd: g, u, dy, dg, du
    if op == "residual_add":
        return 3 * g("tokens") * g("hidden") * e
    if op == "rope":
        return (4 if both else 2) * g("batch") * g("heads") * g("seq") * g("head_dim") * e
    if op == "cross_entropy":
        return (3 if both else 1) * g("tokens") * g("vocab") * 4  # fwd: read logits; bwd: read, write grad
    if op in ("cast_bf16_to_fp32", "cast_fp32_to_bf16"):
        return g("tokens") * g("vocab") * 6 if g("tokens") else g("bytes")  # 4 + 2 bytes per element
    if op == "embedding":  # fwd: gather T rows, write T rows; bwd: zero the V x H grad, scatter-add T rows
        th, vh = g("tokens") * g("hidden"), g("vocab") * g("hidden")
        return (5 * th + vh) * 4 if both else 2 * th * 4
    if op == "adamw":
        return 28 * g("params")  # fp32 p, g, m, v read; p, m, v written
    if op == "sgd":
        return 20 * g("params")  # fp32 p, g, momentum read; p, momentum written
    if op == "launch_add":
        return 8
    if op in CNN_LAYER_OPS:
        return layer_bytes(case)
    return g("bytes")


def layer_bytes(case: dict) -> int:
    """Bytes a CNN layer reads and writes, counted as perfmodel/workload/torch_import.py counts the traced
    op (inputs read once, batch norm's twice; int64 pooling indices 8 bytes each)."""
    x = case["batch"] * case["cin"] * case["hw"] ** 2
    e, op, bwd = DTYPE_BYTES.get(case["dtype"], 4), case["op"], case["phase"] == "bwd"
    if op == "batchnorm":
        return (5 if bwd else 3) * x * e  # fwd: x twice, y; bwd: x and dy twice, dx
    if op == "maxpool":  # 3x3 stride 2: y = x/4, with int64 indices
        y = x // 4
        return (y + x + x) * e + 8 * y if bwd else (x + y) * e + 8 * y
    if op == "se_pool":  # spatial mean: read x, write N x C
        return x * e + case["batch"] * case["cin"] * e
    if op == "se_scale":  # x · gate: read x and the N x C gate, write x
        return 2 * x * e + case["batch"] * case["cin"] * e
    return (3 if bwd else 2) * x * e  # pointwise (and 3x3 stride-1 average pooling): fwd x, y; bwd + dy
