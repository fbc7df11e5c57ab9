"""A GPU run below its TDP: the profile of the same compute at TDP, slowed by the sustained clock.

A catalog GPU with ``power_limit_w`` below ``tdp_w`` (the H100 SXM5 96GB HBM2e at 500 W of Meta's
Grand Teton hosts) has the compute of another catalog GPU (:data:`SAME_COMPUTE_AT_TDP`), whose
bundled profile holds published kernel curves. Its profile is that one with

* compute-bound rates (GEMM ``R``/``R_mis``, attention ``R``) times :func:`sustained_fraction` times
  :func:`sustained_clock_ratio`. Under tensor-core load the board is power-bound, so the firmware
  lowers the SM clock until the power fits the limit. The reference's curves are burst rates (short
  runs); the same die held at its TDP under continuous GEMMs runs at the fraction
  :func:`sustained_fraction` of them (measured: ``data/h200-calibration-2026-11-30/sustained.csv``,
  686-699 W at 1470-1545 MHz of 1980, 664 TFLOP/s at 8192^3 where the same run began at 786). Below
  TDP a step's memory-bound kernels leave no power headroom for burst GEMMs, so the capped part's
  rates start from that sustained rate (an assumption: docs/hardware.md). Where a training
  throughput of the part under power limits is published
  (``profiles/data/reference/power_cap_published.csv``: Mayr et al. 2026, arXiv 2603.16164,
  Table 4, Llama 3 8B pre-training on the H100 SXM 94 GB HBM2e from 200 to 700 W) the clock ratio
  is that curve at the limit, interpolated linearly; else the cube law of dynamic power;
* memory-bound classes (``beta``-type seconds per byte, the GEMM ``bw`` and attention ``c_row``
  terms) by the ratio of the two GPUs' memory bandwidths: the limit throttles the SM clock, not
  the memory clock (Ujeniya et al. 2026, arXiv 2604.11391, measure SM and memory frequency apart);
* collectives and host costs as they are (same NVSwitch fabric, same host stack).

The ratio is written into ``meta["power_cap"]`` with the figures it came from.

    python -m perfmodel.fit.build    # rebuilds the bundled profiles, this one included
"""

from __future__ import annotations

import copy
import csv
import io
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from perfmodel.core.errors import InvalidInputError
from perfmodel.core.readers import read_text_file
from perfmodel.hardware import load_gpu
from perfmodel.profiles.profile import Profile

# power-capped GPU -> the catalog GPU of the same die and clocks run at its TDP
SAME_COMPUTE_AT_TDP = {"h100-sxm5-96gb-hbm2e-500w": "h100-sxm5-80gb"}
CLOCK_EXPONENT = 3.0  # P_dyn = a C V^2 f with V proportional to f across the DVFS range: P ~ f^3
CLOCK_SOURCE = ("dynamic CMOS power a*C*V^2*f (Rabaey et al., Digital Integrated Circuits, 2nd ed., 2003, "
                "Sect. 5.5) with the supply voltage scaled with the clock (Le Sueur and Heiser, HotPower 2010): "
                "power ~ clock^3; static power neglected; the GPU at TDP taken as power-bound under "
                "tensor-core load")
MEASURED_CSV = Path(__file__).with_name("data") / "reference" / "power_cap_published.csv"
# a die held at its TDP under continuous GEMMs (``python -m calibration.sustained``): the H200's GH100 (132 SMs,
# 700 W, as the H100 SXM5's), samples from SETTLE_S on (the first ran before the board reached its limit: 125 W)
SUSTAINED_CSV = Path(__file__).parents[1] / "data" / "h200-calibration-2026-11-30" / "sustained.csv"
SUSTAINED_DIE = {"h100-sxm5-80gb": "h200-sxm-141gb"}  # reference profile's GPU -> the GPU SUSTAINED_CSV measured
SETTLE_S = 1.0
COMPUTE_RATES = {"gemm": ("R", "R_mis"), "sdpa": ("R",)}
BYTE_TIMES = ("beta", "beta_y", "beta_row", "c_row")  # seconds per byte (or per row of bytes)


