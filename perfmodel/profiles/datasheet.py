"""Datasheet-derived profiles: a measured reference profile scaled to another GPU.

``datasheet_profile`` derives a profile for any catalog GPU from a measured
reference profile by scaling each class with the ratio of datasheet figures
(peak FLOP/s for GEMM and attention, memory bandwidth for memory-bound
classes): the shape of each curve (saturation, alignment, latencies) is the
reference GPU's, its height is the target GPU's datasheet; within a GEMM fit each parameter
follows the resource it stands for (:func:`scale_gemm`: rates by FLOP/s, the k at which a GEMM
crosses the ridge point by FLOP/s over bandwidth, area saturation by SM count). Published
microbenchmarks of the target (:mod:`perfmodel.profiles.reference`) replace the
datasheet ratio where they exist; the 8-GPU NVSwitch all-reduce is the curve
fitted to the GPU's published nccl-tests figures (``data/nvlink_allreduce_*.json``,
refitted by ``python -m perfmodel.fit.comm --write``).
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
from pathlib import Path

from perfmodel.core.choices import ENTRY_KEYS
from perfmodel.core.units import DTYPE_BYTES
from perfmodel.hardware import load_gpu
from perfmodel.profiles.profile import Profile
from perfmodel.profiles.mamf import calibrate_mamf
from perfmodel.profiles.reference import calibrate_gemm, stream_copy_bw

GEMM_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp8")
REFERENCE_PROFILE = "h200-sxm-141gb"  # the measured profile datasheet profiles are scaled from
DATA = Path(__file__).with_name("data")


def _gpu(name):
    return load_gpu(name)


def bundled_allreduce_entry(system: str) -> dict:
    """Fitted NVLink all_reduce entry bundled for ``system`` (a100, h100, h200: 8 GPUs; gb200: 4)."""
    with (DATA / f"nvlink_allreduce_{system}.json").open() as fh:
        return json.load(fh)


def profile_entry(entry: dict) -> dict:
    """The six keys a profile stores, without the fit report."""
    return {k: entry.get(k) for k in ENTRY_KEYS}


def derive_missing_gemm(compute: dict, target, reference) -> None:
    """Add GEMM dtypes the GPU supports but the tables lack (e.g. fp8): bf16's curve at that peak."""
    base = compute.get("gemm:bf16")
    if base is None:
        return
    for dtype in GEMM_DTYPES:
        key = f"gemm:{dtype}"
        if key in compute or dtype not in target.peak_flops or "bf16" not in reference.peak_flops:
            continue
        entry = copy.deepcopy(base)
        entry["params"]["R"] = base["params"]["R"] * target.peak_flops[dtype] / reference.peak_flops["bf16"]
        entry["params"]["elem_bytes"] = float(DTYPE_BYTES[dtype])
        entry.update(source=f"derived: bf16 fit x datasheet {dtype}/bf16 peak ratio", cv_mape=None, n_points=0)
        compute[key] = entry


RATE_KEYS = ("R", "R_mis")  # FLOP/s of the aligned and the misaligned kernel family
EPILOGUE_KEYS = ("k_half", "k_half_mis")  # the k at which a wide GEMM crosses the ridge point
AREA_KEYS = ("mn_half_mis",)  # output area (elements) at which the misaligned family fills half its rate


def scale_gemm(params: dict, *, flops: float, bandwidth: float, sms: float, ref_sms: float) -> None:
    """Carry one GEMM fit to another GPU, in place; ``flops`` and ``bandwidth`` are target/reference
    ratios of peak FLOP/s and memory bandwidth, ``sms`` and ``ref_sms`` the two SM counts.

    Each parameter follows the resource it stands for (roofline, Williams et al. 2009):
    R, R_mis x ``flops``; bw x ``bandwidth``; k_half, k_half_mis x ``flops / bandwidth``;
    mn_half_mis x SM ratio; ``sms`` (the waves of ``gemm_tiles``) = the target's.
    Why k_half is a bandwidth term: with m, n >> k a GEMM's intensity is 2k/elem_bytes FLOP per byte
    of C, so it is math-bound once k > (elem_bytes/2)·R/bw, the ridge point (NVIDIA, "Matrix
    Multiplication Background User's Guide", arithmetic intensity); the fitted factor k/(k + k_half)
    is that crossing, t = 2mnk/R + 2mn·k_half/R, whose second term writes C at bw. The H200 fits
    agree (fp16 175 vs 722 TFLOP/s / 4.01 TB/s = 180; bf16 153 vs 189; fp32 33 vs 26; tf32 336 vs 176),
    so k_half scales with the ridge point, R/bw; keeping it would price C's writes at FLOP/s.
    """
    for name in RATE_KEYS:
        if name in params:
            params[name] *= flops
    for name in EPILOGUE_KEYS:
        if name in params:
            params[name] *= flops / bandwidth
    for name in AREA_KEYS:  # a fixed fraction of the SMs busy needs an output area in proportion to them
        if name in params:
            params[name] *= sms / ref_sms
    params["bw"] *= bandwidth
    params["sms"] = sms


