"""Measured training steps as a CSV: the schema, and reading it into cases to predict.

One row per measured configuration. Columns (blank where unknown):

* model: a preset name (``perfmodel list models``), or any label when the model
  fields below are given; fields given next to a preset override it
  (e.g. ``gpt2-small`` with ``vocab`` 50304).
* model fields: layers, hidden, heads, seq, vocab, kv_heads, ffn_hidden,
  activation, norm, bias, tied_embeddings, position, causal.
* gpu: GPU or node preset, or a GPU/node/cluster TOML file; nodes,
  gpus_per_node (default: 1 node; GPUs per node = dp × tp × pp × cp / nodes).
* strategy: dp, tp, pp, micro_batch, global_batch, zero, fsdp, recompute,
  precision, optimizer, schedule, virtual_stages, sequence_parallel,
  stage_layers (space-separated), framework, attention, tp_overlap, dp_overlap, cp,
  ep (defaults as ``pm.Strategy``).
* measured: at least one of step_time_s, tokens_per_second, tflops_per_gpu
  (the first present is compared); peak_memory_bytes optionally.
* profile: a profile name or JSON file for this row (default: the command's
  ``--profile``, else the GPU's bundled profile); source: where the row comes from.

``calibration.train`` writes this schema plus the spread columns of
``RUN_COLUMNS``, which reading ignores. A row that cannot be read becomes a
:class:`BadRow` with its line number and the reason; the others still count.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path

from perfmodel.core.errors import InvalidInputError, PerfModelError, unknown_name
from perfmodel.parallel.strategy import Strategy, parse_stage_layers
from perfmodel.core.checks import read_text_file
from perfmodel.core.readers import MAX_TABLE_BYTES
from perfmodel.hardware import cluster
from perfmodel.predict import check_strategy
from perfmodel.workload.model import transformer
from perfmodel.workload.presets import list_presets, preset

MODEL_FIELDS = ("layers", "hidden", "heads", "seq", "vocab", "kv_heads", "ffn_hidden", "activation",
                "norm", "bias", "tied_embeddings", "position", "causal")
STRATEGY_FIELDS = ("dp", "tp", "pp", "micro_batch", "global_batch", "zero", "fsdp", "recompute",
                   "precision", "optimizer", "schedule", "virtual_stages", "sequence_parallel", "stage_layers",
                   "framework", "attention", "tp_overlap", "dp_overlap", "cp", "ep")
METRICS = ("step_time_s", "tokens_per_second", "tflops_per_gpu")
COLUMNS = ("model", *MODEL_FIELDS, "gpu", "nodes", "gpus_per_node", *STRATEGY_FIELDS, *METRICS,
           "peak_memory_bytes", "profile", "source")
# written by calibration.train after the schema: spread over the timed steps and the run's setting
RUN_COLUMNS = ("step_time_min_s", "step_time_p10_s", "step_time_p90_s", "step_time_max_s", "steps",
               "warmup", "memory_kind", "device", "backend", "threads", "torch", "date")
INT_FIELDS = ("layers", "hidden", "heads", "seq", "vocab", "kv_heads", "ffn_hidden", "nodes",
              "gpus_per_node", "dp", "tp", "pp", "micro_batch", "global_batch", "zero", "virtual_stages", "cp",
              "ep")
BOOL_FIELDS = ("bias", "tied_embeddings", "causal", "sequence_parallel", "tp_overlap", "dp_overlap")
REQUIRED_WITHOUT_PRESET = ("layers", "hidden", "heads", "seq", "vocab")


@dataclass(frozen=True)
class Case:
    """One measured configuration, ready to predict."""

    line: int
    label: str
    model: object
    cluster: object
    strategy: object
    metric: str
    measured: float
    peak_memory_bytes: float | None = None
    profile: str | None = None
    source: str = ""
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class BadRow:
    """A row that could not be predicted (``skipped``), or a note on the header."""

    line: int
    reason: str
    skipped: bool = True

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


def _blank(value) -> bool:
    return value is None or (isinstance(value, str) and value.strip() == "") or (
        isinstance(value, float) and math.isnan(value))


def _int(name: str, text: str) -> int:
    try:
        number = float(text)
    except ValueError:
        raise InvalidInputError(f"{name!r} must be an integer: got {text!r}") from None
    if not number.is_integer():
        raise InvalidInputError(f"{name!r} must be an integer: got {text!r}")
    return int(number)


def _bool(name: str, text: str) -> bool:
    low = text.strip().lower()
    if low in ("true", "1", "yes", "1.0"):
        return True
    if low in ("false", "0", "no", "0.0"):
        return False
    raise InvalidInputError(f"{name!r} must be true or false: got {text!r}")


def _value(name: str, text: str):
    if name in INT_FIELDS:
        return _int(name, text)
    if name == "stage_layers":  # layers per pipeline stage, first to last
        return parse_stage_layers(text)
    if name in BOOL_FIELDS:
        return _bool(name, text)
    return text.strip()


def _given(row: dict, names) -> dict:
    return {n: _value(n, row[n]) for n in names if n in row and not _blank(row[n])}


def model_of(row: dict):
    """The model a row describes: a preset, a preset with overrides, or the fields alone."""
    fields = _given(row, MODEL_FIELDS)
    name = (row.get("model") or "").strip()
    if name and name in list_presets():
        base = preset(name)
        return base.with_(**fields) if fields else base  # a traced graph refuses overrides clearly
    missing = [f for f in REQUIRED_WITHOUT_PRESET if f not in fields]
    if missing:
        if name:
            raise InvalidInputError(f"{unknown_name('model preset', name, list_presets())} "
                                    f"(or give the model fields {', '.join(missing)})")
        raise InvalidInputError(f"no 'model' preset and model fields {missing} missing")
    return transformer(**fields, name=name or "transformer")


def cluster_and_strategy(row: dict):
    """The cluster and the strategy of a row (GPU count from dp × tp × pp)."""
    gpu = (row.get("gpu") or "").strip()
    if not gpu:
        raise InvalidInputError("'gpu' is blank (a GPU or node name, or a TOML file)")
    s = _given(row, STRATEGY_FIELDS)
    strategy = Strategy(**{"dp": 1, **s})  # the row's GPU count is dp × tp × pp: dp is 1 unless given
    place = _given(row, ("nodes", "gpus_per_node"))
    nodes = place.get("nodes", 1)
    if strategy.gpus % nodes:
        raise InvalidInputError(f"dp × tp × pp = {strategy.gpus} GPUs do not split over nodes={nodes}")
    per_node = place.get("gpus_per_node", strategy.gpus // nodes)
    return cluster(gpu, nodes=nodes, gpus_per_node=per_node), strategy


def _measured_number(row: dict, name: str) -> float:
    try:
        value = float(row[name])
    except ValueError:
        raise InvalidInputError(f"{name!r} must be a number: got {row[name]!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise InvalidInputError(f"{name!r} must be a finite number > 0: got {row[name]!r}")
    return value


def metric_of(row: dict) -> tuple[str, float]:
    for name in METRICS:
        if name in row and not _blank(row[name]):
            return name, _measured_number(row, name)
    raise InvalidInputError(f"no measurement: give one of {', '.join(METRICS)}")


def case_of(row: dict, line: int) -> Case:
    """A :class:`Case` from one CSV row (a dict of strings); raises PerfModelError when bad."""
    model = model_of(row)
    cl, strategy = cluster_and_strategy(row)
    check_strategy(model, cl, strategy)
    metric, value = metric_of(row)
    mem = None if _blank(row.get("peak_memory_bytes")) else _measured_number(row, "peak_memory_bytes")
    label = (row.get("model") or "").strip() or getattr(model, "name", "model")
    return Case(line=line, label=label, model=model, cluster=cl, strategy=strategy, metric=metric,
                measured=value, peak_memory_bytes=mem,
                profile=(row.get("profile") or "").strip() or None, source=(row.get("source") or "").strip(),
                extra={k: row[k] for k in RUN_COLUMNS if k in row and not _blank(row[k])})


def read_measured(path: str | Path) -> tuple[list[Case], list[BadRow]]:
    """Every readable row of a measured CSV as a Case; the others as BadRows (line, reason).

    Lines starting with ``#`` are comments. Unknown columns are reported
    (``skipped=False``) and ignored.
    """
    path = Path(path)
    text = read_text_file(path, field="measured", expect="a CSV of measured steps", max_bytes=MAX_TABLE_BYTES)
    cases, bad, columns = [], [], None
    with io.StringIO(text, newline="") as f:
        reader = csv.reader(f)
        for values in reader:
            line = reader.line_num
            if not values or not "".join(values).strip() or values[0].lstrip().startswith("#"):
                continue
            if columns is None:
                columns = [c.strip() for c in values]
                if len(columns) == 1 and ";" in columns[0]:
                    raise InvalidInputError(f"{path}: the header is separated by ';' (a spreadsheet's export in "
                                            "some locales); save it with ',' between the columns")
                unknown = [c for c in columns if c not in COLUMNS and c not in RUN_COLUMNS]
                if unknown:
                    bad.append(BadRow(line, f"unknown columns ignored: {', '.join(unknown)} "
                                            f"(schema: {', '.join(COLUMNS)})", skipped=False))
                continue
            if len(values) != len(columns):
                bad.append(BadRow(line, f"{len(values)} values for {len(columns)} columns"))
                continue
            try:
                cases.append(case_of(dict(zip(columns, values)), line))
            except PerfModelError as exc:
                bad.append(BadRow(line, str(exc)))
    if columns is None:
        raise InvalidInputError(f"{path}: no header line (columns: {', '.join(COLUMNS)})")
    if not cases and not any(b.skipped for b in bad):
        raise InvalidInputError(f"{path}: no rows after the header (one measured configuration per line)")
    return cases, bad
