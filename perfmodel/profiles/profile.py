"""Profile: fitted closed forms for one GPU (and its node's fabrics), as plain JSON data.

A profile maps each compute class (``gemm:bf16``, ``layernorm:fp32:fwd``...)
and each collective per fabric level to ``{"form", "params", "cv_mape",
"n_points", "source"}``. Loading validates the schema and never executes
anything: a form is looked up by name in :mod:`perfmodel.forms.registry`.
"""

from __future__ import annotations

import copy
import json
import math
import numbers
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np
from perfmodel.core.lazy import sympy as sp  # imported on first symbolic use

from perfmodel.core.choices import COLLECTIVES, LEVELS
from perfmodel.core.errors import ProfileError, unknown_name
from perfmodel.core.frozen import freeze
from perfmodel.forms.comm import collective_expression
from perfmodel.forms.registry import get_form
from perfmodel.core.units import DTYPE_BYTES
from perfmodel.core.checks import read_json_file

SCHEMA_VERSION = 1
ENTRY_FIELDS = ("form", "params")


@dataclass(frozen=True)
class Profile:
    """Fitted cost model of one GPU type; ``collectives[level][collective]`` for its fabrics.

    Read-only: its sections are frozen mappings; a changed profile is a new one,
    ``dataclasses.replace(profile, host={**profile.host, "cpu_per_kernel_s": 1e-5})``.
    """

    name: str
    gpu: str
    compute: dict = field(default_factory=dict)
    collectives: dict = field(default_factory=dict)
    host: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def __post_init__(self):  # read-only all the way down: a bundled profile is shared by every caller
        for name in ("compute", "collectives", "host", "meta"):
            object.__setattr__(self, name, freeze(getattr(self, name)))

    def __repr__(self) -> str:
        return (f"Profile(name={self.name!r}, gpu={self.gpu!r}, compute={len(self.compute)} classes, "
                f"collectives={sorted(self.collectives)})")

    # -- lookup --------------------------------------------------------------
    def entry(self, key: str) -> dict:
        try:
            return self.compute[key]
        except KeyError:
            raise unknown_name(f"compute class in profile {self.name!r}", key, self.compute) from None

    def has(self, key: str) -> bool:
        return key in self.compute

    def mem_entry(self, cls: str, dtype: str, variant: str) -> tuple[dict, float]:
        """Entry of a memory-bound class and the factor to scale elements by.

        Prefers the entry measured in ``dtype``; otherwise uses another dtype's
        entry with elements scaled by the ratio of element sizes (same bytes).
        """
        exact = f"{cls}:{dtype}:{variant}"
        if exact in self.compute:
            return self.compute[exact], 1.0
        for key, entry in self.compute.items():
            parts = key.split(":")
            if len(parts) == 3 and parts[0] == cls and parts[2] == variant:
                return entry, DTYPE_BYTES.get(dtype, 4) / DTYPE_BYTES.get(parts[1], 4)
        raise unknown_name(f"memory-bound class in profile {self.name!r}", exact, self.compute)

    def formula(self, cls: str, *, dtype: str | None = None, variant: str | None = None,
                level: str | None = None, **symbols):
        """The sympy expression of a fitted class or collective.

        ``profile.formula("gemm", dtype="bf16")``; ``profile.formula("all_reduce", level="intra")``.
        """
        for name, value in (("cls", cls), ("dtype", dtype), ("variant", variant), ("level", level)):
            if value is not None and not isinstance(value, str):
                raise ProfileError(f"{name!r} must be a name: got {value!r}")
        if level is not None:
            if level not in self.collectives:
                raise unknown_name(f"collective level of profile {self.name!r}; level", level, self.collectives)
            entry = self.collectives[level].get(cls)
            if entry is None:
                raise unknown_name(f"collective at level {level!r}", cls, self.collectives[level])
            _check_symbols(symbols, ("size", "n"), f"{cls} at level {level!r}")
            if _number(symbols.get("n")) and symbols["n"] < 2:
                raise ProfileError(f"'n' must be >= 2 ranks (a group of one communicates nothing): got {symbols['n']!r}")
            if cls not in COLLECTIVES:
                raise unknown_name("collective", cls, COLLECTIVES)
            params = {k: float(v) for k, v in entry["params"].items()}
            return collective_expression(get_form(entry["form"]), params, cls,
                                         size=symbols.get("size", sp.Symbol("S")), n=symbols.get("n", sp.Symbol("n")))
        key = ":".join(p for p in (cls, dtype, variant) if p)
        if key not in self.compute and dtype and variant is None:
            key = f"{cls}:{dtype}:fwd"
        entry = self.entry(key)
        form = get_form(entry["form"])
        _check_symbols(symbols, form.variables, key)
        return form.expression(entry["params"], **symbols)

    # -- (de)serialisation -----------------------------------------------------
    def to_dict(self) -> dict:
        """A deep copy as plain data (safe to modify)."""
        return copy.deepcopy({"schema_version": SCHEMA_VERSION, "name": self.name, "gpu": self.gpu,
                              "host": self.host, "meta": self.meta, "compute": self.compute,
                              "collectives": self.collectives})

    def save(self, path: str | Path) -> None:
        if not isinstance(path, (str, Path)) or not str(path):
            raise ProfileError(f"'path' must be a file name: got {path!r}")
        path = Path(path)
        if path.is_dir():
            raise ProfileError(f"'path' {str(path)!r} is a folder; give a file name such as profile.json")
        if not path.parent.is_dir():
            raise ProfileError(f"'path' {str(path)!r}: folder {str(path.parent)!r} does not exist")
        path.write_text(json.dumps(_plain(self.to_dict()), indent=1, sort_keys=True))

    @classmethod
    def from_dict(cls, data: dict, *, origin: str = "profile") -> Profile:
        _validate(data, origin)
        return cls(data["name"], data["gpu"], data.get("compute", {}), data.get("collectives", {}),
                   data.get("host", {}), data.get("meta", {}))


