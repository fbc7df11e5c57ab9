"""Collective models for a cluster's two fabric levels: inside a node and across nodes.

A profile's fitted entries are used when it has them for a level (the bundled
A100/H100/H200 profiles carry the NVSwitch all-reduce fitted to published
8-GPU curves); otherwise each level falls back to its link's datasheet figure:
the bus bandwidth NCCL is reported to reach on it, else the line rate times
0.8 (nccl-tests issue #212: ~20% protocol overhead on NVLink). Across nodes,
every GPU of a node talks at once, so ranks share the node's NICs.
"""

from __future__ import annotations

from perfmodel.costs.comm import datasheet_entry, rail_busbw
from perfmodel.profile import Profile

PROTOCOL_EFFICIENCY = 0.8
OTHER_COLLECTIVES = ("all_gather", "reduce_scatter", "broadcast", "all_to_all", "sendrecv")


def _link_busbw(link, *, allreduce: bool) -> tuple[float, str]:
    if allreduce and link.nccl_allreduce_busbw_bytes_per_s:
        return link.nccl_allreduce_busbw_bytes_per_s, link.source_of("nccl_allreduce_busbw")
    if link.nccl_busbw_bytes_per_s:
        return link.nccl_busbw_bytes_per_s, link.source_of("nccl_busbw")
    return link.bw_bytes_per_s * PROTOCOL_EFFICIENCY, f"{link.name} line rate x {PROTOCOL_EFFICIENCY} (nccl-tests #212)"


def cluster_collectives(cluster, profile: Profile) -> dict[str, dict[str, dict]]:
    """``{"intra": {...}, "inter": {...}}`` collective entries for ``cluster``."""
    node = cluster.node
    fitted = profile.collectives or {}
    out: dict[str, dict[str, dict]] = {"intra": {}, "inter": {}}
    if node.intra.kind == "nvswitch" and fitted.get("intra"):
        out["intra"].update(fitted["intra"])
    for key in ("all_reduce", *OTHER_COLLECTIVES):
        bw, src = _link_busbw(node.intra, allreduce=key == "all_reduce")
        out["intra"].setdefault(key, datasheet_entry(bw, node.intra.latency_s, source=f"datasheet: {src}"))
    if fitted.get("inter"):
        out["inter"].update(fitted["inter"])
    nic_bw, src = _link_busbw(node.nic, allreduce=False)
    per_rank = rail_busbw(nic_bw, node.nics_per_node, node.gpus_per_node)
    out["inter"].setdefault("all_reduce", datasheet_entry(
        per_rank, node.nic.latency_s,
        source=f"datasheet: {src}; {node.nics_per_node} NICs shared by {node.gpus_per_node} GPUs"))
    return out
