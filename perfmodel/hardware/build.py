"""Build a Cluster from a name (GPU or node preset) or a user's TOML file.

Examples::

    cluster("h200")                     # one H200: a 1-GPU node, PCIe, 25 Gb/s NIC
    cluster("h100", gpus_per_node=8)    # a generic 8 x H100 node on NVSwitch
    cluster("dgx-a100-80gb", nodes=16)  # 128 GPUs
    cluster("my_cluster.toml")          # a user's file (see docs/hardware.md)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from perfmodel.core.errors import InvalidInputError, unknown_name
from perfmodel.hardware import catalog
from perfmodel.hardware.gpu import GPU
from perfmodel.hardware.node import Cluster, Node
from perfmodel.hardware.cloud import servers_from_dict, workers_from_dict
from perfmodel.hardware.link import Link
from perfmodel.hardware.servers import ServerVM
from perfmodel.core.checks import check_int

CLUSTER_FIELDS = ("name", "nodes", "node", "description", "servers", "workers")


GENERIC_SOURCE = "generic node (assumed)"  # how a generic node's source begins


def gpu_node(gpu: GPU, gpus_per_node: int = 1) -> Node:
    """A generic node of ``gpus_per_node`` copies of ``gpu`` (no preset behind it).

    Inside: NVSwitch of the GPU's NVLink generation when it has NVLink and there
    is more than one GPU, else PCIe of its generation. Outside: one 25 Gb/s
    Ethernet NIC, as on a typical cloud VM.
    """
    gpus_per_node = check_int("gpus_per_node", gpus_per_node)
    intra = catalog.default_intra(gpu, gpus_per_node)
    nic = catalog.load_link(catalog.DEFAULT_NIC)
    name = gpu.name if gpus_per_node == 1 else f"{gpus_per_node}x{gpu.name}"
    return Node(
        name=name,
        gpu=gpu,
        gpus_per_node=gpus_per_node,
        intra=intra,
        nic=nic,
        nics_per_node=1,
        source=f"{GENERIC_SOURCE}: {gpus_per_node} x {gpu.name}, "
        f"{intra.name} inside, 1 x {nic.name} NIC",
    )



def generic_fabric_caveats(cluster) -> tuple:
    """What a cluster of several generic nodes (a bare GPU name) assumed about the network between
    them, in words; () for one node, a preset or a cluster file."""
    node = getattr(cluster, "node", None)
    if node is None or getattr(cluster, "nodes", 1) < 2 or not node.source.startswith(GENERIC_SOURCE):
        return ()
    return (f"{cluster.nodes} generic nodes of {node.gpus_per_node} x {node.gpu.name}, joined by one {node.nic.name} "
            f"NIC each (assumed, as a cloud VM): name a node preset for a server's own fabric (perfmodel list "
            f"nodes: dgx-h100, hgx-h200, ...) or give the NICs in a cluster file (docs/hardware.md)",)


def part_of_node(node: Node, gpus_per_node: int) -> Node:
    """The first ``gpus_per_node`` GPUs of a preset, with NICs in proportion (at least one)."""
    gpus_per_node = check_int("gpus_per_node", gpus_per_node)
    if gpus_per_node == node.gpus_per_node:
        return node
    if gpus_per_node > node.gpus_per_node:
        raise InvalidInputError(
            f"'gpus_per_node' must be at most {node.gpus_per_node} for node {node.name!r}: "
            f"got {gpus_per_node}"
        )
    # NICs are spread one per GPU (or per GPU pair) on the presets: keep the ratio
    nics = max(1, node.nics_per_node * gpus_per_node // node.gpus_per_node)
    return dataclasses.replace(
        node,
        name=f"{node.name}/{gpus_per_node}gpu",
        gpus_per_node=gpus_per_node,
        nics_per_node=nics,
        aliases=(),
    )


def _from_file(path_arg) -> tuple[Node | GPU, int, str]:
    """(node or GPU, node count, name) from a user's cluster, node or GPU file."""
    path = catalog.existing_file(path_arg, "cluster")
    shown = str(path_arg)
    data = catalog.read_toml_file(path, shown)
    if "sites" in data:  # several datacenters: perfmodel.hardware.sites
        raise InvalidInputError(f"{shown}: describes [[sites]] joined by a WAN: load it with pm.multi_cluster({shown!r})")
    if "peak_flops" in data:  # a GPU file
        return catalog.load_gpu(path), 1, ""
    if "node" not in data:  # a node file, perhaps with a node count
        fields = {k: v for k, v in data.items() if k not in ("nodes", "servers", "workers")}
        node = catalog.node_from_dict(fields, shown, path.parent, path.stem)
        return node, _count(data.get("nodes", 1), shown), ""
    for key in data:
        if key not in CLUSTER_FIELDS:
            raise InvalidInputError(f"{shown}: {unknown_name('field', key, CLUSTER_FIELDS)}")
    spec = data["node"]
    if isinstance(spec, Mapping):
        node = catalog.node_from_dict(spec, f"{shown} [node]", path.parent, f"{path.stem}-node")
    elif isinstance(spec, str):
        relative = catalog.is_path(spec) and not Path(spec).expanduser().is_absolute()
        node = _resolve(path.parent / spec if relative else spec)
    else:
        raise InvalidInputError(
            f"{shown}: 'node' must be a node name, a .toml path or a table: got {spec!r}"
        )
    return node, _count(data.get("nodes", 1), shown), str(data.get("name", ""))


