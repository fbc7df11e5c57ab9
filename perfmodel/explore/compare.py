"""``compare``: several parallel strategies for one model and cluster, side by side.

Strategies are ``Strategy`` objects, mappings of its fields, or short strings
such as ``"tp=4,pp=2,micro_batch=1"`` (dp defaults to GPUs / (tp × pp)). Each
row comes from ``pm.predict``; the fastest strategy that fits is marked best.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields

import pandas as pd

from perfmodel.core.errors import InvalidInputError, PerfModelError, unknown_name
from perfmodel.interval import DEFAULT_LEVEL
from perfmodel.predict import BREAKDOWN_KEYS, Prediction, predict
from perfmodel.parallel.strategy import Strategy, parse_stage_layers
from perfmodel.core.checks import check_flag, check_int
from perfmodel.workload.presets import as_model
from perfmodel.explore.caveats import add_uncertainty
from perfmodel.explore.ties import mark_ties
from perfmodel.hardware import as_cluster

ALIASES = {"mb": "micro_batch", "gb": "global_batch", "sp": "sequence_parallel", "v": "virtual_stages",
           "vp": "virtual_stages", "ps": "ps_servers"}
_FIELDS = {f.name: f for f in fields(Strategy)}
LEAD = ("label", "dp", "tp", "pp", "virtual_stages", "schedule", "micro_batch", "micro_batches", "global_batch",
        "zero", "fsdp", "recompute", "sequence_parallel", "precision")
RESULTS = ("step_time", "tokens_per_second", "samples_per_second", "tflops_per_gpu", "mfu", "peak_memory",
           "memory_capacity", "fits", "over_capacity", "bottleneck")


def _value(name: str, text: str):
    """A strategy field's value from its text (ints, booleans, None, strings)."""
    default = _FIELDS[name].default
    low = text.strip().lower()
    if isinstance(default, bool):  # sequence_parallel, tp_overlap, dp_overlap
        return check_flag(name, text)
    if low in ("none", "null", ""):
        return None
    if name == "stage_layers":
        return parse_stage_layers(text)
    if name == "bucket_mib":
        try:
            return float(text)
        except ValueError:
            raise InvalidInputError(f"'bucket_mib' must be a number: got {text!r}") from None
    if isinstance(default, int) or name in ("global_batch", "dp"):
        try:
            return int(text)
        except ValueError:
            raise InvalidInputError(f"{name!r} must be an integer: got {text!r}") from None
    return text.strip()


def _pairs(spec: str) -> dict:
    out = {}
    for item in spec.replace(";", ",").replace(" ", ",").split(","):
        if not item:
            continue
        if "=" not in item:
            raise InvalidInputError(f"strategy item {item!r} in {spec!r} must read key=value (e.g. 'tp=4,pp=2')")
        key, text = item.split("=", 1)
        out[key.strip()] = text
    return out


def parse_strategy(spec, n_gpus: int, **defaults) -> Strategy:
    """A ``Strategy`` from a string, a mapping or a Strategy; ``defaults`` fill unset fields.

    dp defaults to ``n_gpus`` / (tp × pp); virtual_stages > 1 implies the interleaved schedule.
    """
    if isinstance(spec, Strategy):
        return spec
    if isinstance(spec, str):
        raw = _pairs(spec)
    elif isinstance(spec, Mapping):
        raw = dict(spec)
    else:
        raise InvalidInputError(f"a strategy must be a Strategy, a mapping or a string like 'tp=4,pp=2': got {spec!r}")
    values = {}
    for key, value in [*defaults.items(), *raw.items()]:  # defaults first: the strategy's own fields win
        name = ALIASES.get(key, key)
        if not isinstance(key, str) or name not in _FIELDS:
            raise unknown_name("strategy field", str(key), [*_FIELDS, *ALIASES])
        values[name] = _value(name, value) if isinstance(value, str) else value
    stages = values.get("virtual_stages")
    if isinstance(stages, int) and not isinstance(stages, bool) and stages > 1:
        values.setdefault("schedule", "interleaved")
    if "dp" not in values:
        sizes = {k: values.get(k, 1) for k in ("tp", "pp", "cp")}
        for key, size in sizes.items():  # dp is filled in from these: check them first
            check_int(key, size)
        group = sizes["tp"] * sizes["pp"] * sizes["cp"]
        if n_gpus % group:
            raise InvalidInputError(f"tp × pp × cp = {sizes['tp']} × {sizes['pp']} × {sizes['cp']} must divide the "
                                    f"cluster's {n_gpus} GPUs (or give dp explicitly) in strategy {spec!r}")
        values["dp"] = n_gpus // group
    return Strategy(**values)


