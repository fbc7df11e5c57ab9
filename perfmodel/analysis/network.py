"""Jobs sharing a cluster's network: ``predict_cluster(jobs_with_placements, cluster)``.

Each job is priced alone on its own nodes (``perfmodel.predict``); its step is then a periodic
timeline of a compute phase and an inter-node communication phase (the exposed data-parallel
communication, pipeline sends and, when a TP group spans nodes, tensor-parallel communication of
its prediction), during which it drives every link on its
route at its solo rate. Links: each node's NICs, and, where racks are given, each rack's uplink
(``nodes_per_rack`` x a node's NIC bandwidth / ``oversubscription``); a job spanning racks crosses
each of its racks' uplinks once (a ring over its nodes in rack order). When phases overlap, links
are shared max-min fairly (progressive filling, Bertsekas & Gallager, Data Networks, §6.5.2) and
an event simulation advances every job through its phases. ``offsets`` starts jobs out of phase;
``search_offsets=True`` tries a grid of them and reports the gain (CASSINI, Rajasekaran et al.,
NSDI 2024: interleave the communication phases of jobs that share links).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from perfmodel.core.errors import InvalidInputError, UnsupportedError
from perfmodel.analysis.load import as_job
from perfmodel.hardware import as_cluster, part_of_node
from perfmodel.hardware.node import Cluster
from perfmodel.predict import predict

STEPS = 24          # simulated steps of the slowest job; the first WARMUP are dropped
WARMUP = 4
OFFSET_GRID = 8     # offsets tried per job (fractions of its step) by search_offsets
EPS = 1e-12


@dataclass(frozen=True)
class Phases:
    """One job's periodic step: ``compute_s`` then ``comm_s`` at ``rate`` (share of a link) on ``links``."""

    name: str
    compute_s: float
    comm_s: float
    rate: float
    links: tuple


@dataclass(frozen=True)
class ClusterJob:
    name: str
    nodes: tuple
    step_time: float
    solo_step_time: float
    slowdown: float
    comm_s: float
    offset_s: float


@dataclass(frozen=True)
class ClusterPrediction:
    """Rows per job, the hottest links (name, busy fraction), and the gain of offsetting phases."""

    jobs: tuple
    hottest_links: tuple
    offsets_s: tuple
    aligned_slowdowns: tuple  # all jobs started together (offsets 0)
    gain: float               # mean slowdown started together / with the offsets used

    def table(self):
        import pandas as pd

        return pd.DataFrame([j.__dict__ for j in self.jobs])

    def __repr__(self) -> str:
        rows = ", ".join(f"{j.name} x{j.slowdown:.2f}" for j in self.jobs)
        hot = ", ".join(f"{n} {u:.0%}" for n, u in self.hottest_links[:3])
        return f"ClusterPrediction({rows}; hottest: {hot}; offset gain x{self.gain:.2f})"


def max_min_rates(flows: list[Phases], capacity: dict) -> np.ndarray:
    """Max-min fair rates of ``flows`` (each capped at its own ``rate``) over links of ``capacity``."""
    rate = np.zeros(len(flows))
    frozen = np.zeros(len(flows), bool)
    left = dict(capacity)
    while not frozen.all():
        share = {ln: left[ln] / n for ln in left
                 if (n := sum(1 for f, fr in zip(flows, frozen) if not fr and ln in f.links)) > 0}
        step = min([share[ln] for ln in share] + [f.rate - r for f, r, fr in zip(flows, rate, frozen) if not fr])
        for i, f in enumerate(flows):
            if not frozen[i]:
                rate[i] += step
                for ln in f.links:
                    left[ln] -= step
        for i, f in enumerate(flows):
            if not frozen[i] and (rate[i] >= f.rate - EPS or any(left[ln] <= EPS for ln in f.links)):
                frozen[i] = True
    return rate