def _check_symbols(symbols: dict, variables, what: str) -> None:
    """Keyword values of ``formula``: known variables only; numbers finite and > 0 (sizes, counts)."""
    unknown = [k for k in symbols if k not in variables]
    if unknown:
        raise ProfileError(f"{what} takes variables {list(variables)}: got {unknown}")
    for name, value in symbols.items():
        if isinstance(value, sp.Basic):
            continue
        if not _number(value) or value <= 0:
            raise ProfileError(f"{name!r} must be a finite number > 0 or a sympy expression: got {value!r}")


def _plain(obj):
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (np.floating, np.integer)):
        return obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


# Parameters that divide (rates, bandwidths, sizes, efficiency fractions): zero would price a kernel
# at infinite time. Every other parameter may be zero (a latency, a floor, a saturation constant).
POSITIVE_PARAMS = frozenset({"R", "R_mis", "bw", "busbw_bytes_per_s", "sms", "T", "elem_bytes", "e16", "e8", "e4",
                             "p16", "p8", "p4", "p2", "p_both", "p_mis", "q"})


# What is physically possible for each parameter (inclusive): a profile outside these is not a
# measurement, and priced it gives inf/NaN (a rate of 5e-324, a latency of 1e308 s). Names not listed
# (half-saturation sizes, efficiency factors) are bounded by the default.
_SECONDS, _PER_UNIT, _RATE, _EXPONENT = (0.0, 10.0), (0.0, 1.0), (1e3, 1e18), (0.0, 16.0)
PARAM_BOUNDS = {
    **dict.fromkeys(("t0", "t_cpu", "t_split", "alpha_s", "alpha_rank_s"), (_SECONDS, "seconds")),
    **dict.fromkeys(("beta", "beta_row", "beta_y", "c_row"), (_PER_UNIT, "seconds per FLOP, byte or row")),
    **dict.fromkeys(("R", "R_mis", "bw", "busbw_bytes_per_s"), (_RATE, "FLOP/s or bytes/s")),
    **dict.fromkeys(("gamma", "q", "exponent"), (_EXPONENT, "an exponent")),
    **dict.fromkeys(("sms", "T"), ((1.0, 1e6), "a count of SMs or tile rows")),
    "elem_bytes": ((0.125, 64.0), "bytes per element"),
}
DEFAULT_BOUNDS = ((0.0, 1e15), "a size or a factor")


def _check_bounds(where: str, name: str, value) -> None:
    (low, high), what = PARAM_BOUNDS.get(name, DEFAULT_BOUNDS)
    if not low <= value <= high:
        raise ProfileError(f"{where}: parameter {name!r} = {value!r} is outside what is physically possible "
                           f"for {what} ({low:g} to {high:g})")


HOST_FLAGS = ("serial",)  # host entries that are switches (a CPU runs its host work and kernels serially)


