"""Collective models for a cluster's two fabric levels: inside a node and across nodes.

A profile's fitted entries are used when it has them for a level (the bundled
A100/H100/H200 profiles carry the NVSwitch all-reduce fitted to published
8-GPU curves). Inside a node, the other collectives (reduce-scatter,
all-gather, ...) take the fitted all-reduce curve's shape at the link's
ring bus bandwidth: the same NCCL ring carries them at the same busbw
(nccl-tests doc/PERFORMANCE.md), except that NVLink SHARP speeds up only the
all-reduce (~480 vs ~370 GB/s on NVLink4, NVIDIA/nccl-tests#212). Without a
fitted entry a level falls back to its link's datasheet figure: the bus
bandwidth NCCL is reported to reach on it, else the line rate times 0.8
(nccl-tests issue #212: ~20% protocol overhead on NVLink). Across nodes,
every GPU of a node talks at once, so ranks share the node's NICs.
"""

from __future__ import annotations

import copy

from perfmodel.costs.comm import datasheet_entry as _datasheet_entry
from perfmodel.costs.comm import busbw_factor, collective_time, rail_busbw
from perfmodel.costs.nccl_tuning import NCCL_VERSION
from perfmodel.hardware.catalog import load_link
from perfmodel.profiles.profile import Profile

PROTOCOL_EFFICIENCY = 0.8
NVLINK_KINDS = ("nvlink", "nvswitch")  # NCCL's intra hardware NVLINK (typeIntra LINK_NVL); LL128 needs it (tuning.cc:286)
OTHER_COLLECTIVES = ("all_gather", "reduce_scatter", "broadcast", "all_to_all", "sendrecv")


def _link_busbw(link, *, allreduce: bool) -> tuple[float, str]:
    if allreduce and link.nccl_allreduce_busbw_bytes_per_s:
        return link.nccl_allreduce_busbw_bytes_per_s, link.source_of("nccl_allreduce_busbw")
    if link.nccl_busbw_bytes_per_s:
        return link.nccl_busbw_bytes_per_s, link.source_of("nccl_busbw")
    return link.bw_bytes_per_s * PROTOCOL_EFFICIENCY, f"{link.name} line rate x {PROTOCOL_EFFICIENCY} (nccl-tests #212)"


def datasheet_entry(bw_bytes_per_s: float, latency_s: float, *, source: str) -> dict:
    """A datasheet entry whose latency grows with the ring: one hop latency per step.

    NCCL's own cost model charges a ring ``nsteps × hwLat`` (NVIDIA/nccl
    src/graph/tuning.cc); with alpha(n) = alpha_s + alpha_rank_s·(n − 1) that is
    alpha_rank_s = the link's latency. A ring all-reduce takes 2(n − 1) steps; the
    form charges n − 1 of them, so large all-reduces stay bandwidth-bound as NCCL's
    tree algorithm makes them.
    """
    entry = _datasheet_entry(bw_bytes_per_s, latency_s, source=source)
    entry["params"]["alpha_rank_s"] = float(latency_s)
    return entry


def _ring_shaped(entry: dict, link) -> dict:
    """The fitted all-reduce curve rescaled to the link's ring busbw (for RS, AG, ...)."""
    ring, _ = _link_busbw(link, allreduce=False)
    best, _ = _link_busbw(link, allreduce=True)
    out = copy.deepcopy(entry)
    out["params"]["busbw_bytes_per_s"] *= min(1.0, ring / best)
    out["source"] = (f"{entry.get('source', '')}; all_reduce curve x {min(1.0, ring / best):.3f} "
                     f"(ring/all-reduce busbw of {link.name}, nccl-tests #212)")
    return out


def _mesh_entries(allreduce: dict, link) -> dict:
    """A switchless NVLink mesh (``link.mesh_peers``): every collective on the fitted all-reduce curve's
    shape at the link's ring busbw (no NVLink SHARP without a switch), each entry carrying the mesh so
    ``costs.comm.collective_time`` prices a group of n ranks on its n − 1 peers' share of the links."""
    ring, src = _link_busbw(link, allreduce=False)
    top = float(allreduce["range_bytes"][1]) if "range_bytes" in allreduce else 8.0 * 2**30
    reached = top / float(collective_time(allreduce, "all_reduce", top, 8)) * busbw_factor("all_reduce", 8)
    out = {}
    for key in ("all_reduce", "all_gather", "reduce_scatter", "sendrecv"):
        entry = copy.deepcopy(allreduce)
        entry["params"]["busbw_bytes_per_s"] *= ring / reached  # the curve's largest measured busbw -> ring's
        entry["source"] = f"{allreduce.get('source', '')}; shape only, x {ring / reached:.3f} to {link.name}'s ring busbw ({src})"
        entry["mesh_peers"] = link.mesh_peers
        out[key] = entry
    return out


