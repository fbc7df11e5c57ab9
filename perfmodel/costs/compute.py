"""Time of compute kernels from a Profile: GPU time and eager CPU issue time.

Each kernel's GPU time comes from its class's fitted closed form with the
eager CPU floor removed; its CPU time is that floor (or the host's per-kernel
launch cost). A phase (forward or backward) then takes max(Σ GPU, Σ CPU): the
CPU runs ahead of the GPU through the launch queue, so whichever side is
slower sets the pace (the eager-mode launch-bound regime of small models).

The same functions price sympy expressions (``symbolic=True``: a kernel's GPU
time is its form's sympy twin, sums and maxima are sympy's), so a symbolic step
time (``perfmodel.analysis.symbolic``) applies the very host terms ``predict`` does.
"""

from __future__ import annotations

import numpy as np

from perfmodel.core.algebra import maximum, to_sympy
from perfmodel.core.errors import PerfModelError, UnsupportedError
from perfmodel.costs.cnn import CNN_CLASSES, cnn_kernel_time
from perfmodel.costs.optimizers import OPTIMIZER_BYTES
from perfmodel.core.memo import PLAIN_TYPES, IdentityMemo, scalar
from perfmodel.costs.host import DEFAULT_CPU_PER_KERNEL_S, HostCosts  # noqa: F401 (re-exported)
from perfmodel.forms.registry import get_form
from perfmodel.profiles.profile import Profile
from perfmodel.workload.ops import Kernel, aligned_view, mem as mem_kernel

# attention kernels priced only on the GPUs whose curves are published (fit/published.py), not by the
# profile's own attention: the message says where
ONLY_PUBLISHED = {
    "fa3": "attention='flash3' (FlashAttention-3) runs on Hopper GPUs only (flash-attn hopper/) and",
    "fa1": "attention='flash1' (FlashAttention-1) is published for the A100 80GB and the H100 SXM5 (also priced "
           "for the A100 40GB and the H200) and",
    "triton": "attention='triton' (flash-attn's Triton kernel) is published for the A100 80GB only (also priced for "
              "the A100 40GB) and",
}
# the nearest kernel with a curve where the asked one has none: on the A100, where both are published (Dao 2023,
# Fig. 4), the Triton kernel's forward + backward runs within 2-6% of FlashAttention-1's (docs/stacks.md)
NEAREST_PUBLISHED = {"triton": ("fa1", "attention='flash1' (FlashAttention-1), which the Triton kernel ran within "
                                       "2-6% of on the A100, is priced on this GPU")}


def _gpu(entry: dict, symbolic: bool = False, **variables):
    params = _ZEROED.get(entry, "t_cpu")
    if params is None:  # the entry's parameters without the eager CPU floor, built once per entry
        params = {**entry["params"], "t_cpu": 0.0}
        _ZEROED.put(entry, "t_cpu", params)
    if symbolic:
        return get_form(entry["form"]).expression(params, **{k: to_sympy(v) for k, v in variables.items()})
    return get_form(entry["form"]).evaluate(params, **variables)


def _cpu(profile: Profile, entry: dict) -> float:
    floor = entry["params"].get("t_cpu", 0.0)
    return floor if floor > 0 else HostCosts.of(profile).cpu_per_kernel_s


def _number(value, symbolic: bool):
    """``value`` as pricing multiplies it: a float array, or a sympy number."""
    return to_sympy(value) if symbolic else np.asarray(value, float)


def gemm_key(profile: Profile, dtype: str) -> str:
    key = f"gemm:{dtype}"
    if not profile.has(key):
        known = sorted(k.split(":")[1] for k in profile.compute if k.startswith("gemm:"))
        raise UnsupportedError(f"profile {profile.name!r} has no {dtype} GEMM model "
                               f"(the GPU lacks it or it was not calibrated; available: {', '.join(known)})")
    return key


