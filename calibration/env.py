"""Where a calibration runs: the machine's description and the launcher's variables.

``machine_metadata`` describes the host, its accelerator and software versions
(written to ``metadata.json`` beside every table); ``dist_env`` reads the
variables torchrun or SLURM set for a distributed run.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone

import torch


def command_output(cmd: list[str], timeout_s: float = 10.0) -> str:
    """stdout of ``cmd``, or "" when it is missing or fails."""
    if shutil.which(cmd[0]) is None:
        return ""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_bytes() -> int | None:
    """Physical memory of the host in bytes, when the OS says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def available_memory_bytes() -> int | None:
    """Memory the host can still give (``MemAvailable``), when the OS says."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel prints kB = 1024 bytes
    except (OSError, ValueError, IndexError):
        pass
    return None


def device_name(device: str) -> str:
    """``'NVIDIA H200'`` on a GPU, the CPU model on the CPU."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return cpu_model()


def _gpu_section(device: str) -> dict:
    props = torch.cuda.get_device_properties(torch.device(device))
    nccl = torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else None
    driver = command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return {
        "gpu_count": torch.cuda.device_count(),
        "gpu_memory_bytes": props.total_memory,
        "sm_count": props.multi_processor_count,
        "compute_capability": f"{props.major}.{props.minor}",
        "l2_cache_bytes": getattr(props, "L2_cache_size", None),
        "driver": driver.splitlines()[0] if driver else None,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl,
        "topology": command_output(["nvidia-smi", "topo", "-m"]) or None,
        "clocks": command_output(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem,power.limit",
                        "--format=csv"]) or None,
    }


def command_line() -> str:
    """This process's command line, as ``python -m module ...`` when started with -m."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = [sys.executable, "-m", spec.name] if spec is not None and spec.name else [sys.executable, sys.argv[0]]
    return shlex.join([*head, *sys.argv[1:]])


def machine_metadata(device: str, *, flags: dict | None = None) -> dict:
    """Description of this machine and run for ``metadata.json``."""
    meta = {
        "host": socket.gethostname(),
        "hosts": [socket.gethostname()],
        "device": "cuda" if device.startswith("cuda") else "cpu",
        "device_name": device_name(device),
        "gpu_count": 0,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "memory_bytes": memory_bytes(),
        "world_size": 1,
        "nodes": 1,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command_line(),
    }
    if meta["device"] == "cuda":
        meta.update(_gpu_section(device))
    meta.update(flags or {})
    return meta


def identity(meta: dict) -> dict:
    """The fields that say which machine a table was measured on."""
    return {
        "hosts": sorted(meta.get("hosts") or [meta.get("host")]),
        "device": meta.get("device"),
        "device_name": meta.get("device_name"),
    }


@dataclass(frozen=True)
class DistEnv:
    """One process's place in a distributed run, as the launcher announced it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun" or "slurm"


def _slurm_tasks_per_node(environ) -> int | None:
    # SLURM_NTASKS_PER_NODE is "8"; SLURM_TASKS_PER_NODE is "8(x2)" or "8,4"
    for key in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        value = environ.get(key, "")
        head = value.split(",")[0].split("(")[0]
        if head.isdigit():
            return int(head)
    return None


def _slurm_master(environ) -> str | None:
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        return None
    hosts = command_output(["scontrol", "show", "hostnames", nodelist]).split()
    if hosts:
        return hosts[0]
    return nodelist if all(c not in nodelist for c in "[],") else None


def dist_env(environ=None) -> DistEnv | None:
    """The torchrun (RANK, WORLD_SIZE, ...) or SLURM (SLURM_PROCID, ...) variables, or None."""
    environ = os.environ if environ is None else environ
    if "RANK" in environ and "WORLD_SIZE" in environ:
        world = int(environ["WORLD_SIZE"])
        return DistEnv(
            rank=int(environ["RANK"]), world_size=world,
            local_rank=int(environ.get("LOCAL_RANK", 0)),
            local_world_size=int(environ.get("LOCAL_WORLD_SIZE", world)),
            master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(environ.get("MASTER_PORT", 29500)), launcher="torchrun",
        )
    if "SLURM_PROCID" in environ and int(environ.get("SLURM_NTASKS", "1")) > 1:
        world = int(environ["SLURM_NTASKS"])
        master = environ.get("MASTER_ADDR") or _slurm_master(environ)
        if master is None:
            return None
        return DistEnv(
            rank=int(environ["SLURM_PROCID"]), world_size=world,
            local_rank=int(environ.get("SLURM_LOCALID", 0)),
            local_world_size=_slurm_tasks_per_node(environ) or world,
            master_addr=master, master_port=int(environ.get("MASTER_PORT", 29500)),
            launcher="slurm",
        )
    return None
