"""Assemble a Profile: fitted classes from tables, datasheet-scaled classes for the rest.

``build_profile`` fits what a calibration folder measured; classes it could not
fit come from :func:`perfmodel.profiles.datasheet.datasheet_profile`. Regenerate the bundled profiles with
``python -m perfmodel.fit.build`` (run from a checkout); ``--cnn-classes`` refits only the CNN classes of the
GPUs seeded from public tables (and of those they are carried to), against the bundled GEMM and copy fits.
"""

from __future__ import annotations

from dataclasses import replace

import argparse
import datetime as _dt
import functools
import re
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.core.entry import run_command
from perfmodel.fit.compute import MIN_POINTS, ComputeFitter
from perfmodel.fit.conv import class_channel_ranges, fit_classes
from perfmodel.fit.published import with_published
from perfmodel.core.errors import InvalidInputError, PerfModelError
from perfmodel.core.readers import read_csv_file, read_json_file
from perfmodel.fit.tables import COMPUTE_COLUMNS, read_compute_table
from perfmodel.profiles.datasheet import (
    GEMM_DTYPES,
    REFERENCE_PROFILE,
    datasheet_profile,
    derive_missing_gemm,
    intra_collectives,
)
from perfmodel.profiles.power_cap import SAME_COMPUTE_AT_TDP, power_capped_profile
from perfmodel.profiles.reference import calibrate_gemm
from perfmodel.profiles.profile import Profile, load_profile
from perfmodel.fit.comm import fit_collectives
from perfmodel.fit.overhead import fit_step_overhead
from perfmodel.hardware import list_gpus, load_gpu

BUNDLED_H200_TABLES = Path(__file__).resolve().parents[1] / "data" / "h200-2026-11-29"
# The same kind of GPU measured by this project's own calibration suite (calibration.compute)
CALIBRATED_H200_TABLES = Path(__file__).resolve().parents[1] / "data" / "h200-calibration-2026-11-30"
CALIBRATED_H200_PROFILE = "h200-sxm-141gb-calibrated"
PROFILES_DIR = Path(__file__).resolve().parents[1] / "profiles"
# Public convolution benchmarks that seed the CNN classes of GPUs this project has not measured:
# baidu-research/DeepBench results/train/DeepBench_NV_V100.xlsx (commit da81ba7; CUDA 10.1, cuDNN 7.6.2,
# NCHW), DeepBench_NV_P100.xlsx (same commit; CUDA 8.0.88, cuDNN 6.0.21, a PCIe board) and DeepBench_NV_T4.xlsx
# (same commit; CUDA 10.1, cuDNN 7.6.2), converted by tools/deepbench_conv.py
SEED_TABLES = {"v100-sxm2-32gb": Path(__file__).resolve().parents[1] / "data" / "deepbench-v100",
               "p100-pcie-16gb": Path(__file__).resolve().parents[1] / "data" / "deepbench-p100",
               "t4": Path(__file__).resolve().parents[1] / "data" / "deepbench-t4"}
# GPUs with no published convolution table take the convolution classes of a GPU measured with the cuDNN
# generation their users ran: the K80's TensorFlow 1.x runs of 2017 used cuDNN 5.1, DeepBench's P100 table
# cuDNN 6.0.21. No Kepler table of this kind is public: DeepBench has no Kepler GPU, and convnet-benchmarks'
# legacy Kepler (Titan Black) layer table has no cuDNN row, on five large-kernel shapes (docs/parameter-servers.md)
CONV_CARRIED = {"k80": "p100-pcie-16gb"}
# a class fitted on rows of one kernel shape and stride; the pooled ``conv.<kind>:...`` entries mix shapes
# a class of one kernel shape, or the pooled dense shapes no Winograd algorithm runs (costs.cnn.pooled_label)
SHAPE_CLASS = re.compile(r"^conv\.[a-z]+-(k\d+x\d+-s\d+|gemm|gemm-strided):(?P<dtype>[a-z0-9]+):")


