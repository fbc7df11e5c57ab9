"""Interference table: how much a kernel class slows when another job runs a class beside it.

``coefficient(a, b)`` is the fractional slowdown of class ``a`` while a co-located job runs
class ``b`` at the same time (0: no effect, 1: twice as long, as when two kernels that each
saturate the same unit split it evenly). Classes: ``compute`` (GEMM and attention: SMs or
cores), ``memory`` (bandwidth-bound elementwise, norms, optimizer), ``launch`` (the host issuing
small kernels; on a GPU the device idles meanwhile). ``switch_fraction`` is the time lost per
time slice when a device alternates between jobs (context switch / slice length).
``coefficient(a, "other")``: the slowdown of class ``a`` while other users' work (of no known
class) runs beside it on another unit; on a CPU host of SMT siblings that work shares the core's
pipelines, caches and DRAM with it, alone or not (0 where unmeasured: the GPU default).

Tables are plain JSON (``data/interference-*.json``): the GPU default is the resource bound
below; a measured one comes from ``calibration.interference`` via ``perfmodel.fit.interference``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from perfmodel.core.errors import InvalidInputError, ProfileError, unknown_name
from perfmodel.hardware.common import FrozenMap

CLASSES = ("compute", "memory", "launch")
OTHER = "other"  # other users' work beside a job: the second half of a key only
DATA = Path(__file__).resolve().parent / "data"
# "cpu": fitted on the nearly idle host's kernel rows; "cpu-busy": on those taken among 5-8 other
# users' sessions (docs/contention.md says why the idle set is the default)
BUNDLED = {"gpu-default": DATA / "interference-gpu-default.json", "cpu": DATA / "interference-cpu.json",
           "cpu-busy": DATA / "interference-cpu-busy.json"}


@dataclass(frozen=True)
class InterferenceTable:
    """Pairwise class slowdowns (``coefficients[(a, b)]``), the time-slice loss and their provenance."""

    name: str
    coefficients: FrozenMap
    switch_fraction: float = 0.0
    cv_error: float | None = None  # median |relative error| of held-out slowdowns, where fitted
    n_points: int = 0
    source: str = ""
    meta: FrozenMap = field(default_factory=FrozenMap)

    def coefficient(self, a: str, b: str) -> float:
        if a not in CLASSES:
            raise unknown_name("kernel class", a, CLASSES)
        if b not in CLASSES + (OTHER,):
            raise unknown_name("kernel class", b, CLASSES + (OTHER,))
        return float(self.coefficients.get(f"{a}|{b}", 0.0))

    def to_dict(self) -> dict:
        return {"name": self.name, "coefficients": dict(self.coefficients), "switch_fraction": self.switch_fraction,
                "cv_error": self.cv_error, "n_points": self.n_points, "source": self.source, "meta": dict(self.meta)}

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n")

    def __repr__(self) -> str:
        cv = "" if self.cv_error is None else f", cv_error={self.cv_error:.1%}"
        return f"InterferenceTable({self.name!r}, {len(self.coefficients)} pairs, switch={self.switch_fraction:.3f}{cv})"


def table_from_dict(data: dict, origin: str = "interference table") -> InterferenceTable:
    """Check and build a table from plain data (keys ``"a|b"`` of CLASSES, b also ``"other"``; values >= 0)."""
    if not isinstance(data, dict) or "coefficients" not in data:
        raise ProfileError(f"{origin}: expected an object with 'coefficients'")
    coeffs = {}
    for key, value in dict(data["coefficients"]).items():
        parts = str(key).split("|")
        if len(parts) != 2 or parts[0] not in CLASSES or parts[1] not in CLASSES + (OTHER,):
            raise ProfileError(f"{origin}: coefficient key {key!r} must be 'a|b' with a, b in {', '.join(CLASSES)} "
                               f"(b also {OTHER!r})")
        if not isinstance(value, (int, float)) or not value >= 0:
            raise ProfileError(f"{origin}: coefficient {key!r} must be a number >= 0: got {value!r}")
        coeffs[key] = float(value)
    switch = data.get("switch_fraction", 0.0)
    if not isinstance(switch, (int, float)) or not 0 <= switch < 1:
        raise ProfileError(f"{origin}: 'switch_fraction' must be in [0, 1): got {switch!r}")
    return InterferenceTable(str(data.get("name", origin)), FrozenMap(coeffs), float(switch), data.get("cv_error"),
                             int(data.get("n_points", 0)), str(data.get("source", "")), FrozenMap(data.get("meta", {})))


GPU_MODES = ("time-slice", "mps")  # the sharing modes a measured GPU table is keyed by


def gpu_table_path(gpu: str, mode: str, folder=None) -> Path:
    """Where a GPU's measured table for ``mode`` is bundled (``perfmodel.fit.gpu_interference`` writes it)."""
    if mode not in GPU_MODES:
        raise unknown_name("GPU sharing mode", mode, GPU_MODES)
    return Path(DATA if folder is None else folder) / f"interference-gpu-{gpu}-{mode}.json"


def gpu_interference(gpu: str, mode: str, folder=None):
    """The measured table of GPU ``gpu`` (its catalogue name) under ``mode``, or "gpu-default"
    (the resource bound) where that GPU and mode were never measured."""
    path = gpu_table_path(gpu, mode, folder)
    return load_interference(path) if path.is_file() else "gpu-default"


def load_interference(name_or_path=None) -> InterferenceTable:
    """A bundled table (``"gpu-default"``, ``"cpu"``, ``"cpu-busy"``), a JSON file, or a table itself; None: the GPU default."""
    if isinstance(name_or_path, InterferenceTable):
        return name_or_path
    if name_or_path is None:
        name_or_path = "gpu-default"
    if not isinstance(name_or_path, (str, Path)):
        raise InvalidInputError(f"'interference' must be a table, a bundled name ({', '.join(BUNDLED)}) or a JSON "
                                f"file: got {type(name_or_path).__name__}")
    path = BUNDLED.get(str(name_or_path), Path(name_or_path))
    if not path.is_file():
        raise unknown_name("interference table (or missing file)", str(name_or_path), BUNDLED)
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise ProfileError(f"interference table {str(name_or_path)!r} is not valid JSON: {e}") from None
    return table_from_dict(data, origin=str(name_or_path))
