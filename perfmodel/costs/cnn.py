"""Time of CNN kernels by class: convolutions by kind, kernel and stride; batch norm, activations, pooling.

A convolution pass (forward, data gradient or weight gradient) is classed by its
kind -- ``dense`` (groups 1), ``grouped`` (1 < groups, C/g > 1), ``depthwise``
(C/g = 1) -- its kernel (R×S) and its stride: ``conv.dense-k3-s1``,
``conv.depthwise-k5-s2``. Each class is priced as a fitted correction of a
reference time the profile already knows (form ``scaled_ref``: t = t0 + c · t_ref):

- dense and grouped: t_ref = the implicit GEMM (Chetlur et al. 2014, cuDNN §3:
  M = N·P·Q, N = K, K = C/g·R·S; shapes in :func:`perfmodel.workload.graph.conv_gemm_shapes`)
  on the profile's ``gemm:<dtype>`` fit;
- depthwise, and the bandwidth-bound layers (``batchnorm``, ``relu``, ``silu``, ``sigmoid``,
  ``maxpool``, ``avgpool``, ``se_pool``, ``se_scale``): t_ref = the bytes the kernel moves at the
  profile's measured copy-bandwidth curve (``copy:fp32:fwd``; roofline, Williams et al. 2009).

Entries are looked up most specific first: ``conv.<kind>-k<R>x<S>-s<stride>:<dtype>:<pass>``,
the same class in another dtype (c is a ratio to a reference priced in the kernel's own
dtype), then a pooled entry, then c = 1: an unmeasured class runs at exactly its reference
time, and :func:`unmeasured` names it so a prediction says so. The pooled entry depends on
whether cuDNN could run the shape by Winograd (:func:`winograd_eligible`): an eligible one takes
the kind's entry ``conv.<kind>:<dtype>:<pass>`` (pooled over every measured shape, mostly 3x3);
an ineligible dense one (1x1, 1x7, 7x1, 3x1, 1x3 at stride 1) takes
``conv.dense-gemm:<dtype>:<pass>``, pooled over the measured ineligible stride-1 shapes only, so no
Winograd saving measured on 3x3 rows is lent to a shape whose algorithms are all GEMMs; a strided
one (3x3 or 7x7 stride 2, 1x1 stride 2) takes ``conv.dense-gemm-strided:<dtype>:<pass>``, pooled over
the measured strided shapes, falling back to the stride-1 pool where a profile has none. A strided
data gradient writes a larger input than its GEMM's rows suggest: DeepBench's 1x1 stride-2 rows take
2.4x (P100), 2.2x (V100) and 1.9x (T4) their implicit GEMM in fp32, against 1.15x, 0.98x and 0.84x at
stride 1 (docs/cnn.md).
"""

from __future__ import annotations

import functools

import numpy as np

from perfmodel.core.algebra import to_sympy
from perfmodel.core.errors import PerfModelError, UnsupportedError
from perfmodel.core.units import DTYPE_BYTES
from perfmodel.forms.registry import get_form
from perfmodel.hardware import load_gpu
from perfmodel.workload.graph import CNN_MEM_CLASSES, conv_gemm_shapes, conv_kind
from perfmodel.workload.ops import Kernel

CONV_KINDS = ("dense", "grouped", "depthwise")
CONV_PASSES = ("fwd", "dgrad", "wgrad")
MEM_CLASSES = CNN_MEM_CLASSES
CNN_CLASSES = frozenset(("conv",) + MEM_CLASSES)
COPY_KEY = "copy:fp32:fwd"  # the bandwidth curve: x = bytes / 8 (a copy reads and writes 4 bytes each)
BANDWIDTH_KINDS = ("depthwise",)
# cuDNN's Winograd algorithms (cuDNN Developer Guide, cudnnConvolutionForward / BackwardData /
# BackwardFilter support tables, v6-v8): WINOGRAD needs a 3x3 filter, WINOGRAD_NONFUSED 3x3 or 5x5,
# both stride 1; every other dense shape runs a GEMM-family algorithm (implicit, precomputed or explicit GEMM)
WINOGRAD_FILTERS = ((3, 3), (5, 5))
GEMM_ONLY = "gemm"  # the pooled label of dense shapes no Winograd algorithm accepts: conv.dense-gemm
STRIDED = "strided"  # ... and of those with a stride above 1: conv.dense-gemm-strided
CONV_SIZE = ("m", "n", "k", "x", "kh", "kw", "stride", "groups", "cin")  # what a 'conv' kernel carries
TILE = 128  # the output tile of a SIMT GEMM threadblock (output_fill)
# A stem's few input channels (RGB) are padded to 8 (workload.graph.conv_gemm_shapes): a class's input-channel
# range counts its rows of at least this many, and a stem is judged by its output channels alone
STEM_CHANNELS = 8


