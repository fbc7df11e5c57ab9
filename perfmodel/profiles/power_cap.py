"""A GPU run below its TDP: the profile of the same compute at TDP, slowed by the sustained clock.

A catalog GPU with ``power_limit_w`` below ``tdp_w`` (the H100 SXM5 96GB HBM2e at 500 W of Meta's
Grand Teton hosts) has the compute of another catalog GPU (:data:`SAME_COMPUTE_AT_TDP`), whose
bundled profile holds published kernel curves. Its profile is that one with

* compute-bound rates (GEMM ``R``/``R_mis``, attention ``R``) times the sustained-clock ratio
  :func:`sustained_clock_ratio`: under tensor-core load the board is power-bound, so the firmware
  lowers the SM clock until the power fits the limit (measured at 700 W on the same die:
  ``data/h200-calibration-2026-11-30/sustained.csv``, 686-699 W at 1470-1545 MHz of 1980);
* memory-bound classes (``beta``-type seconds per byte, the GEMM ``bw`` and attention ``c_row``
  terms) by the ratio of the two GPUs' memory bandwidths: the limit throttles the SM clock, not
  the memory clock (Ujeniya et al. 2026, arXiv 2604.11391, measure SM and memory frequency apart);
* collectives and host costs as they are (same NVSwitch fabric, same host stack).

The ratio is written into ``meta["power_cap"]`` with the figures it came from.

    python -m perfmodel.fit.build    # rebuilds the bundled profiles, this one included
"""

from __future__ import annotations

import copy
from dataclasses import replace

from perfmodel.core.errors import InvalidInputError
from perfmodel.hardware import load_gpu
from perfmodel.profiles.profile import Profile

# power-capped GPU -> the catalog GPU of the same die and clocks run at its TDP
SAME_COMPUTE_AT_TDP = {"h100-sxm5-96gb-hbm2e-500w": "h100-sxm5-80gb"}
CLOCK_EXPONENT = 3.0  # P_dyn = a C V^2 f with V proportional to f across the DVFS range: P ~ f^3
CLOCK_SOURCE = ("dynamic CMOS power a*C*V^2*f (Rabaey et al., Digital Integrated Circuits, 2nd ed., 2003, "
                "Sect. 5.5) with the supply voltage scaled with the clock (Le Sueur and Heiser, HotPower 2010): "
                "power ~ clock^3; static power neglected; the GPU at TDP taken as power-bound under "
                "tensor-core load")
COMPUTE_RATES = {"gemm": ("R", "R_mis"), "sdpa": ("R",)}
BYTE_TIMES = ("beta", "beta_y", "beta_row", "c_row")  # seconds per byte (or per row of bytes)


def sustained_clock_ratio(gpu) -> float:
    """Sustained SM clock at ``gpu.power_limit_w`` over the clock at ``gpu.tdp_w`` under tensor-core
    load: (P_limit / P_tdp)^(1/3) (:data:`CLOCK_SOURCE`); 1.0 when no lower limit is set."""
    gpu = load_gpu(gpu) if isinstance(gpu, str) else gpu
    if gpu.power_limit_w is None or gpu.tdp_w is None or gpu.power_limit_w >= gpu.tdp_w:
        return 1.0
    return float((gpu.power_limit_w / gpu.tdp_w) ** (1.0 / CLOCK_EXPONENT))


def power_capped_profile(gpu: str, reference: Profile) -> Profile:
    """``reference`` (the bundled profile of ``SAME_COMPUTE_AT_TDP[gpu]``) priced for ``gpu``: compute
    rates times :func:`sustained_clock_ratio`, memory-bound classes by the bandwidth ratio."""
    target, ref = load_gpu(gpu), load_gpu(reference.gpu)
    if SAME_COMPUTE_AT_TDP.get(target.name) != ref.name:
        raise InvalidInputError(f"'reference' for {target.name} must be the profile of "
                                f"{SAME_COMPUTE_AT_TDP.get(target.name)!r}: got {reference.gpu!r}")
    clock = sustained_clock_ratio(target)
    bw = target.mem_bw_bytes_per_s / ref.mem_bw_bytes_per_s  # < 1: slower memory
    compute = {key: _scaled(key, entry, clock, bw) for key, entry in reference.compute.items()}
    meta = {**reference.meta, "derived_from": reference.name,
            "method": f"{reference.name} at {ref.tdp_w:g} W: compute rates x sustained-clock ratio, "
                      f"memory-bound classes x bandwidth ratio",
            "power_cap": {"power_limit_w": target.power_limit_w, "tdp_w": target.tdp_w, "clock_ratio": clock,
                          "bandwidth_ratio": bw, "source": CLOCK_SOURCE}}
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
