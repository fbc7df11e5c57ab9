"""Map the dp × tp × pp grid of ranks onto nodes and say which fabric each group uses.

Ranks are numbered with the first-named dimension varying fastest. The
default order "tp-pp-dp" is Megatron-LM's (Narayanan et al. 2021, §3.3 and
``mpu.initialize_model_parallel``): tensor groups are consecutive ranks, so
they sit inside a node; pipeline stages come next and data-parallel replicas
last. A group of ``size`` ranks spaced ``stride`` apart has
``ranks_per_node`` members on each of ``nodes`` nodes; a collective over it
uses the intra-node fabric when ``nodes == 1``, the network when
``ranks_per_node == 1`` and the two-level ring model otherwise
(``perfmodel.costs.comm.hierarchical_time``).

Sizes and strides that divide ``gpus_per_node`` or are multiples of it (powers
of two on 8-GPU nodes always are) tile the nodes. A group that would fit in one
node but whose span does not divide it (tp = 3 or 6 on 8-GPU nodes) does not:
the groups follow one another across node boundaries, so some straddle two
nodes, and the collective of the slowest group paces the step; such a group is
priced as its worst member, ceil(size / 2) ranks on each of two nodes.

Context-parallel ranks sit right after the tensor group, then the
expert-parallel ranks (Megatron-Core's order "tp-cp-ep-dp-pp"), whatever the
order of the others. Expert-parallel ranks are data-parallel ranks: the
data-parallel group ("dp") is the ep group times the rest of the replicas at
the data-parallel place in the order; gradients are reduced over the data-
and context-parallel ranks together ("dp_cp").
"""

from __future__ import annotations

import numpy as np

from perfmodel.core.checks import check_choice

DIMENSIONS = ("tp", "pp", "dp")
ORDERS = ("tp-pp-dp", "tp-dp-pp", "pp-tp-dp", "dp-tp-pp", "pp-dp-tp", "dp-pp-tp")


def group_layout(size, stride, gpus_per_node):
    """(ranks_per_node, nodes) of a group of ``size`` ranks spaced ``stride`` apart (arrays)."""
    size = np.asarray(size, float)
    stride = np.asarray(stride, float)
    gpn = float(gpus_per_node)
    fits = stride * size <= gpn                      # the whole group inside one node
    per_node = np.where(fits, size, np.where(stride >= gpn, 1.0, np.maximum(1.0, gpn // np.maximum(stride, 1.0))))
    per_node = np.minimum(per_node, size)
    straddles = fits & (np.mod(gpn, np.maximum(stride * size, 1.0)) != 0)  # consecutive groups cross node edges
    per_node = np.where(straddles, np.ceil(size / 2.0), per_node)
    return per_node, np.ceil(size / per_node)


def _product(a, b):
    """Layout of the union of two groups whose strides never overlap: members per node and nodes multiply."""
    return a[0] * b[0], a[1] * b[1]


def layout(dp, tp, pp, gpus_per_node, order: str = "tp-pp-dp", cp=1, ep=1, etp=None) -> dict[str, tuple]:
    """For each of "tp", "cp", "ep", "etp", "pp", "dp" and "dp_cp": (ranks_per_node, nodes) under the given order.

    With ``etp`` set, the experts have a grid of their own (Megatron-Core ``parallel_state``, core_v0.12.0: the
    expert rank generator takes the same order with tp -> etp and cp 1): etp consecutive ranks, then the ep group
    of ranks spaced etp apart, folded over the tp, cp and data-parallel ranks of a stage."""
    check_choice("placement", order, ORDERS)
    inside_dp = np.asarray(1.0 if etp is not None else ep, float)  # folded experts leave the dp grid whole
    sizes = {"tp": np.asarray(tp, float), "cp": np.asarray(cp, float), "ep": inside_dp,
             "pp": np.asarray(pp, float), "dp": np.asarray(dp, float) / inside_dp}
    stride = np.ones_like(sizes["tp"] * sizes["pp"] * sizes["dp"] * sizes["cp"])
    names = order.split("-")
    names[names.index("tp") + 1:names.index("tp") + 1] = ["cp", "ep"]
    out = {}
    for name in names:
        out[name] = group_layout(sizes[name], stride, gpus_per_node)
        stride = stride * sizes[name]
    out["dp"] = _product(out["ep"], out["dp"])  # the whole data-parallel group: ep × the other replicas
    out["dp_cp"] = _product(out["dp"], out["cp"])
    out["etp"] = out["tp"]
    if etp is not None:
        out["etp"] = group_layout(np.asarray(etp, float), np.ones_like(stride), gpus_per_node)
        out["ep"] = group_layout(np.asarray(ep, float), np.asarray(etp, float) * np.ones_like(stride), gpus_per_node)
    return out


def expert_grid(framework: str, ep, tp, etp):
    """The ``etp`` :func:`layout` takes: the strategy's where set; Megatron-Core's expert rank generator (core_r0.10
    on, ``parallel_state``: etp = tp by default) where experts split (ep > 1); else None, the older tp-cp-ep-dp-pp
    order the other stacks keep."""
    if etp is not None or framework != "megatron" or ep == 1:
        return etp
    return tp


def pipeline_crossings(pp_layout) -> np.ndarray:
    """Stage boundaries that cross a node: consecutive stages fill a node, then move on."""
    _, nodes = pp_layout
    return np.asarray(nodes, float) - 1.0
