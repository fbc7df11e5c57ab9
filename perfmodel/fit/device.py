"""Which device calibration tables were measured on, read from their ``metadata.json``.

``perfmodel fit`` names the profile after that device: a catalog GPU matched
from the CUDA device name (``NVIDIA H200`` -> ``h200-sxm-141gb``), or, for
tables measured on a CPU, the host described as a device in a TOML file
written beside the profile (``perfmodel.validate.host``). A ``--gpu`` that
contradicts the tables is refused unless the user says it is deliberate.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from perfmodel.core.errors import InvalidInputError, UnknownNameError
from perfmodel.hardware import list_gpus, load_gpu

CPU = "cpu"


@dataclass(frozen=True)
class Measured:
    """The device of a set of calibration folders: ``kind`` "cuda" or "cpu" (None: not recorded)."""

    kind: str | None
    device_name: str | None   # as torch reported it ("NVIDIA H200", the CPU model)
    gpu: str | None           # catalog GPU matched to a CUDA device name (None: no match or a CPU)
    meta: dict


def read_metadata(folder) -> dict:
    """``metadata.json`` of a calibration folder; for folders of the earlier harness, the device fields
    of the first line of ``env.jsonl``; {} when neither is there or readable."""
    path, env = Path(folder) / "metadata.json", Path(folder) / "env.jsonl"
    try:
        if path.is_file():
            data = json.loads(path.read_text())
        elif env.is_file():
            first = json.loads(env.read_text().splitlines()[0])
            data = {"device": first.get("device"), "device_name": first.get("name"),
                    "gpu_memory_bytes": first.get("mem_bytes")}
        else:
            data = {}
    except (OSError, ValueError, IndexError):
        return {}
    return data if isinstance(data, dict) else {}


def catalog_gpu(device_name: str, memory_bytes: float | None = None) -> str | None:
    """The catalog GPU a CUDA device name describes: the longest leading run of its words that is a
    catalog name or alias ("NVIDIA H100 80GB HBM3" -> h100...), the closest memory size breaking ties."""
    words = [w for w in re.split(r"[^a-z0-9]+", str(device_name).lower()) if w and w not in ("nvidia", "tesla")]
    for n in range(len(words), 0, -1):
        key = "-".join(words[:n])
        try:
            return load_gpu(key).name
        except UnknownNameError:
            pass
    family = [g for g in list_gpus() if words and g.split("-")[0] == words[0]]
    if not family:
        return None
    if memory_bytes:
        return min(family, key=lambda g: abs(load_gpu(g).mem_bytes - float(memory_bytes)))
    return family[0] if len(family) == 1 else None


def measured_device(folders) -> Measured:
    """The one device all ``folders`` were measured on; folders of different devices are refused."""
    found = {}
    for folder in folders:
        meta = read_metadata(folder)
        kind = meta.get("device") or ("cuda" if meta.get("source") == "nccl-tests" and meta.get("device_name")
                                      else None)  # imported nccl-tests logs name the GPU only
        if kind:
            name = meta.get("device_name") or meta.get("cpu_model") or kind
            found.setdefault((kind, name), (folder, meta))
    if not found:
        return Measured(None, None, None, {})
    if len(found) > 1:
        listed = "; ".join(f"{f}: {name} ({kind})" for (kind, name), (f, _) in found.items())
        raise InvalidInputError(f"'tables' were measured on different devices ({listed}): fit each device's "
                                "folders into its own profile")
    (kind, name), (_, meta) = next(iter(found.items()))
    gpu = catalog_gpu(name, meta.get("gpu_memory_bytes")) if kind == "cuda" else None
    return Measured(kind, name, gpu, meta)


def choose_gpu(measured: Measured, gpu: str | None, *, allow_mismatch: bool = False) -> str:
    """The GPU a fit describes: ``gpu`` as given, else the measured device ("cpu" for a CPU host).

    A ``gpu`` other than the measured device is refused unless ``allow_mismatch``.
    """
    if gpu is None:
        if measured.kind == CPU:
            return CPU
        if measured.gpu:
            return measured.gpu
        if measured.kind is None:
            raise InvalidInputError("the tables do not say which device measured them (no metadata.json with "
                                    "'device'): give --gpu, e.g. --gpu h100")
        raise InvalidInputError(f"the tables were measured on {measured.device_name!r}, which is not a catalog "
                                "GPU: describe it in a TOML file and give --gpu FILE.toml (docs/hardware.md)")
    if measured.kind is None or allow_mismatch:
        return gpu
    if gpu == CPU:
        mismatch = measured.kind != CPU
    else:
        mismatch = measured.kind == CPU or (measured.gpu is not None and load_gpu(gpu).name != measured.gpu)
    if mismatch:
        what = measured.gpu or measured.device_name
        raise InvalidInputError(f"--gpu {gpu} contradicts the tables, measured on {measured.device_name!r}"
                                f"{f' ({what})' if what != measured.device_name else ''}: leave --gpu out to name "
                                "the profile after the measured device, or add --allow-gpu-mismatch for a "
                                "deliberate what-if")
    return gpu


def host_slug(device_name: str | None) -> str:
    """A file and profile name for a CPU host: "cpu-" and its model in lower-case words."""
    words = [w for w in re.split(r"[^a-z0-9]+", str(device_name or "").lower()) if w and w not in ("r", "tm")]
    return "-".join(["cpu", *words[:6]]) if words else "cpu-host"
