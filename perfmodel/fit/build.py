"""Assemble a Profile: fitted classes from tables, datasheet-scaled classes for the rest.

``build_profile`` fits what a calibration folder measured; ``datasheet_profile``
derives a profile for any catalog GPU from a measured reference profile by
scaling each class with the ratio of datasheet figures (peak FLOP/s for
GEMM and attention, memory bandwidth for memory-bound classes): the shape of
each curve (saturation, alignment, latencies) is the reference GPU's, its
height is the target GPU's datasheet. Regenerate the bundled profiles with
``python -m perfmodel.fit.build`` (run from a checkout).
"""

from __future__ import annotations

import copy
import datetime as _dt
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.fit.compute import MIN_POINTS, ComputeFitter
from perfmodel.profiles.reference import calibrate_gemm, stream_copy_bw
from perfmodel.core.errors import InvalidInputError
from perfmodel.fit.tables import COMPUTE_COLUMNS, read_compute_table
from perfmodel.profiles.profile import Profile
from perfmodel.core.units import DTYPE_BYTES

BUNDLED_H200_TABLES = Path(__file__).resolve().parents[1] / "data" / "h200-2026-11-29"
# The same kind of GPU measured by this project's own calibration suite (calibration.compute)
CALIBRATED_H200_TABLES = Path(__file__).resolve().parents[1] / "data" / "h200-calibration-2026-11-30"
CALIBRATED_H200_PROFILE = "h200-sxm-141gb-calibrated"
PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"
GEMM_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp8")
REFERENCE_PROFILE = "h200-sxm-141gb"  # the measured profile datasheet profiles are scaled from


def _gpu(name):
    from perfmodel.hardware import load_gpu

    return load_gpu(name)


def fit_tables(folders, *, gpu: str, folds: int = 5, seed: int = 0, progress=None):
    """Fit every class measured in the ``compute.csv`` of ``folders``; returns the fitter."""
    spec = _gpu(gpu)
    for f in folders:
        if Path(f).is_dir() and not any((Path(f) / n).exists() for n in ("compute.csv", "collectives.csv")):
            raise InvalidInputError(f"'tables' folder {str(f)!r} holds neither compute.csv nor collectives.csv")
    compute = [f for f in folders if not Path(f).is_dir() or (Path(f) / "compute.csv").exists()]
    tables = [read_compute_table(f) for f in compute] or [pd.DataFrame(columns=list(COMPUTE_COLUMNS))]
    table = pd.concat(tables, ignore_index=True)
    source = ", ".join(str(Path(f).name) for f in compute) or "no compute tables"
    on_cpu = any(_metadata(f).get("device") == "cpu" for f in folders)
    fitter = ComputeFitter(sms=spec.sm_count, folds=folds, seed=seed, source=f"measured: {source}",
                           power_limited=not on_cpu, serial=on_cpu, progress=progress).fit(table)
    fitter.table_ = table
    fitter.on_cpu_ = on_cpu
    return fitter