def _gpu(name):
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
    derive_missing_gemm(compute, spec, spec)
    fitter.report_ = _fill_from_datasheet(compute, gpu, fitter.report_, fill=fill)
    for dtype in GEMM_DTYPES:  # derived dtypes only: fitted ones already match this GPU's tables
        key = f"gemm:{dtype}"
        if compute.get(key, {}).get("n_points") == 0:
            one = {key: compute[key]}
            calibrate_gemm(one, spec.name)  # replaces the entry in the mapping it is given
            compute[key] = one[key]
    coll = dict(collectives or {})
    fitted_coll = []
    for folder in folders:
        path = Path(folder) / "collectives.csv"
        if path.exists():
            table = read_csv_file(path, field="collectives", expect="a collectives.csv")
            for level, entries in fit_collectives(table, source=f"measured: {path.parent.name}").items():
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

    profile = replace(profile, host={**profile.host, **fit_step_overhead(profile, fitter.table_, gpu)})
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
    try:
        data = read_json_file(path, field="metadata")
    except PerfModelError:  # metadata only labels the fit: a broken file leaves it unlabelled
        return {}
    return data if isinstance(data, dict) else {}


def _fill_from_datasheet(compute: dict, gpu, report: pd.DataFrame, *, fill: bool = True) -> pd.DataFrame:
    """Classes the tables could not fit come from the datasheet-scaled bundled reference profile
    (on the reference GPU itself, from that bundled profile as it is)."""
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


def bundled_profiles(only: tuple[str, ...] = ()) -> dict[str, Profile]:
    """Every bundled profile, by name: the fitted H200 ones and datasheet-scaled ones for the other GPUs;
    ``only``: just these datasheet-scaled catalog GPUs (a GPU added to the catalog, the others untouched)."""
    h200, _ = build_profile([BUNDLED_H200_TABLES], gpu="h200-sxm-141gb", name="h200-sxm-141gb", fill=False,
                            collectives=intra_collectives("h200-sxm-141gb"))
    if only:
        return {gpu: _datasheet_bundled(gpu, h200) for gpu in only}
    calibrated, _ = build_profile([CALIBRATED_H200_TABLES], gpu="h200-sxm-141gb", name=CALIBRATED_H200_PROFILE,
                                  fill=False, collectives=intra_collectives("h200-sxm-141gb"))
    # the datasheet profiles are scaled from the H200's fits as measured, before published terms join it
    out = {h200.gpu: with_published(h200), CALIBRATED_H200_PROFILE: with_published(calibrated)}
    for gpu in list_gpus():
        if gpu not in out and gpu not in SAME_COMPUTE_AT_TDP:
            out[gpu] = _datasheet_bundled(gpu, h200)
    for gpu, donor in CONV_CARRIED.items():
        out[gpu] = carried_conv(out[gpu], out[donor])
    for gpu, at_tdp in SAME_COMPUTE_AT_TDP.items():  # a power-capped GPU: its die's profile at TDP, clocked down
        out[gpu] = power_capped_profile(gpu, out[at_tdp])
    return out


def _datasheet_bundled(gpu: str, h200: Profile) -> Profile:
    """``gpu``'s bundled datasheet-scaled profile: the H200's fits scaled, its published kernels and seed tables fitted in."""
    return seeded(with_published(datasheet_profile(gpu, h200, collectives=intra_collectives(gpu))))


def seeded(profile: Profile) -> Profile:
    """``profile`` with the CNN classes its GPU's public benchmark table (:data:`SEED_TABLES`) fits,
    each a correction of that profile's own GEMM and copy fits; unchanged for other GPUs."""
    folder = SEED_TABLES.get(profile.gpu)
    if folder is None:
        return profile
    entries = fit_classes(read_compute_table(folder), profile, source=seeded_source(folder))
    return replace(profile, compute={**profile.compute, **entries},
                   meta={**profile.meta, "seeded_from": folder.name})


def seeded_source(folder: Path) -> str:
    """The source :func:`seeded` names on the classes it fits from ``folder``."""
    return f"measured (published): {folder.name}"


