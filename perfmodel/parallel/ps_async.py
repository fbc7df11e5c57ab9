"""Asynchronous parameter servers: each worker computes, pushes its gradient and pulls fresh
parameters without waiting for the others (TensorFlow 1.x between-graph replication).

The cluster is a closed system of W workers cycling through one step each (think time: the
worker's own step) and S servers serving one update at a time per resource. Its throughput obeys
the asymptotic bounds of operational analysis (Lazowska et al. 1984, *Quantitative System
Performance*, §5.2): X(W) = min(W / t_worker, 1 / D_max), where D_max is the service demand of
one update at the busiest server: the largest of its NIC time out (the pull), its NIC time in (the
push) and its CPU time (the update, the copies and the TCP stack), because a server pipelines the
three over successive workers' requests. Workers beyond W* = t_worker / D_max add nothing.

Mean staleness (updates applied by the other workers between a worker's read and its write):
X·T − 1 with T the worker's period (Zhang et al. 2016, IJCAI, "Staleness-aware async-SGD": about
W − 1 for W equal workers). docs/parameter-servers.md derives each term.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

from perfmodel.core.errors import InvalidInputError
from perfmodel.parallel.fabric import parameter_server_links

PLACEMENTS = ("greedy", "round-robin")


@dataclass(frozen=True)
class ServerCpu:
    """A server's CPU seconds per byte on one vCPU (calibration/ps_cpu.py, perfmodel/fit/ps_cpu.py)."""

    update_s_per_byte: float       # ApplyMomentum over the variable
    copy_s_per_byte: float         # a received tensor copied out of the RPC buffer
    transfer_s_per_byte_per_end: float  # one end of a tensor's transfer (gRPC over TCP: framing, copies, system calls)
    message_s_per_end: float       # one end of a small request-reply: the floor of one RPC
    source: str = ""

    def update_s(self, nbytes, rpcs):
        """CPU seconds, on one vCPU, to receive ``nbytes`` of gradient, apply it, send ``nbytes`` back,
        answering ``rpcs`` RPCs: bytes·(2·transfer + copy + update) + rpcs·message."""
        per_byte = 2.0 * self.transfer_s_per_byte_per_end + self.copy_s_per_byte + self.update_s_per_byte
        return np.asarray(nbytes, float) * per_byte + np.asarray(rpcs, float) * self.message_s_per_end


@cache
def load_server_cpu() -> ServerCpu:
    """The bundled CPU costs (parallel/data/ps_cpu.json, measured on one vCPU)."""
    data = json.loads((resources.files("perfmodel.parallel") / "data" / "ps_cpu.json").read_text())
    return ServerCpu(data["update_s_per_byte"], data["copy_s_per_byte"], data["transfer_s_per_byte_per_end"],
                     data["message_s_per_end"], source=data["source"])


def place_variables(nbytes, servers: int, policy: str = "greedy") -> np.ndarray:
    """Server index of each variable, in creation order.

    "round-robin": the i-th variable on server i mod S (tensorflow v1.10 python/training/
    device_setter.py, ``_RoundRobinStrategy``, replica_device_setter's default);
    "greedy": each on the server holding the fewest bytes so far, ties to the lowest index
    (contrib/training/python/training/device_setter.py, ``GreedyLoadBalancingStrategy`` with
    ``byte_size_load_fn``).
    """
    nbytes = np.asarray(nbytes, float)
    if policy == "round-robin":
        return np.arange(len(nbytes)) % servers
    if policy != "greedy":
        raise InvalidInputError(f"'ps_placement' must be one of {', '.join(PLACEMENTS)}: got {policy!r}")
    load = np.zeros(servers)
    out = np.empty(len(nbytes), int)
    for i, b in enumerate(nbytes):
        out[i] = int(np.argmin(load))
        load[out[i]] += b
    return out


@dataclass(frozen=True)
class ServerLoad:
    """What one worker's update asks of each server: bytes each way, RPCs answered."""

    push_bytes: np.ndarray  # gradient bytes in (trainable variables)
    pull_bytes: np.ndarray  # parameter bytes out
    rpcs: np.ndarray        # two RecvTensor RPCs per trainable variable (the pull, the gradient)

    @classmethod
    def of(cls, variables, servers: int, policy: str) -> ServerLoad:
        sizes = np.array([v.nbytes for v in variables])
        trainable = np.array([v.trainable for v in variables], bool)
        where = place_variables(sizes, servers, policy)
        moved = np.bincount(where, weights=sizes * trainable, minlength=servers)
        rpcs = np.bincount(where, weights=2.0 * trainable, minlength=servers)
        return cls(moved, moved.copy(), rpcs)


@dataclass(frozen=True)
class ServerSpec:
    """A server's rates: NIC out and in (bytes/s), vCPUs (None: its CPU is not priced), latency (s)."""

    egress_bytes_per_s: float
    ingress_bytes_per_s: float
    vcpus: int | None
    latency_s: float


def server_spec(cluster) -> ServerSpec:
    """The servers' rates: the cluster's server VMs (``Cluster.servers``: NIC each way, vCPUs), else
    machines of the node type (their NICs; CPU not priced, as nothing says how many cores they give)."""
    vm = cluster.servers
    if vm is not None:
        return ServerSpec(vm.egress_bytes_per_s, vm.ingress_bytes_per_s, vm.vcpus,
                          max(vm.latency_s, cluster.node.nic.latency_s))
    links = parameter_server_links(cluster)
    return ServerSpec(links["server"], links["server"], None, links["latency"])


