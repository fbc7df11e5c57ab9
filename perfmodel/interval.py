"""Prediction intervals with a stated coverage level, from the shipped calibration table.

``perfmodel/data/intervals.json`` holds, per regime, the median log-ratio c of the
project's own validation rows, r = ln(measured step / predicted step), a scale σ (the
regime's difficulty: 1 for plain split conformal, its shrunk median |r - c| for the
locally weighted score) and the sorted nonconformity scores |r - c| / σ it draws on
(its own, or all regimes' pooled) (``python -m perfmodel.validate.intervals --write``
regenerates it; docs/accuracy.md). Split-conformal prediction (Vovk et al. 2005;
Lei et al. 2018, JASA 113:1094, §2.2 and §5.2 for the locally weighted score): with n
calibration scores, the ⌈(n+1)·level⌉-th smallest, q, gives the interval
[step·e^(c-qσ), step·e^(c+qσ)], which holds a new step with probability ≥ level when rows are
exchangeable (c is the regime's bias: the interval is centred on the corrected step). Under the
``normalised`` score the table also holds ``difficulty`` (β of :data:`DIFFICULTY`) and a step's
half-width is its regime's times σ(x) over the regime's typical row's (:func:`row_factor`). A step no
calibrated regime holds (or one with too few rows for the level) is labelled "uncalibrated" and gets its
profile origin's pooled interval (``fallback``: every calibrated regime of that origin, each row against
the other regimes' median, each regime one unit; :func:`pooled_half_width`); a CPU host's regime
extends past its rows by a stated Laplace prior (:func:`laplace_width`). The same table holds a
memory section of the same shape (ratio of measured to predicted peak memory, by framework and by
one GPU or several).

Only json and numpy are needed here: predict reads the table once per process.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from perfmodel.core.errors import InvalidInputError
from perfmodel.core.memo import clear_memos
from perfmodel.interval_difficulty import DIFFICULTY, difficulty_features, one_factor, row_factor  # noqa: F401
from perfmodel.interval_pools import laplace_width, origin_of, pooled_half_width

TABLE_PATH = Path(__file__).resolve().parent / "data" / "intervals.json"
DEFAULT_LEVEL = 0.9
# a step is "communication-heavy" from this share of exposed communication and pipeline bubble on
COMM_SHARE = 0.2
# a step is host-bound from this share of exposed eager launch overhead on (no validation row is)
HOST_SHARE = 0.25
# a step predicted shorter than this is its own regime: two runs of one configuration differ by 8-13%
# below 60 ms on the H200, by at most 2.3% above (gpu_runs.csv); 0.06 s beat 0 and 0.1 s held back
SHORT_STEP_S = 0.06
SHAPE_FIELDS = ("hidden", "seq")  # the transformer fields that tell a transformer from a traced graph
# the model fields the calibration range is checked on: its shapes, its experts per MoE layer (1: dense); a field
# the shipped table has no range for is not checked
RANGE_FIELDS = (*SHAPE_FIELDS, "experts")
UNCALIBRATED = "uncalibrated"
# the regimes of a traced graph's step (a CNN: no transformer shape), ``cnn/<framework>``, calibrated on the published
# CNN checks apart from the transformer regimes (validate/interval_rows.py:traced_scored_rows), on any GPU profile
TRACED = "cnn"
TABLE_SCHEMA = 6  # raise when the table's keys change (6: the pricing paths the rows ran)
EMPTY_TABLE = {"validated_stacks": [], "validated_paths": {}, "shape_range": {}, "datasheet_gpus": [], "regimes": {},
               "memory": {"regimes": {}}, "fallback": {}, "fallback_floor": math.log(4.0)}  # no data at all: [step / 4, 4 x step]
ORIGINS = ("measured", "datasheet")  # the GPU profile origins a fallback pool is drawn for


@dataclass(frozen=True)
class Interval:
    """Bounds of the step time (seconds), the coverage level they are stated at, and the regime."""

    low: object
    high: object
    level: float
    regime: object


def check_level(level) -> float:
    """``level`` as a float in (0, 1), or a clear error."""
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise InvalidInputError(f"'level' must be a coverage probability strictly between 0 and 1 "
                                f"(e.g. 0.9): got {level!r}")
    return float(level)


@cache
def _shipped() -> dict:
    """The shipped table; one of another schema (mid-regeneration) reads as empty: every regime uncalibrated."""
    with open(TABLE_PATH, encoding="utf-8") as f:
        table = json.load(f)
    if table.get("schema_version") != TABLE_SCHEMA:
        warnings.warn(f"{TABLE_PATH.name} is not schema {TABLE_SCHEMA}: every interval is uncalibrated until "
                      "'python -m perfmodel.validate.intervals --write' rewrites it", UserWarning, stacklevel=2)
        return EMPTY_TABLE
    return table


def reload_table() -> None:
    """Forget the table read and every width derived from it (after the file changed)."""
    for f in (_shipped, _shipped_log_interval, _shipped_labelled, _shipped_memory_interval):
        f.cache_clear()
    clear_memos()  # predictions' intervals are kept beside their step times


def calibration_table() -> dict:
    """The shipped calibration table (a copy: callers may not change the one predict uses)."""
    return json.loads(json.dumps(_shipped()))


# stacks that run another stack's kernels and collectives, apart from defaults a user can name on either:
# composer is Composer's FSDP1 with MPT's fused loss (workload/stacks)
SAME_KERNELS = {"composer": "fsdp1"}
# fused attention kernels, each priced on its own measured curve (docs/model.md §5): one stack family
FUSED_ATTENTION = ("flash", "flash2", "flash3", "cudnn", "flash1", "triton")


def stack_key(framework: str, attention: str, precision: str) -> str:
    """The software stack a step runs on (its kernel list), as the table names validated stacks.

    Sharding (ZeRO, FSDP) is not part of it: it changes the collectives, which the
    communication share of the regime accounts for, not the kernels. Nor is which fused attention
    kernel runs (``FUSED_ATTENTION``): each has its own measured curve, so a stack validated on one
    is validated on the others (fsdp1's default FlashAttention-2 and the check rows' torch SDPA);
    the unfused attention's kernel list differs, and stays apart.
    """
    kernel = "flash" if attention in FUSED_ATTENTION else attention
    framework = SAME_KERNELS.get(framework, framework)
    return "/".join([framework, kernel] + (["fp8"] if str(precision).startswith("fp8") else []))


def profile_kind(profile) -> str:
    """"datasheet" for a profile scaled from another GPU's by datasheet figures, "host" for a CPU measured as
    the device (``host.serial``: its host work and kernels run one after the other), else "measured"."""
    if "derived_from" in profile.meta:
        return "datasheet"
    return "host" if profile.host.get("serial") else "measured"


def cell(kind: str, share):
    """The calibrated cell of a step: profile kind and whether communication is a large share."""
    return np.where(np.asarray(share) >= COMM_SHARE, f"{kind}/high-comm", f"{kind}/low-comm")


# stacks priced by one model code and sharding share a regime (workload/stacks): DeepSpeed runs are
# Megatron-LM's layers plus the engine's host work; FSDP1 and torchtitan (FSDP2) shard the torch model code
REGIME_FRAMEWORK = {"deepspeed": "megatron", "fsdp1": "fsdp", "composer": "fsdp", "torchtitan": "fsdp", "kempnerforge": "fsdp"}


def regime_framework(framework: str) -> str:
    """The framework part of a regime name (``REGIME_FRAMEWORK``)."""
    return REGIME_FRAMEWORK.get(framework, framework)


def regime_name(kind: str, share: float, framework: str, step: float) -> str:
    """The calibrated regime of one step: profile kind, communication share, framework, short or not."""
    comm = "high-comm" if share >= COMM_SHARE else "low-comm"
    return f"{kind}/{comm}/{regime_framework(framework)}" + ("/short-step" if _short(kind, step) else "")


def _short(kind: str, step):
    """Whether a step is short (``SHORT_STEP_S``: the H200's run-to-run spread below it; not for a CPU host)."""
    return (np.asarray(step) < SHORT_STEP_S) & (kind != "host")


def uncalibrated_reason(table: dict, *, kind: str, stack: str, model, profile_gpu: str, cluster_gpu: str,
                        paths: dict | None = None):
    """Why a configuration lies outside every calibrated regime (None when it does not); ``paths``: its pricing
    paths (``parallel/paths.py``), each checked against the values the validation rows ran."""
    if profile_gpu != cluster_gpu:
        return f"profile of {profile_gpu} used for {cluster_gpu}"
    if traced(model):  # its regime is its framework's (traced_regime); the transformer checks do not apply
        return None if kind != "host" else "not a transformer (no interval row checks a traced graph on a CPU host)"
    if kind == "datasheet" and cluster_gpu not in table["datasheet_gpus"]:
        # datasheet scaling is as good as the GPU's datasheet ratios: checked per GPU
        return f"datasheet profile of {cluster_gpu} never checked against measurements"
    if stack not in table["validated_stacks"]:
        return f"stack {stack} not validated"
    for name, ran in table.get("validated_paths", {}).items() if paths else ():  # in the table's order
        if name in paths and paths[name] not in ran:
            return f"{name}={paths[name]} in no validation row"
    ranges = table.get("host_shape_range", {}) if kind == "host" else table["shape_range"]
    for name in RANGE_FIELDS:
        if name not in ranges and name not in SHAPE_FIELDS:
            continue
        value = getattr(model, name, 1)
        lo, hi = ranges.get(name, (math.inf, -math.inf))
        if not lo <= value <= hi:
            if name == "experts" and hi == 1:
                return f"a mixture of experts (experts={value}): no validation row has experts"
            return f"{name}={value} outside calibrated {lo}-{hi}"
    return None


def traced_regime(framework: str) -> str:
    """The regime of a traced graph's step under ``framework``."""
    return f"{TRACED}/{regime_framework(framework)}"


def traced(model) -> bool:
    """Whether ``model`` is a traced graph (CNN, ViT: 0 or no transformer shape), not a transformer."""
    return not all(getattr(model, name, None) for name in SHAPE_FIELDS)


def half_width(scores, level: float) -> float:
    """Split-conformal log half-width of sorted ``scores`` at ``level``; NaN with too few scores."""
    k = math.ceil((len(scores) + 1) * level)
    return float(scores[k - 1]) if 1 <= k <= len(scores) else math.nan


def scaled_width(entry: dict, level: float) -> float:
    """A regime's log half-width: its own split-conformal quantile where it has enough rows for the level
    (``own_scores``), else its scale times the conformal quantile of the (pooled) scores it draws on."""
    own = half_width(entry["own_scores"], level) if "own_scores" in entry else math.nan
    if not math.isnan(own):
        return own
    pooled = entry.get("scale", 1.0) * half_width(entry["scores"], level)
    if math.isnan(pooled) and entry.get("beyond_rows") == "laplace":
        return laplace_width(entry["scores"], level)
    # past its own rows, never narrower than its own widest score (a level above one it supports)
    return max(pooled, entry["own_scores"][-1]) if entry.get("own_scores") and not math.isnan(pooled) else pooled


def fallback_interval(table: dict, level: float, origin: str = "datasheet") -> tuple[float, float]:
    """(log centre, log half-width) of a step no calibrated regime holds: its origin's pool (``fallback``),
    a datasheet one never narrower than the measured pool (its fits are the measured ones rescaled); an origin
    without a pool the widest pool around the prediction; no pool at all ``fallback_floor``. A CPU host's is
    its own regime (its rows, then their Laplace prior: :func:`laplace_width`); a table without CPU rows gives a
    host ``fallback_floor``: no GPU pool says how far a CPU step's model is off (the bundled CPU rows are off by
    +1%, +13% and +99%, where the measured GPU pool is about ±10% wide)."""
    if origin == "host":
        host = [e for name, e in table["regimes"].items() if name.startswith("host/")]
        w = scaled_width(host[0], level) if host else math.nan
        if not math.isnan(w):
            return host[0]["centre"], w
        return 0.0, table["fallback_floor"]
    pools = table.get("fallback", {})
    widths = {o: pooled_half_width(pool, level) for o, pool in pools.items()}
    if origin not in widths:
        return 0.0, max(widths.values(), default=table["fallback_floor"])
    w = max(widths[origin], widths.get("measured", 0.0)) if origin == "datasheet" else widths[origin]
    return pools[origin]["centre"], w


def fallback_half_width(table: dict, level: float, origin: str = "datasheet") -> float:
    """The log half-width of :func:`fallback_interval`."""
    return fallback_interval(table, level, origin)[1]


def regimes(kind: str, share, host_share, reason, framework: str = "pytorch", step=1.0,
            is_traced: bool = False) -> np.ndarray:
    """The regime name of each step (arrays of shares and steps broadcast)."""
    share, step = np.broadcast_arrays(np.asarray(share, dtype=float), np.asarray(step, dtype=float))
    names = np.asarray(np.char.add(np.char.add(cell(kind, share).astype(str), f"/{regime_framework(framework)}"),
                                   np.where(_short(kind, step), "/short-step", "")), dtype=object)
    if reason is not None:
        names[...] = f"{UNCALIBRATED}: {reason}"
        return names
    if is_traced:
        names[...] = traced_regime(framework)
    host = np.broadcast_to(np.asarray(host_share) >= HOST_SHARE, names.shape) & (kind != "host")
    names[host] = f"{UNCALIBRATED}: host-bound"
    return names


def _one_regime(kind: str, share: float, host_share: float, reason, framework: str, step: float,
                is_traced: bool = False) -> str:
    """:func:`regimes` of one step."""
    if reason is not None:
        return f"{UNCALIBRATED}: {reason}"
    if host_share >= HOST_SHARE and kind != "host":  # on a CPU device the host work is the step's own
        return f"{UNCALIBRATED}: host-bound"
    return traced_regime(framework) if is_traced else regime_name(kind, share, framework, step)


def log_interval(table: dict, names: np.ndarray, level: float,
                 origin: str = "datasheet") -> tuple[np.ndarray, np.ndarray]:
    """(centre, half-width) in log space of each regime name; a name no calibrated regime holds at the level
    takes the fallback of its profile ``origin`` (:func:`origin_of`)."""
    centre, width = np.zeros(names.shape), np.empty(names.shape)
    for name in set(names.ravel().tolist()):
        mask = names == name
        centre[mask], width[mask] = regime_log_interval(table, name, level, origin)
    return centre, width


def labelled(table: dict, name: str, level: float) -> str:
    """``name``, or why it is uncalibrated when the table has no rows, or too few for the level, in it."""
    if name.startswith(UNCALIBRATED):
        return name
    entry = table["regimes"].get(name)
    if entry is None:
        return f"{UNCALIBRATED}: no validation rows in {name}"
    return name if not math.isnan(scaled_width(entry, level)) else f"{UNCALIBRATED}: too few rows in {name} for {level:g}"


@cache
def _shipped_labelled(name: str, level: float) -> str:
    return labelled(_shipped(), name, level)


def relabel(table: dict, names: np.ndarray, level: float) -> np.ndarray:
    """:func:`labelled` of each name of an array."""
    out = names.copy()
    for name in set(names.ravel().tolist()):
        out[names == name] = labelled(table, name, level)
    return out


def regime_log_interval(table: dict, name: str, level: float, origin: str = "datasheet") -> tuple[float, float]:
    """(centre, half-width) in log space of one regime (``origin``: the fallback pool, :func:`origin_of`)."""
    if table is _shipped():  # predict's case: a few regimes and levels, looked up once each
        return _shipped_log_interval(name, level, origin)
    return _log_interval(table, name, level, origin)


@cache
def _shipped_log_interval(name: str, level: float, origin: str) -> tuple[float, float]:
    return _log_interval(_shipped(), name, level, origin)


def _log_interval(table: dict, name: str, level: float, origin: str) -> tuple[float, float]:
    """A calibrated regime's centre and width; any other step (no rows, too few for the level, or uncalibrated
    for a reason) its origin's fallback (:func:`fallback_interval`), whose pool holds the nearest regimes' rows.
    A regime whose rows are too few for the level keeps its centre and is never narrower than its widest score:
    a higher level never gives a narrower interval than the levels its rows support."""
    entry = table["regimes"].get(name)
    w = regime_width(table, name, level, math.nan) if entry else math.nan
    if not math.isnan(w):
        return entry["centre"], w
    centre, width = fallback_interval(table, level, origin)
    own = (entry.get("own_scores") or entry.get("scores")) if entry else None
    return (entry["centre"], max(width, float(own[-1]) * entry.get("scale", 1.0))) if own else (centre, width)


def regime_width(table: dict, name: str, level: float, fallback: float) -> float:
    """One regime's log half-width. A datasheet profile is the measured fits rescaled, so it inherits
    their error: its width is at least that of the measured regime of the same communication share,
    framework and step class."""
    entry = table["regimes"].get(name)
    q = scaled_width(entry, level) if entry else math.nan
    if math.isnan(q):
        return fallback
    twins = [scaled_width(e, level) for other, e in table["regimes"].items() if _twins(name, other)]
    return max([q] + [w for w in twins if not math.isnan(w)])


def _twins(name: str, other: str) -> bool:
    """Whether ``other`` is a measured regime of datasheet regime ``name``'s communication share, framework and
    step class (another framework's error is its stack's, which a datasheet profile does not inherit)."""
    a, b = name.split("/"), other.split("/")
    return a[0] == "datasheet" and b[0] == "measured" and a[1:] == b[1:]


def power_capped(profile) -> bool:
    """Whether ``profile`` is a power-capped part's, its compute slowed by a formula (profiles/power_cap.py)."""
    return "power_cap" in profile.meta


_SHARE_KEYS = ("tp_comm", "dp_comm", "p2p", "pipeline_bubble", "host_overhead")


def shares(step, breakdown: dict):
    """(communication + bubble share, host-overhead share) of each step: what picks the regime."""
    step = np.maximum(np.asarray(step, dtype=float), 1e-300)
    exposed = sum(np.asarray(breakdown[k], dtype=float) for k in _SHARE_KEYS[:-1])
    return exposed / step, np.asarray(breakdown["host_overhead"], dtype=float) / step


def bounds(step, breakdown: dict, *, profile, cluster, model, framework: str, attention: str, precision: str,
           level: float = DEFAULT_LEVEL, table: dict | None = None, paths: dict | None = None) -> Interval:
    """The interval of ``step`` (a number or an array, with ``breakdown`` of the same shape); ``paths``: the
    step's pricing paths (``parallel/paths.py``)."""
    level = check_level(level)
    table = table or _shipped()
    kind = profile_kind(profile)
    reason = uncalibrated_reason(table, kind=kind, stack=stack_key(framework, attention, precision),
                                 model=model, profile_gpu=profile.gpu, cluster_gpu=cluster.gpu.name, paths=paths)
    if isinstance(step, float) and all(isinstance(breakdown[k], float) for k in _SHARE_KEYS):  # one prediction
        step = max(step, 1e-300)
        share = sum(breakdown[k] for k in _SHARE_KEYS[:-1]) / step
        raw = _one_regime(kind, share, breakdown["host_overhead"] / step, reason, framework, step, traced(model))
        c, w = regime_log_interval(table, raw, level, origin_of(kind, reason))
        name = _shipped_labelled(raw, level) if table is _shipped() else labelled(table, raw, level)
        if "regime_scale" in table["regimes"].get(raw, {}) and not name.startswith(UNCALIBRATED):
            w *= one_factor(table, raw, share, cluster.n_gpus, power_capped(profile))
        return Interval(step * math.exp(c - w), step * math.exp(c + w), level, name)
    step = np.asarray(step, dtype=float)
    share, host = shares(step, breakdown)
    raw = regimes(kind, np.broadcast_to(share, np.broadcast(share, host, step).shape), host, reason, framework, step,
                  traced(model))
    c, w = log_interval(table, raw, level, origin_of(kind, reason))
    names = relabel(table, raw, level)
    if "difficulty" in table:
        calibrated = ~np.char.startswith(names.astype(str), UNCALIBRATED)
        share = np.broadcast_to(share, raw.shape)
        factor = row_factor(table, raw, difficulty_features(share, cluster.n_gpus, power_capped(profile)))
        w = np.where(calibrated, w * factor, w)
    low, high = step * np.exp(c - w), step * np.exp(c + w)
    if step.ndim == 0:
        return Interval(float(low), float(high), level, str(names.item()))
    return Interval(low, high, level, names)


def uncalibrated_bounds(seconds, level: float = DEFAULT_LEVEL, table: dict | None = None):
    """(low, high) of a time no validation row checks (a formula outside the calibrated regimes):
    the widest fallback half-width at ``level`` (the datasheet pool's) around it."""
    w = fallback_half_width(table or _shipped(), check_level(level))
    seconds = np.asarray(seconds, dtype=float)
    return seconds * np.exp(-w), seconds * np.exp(w)


def memory_regime(framework: str, n_gpus: int) -> str:
    """The memory regime of a run: its framework, and whether it spans several GPUs (buckets, shards and
    buffers in flight that one GPU does not have)."""
    return framework if n_gpus <= 1 else f"{framework}/parallel"


# what a memory row's reading is: ``torch.cuda.max_memory_allocated`` against ``peak_memory``, or the
# stack's max reserved reading against ``reserved_memory`` + the CUDA context (the allocator model too)
MEMORY_READINGS = ("allocated", "reserved")
# a memory regime no row measured: a stated guess, not drawn from the calibrated regimes' sub-percent widths.
# ±25% at 90%, wider than any memory error recorded here for a stack before its own terms were written
# (TorchTitan paper readings under the flat allocator rule: up to +10.6%; those readings against the allocated
# accounting alone: up to +17%; ``python -m perfmodel.validate.memory_checks``); other levels as a Laplace
# distribution's |x| quantile, b·ln(1/(1 - level)), so 50% is ±6.7% and 95% ±34%
MEMORY_PRIOR_90 = math.log(1.25)
# run sources a memory regime needs: one source's rows agree among themselves however far another source's
# lie (the TorchTitan paper's two tables: within 0.4% each, 3-4% apart), so its spread says nothing of a new one
MIN_MEMORY_SOURCES = 2


def memory_prior_width(level: float) -> float:
    """The log half-width of a memory regime without rows at ``level`` (:data:`MEMORY_PRIOR_90`)."""
    return MEMORY_PRIOR_90 * math.log(1.0 / (1.0 - level)) / math.log(10.0)


def memory_fallback_width(mem: dict, level: float) -> float:
    """A memory regime without rows (or too few for the level): the larger of the stated prior and the
    conformal quantile of every memory row scored against its regime's other run sources (``fallback_scores``:
    what a stack measured by one source alone looks like to the others)."""
    pooled = half_width(mem.get("fallback_scores", []), level)
    return max(memory_prior_width(level), 0.0 if math.isnan(pooled) else pooled)


def memory_bounds(peak_bytes: float, *, framework: str, n_gpus: int = 1, level: float = DEFAULT_LEVEL,
                  table: dict | None = None) -> Interval:
    """The interval of a predicted peak memory (bytes), from the memory section of the table: the
    ratio of measured to predicted memory of the regime's validation rows, as for step time."""
    level = check_level(level)
    name = memory_regime(framework, n_gpus)
    if table is None or table is _shipped():
        c, w, name = _shipped_memory_interval(name, level)
    else:
        c, w, name = memory_log_interval(table, name, level)
    return Interval(peak_bytes * math.exp(c - w), peak_bytes * math.exp(c + w), level, name)


@cache
def _shipped_memory_interval(regime: str, level: float) -> tuple[float, float, str]:
    return memory_log_interval(_shipped(), regime, level)


def memory_log_interval(table: dict, regime: str, level: float) -> tuple[float, float, str]:
    """(centre, half-width, label) in log space of a memory regime (:func:`memory_regime`): its rows of peak
    allocated memory, else its stack's reserved readings (``<regime>/reserved``, labelled so), else the
    fallback (:func:`memory_fallback_width`)."""
    mem = table.get("memory", EMPTY_TABLE["memory"])
    found = [(name, mem["regimes"][name]) for name in (regime, f"{regime}/reserved") if name in mem["regimes"]]
    for name, entry in found:
        w = scaled_width(entry, level)
        if not math.isnan(w) and entry.get("run_sources", MIN_MEMORY_SOURCES) >= MIN_MEMORY_SOURCES:
            return entry["centre"], w, f"memory/{name}"
    why = "never measured" if not found else (
        "measured by one run source" if any(not math.isnan(scaled_width(e, level)) for _, e in found)
        else "too few measurements for the level")
    return 0.0, memory_fallback_width(mem, level), f"{UNCALIBRATED}: memory of {regime} {why}"
