"""Nodes (GPUs + the link between them + NICs) and clusters (nodes x count).

A cluster is homogeneous today: ``nodes`` copies of one ``node``. Code that
walks the machine should go through :attr:`Cluster.groups`, a tuple of
``(node, count)`` pairs, so that clusters mixing node types (several groups)
can be added without changing callers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from perfmodel.core.errors import InvalidInputError
from perfmodel.hardware.common import FrozenMap, check_name
from perfmodel.hardware.gpu import GPU
from perfmodel.hardware.link import Link
from perfmodel.hardware.servers import ServerVM
from perfmodel.core.units import format_rate
from perfmodel.core.checks import LIMITS, check_size


@dataclass(frozen=True, repr=False)
class Node:
    """``gpus_per_node`` GPUs joined by ``intra``, reaching other nodes through NICs."""

    name: str
    gpu: GPU
    gpus_per_node: int
    intra: Link  # GPU-to-GPU inside the node: NVLink, NVSwitch or PCIe
    nic: Link  # one NIC: InfiniBand or Ethernet
    nics_per_node: int = 1
    source: str = ""
    aliases: tuple[str, ...] = ()
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        check_name("node", self.name)
        owner = f"node {self.name!r}"
        if not isinstance(self.gpu, GPU):
            raise InvalidInputError(f"{owner}: 'gpu' must be a GPU: got {self.gpu!r}")
        for role, link, kinds in (
            ("intra", self.intra, ("nvlink", "nvswitch", "pcie")),
            ("nic", self.nic, ("infiniband", "ethernet")),
        ):
            if not isinstance(link, Link) or link.kind not in kinds:
                raise InvalidInputError(
                    f"{owner}: {role!r} must be a link of kind {', '.join(kinds)}: got {link!r}"
                )
        set_ = object.__setattr__
        set_(self, "gpus_per_node", check_size("gpus_per_node", self.gpus_per_node))
        set_(self, "nics_per_node", check_size("nics_per_node", self.nics_per_node, limit="gpus_per_node"))
        set_(self, "aliases", tuple(self.aliases))
        set_(self, "sources", FrozenMap(self.sources))

    @property
    def inter_bw_bytes_per_s(self) -> float:
        """Line-rate bandwidth out of the node, per direction: NIC rate x NICs."""
        return self.nic.bw_bytes_per_s * self.nics_per_node

    def source_of(self, field_name: str) -> str:
        """Where the number in ``field_name`` comes from (falls back to ``source``)."""
        return self.sources.get(field_name, self.source)

    def __repr__(self) -> str:
        return (
            f"Node({self.name!r}, {self.gpus_per_node}x {self.gpu.name}, "
            f"intra={self.intra.name}, {self.nics_per_node}x {self.nic.name} = "
            f"{format_rate(self.inter_bw_bytes_per_s, 'B/s')} out)"
        )


@dataclass(frozen=True, repr=False)
class Cluster:
    """``nodes`` identical nodes. Build one with :func:`perfmodel.hardware.cluster`."""

    node: Node
    nodes: int = 1
    name: str = ""  # empty: "<nodes>x <node name>", or the node name for one node
    servers: ServerVM | None = None  # CPU-only parameter-server VMs beside the GPU nodes (hardware/servers.py)

    def __post_init__(self) -> None:
        if not isinstance(self.node, Node):
            raise InvalidInputError(f"cluster 'node' must be a Node: got {self.node!r}")
        if self.servers is not None and not isinstance(self.servers, ServerVM):
            raise InvalidInputError(f"cluster 'servers' must be a ServerVM (perfmodel.hardware.servers.server_vm): "
                                    f"got {self.servers!r}")
        object.__setattr__(self, "nodes", check_size("nodes", self.nodes))
        if self.nodes * self.node.gpus_per_node > LIMITS["gpus"]:
            raise InvalidInputError(f"a cluster of {self.nodes:,} nodes × {self.node.gpus_per_node} GPUs is above the "
                                    f"{LIMITS['gpus']:,} GPUs perfmodel models")
        if not self.name:
            name = self.node.name if self.nodes == 1 else f"{self.nodes}x {self.node.name}"
            object.__setattr__(self, "name", name)

    @property
    def groups(self) -> tuple[tuple[Node, int], ...]:
        """``((node, count), ...)``: one group today; several for mixed clusters later."""
        return ((self.node, self.nodes),)

    @property
    def n_gpus(self) -> int:
        return sum(node.gpus_per_node * count for node, count in self.groups)

    @property
    def n_nodes(self) -> int:
        return sum(count for _, count in self.groups)

    @property
    def gpu(self) -> GPU:
        return self.node.gpu

    @property
    def gpus_per_node(self) -> int:
        return self.node.gpus_per_node

    def __repr__(self) -> str:
        return (
            f"Cluster({self.name!r}: {self.nodes} x {self.node.gpus_per_node} "
            f"{self.node.gpu.name} = {self.n_gpus} GPU{'s' if self.n_gpus > 1 else ''}, "
            f"intra={self.node.intra.name}, "
            f"{self.node.nics_per_node}x {self.node.nic.name} per node"
            f"{'' if self.servers is None else '; servers ' + repr(self.servers)})"
        )
