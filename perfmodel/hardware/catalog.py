"""Load GPUs, links and nodes from TOML files: the bundled catalog or a user's file.

Bundled data lives next to this module (``data/gpus/*.toml``, ``data/links.toml``,
``data/nodes/*.toml``) and is read on first use, never at import. Unit strings
(``"80GiB"``, ``"400Gb/s"``, ``"989.4TFLOPS"``, ``"2.7us"``) are parsed here with
:mod:`perfmodel.core.units`; the objects returned hold SI numbers and are frozen.
The file format is described in ``docs/hardware.md``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path

from perfmodel.core.errors import InvalidInputError, PerfModelError, unknown_name
from perfmodel.hardware.gpu import GPU
from perfmodel.hardware.link import Link
from perfmodel.hardware.node import Node
from perfmodel.core.units import parse_bandwidth, parse_bytes, parse_duration, parse_flops
from perfmodel.core.checks import check_int
from perfmodel.core.readers import parse_toml, read_text_file

GPU_REQUIRED = ("peak_flops", "memory_bandwidth", "memory", "sm_count")
GPU_OPTIONAL = (
    "name",
    "aliases",
    "description",
    "year",
    "compute_capability",
    "source",
    "sources",
    "memory_usable",
    "l2",
    "nvlink",
    "nvlink_bandwidth",
    "pcie",
    "gpus_per_pcie",
    "tdp_w",
    "power_limit_w",
    "speed_spread",
)
LINK_REQUIRED = ("kind", "bandwidth", "latency")
LINK_OPTIONAL = (
    "name",
    "aliases",
    "description",
    "source",
    "sources",
    "nccl_busbw",
    "nccl_allreduce_busbw",
    "mesh_peers",
)
NODE_REQUIRED = ("gpu", "gpus_per_node")
NODE_OPTIONAL = (
    "name",
    "aliases",
    "description",
    "source",
    "sources",
    "intra",
    "nic",
    "nics_per_node",
)

# what a bare GPU becomes as a node: a cloud VM's NIC, unless a file says otherwise
DEFAULT_NIC = "eth25"
DEFAULT_PCIE = "pcie4"


def catalog_key(name: str) -> str:
    """Spelling-insensitive key: ``'H100_SXM5 80GB'`` -> ``'h100-sxm5-80gb'``."""
    return str(name).strip().lower().replace("_", "-").replace(" ", "-")


def is_path(name_or_path) -> bool:
    """A user's file (ends in .toml or has a directory part) rather than a catalog name."""
    if isinstance(name_or_path, os.PathLike):
        return True
    text = str(name_or_path)
    return text.endswith(".toml") or "/" in text or os.sep in text


@contextlib.contextmanager
def _located(where: str):
    """Prefix any perfmodel error raised inside with the file (and table) it came from."""
    try:
        yield
    except PerfModelError as err:
        text = str(err)
        if text.startswith(where):
            raise
        raise type(err)(f"{where}: {text}") from None


def _check_fields(data, required, optional, where: str) -> None:
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"{where}: must be a table of fields: got {data!r}")
    for name in data:  # a misspelt field first: its message suggests the right name
        if name not in required and name not in optional:
            raise InvalidInputError(
                f"{where}: {unknown_name('field', name, (*required, *optional))}"
            )
    for name in required:
        if name not in data:
            raise InvalidInputError(
                f"{where}: missing field {name!r} (required: {', '.join(required)})"
            )


def _parse_toml(text: str, where: str) -> dict:
    return parse_toml(text, where)


def existing_file(path, kind: str) -> Path:
    """The resolved path of a user's file; InvalidInputError if there is none."""
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        raise InvalidInputError(f"{kind} file {str(path)!r} does not exist")
    return resolved.resolve()


def read_toml_file(path: Path, shown: str) -> dict:
    """The table in a user's TOML file; ``shown`` is how errors name the file."""
    return _parse_toml(read_text_file(path, field=None, expect="a TOML file"), shown)


def _str_tuple(data: Mapping, name: str) -> tuple[str, ...]:
    value = data.get(name, ())
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise InvalidInputError(f"{name!r} must be a list of strings: got {value!r}")
    return tuple(catalog_key(v) for v in value)


