"""Server VMs from a NIC or a cloud's per-VM network cap, and a cluster TOML's ``[servers]`` table.

    server_vm(vcpus=4, provider="gcp")                 # n1 VM: 2 Gb/s per vCPU -> 8 Gb/s each way
    server_vm(machine="m5.xlarge", provider="aws")     # 4 vCPUs, 1.25 Gb/s sustained baseline
    server_vm(vcpus=8, nic="10Gb/s", count=2)          # a NIC given outright
    cluster("k80", nodes=8, servers=server_vm(vcpus=4, provider="gcp", count=1))

In a cluster TOML the same is a ``[servers]`` table (``vcpus``, ``nic`` or ``provider`` /
``machine`` / ``family``, ``count``; without ``count`` the strategy's ``ps_servers`` says how
many). The caps are data (``data/cloud_network.toml``), each provider's with its page and date.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from importlib import resources

from perfmodel.core.checks import check_int
from perfmodel.core.errors import InvalidInputError, unknown_name
from perfmodel.core.readers import parse_toml
from perfmodel.core.units import parse_bandwidth, parse_duration
from perfmodel.hardware.catalog import load_link
from perfmodel.hardware.link import Link
from perfmodel.hardware.servers import DEFAULT_LATENCY_S, ServerVM

PROVIDERS = ("gcp", "aws", "azure")
SERVER_FIELDS = ("vcpus", "nic", "provider", "machine", "family", "count", "name", "latency")


@cache
def cloud_caps() -> dict:
    """The bundled per-VM network caps (``data/cloud_network.toml``)."""
    text = resources.files("perfmodel.hardware").joinpath("data", "cloud_network.toml").read_text(encoding="utf-8")
    return parse_toml(text, "catalog cloud_network.toml")


def _check_vcpus(vcpus) -> int:
    try:
        return check_int("vcpus", vcpus)
    except InvalidInputError:
        raise InvalidInputError(f"'vcpus' of a server VM must be a positive integer: got {vcpus!r}") from None


def gcp_cap(vcpus: int, family: str = "n1") -> tuple[float, str]:
    """GCP egress cap of a VM (bytes/s): 2 Gb/s per vCPU up to its family's cap (source in the data)."""
    table = cloud_caps()["gcp"]
    caps = table["family_cap"]
    key = str(family).lower()
    if key not in caps:
        raise unknown_name("GCP machine family", family, [k for k in caps if k != "default"])
    per = parse_bandwidth(table["per_vcpu"], "per_vcpu")
    cap = parse_bandwidth(caps[key], key)
    return min(per * _check_vcpus(vcpus), cap), f"GCP {key}: {table['rule']}; {table['source']}"


def instance_cap(provider: str, machine: str) -> tuple[int, float, str]:
    """(vCPUs, sustained rate each way in bytes/s, source) of an AWS or Azure instance type."""
    table = cloud_caps()[provider]
    instances = table["instances"]
    if machine not in instances:
        raise unknown_name(f"{provider} instance type", machine, instances)
    row = instances[machine]
    rate = parse_bandwidth(row["baseline"] if provider == "aws" else row["egress"], "bandwidth")
    return int(row["vcpus"]), rate, f"{provider} {machine}: {table['rule']}; {table['source']}"


def _cloud(provider, machine, family, vcpus):
    """(vCPUs, rate, source) from a cloud's table; ``vcpus`` may be None for an instance type."""
    if provider not in PROVIDERS:
        raise unknown_name("cloud provider", provider, PROVIDERS)
    if provider == "gcp":
        if vcpus is None:
            raise InvalidInputError("'vcpus' of a GCP server VM is required (its cap is 2 Gb/s per vCPU)")
        rate, source = gcp_cap(vcpus, family or "n1")
        return _check_vcpus(vcpus), rate, source
    if machine is None:
        raise InvalidInputError(f"'machine' (an instance type) is required for provider={provider!r}: "
                                f"e.g. {next(iter(cloud_caps()[provider]['instances']))!r}")
    listed, rate, source = instance_cap(provider, machine)
    if vcpus is not None and _check_vcpus(vcpus) != listed:
        raise InvalidInputError(f"'vcpus'={vcpus} contradicts {machine}'s {listed} vCPUs (leave vcpus out)")
    return listed, rate, source


