"""Jobs sharing one device: ``predict_shared(jobs, gpu, mode=...)``.

Each job is priced alone first (``perfmodel.predict``); its step splits into device seconds per
kernel class and free seconds (``perfmodel.analysis.load``). Sharing then stretches the device
part of every job by two factors, solved together as a fixed point (docs/contention.md):

- queueing: the device runs at most ``slots`` jobs at once (time-slicing: 1; MPS: all; a CPU:
  cores / threads per job). With p_j the fraction of its step job j has device work ready, job i
  finds n_i = 1 + sum_{j != i} p_j jobs ready and waits in proportion:
  Q_i = max(1, n_i / slots) * (1 + switch * min(1, max(0, n_i - slots)))  (processor sharing,
  Kleinrock 1967, with a context-switch loss per slice);
- interference: while i runs, each other ready job runs beside it with weight
  w_ij = p_j * min(1, (slots - 1) / (n_i - 1)); on a device of more parallel ``units`` than the
  slots the jobs get (a session's share of a shared host's cores) the others run on their own
  units a fraction f = slots / min(n_i, units) of the time, so w_ij = p_j * min(1,
  (min(n_i, units) - 1) * f / (n_i - 1)) (units = slots gives the first form); class a of i stretches by
  1 + sum_j w_ij * sum_b q_jb * I(a, b), q_jb the share of j's device time in class b and I the
  interference table (``perfmodel.analysis.interference``); other users' work (``foreign``, in
  jobs' worth, on a host shared with them) fills the units the jobs leave, U - 1 - sum_j w_ij
  beside i, busy a fraction min(1, foreign / (U - 1)), and stretches class a by I(a, other) there.

T'_i = free_i + Q_i * sum_a t_ia * stretch_ia, and p_i = (T'_i - free_i) / T'_i. ``"mig"`` instead
gives each job its own instance, priced by the scaled profile (``perfmodel.analysis.mig``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import numpy as np

from perfmodel.analysis import mig as migs
from perfmodel.analysis.interference import CLASSES, gpu_interference, load_interference
from perfmodel.analysis.load import job_load
from perfmodel.core.errors import InvalidInputError, UnsupportedError
from perfmodel.core.checks import check_choice
from perfmodel.hardware import as_cluster
from perfmodel.predict import default_profile, profile_for

MODES = ("time-slice", "mps", "mig")
ITERATIONS = 400
TOLERANCE = 1e-9


@dataclass(frozen=True)
class SharedJob:
    """One job's row: its step alone and shared (s), slowdown, device share, rate and memory."""

    name: str
    step_time: float
    solo_step_time: float
    slowdown: float
    gpu_share: float            # solo device seconds per second of sharing: the part of the device it gets
    tokens_per_second: float
    memory_bytes: float
    fits: bool                  # its own memory fits (under MIG: in its instance)
    instance: str = ""          # MIG profile, or "" when the device is shared whole


@dataclass(frozen=True)
class SharedPrediction:
    """The device shared by ``jobs``: rows, aggregate throughput and whether the memory fits."""

    mode: str
    device: str
    jobs: tuple
    throughput: float           # sum of solo/shared step ratios: 1.0 = one device's worth of solo work
    memory_bytes: float
    memory_capacity: float
    fits: bool
    interference: str

    def table(self):
        import pandas as pd

        return pd.DataFrame([j.__dict__ for j in self.jobs])

    def __repr__(self) -> str:
        rows = ", ".join(f"{j.name} x{j.slowdown:.2f}" for j in self.jobs)
        return (f"SharedPrediction({self.mode} on {self.device}: {rows}; throughput {self.throughput:.2f}, "
                f"memory {self.memory_bytes / 2**30:.1f} of {self.memory_capacity / 2**30:.0f} GiB"
                f"{'' if self.fits else ' (DOES NOT FIT)'})")


