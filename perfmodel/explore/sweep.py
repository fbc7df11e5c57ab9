"""``sweep``: one strategy across node counts, GPU counts, batch sizes, sequence lengths or GPU types.

Over ``nodes`` or ``gpus`` the data-parallel size follows the GPU count
(dp = GPUs / (tp × pp)). Weak scaling keeps the per-rank work (micro-batch and
micro-batches per step), so the global batch grows with dp; strong scaling keeps
the global batch. Rows of GPU-count sweeps carry the scaling efficiency
relative to the first row that fits in memory: (tokens/s per GPU) / (that row's
tokens/s per GPU); every sweep carries the speed-up in tokens/s over that row.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import fields, replace

import pandas as pd

from perfmodel.core.errors import InvalidInputError, PerfModelError
from perfmodel.explore.compare import label_of, prediction_row
from perfmodel.explore.stack_options import mixed_precision
from perfmodel.interval import DEFAULT_LEVEL
from perfmodel.predict import predict
from perfmodel.parallel.strategy import Strategy, fill_dp
from perfmodel.core.checks import check_choice, check_flag, check_int
from perfmodel.workload.presets import as_model
from perfmodel.hardware import Cluster, as_cluster, cluster as make_cluster
from perfmodel.hardware.build import part_of_node

SCALE_AXES = ("nodes", "gpus")
OTHER_AXES = ("global_batch", "micro_batch", "seq", "gpu")
STRATEGY_AXES = tuple(f.name for f in fields(Strategy) if f.name not in ("dp", "global_batch", "micro_batch"))
AXES = SCALE_AXES + OTHER_AXES + STRATEGY_AXES
SCALINGS = ("weak", "strong")


def _resize(cl, over: str, value):
    """The cluster with ``value`` nodes, or ``value`` GPUs (part of one node or whole nodes)."""
    value = check_int(over, value)
    if over == "nodes":
        return Cluster(node=cl.node, nodes=value)
    gpn = cl.gpus_per_node
    if value < gpn:
        return Cluster(node=part_of_node(cl.node, value), nodes=1)
    if value % gpn:
        raise InvalidInputError(f"'gpus'={value} must be below or a multiple of gpus_per_node={gpn} "
                                f"(nearby: {value // gpn * gpn} or {(value // gpn + 1) * gpn})")
    return Cluster(node=cl.node, nodes=value // gpn)


def _rescaled(s: Strategy, n_gpus: int, scaling: str, base_batch: int) -> Strategy:
    """The strategy on ``n_gpus`` GPUs: dp follows; weak keeps per-rank work, strong the global batch."""
    model_parallel = s.tp * s.pp * s.cp
    if n_gpus % model_parallel:
        names = "tp × pp × cp" if s.cp > 1 else "tp × pp"
        raise InvalidInputError(f"{names} = {model_parallel} must divide the GPU count {n_gpus}")
    dp = n_gpus // model_parallel
    batch = dp * s.micro_batch * s.micro_batches if scaling == "weak" else base_batch
    return replace(s, dp=dp, global_batch=batch)


def _point(model, cl, s: Strategy, over: str, value, scaling: str, base_batch: int, own_precision: bool = False):
    """(model, cluster, strategy) of one sweep point; over GPU types with ``own_precision``, at that GPU's own."""
    if over in SCALE_AXES:
        cl = _resize(cl, over, value)
        return model, cl, _rescaled(s, cl.n_gpus, scaling, base_batch)
    if over == "seq":
        return model.with_(seq=check_int("seq", value)), cl, s
    if over == "gpu":
        c = make_cluster(str(value), nodes=cl.nodes)
        return model, c, replace(s, precision=mixed_precision(c.gpu)) if own_precision else s
    if over in ("global_batch", "micro_batch"):
        return model, cl, replace(s, **{over: check_int(over, value)})
    changes = {over: value}
    if over == "virtual_stages" and isinstance(value, int) and value > 1 and s.schedule == "1f1b":
        changes["schedule"] = "interleaved"  # as compare does: more than one virtual stage means interleaving
    s = replace(s, **changes)
    return model, cl, _rescaled(s, cl.n_gpus, "strong", s.batch) if over in ("tp", "pp", "cp") else s