SHORT = {"virtual_stages": "v", "sequence_parallel": "sp"}


def label_of(s: Strategy) -> str:
    """Short text naming a strategy: dp, tp, pp, micro_batch and every other field off its default.

    The global batch and the schedule (implied by virtual stages) are left to their own columns.
    """
    parts = [f"dp={s.dp}", f"tp={s.tp}", f"pp={s.pp}", f"mb={s.micro_batch}"]
    for f in fields(s):
        value = getattr(s, f.name)
        if f.name in ("dp", "tp", "pp", "micro_batch", "global_batch", "schedule") or s.is_default(f.name):
            continue
        name = SHORT.get(f.name, f.name)
        parts.append(name if value is True else f"{name}={value}")
    return ",".join(parts)


def prediction_row(p: Prediction, label: str | None = None) -> dict:
    """One table row of a prediction: strategy fields, results, breakdown and memory terms."""
    s = p.strategy
    row = {"label": label or label_of(s), "dp": s.dp, "tp": s.tp, "pp": s.pp, "virtual_stages": s.virtual_stages,
           "schedule": s.schedule, "micro_batch": s.micro_batch, "micro_batches": s.micro_batches,
           "global_batch": s.batch, "zero": s.shard, "fsdp": s.fsdp, "recompute": s.recompute,
           "sequence_parallel": s.sequence_parallel, "precision": s.precision}
    row.update({k: getattr(p, k) for k in RESULTS})
    row.update(step_time_low=p.interval[0], step_time_high=p.interval[1], interval_level=p.interval_level,
               interval_regime=p.interval_regime)
    row.update(interval_low_s=float(p.interval[0]), interval_high_s=float(p.interval[1]), dp_overlap=s.dp_overlap)
    row.update({k: p.breakdown[k] for k in BREAKDOWN_KEYS})
    row.update({"mem_" + k: v for k, v in p.memory.items()})
    return row


def mark_best(df: pd.DataFrame, column: str = "tokens_per_second") -> pd.DataFrame:
    """Add a boolean ``best`` column: the largest ``column`` among rows that fit; and ``tie``: the fitting
    rows whose interval of ``column`` overlaps the best's (``explore.ties``)."""
    df["best"] = False
    fitting = df.index[df["fits"].astype(bool)]
    best = df.loc[fitting, column].idxmax() if len(fitting) else None
    if best is not None:
        df.loc[best, "best"] = True
    return mark_ties(df, best, column, candidates=df["fits"].astype(bool))


def compare(model, cluster, strategies, *, profile=None, defaults: Mapping | None = None,
            level: float = DEFAULT_LEVEL, memory_headroom: float = 0.0) -> pd.DataFrame:
    """One row per strategy (``pm.predict``), in the given order, with the best fitting one marked.
    Each row's interval is stated at ``level``; a row fits when it leaves ``memory_headroom`` (a fraction)
    of each GPU's memory free.

    ``strategies``: a list of Strategy objects, mappings or strings, or a mapping
    label -> strategy. ``defaults`` (e.g. ``{"global_batch": 512}``) fill fields a
    string or mapping leaves unset.
    """
    cl = as_cluster(cluster)
    model = as_model(model)
    if isinstance(strategies, (str, Strategy)):
        strategies = [strategies]
    if not isinstance(strategies, (Mapping, list, tuple)):
        raise InvalidInputError("'strategies' must be a list of strategies (Strategy objects, mappings or strings "
                                f"like 'tp=4,pp=2') or a mapping label -> strategy: got {strategies!r}")
    items = list(strategies.items()) if isinstance(strategies, Mapping) else [(None, s) for s in strategies]
    if not items:
        raise InvalidInputError("'strategies' must list at least one strategy: got none")
    if defaults is not None and not isinstance(defaults, Mapping):
        raise InvalidInputError(f"'defaults' must be a mapping of strategy fields (e.g. {{'global_batch': 512}}): "
                                f"got {defaults!r}")
    rows = []
    for label, spec in items:
        shown = label or (spec if isinstance(spec, str) else None)
        try:
            s = parse_strategy(spec, cl.n_gpus, **dict(defaults or {}))
            rows.append(prediction_row(predict(model, cl, s, profile=profile, level=level,
                                               memory_headroom=memory_headroom), shown))
        except PerfModelError as exc:
            raise type(exc)(f"strategy {shown or spec!r}: {exc}") from None

    df = add_uncertainty(mark_best(pd.DataFrame(rows)))
    df.attrs.update(model=getattr(model, "name", ""), cluster=cl.name, gpu=cl.gpu.name, n_gpus=cl.n_gpus)
    return df
