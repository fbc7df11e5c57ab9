"""Collectives of a search priced on their distinct (size, group) triples, several sizes in one call.

A search's grid repeats a few bucket sizes and group placements over many rows (its sharding and
recomputation axes), and a stage's data-parallel terms price the same collective over the same group
at several sizes (a bucket list's first, full and last buckets; ZeRO-3's units). The collective's
model (``costs.comm.hierarchical_time``) is elementwise, so each distinct triple priced once, in one
call, and spread back gives every element the number its own call gives, for one call's overhead.
"""

from __future__ import annotations

import numpy as np

from perfmodel.core.memo import IdentityMemo
from perfmodel.costs.comm import hierarchical_time

# stacked collectives of a search, by their arrays' bytes: its recomputation and sharding variants
# price the same groups again (~100 entries in the default Llama-3-405B search on 16,384 H100)
_STACKED_MEMO = IdentityMemo(1024)


def stacked_time(coll, collective, sizes, rpn, nodes, algorithm="ring"):
    """``[hierarchical_time(coll, collective, s, rpn, nodes, algorithm=...) for s in sizes]``, each
    distinct (size, ranks per node, nodes) of them priced once.

    A search's grid repeats a few bucket sizes and group placements over many rows; the collective's
    model is elementwise, so pricing the distinct triples once, in one call, and spreading them back
    (``np.unique`` and its inverse) gives each element the number its own call gives. The results
    are remembered by the arrays' bytes (read-only). One group (numbers): one call per size.
    """
    if not any(np.ndim(x) for x in (*sizes, rpn, nodes)):  # one group (a single prediction): as before
        return [hierarchical_time(coll, collective, s, rpn, nodes, algorithm=algorithm) for s in sizes]
    shapes = [np.broadcast_shapes(np.shape(s), np.shape(rpn), np.shape(nodes)) for s in sizes]
    given = [np.asarray(x, dtype=float) for x in (*sizes, rpn, nodes)]
    if not np.broadcast_shapes(*(x.shape for x in given)) or not all(x.size for x in given):
        *sizes, rpn, nodes = np.broadcast_arrays(*given)
        return [hierarchical_time(coll, collective, s, rpn, nodes, algorithm=algorithm) for s in sizes]
    # keyed by the arrays as given (their shapes and bytes determine the result), not their broadcast copies
    key = (collective, algorithm, tuple((x.shape, x.tobytes()) for x in given))
    hit = _STACKED_MEMO.get(coll, key)
    if hit is None:
        *sizes, rpn, nodes = np.broadcast_arrays(*given)
        hit = _distinct_time(coll, collective, np.stack(sizes), _least(rpn), _least(nodes), algorithm)
        hit.flags.writeable = False
        _STACKED_MEMO.put(coll, key, hit)
    return [_unbroadcast(t, shape) for t, shape in zip(hit, shapes)]


def _unbroadcast(t, shape):
    """A view of ``t`` at ``shape``, which broadcasts to ``t.shape`` (each of its elements repeats there)."""
    lead = t.ndim - len(shape)
    return t[(0,) * lead + tuple(slice(None) if n == m else slice(0, 1) for n, m in zip(shape, t.shape[lead:]))]


def _least(a: np.ndarray) -> np.ndarray:
    """``a`` (a broadcast view) as the smallest array that broadcasts back to it: its repeated axes cut to 1."""
    return a[tuple(slice(0, 1) if step == 0 else slice(None) for step in a.strides)]


def _distinct_time(coll, collective, size, rpn, nodes, algorithm):
    """``hierarchical_time`` of float arrays that broadcast to ``size``'s shape, priced on their distinct
    triples. The group's columns are ranked on their own (smaller) shapes, the ranks broadcast."""
    codes = np.zeros(size.shape, dtype=np.int64)
    for column in (size, rpn, nodes):  # one integer per distinct triple, from each column's ranks
        values, rank = np.unique(column.reshape(-1), return_inverse=True)
        codes = codes * values.size + rank.reshape(column.shape)
    distinct, inverse = np.unique(codes.reshape(-1), return_inverse=True)
    first = np.empty(distinct.size, dtype=np.intp)
    first[inverse.reshape(-1)] = np.arange(size.size)  # one element of each distinct triple
    full = [np.broadcast_to(x, size.shape).reshape(-1) for x in (size, rpn, nodes)]
    t = hierarchical_time(coll, collective, *(x[first] for x in full), algorithm=algorithm)
    return np.asarray(t, dtype=float)[inverse.reshape(-1)].reshape(size.shape)