def solve_sharing(seconds, free, table, slots: float, switch: float, background: float = 0.0, *,
                  executed: bool = False, units: float | None = None, foreign: float = 0.0):
    """Shared step seconds of jobs with device ``seconds[i, class]`` and ``free[i]`` seconds.

    The fixed point of the module docstring, iterated with damping from the solo state.
    ``background``: other always-ready work on the device (e.g. other users' runnable threads on a
    CPU host), counted in the queue and in the slots it takes, not in the interference.
    ``executed=True`` returns ``(step, work)``, work = sum_a t_ia * stretch_ia: the device seconds
    a job executes per step (its CPU time on a CPU host), without the time it waits for a slot.
    ``units``: the device's parallel units (cores) when the jobs get fewer ``slots`` than that
    (other users' sessions take the rest); None: as many as the slots. ``foreign``: other users'
    runnable work beside the jobs (sessions or threads' worth), priced by the table's ``a|other``.
    """
    t = np.asarray(seconds, float)
    free = np.asarray(free, float)
    coeff = np.array([[table.coefficients.get(f"{a}|{b}", 0.0) for b in CLASSES] for a in CLASSES])
    device = t.sum(axis=1)
    q = np.divide(t, device[:, None], out=np.zeros_like(t), where=device[:, None] > 0)  # class shares
    mix = q @ coeff.T                            # [j, a] = sum_b q_jb I(a, b)
    other = np.array([table.coefficients.get(f"{a}|other", 0.0) for a in CLASSES])
    units = slots if units is None else max(float(units), slots)
    busy = min(1.0, max(float(foreign), 0.0) / (units - 1.0)) if units > 1.0 else 0.0  # a spare unit's foreign share
    step = free + device
    p = np.divide(device, step, out=np.zeros_like(device), where=step > 0)
    work = device
    for _ in range(ITERATIONS):
        others = p.sum() - p
        ready = 1.0 + others + background
        queue = np.maximum(1.0, ready / slots) * (1.0 + switch * np.clip(ready - slots, 0.0, 1.0))
        beside = _beside(others + background, slots, units)
        w = p[None, :] * np.minimum(1.0, beside)[:, None]
        np.fill_diagonal(w, 0.0)
        spare = np.maximum(units - 1.0 - w.sum(axis=1), 0.0) * busy  # foreign work's worth beside i
        stretch = 1.0 + w @ mix + spare[:, None] * other[None, :]  # 1 + sum_j w_ij sum_b q_jb I(a, b) + ...
        work = (t * stretch).sum(axis=1)
        shared_device = queue * work
        new_step = free + shared_device
        new_p = np.divide(shared_device, new_step, out=np.zeros_like(device), where=new_step > 0)
        done = np.max(np.abs(new_step - step)) <= TOLERANCE * max(float(np.max(new_step)), 1e-30)
        p, step = 0.5 * p + 0.5 * new_p, new_step
        if done:
            break
    return (step, work) if executed else step


def _beside(others, slots: float, units: float):
    """Jobs' worth running beside one running job, per other ready job (capped at 1): the others
    hold min(n, units) - 1 units besides its own, each busy a fraction slots / min(n, units)."""
    held = np.minimum(1.0 + others, units)
    running = np.maximum(held - 1.0, 0.0) * np.minimum(1.0, slots / held)
    return np.divide(running, others, out=np.ones_like(others), where=others > 0)