def conv_label(kh, kw, stride, groups, cin) -> str:
    """Class label of a convolution, e.g. ``dense-k3x3-s1``, ``depthwise-k5x5-s2``."""
    return f"{conv_kind(groups, cin)}-k{int(kh)}x{int(kw)}-s{int(stride)}"


def conv_pass_kernel(name: str, phase: str, part: str, batch, cin, cout, hw, kernel, stride=1, *, groups=1,
                     out_hw=None, dtype="bf16", count=1) -> Kernel:
    """The ``conv`` kernel of one pass (``fwd``, ``dgrad`` or ``wgrad``) of a square convolution."""
    out_hw = np.floor_divide(np.add(hw, 2 * np.floor_divide(kernel, 2)) - kernel, stride) + 1 if out_hw is None \
        else out_hw
    ksz, out_sp = np.square(kernel), np.square(out_hw)
    m, n, k = conv_gemm_shapes(batch, cin, cout, np.square(hw), out_sp, ksz, groups)[part]
    x = np.multiply(batch, np.multiply(cin, np.square(hw))) + np.multiply(batch, np.multiply(cout, out_sp)) \
        + np.multiply(cout, np.multiply(np.divide(cin, groups), ksz))
    size = {"m": m, "n": n, "k": k, "x": x, "kh": kernel, "kw": kernel, "stride": stride, "groups": groups,
            "cin": cin}
    return Kernel(name, "conv", phase, size, count, 2.0 * np.multiply(np.multiply(m, n), k), part, dtype)


def winograd_eligible(kh, kw, stride) -> bool:
    """True when one of cuDNN's Winograd algorithms accepts the filter: 3x3 or 5x5 at stride 1."""
    return (int(kh), int(kw)) in WINOGRAD_FILTERS and int(stride) == 1


def pooled_label(kh, kw, stride, groups, cin) -> str:
    """The pooled class a convolution falls back to: its kind (``dense``, ``grouped``, ``depthwise``), or
    ``dense-gemm`` for a dense shape no Winograd algorithm runs (see :func:`winograd_eligible`), and
    ``dense-gemm-strided`` for such a shape with a stride above 1."""
    kind = conv_kind(groups, cin)
    if kind == "dense" and not winograd_eligible(kh, kw, stride):
        return f"{kind}-{GEMM_ONLY}" + (f"-{STRIDED}" if int(stride) > 1 else "")
    return kind


def _scalar(v) -> float:
    return float(np.ravel(np.asarray(v, dtype=float))[0])


def kernel_label(kern: Kernel) -> str:
    """The profile class of a CNN kernel (without dtype and pass)."""
    if kern.cls != "conv":
        return kern.cls
    s = kern.size
    missing = [k for k in CONV_SIZE if k not in s]
    if missing:
        raise UnsupportedError(f"convolution kernel {kern.name!r} lacks sizes {missing} (a 'conv' op needs "
                               f"{', '.join(CONV_SIZE)}; trace it again with perfmodel.from_torch)")
    return "conv." + conv_label(_scalar(s["kh"]), _scalar(s["kw"]), _scalar(s["stride"]), _scalar(s["groups"]),
                                _scalar(s["cin"]))


def conv_channels(kern: Kernel) -> tuple[float, float]:
    """(input, output) channels of a convolution pass: ``cin`` as traced, the output channels read back from
    its implicit GEMM (forward n, data-gradient k·groups, weight-gradient m; padded to 8 as those shapes are)."""
    s = kern.size
    if kern.variant == "dgrad":
        return _scalar(s["cin"]), _scalar(s["k"]) * _scalar(s["groups"])
    return _scalar(s["cin"]), _scalar(s["m"] if kern.variant == "wgrad" else s["n"])