def build_profile(folders, *, gpu: str, name: str | None = None, folds: int = 5, seed: int = 0,
                  collectives: dict | None = None, fill: bool = True, progress=None) -> tuple[Profile, pd.DataFrame]:
    """Profile fitted from calibration folders; classes they lack are derived from the datasheet
    (``fill=False``: left out). The report has one row per compute class and per fitted collective;
    ``progress(done, total, class)`` is called before each compute class is fitted."""
    spec = _gpu(gpu)
    fitter = fit_tables(folders, gpu=gpu, folds=folds, seed=seed, progress=progress)
    compute = dict(fitter.entries_)
    if not compute and not any((Path(f) / "collectives.csv").exists() for f in folders):
        rejected = ", ".join(f"{n} {why}" for why, n in fitter.rejected_.items()) or "none"
        raise InvalidInputError(f"no compute class could be fitted from {', '.join(map(str, folders))} "
                                f"(rows rejected: {rejected}; each class needs {MIN_POINTS} usable rows)")
    _derive_missing_gemm(compute, spec, spec)
    fitter.report_ = _fill_from_datasheet(compute, gpu, fitter.report_, fill=fill)
    for dtype in GEMM_DTYPES:  # derived dtypes only: fitted ones already match this GPU's tables
        if compute.get(f"gemm:{dtype}", {}).get("n_points") == 0:
            calibrate_gemm({f"gemm:{dtype}": compute[f"gemm:{dtype}"]}, spec.name)
    coll = dict(collectives or {})
    fitted_coll = []
    for folder in folders:
        path = Path(folder) / "collectives.csv"
        if path.exists():
            from perfmodel.fit.comm import fit_collectives

            for level, entries in fit_collectives(pd.read_csv(path), source=f"measured: {path.parent.name}").items():
                coll.setdefault(level, {}).update(entries)
                fitted_coll += [_collective_row(level, name, e) for name, e in entries.items()]
    meta = {"created": _dt.date.today().isoformat(), "fitted_from": [str(Path(f).name) for f in folders],
            "rejected_rows": fitter.rejected_, "method": "robust log-space least squares, 5-fold CV"}
    fallback = sum("fallback" in str(e.get("source", "")) for e in compute.values())
    if fallback:  # classes the tables lacked, taken from the bundled profile (so said on every prediction)
        meta["fallback_classes"] = fallback
    host = dict(fitter.host_)
    if fitter.on_cpu_:
        # no launch queue on a CPU: dispatch and compute of each op run one after the other
        host["serial"] = True
    profile = Profile(name or spec.name, spec.name, compute, coll, host, meta)
    from perfmodel.fit.overhead import fit_step_overhead

    profile.host.update(fit_step_overhead(profile, fitter.table_, gpu))
    report = fitter.report_
    if fitted_coll:
        report = pd.concat([report, pd.DataFrame(fitted_coll)], ignore_index=True)
    report.attrs["points"] = fitter.points_
    return profile, report


def _collective_row(level: str, name: str, entry: dict) -> dict:
    """A fit-report row of one fitted collective ("all_reduce@intra"), as compute classes have."""
    form = entry.get("form") or f"(not fitted: {entry.get('note', '')})"
    return {"class": f"{name}@{level}", "points": entry.get("n_points", 0), "form": form,
            "cv_mape": np.nan if entry.get("cv_mape") is None else float(entry["cv_mape"]),
            "fit_mape": None, "candidates": {k: v for k, v in (entry.get("candidates") or {}).items()
                                             if v is not None}}


def _metadata(folder) -> dict:
    path = Path(folder) / "metadata.json"
    if not path.exists():
        return {}
    import json

    try:
        return json.loads(path.read_text())
    except ValueError:
        return {}


def _fill_from_datasheet(compute: dict, gpu, report: pd.DataFrame, *, fill: bool = True) -> pd.DataFrame:
    """Classes the tables could not fit come from the datasheet-scaled bundled reference profile
    (on the reference GPU itself, from that bundled profile as it is)."""
    from perfmodel.profiles.profile import load_profile

    if not fill:  # the bundled profiles are built from their own tables alone
        return report
    reference = load_profile(REFERENCE_PROFILE)
    if _gpu(gpu).name == REFERENCE_PROFILE:
        fallback, label = reference.compute, "bundled fallback"
    else:
        fallback, label = datasheet_profile(gpu, reference).compute, "datasheet fallback"
    filled = [key for key in fallback if key not in compute]
    for key in filled:
        compute[key] = {**fallback[key], "source": f"{label}: {fallback[key].get('source', '')}"}
    known = set(report["class"]) if len(report) else set()
    extra = pd.DataFrame([{"class": k, "points": 0, "form": f"({label})", "cv_mape": np.nan}
                          for k in filled if k not in known])
    report = pd.concat([report, extra], ignore_index=True) if len(extra) else report
    missing = report["form"].astype(str).str.startswith("(datasheet")
    report.loc[missing, "form"] = [f"({label})" if k in compute else "(missing: no datasheet class)"
                                   for k in report.loc[missing, "class"]]
    return report


