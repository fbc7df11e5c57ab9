"""Hardware descriptions: GPUs, links, nodes and clusters, and their bundled catalog.

    from perfmodel.hardware import cluster, load_gpu
    load_gpu("h100").peak("bf16")              # 989.4e12 FLOP/s, dense
    cluster("dgx-a100-80gb", nodes=16).n_gpus  # 128

Hardware is data: one TOML file per GPU and node preset, one for the links
(see docs/hardware.md). Nothing is read until a function asks for it.
"""

from perfmodel.hardware.build import as_cluster, cluster, gpu_node, part_of_node
from perfmodel.hardware.catalog import (
    compute_capability,
    list_gpus,
    list_links,
    list_nodes,
    load_gpu,
    load_link,
    load_node,
    tensor_core_dtypes,
)
from perfmodel.hardware.gpu import DTYPES, GPU
from perfmodel.hardware.link import LINK_KINDS, Link
from perfmodel.hardware.node import Cluster, Node

__all__ = [
    "as_cluster",
    "DTYPES",
    "GPU",
    "LINK_KINDS",
    "Cluster",
    "Link",
    "Node",
    "cluster",
    "compute_capability",
    "gpu_node",
    "list_gpus",
    "list_links",
    "list_nodes",
    "load_gpu",
    "load_link",
    "load_node",
    "part_of_node",
    "tensor_core_dtypes",
]
