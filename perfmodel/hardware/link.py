"""One kind of link between GPUs (NVLink, NVSwitch, PCIe) or between nodes (NICs).

Bandwidths are per direction and per GPU (for NVLink/NVSwitch/PCIe) or per
NIC (InfiniBand, Ethernet), at line rate. ``nccl_busbw_bytes_per_s`` is what
NCCL reaches on the link, in nccl-tests bus-bandwidth terms
(nccl-tests doc/PERFORMANCE.md), where a measurement or a maintainer's figure
is known.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from perfmodel.core.errors import InvalidInputError
from perfmodel.hardware.common import FrozenMap, check_name, check_number
from perfmodel.core.units import format_rate, format_seconds

LINK_KINDS = ("nvlink", "nvswitch", "pcie", "infiniband", "ethernet")


@dataclass(frozen=True, repr=False)
class Link:
    """A link kind: line-rate bandwidth per direction, latency, NCCL bus bandwidth."""

    name: str
    kind: str  # one of LINK_KINDS
    bw_bytes_per_s: float  # line rate, per direction
    latency_s: float
    nccl_busbw_bytes_per_s: float | None = None  # ring / non-all-reduce busbw NCCL reaches
    source: str = ""
    aliases: tuple[str, ...] = ()
    # all-reduce busbw where it beats the ring figure (NVLink SHARP); None = same
    nccl_allreduce_busbw_bytes_per_s: float | None = None
    description: str = ""
    sources: Mapping[str, str] = field(default_factory=FrozenMap)
    # NVLink without a switch, every GPU wired to each of ``mesh_peers`` peers by an equal share of
    # its links (HGX 4-GPU boards: 3); None = a switch or a shared bus
    mesh_peers: int | None = None

    def __post_init__(self) -> None:
        check_name("link", self.name)
        owner = f"link {self.name!r}"
        if self.kind not in LINK_KINDS:
            raise InvalidInputError(
                f"{owner}: 'kind' must be one of {', '.join(LINK_KINDS)}: got {self.kind!r}"
            )
        set_ = object.__setattr__
        set_(self, "bw_bytes_per_s", check_number(owner, "bw_bytes_per_s", self.bw_bytes_per_s))
        latency = self.latency_s
        if latency != 0:  # a zero latency is allowed (ideal link)
            latency = check_number(owner, "latency_s", latency)
        set_(self, "latency_s", float(latency))
        for name in ("nccl_busbw_bytes_per_s", "nccl_allreduce_busbw_bytes_per_s"):
            set_(self, name, check_number(owner, name, getattr(self, name), optional=True))
        if self.mesh_peers is not None and (int(self.mesh_peers) != self.mesh_peers or self.mesh_peers < 1):
            raise InvalidInputError(f"{owner}: 'mesh_peers' must be a whole number of peers, at least 1: "
                                    f"got {self.mesh_peers!r}")
        set_(self, "aliases", tuple(self.aliases))
        set_(self, "sources", FrozenMap(self.sources))

    @property
    def is_intra_node(self) -> bool:
        """True for GPU-to-GPU links inside a node (NVLink, NVSwitch, PCIe)."""
        return self.kind in ("nvlink", "nvswitch", "pcie")

    def source_of(self, field_name: str) -> str:
        """Where the number in ``field_name`` comes from (falls back to ``source``)."""
        return self.sources.get(field_name, self.source)

    def __repr__(self) -> str:
        busbw = ""
        if self.nccl_busbw_bytes_per_s is not None:
            busbw = f", nccl_busbw={format_rate(self.nccl_busbw_bytes_per_s, 'B/s')}"
        return (
            f"Link({self.name!r}, {self.kind}, {format_rate(self.bw_bytes_per_s, 'B/s')}"
            f" per direction, latency={format_seconds(self.latency_s)}{busbw})"
        )