HOST_LINK_KEYS = ("h2d_", "d2h_")  # host copies measured over the reference machine's own PCIe link


def host_of_target(host) -> dict:
    """The reference's host costs a scaled profile keeps: not its measured host copies (another GPU
    has its own PCIe generation: ``costs.offload`` then prices the catalog's link)."""
    return {k: v for k, v in host.items() if not k.startswith(HOST_LINK_KEYS)}


def datasheet_profile(gpu: str, reference: Profile, *, collectives: dict | None = None,
                      published: bool = True) -> Profile:
    """A profile for ``gpu`` scaled from ``reference`` by datasheet peak FLOP/s and memory bandwidth;
    ``published``: published copy bandwidths replace the datasheet ratio and GEMM rates are matched to
    ``gpu``'s published GEMM benchmarks (``profiles/reference.py``); False: the datasheet figures alone."""
    target, ref = _gpu(gpu), _gpu(reference.gpu)
    bw_ratio = ref.mem_bw_bytes_per_s / target.mem_bw_bytes_per_s
    measured_ref, measured_target = stream_copy_bw(ref.name), stream_copy_bw(target.name)
    if published and measured_ref and measured_target:  # published copy figures beat the datasheet ratio
        bw_ratio = measured_ref / measured_target
    compute: dict = {}
    for key, entry in reference.compute.items():
        entry = copy.deepcopy(entry)
        params = entry["params"]
        cls = key.split(":")[0]
        if cls == "gemm":
            dtype = key.split(":")[1]
            if dtype not in target.peak_flops or dtype not in ref.peak_flops:
                continue
            scale_gemm(params, flops=target.peak_flops[dtype] / ref.peak_flops[dtype], bandwidth=1.0 / bw_ratio,
                       sms=float(target.sm_count), ref_sms=float(ref.sm_count))
        elif cls == "sdpa":
            # attention runs in the first 16-bit (else wider) dtype the GPU lists; a GPU file may omit any
            peak = next(target.peak_flops[d] for d in ("bf16", "fp16", "tf32", "fp32", "fp8") if d in target.peak_flops)
            params["R"] *= peak / ref.peak_flops["bf16"]
            if "sms" in params:
                params["sms"] = float(target.sm_count)
        else:  # memory-bound and optimizer classes: bytes over bandwidth
            for name in ("beta", "beta_y", "beta_row"):
                if name in params:
                    params[name] *= bw_ratio
        entry.update(source=f"datasheet-scaled from {reference.name} ({entry.get('source', '')})",
                     cv_mape=None, n_points=0)
        compute[key] = entry
    derive_missing_gemm(compute, target, target)
    if published:
        calibrate_gemm(compute, target.name)
        calibrate_mamf(compute, target.name, reference.compute, ref.name)
    meta = {"created": _dt.date.today().isoformat(), "derived_from": reference.name,
            "method": "reference fits scaled by datasheet peak FLOP/s, memory bandwidth and SM count "
                      "(each GEMM parameter by the resource it stands for: scale_gemm)"}
    return Profile(f"{target.name} (datasheet)", target.name, compute, dict(collectives or {}),
                   host_of_target(reference.host), meta)


# GPU -> the 8-GPU NVSwitch all-reduce curve fitted to its published nccl-tests numbers
NVLINK_ALLREDUCE = {"a100-sxm4-40gb": "a100", "a100-sxm4-80gb": "a100", "h100-sxm5-80gb": "h100",
                    "h200-sxm-141gb": "h200", "gb200-186gb": "gb200",
                    # no HGX B200 curve is published here: the GB200's, over the same NVLink 5 ports and
                    # NVSwitch generation (an assumption, docs/hardware.md "Blackwell")
                    "b200-sxm-180gb": "gb200"}


def intra_collectives(gpu: str) -> dict:
    system = NVLINK_ALLREDUCE.get(gpu)
    if system is None:
        return {}
    return {"intra": {"all_reduce": profile_entry(bundled_allreduce_entry(system))}}