def server_count(strategy, cluster) -> int:
    """S: the strategy's ``ps_servers``, else the cluster's ``[servers]`` count; both given must agree."""
    vm_count = None if cluster.servers is None else cluster.servers.count
    if strategy.ps_servers and vm_count is not None and strategy.ps_servers != vm_count:
        raise InvalidInputError(f"'ps_servers'={strategy.ps_servers} contradicts the cluster's [servers] "
                                f"count={vm_count}: give one of them")
    count = strategy.ps_servers or vm_count
    if not count:
        raise InvalidInputError("'ps_async'=True needs parameter servers: give ps_servers=S in the strategy "
                                "or a [servers] table with 'count' in the cluster (pm.cluster(servers=...))")
    return int(count)


@dataclass(frozen=True)
class AsyncPS:
    """The asynchronous parameter-server cluster: rates, the binding resource, staleness. Times in s."""

    workers: int
    servers: int
    placement: str
    worker_step_s: float        # a worker's own step (mean over workers): compute + pull + the push backward does not hide
    compute_s: float
    pull_s: float
    push_exposed_s: float
    server_demand_s: tuple      # per server: max(NIC out, NIC in, CPU) seconds per update
    server_cpu_s: tuple         # per server: CPU seconds per update (None: no vCPU count, not priced)
    updates_per_second: float   # cluster throughput (steps/s as TensorFlow counts global steps)
    worker_period_s: float      # time between one worker's updates (its step, or its wait at saturation)
    saturating_workers: float   # W* = worker step / busiest server's demand
    bottleneck: str
    mean_staleness: float
    server_bytes: tuple         # per server: bytes pulled per update
    worker_steps_s: tuple = ()  # per worker: its own step (mixed GPU types differ)

    @property
    def saturated(self) -> bool:
        return self.workers >= self.saturating_workers


def server_demand(load: ServerLoad, spec: ServerSpec, cpu: ServerCpu):
    """(demand, NIC out, NIC in, CPU) seconds per update at each server; CPU spread over its vCPUs
    (TensorFlow runs RPCs and update kernels on a pool of one thread per core:
    core/common_runtime/process_util.cc, inter-op threads default to the core count)."""
    out = load.pull_bytes / spec.egress_bytes_per_s
    inn = load.push_bytes / spec.ingress_bytes_per_s
    if spec.vcpus is None:
        busy = np.full_like(out, np.nan)
        return np.maximum(out, inn), out, inn, busy
    busy = cpu.update_s(load.pull_bytes, load.rpcs) / spec.vcpus
    return np.maximum(np.maximum(out, inn), busy), out, inn, busy


def _bottleneck(w: int, w_star: float, i: int, out, inn, busy, spec: ServerSpec) -> str:
    if w < w_star:
        return f"the workers' own steps ({w} worker{'s' if w > 1 else ''} < {w_star:.1f} that saturate the servers)"
    parts = {"NIC out (parameter pulls)": out[i], "NIC in (gradient pushes)": inn[i],
             f"CPU ({spec.vcpus} vCPUs: updates, copies, gRPC)": busy[i]}
    name = max((k for k, v in parts.items() if np.isfinite(v)), key=parts.get)
    return f"server {i}'s {name}: {parts[name] * 1e3:.2f} ms per update, saturated from {w_star:.1f} workers"


def async_ps(*, compute_s, backward_s, variables, workers: int, servers: int, spec: ServerSpec,
             worker_bw_bytes_per_s: float, placement: str = "greedy", cpu: ServerCpu | None = None) -> AsyncPS:
    """Price asynchronous parameter-server training of ``workers`` workers over ``servers`` servers.

    ``compute_s``, ``backward_s``: one worker's compute and backward seconds, or one value per worker
    (mixed GPU types). A worker's own step: compute + pull + exposed push, where the pull moves all
    parameters through its NIC and at most each server's NIC rate (P/B_w, and p_s/B_out for each
    server s) + latency, and the push (the same bytes in) overlaps backward as gradients become
    ready (as DDP buckets). Cluster rate: min(sum_i 1/t_i, 1/D_max) (module docstring); at
    saturation every worker slows by the same factor, so worker i's period is t_i · sum_j(1/t_j) / X.
    """
    cpu = cpu or load_server_cpu()
    load = ServerLoad.of(variables, servers, placement)
    demand, out, inn, busy = server_demand(load, spec, cpu)
    total = float(load.pull_bytes.sum())
    pull = max(total / worker_bw_bytes_per_s, float(out.max())) + spec.latency_s
    push = max(total / worker_bw_bytes_per_s, float(inn.max()))
    compute = np.broadcast_to(np.asarray(compute_s, float), (workers,))
    push_exposed = np.maximum(push - np.broadcast_to(np.asarray(backward_s, float), (workers,)), 0.0) + spec.latency_s
    t_worker = compute + pull + push_exposed
    d_max, busiest = float(demand.max()), int(np.argmax(demand))
    alone = float(np.sum(1.0 / t_worker))  # the workers' rates summed: the cluster's rate if servers never bind
    rate = min(alone, 1.0 / d_max) if d_max > 0 else alone
    periods = t_worker * alone / rate
    w_star = workers / (alone * d_max) if d_max > 0 else np.inf
    return AsyncPS(workers=workers, servers=servers, placement=placement, worker_step_s=float(t_worker.mean()),
                   compute_s=float(compute.mean()), pull_s=pull, push_exposed_s=float(push_exposed.mean()),
                   server_demand_s=tuple(map(float, demand)),
                   server_cpu_s=tuple(float(b) if np.isfinite(b) else None for b in busy),
                   updates_per_second=rate, worker_period_s=float(periods.mean()), saturating_workers=w_star,
                   bottleneck=_bottleneck(workers, w_star, busiest, out, inn, busy, spec),
                   mean_staleness=max(float(np.mean(rate * periods)) - 1.0, 0.0),
                   server_bytes=tuple(map(float, load.pull_bytes)), worker_steps_s=tuple(map(float, t_worker)))