@lru_cache(maxsize=1)
def measured_curves() -> dict:
    """gpu -> (power limits in W, throughput / throughput at TDP, source) of every published curve."""
    text = read_text_file(MEASURED_CSV, field="power_cap_published", expect="the power-cap curves CSV")
    rows: dict = {}
    for r in csv.DictReader(io.StringIO(text, newline="")):
        rows.setdefault(r["gpu"], []).append((float(r["power_limit_w"]), float(r["tdp_w"]), float(r["throughput"]),
                                              r["source"]))
    curves = {}
    for gpu, pts in rows.items():
        pts.sort()
        at_tdp = [t for w, tdp, t, _ in pts if w == tdp]
        if len(at_tdp) != 1:
            raise InvalidInputError(f"{MEASURED_CSV.name}: the curve of {gpu!r} needs one row at its TDP: "
                                    f"got {len(at_tdp)}")
        curves[gpu] = (np.array([p[0] for p in pts]), np.array([p[2] for p in pts]) / at_tdp[0], pts[0][3])
    return curves


@lru_cache(maxsize=1)
def sustained_gemm() -> tuple[float, dict, str]:
    """(median FLOP/s of the settled samples of :data:`SUSTAINED_CSV`, the GEMM's sizes {m, n, k}, its dtype)."""
    text = read_text_file(SUSTAINED_CSV, field="sustained", expect="the sustained-GEMM CSV")
    rows = [r for r in csv.DictReader(io.StringIO(text, newline="")) if float(r["t_s"]) >= SETTLE_S]
    shapes = {(r["dtype"], r["m"], r["n"], r["k"]) for r in rows}
    if len(shapes) != 1:
        raise InvalidInputError(f"{SUSTAINED_CSV.name}: needs settled samples (t_s >= {SETTLE_S:g}) of one GEMM: "
                                f"got {len(shapes)} shapes")
    dtype, *mnk = shapes.pop()
    return float(np.median([float(r["tflops"]) for r in rows])) * 1e12, dict(zip("mnk", map(float, mnk))), dtype


def burst_gemm() -> float:
    """Median FLOP/s of the samples of :data:`SUSTAINED_CSV` before ``SETTLE_S``: the same GEMM on the same board
    before it reached its power limit (the burst rate, by the same harness)."""
    text = read_text_file(SUSTAINED_CSV, field="sustained", expect="the sustained-GEMM CSV")
    rows = [float(r["tflops"]) for r in csv.DictReader(io.StringIO(text, newline="")) if float(r["t_s"]) < SETTLE_S]
    if not rows:
        raise InvalidInputError(f"{SUSTAINED_CSV.name}: needs a sample before t_s = {SETTLE_S:g} (the burst rate)")
    return float(np.median(rows)) * 1e12


def sustained_fraction(reference: Profile) -> float:
    """The rate the die of ``reference`` sustains at its TDP under continuous GEMMs over its burst rate, both from
    one run of one board (:func:`sustained_gemm` over :func:`burst_gemm`), at most 1; 1.0 for a GPU with no
    sustained measurement. A ratio of the die, not of ``reference``'s curve: a change of the curve's bf16 rate
    does not move its fp8 or attention rates."""
    if SUSTAINED_DIE.get(reference.gpu) is None:
        return 1.0
    return min(1.0, sustained_gemm()[0] / burst_gemm())


def cube_law_ratio(power_limit_w, tdp_w: float):
    """Clock at ``power_limit_w`` over the clock at ``tdp_w`` when power ~ clock^3: (P_limit / P_tdp)^(1/3)
    (:data:`CLOCK_SOURCE`); static power neglected."""
    return (np.asarray(power_limit_w, float) / tdp_w) ** (1.0 / CLOCK_EXPONENT)


