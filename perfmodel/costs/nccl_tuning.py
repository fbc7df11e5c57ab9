"""NCCL's own cost model of a collective across nodes, as NCCL computes it to pick an algorithm and protocol.

Source: NVIDIA/nccl v2.18.5-1 (559b70f8) ``src/graph/tuning.cc`` (line numbers below) and
``src/include/info.h``:69 (all-gather and reduce-scatter sizes are the whole gathered buffer, the
nccl-tests S). For each algorithm a and protocol p NCCL allows::

    t(a, p) = lat(a, p) + S / algbw(a, p)          (ncclTopoGetAlgoTime, :381-397)

and runs the (a, p) of least t. Here a is ring (all-reduce, all-gather, reduce-scatter) or tree
(all-reduce), p is LL, LL128 or Simple. NVLS, NVLS-Tree and CollNet need NVLink SHARP or IB SHARP
support that a cluster description does not carry; they are not candidates (docs/distributed.md).

``busbw`` is this project's inter-node bus bandwidth per rank (``fabric.rail_busbw``: every rank of a
node talking at once over its share of the NICs), measured at large messages, where NCCL runs the
Simple protocol. A ring over ``rpn`` ranks on each node moves S/rpn of each rank's bytes per rail, so
NCCL's per-GPU ``busBw`` (``nChannels × bwInter``, :175) is ``busbw × rpn``. Not modelled: the
per-channel caps (they need the channel count; they bind only below ~11 channels on Hopper), the CPU
vendor (Intel rows: ``llMaxBws`` and ``getNetOverhead``), and a NIC's own ``latencyInter`` (0 for the
IB verbs transport). The formulas take numpy arrays or sympy expressions alike (``ops``).
"""

from __future__ import annotations

import math

import numpy as np
from perfmodel.core.lazy import sympy as sp  # imported on first symbolic use

from perfmodel.core.errors import InvalidInputError

NCCL_VERSION = "v2.18.5-1"
PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")  # the ones tuning.cc prices across nodes
INTRA_HW = ("nvlink", "pci")

# baseLat (us), tuning.cc:56-59: {algorithm: (LL, LL128, Simple)}
BASE_LAT = {"tree": (6.8, 14.0, 0.0), "ring": (6.6, 14.0, 8.4)}
# hwLat (us), tuning.cc:65-78: {hardware: {algorithm: (LL, LL128, Simple)}}
HW_LAT = {
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 6.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)},
}
LL_MAX_BW = (39.0e9, 20.4e9)  # llMaxBws Intel row, 2 nodes / more (GB/s -> B/s), tuning.cc:86-90, index :142-145
NET_OVERHEAD_US = 1.0  # getNetOverhead, x86 Intel, tuning.cc:111-117; x3 for Simple, :222
RING_LL_SHARE = 1.0 / 4.0  # ring LL across nodes, tuning.cc:178
RING_LL128_SHARE = (0.7, 0.92)  # ring LL128, fewer than 2 / at least 2 ranks per node, tuning.cc:179
TREE_SHARE = 0.92  # tree, every protocol, tuning.cc:180
TREE_LL_SHARE = 1.0 / 3.8  # tree LL on top, tuning.cc:181
TREE_LL128_SHARE = 120.0 / 128.0  # tree LL128 across nodes, tuning.cc:182
TREE_RATIO = 0.5  # tree's algbw = busBw x .5, tuning.cc:199
PLATEAU = 1.4  # multi-node ring Simple all-reduce latency, Ampere and later, tuning.cc:389-392 (1.9 before)
# treeCorrectionFactor[protocol][log2(S / 64)], tuning.cc:375-379: sizes 64 B .. 256 MB
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)