def sweep(model, over: str, values, *, cluster=None, strategy: Strategy | None = None, profile=None,
          scaling: str = "weak", level: float = DEFAULT_LEVEL, memory_headroom: float = 0.0,
          own_precision: bool = False) -> pd.DataFrame:
    """One row per value of ``over`` (``pm.predict`` of each point), in the given order, each interval
    stated at ``level``, each point fitting when it leaves ``memory_headroom`` of each GPU's memory free.

    ``over``: "nodes", "gpus", "global_batch", "micro_batch", "seq", "gpu" (GPU or
    node preset names, same node count) or any other Strategy field ("tp", "zero",
    "recompute"...). Points that do not fit in memory stay in the table with
    ``fits`` False; a point the strategy cannot run raises, naming the value.
    ``scaling`` ("weak" or "strong") says what a sweep over nodes or gpus does to the
    global batch; ``df.attrs["batch_note"]`` says it in words. Speed-up and scaling
    efficiency are relative to the first point that fits, NaN where a point does not.
    Over "gpu", ``own_precision=True`` runs each GPU at its own mixed precision (bf16 autocast, fp16
    without bf16 tensor cores, fp32 on the K80: what ``pm.search`` tries by default) instead of the
    strategy's, so GPUs of different generations share one sweep; the ``precision`` column says which.
    """
    check_choice("over", over, AXES)
    check_choice("scaling", scaling, SCALINGS)
    own_precision = check_flag("own_precision", own_precision)
    if own_precision and over != "gpu":
        raise InvalidInputError(f"'own_precision' applies to a sweep over 'gpu' only: got over={over!r}")
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidInputError(f"'values' must be a list of values to sweep over: got {values!r}")
    values = list(values)
    if not values:
        raise InvalidInputError("'values' must list at least one value to sweep over: got none")
    cl = as_cluster(cluster)
    if strategy is not None and not isinstance(strategy, Strategy):
        raise InvalidInputError(f"'strategy' must be a pm.Strategy: got {strategy!r}")
    model = as_model(model)
    s = fill_dp(strategy or Strategy(), cl.n_gpus)
    rows = []
    for value in values:
        try:
            m, c, st = _point(model, cl, s, over, value, scaling, s.batch, own_precision)
            p = predict(m, c, st, profile=profile, level=level, memory_headroom=memory_headroom)
        except PerfModelError as exc:
            raise type(exc)(f"sweep over {over}={value!r}: {exc}") from None
        row = {over: value, "cluster": c.name, "gpu": c.gpu.name, "nodes": c.nodes, "gpus": c.n_gpus,
               "seq": m.seq, **prediction_row(p, label_of(st))}
        row[over] = value
        rows.append(row)
    df = pd.DataFrame(rows)
    fits = df["fits"].astype(bool)
    per_gpu = df["tokens_per_second"] / df["gpus"]
    df["tokens_per_second_per_gpu"] = per_gpu
    # relative to the first point that fits; a point that does not fit (or no point fitting) has none
    base = df.index[fits][0] if fits.any() else None
    ratio = (lambda col: (col / col[base]).where(fits)) if base is not None else (lambda col: col * float("nan"))
    df["speedup"] = ratio(df["tokens_per_second"])
    if over in SCALE_AXES:
        df["scaling_efficiency"] = ratio(per_gpu)
    df.attrs.update(over=over, scaling=scaling, model=getattr(model, "name", ""), strategy=label_of(s),
                    batch_note=batch_note(df, over, scaling))
    return df


def batch_note(df: pd.DataFrame, over: str, scaling: str) -> str:
    """What the sweep did to the global batch, in one sentence ("" when it is left alone)."""
    if over not in SCALE_AXES or df.empty:
        return ""
    first, last = df.iloc[0], df.iloc[-1]
    if scaling == "weak":
        if first["global_batch"] == last["global_batch"]:
            return ""
        return (f"weak scaling: the global batch grows with the GPU count, from {first['global_batch']:,} at "
                f"{first['gpus']:,} GPUs to {last['global_batch']:,} at {last['gpus']:,} (per-GPU work fixed; "
                "scaling='strong' keeps the global batch)")
    return (f"strong scaling: the global batch stays {first['global_batch']:,}, so each GPU gets less work "
            "as GPUs are added")