def carried_conv(profile: Profile, donor: Profile) -> Profile:
    """``profile`` with ``donor``'s convolution classes fitted on one kernel shape, in the dtypes ``profile``'s
    GPU computes in, in place of every ``conv.`` class datasheet scaling gave it (those describe the reference
    GPU's own cuDNN, in its dtypes). Each class's c is a ratio to the implicit GEMM, so here it multiplies
    this GPU's own GEMM fit: cuDNN's algorithm choice (Winograd for 3x3, lowering for 1x1) is assumed to cost
    the same relative to a GEMM on both GPUs. The donor's pooled kind entries are not carried (mostly 3x3
    Winograd rows); its pooled ``conv.dense-gemm`` and ``conv.dense-gemm-strided`` entries (the measured shapes
    no Winograd algorithm runs, at stride 1 and above) are, and price the shapes it did not measure one by one
    that Winograd cannot run either (1x7 at stride 1, 3x3 at stride 2 ...);
    the rest run at their implicit GEMM (c = 1, named by ``costs.cnn.unmeasured``)."""
    dtypes = set(load_gpu(profile.gpu).peak_flops)
    carried = {}
    for key, entry in donor.compute.items():
        hit = SHAPE_CLASS.match(key)
        if hit and hit["dtype"] in dtypes and entry.get("n_points"):
            carried[key] = {**entry, "source": f"carried from {donor.gpu} ({entry['source']}); "
                                               f"c over this GPU's own gemm:{hit['dtype']}"}
    kept = {k: v for k, v in profile.compute.items() if not k.startswith("conv.")}
    return replace(profile, compute={**kept, **carried}, meta={**profile.meta, "conv_carried_from": donor.gpu})


def refit_cnn_classes(profiles: dict) -> dict:
    """The bundled ``profiles`` (name -> Profile) whose CNN classes come from a public table, those classes fitted
    again against each profile's own GEMM and copy fits as bundled (the seeded GPUs' table entries replaced, the
    carried GPUs' taken anew from their donor); every other entry as it was."""
    out = {}
    for name, profile in profiles.items():
        if profile.gpu in SEED_TABLES and name == profile.gpu:
            table = seeded_source(SEED_TABLES[profile.gpu])  # the entries seeded() wrote: replaced
            own = {k: v for k, v in profile.compute.items() if v.get("source") != table}
            out[name] = seeded(replace(profile, compute=own))
    for gpu, donor in CONV_CARRIED.items():
        if gpu in profiles and donor in out:
            out[gpu] = carried_conv(profiles[gpu], out[donor])
    return out


def with_channel_ranges(profile: Profile) -> Profile:
    """``profile`` with the channel range (``fit.conv.channel_range``) recorded on each convolution class fitted
    on this project's H200 tables that lacks one, as bundled before ranges were kept (the datasheet-scaled and
    power-capped copies included: their source names the table); parameters unchanged."""
    ranges = _h200_channel_ranges()
    compute = dict(profile.compute)
    for key, entry in profile.compute.items():
        if not key.startswith("conv.") or "channels" in entry or "depthwise" in key:
            continue
        table = next((name for name in ranges if name in str(entry.get("source", ""))), None)
        if table is not None and key in ranges[table]:
            compute[key] = {"channels": ranges[table][key], **entry}
    return replace(profile, compute=compute)


@functools.cache
def _h200_channel_ranges() -> dict[str, dict]:
    """The channel ranges of the classes of each H200 table, by the table folder's name (read once)."""
    return {f.name: class_channel_ranges(read_compute_table(f)) for f in (CALIBRATED_H200_TABLES, BUNDLED_H200_TABLES)}


def _datasheet_gpu(name: str) -> str:
    """The catalog name of ``name``, refused where its bundled profile is not datasheet-scaled."""
    gpu = _gpu(name).name
    fitted = {REFERENCE_PROFILE, *SAME_COMPUTE_AT_TDP, *CONV_CARRIED}
    if gpu in fitted:
        raise InvalidInputError(f"'--only' takes a datasheet-scaled catalog GPU; {gpu!r} is built with the others "
                                f"(run without --only); not with --only: {', '.join(sorted(fitted))}")
    return gpu


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--cnn-classes", action="store_true",
                        help="refit only the CNN classes of the bundled profiles seeded from public tables "
                             "(and of the GPUs they are carried to), keeping every other entry as bundled")
    parser.add_argument("--only", action="append", metavar="GPU",
                        help="write only this datasheet-scaled catalog GPU's profile (repeatable): a GPU added to "
                             "the catalog gets its profile without the others being refitted")
    args = parser.parse_args(argv)
    PROFILES_DIR.mkdir(exist_ok=True)
    if args.cnn_classes:
        bundled = {p.stem: load_profile(p) for p in sorted(PROFILES_DIR.glob("*.json"))}
        profiles = {name: with_channel_ranges(p) for name, p in {**bundled, **refit_cnn_classes(bundled)}.items()}
    else:
        only = tuple(_datasheet_gpu(name) for name in args.only or ())
        profiles = bundled_profiles(only)
    for name, profile in profiles.items():
        profile.save(PROFILES_DIR / f"{name}.json")
        print(f"wrote {name}.json ({len(profile.compute)} compute classes)")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