class NumpyOps:
    """The few operations the model needs, on numpy arrays."""

    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)
    where = staticmethod(np.where)

    @staticmethod
    def log2i(x):  # NCCL's log2i: floor(log2(x)), 0 for x < 2
        return np.floor(np.log2(np.maximum(np.asarray(x, float), 1.0)))

    @staticmethod
    def correction(protocol: int, size):
        """treeCorrectionFactor at log2i(S >> 6), 1 from 2^29 B on (tuning.cc:387-388)."""
        idx = NumpyOps.log2i(np.floor(np.asarray(size, float) / 64.0)).astype(int)
        table = np.asarray(TREE_CORRECTION[protocol] + (1.0,))
        return table[np.minimum(idx, len(table) - 1)]


def _ring_steps(collective: str, n, nodes):
    """(nsteps, nInterSteps), tuning.cc:158-163."""
    if collective == "all_reduce":
        return 2 * (n - 1), 2 * nodes
    return n - 1, nodes - 1


def _ring(collective, size, n, rpn, nodes, busbw, hw, p, ops):
    """Seconds of the ring with protocol index ``p`` (tuning.cc:175-226, :389-396; the plateau's size
    test S / (nChannels nRanks) >= 64 is taken with one channel: at such sizes LL wins anyway)."""
    bus = busbw * rpn  # NCCL's per-GPU busBw
    if p == 0:
        bus = ops.minimum(ops.where(nodes <= 2, LL_MAX_BW[0], LL_MAX_BW[1]), bus * RING_LL_SHARE)
    elif p == 1:
        bus = bus * ops.where(rpn < 2, RING_LL128_SHARE[0], RING_LL128_SHARE[1])
    nsteps, inter_steps = _ring_steps(collective, n, nodes)
    overhead = NET_OVERHEAD_US * (3.0 if p == 2 else 1.0)
    intra = ops.maximum(HW_LAT[hw]["ring"][p], overhead)
    lat = BASE_LAT["ring"][p] + (nsteps - inter_steps) * intra + inter_steps * HW_LAT["net"]["ring"][p]
    if p == 2 and collective == "all_reduce":
        lat = lat * ops.where(size / n >= 64.0, PLATEAU, 1.0)
    return lat * 1e-6 + size * nsteps / (n * bus)  # algbw = busBw x nRanks / nsteps (:196)


def _tree(size, rpn, nodes, busbw, hw, p, ops):
    """Seconds of the tree all-reduce with protocol index ``p`` (tuning.cc:180-182, :199, :227-229, :387-388)."""
    bus = busbw * rpn * TREE_SHARE
    if p == 0:
        bus = ops.minimum(bus * TREE_LL_SHARE, ops.where(nodes <= 2, LL_MAX_BW[0], LL_MAX_BW[1]))
    elif p == 1:
        bus = bus * TREE_LL128_SHARE
    lat = BASE_LAT["tree"][p] + 2 * ((rpn - 1) * HW_LAT[hw]["tree"][p] + ops.log2i(nodes) * HW_LAT["net"]["tree"][p])
    return lat * 1e-6 + size / (bus * TREE_RATIO * ops.correction(p, size))


def candidates(collective: str, size, rpn, nodes, busbw, *, hw: str = "nvlink", ll128: bool = True, ops=NumpyOps,
               n=None):
    """``{(algorithm, protocol): seconds}`` for every choice NCCL allows across ``nodes`` > 1 nodes.

    ``size``: nccl-tests S of the whole group; ``rpn``: ranks per node; ``busbw``: inter-node bus bandwidth
    per rank (bytes/s); ``hw``: the intra-node link NCCL sees (``nvlink`` or ``pci``); ``ll128``: whether
    LL128 is enabled (tuning.cc:282-294: Volta/Ampere/Hopper over NVLink with GPU-direct RDMA).
    """
    if collective not in NCCL_COLLECTIVES:
        raise InvalidInputError(f"'collective' must be one of {', '.join(NCCL_COLLECTIVES)} for NCCL's model: "
                                f"got {collective!r}")
    if hw not in INTRA_HW:
        raise InvalidInputError(f"'hw' must be one of {', '.join(INTRA_HW)}: got {hw!r}")
    n = rpn * nodes if n is None else n
    out = {}
    for p, proto in enumerate(PROTOCOLS):
        if proto == "LL128" and not ll128:
            continue
        out["ring", proto] = _ring(collective, size, n, rpn, nodes, busbw, hw, p, ops)
        if collective == "all_reduce":  # tree only for all-reduce in v2.18 (tuning.cc:165-169)
            out["tree", proto] = _tree(size, rpn, nodes, busbw, hw, p, ops)
    return out


