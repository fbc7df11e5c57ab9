"""Packing advice: which jobs to co-locate on which GPUs, and which placement on a cluster's nodes.

``advise_packing(jobs, cluster)`` tries every way of grouping single-GPU jobs onto the cluster's
GPUs (set partitions into at most n_gpus groups), each group under each sharing mode
(``predict_shared``), and ranks the choices by total throughput (sum of solo/shared step ratios:
jobs' worth of solo progress per unit time) or by the slowest job's completion time (its steps x
its shared step). ``rank_placements(candidates, cluster)`` ranks alternative node placements of
multi-node jobs by the same objectives under network sharing (``predict_cluster``).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.parallel.strategy import fill_dp
from perfmodel.core.errors import InfeasibleError, InvalidInputError, PerfModelError, UnsupportedError
from perfmodel.core.checks import check_choice
from perfmodel.analysis.contention import MODES, predict_shared
from perfmodel.analysis.load import as_job
from perfmodel.analysis.network import predict_cluster
from perfmodel.hardware import as_cluster, part_of_node
from perfmodel.hardware.node import Cluster

OBJECTIVES = ("throughput", "slowest")
MAX_JOBS = 7  # Bell(7) = 877 groupings: priced in seconds; beyond, the count explodes


@dataclass(frozen=True)
class PackingChoice:
    """One grouping: job names per GPU, the mode of each GPU, and its scores."""

    groups: tuple
    modes: tuple
    throughput: float
    slowest_s: float          # the latest completion (steps x shared step) over all jobs
    shared: tuple             # the SharedPrediction of each GPU


def _partitions(items: list, most: int):
    """Set partitions of ``items`` into at most ``most`` blocks."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest, most):
        for i in range(len(part)):
            yield part[:i] + [[first] + part[i]] + part[i + 1:]
        if len(part) < most:
            yield [[first]] + part


def _score(shared, steps, names):
    done = max(steps[names.index(j.name)] * j.step_time for j in shared.jobs)
    return shared.throughput, done


def advise_packing(jobs, cluster, *, objective: str = "throughput", modes=("time-slice", "mps", "mig"),
                   steps=None, profile=None, top: int = 10) -> list[PackingChoice]:
    """Rank groupings of single-GPU ``jobs`` on ``cluster``'s GPUs (best first).

    ``jobs``: ``(model, strategy, label)`` with distinct labels (or models / ``(model, strategy)``);
    ``steps``: steps each job must run (default 1 each) for the completion times.
    """
    check_choice("objective", objective, OBJECTIVES)
    for m in modes:
        check_choice("mode", m, MODES)
    cluster = as_cluster(cluster)
    jobs = list(jobs)
    if not 1 <= len(jobs) <= MAX_JOBS:
        raise UnsupportedError(f"advise_packing ranks 1 to {MAX_JOBS} jobs: got {len(jobs)}")
    gpu = Cluster(node=part_of_node(cluster.node, 1), nodes=1)
    names = [as_job(j, gpu)[2] for j in jobs]
    if len(set(names)) != len(names):
        raise InvalidInputError(f"jobs need distinct labels (give (model, strategy, label)): got {names}")
    for j, name in zip(jobs, names):
        if fill_dp(as_job(j, gpu)[1], 1).gpus != 1:
            raise UnsupportedError(f"job {name!r} uses several GPUs: advise_packing groups single-GPU jobs")
    steps = [1] * len(jobs) if steps is None else list(steps)
    if len(steps) != len(jobs) or any(not isinstance(s, int) or s < 1 for s in steps):
        raise InvalidInputError(f"'steps' must hold one integer >= 1 per job ({len(jobs)}): got {steps!r}")
    cache: dict = {}

    def best_mode(group):
        key = tuple(group)
        if key not in cache:
            options = []
            for m in (modes if len(group) > 1 else ("time-slice",)):
                try:
                    r = predict_shared([jobs[i] for i in group], gpu, mode=m, profile=profile)
                except PerfModelError:  # a mode that cannot hold the group (MIG instances, no table)
                    continue
                if r.fits:
                    options.append((r, *_score(r, steps, names)))
            pick = (lambda o: -o[1]) if objective == "throughput" else (lambda o: o[2])
            cache[key] = min(options, key=pick) if options else None
        return cache[key]

    choices = []
    for part in _partitions(list(range(len(jobs))), cluster.n_gpus):
        picked = [best_mode(g) for g in part]
        if any(p is None for p in picked):
            continue
        choices.append(PackingChoice(tuple(tuple(names[i] for i in g) for g in part),
                                     tuple("alone" if len(g) == 1 else p[0].mode for g, p in zip(part, picked)),
                                     float(sum(p[1] for p in picked)), float(max(p[2] for p in picked)),
                                     tuple(p[0] for p in picked)))
    if not choices:
        raise InfeasibleError(f"no grouping of the {len(jobs)} jobs fits in the memory of {cluster.n_gpus} GPU(s)")
    key = (lambda c: -c.throughput) if objective == "throughput" else (lambda c: c.slowest_s)
    return sorted(choices, key=key)[:top]


def rank_placements(candidates, cluster, *, objective: str = "throughput", **options) -> list:
    """``[(index, ClusterPrediction)]`` of alternative placements (each a ``predict_cluster`` job list),
    best first: by total throughput (sum of 1/slowdown) or the slowest job's shared step."""
    check_choice("objective", objective, OBJECTIVES)
    if not isinstance(candidates, (list, tuple)) or not candidates:
        raise InvalidInputError("'candidates' must be a non-empty list of placements (predict_cluster job lists)")
    scored = [(i, predict_cluster(c, cluster, **options)) for i, c in enumerate(candidates)]
    if objective == "throughput":
        return sorted(scored, key=lambda x: -sum(1 / j.slowdown for j in x[1].jobs))
    return sorted(scored, key=lambda x: max(j.step_time for j in x[1].jobs))
