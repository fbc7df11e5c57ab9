"""The variables a model keeps on parameter servers: name, elements, trainable, in creation order.

CIFAR presets ship the list their TensorFlow graph creates (``data/graphs/<name>.variables.json``,
written by tools/cifar_models.py; ``global_step`` comes first, as tf.estimator creates it before the
model). Other workloads have no such list: their parameters are cut into ``FALLBACK_PIECES``
equal variables, which places them evenly (a limit for round-robin placement, which depends on
the real sizes; docs/parameter-servers.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

FALLBACK_PIECES = 64
GLOBAL_STEP = ("global_step", 1, False)  # int64 scalar: counted as one 8-byte element below


@dataclass(frozen=True)
class Variable:
    """One variable: ``elements`` fp32 values (``global_step``: one int64), updated by the servers when trainable."""

    name: str
    elements: int
    trainable: bool

    @property
    def nbytes(self) -> float:
        return 8.0 if self.name == "global_step" else 4.0 * self.elements


@cache
def _bundled(name: str) -> tuple[Variable, ...] | None:
    path = resources.files("perfmodel.workload") / "data" / "graphs" / f"{name}.variables.json"
    if not path.is_file():
        return None
    rows = json.loads(path.read_text())["variables"]
    return (Variable(*GLOBAL_STEP),) + tuple(Variable(str(n), int(e), bool(t)) for n, e, t in rows)


def model_variables(model) -> tuple[Variable, ...]:
    """The model's variables in creation order: the bundled TensorFlow list, else equal pieces."""
    listed = _bundled(str(getattr(model, "name", "")))
    if listed is not None:
        return listed
    params = int(model.params)
    pieces = max(1, min(FALLBACK_PIECES, params))
    size, extra = divmod(params, pieces)
    return tuple(Variable(f"part{i}", size + (i < extra), True) for i in range(pieces))