def _derive_missing_gemm(compute: dict, target, reference) -> None:
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


def datasheet_profile(gpu: str, reference: Profile, *, collectives: dict | None = None) -> Profile:
    """A profile for ``gpu`` scaled from ``reference`` by datasheet peak FLOP/s and memory bandwidth."""
    target, ref = _gpu(gpu), _gpu(reference.gpu)
    bw_ratio = ref.mem_bw_bytes_per_s / target.mem_bw_bytes_per_s
    measured_ref, measured_target = stream_copy_bw(ref.name), stream_copy_bw(target.name)
    if measured_ref and measured_target:  # published STREAM figures beat the datasheet ratio
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
            params["R"] *= target.peak_flops[dtype] / ref.peak_flops[dtype]
            params["sms"] = float(target.sm_count)
            params["bw"] /= bw_ratio
        elif cls == "sdpa":
            dtype = "bf16" if "bf16" in target.peak_flops else "fp16"
            params["R"] *= target.peak_flops.get(dtype, target.peak_flops["fp32"]) / ref.peak_flops["bf16"]
            if "sms" in params:
                params["sms"] = float(target.sm_count)
        else:  # memory-bound and optimizer classes: bytes over bandwidth
            for name in ("beta", "beta_y", "beta_row"):
                if name in params:
                    params[name] *= bw_ratio
        entry.update(source=f"datasheet-scaled from {reference.name} ({entry.get('source', '')})",
                     cv_mape=None, n_points=0)
        compute[key] = entry
    _derive_missing_gemm(compute, target, target)
    calibrate_gemm(compute, target.name)
    meta = {"created": _dt.date.today().isoformat(), "derived_from": reference.name,
            "method": "reference fits scaled by datasheet peak FLOP/s and memory bandwidth"}
    return Profile(f"{target.name} (datasheet)", target.name, compute, dict(collectives or {}),
                   dict(reference.host), meta)


# GPU -> the 8-GPU NVSwitch all-reduce curve fitted to its published nccl-tests numbers
NVLINK_ALLREDUCE = {"a100-sxm4-40gb": "a100", "a100-sxm4-80gb": "a100", "h100-sxm5-80gb": "h100",
                    "h200-sxm-141gb": "h200"}


def _intra_collectives(gpu: str) -> dict:
    from perfmodel.fit.comm import bundled_allreduce_entry, profile_entry

    system = NVLINK_ALLREDUCE.get(gpu)
    if system is None:
        return {}
    return {"intra": {"all_reduce": profile_entry(bundled_allreduce_entry(system))}}


def bundled_profiles() -> dict[str, Profile]:
    """Every bundled profile, by name: the fitted H200 ones and datasheet-scaled ones for the other GPUs."""
    from perfmodel.hardware import list_gpus

    h200, _ = build_profile([BUNDLED_H200_TABLES], gpu="h200-sxm-141gb", name="h200-sxm-141gb", fill=False,
                            collectives=_intra_collectives("h200-sxm-141gb"))
    out = {h200.gpu: h200}
    calibrated, _ = build_profile([CALIBRATED_H200_TABLES], gpu="h200-sxm-141gb", name=CALIBRATED_H200_PROFILE,
                                  fill=False, collectives=_intra_collectives("h200-sxm-141gb"))
    out[CALIBRATED_H200_PROFILE] = calibrated
    for gpu in list_gpus():
        if gpu not in out:
            out[gpu] = datasheet_profile(gpu, h200, collectives=_intra_collectives(gpu))
    return out


def main() -> None:
    PROFILES_DIR.mkdir(exist_ok=True)
    for name, profile in bundled_profiles().items():
        profile.save(PROFILES_DIR / f"{name}.json")
        print(f"wrote {name}.json ({len(profile.compute)} compute classes)")


if __name__ == "__main__":
    main()