def within_channels(entry: dict, kern: Kernel) -> bool:
    """Whether ``kern`` is as wide as the rows ``entry`` was fitted on (its ``channels`` record, kept on the
    classes whose rows cuDNN may run by Winograd: the fewest output channels, and the fewest input channels
    among rows of at least ``STEM_CHANNELS``); an entry without the record always applies."""
    bounds = entry.get("channels") if kern.cls == "conv" else None
    if not bounds:
        return True
    cin, cout = conv_channels(kern)
    if cout < bounds.get("cout_min", 0.0):
        return False
    return cin < STEM_CHANNELS or cin >= (bounds.get("cin_min") or 0.0)


def class_entry(profile, kern: Kernel):
    """(entry, key) of the most specific class fitted for ``kern``; (None, None) when none is.

    A Winograd saving is lent only as wide as it was measured (:func:`within_channels`): a convolution
    narrower than the rows of every Winograd class that would price it (a CIFAR network's 16 or 32 channels
    against DeepBench's 64 and up) takes the pooled GEMM-family entry ``conv.dense-gemm``, what cuDNN's
    implicit- and precomputed-GEMM kernels measured against the GEMM fit, as a shape Winograd cannot run does."""
    entry, key, _ = _class_match(profile, kern)
    return entry, key


def _class_match(profile, kern: Kernel):
    """(entry, key, narrower) of :func:`class_entry`; ``narrower``: a fitted class was passed over because
    ``kern`` is narrower than its rows."""
    label = kernel_label(kern)
    candidates = [f"{label}:{kern.dtype}:{kern.variant}"]
    candidates += [k for k in sorted(profile.compute) if k.startswith(label + ":") and k.endswith(":" + kern.variant)]
    if kern.cls == "conv":
        s = kern.size
        pooled = "conv." + pooled_label(*(_scalar(s[k]) for k in ("kh", "kw", "stride", "groups", "cin")))
        pools = [pooled, pooled.removesuffix(f"-{STRIDED}")] if pooled.endswith(STRIDED) else [pooled]
        for pool in pools:  # a profile without a strided pool prices strided shapes by the stride-1 one
            candidates.append(f"{pool}:{kern.dtype}:{kern.variant}")
            candidates += [k for k in sorted(profile.compute)
                           if k.startswith(pool + ":") and k.endswith(":" + kern.variant)]
    found = [key for key in candidates if key in profile.compute]
    wide = next((key for key in found if within_channels(profile.compute[key], kern)), None)
    if wide is not None or not found:
        return (profile.compute[wide] if wide else None), wide, False
    gemm = f"conv.{conv_kind(_scalar(kern.size['groups']), _scalar(kern.size['cin']))}-{GEMM_ONLY}"
    key = next((k for k in [f"{gemm}:{kern.dtype}:{kern.variant}"] + sorted(profile.compute)
                if k in profile.compute and k.startswith(gemm + ":") and k.endswith(":" + kern.variant)), None)
    return (profile.compute[key] if key else None), key, True


def _evaluate(entry: dict, symbolic: bool, **variables):
    params = {**entry["params"], "t_cpu": 0.0}
    form = get_form(entry["form"])
    if symbolic:
        return form.expression(params, **{k: to_sympy(v) for k, v in variables.items()})
    return form.evaluate(params, **variables)


def moved_bytes(kern: Kernel):
    """Bytes a bandwidth-bound CNN kernel reads and writes (a conv pass: input + weight + output)."""
    if kern.cls == "conv":
        return np.multiply(kern.size["x"], DTYPE_BYTES.get(kern.dtype, 4))
    return kern.size["bytes"]