def sustained_clock_ratio(gpu) -> float:
    """Compute-bound rate at ``gpu.power_limit_w`` over the rate at ``gpu.tdp_w`` under tensor-core load: the
    published curve of the part at that limit (:func:`measured_curves`, linear between measured limits),
    else :func:`cube_law_ratio`; 1.0 when no lower limit is set.

    The curve is a whole training step's throughput, taken for the compute-bound rate: an upper bound of
    it, as the step's memory-bound kernels slow less than its GEMMs."""
    gpu = load_gpu(gpu) if isinstance(gpu, str) else gpu
    if gpu.power_limit_w is None or gpu.tdp_w is None or gpu.power_limit_w >= gpu.tdp_w:
        return 1.0
    curve = _curve_at_limit(gpu)
    if curve is None:
        return float(cube_law_ratio(gpu.power_limit_w, gpu.tdp_w))
    return float(np.interp(gpu.power_limit_w, curve[0], curve[1]))


def _curve_at_limit(gpu):
    """The published curve of ``gpu`` when its power limit lies within the measured limits, else None."""
    curve = measured_curves().get(gpu.name)
    if curve is None or gpu.power_limit_w is None or not curve[0][0] <= gpu.power_limit_w <= curve[0][-1]:
        return None
    return curve


def ratio_source(gpu) -> str:
    """Where :func:`sustained_clock_ratio` of ``gpu`` comes from, in words."""
    curve = _curve_at_limit(load_gpu(gpu) if isinstance(gpu, str) else gpu)
    return CLOCK_SOURCE if curve is None else f"measured throughput under power limits, interpolated: {curve[2]}"


def power_capped_profile(gpu: str, reference: Profile) -> Profile:
    """``reference`` (the bundled profile of ``SAME_COMPUTE_AT_TDP[gpu]``) priced for ``gpu``: compute
    rates times :func:`sustained_fraction` and :func:`sustained_clock_ratio`, memory-bound classes by the
    bandwidth ratio."""
    target, ref = load_gpu(gpu), load_gpu(reference.gpu)
    if SAME_COMPUTE_AT_TDP.get(target.name) != ref.name:
        raise InvalidInputError(f"'reference' for {target.name} must be the profile of "
                                f"{SAME_COMPUTE_AT_TDP.get(target.name)!r}: got {reference.gpu!r}")
    clock, burst = sustained_clock_ratio(target), sustained_fraction(reference)
    bw = target.mem_bw_bytes_per_s / ref.mem_bw_bytes_per_s  # < 1: slower memory
    compute = {key: _scaled(key, entry, clock * burst, bw) for key, entry in reference.compute.items()}
    meta = {**reference.meta, "derived_from": reference.name,
            "method": f"{reference.name} at {ref.tdp_w:g} W: compute rates x the sustained fraction x the "
                      f"capped-rate ratio, memory-bound classes x bandwidth ratio",
            "power_cap": {"power_limit_w": target.power_limit_w, "tdp_w": target.tdp_w, "clock_ratio": clock,
                          "sustained_fraction": burst, "bandwidth_ratio": bw, "source": ratio_source(target),
                          "sustained_source": f"perfmodel/data/{SUSTAINED_CSV.parent.name}/{SUSTAINED_CSV.name} "
                                              f"({SUSTAINED_DIE.get(ref.name)}, the same die at its TDP)"}}
    return replace(reference, name=target.name, gpu=target.name, compute=compute, meta=meta)


def _scaled(key: str, entry: dict, clock: float, bw: float) -> dict:
    entry = copy.deepcopy(dict(entry))
    params = entry["params"]
    for name in COMPUTE_RATES.get(key.split(":")[0], ()):
        if name in params:
            params[name] *= clock
    for name in BYTE_TIMES:
        if name in params:
            params[name] /= bw
    if "bw" in params:
        params["bw"] *= bw
    entry["source"] = f"power-capped from {entry.get('source', '')}"
    return entry