def kernel_time(profile: Profile, kern: Kernel, *, symbolic: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(GPU seconds, CPU seconds) of one launch of ``kern`` (the GPU seconds a sympy expression
    when ``symbolic``).

    On a CPU host whose profile was measured alone, ``host["side_by_side_factor"]``
    scales both: a step's time with the host's other training processes computing
    at once over its time alone (measured, perfmodel/validate/host.py).
    """
    return _launch_time(profile, kern, HostCosts.of(profile).side_by_side_factor, symbolic)


def _launch_time(profile: Profile, kern: Kernel, shared: float, symbolic: bool = False):
    """``kernel_time`` with the host's ``side_by_side_factor`` given (a phase reads it once)."""
    key, memo = (None, None) if symbolic else (_kernel_key(kern), _KERNEL_MEMO)
    if key is None and not symbolic:  # arrays: a search prices the same sizes under each recompute policy
        key, memo = _array_kernel_key(kern), _ARRAY_KERNEL_MEMO
    if key is None:
        gpu, cpu = _kernel_time(profile, kern, symbolic)
    else:  # one launch of the same kernel recurs (recomputed forwards, the tensor-parallel GEMM times)
        hit = memo.get(profile, key)
        if hit is None:
            hit = _kernel_time(profile, kern)
            if memo is _ARRAY_KERNEL_MEMO:  # shared by the calls that hit it: read-only
                hit = tuple(_read_only(x) for x in hit)
            memo.put(profile, key, hit)
        gpu, cpu = hit
    return (gpu * shared, cpu * shared) if shared != 1.0 else (gpu, cpu)


_KERNEL_MEMO = IdentityMemo(8192)
_ZEROED = IdentityMemo(1024)  # entry -> its parameters with t_cpu = 0 (never handed out: not changed)
# a search's kernels: Llama-3-70B on 512 H100 keeps 583 (3.4 MB, size arrays of up to 1,494 rows)
_ARRAY_KERNEL_MEMO = IdentityMemo(2048)
ARRAY_KERNEL_MAX = 2048  # elements of a size array beyond which a kernel is priced without the memo


def _array_kernel_key(kern: Kernel):
    """A memo key of a launch whose sizes are numeric arrays, by their bytes (None for large or
    non-numeric sizes, and for the CNN classes, whose price also reads the kernel's name)."""
    if kern.cls in CNN_CLASSES:
        return None
    sizes = []
    for name, v in kern.size.items():
        a = np.asarray(v)
        if a.dtype.kind not in "biuf" or a.size > ARRAY_KERNEL_MAX:
            return None
        sizes.append((name, a.dtype.str, a.shape, a.tobytes()))
    return kern.cls, kern.dtype, kern.variant, tuple(sizes)


def _read_only(x):
    if isinstance(x, np.ndarray):
        x.setflags(write=False)
    return x


def _kernel_key(kern: Kernel):
    """A memo key of what one launch's price reads (class, dtype, variant, sizes), or None when a
    size is an array (a search) or a symbol."""
    sizes = []
    for name, v in kern.size.items():
        v = v if type(v) in PLAIN_TYPES else scalar(v)
        if v is None:
            return None
        sizes.append((name, v))
    return kern.cls, kern.dtype, kern.variant, tuple(sizes)


def _kernel_time(profile: Profile, kern: Kernel, symbolic: bool = False):
    cls = kern.cls
    if cls == "gemm":
        entry = profile.entry(gemm_key(profile, kern.dtype))
        return _gpu(entry, symbolic, **aligned_view(kern)), _cpu(profile, entry)
    if cls == "sdpa":
        key = f"sdpa:{kern.variant}"
        if not profile.has(key):  # a kernel choice (``fa2.fwd``) the profile has no curve for: its own attention
            kernel = kern.variant.rsplit(".", 1)[0]
            if kernel in ONLY_PUBLISHED:
                near, words = NEAREST_PUBLISHED.get(kernel, ("", ""))
                hint = f"; {words}" if near and profile.has(f"sdpa:{near}.fwd") else ""
                raise UnsupportedError(f"{ONLY_PUBLISHED[kernel]} has no curve in the profile of {profile.gpu!r}: "
                                       f"it is priced where it is published; use attention='flash2' or 'flash'{hint}")
            key = f"sdpa:{kern.variant.rsplit('.', 1)[-1]}"
        entry = profile.entry(key)
        size = {k: v for k, v in kern.size.items() if k != "kv_heads"}
        size, longer = (size, 1.0) if symbolic else held_sequence(size, entry)
        t = _gpu(entry, symbolic, **size) * longer
        fast = next((f"gemm:{d}" for d in ("bf16", "fp16") if profile.has(f"gemm:{d}")), None)
        if kern.dtype in ("fp32", "tf32") and fast:  # no FlashAttention in fp32: scale by the GEMM rate ratio
            t = t * profile.entry(fast)["params"]["R"] / profile.entry(gemm_key(profile, kern.dtype))["params"]["R"]
        return t, _cpu(profile, entry)
    if cls == "fp8_linear":  # a float8 linear beyond its GEMMs and cast bytes, where measured (else nothing)
        entry = profile.compute.get(f"fp8_linear:{kern.variant}")
        if entry is None:
            return 0.0, 0.0
        mk = _number(kern.size["mk"], symbolic) if symbolic else kern.size["mk"]
        return _gpu(entry, symbolic, mk=mk, share=kern.size["share"]), 0.0
    if cls in CNN_CLASSES:  # convolutions by kind/kernel/stride, batch norm, activations, pooling
        gpu, entry = cnn_kernel_time(profile, kern, symbolic)
        return gpu, _cpu(profile, entry)
    if cls in OPTIMIZER_BYTES:
        entry, scale = _optimizer_entry(profile, cls)
        return _gpu(entry, symbolic, params=_number(kern.size["params"], symbolic) * scale), _cpu(profile, entry)
    entry, factor = profile.mem_entry(cls, kern.dtype, kern.variant)
    needs = get_form(entry["form"]).variables
    missing = [v for v in needs if v not in kern.size]
    if missing:
        raise UnsupportedError(f"kernel {kern.name!r} lacks {missing} needed by the {entry['form']!r} form of {cls!r}")
    size = {v: kern.size[v] for v in needs}
    size["x"] = _number(size["x"], symbolic) * factor
    return _gpu(entry, symbolic, **size), _cpu(profile, entry)


# the longest sequence of every attention table the bundled profiles are fitted to: Shah et al. 2024
# (arXiv 2407.08608) Figs. 5-6 and Dao 2023 (arXiv 2307.08691) Figs. 4, 7 stop at 16k, as does this
# project's H200 table (data/h200-2026-11-29/compute.csv); a profile entry may name its own ("seq_max")
SDPA_SEQ_MEASURED = 16384.0


def held_sequence(size: dict, entry) -> tuple[dict, object]:
    """(sizes, factor) pricing attention above the measured sequence range at the rate measured at its
    top: a sequence s > s_max runs as b·s/s_max sequences of s_max (the same query tiles, so the same
    waves) times s/s_max, whose FLOPs (4·b·h·s²·d, halved when causal) equal the kernel's. The
    measured curves are flat from 8k to 16k (FlashAttention-2/-3, cuDNN: within 2%, Shah et al. 2024),
    where the fitted forms would keep rising (causal above the non-causal rate); ``factor`` is 1.0 and
    the sizes unchanged within the range."""
    cap = float(entry["seq_max"]) if "seq_max" in entry else SDPA_SEQ_MEASURED
    seq = np.asarray(size["seq"], float)
    if not np.any(seq > cap):
        return size, 1.0
    longer = np.maximum(seq / cap, 1.0)
    if longer.ndim == 0:
        longer = float(longer)
    return {**size, "batch": size["batch"] * longer, "seq": np.minimum(seq, cap) if seq.ndim else min(float(seq), cap)}, longer


def _optimizer_entry(profile: Profile, cls: str):
    """The measured AdamW kernel and the factor that scales it to ``cls``'s bytes: the same kernel shape
    (one multi-tensor pass over every parameter), ``OPTIMIZER_BYTES`` moved. AdamW and SGD take the fused
    kernel where measured; RMSprop has no fused implementation in torch, so its foreach one."""
    fused, foreach = profile.compute.get("adamw:fused"), profile.compute.get("adamw:foreach")
    entry = (foreach or fused) if cls == "rmsprop" else (fused or foreach)
    if entry is None:
        entry = profile.entry("adamw:foreach")  # neither measured: the error names the profile's classes
    return entry, OPTIMIZER_BYTES[cls] / OPTIMIZER_BYTES["adamw"]


def phase_time(profile: Profile, kernels: list[Kernel], *, symbolic: bool = False):
    """(wall seconds, GPU seconds, CPU seconds) of a list of kernels run back to back.

    On a GPU the CPU enqueues ahead, so wall = max(Σ GPU, Σ CPU). On a device
    without a launch queue (``profile.host["serial"]``, a CPU), each op's
    dispatch and compute follow each other: wall = Σ max(GPU, CPU) per op, the
    quantity its eager microbenchmark measured. A profile fitted to whole tiny
    steps adds ``host["cpu_extra_per_kernel_s"]`` to each kernel's CPU time
    (what module calls and autograd add around it) and, on a CPU, scales each
    GEMM's compute by ``host["in_step_compute_factor"]`` (perfmodel/fit/overhead.py).
    ``symbolic``: the kernels' sizes may hold sympy symbols; the times are sympy expressions.
    """
    host = HostCosts.of(profile)
    if not symbolic and not host.serial:
        one = _one_phase(profile, kernels, host)
        if one is not None:
            return one
    extra = host.cpu_extra_per_kernel_s  # module/autograd
    in_step = host.in_step_compute_factor  # cold operands
    gpu = 0.0
    cpu = 0.0
    wall = 0.0
    shared = host.side_by_side_factor
    for kern in kernels:
        g, c = _launch_time(profile, kern, shared, symbolic)
        g = g * in_step if kern.cls == "gemm" else g
        count = _number(kern.count, symbolic)
        gpu = gpu + g * count
        cpu = cpu + (c + extra) * count
        if host.serial:
            wall = wall + (maximum(g, c) + extra) * count
    if symbolic:
        return (wall if host.serial else maximum(gpu, cpu)), gpu, cpu
    gpu, cpu = np.asarray(gpu, float), np.asarray(cpu, float)
    return (np.asarray(wall, float) if host.serial else np.maximum(gpu, cpu)), gpu, cpu


_ONE = frozenset((float, int, np.float64))  # one number, summed on Python floats


def _one_phase(profile: Profile, kernels: list[Kernel], host: HostCosts):
    """``phase_time`` of one configuration on a GPU (a launch queue) on Python floats, the same
    operations in the same order; None when a count or a kernel's time is an array (a search)."""
    gpu = cpu = 0.0
    extra, in_step, shared = host.cpu_extra_per_kernel_s, host.in_step_compute_factor, host.side_by_side_factor
    for kern in kernels:
        count = kern.count
        if type(count) not in _ONE:
            return None
        g, c = _launch_time(profile, kern, shared)
        if type(g) not in _ONE or type(c) not in _ONE:
            return None
        g = float(g) * in_step if kern.cls == "gemm" else float(g)
        gpu = gpu + g * float(count)
        cpu = cpu + (float(c) + extra) * float(count)
    gpu, cpu = np.asarray(gpu, float), np.asarray(cpu, float)
    return np.maximum(gpu, cpu), gpu, cpu


def class_totals(profile: Profile, kernels: list[Kernel]) -> dict[str, tuple]:
    """(launches, GPU seconds, host seconds) per cost class of ``kernels`` run once each (for breakdowns)."""
    out: dict[str, tuple] = {}
    for kern in kernels:
        g, c = kernel_time(profile, kern)
        n = np.asarray(kern.count, float)
        launches, gpu, cpu = out.get(kern.cls, (0.0, 0.0, 0.0))
        out[kern.cls] = (launches + n, gpu + g * n, cpu + c * n)
    return out


def time_by_class(profile: Profile, kernels: list[Kernel]) -> dict[str, np.ndarray]:
    """GPU seconds per cost class (for breakdowns and debugging)."""
    return {cls: gpu for cls, (_, gpu, _) in class_totals(profile, kernels).items()}


def copy_pricer(profile):
    """Seconds of one fp32 copy of ``elements`` elements (the profile's copy class), or None."""
    try:
        profile.mem_entry("copy", "fp32", "fwd")
    except PerfModelError:
        return None

    def copy_s(elements):
        return phase_time(profile, [mem_kernel("ddp.bucket_copy", "copy", "fwd", elements, variant="fwd")])[0]
    return copy_s