def _sources(data: Mapping) -> dict[str, str]:
    value = data.get("sources", {})
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidInputError(f"'sources' must be a table of strings: got {value!r}")
    return dict(value)


def _link_name(data: Mapping, key: str, kinds: tuple[str, ...]) -> str | None:
    """A GPU's ``pcie`` / ``nvlink`` field: the canonical name of a bundled link of that kind."""
    if key not in data:
        return None
    links, index = _bundled_links()
    names = [name for name, link in links.items() if link.kind in kinds]
    found = index.get(catalog_key(data[key]))
    if found not in names:
        raise unknown_name(f"{key!r} link", data[key], names)
    return found


# Far outside what any accelerator (or a CPU modelled as one) reaches: a value here is a unit typo
PEAK_FLOPS_RANGE = (1e9, 1e18)
MEMORY_BANDWIDTH_RANGE = (1e8, 1e15)


def _plausible(value: float, field: str, bounds: tuple[float, float], unit: str) -> float:
    low, high = bounds
    if not low <= value <= high:
        raise InvalidInputError(f"{field!r} must be between {low:.0e} and {high:.0e} {unit}: got {value:.3g} "
                                "(a unit prefix off?)")
    return value


def _capability(value) -> float | None:
    """A CUDA compute capability written "major.minor" (e.g. "9.0"), as a number; None where not given."""
    if value is None:
        return None
    text = str(value)
    major, _, minor = text.partition(".")
    if not (major.isdigit() and minor.isdigit() and len(minor) == 1):
        raise InvalidInputError(f"'compute_capability' must be written major.minor, e.g. \"9.0\" (sm_90) or "
                                f"\"8.0\" (sm_80): got {value!r}")
    return float(text)


def gpu_from_dict(data: Mapping, where: str, default_name: str = "") -> GPU:
    """Build a GPU from one TOML table (units parsed); errors name ``where``."""
    with _located(where):
        _check_fields(data, GPU_REQUIRED, GPU_OPTIONAL, where)
        peaks = data["peak_flops"]
        if not isinstance(peaks, Mapping):
            raise InvalidInputError(f"'peak_flops' must be a table of dtype = rate: got {peaks!r}")
        memory = parse_bytes(data["memory"], "memory")
        if "memory_usable" in data:
            memory = parse_bytes(data["memory_usable"], "memory_usable")
        optional_bytes = {
            "l2": parse_bytes(data["l2"], "l2") if "l2" in data else None,
            "nvlink": (
                parse_bandwidth(data["nvlink_bandwidth"], "nvlink_bandwidth")
                if "nvlink_bandwidth" in data
                else None
            ),
        }
        year = data.get("year")
        return GPU(
            name=catalog_key(data.get("name", default_name)),
            peak_flops={d: _plausible(parse_flops(v, f"peak_flops.{d}"), f"peak_flops.{d}", PEAK_FLOPS_RANGE, "FLOP/s")
                        for d, v in peaks.items()},
            mem_bw_bytes_per_s=_plausible(parse_bandwidth(data["memory_bandwidth"], "memory_bandwidth"),
                                          "memory_bandwidth", MEMORY_BANDWIDTH_RANGE, "B/s"),
            mem_bytes=memory,
            sm_count=data["sm_count"],
            l2_bytes=optional_bytes["l2"],
            nvlink_bw_bytes_per_s=optional_bytes["nvlink"],
            pcie=_link_name(data, "pcie", ("pcie",)),
            gpus_per_pcie=check_int("gpus_per_pcie", data.get("gpus_per_pcie", 1), minimum=1),
            tdp_w=data.get("tdp_w"),
            power_limit_w=data.get("power_limit_w"),
            speed_spread=data.get("speed_spread"),
            aliases=_str_tuple(data, "aliases"),
            source=str(data.get("source", "")),
            nvlink=_link_name(data, "nvlink", ("nvlink",)),
            year=None if year is None else check_int("year", year),
            compute_capability=_capability(data.get("compute_capability")),
            description=str(data.get("description", "")),
            sources=_sources(data),
        )


