"""This CPU host as perfmodel hardware: a "GPU" of ``threads`` cores, and a node of several.

The predictor prices devices; on a machine without a GPU the device is the
CPU, running one training process with ``threads`` torch threads. Its
description is measured, not looked up: peak fp32 FLOP/s is the fastest GEMM
rate of the calibration table, memory bandwidth the median rate of the large
(>= 32 MiB moved) copy/add rows, memory the host's RAM, ``sm_count`` the
threads. Processes on the host talk through gloo over loopback TCP; the node's
``intra`` link (kind "pcie": the catalog's only non-NVLink kind inside a node) carries the bus bandwidth and latency of an alpha-beta fit
(nccl-tests doc/PERFORMANCE.md terms) to the measured all_reduce rows.

The fitter needs 4 points per class; classes with 1-3 points (the quick
calibration grid has one shape per memory-bound op) are priced here from
their own points by ``few_point_entries``: t = t_launch + x · median((t_i -
t_launch) / x_i), marked as such in each entry's ``source``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import copy
from pathlib import Path

import numpy as np
import pandas as pd

from perfmodel.core.errors import InvalidInputError
from perfmodel.costs.comm import BUSBW_FACTOR
from perfmodel.fit.comm import fit_params
from perfmodel.fit.compute import MEM_OPS, mem_elements, without_autograd_call
from perfmodel.fit.overhead import fit_step_overhead
from perfmodel.fit.tables import twin_rows
from perfmodel.profiles.profile import Profile

LARGE_MOVE_BYTES = 32 * 2**20  # beyond the last-level cache of a typical server core
LAUNCH_FALLBACK_S = 5e-6


def _toml_str(text: str) -> str:
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def host_figures(table: pd.DataFrame) -> dict:
    """Peak fp32 FLOP/s and memory bandwidth (bytes/s) measured in a CPU ``compute.csv``."""
    gemm = table[(table.op == "gemm") & (table.dtype == "fp32") & (table.time_s > 0)]
    if gemm.empty:
        raise InvalidInputError("the compute table has no fp32 GEMM rows: cannot describe the host's FLOP/s")
    rate = 2 * gemm.m * gemm.n * gemm.k / gemm.time_s
    raw = table[table.op.isin(["copy", "add"]) & (table.time_s > 0)]
    big = raw[raw["bytes"] >= LARGE_MOVE_BYTES]
    rows = big if len(big) else raw
    if rows.empty:
        raise InvalidInputError("the compute table has no copy/add rows: cannot describe the host's bandwidth")
    return {"peak_fp32_flops": float(rate.max()), "mem_bw_bytes_per_s": float((rows["bytes"] / rows.time_s).median()),
            "gemm_rows": len(gemm), "bandwidth_rows": len(rows)}


def write_host_gpu(path: str | Path, table: pd.DataFrame, meta: dict, threads: int, *, note: str = "") -> Path:
    """Write the host-as-a-GPU TOML (perfmodel/hardware format) and return its path."""
    fig = host_figures(table)
    memory = meta.get("memory_bytes") or 8 * 2**30
    cpu = meta.get("cpu_model") or meta.get("device_name") or "CPU"
    lines = [
        f"# {cpu}: one training process with {threads} torch thread(s), measured by the calibration table",
        f"name = {_toml_str(Path(path).stem)}",
        f"description = {_toml_str(f'{cpu}, {threads} thread(s) per process (CPU host as a device){note}')}",
        f"source = {_toml_str('measured by calibration.compute on ' + str(meta.get('date', 'an unknown date')))}",
        f'memory_bandwidth = "{fig["mem_bw_bytes_per_s"]:.6g}B/s"',
        f'memory = "{int(memory)}B"',
        f"sm_count = {int(threads)}",
        "speed_spread = 0",
        "",
        "[peak_flops]",
        f'fp32 = "{fig["peak_fp32_flops"]:.6g}FLOPS"',
        "",
        "[sources]",
        f'peak_flops = "fastest fp32 GEMM of {fig["gemm_rows"]} measured (compute.csv)"',
        f'memory_bandwidth = "median of {fig["bandwidth_rows"]} copy/add rows moving >= 32 MiB (compute.csv)"',
        'memory = "host RAM (metadata.json memory_bytes)"',
        'sm_count = "torch threads per process"',
        'speed_spread = "the processes share one host\'s cores: no fleet of devices to wait for"',
    ]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path


def loopback_link(collectives: pd.DataFrame) -> dict:
    """Bus bandwidth (bytes/s) and latency (s) of an alpha-beta fit to the all_reduce rows."""
    rows = collectives[(collectives.collective == "all_reduce") & (collectives.time_s > 0)]
    if rows["size_bytes"].nunique() < 2:
        raise InvalidInputError("collectives.csv needs all_reduce rows of at least 2 sizes to describe the link")
    n = rows.group_size.to_numpy(float)
    p = fit_params("comm_alpha_beta", rows.size_bytes.to_numpy(float), n, BUSBW_FACTOR["all_reduce"](n),
                   rows.time_s.to_numpy(float))
    return {"busbw_bytes_per_s": p["busbw_bytes_per_s"], "latency_s": p["alpha_s"],
            "sizes": [float(rows.size_bytes.min()), float(rows.size_bytes.max())]}


def write_host_node(path: str | Path, gpu_toml: Path, link: dict, procs: int) -> Path:
    """A node TOML: ``procs`` host devices joined by the measured loopback link."""
    lo, hi = link["sizes"]
    lines = [
        "# processes on one host, gloo over loopback TCP; link fitted to measured all_reduce",
        f"name = {_toml_str(Path(path).stem)}",
        f"gpu = {_toml_str(gpu_toml.name)}",
        f"gpus_per_node = {int(procs)}",
        "",
        "[intra]",
        'kind = "pcie"  # intra links may be nvlink, nvswitch or pcie; this one is host memory',
        'description = "gloo over loopback TCP between processes of one host"',
        f'bandwidth = "{link["busbw_bytes_per_s"]:.6g}B/s"',
        f'nccl_busbw = "{link["busbw_bytes_per_s"]:.6g}B/s"',
        f'latency = "{link["latency_s"] * 1e6:.6g}us"',
        f'source = "measured: alpha-beta fit to all_reduce rows of {lo:.0f}-{hi:.0f} bytes (collectives.csv)"',
    ]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path


def _launch_s(table: pd.DataFrame) -> float:
    tiny = table[table.op.isin(["launch_add", "launch_mm"]) & (table.time_s > 0)]
    return float(tiny.time_s.min()) if len(tiny) else LAUNCH_FALLBACK_S


SHAPE_COLUMNS = ("tokens", "hidden", "vocab", "batch", "heads", "seq", "head_dim")


def few_point_entries(profile, table: pd.DataFrame) -> dict:
    """Entries for memory-bound classes the fitter skipped (1-3 points), from their own points.

    Backward = the forward+backward row minus the forward row of the same shape and minus the
    autograd engine's per-call cost (``host["autograd_call_s"]``).
    """
    table = without_autograd_call(table, profile.host.get("autograd_call_s", 0.0))
    launch = _launch_s(table)
    out = {}
    for (op, dtype), sub in table[table.op.isin(MEM_OPS) & (table.time_s > 0)].groupby(["op", "dtype"]):
        fwd = sub[sub.phase == "fwd"]
        key = f"{op}:{dtype}"
        if f"{key}:fwd" not in profile.compute and len(fwd):
            out[f"{key}:fwd"] = _per_element(mem_elements(fwd), fwd.time_s.to_numpy(float), launch)
        pairs = sub[sub.phase == "fwdbwd"].merge(fwd[[*SHAPE_COLUMNS, "time_s"]], on=list(SHAPE_COLUMNS),
                                                 suffixes=("", "_fwd"))
        rest = (pairs.time_s - pairs.time_s_fwd).to_numpy(float)
        if f"{key}:bwd" not in profile.compute and (rest > 0).any():
            good = pairs[rest > 0]
            out[f"{key}:bwd"] = _per_element(mem_elements(good), rest[rest > 0], launch)
    return out


def _per_element(x: np.ndarray, t: np.ndarray, launch: float) -> dict:
    n = len(t)
    beta = float(np.median(np.maximum(t - launch, 1e-12) / x))
    return {"form": "mem_affine", "params": {"t0": launch, "beta": beta, "t_cpu": launch}, "cv_mape": None,
            "n_points": n, "source": f"few-point estimate: per-element time of {n} point(s) "
                                     "(below the fitter's 4), launch cost as the CPU floor"}


def complete_profile(profile, table: pd.DataFrame, gpu=None):
    """``profile`` plus few-point entries for the classes its fit skipped (listed in meta).

    Also ``gemm:bf16`` as an alias of ``gemm:fp32`` when the host has no bf16
    GEMM: attention measured in fp32 is then priced as measured (the cost
    model rescales fp32 attention by the bf16/fp32 GEMM rate ratio, which is
    1 here). The host description lists no bf16 peak, so no bf16 step is priced.
    """
    extra = few_point_entries(profile, table)
    if "gemm:bf16" not in profile.compute and "gemm:fp32" in profile.compute:
        alias = copy.deepcopy(profile.compute["gemm:fp32"])
        alias["source"] = "alias of gemm:fp32 (no bf16 on this host; keeps fp32 attention as measured)"
        extra["gemm:bf16"] = alias
    compute = {**copy.deepcopy(profile.compute), **extra}
    meta = {**profile.meta, "few_point_classes": sorted(k for k in extra if not k.startswith("gemm:")),
            "aliased_classes": sorted(k for k in extra if k.startswith("gemm:"))}
    done = Profile(profile.name, profile.gpu, compute, profile.collectives, dict(profile.host), meta)
    if gpu is not None and "cpu_extra_per_kernel_s" not in done.host:  # needed the classes added here
        done = replace(done, host={**done.host, **fit_step_overhead(done, table, gpu)})
    return done


def side_by_side_factor(alone: pd.DataFrame, shared: list[pd.DataFrame]) -> dict:
    """How much slower a step runs while the host's other processes compute at once.

    Σ time side by side / Σ time alone over the same measurements of every
    side-by-side table: the whole tiny training steps (``train_step`` rows) when
    the tables have them, else every matched row. A ratio of sums weighs the
    longer steps, whose timings are steadier (the 1-block step's ratio ranged
    0.72-0.88 in one calibration where the whole ratio was 0.99-1.00). Returned
    as host fields (``side_by_side_factor`` and its source). One ratio of many
    rows is far steadier than a second profile fitted to the side-by-side tables
    alone, whose own fitting noise (its in-step factor moved 1.03-1.39 between
    calibrations of this kind) would land in every multi-process prediction.
    """
    pairs = []
    for table in shared:
        both = twin_rows(alone, table, suffix="_shared")
        pairs.append(both[(both.time_s > 0) & (both.time_s_shared > 0)])
    both = pd.concat(pairs, ignore_index=True) if pairs else pd.DataFrame()
    if both.empty:
        raise InvalidInputError("the side-by-side tables share no measurement with the table measured alone: "
                                "cannot tell how much the processes slow each other")
    steps = both[both.op == "train_step"]
    rows = f"{len(steps)} train_step rows" if len(steps) else f"{len(both)} matched rows"
    used = steps if len(steps) else both
    return {"side_by_side_factor": float(used.time_s_shared.sum() / used.time_s.sum()),
            "side_by_side_source": f"sum of times side by side / alone over {rows} "
                                   f"of {len(shared)} side-by-side table(s)"}


@dataclass(frozen=True)
class Host:
    """A calibrated CPU host: what one process alone runs on, and what processes side by side run on.

    ``gpu``/``profile``: the host as one device with the machine to itself.
    ``node``/``shared_profile``: ``procs`` devices joined by the measured gloo
    loopback link; the profile is the lone one scaled by how much slower the
    processes run side by side (cores, caches and memory bandwidth are shared
    on a CPU, unlike GPUs), with the DDP per-bucket cost.
    """

    gpu: Path
    profile: Path
    node: Path
    shared_profile: Path
    notes: tuple = ()

    @classmethod
    def from_folder(cls, folder: str | Path) -> Host:
        """The host a calibrating run wrote into ``folder`` (or the folder of its profile.json)."""
        folder = Path(folder)
        folder = folder.parent if folder.suffix == ".json" else folder
        files = {k: folder / v for k, v in HOST_FILES.items()}
        missing = [str(p) for p in files.values() if not p.is_file()]
        if missing:
            raise InvalidInputError(f"{folder} is not a calibrated host folder: missing {', '.join(missing)} "
                                    "(run perfmodel validate without --profile to calibrate one)")
        return cls(**files)


HOST_FILES = {"gpu": "cpu-host.toml", "profile": "profile.json", "node": "cpu-host-node.toml",
              "shared_profile": "profile-shared.json"}


def speed_drift(calibrated: pd.DataFrame, again: pd.DataFrame) -> float:
    """How far this host's speed moved since calibration: Σ time now / Σ time then - 1 over the whole
    tiny training steps (``train_step`` rows) both tables timed; negative: faster now.

    A CPU host's speed drifts (the same step measured 13.5-22.4 ms over one day on a 2-core machine,
    docs/validation.md) with load no process list shows, e.g. another guest on the same physical cores;
    re-timing the steps after the runs tells whether calibration and runs saw one machine.
    """
    both = twin_rows(calibrated, again, suffix="_again")
    both = both[(both.op == "train_step") & (both.time_s > 0) & (both.time_s_again > 0)]
    if both.empty:
        raise InvalidInputError("the re-timed table shares no train_step row with the calibration table: "
                                "cannot tell whether this host's speed moved")
    return float(both.time_s_again.sum() / both.time_s.sum() - 1.0)


def _cpu_seconds() -> tuple[float, float] | None:
    """(busy CPU seconds of the whole machine, CPU seconds of this process and its waited-for children)."""
    import os
    import resource

    try:
        with open("/proc/stat") as f:
            ticks = [float(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0.0)  # idle + iowait
    busy = (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")  # user..steal; guest time is inside user
    own = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    return busy, own


class OtherLoad:
    """Share of the machine's CPU time that other processes used while the block ran (Linux).

        with OtherLoad() as load:
            ...                       # run subprocesses and wait for them
        load.fraction                 # 0.0 on a quiet machine; None where /proc/stat is missing

    Busy time comes from ``/proc/stat`` (steal included: a hypervisor's other
    guests); this process's and its children's from ``getrusage``.
    """

    def __enter__(self) -> OtherLoad:
        import os
        import time

        self.fraction, self.wall = None, 0.0
        self._t0, self._start, self._cores = time.monotonic(), _cpu_seconds(), os.cpu_count() or 1
        return self

    def __exit__(self, *exc) -> None:
        import time

        end = _cpu_seconds()
        wall = self.wall = time.monotonic() - self._t0
        if self._start is None or end is None or wall <= 0:
            return
        other = (end[0] - self._start[0]) - (end[1] - self._start[1])
        self.fraction = float(min(max(other / (wall * self._cores), 0.0), 1.0))
