"""Multi-Instance GPU: a job on a MIG slice is priced by the GPU's profile scaled to the slice.

A MIG GPU instance owns whole compute slices (SMs) and whole memory slices (memory controllers,
L2 banks and DRAM), isolated from the other instances (NVIDIA MIG User Guide, "Partitioning").
So a slice is a smaller GPU: ``slice_gpu`` scales the GPU description (SMs, peak FLOP/s with
the SM count, memory bandwidth and capacity with the memory eighths) and ``slice_profile`` scales
the fitted profile the same way (GEMM and attention rates by the SM fraction with the SM count
their wave terms use, memory-bound seconds per byte by the bandwidth fraction), as
``perfmodel.fit.build.datasheet_profile`` scales one GPU's curves to another's datasheet.
The profile table is ``data/mig_profiles.csv`` (cited there).
"""

from __future__ import annotations

import copy
import csv
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from perfmodel.core.errors import InvalidInputError, UnsupportedError, unknown_name
from perfmodel.hardware import gpu_node
from perfmodel.hardware.node import Cluster

MIG_TABLE = Path(__file__).resolve().parent / "data" / "mig_profiles.csv"
MEMORY_SLICES = 8  # memory eighths per GPU (MIG User Guide, "Supported MIG Profiles")
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class MigProfile:
    """One MIG GPU-instance profile of one GPU: ``1g.10gb`` = 1 compute slice, 1/8 of the memory."""

    gpu: str
    name: str
    compute_slices: int
    memory_eighths: int
    sms: int
    max_instances: int

    @property
    def memory_fraction(self) -> float:
        return self.memory_eighths / MEMORY_SLICES


@cache
def _table() -> dict[str, dict[str, MigProfile]]:
    out: dict[str, dict[str, MigProfile]] = {}
    with MIG_TABLE.open() as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        for r in rows:
            p = MigProfile(r["gpu"], r["profile"], int(r["compute_slices"]), int(r["memory_eighths"]),
                           int(r["sms"]), int(r["max_instances"]))
            out.setdefault(p.gpu, {})[p.name] = p
    return out


def mig_profiles(gpu) -> dict[str, MigProfile]:
    """The MIG profiles of ``gpu`` (a GPU or its catalog name), by name, smallest first."""
    name = getattr(gpu, "name", gpu)
    table = _table()
    if name not in table:
        raise UnsupportedError(f"{name} has no MIG profile table (GPUs with MIG here: {', '.join(sorted(table))})")
    return table[name]


def mig_profile(gpu, name: str) -> MigProfile:
    """One profile by name, e.g. ``mig_profile("h100-sxm5-80gb", "1g.10gb")``."""
    known = mig_profiles(gpu)
    if name not in known:
        raise unknown_name(f"MIG profile of {getattr(gpu, 'name', gpu)}", name, known)
    return known[name]


def equal_split(gpu, n_jobs: int) -> MigProfile:
    """The largest profile of which ``n_jobs`` instances fit on one GPU (7 jobs on an H100: 1g.10gb).

    Among profiles with enough instances, the one with the most compute slices, then the most memory.
    """
    if n_jobs < 1:
        raise InvalidInputError(f"'jobs' must hold at least one job: got {n_jobs}")
    fits = [p for p in mig_profiles(gpu).values()
            if p.max_instances >= n_jobs and n_jobs * p.compute_slices <= COMPUTE_SLICES
            and n_jobs * p.memory_eighths <= MEMORY_SLICES]
    if not fits:
        most = max(p.max_instances for p in mig_profiles(gpu).values())
        raise UnsupportedError(f"{n_jobs} jobs do not fit in MIG instances of one {getattr(gpu, 'name', gpu)} "
                               f"(at most {most} instances)")
    return max(fits, key=lambda p: (p.compute_slices, p.memory_eighths))


def check_layout(gpu, chosen: list[MigProfile]) -> None:
    """Raise when the instances ``chosen`` cannot coexist on one GPU (slices or instance counts)."""
    name = getattr(gpu, "name", gpu)
    compute = sum(p.compute_slices for p in chosen)
    memory = sum(p.memory_eighths for p in chosen)
    if compute > COMPUTE_SLICES or memory > MEMORY_SLICES:
        listed = ", ".join(p.name for p in chosen)
        raise UnsupportedError(f"MIG instances {listed} need {compute}/7 compute and {memory}/8 memory slices "
                               f"of one {name}: more than the GPU has")
    for p in {q.name: q for q in chosen}.values():
        count = sum(q.name == p.name for q in chosen)
        if count > p.max_instances:
            raise UnsupportedError(f"{count} instances of {p.name} requested on one {name}: "
                                   f"at most {p.max_instances}")


def slice_gpu(gpu, mig: MigProfile):
    """The GPU description of one MIG instance: SMs, FLOP/s, bandwidth and memory of its slices."""
    sm = mig.sms / gpu.sm_count
    return replace(gpu, name=f"{gpu.name}-mig-{mig.name}", aliases=(),
                   peak_flops={k: v * sm for k, v in gpu.peak_flops.items()},
                   mem_bw_bytes_per_s=gpu.mem_bw_bytes_per_s * mig.memory_fraction,
                   mem_bytes=gpu.mem_bytes * mig.memory_fraction, sm_count=mig.sms,
                   l2_bytes=gpu.l2_bytes * mig.memory_fraction if gpu.l2_bytes else None,
                   nvlink_bw_bytes_per_s=None, nvlink=None,
                   description=f"MIG {mig.name} instance of {gpu.name}",
                   source=f"{gpu.name} scaled to MIG {mig.name} (NVIDIA MIG User Guide)")


def slice_profile(profile, gpu, mig: MigProfile):
    """``profile`` (of ``gpu``) scaled to a MIG instance; a new Profile, the loaded one untouched."""
    sm = mig.sms / gpu.sm_count
    bw = mig.memory_fraction
    compute: dict = {}
    for key, entry in profile.compute.items():
        entry = copy.deepcopy(entry)
        params = entry["params"]
        cls = key.split(":")[0]
        if cls in ("gemm", "sdpa"):  # compute-bound: rate with the SMs; wave terms see the slice's SM count
            for name in ("R", "R_mis"):
                if name in params:
                    params[name] *= sm
            if "sms" in params:
                params["sms"] = float(mig.sms)
            if "bw" in params:
                params["bw"] *= bw
        else:  # memory-bound and optimizer classes: seconds per byte grow as the bandwidth shrinks
            for name in ("beta", "beta_y", "beta_row"):
                if name in params:
                    params[name] /= bw
        entry["source"] = f"MIG {mig.name} scaling of {profile.name} ({entry.get('source', '')})"
        compute[key] = entry
    meta = {**copy.deepcopy(profile.meta), "derived_from": profile.name,
            "method": f"MIG {mig.name}: rates x {sm:.3f} (SMs {mig.sms}/{gpu.sm_count}), bandwidth x {bw:.3f}"}
    return replace(profile, name=f"{profile.name} (MIG {mig.name})", gpu=slice_gpu(gpu, mig).name,
                   compute=compute, collectives={}, host=copy.deepcopy(profile.host), meta=meta)


def slice_cluster(gpu, mig: MigProfile):
    """A one-GPU cluster whose GPU is the MIG instance."""
    return Cluster(node=gpu_node(slice_gpu(gpu, mig), 1), nodes=1)
