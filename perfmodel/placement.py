"""Map the dp × tp × pp grid of ranks onto nodes and say which fabric each group uses.

Ranks are numbered with the first-named dimension varying fastest (the
Megatron-LM convention for the default "tp-pp-dp": tensor groups are
consecutive ranks, so they sit inside a node). A group of ``size`` ranks
spaced ``stride`` apart has ``ranks_per_node`` members on each of ``nodes``
nodes; the collective model is hierarchical when both exceed one.
"""

from __future__ import annotations

import numpy as np


def group_layout(size, stride, gpus_per_node):
    """(ranks_per_node, nodes) of a group of ``size`` ranks spaced ``stride`` apart (arrays)."""
    size = np.asarray(size, float)
    stride = np.asarray(stride, float)
    gpn = float(gpus_per_node)
    fits = stride * size <= gpn
    per_node = np.where(fits, size, np.where(stride >= gpn, 1.0, np.maximum(1.0, gpn // np.maximum(stride, 1.0))))
    per_node = np.minimum(per_node, size)
    return per_node, np.ceil(size / per_node)


def layout(dp, tp, pp, gpus_per_node, order: str = "tp-pp-dp") -> dict[str, tuple]:
    """For each of "tp", "pp", "dp": (ranks_per_node, nodes) under the given order."""
    sizes = {"tp": np.asarray(tp, float), "pp": np.asarray(pp, float), "dp": np.asarray(dp, float)}
    stride = np.ones_like(sizes["tp"] * sizes["pp"] * sizes["dp"])
    out = {}
    for name in order.split("-"):
        out[name] = group_layout(sizes[name], stride, gpus_per_node)
        stride = stride * sizes[name]
    return out
