"""Which shapes the compute calibration measures: a full GPU grid, a CPU grid, a quick one.

Every case is a dict of ``compute.csv`` key columns (op, phase, timing, dtype
and the op's shape). The full GPU grid is sized to finish in a few minutes on
one H100/H200-class GPU; the CPU grid uses shapes a CPU finishes in minutes;
``--quick`` is a handful of small shapes for tests (< 60 s on 2 CPU cores).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calibration.ops import input_bytes, moved_bytes

HALF = ("bf16", "fp16")
# fwd ops that are also timed inside a CUDA graph (GPU time without launch gaps)
GRAPH_OPS = frozenset({
    "layernorm", "rmsnorm", "softmax", "gelu", "swiglu", "rope", "residual_add", "cross_entropy",
    "cast_bf16_to_fp32", "cast_fp32_to_bf16", "embedding", "copy", "add", "scale", "sum", "gemm",
    "launch_add", "launch_mm",
})
# fwd+bwd also timed inside a CUDA graph: eager autograd.grad costs ~0.2 ms of CPU per call, which
# hides the GPU time of these ops below tens of MB. Rope's backward failed to capture on an H200
# (torch 2.11); embedding and cross-entropy backward use index kernels: all three stay eager.
GRAPH_FWDBWD_OPS = frozenset({"layernorm", "rmsnorm", "softmax", "gelu", "swiglu"})
GRAPH_MAX_GEMM_MNK = 1 << 30  # graph-time GEMMs up to 1024^3 (where launch cost matters)
# a graph keeps every call's output alive: on an H200 the 1 GiB copy replayed 1.5x slower than eager
# (20 live outputs), the 512 MiB one at eager speed
GRAPH_MAX_BYTES = 1 << 29


@dataclass(frozen=True)
class Request:
    """What to measure: device, precisions, timings, grid size and a memory limit."""

    device: str  # "cpu" or "cuda:N"
    dtypes: tuple[str, ...]
    timings: tuple[str, ...]  # "eager" and, on a GPU, "graph"
    quick: bool = False
    ops: frozenset[str] | None = None  # only these ops (None: all)
    mem_limit_bytes: float = float("inf")

    @property
    def gpu(self) -> bool:
        return self.device.startswith("cuda")


def _case(op: str, phase: str, dtype: str, **shape) -> dict:
    return {"op": op, "phase": phase, "dtype": dtype, **shape}


def _log_uniform(count: int, lo: int, hi: int, seed: int = 0) -> list[tuple[int, int, int]]:
    """``count`` (m, n, k) drawn log-uniformly in [lo, hi] with a fixed seed."""
    rng = np.random.default_rng(seed)
    draws = np.exp(rng.uniform(np.log(lo), np.log(hi), size=(count, 3))).round().astype(int)
    return [tuple(int(v) for v in row) for row in draws]


def _transformer_gemms(hiddens, tokens) -> list[tuple[int, int, int]]:
    """Forward (T, out, in), input-gradient (T, in, out) and weight-gradient (out, in, T) GEMMs
    of the qkv (3h x h), proj (h x h), fc1 (4h x h) and fc2 (h x 4h) layers."""
    shapes = []
    for h in hiddens:
        for t in tokens:
            for out, inp in ((3 * h, h), (h, h), (4 * h, h), (h, 4 * h)):
                shapes += [(t, out, inp), (t, inp, out), (out, inp, t)]
    return shapes


def _misaligned(bases) -> list[tuple[int, int, int]]:
    """One of m, n, k moved off a multiple of 8 (-1, +1, +4) or of 16 (+8) at a time."""
    shapes = []
    for base in bases:
        for dim in range(3):
            for delta in (-1, 1, 4, 8):
                s = list(base)
                s[dim] += delta
                shapes.append(tuple(s))
    return shapes


def _gemm_shapes(req: Request, dtype: str) -> list[tuple[int, int, int]]:
    if req.quick:
        return [(64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 768, 768),
                *_misaligned([(256, 256, 256)])[:6:2], *_log_uniform(2, 16, 512)]
    if not req.gpu:
        return ([(s, s, s) for s in (64, 128, 256, 512, 1024, 2048)]
                + _transformer_gemms((256, 768, 1024), (512,)) + _log_uniform(16, 32, 2048)
                + [(1, 1024, 1024), (8, 1024, 1024), (32, 2048, 2048)] + _misaligned([(512, 512, 512)]))
    square = [(s, s, s) for s in (128, 256, 512, 1024, 2048, 4096, 8192, 16384)]
    skinny = [(m, n, k) for m in (1, 8, 32, 128) for n, k in ((4096, 4096), (8192, 8192), (4096, 16384))]
    skinny += [(4096, 8, 4096), (8192, 32, 8192)]
    lm_head = [s for v in (32000, 50257, 50304, 128256) for s in ((8192, v, 768), (8192, 768, v), (v, 768, 8192))]
    random = _log_uniform(48, 64, 16384)
    if dtype == "bf16":
        shapes = (square + _transformer_gemms((768, 1024, 2048, 4096, 8192), (2048, 16384)) + lm_head
                  + random + skinny + _misaligned([(4096, 4096, 4096), (2048, 768, 3072), (8192, 2048, 8192)]))
    elif dtype == "fp8":
        shapes = square[1:] + _transformer_gemms((768, 1024, 2048, 4096, 8192), (8192,))
    elif dtype in ("fp16", "tf32"):
        shapes = (square + _transformer_gemms((768, 1024, 2048, 4096, 8192), (2048,)) + random[:24]
                  + skinny[:6] + _misaligned([(4096, 4096, 4096)]))
    else:  # strict fp32 is ~15x slower than bf16: keep each product under ~1e12 FLOP
        shapes = square[:-1] + _transformer_gemms((768, 1024, 2048, 4096), (2048,)) + random[:24]
    cap = 2e12 if dtype in ("tf32", "fp32") else float("inf")
    return [s for s in dict.fromkeys(shapes) if 2 * s[0] * s[1] * s[2] <= cap]


def gemm_cases(req: Request) -> list[dict]:
    cases = []
    for dtype in req.dtypes:
        cases += [_case("gemm", "fwd", dtype, m=m, n=n, k=k) for m, n, k in _gemm_shapes(req, dtype)]
    bmm = [(4, 64, 64, 32)] if req.quick else (
        [(16, 256, 256, 64), (16, 256, 64, 256), (32, 512, 512, 64)] if not req.gpu else
        [(96, 1024, 1024, 64), (96, 1024, 64, 1024), (256, 1024, 1024, 64), (32, 4096, 4096, 128),
         (32, 4096, 128, 4096), (64, 512, 512, 64)])
    for dtype in _matmul_dtypes(req):
        cases += [_case("bmm", "fwd", dtype, batch=b, m=m, n=n, k=k) for b, m, n, k in bmm]
    return cases


def _matmul_dtypes(req: Request) -> list[str]:
    """Precisions for bmm, attention and convolution: the requested half ones, else fp32."""
    half = [d for d in req.dtypes if d in HALF]
    return half or (["fp32"] if "fp32" in req.dtypes or "tf32" in req.dtypes else [])


def _act_dtype(req: Request) -> str:
    """The precision autocast runs activations in: bf16 if requested, else fp16, else fp32."""
    return next((d for d in HALF if d in req.dtypes), "fp32")


SDPA_GPU = [  # (batch, heads, kv_heads, seq, head_dim)
    (8, 12, 12, 1024, 64), (16, 12, 12, 1024, 64), (32, 12, 12, 512, 64), (8, 16, 16, 2048, 64),
    (4, 16, 16, 2048, 128), (4, 32, 32, 2048, 128), (1, 32, 32, 4096, 128), (2, 32, 32, 4096, 128),
    (1, 64, 64, 8192, 128), (1, 8, 8, 16384, 128), (4, 32, 8, 2048, 64), (4, 32, 4, 2048, 64),
    (1, 32, 8, 4096, 128), (2, 32, 8, 4096, 128), (1, 32, 8, 8192, 128), (2, 32, 32, 2048, 80),
    (2, 32, 32, 2048, 96), (8, 8, 8, 1000, 125),
]
SDPA_CPU = [(1, 4, 4, 128, 64), (2, 8, 8, 256, 64), (1, 8, 2, 512, 64), (1, 12, 12, 256, 64)]
SDPA_QUICK = [(1, 2, 2, 64, 32), (1, 4, 2, 64, 32), (2, 4, 4, 64, 32), (1, 4, 4, 128, 32)]


def sdpa_cases(req: Request) -> list[dict]:
    cases = []
    for dtype in _matmul_dtypes(req):
        configs = SDPA_QUICK if req.quick else SDPA_GPU if req.gpu else SDPA_CPU
        if req.gpu and not req.quick and dtype != "bf16":
            configs = configs[:6] if dtype == "fp16" else configs[:3]
        for b, h, kvh, s, d in configs:
            for causal in (True, False):
                for phase in ("fwd", "fwdbwd"):
                    cases.append(_case("sdpa", phase, dtype, batch=b, heads=h, kv_heads=kvh, seq=s,
                                       head_dim=d, causal=causal))
    return cases


CONV_GPU = [  # (batch, cin, hw, cout, kernel, stride): ResNet-50 and VGG-16 layers
    (64, 64, 56, 64, 1, 1), (64, 64, 56, 64, 3, 1), (64, 256, 56, 64, 1, 1), (64, 128, 28, 128, 3, 1),
    (64, 256, 14, 256, 3, 1), (64, 512, 7, 512, 3, 1), (64, 3, 224, 64, 7, 2), (128, 64, 56, 64, 3, 1),
    (128, 1024, 14, 256, 1, 1), (256, 512, 28, 128, 1, 1), (32, 64, 224, 64, 3, 1),
    (32, 128, 112, 128, 3, 1), (32, 256, 56, 256, 3, 1), (32, 512, 28, 512, 3, 1),
]
CONV_CPU = [(4, 64, 56, 64, 1, 1), (4, 64, 56, 64, 3, 1), (4, 128, 28, 128, 3, 1), (4, 256, 14, 256, 3, 1),
            (4, 3, 112, 64, 7, 2)]
CONV_QUICK = [(2, 8, 16, 8, 3, 1), (2, 8, 16, 16, 1, 1), (2, 16, 8, 16, 3, 1), (4, 8, 16, 8, 3, 1)]


def conv_cases(req: Request) -> list[dict]:
    configs = CONV_QUICK if req.quick else CONV_GPU if req.gpu else CONV_CPU
    dtypes = _matmul_dtypes(req)[:1]
    return [_case("conv2d", phase, dtype, batch=b, cin=ci, hw=hw, cout=co, kernel=k, stride=s)
            for dtype in dtypes for b, ci, hw, co, k, s in configs for phase in ("fwd", "fwdbwd")]


# (batch, cin, hw, cout, kernel, stride, groups): the layer shapes of the CNN presets, each pass alone
CNN_CONV_GPU = [
    # ResNet-50 (dense; stride 2 on the 3x3 and the projection shortcut) and the stem
    (64, 64, 56, 256, 1, 1, 1), (64, 256, 56, 128, 1, 1, 1), (64, 128, 56, 128, 3, 2, 1), (64, 256, 56, 512, 1, 2, 1),
    (64, 256, 28, 256, 3, 2, 1), (64, 512, 28, 1024, 1, 2, 1), (64, 1024, 14, 2048, 1, 2, 1),
    (64, 512, 14, 512, 3, 2, 1), (64, 2048, 7, 512, 1, 1, 1), (64, 512, 7, 2048, 1, 1, 1), (64, 3, 224, 64, 7, 2, 1),
    (128, 256, 14, 256, 3, 1, 1), (128, 128, 28, 512, 1, 1, 1),
    # ResNeXt-50 32x4d (32 groups)
    (64, 128, 56, 128, 3, 1, 32), (64, 256, 56, 256, 3, 2, 32), (64, 256, 28, 256, 3, 1, 32),
    (64, 512, 28, 512, 3, 2, 32), (64, 512, 14, 512, 3, 1, 32), (64, 1024, 14, 1024, 3, 2, 32),
    (64, 1024, 7, 1024, 3, 1, 32),
    # EfficientNet-B0: stem, 1x1 expand/project, depthwise 3x3 and 5x5 at strides 1 and 2
    (64, 3, 224, 32, 3, 2, 1), (64, 16, 112, 96, 1, 1, 1), (64, 144, 56, 24, 1, 1, 1), (64, 240, 28, 40, 1, 1, 1),
    (64, 480, 14, 80, 1, 1, 1), (64, 1152, 7, 192, 1, 1, 1), (64, 320, 7, 1280, 1, 1, 1),
    (64, 32, 112, 32, 3, 1, 32), (64, 96, 112, 96, 3, 2, 96), (64, 144, 56, 144, 3, 1, 144),
    (64, 144, 56, 144, 5, 2, 144), (64, 240, 28, 240, 5, 1, 240), (64, 240, 28, 240, 3, 2, 240),
    (64, 480, 14, 480, 3, 1, 480), (64, 480, 14, 480, 5, 1, 480), (64, 672, 14, 672, 5, 2, 672),
    (64, 1152, 7, 1152, 5, 1, 1152), (64, 1152, 7, 1152, 3, 1, 1152), (128, 384, 14, 384, 7, 1, 384),
    (128, 144, 56, 144, 3, 1, 144), (128, 480, 14, 480, 5, 1, 480),
    # EfficientNet-B4 at 320 px (torchvision widths x1.4): its strided depthwise layers, so that every
    # depthwise class (3x3 and 5x5, strides 1 and 2) has the rows of a fit of its own
    (32, 144, 160, 144, 3, 2, 144), (64, 336, 40, 336, 3, 2, 336), (32, 192, 80, 192, 5, 2, 192),
    (64, 960, 20, 960, 5, 2, 960), (64, 672, 20, 672, 5, 1, 672),
    # Inception-v3 (square kernels): stem, 1x1, 3x3, 5x5 branches, stride-2 reductions
    (64, 3, 299, 32, 3, 2, 1), (64, 32, 149, 64, 3, 1, 1), (64, 192, 35, 64, 1, 1, 1), (64, 48, 35, 64, 5, 1, 1),
    (64, 64, 35, 96, 3, 1, 1), (64, 288, 35, 384, 3, 2, 1), (64, 768, 17, 192, 1, 1, 1),
    (64, 192, 17, 320, 3, 2, 1), (64, 1280, 8, 448, 1, 1, 1), (64, 128, 5, 768, 5, 1, 1),
    # CIFAR ResNets at batch 128 (tensorflow/models resnet_cifar, T2T resnet_cifar_32, pre-activation
    # ResNet-164): 16-64 channels on 32x32 to 8x8 maps, narrower than every row above past the stems,
    # so that a Winograd class measured at 64+ channels is not the only evidence for them (docs/cnn.md)
    (128, 3, 32, 16, 3, 1, 1), (128, 16, 32, 16, 3, 1, 1), (128, 16, 32, 32, 3, 2, 1), (128, 32, 16, 32, 3, 1, 1),
    (128, 32, 16, 64, 3, 2, 1), (128, 64, 8, 64, 3, 1, 1), (128, 64, 32, 16, 1, 1, 1), (128, 16, 32, 64, 1, 1, 1),
    (128, 128, 16, 32, 1, 1, 1), (128, 32, 16, 128, 1, 1, 1), (128, 256, 8, 64, 1, 1, 1),
    (128, 64, 8, 256, 1, 1, 1), (128, 64, 32, 128, 1, 2, 1),
]
CNN_CONV_CPU = [(2, 32, 28, 32, 3, 1, 1), (2, 32, 28, 64, 1, 2, 1), (2, 64, 14, 64, 3, 1, 32),
                (2, 64, 28, 64, 3, 1, 64), (2, 64, 28, 64, 5, 2, 64), (4, 3, 56, 16, 7, 2, 1)]
CNN_CONV_QUICK = [(1, 8, 8, 8, 3, 2, 1), (1, 8, 8, 8, 3, 1, 8)]  # one dense, one depthwise: the code paths only
# (batch, channels, hw): activations the CNN layers run on
CNN_LAYER_GPU = [(64, 64, 112), (64, 256, 56), (64, 512, 28), (64, 1024, 14), (64, 2048, 7), (64, 96, 112),
                 (64, 144, 56), (64, 480, 14), (64, 1152, 7), (128, 256, 56), (64, 288, 35),
                 # CIFAR ResNets at batch 128: batch norm over few channels (cuDNN spreads it over channels)
                 (128, 16, 32), (128, 32, 16), (128, 64, 8), (128, 64, 32), (128, 256, 8)]
CNN_LAYER_CPU = [(2, 32, 28), (2, 64, 28), (4, 64, 14), (2, 128, 14)]
CNN_LAYER_QUICK = [(2, 8, 8)]
CNN_LAYERS = ("batchnorm", "relu", "silu", "sigmoid", "maxpool", "avgpool", "se_pool", "se_scale")
FORWARD_ONLY = ("se_pool", "se_scale")  # a backward that is another class's kernel (bytes, or se_scale itself)


def cnn_cases(req: Request) -> list[dict]:
    """Convolution passes (fwd, dgrad, wgrad) of the CNN presets' layers in every requested precision
    (channels-last), and batch norm, activations and pooling forward and backward in the autocast one."""
    convs = CNN_CONV_QUICK if req.quick else CNN_CONV_GPU if req.gpu else CNN_CONV_CPU
    dtypes = [d for d in req.dtypes if d in ("fp32", "tf32", "bf16", "fp16")]
    cases = [_case("conv2d", phase, dtype, batch=b, cin=ci, hw=hw, cout=co, kernel=k, stride=s, groups=g)
             for dtype in dtypes for b, ci, hw, co, k, s, g in convs for phase in ("fwd", "dgrad", "wgrad")]
    layers = CNN_LAYER_QUICK if req.quick else CNN_LAYER_GPU if req.gpu else CNN_LAYER_CPU
    act = _act_dtype(req)
    for op in CNN_LAYERS:
        phases = ("fwd",) if op in FORWARD_ONLY else ("fwd", "bwd")
        cases += [_case(op, p, act, batch=b, cin=c, hw=hw) for b, c, hw in layers for p in phases]
    return cases


def layer_cases(req: Request) -> list[dict]:
    """Norms, activations, residual add, rope, cross-entropy, casts, embedding."""
    if req.quick:
        # the fitter needs >= 4 points per class
        rows = [(64, 128), (128, 256), (256, 256), (256, 512)]
        ropes = [(1, 2, 64, 32), (1, 4, 64, 32), (2, 4, 64, 32), (2, 4, 128, 32)]
        ces = [(64, 1000), (128, 1000), (128, 2000), (256, 2000)]
        embs = [(128, 1000, 64), (256, 1000, 64), (256, 2000, 128), (512, 2000, 128)]
    elif req.gpu:
        rows = [(t, h) for t in (2048, 8192, 32768) for h in (768, 1024, 2048, 4096, 8192)]
        ropes = [(4, 32, 2048, 64), (1, 32, 4096, 128), (4, 16, 2048, 128), (8, 12, 1024, 64),
                 (2, 8, 1024, 64), (2, 32, 2048, 128), (8, 32, 2048, 128), (16, 12, 1024, 64)]
        ces = [(t, v) for t in (2048, 8192, 16384, 32768) for v in (32000, 50257, 50304, 128256, 256000)]
        embs = [(8192, 50304, 768), (8192, 32000, 2048), (16384, 128256, 4096), (32768, 50304, 1024)]
    else:
        rows = [(t, h) for t in (256, 1024, 4096) for h in (256, 768, 1024)]
        ropes = [(1, 8, 512, 64), (2, 12, 256, 64), (1, 4, 256, 64), (2, 8, 512, 64)]
        ces = [(t, v) for t in (256, 1024) for v in (8000, 32000)]
        embs = [(1024, 32000, 256), (2048, 8000, 768), (512, 8000, 256), (2048, 32000, 512)]
    act = _act_dtype(req)
    both = ("fwd", "fwdbwd")
    cases = []
    for t, h in rows:  # norms run in fp32 under autocast; activations in the autocast precision
        cases += [_case(op, p, "fp32", tokens=t, hidden=h) for op in ("layernorm", "rmsnorm") for p in both]
        cases += [_case("softmax", p, d, tokens=t, hidden=h) for d in dict.fromkeys(("fp32", act)) for p in both]
        cases += [_case(op, p, act, tokens=t, hidden=h) for op in ("gelu", "swiglu") for p in both]
        cases.append(_case("residual_add", "fwd", "fp32", tokens=t, hidden=h))
    cases += [_case("rope", p, act, batch=b, heads=h, seq=s, head_dim=d) for b, h, s, d in ropes for p in both]
    for t, v in ces:  # fp32 logits: the bf16 -> fp32 cast, then cross-entropy
        cases.append(_case("cast_bf16_to_fp32", "fwd", "fp32", tokens=t, vocab=v))
        cases += [_case("cross_entropy", p, "fp32", tokens=t, vocab=v) for p in both]
    cases += [_case("embedding", p, "fp32", tokens=t, vocab=v, hidden=h) for t, v, h in embs for p in both]
    return cases


def geometric(lo: int, hi: int, step: int = 2) -> list[int]:
    """lo, lo*step, lo*step**2, ... up to hi (powers of two for sizes)."""
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= step
    return out


def memory_cases(req: Request) -> list[dict]:
    """copy/add/scale/sum over fp32 tensors; fp32 <-> bf16 casts; host <-> device copies."""
    sizes = ([1 << 10, 1 << 14, 1 << 18, 1 << 22] if req.quick else
             geometric(1 << 10, 1 << 32) if req.gpu else geometric(1 << 10, 1 << 28, 4))
    from calibration.ops import MEM_OPERANDS
    cases = [_case(op, "fwd", "fp32", bytes=s * k) for s in sizes for op, k in MEM_OPERANDS.items()]
    casts = [1 << 12, 1 << 14, 1 << 16, 1 << 18] if req.quick else geometric(1 << 20, 1 << 32, 4) if req.gpu else geometric(1 << 16, 1 << 26, 4)
    for fp32_bytes in casts:  # 'bytes' = 6 per element: 4 read + 2 written (or 2 + 4)
        cases += [_case(op, "fwd", "fp32", bytes=fp32_bytes // 4 * 6)
                  for op in ("cast_fp32_to_bf16", "cast_bf16_to_fp32")]
    if req.gpu:
        for s in ([1 << 20] if req.quick else [1 << 20, 1 << 24, 1 << 28, 1 << 30]):
            cases += [_case(op, "fwd", pin, bytes=s) for op in ("h2d", "d2h") for pin in ("pinned", "pageable")]
    return cases


def optimizer_cases(req: Request) -> list[dict]:
    counts = [1_000, 10_000, 30_000, 100_000] if req.quick else [10**5, 10**6, 10**7, 10**8, 10**9] if req.gpu else [10**4, 10**5, 10**6, 10**7]
    return [_case(op, "step", "fp32", params=p, fused=f)
            for op in ("adamw", "sgd") for p in counts for f in (True, False)]


def launch_cases(req: Request) -> list[dict]:
    return [_case("launch_add", "fwd", "fp32"), _case("launch_add", "fwdbwd", "fp32"),
            _case("launch_mm", "fwd", _act_dtype(req) if req.gpu else "fp32", m=16, n=16, k=16)]


def step_cases(req: Request) -> list[dict]:
    """Whole steps of tiny transformers (1..8 blocks of width 64): the per-kernel cost a step adds;
    four wider ones whose arithmetic is not negligible: how much slower kernels run inside a step
    than in a loop over one op (on a CPU, operands no longer in cache)."""
    dtype = _act_dtype(req)
    layers = (1, 2, 4) if req.quick else (1, 2, 4, 8)
    narrow = [_case("train_step", "step", dtype, layers=n, hidden=64, heads=2, seq=16, vocab=256, batch=1)
              for n in layers]
    wide = [_case("train_step", "step", dtype, layers=2, hidden=h, heads=4, seq=s, vocab=512, batch=2)
            for h, s in ((160, 48), (192, 64), (224, 96), (256, 32))]
    return narrow + wide


def _graph_ok(case: dict) -> bool:
    if case["phase"] == "fwdbwd":  # forward + backward GPU time, without autograd's CPU cost per call
        return case["op"] in GRAPH_FWDBWD_OPS and (case.get("bytes") or 0) <= GRAPH_MAX_BYTES
    if case["phase"] != "fwd" or case["op"] not in GRAPH_OPS:
        return False
    if case["op"] == "gemm":
        return case["m"] * case["n"] * case["k"] <= GRAPH_MAX_GEMM_MNK and case["dtype"] != "fp8"
    return (case.get("bytes") or 0) <= GRAPH_MAX_BYTES


def cases(req: Request) -> list[dict]:
    """Every case to measure, with its timing and 'bytes', in the order they run."""
    planned = (launch_cases(req) + gemm_cases(req) + sdpa_cases(req) + layer_cases(req)
               + memory_cases(req) + optimizer_cases(req) + conv_cases(req) + cnn_cases(req) + step_cases(req))
    out, seen = [], set()
    for case in planned:
        if tuple(sorted(case.items())) in seen:  # the same shape from two families (e.g. square and
            continue                               # transformer GEMMs) is measured once
        seen.add(tuple(sorted(case.items())))
        if req.ops is not None and case["op"] not in req.ops:
            continue
        if 4 * input_bytes(case) > req.mem_limit_bytes:  # inputs, outputs, gradients, workspace
            continue
        case["bytes"] = moved_bytes(case)
        for timing in req.timings:
            if timing == "eager" or (timing == "graph" and req.gpu and _graph_ok(case)):
                out.append({**case, "timing": timing})
    return out
