"""A CPU-only server VM beside the GPU workers (a parameter server): its vCPUs and its NIC.

Build one with :func:`perfmodel.hardware.cloud.server_vm` (a NIC given, or a cloud's per-VM cap).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.core.units import format_rate

DEFAULT_LATENCY_S = 10e-6  # kernel TCP sockets in a datacenter, as the eth10/eth25 links (hardware/data/links.toml)


@dataclass(frozen=True)
class ServerVM:
    """A CPU-only VM serving parameters: its vCPUs and its NIC's rate in each direction (bytes/s)."""

    vcpus: int
    egress_bytes_per_s: float
    ingress_bytes_per_s: float
    count: int | None = None  # None: the strategy's ps_servers
    name: str = "server"
    latency_s: float = DEFAULT_LATENCY_S
    source: str = ""

    def __repr__(self) -> str:
        many = "" if self.count is None else f"{self.count}x "
        return (f"ServerVM({many}{self.name}: {self.vcpus} vCPUs, {format_rate(self.egress_bytes_per_s, 'B/s')} out, "
                f"{format_rate(self.ingress_bytes_per_s, 'B/s')} in)")