def _number(value) -> bool:
    """A finite real number (numpy scalars included), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _validate(data, origin: str) -> None:

    if not isinstance(data, dict):
        raise ProfileError(f"{origin}: a profile must be a JSON object")
    version = data.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ProfileError(f"{origin}: 'schema_version' missing or not an integer >= 1: got {version!r}")
    if version > SCHEMA_VERSION:
        raise ProfileError(f"{origin}: schema_version {version} is newer than this perfmodel understands "
                           f"({SCHEMA_VERSION}); upgrade perfmodel (pip install -U perfmodel)")
    for key in ("name", "gpu"):
        if not isinstance(data.get(key), str):
            raise ProfileError(f"{origin}: field {key!r} missing or not a string")
    for key in ("compute", "collectives", "host", "meta"):
        if not isinstance(data.get(key, {}), dict):
            raise ProfileError(f"{origin}: {key!r} must be an object (name -> value), got {type(data[key]).__name__}")
    for key, value in data.get("host", {}).items():
        if key in HOST_FLAGS:
            if not isinstance(value, bool):
                raise ProfileError(f"{origin}: host.{key} must be true or false: got {value!r}")
        elif not (isinstance(value, str) and key.endswith("_source")) and not (_number(value) and 0 <= value <= 10):
            raise ProfileError(f"{origin}: host.{key} must be a number of seconds between 0 and 10 (a host cost "
                               f"per kernel, bucket or step): got {value!r}")

    for level in data.get("collectives", {}):
        if level not in LEVELS:
            raise ProfileError(f"{origin}: unknown collectives level {level!r} (valid: {', '.join(LEVELS)})")
    sections = [("compute", data.get("compute", {}))]
    sections += [(f"collectives.{lvl}", v) for lvl, v in data.get("collectives", {}).items()]
    for section, entries in sections:
        if not isinstance(entries, dict):
            raise ProfileError(f"{origin}: {section!r} must be an object")
        communication = section.startswith("collectives.")
        for key, entry in entries.items():
            where = f"{origin}: {section}.{key}"
            if communication and key not in COLLECTIVES:
                raise ProfileError(f"{where}: unknown collective {key!r} (valid: {', '.join(COLLECTIVES)})")
            if not isinstance(entry, dict) or any(f not in entry for f in ENTRY_FIELDS):
                raise ProfileError(f"{where} needs fields {list(ENTRY_FIELDS)}")
            if not isinstance(entry["form"], str):
                raise ProfileError(f"{where}: 'form' must be a form name: got {entry['form']!r}")
            form = get_form(entry["form"])
            if communication != ("size" in form.variables):  # a kernel's form under collectives, or the reverse
                kind = "communication" if communication else "compute"
                raise ProfileError(f"{where}: form {form.name!r} is not a {kind} form")
            params = entry["params"]
            if not isinstance(params, dict):
                raise ProfileError(f"{where}: 'params' must be an object (name -> number): got {params!r}")
            bad = [p for p in form.params if not _number(params.get(p))]
            if bad:
                raise ProfileError(f"{where}: parameters {bad} missing or not finite numbers "
                                   f"(form {form.name!r} needs {list(form.params)})")
            for name in form.params:
                low = params[name] <= 0 if name in POSITIVE_PARAMS else params[name] < 0
                if low:
                    raise ProfileError(f"{where}: parameter {name!r} must be {'> 0' if name in POSITIVE_PARAMS else '>= 0'}: "
                                       f"got {params[name]!r}")
                _check_bounds(where, name, params[name])


def load_profile(name_or_path: str | Path | Profile) -> Profile:
    """A bundled profile by name (see :func:`list_profiles`) or a profile JSON file."""
    if isinstance(name_or_path, Profile):
        return name_or_path
    if not isinstance(name_or_path, (str, Path)):
        raise ProfileError(f"'profile' must be a bundled profile name, a JSON file or a Profile: got {name_or_path!r}")
    path = Path(str(name_or_path))
    if path.suffix == ".json" or path.exists() or "/" in str(name_or_path):  # a file, not a bundled name
        data = read_json_file(path, field="profile", error=ProfileError)
        return Profile.from_dict(data, origin=str(path))
    return _bundled(str(name_or_path))


def list_profiles() -> list[str]:
    return list(_bundled_names())


@cache
def _bundled_names() -> tuple[str, ...]:  # the package's files do not change while it runs
    folder = resources.files("perfmodel") / "profiles"
    return tuple(sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json")))


@cache
def _bundled(name: str) -> Profile:
    known = list_profiles()
    if name not in known:
        raise unknown_name("profile", name, known)
    text = (resources.files("perfmodel") / "profiles" / f"{name}.json").read_text()
    return Profile.from_dict(json.loads(text), origin=f"bundled profile {name!r}")