class FloatOps:
    """The same operations on Python floats: one collective without numpy's per-call overhead."""

    minimum = staticmethod(min)
    maximum = staticmethod(max)
    where = staticmethod(lambda cond, a, b: a if cond else b)
    log2i = staticmethod(lambda x: float(math.floor(math.log2(max(x, 1.0)))))

    @staticmethod
    def correction(protocol: int, size: float) -> float:
        idx = int(FloatOps.log2i(math.floor(size / 64.0)))
        table = TREE_CORRECTION[protocol]
        return table[idx] if idx < len(table) else 1.0


_FLOATS = (float, int, np.float64, np.int64)


def nccl_time(collective: str, size, rpn, nodes, busbw, *, hw: str = "nvlink", ll128: bool = True) -> np.ndarray:
    """Seconds of the fastest algorithm and protocol (numpy arrays broadcast); no bytes cost nothing."""
    if all(type(x) in _FLOATS or (type(x) is np.ndarray and x.ndim == 0) for x in (size, rpn, nodes)):
        size, rpn, nodes = float(size), float(rpn), float(nodes)
        times = candidates(collective, size, rpn, nodes, float(busbw), hw=hw, ll128=ll128, ops=FloatOps)
        return np.asarray(min(times.values()) if size > 0 else 0.0)
    size = np.asarray(size, float)
    times = candidates(collective, size, np.asarray(rpn, float), np.asarray(nodes, float), float(busbw),
                       hw=hw, ll128=ll128)
    best = np.minimum.reduce(np.broadcast_arrays(*times.values()))
    return np.where(size > 0, best, 0.0)


def nccl_choice(collective: str, size: float, rpn: int, nodes: int, busbw: float, *, hw: str = "nvlink",
                ll128: bool = True) -> tuple[str, str]:
    """(algorithm, protocol) NCCL's model picks for one size and placement."""
    times = candidates(collective, float(size), float(rpn), float(nodes), float(busbw), hw=hw, ll128=ll128,
                       ops=FloatOps)
    return min(times, key=times.get)


class SympyOps:
    """The same operations on sympy expressions (a fixed placement: rpn and nodes are numbers)."""

    minimum = staticmethod(lambda a, b: sp.Min(a, b, evaluate=False))
    maximum = staticmethod(lambda a, b: sp.Max(a, b, evaluate=False))
    log2i = staticmethod(lambda x: math.floor(math.log2(max(float(x), 1.0))))

    @staticmethod
    def where(cond, a, b):
        if cond in (True, False):  # a number's comparison, or one sympy decides
            return a if cond else b
        return sp.Piecewise((a, cond), (b, True))

    @staticmethod
    def correction(protocol, size):
        if getattr(sp.sympify(size), "is_number", False):  # a known size: the table's entry
            return float(NumpyOps.correction(protocol, float(size)))
        pieces = [(f, sp.Lt(size, 64 * 2 ** (i + 1))) for i, f in enumerate(TREE_CORRECTION[protocol])]
        return sp.Piecewise(*pieces, (1.0, True))


def nccl_expression(collective: str, size, rpn: float, nodes: float, n, busbw: float, *, hw: str = "nvlink",
                    ll128: bool = True):
    """Sympy twin of ``nccl_time`` for S > 0: ``size`` and ``n`` (the group, rpn x nodes) may be symbols."""
    times = candidates(collective, size, float(rpn), float(nodes), float(busbw), hw=hw, ll128=ll128, ops=SympyOps, n=n)
    return sp.Min(*times.values(), evaluate=False)