def link_from_dict(data: Mapping, where: str, default_name: str = "") -> Link:
    """Build a Link from one TOML table (units parsed); errors name ``where``."""
    with _located(where):
        _check_fields(data, LINK_REQUIRED, LINK_OPTIONAL, where)

        def rate(key):
            return parse_bandwidth(data[key], key) if key in data else None

        return Link(
            name=catalog_key(data.get("name", default_name)),
            kind=data["kind"],
            bw_bytes_per_s=parse_bandwidth(data["bandwidth"], "bandwidth"),
            latency_s=parse_duration(data["latency"], "latency"),
            nccl_busbw_bytes_per_s=rate("nccl_busbw"),
            source=str(data.get("source", "")),
            aliases=_str_tuple(data, "aliases"),
            nccl_allreduce_busbw_bytes_per_s=rate("nccl_allreduce_busbw"),
            description=str(data.get("description", "")),
            sources=_sources(data),
            mesh_peers=data.get("mesh_peers"),
        )


# ---------------------------------------------------------------- bundled catalog


def _data_dir():
    return resources.files("perfmodel.hardware").joinpath("data")


def _index(items: dict, kind: str) -> dict[str, str]:
    """Map every name and alias to its canonical name; an alias used twice is a data bug."""
    index: dict[str, str] = {}
    for name, item in items.items():
        for key in (name, *item.aliases):
            if index.get(key, name) != name:
                raise InvalidInputError(
                    f"{kind} alias {key!r} names both {index[key]!r} and {name!r}"
                )
            index[key] = name
    return index


