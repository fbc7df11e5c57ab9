"""One GPU: peak FLOP/s per data type, memory, bandwidths (SI units throughout).

Peaks are dense (no 2:4 sparsity) datasheet figures at boost clock; a dtype
absent from ``peak_flops`` means the GPU has no fast path for it.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field

from perfmodel.core.errors import InvalidInputError, UnsupportedError, unknown_name
from perfmodel.hardware.common import FrozenMap, check_name, check_number
from perfmodel.core.units import format_bytes, format_rate

# the data types a GPU may list, in the order messages print them
DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
# dtypes only tensor cores multiply (tf32 and bf16 from Ampere, fp8 from Ada/Hopper); fp16 runs on them from
# Volta at 8x the fp32 FMA rate (V100, T4 datasheets), while a P100's paired fp16 in CUDA cores gives 2x
TENSOR_CORE_ONLY = ("tf32", "bf16", "fp8")
TENSOR_CORE_FP16_RATIO = 4.0
MAX_SPEED_SPREAD = 0.5  # a σ of half the median speed: beyond any fleet measured (22% variation at most)
# other spellings accepted by GPU.peak (torch dtype names, precision names)
DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "tensorfloat32": "tf32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float8": "fp8",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
}


def normalize_dtype(dtype: str) -> str:
    """``'bfloat16'`` -> ``'bf16'``; unknown names raise listing the known ones."""
    key = str(dtype).strip().lower().replace("torch.", "")
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise unknown_name("dtype", dtype, DTYPES)
    return key


@dataclass(frozen=True, repr=False)
class GPU:
    """A GPU model. ``peak_flops`` maps dtype (fp32, tf32, bf16, fp16, fp8) to FLOP/s."""

    name: str
    peak_flops: Mapping[str, float]
    mem_bw_bytes_per_s: float
    mem_bytes: float  # usable by CUDA where measured, else the datasheet capacity
    sm_count: int
    l2_bytes: float | None = None
    nvlink_bw_bytes_per_s: float | None = None  # per GPU, per direction, all links
    pcie: str | None = None  # link name of the host interface, e.g. "pcie5"
    gpus_per_pcie: int = 1  # GPUs behind one host link (a K80 board's two GK210 share its x16 through a switch)
    tdp_w: float | None = None
    # the board power limit it runs at, where set below ``tdp_w`` (W); None: at its TDP
    power_limit_w: float | None = None
    # σ of one device's speed over the median device's, across a fleet of this GPU (a fraction); None: the
    # published fleet figure (perfmodel/parallel/stragglers.py), 0 for devices that run at one speed
    speed_spread: float | None = None
    aliases: tuple[str, ...] = ()
    source: str = ""
    nvlink: str | None = None  # link name of its NVLink generation, e.g. "nvlink4"
    year: int | None = None
    compute_capability: float | None = None  # CUDA's major.minor, e.g. 9.0 for sm_90 (Hopper)
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=FrozenMap)  # per-field sources

    def __post_init__(self) -> None:
        check_name("GPU", self.name)
        owner = f"GPU {self.name!r}"
        if not isinstance(self.peak_flops, Mapping) or not self.peak_flops:
            raise InvalidInputError(
                f"{owner}: 'peak_flops' must map at least one of {', '.join(DTYPES)} "
                f"to FLOP/s: got {self.peak_flops!r}"
            )
        peaks = {}
        for dtype, value in self.peak_flops.items():
            key = normalize_dtype(dtype)
            peaks[key] = check_number(owner, f"peak_flops.{key}", value)
        ordered = {d: peaks[d] for d in DTYPES if d in peaks}
        set_ = object.__setattr__  # frozen: normalise once, here
        set_(self, "peak_flops", FrozenMap(ordered))
        set_(
            self,
            "mem_bw_bytes_per_s",
            check_number(owner, "mem_bw_bytes_per_s", self.mem_bw_bytes_per_s),
        )
        set_(self, "mem_bytes", check_number(owner, "mem_bytes", self.mem_bytes))
        sm = self.sm_count
        if isinstance(sm, bool) or not isinstance(sm, numbers.Integral) or sm < 1:
            raise InvalidInputError(f"{owner}: 'sm_count' must be an integer >= 1: got {sm!r}")
        set_(self, "sm_count", int(sm))
        for name in ("l2_bytes", "nvlink_bw_bytes_per_s", "tdp_w", "power_limit_w"):
            set_(self, name, check_number(owner, name, getattr(self, name), optional=True))
        if self.power_limit_w is not None and self.tdp_w is not None and self.power_limit_w > self.tdp_w:
            raise InvalidInputError(f"{owner}: 'power_limit_w' must be at most tdp_w={self.tdp_w:g}: "
                                    f"got {self.power_limit_w:g}")
        if self.speed_spread is not None:
            spread = self.speed_spread
            if isinstance(spread, bool) or not isinstance(spread, numbers.Real) or not 0 <= spread <= MAX_SPEED_SPREAD:
                raise InvalidInputError(f"{owner}: 'speed_spread' must be a fraction from 0 to {MAX_SPEED_SPREAD:g} "
                                        f"(the σ of a device's speed over the median device's, e.g. 0.015): "
                                        f"got {spread!r}")
            set_(self, "speed_spread", float(spread))
        set_(self, "aliases", tuple(self.aliases))
        set_(self, "sources", FrozenMap(self.sources))

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The data types this GPU has a peak for, in DTYPES order."""
        return tuple(self.peak_flops)

    @property
    def tensor_core_dtypes(self) -> tuple[str, ...]:
        """The data types this GPU multiplies on tensor cores: tf32, bf16 and fp8 wherever listed, and fp16
        on a GPU that also lists one of those or runs fp16 at >= 4x its fp32 rate (``TENSOR_CORE_FP16_RATIO``)."""
        peaks = self.peak_flops
        fp16 = "fp16" in peaks and (any(d in peaks for d in TENSOR_CORE_ONLY)
                                    or peaks["fp16"] >= TENSOR_CORE_FP16_RATIO * peaks.get("fp32", float("inf")))
        return tuple(d for d in DTYPES if d in TENSOR_CORE_ONLY and d in peaks or d == "fp16" and fp16)

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``; UnsupportedError if the GPU lacks it."""
        key = normalize_dtype(dtype)
        if key not in self.peak_flops:
            kind = "fp32 units" if key == "fp32" else "tensor cores"
            raise UnsupportedError(
                f"{self.name} has no {key} {kind} (supported: {', '.join(self.dtypes)})"
            )
        return self.peak_flops[key]

    def source_of(self, field_name: str) -> str:
        """Where the number in ``field_name`` comes from (falls back to ``source``)."""
        return self.sources.get(field_name, self.source)

    def __repr__(self) -> str:
        best = max(self.peak_flops, key=self.peak_flops.get)
        return (
            f"GPU({self.name!r}, {best}={format_rate(self.peak_flops[best], 'FLOP/s')}, "
            f"mem={format_bytes(self.mem_bytes)}, "
            f"mem_bw={format_rate(self.mem_bw_bytes_per_s, 'B/s')}, sms={self.sm_count})"
        )