def simulate(jobs: list[Phases], capacity: dict, offsets=None, *, steps: int = STEPS, warmup: int = WARMUP):
    """(mean step seconds per job after ``warmup`` steps, busy fraction per link) of the periodic jobs."""
    n = len(jobs)
    offsets = np.zeros(n) if offsets is None else np.asarray(offsets, float)
    phase = np.zeros(n, int)            # 0: waiting for its offset, 1: compute, 2: comm
    left = offsets.copy()               # seconds (phases 0, 1) or solo-rate seconds of comm (phase 2)
    t = 0.0
    ends: list[list[float]] = [[] for _ in range(n)]
    busy = dict.fromkeys(capacity, 0.0)
    while min(len(e) for e in ends) < steps:
        comm = [i for i in range(n) if phase[i] == 2]
        rates = np.ones(n)
        if comm:
            r = max_min_rates([jobs[i] for i in comm], capacity)
            for i, ri in zip(comm, r):
                rates[i] = ri / jobs[i].rate    # progress in solo-rate seconds per second
        dt = min(left[i] / rates[i] if rates[i] > EPS else np.inf for i in range(n))
        for i, ri in zip(comm, r if comm else []):
            for ln in jobs[i].links:
                busy[ln] += ri * dt / capacity[ln]
        t += dt
        for i in range(n):
            left[i] -= rates[i] * dt
            if left[i] <= EPS * max(1.0, t):
                phase[i], left[i] = _next(jobs[i], phase[i], t, ends[i])
    starts = [e[warmup - 1] if warmup else offsets[i] for i, e in enumerate(ends)]
    mean = np.array([(e[steps - 1] - s) / (steps - warmup) for e, s in zip(ends, starts)])
    return mean, {ln: b / t for ln, b in busy.items()}


def _next(job: Phases, phase: int, t: float, ends: list) -> tuple[int, float]:
    """The phase after ``phase`` ends at ``t`` (a finished comm phase ends a step)."""
    if phase == 1 and job.comm_s > EPS:
        return 2, job.comm_s
    if phase >= 1:
        ends.append(t)
    return 1, job.compute_s if job.compute_s > EPS else EPS


def _placed(item, cluster):
    """(job item, node indices) of ``(model, strategy, nodes)``, ``(model, strategy, nodes, label)`` or
    ``(Prediction-or-model, nodes)``."""
    if not isinstance(item, tuple) or len(item) not in (2, 3, 4):
        raise InvalidInputError("each placed job must be (model, strategy, nodes[, label]) or (job, nodes): "
                                f"got {item!r}")
    nodes = item[1] if len(item) == 2 else item[2]
    job = item[0] if len(item) == 2 else (item[0], item[1]) + tuple(item[3:])
    nodes = (nodes,) if isinstance(nodes, int) else tuple(nodes)
    if not nodes or any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 0 <= x < cluster.nodes
                        for x in nodes) or len(set(nodes)) != len(nodes):
        raise InvalidInputError(f"'nodes' must be distinct node indices in 0..{cluster.nodes - 1}: got {nodes!r}")
    return job, tuple(int(x) for x in nodes)