def predict_shared(jobs, gpu_or_cluster=None, mode: str = "time-slice", *, profile=None, interference=None,
                   mig_profile=None, slots: float | None = None, background_load: float = 0.0,
                   units: float | None = None) -> SharedPrediction:
    """Predict jobs co-located on one device (``mode``: "time-slice", "mps" or "mig").

    ``jobs``: Predictions, models, ``(model, strategy)`` or ``(model, strategy, label)``. ``mig_profile``:
    one MIG profile name for every job or a list, one per job (default: the equal split that holds them).
    ``slots``: jobs' worth the device runs at once (default: 1 time-sliced, all under MPS; on a CPU
    host, its cores over the threads per job; a session sharing a Linux host with others gets
    cores / (1 + other active sessions) under autogroup scheduling: ``perfmodel.fit.interference.host_slots``). ``interference``: a table, its JSON or a bundled name
    (default: on a CPU host "cpu"; on a GPU its measured table for ``mode`` where one is bundled,
    ``perfmodel.fit.gpu_interference``, else "gpu-default"; the result's ``interference`` names it).
    ``background_load``: other always-ready work sharing the device (runnable threads on a CPU host),
    in jobs' worth; the slowdowns are then against each job alone with that same load (it also slows
    a job it runs beside by the table's ``a|other``).
    ``units``: jobs' worth the device could run at once if it were all theirs (default: on a CPU host
    its cores over the threads per job, on a GPU the slots); where ``slots`` is less (a session's
    share of a host's cores), the jobs still run beside each other on their own units part of the
    time (``solve_sharing``), so their interference counts.
    """
    check_choice("mode", mode, MODES)
    cluster = as_cluster(gpu_or_cluster)
    jobs = list(jobs) if isinstance(jobs, (list, tuple)) else None
    if not jobs:
        raise InvalidInputError("'jobs' must be a non-empty list of Predictions, models or (model, strategy)")
    if mode == "mig":
        return _predict_mig(jobs, cluster, profile, mig_profile)
    if mig_profile is not None:
        raise InvalidInputError(f"'mig_profile' applies to mode='mig' only: got mode={mode!r}")
    prof = default_profile(cluster) if profile is None else profile_for(cluster, profile)
    on_cpu = bool(prof.host.get("serial"))
    if on_cpu and mode == "mps":
        raise UnsupportedError("mode='mps' shares a GPU between processes; on a CPU host processes share cores: "
                               "use mode='time-slice'")
    table = _shared_table(interference, on_cpu, cluster.gpu.name, mode)
    loads = [job_load(j, cluster, prof, launch_on_device=on_cpu) for j in jobs]
    cores = max((os.cpu_count() or 1) // cluster.gpu.sm_count, 1) if on_cpu else None  # one job per core's worth
    if slots is None:
        slots = cores if on_cpu else 1 if mode == "time-slice" else len(loads)
    _check_positive("slots", slots, "jobs' worth the device runs at once")
    units = cores if units is None else units
    if units is not None:
        _check_positive("units", units, "jobs' worth the device runs at once when all its units are theirs")
    seconds = [[ld.seconds[c] if (c != "launch" or on_cpu) else 0.0 for c in CLASSES] for ld in loads]
    if isinstance(background_load, bool) or not isinstance(background_load, (int, float)) or not background_load >= 0:
        raise InvalidInputError(f"'background_load' must be a number >= 0 (always-ready jobs): got {background_load!r}")
    switch = table.switch_fraction if (mode == "time-slice") else 0.0
    free = [ld.free_s for ld in loads]
    bg = float(background_load)
    shared = solve_sharing(seconds, free, table, float(slots), switch, bg, units=units, foreign=bg)
    alone = [float(solve_sharing([sec], [f], table, float(slots), switch, bg, units=units, foreign=bg)[0])
             / ld.step_s
             if background_load else 1.0 for sec, f, ld in zip(seconds, free, loads)]
    rows = tuple(_row(ld, float(s), float(sum(sec)), solo_s=ld.step_s * a)
                 for ld, s, sec, a in zip(loads, shared, seconds, alone))
    need = sum(ld.memory_bytes for ld in loads)
    cap = cluster.gpu.mem_bytes
    return SharedPrediction(mode, cluster.gpu.name, rows, float(sum(r.solo_step_time / r.step_time for r in rows)),
                            float(need), float(cap), bool(need <= cap), table.name)


def _shared_table(interference, on_cpu: bool, gpu: str, mode: str):
    """The given table, else a CPU host's own, else the GPU's measured one for ``mode``, else the bound."""
    if interference is None:
        interference = "cpu" if on_cpu else gpu_interference(gpu, mode)
    return load_interference(interference)


def _check_positive(name: str, value, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidInputError(f"{name!r} must be a number > 0 ({what}): got {value!r}")


def _row(ld, shared_s: float, device_s: float, instance: str = "", fits: bool | None = None,
         solo_s: float | None = None) -> SharedJob:
    p = ld.prediction
    solo = p.step_time if solo_s is None else solo_s  # alone (with the same background load)
    return SharedJob(ld.name, shared_s, solo, shared_s / solo, device_s / shared_s,
                     p.tokens_per_second * p.step_time / shared_s, ld.memory_bytes,
                     bool(p.fits if fits is None else fits), instance)


def _instances(gpu, n: int, mig_profile) -> list:
    if mig_profile is None:
        return [migs.equal_split(gpu, n)] * n
    names = [mig_profile] * n if isinstance(mig_profile, str) else list(mig_profile)
    if len(names) != n:
        raise InvalidInputError(f"'mig_profile' must be one name or one per job ({n}): got {len(names)}")
    chosen = [migs.mig_profile(gpu, name) for name in names]
    migs.check_layout(gpu, chosen)
    return chosen


def _predict_mig(jobs, cluster, profile, mig_profile) -> SharedPrediction:
    """Each job alone on its MIG instance: no interference (MIG isolates SMs, L2 and DRAM)."""
    if cluster.n_gpus != 1:
        raise UnsupportedError(f"mode='mig' splits one GPU: got a cluster of {cluster.n_gpus} GPUs")
    gpu = cluster.gpu
    chosen = _instances(gpu, len(jobs), mig_profile)
    whole = default_profile(cluster) if profile is None else profile_for(cluster, profile)
    rows = []
    for item, inst in zip(jobs, chosen):
        solo = job_load(item, cluster, whole)
        if solo.model is None:
            raise UnsupportedError(f"job {solo.name!r}: pricing it on a MIG instance needs its model, "
                                   "not only its Prediction; give (model, strategy)")
        on_slice = job_load((solo.model, solo.prediction.strategy, solo.name), migs.slice_cluster(gpu, inst),
                            migs.slice_profile(whole, gpu, inst))
        row = _row(solo, on_slice.step_s, 0.0, inst.name, fits=on_slice.prediction.fits)
        rows.append(replace(row, gpu_share=inst.sms / gpu.sm_count))  # its SMs, whether busy or not
    need = sum(r.memory_bytes for r in rows)
    return SharedPrediction("mig", gpu.name, tuple(rows), float(sum(r.solo_step_time / r.step_time for r in rows)),
                            float(need), float(gpu.mem_bytes), all(r.fits for r in rows), "none (isolated)")