def _nic_rate(nic) -> float:
    if isinstance(nic, (int, float)) and not isinstance(nic, bool):
        if nic <= 0:
            raise InvalidInputError(f"'nic' of a server VM must be a rate > 0: got {nic!r}")
        return float(nic)
    if isinstance(nic, str) and "/" not in nic:  # a link of the catalog ("eth10")
        return load_link(nic).bw_bytes_per_s
    return parse_bandwidth(nic, "nic")


def server_vm(vcpus=None, nic=None, *, provider=None, machine=None, family=None, count=None,
              name: str = "server", latency_s: float = DEFAULT_LATENCY_S) -> ServerVM:
    """A CPU-only server VM; its NIC from ``nic`` (a rate such as "10Gb/s", bytes/s, or a link name),
    from a cloud's cap (``provider`` "gcp" with ``vcpus`` [and ``family``], "aws"/"azure" with
    ``machine``), or the lower of both. ``count``: how many (None: the strategy's ps_servers)."""
    if nic is None and provider is None:
        raise InvalidInputError("a server VM needs a NIC: give 'nic' (a rate such as '10Gb/s' or a link name "
                                f"such as 'eth10') or 'provider' (one of {', '.join(PROVIDERS)}) for the cloud's cap")
    source = ""
    rate = None if nic is None else _nic_rate(nic)
    if provider is not None:
        vcpus, cap, source = _cloud(str(provider).lower(), machine, family, vcpus)
        rate = cap if rate is None else min(rate, cap)
    if vcpus is None:
        raise InvalidInputError("'vcpus' of a server VM is required (a positive integer): got None")
    count = None if count is None else check_int("count", count)
    return ServerVM(vcpus=_check_vcpus(vcpus), egress_bytes_per_s=rate, ingress_bytes_per_s=rate, count=count,
                    name=str(name), latency_s=float(latency_s), source=source or f"nic {nic!r} as given")


def _check_table(data, where: str, table: str, fields) -> None:
    """A cluster TOML's ``[table]`` is a table of known ``fields``, or an error naming ``where``."""
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"{where}: [{table}] must be a table: got {data!r}")
    for key in data:
        if key not in fields:
            raise InvalidInputError(f"{where} [{table}]: {unknown_name('field', key, fields)}")


def servers_from_dict(data: Mapping, where: str) -> ServerVM:
    """A ``[servers]`` table of a cluster TOML; errors name ``where`` and the field."""
    _check_table(data, where, "servers", SERVER_FIELDS)
    kw = {k: data[k] for k in ("vcpus", "nic", "provider", "machine", "family", "count", "name") if k in data}
    if "latency" in data:
        kw["latency_s"] = parse_duration(data["latency"], "latency")
    try:
        return server_vm(**kw)
    except InvalidInputError as err:
        raise InvalidInputError(f"{where} [servers]: {err}") from None


WORKER_FIELDS = ("vcpus", "nic", "provider", "machine", "family")


def vm_nic(vcpus=None, nic=None, *, provider=None, machine=None, family=None) -> Link:
    """A GPU worker VM's network as its cloud caps it (or as given): an Ethernet link whose rate is
    the cap, which is what the VM reaches (``nccl_busbw`` = the cap), for ``pm.cluster(nic=...)``."""
    vm = server_vm(vcpus, nic, provider=provider, machine=machine, family=family, name="worker")
    rate = min(vm.egress_bytes_per_s, vm.ingress_bytes_per_s)
    return Link(name=f"{provider or 'vm'}-{vm.vcpus}vcpu-nic", kind="ethernet", bw_bytes_per_s=rate,
                latency_s=vm.latency_s, nccl_busbw_bytes_per_s=rate, source=f"per-VM cap: {vm.source}")


def workers_from_dict(data: Mapping, where: str) -> Link:
    """A ``[workers]`` table of a cluster TOML (the worker VMs' network cap); errors name ``where``."""
    _check_table(data, where, "workers", WORKER_FIELDS)
    try:
        return vm_nic(**dict(data))
    except InvalidInputError as err:
        raise InvalidInputError(f"{where} [workers]: {err}") from None