def cluster_collectives(cluster, profile: Profile) -> dict[str, dict[str, dict]]:
    """``{"intra": {...}, "inter": {...}}`` collective entries for ``cluster``."""
    node = cluster.node
    fitted = profile.collectives or {}
    out: dict[str, dict[str, dict]] = {"intra": {}, "inter": {}}
    if node.intra.kind == "nvswitch" and fitted.get("intra"):
        out["intra"].update(fitted["intra"])
        allreduce = out["intra"].get("all_reduce")
        if allreduce is not None:
            for key in ("all_gather", "reduce_scatter", "sendrecv"):
                out["intra"].setdefault(key, _ring_shaped(allreduce, node.intra))
    elif node.intra.mesh_peers and (fitted.get("intra") or {}).get("all_reduce") is not None:
        out["intra"].update(_mesh_entries(fitted["intra"]["all_reduce"], node.intra))
    for key in ("all_reduce", *OTHER_COLLECTIVES):
        bw, src = _link_busbw(node.intra, allreduce=key == "all_reduce")
        entry = datasheet_entry(bw, node.intra.latency_s, source=f"datasheet: {src}")
        out["intra"].setdefault(key, {**entry, "mesh_peers": node.intra.mesh_peers} if node.intra.mesh_peers else entry)
    if fitted.get("inter"):
        out["inter"].update(fitted["inter"])
    nic_bw, src = _link_busbw(node.nic, allreduce=False)
    per_rank = rail_busbw(nic_bw, node.nics_per_node, node.gpus_per_node)
    inter = datasheet_entry(per_rank, node.nic.latency_s,
                            source=f"datasheet: {src}; {node.nics_per_node} NICs shared by {node.gpus_per_node} GPUs")
    if nccl_network(node.nic):
        inter["nccl"] = {"hw": "nvlink" if node.intra.kind in NVLINK_KINDS else "pci",
                         "ll128": node.intra.kind in NVLINK_KINDS}
        inter["source"] += f"; NCCL {NCCL_VERSION} tuning.cc algorithm/protocol model"
    out["inter"].setdefault("all_reduce", inter)
    return out


def nccl_network(link) -> bool:
    """Whether NCCL's own cost model prices collectives over ``link``: a NIC whose latency is NCCL's
    (links.toml cites tuning.cc for it: InfiniBand and RoCE), not a TCP-socket figure of its own."""
    return "tuning.cc" in link.source_of("latency")


def parameter_server_links(cluster) -> dict[str, float]:
    """Bandwidths of parameter-server traffic (bytes/s, one direction) and its latency.

    A server is the cluster's server VM when it has one (``Cluster.servers``), else a machine
    of the cluster's node type serving through all its NICs; a worker is one GPU, sharing its node's NICs with the node's other
    workers (every worker pushes at the same moment). Rates are what the link
    reaches in practice (``nccl_busbw``, else line rate x 0.8), not line rate.
    """
    node = cluster.node
    nic_bw, _ = _link_busbw(node.nic, allreduce=False)
    local = _local_ps_links(node)
    # for Strategy.ps_local_reduce: a machine's whole NIC share and its GPUs' PCIe (ps_time)
    machine = {"node": nic_bw * node.nics_per_node, "local": local["worker"], "gpus_per_node": node.gpus_per_node}
    vm = getattr(cluster, "servers", None)
    if vm is not None:  # CPU-only server VMs of their own (hardware/servers.py): their NIC, the slower way
        return {"server": min(vm.egress_bytes_per_s, vm.ingress_bytes_per_s),
                "worker": rail_busbw(nic_bw, node.nics_per_node, node.gpus_per_node),
                "latency": max(vm.latency_s, node.nic.latency_s), **machine}
    if getattr(cluster, "nodes", 1) == 1:  # one machine: the ps is its host, reached over each GPU's PCIe
        return {**local, **machine, "node": local["server"], "gpus_per_node": 1}
    return {"server": nic_bw * node.nics_per_node,
            "worker": rail_busbw(nic_bw, node.nics_per_node, node.gpus_per_node),
            "latency": node.nic.latency_s, **machine}


def _local_ps_links(node) -> dict[str, float]:
    """Parameter-server links inside one machine: variables on the host (tf_cnn_benchmarks
    ``local_parameter_device=cpu``, variable_mgr.py ``VariableMgrLocalFetchFromPS``; TensorFlow copies
    tensors between host and GPU over PCIe, gpu_util.cc), no NIC. Each GPU reads and writes through its
    own PCIe link, which GPUs on one board share (``GPU.gpus_per_pcie``); the host takes every link at once."""
    pcie = node.intra if node.intra.kind == "pcie" else load_link(node.gpu.pcie)
    bw, _ = _link_busbw(pcie, allreduce=False)
    share = min(node.gpu.gpus_per_pcie, node.gpus_per_node)
    return {"server": bw * node.gpus_per_node / share, "worker": bw / share, "latency": pcie.latency_s}