def _job_phases(job, nodes, cluster, profile, racks):
    """The job priced alone on its nodes and its phases on the shared links."""
    model, s, label, given = as_job(job, Cluster(node=cluster.node, nodes=len(nodes)))
    per_node = s.gpus // len(nodes)
    if per_node * len(nodes) != s.gpus or per_node > cluster.gpus_per_node:
        raise InvalidInputError(f"job {label!r}: {s.gpus} GPUs do not spread evenly over {len(nodes)} node(s) "
                                f"of {cluster.gpus_per_node} GPUs")
    own = Cluster(node=part_of_node(cluster.node, per_node), nodes=len(nodes))
    p = given if given is not None else predict(model, own, s, profile=profile)
    comm = (p.breakdown["dp_comm"] + p.breakdown["p2p"] + _tp_across_nodes(p, s, per_node)) if len(nodes) > 1 else 0.0
    links = tuple(f"node{n}.nic" for n in nodes)
    spanned = sorted({n // racks for n in nodes}) if racks else []
    if len(spanned) > 1:
        links += tuple(f"rack{r}.uplink" for r in spanned)
    rate = own.node.nics_per_node / cluster.node.nics_per_node  # its share of a node's NICs
    return label, p, Phases(label, max(p.step_time - comm, 0.0), comm, rate, links)


def _tp_across_nodes(p, s, per_node: int) -> float:
    """Tensor-parallel seconds that cross the NICs: all of them when a TP group is wider than the
    GPUs the job has on a node (ranks are numbered TP-innermost, Megatron-LM's order, so a group
    that fits stays on one node's NVLink/NVSwitch, which jobs on other GPUs do not share)."""
    return float(p.breakdown.get("tp_comm", 0.0)) if s.tp > per_node else 0.0


def _capacities(cluster, nodes_per_rack, oversubscription) -> dict:
    cap = {f"node{n}.nic": 1.0 for n in range(cluster.nodes)}  # in units of one node's NIC bandwidth
    if nodes_per_rack:
        for r in range(-(-cluster.nodes // nodes_per_rack)):
            cap[f"rack{r}.uplink"] = nodes_per_rack / oversubscription
    return cap


def predict_cluster(jobs_with_placements, cluster, *, profile=None, offsets=None, search_offsets: bool = False,
                    nodes_per_rack: int | None = None, oversubscription: float = 1.0) -> ClusterPrediction:
    """Predict jobs placed on nodes of one ``cluster`` sharing its NICs and rack uplinks.

    ``jobs_with_placements``: ``(model, strategy, nodes)`` / ``(job, nodes)``, nodes a list of node
    indices (a job's GPUs spread evenly over them). ``offsets``: seconds each job starts after the
    first; ``search_offsets``: choose offsets on a grid (the first job fixed at 0) for the lowest mean
    slowdown. ``nodes_per_rack`` with ``oversubscription``: rack uplinks of nodes_per_rack NICs' worth / it.
    """
    cluster = as_cluster(cluster)
    items = list(jobs_with_placements) if isinstance(jobs_with_placements, (list, tuple)) else []
    if not items:
        raise InvalidInputError("'jobs_with_placements' must be a non-empty list of (model, strategy, nodes)")
    if nodes_per_rack is not None and (not isinstance(nodes_per_rack, int) or nodes_per_rack < 1):
        raise InvalidInputError(f"'nodes_per_rack' must be an integer >= 1: got {nodes_per_rack!r}")
    if not isinstance(oversubscription, (int, float)) or not oversubscription >= 1:
        raise InvalidInputError(f"'oversubscription' must be a number >= 1 (1: non-blocking): got {oversubscription!r}")
    placed = [_placed(it, cluster) for it in items]
    _check_gpus(placed, cluster)
    priced = [_job_phases(job, nodes, cluster, profile, nodes_per_rack) for job, nodes in placed]
    phases = [ph for _, _, ph in priced]
    cap = _capacities(cluster, nodes_per_rack, oversubscription)
    solo = np.array([p.step_time for _, p, _ in priced])
    aligned, busy = simulate(phases, cap)
    used = np.zeros(len(phases)) if offsets is None else _check_offsets(offsets, len(phases))
    if search_offsets:
        used = _best_offsets(phases, cap, solo)
    shared, busy = (aligned, busy) if not used.any() else simulate(phases, cap, used)
    shared = np.maximum(shared, solo)  # sharing never speeds a job up (rounding of the simulation)
    rows = tuple(ClusterJob(name, nodes, float(t), float(s0), float(t / s0), ph.comm_s, float(o))
                 for (name, _, ph), (_, nodes), t, s0, o in zip(priced, placed, shared, solo, used))
    hot = tuple(sorted(((ln, float(u)) for ln, u in busy.items() if u > 0), key=lambda x: -x[1]))
    aligned_slow = np.maximum(aligned, solo) / solo
    return ClusterPrediction(rows, hot, tuple(float(o) for o in used), tuple(float(x) for x in aligned_slow),
                             float(aligned_slow.mean() / np.mean([r.slowdown for r in rows])))


def _check_gpus(placed, cluster) -> None:
    for job, _ in placed:
        as_job(job, cluster)  # names and strategies checked before any pricing
    counts = {}
    for job, nodes in placed:
        _, s, label, _ = as_job(job, cluster)
        for n in nodes:
            counts[n] = counts.get(n, 0) + s.gpus // len(nodes)
    over = {n: c for n, c in counts.items() if c > cluster.gpus_per_node}
    if over:
        raise UnsupportedError(f"jobs need more GPUs than nodes {sorted(over)} have ({cluster.gpus_per_node} each): "
                               "predict_cluster shares the network; share GPUs with predict_shared")


def _check_offsets(offsets, n: int) -> np.ndarray:
    arr = np.asarray(offsets, float) if isinstance(offsets, (list, tuple, np.ndarray)) else None
    if arr is None or arr.shape != (n,) or not np.all(np.isfinite(arr)) or np.any(arr < 0):
        raise InvalidInputError(f"'offsets' must be {n} seconds >= 0, one per job: got {offsets!r}")
    return arr


def _best_offsets(phases, cap, solo) -> np.ndarray:
    """Coordinate search: each job after the first tries OFFSET_GRID offsets over its step."""
    best = np.zeros(len(phases))
    best_score = float(np.mean(np.maximum(simulate(phases, cap, best)[0], solo) / solo))
    for i in range(1, len(phases)):
        for k in range(1, OFFSET_GRID):
            trial = best.copy()
            trial[i] = solo[i] * k / OFFSET_GRID
            score = float(np.mean(np.maximum(simulate(phases, cap, trial)[0], solo) / solo))
            if score < best_score - 1e-9:
                best, best_score = trial, score
    return best