@cache
def _bundled_gpus() -> tuple[dict[str, GPU], dict[str, str]]:
    gpus = {}
    for entry in sorted(_data_dir().joinpath("gpus").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            where = f"catalog gpus/{entry.name}"
            gpu = gpu_from_dict(_parse_toml(entry.read_text(encoding="utf-8"), where), where)
            gpus[gpu.name] = gpu
    return gpus, _index(gpus, "GPU")


@cache
def _bundled_links() -> tuple[dict[str, Link], dict[str, str]]:
    where = "catalog links.toml"
    tables = _parse_toml(_data_dir().joinpath("links.toml").read_text(encoding="utf-8"), where)
    links = {
        catalog_key(name): link_from_dict(table, f"{where} [{name}]", name)
        for name, table in tables.items()
    }
    return links, _index(links, "link")


@cache
def _bundled_nodes() -> tuple[dict[str, Node], dict[str, str]]:
    nodes = {}
    for entry in sorted(_data_dir().joinpath("nodes").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            where = f"catalog nodes/{entry.name}"
            data = _parse_toml(entry.read_text(encoding="utf-8"), where)
            node = node_from_dict(data, where, None, entry.name[: -len(".toml")])
            nodes[node.name] = node
    return nodes, _index(nodes, "node")


def _lookup(kind: str, name: str, catalog: tuple[dict, dict]):
    items, index = catalog
    key = catalog_key(name)
    if key not in index:
        raise unknown_name(kind, name, index)
    return items[index[key]]


def gpu_keys() -> frozenset[str]:
    """Every bundled GPU name and alias."""
    return frozenset(_bundled_gpus()[1])


def node_keys() -> frozenset[str]:
    """Every bundled node preset name and alias."""
    return frozenset(_bundled_nodes()[1])


def list_gpus() -> list[str]:
    """Canonical names of the bundled GPUs (aliases resolve through load_gpu)."""
    return sorted(_bundled_gpus()[0])


def list_links() -> list[str]:
    """Canonical names of the bundled links."""
    return sorted(_bundled_links()[0])


def list_nodes() -> list[str]:
    """Canonical names of the bundled node presets."""
    return sorted(_bundled_nodes()[0])


# ---------------------------------------------------------------- public loaders


@lru_cache(maxsize=64)
def _gpu_file(path: Path, shown: str, mtime_ns: int) -> GPU:
    return gpu_from_dict(read_toml_file(path, shown), shown, default_name=path.stem)


def _load(kind: str, cls, name_or_path, from_file, bundled):
    """``name_or_path`` as is when already a ``cls``; a user's TOML file (cached until it
    changes); else a bundled entry by name or alias."""
    if isinstance(name_or_path, cls):
        return name_or_path
    if is_path(name_or_path):
        path = existing_file(name_or_path, kind)
        return from_file(path, str(name_or_path), path.stat().st_mtime_ns)
    return _lookup(kind, name_or_path, bundled())


def load_gpu(name_or_path) -> GPU:
    """A bundled GPU by name or alias (``'h100'``), or a user's GPU TOML file."""
    return _load("GPU", GPU, name_or_path, _gpu_file, _bundled_gpus)


@cache
def tensor_core_dtypes(gpu_name: str) -> tuple:
    """The dtypes the named GPU multiplies on tensor cores (``GPU.tensor_core_dtypes``); a GPU not in the
    catalog (a user's profile of another card) is taken to have them for every 16-bit and tf32 dtype, as every
    GPU since Ampere."""
    try:
        return load_gpu(gpu_name).tensor_core_dtypes
    except PerfModelError:
        return ("tf32", "bf16", "fp16", "fp8")


def compute_capability(gpu_name: str) -> float | None:
    """The named GPU's CUDA compute capability (9.0 for sm_90); None for a GPU not in the catalog or one whose
    description does not give it."""
    try:
        return load_gpu(gpu_name).compute_capability
    except PerfModelError:
        return None


def load_link(name) -> Link:
    """A bundled link by name or alias (``'nvlink4-nvswitch'``, ``'hdr'``, ``'25gbe'``)."""
    if isinstance(name, Link):
        return name
    return _lookup("link", name, _bundled_links())


@lru_cache(maxsize=64)
def _node_file(path: Path, shown: str, mtime_ns: int) -> Node:
    return node_from_dict(read_toml_file(path, shown), shown, path.parent, path.stem)


def load_node(name_or_path) -> Node:
    """A bundled node preset by name or alias (``'dgx-h100'``), or a user's node TOML file."""
    return _load("node", Node, name_or_path, _node_file, _bundled_nodes)


def _gpu_ref(value, where: str, base: Path | None) -> GPU:
    """A node's ``gpu``: a catalog name, a path (relative to the node's file) or a table."""
    if isinstance(value, Mapping):
        return gpu_from_dict(value, f"{where} [gpu]", default_name="custom-gpu")
    if not isinstance(value, str):
        raise InvalidInputError(
            f"{where}: 'gpu' must be a GPU name, a .toml path or a table: got {value!r}"
        )
    if is_path(value) and base is not None and not Path(value).expanduser().is_absolute():
        return load_gpu(base / value)
    return load_gpu(value)


def _link_ref(value, role: str, where: str) -> Link:
    if isinstance(value, Mapping):
        return link_from_dict(value, f"{where} [{role}]", default_name=f"custom-{role}")
    if not isinstance(value, str):
        raise InvalidInputError(f"{where}: {role!r} must be a link name or a table: got {value!r}")
    with _located(where):
        return load_link(value)


def default_intra(gpu: GPU, gpus_per_node: int) -> Link:
    """GPUs of one node talk over NVSwitch of their NVLink generation, else PCIe."""
    if gpus_per_node > 1 and gpu.nvlink:
        switched = f"{gpu.nvlink}-nvswitch"
        return load_link(switched if switched in _bundled_links()[1] else gpu.nvlink)
    return load_link(gpu.pcie or DEFAULT_PCIE)


def node_from_dict(data: Mapping, where: str, base: Path | None, default_name: str = "") -> Node:
    """Build a Node from one TOML table; ``base`` resolves relative GPU paths."""
    with _located(where):
        _check_fields(data, NODE_REQUIRED, NODE_OPTIONAL, where)
        gpu = _gpu_ref(data["gpu"], where, base)
        gpus_per_node = check_int("gpus_per_node", data["gpus_per_node"])
        if "intra" in data:
            intra = _link_ref(data["intra"], "intra", where)
        else:
            intra = default_intra(gpu, gpus_per_node)
        return Node(
            name=catalog_key(data.get("name", default_name)),
            gpu=gpu,
            gpus_per_node=gpus_per_node,
            intra=intra,
            nic=_link_ref(data.get("nic", DEFAULT_NIC), "nic", where),
            nics_per_node=data.get("nics_per_node", 1),
            source=str(data.get("source", "")),
            aliases=_str_tuple(data, "aliases"),
            description=str(data.get("description", "")),
            sources=_sources(data),
        )