def _count(value, where: str) -> int:
    try:
        return check_int("nodes", value)
    except InvalidInputError as err:
        raise InvalidInputError(f"{where}: {err}") from None


def _resolve(name_or_path) -> Node | GPU:
    """A node preset or node file, or a GPU name (the caller makes it a node)."""
    if catalog.is_path(name_or_path):
        return catalog.load_node(name_or_path)
    key = catalog.catalog_key(name_or_path)
    node_keys, gpu_keys = catalog.node_keys(), catalog.gpu_keys()
    if key in node_keys:
        return catalog.load_node(key)
    if key in gpu_keys:
        return catalog.load_gpu(key)
    raise unknown_name("node or GPU", name_or_path, [*node_keys, *gpu_keys])


def _file_roles(path_arg) -> tuple[ServerVM | None, Link | None]:
    """The ``[servers]`` (CPU-only parameter-server VMs) and ``[workers]`` (the worker VMs' network
    cap) tables of a cluster file, each None when absent."""
    data = catalog.read_toml_file(catalog.existing_file(path_arg, "cluster"), str(path_arg))
    servers = servers_from_dict(data["servers"], str(path_arg)) if "servers" in data else None
    return servers, workers_from_dict(data["workers"], str(path_arg)) if "workers" in data else None


def cluster(
    name_or_path: str = "h200", nodes: int = 1, gpus_per_node: int | None = None, servers: ServerVM | None = None,
    nic: Link | None = None, speed_spread: float | None = None,
) -> Cluster:
    """A homogeneous cluster: ``nodes`` copies of a node preset, GPU or user file.

    A GPU name gives generic nodes of ``gpus_per_node`` GPUs (default 1); a
    preset keeps its GPU count unless ``gpus_per_node`` asks for part of it. A
    file's own ``nodes`` count is used unless ``nodes`` is given (> 1).
    ``servers``: CPU-only parameter-server VMs beside the nodes (``hardware.servers.server_vm``;
    a file's ``[servers]`` table unless given). ``nic``: each node's network as one link, e.g. a
    cloud VM's cap (``hardware.cloud.vm_nic``; a file's ``[workers]`` table unless given).
    ``speed_spread``: σ of a GPU's speed over the fleet's median (``GPU.speed_spread``; unset: the GPU
    file's, else the published fleet figure), e.g. 0 for a fleet screened to one speed (docs/distributed.md).
    """
    nodes = check_int("nodes", nodes)
    name = ""
    if catalog.is_path(name_or_path):
        found, file_nodes, name = _from_file(name_or_path)
        if nodes == 1:
            nodes = file_nodes
        file_servers, file_nic = _file_roles(name_or_path)
        servers, nic = servers or file_servers, nic or file_nic
    else:
        found = _resolve(name_or_path)
    if isinstance(found, GPU):
        node = gpu_node(found, 1 if gpus_per_node is None else gpus_per_node)
    elif gpus_per_node is not None:
        node = part_of_node(found, gpus_per_node)
    else:
        node = found
    if nic is not None:  # the VM's network as its cloud caps it: one link per node
        node = dataclasses.replace(node, nic=nic, nics_per_node=1)
    if speed_spread is not None:  # the GPU checks the value
        node = dataclasses.replace(node, gpu=dataclasses.replace(node.gpu, speed_spread=speed_spread))
    return Cluster(node=node, nodes=nodes, name=name, servers=servers)


def as_cluster(value=None) -> Cluster:
    """``value`` itself when a Cluster, the named one when a name, the default H200 when None."""
    if value is None:
        return cluster()
    if isinstance(value, str):
        return cluster(value)
    if not isinstance(value, Cluster):
        raise InvalidInputError(f"'cluster' must be a Cluster (pm.cluster) or its name: got {value!r}")
    return value