def reference_seconds(profile, kern: Kernel, symbolic: bool = False):
    """(t_ref, the entry that priced it): implicit GEMM for dense/grouped convs, else bytes at copy bandwidth."""
    if kern.cls == "conv" and kernel_label(kern).split("-")[0].removeprefix("conv.") not in BANDWIDTH_KINDS:
        entry = profile.entry(f"gemm:{kern.dtype}")
        return _evaluate(entry, symbolic, m=kern.size["m"], n=kern.size["n"], k=kern.size["k"]), entry
    entry, factor = profile.mem_entry("copy", "fp32", "fwd")
    x = np.multiply(moved_bytes(kern), factor / 8.0) if not symbolic else to_sympy(moved_bytes(kern)) * factor / 8
    return _evaluate(entry, symbolic, x=x), entry


@functools.cache
def _sm_count(gpu: str) -> float | None:
    try:
        return float(load_gpu(gpu).sm_count)
    except PerfModelError:  # a profile named after no catalog GPU (a CPU host, a custom part)
        return None


def output_fill(profile, kern: Kernel, symbolic: bool = False):
    """How far a convolution pass's implicit GEMM falls short of one output tile per SM: max(1, SMs / tiles),
    tiles = ⌈m / 128⌉ · ⌈n / 128⌉ (a SIMT GEMM's 128x128 threadblock tile: CUTLASS 2.x
    ``include/cutlass/gemm/device/default_gemm_configuration.h``, ``DefaultGemmConfiguration<OpClassSimt>``);
    1 on a GPU the catalog does not know."""
    sms = _sm_count(profile.gpu)
    m, n = kern.size["m"], kern.size["n"]
    if sms is None:
        return 1.0
    if symbolic:
        import sympy as sp

        return sp.Max(1, sms / (sp.ceiling(to_sympy(m) / TILE) * sp.ceiling(to_sympy(n) / TILE)))
    return np.maximum(1.0, sms / (np.ceil(np.divide(m, TILE)) * np.ceil(np.divide(n, TILE))))


def cnn_kernel_time(profile, kern: Kernel, symbolic: bool = False):
    """(GPU seconds, the entry whose CPU floor applies) of one launch of a CNN kernel."""
    t_ref, ref_entry = reference_seconds(profile, kern, symbolic)
    entry, _ = class_entry(profile, kern)
    if entry is None:
        return t_ref, ref_entry
    fill = {"fill": output_fill(profile, kern, symbolic)} if "fill" in get_form(entry["form"]).variables else {}
    # the CPU floor stays the reference's: a class fitted on GPU-timed rows (DeepBench) has no CPU term
    return _evaluate(entry, symbolic, t_ref=t_ref, **fill), ref_entry


def unmeasured(profile, kernels) -> list[str]:
    """CNN classes among ``kernels`` that ``profile`` has no fitted entry for (priced at c = 1)."""
    out = set()
    for kern in kernels:
        if kern.cls in CNN_CLASSES and class_entry(profile, kern)[0] is None:
            out.add(f"{kernel_label(kern)}:{kern.dtype}:{kern.variant}")
    return sorted(out)


def cnn_caveats(model, profile, precision: str) -> tuple[str, ...]:
    """One sentence naming the CNN classes of ``model`` that ``profile`` prices unmeasured (c = 1);
    empty for workloads without CNN kernels."""
    if not any(getattr(op, "cls", "") in CNN_CLASSES for op in getattr(model, "ops", ())):
        return ()
    fwd, bwd = model.layer_kernels(1, precision=precision)
    missing, narrow = unmeasured(profile, fwd + bwd), narrower_than_measured(profile, fwd + bwd)
    out = ()
    if missing:
        out += (f"{len(missing)} CNN kernel classes not measured on {profile.gpu}, priced at their reference "
                f"time (implicit GEMM, or bytes at copy bandwidth): {', '.join(missing)}",)
    if narrow:
        out += (f"{len(narrow)} convolution classes run here on fewer channels than any Winograd row measured on "
                f"{profile.gpu}: priced as cuDNN's GEMM-family kernels measured, without a Winograd saving: "
                f"{', '.join(narrow)}",)
    return out


def narrower_than_measured(profile, kernels) -> list[str]:
    """Convolution classes among ``kernels`` narrower than every fitted Winograd entry that would price them
    (:func:`class_entry` took the GEMM-family pool, or c = 1)."""
    return sorted({f"{kernel_label(kern)}:{kern.dtype}:{kern.variant}" for kern in kernels
                   if kern.cls == "conv" and _class_match(profile, kern)[2]})
