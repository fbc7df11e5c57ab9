"""Time of a collective, in nccl-tests terms, on one fabric level or across nodes.

Conventions (nccl-tests doc/PERFORMANCE.md): ``S`` is the message size as
nccl-tests reports it for each collective (for all_gather and reduce_scatter
the full, gathered buffer), ``algbw = S / t`` and ``busbw = algbw * factor(n)``.
A fitted entry describes the bus bandwidth of one fabric level as a function
of the message size, so one entry serves every group size::

    t(S, n) = alpha(n) + S * factor(n) / busbw(S)        alpha(n) = alpha_s + alpha_rank_s * (n - 1)

An entry is plain data (JSON-able)::

    {"form": "comm_logistic", "params": {...}, "cv_mape": 0.06, "n_points": 24,
     "range_bytes": [1024, 8589934592], "source": "..."}

and a profile keeps them as ``collectives[level][collective]`` with ``level``
``"intra"`` (inside a node) or ``"inter"`` (between nodes, per rank: the bus
bandwidth one rank reaches while every rank of its node communicates).
A group of one rank, or a message of zero bytes, costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from perfmodel.core.lazy import sympy as sp  # imported on first symbolic use

from perfmodel.core.errors import InvalidInputError, ProfileError, unknown_name
from perfmodel.core.choices import ALGORITHMS, COLLECTIVES, ENTRY_KEYS, LEVELS  # noqa: F401 (re-exported)
from perfmodel.forms.base import Form
from perfmodel.forms.comm import BUSBW_FACTOR, collective_expression
from perfmodel.forms.registry import COMM_FORMS, FORMS
from perfmodel.core.memo import PLAIN_TYPES, IdentityMemo, scalar
from perfmodel.core.checks import check_choice, check_int, check_positive
from perfmodel.costs.nccl_tuning import NCCL_COLLECTIVES, nccl_expression, nccl_time




# --- input checks ---------------------------------------------------------------------------


def _array(name: str, value, *, integer: bool = False, minimum: float = 0.0) -> np.ndarray:
    """``value`` as a float array, requiring finite values >= ``minimum`` (integers if asked)."""
    if type(value) in PLAIN_NUMBERS or (type(value) is np.ndarray and value.ndim == 0 and value.dtype.kind in "fiu"):
        v = float(value)  # one number: the same checks without numpy's reductions
        if v >= minimum and math.isfinite(v) and not (integer and v != round(v)):
            return np.asarray(v)
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{name!r} must be numbers: got {value!r}") from None
    if not arr.size or (arr.min() >= minimum and np.isfinite(arr.max())  # the usual case: two reductions
                        and not (integer and np.any(arr != np.round(arr)))):
        return arr
    bad = ~np.isfinite(arr) | (arr < minimum)
    if integer:
        bad |= arr != np.round(arr)
    if np.any(bad):
        kind = f"integers >= {minimum:g}" if integer else f"finite numbers >= {minimum:g}"
        raise InvalidInputError(f"{name!r} must be {kind}: got {float(arr[bad].flat[0])!r}")
    return arr


def _check_collective(collective: str) -> str:
    return check_choice("collective", collective, COLLECTIVES)


def comm_form(entry: Mapping) -> Form:
    """The registered form an entry names, after checking the entry has what it needs."""
    if not isinstance(entry, Mapping) or "form" not in entry or "params" not in entry:
        raise ProfileError(f"a collective entry needs 'form' and 'params': got {entry!r}")
    name = entry["form"]
    if name is None:
        raise ProfileError(f"collective entry was not fitted: {entry.get('note', 'no form')}")
    if name not in COMM_FORMS:
        raise unknown_name("communication form", name, COMM_FORMS)
    form = FORMS[name]
    missing = [p for p in form.params if p not in entry["params"]]
    if missing:
        raise ProfileError(f"form {name!r} lacks parameters {missing} (needs {list(form.params)})")
    return form


# --- one fabric level -----------------------------------------------------------------------


def busbw_factor(collective: str, n) -> np.ndarray:
    """nccl-tests bus-bandwidth factor ``busbw / algbw`` for ``n`` ranks (array-valued)."""
    _check_collective(collective)
    return np.asarray(BUSBW_FACTOR[collective](_array("group_size", n, integer=True, minimum=1)))


def busbw_from_time(collective: str, size_bytes, group_size, time_s) -> np.ndarray:
    """Bus bandwidth (bytes/s) of a measured time: ``S / t * factor(n)`` (nccl-tests)."""
    time_s = _array("time_s", time_s)
    return _array("size_bytes", size_bytes) / time_s * busbw_factor(collective, group_size)


def collective_time(entry: Mapping, collective: str, size_bytes, group_size) -> np.ndarray:
    """Seconds for one collective of ``size_bytes`` (nccl-tests S) over ``group_size`` ranks.

    ``entry`` is a fitted or datasheet entry of one fabric level; arrays broadcast.
    One-number calls are remembered by (entry identity, collective, size, n): see perfmodel/core/memo.py.
    """
    if "mesh_peers" in entry:  # a switchless NVLink mesh: n ranks use n − 1 of the peers' link shares
        size_bytes = mesh_bytes(entry["mesh_peers"], size_bytes, group_size)
    key = _scalar_key(collective, size_bytes, group_size)
    if key is not None:
        hit = _COLLECTIVE_MEMO.get(entry, key)
        if hit is None:
            hit = _one_collective(entry, collective, size_bytes, group_size)
            _COLLECTIVE_MEMO.put(entry, key, hit)
        return hit.copy()
    return _collective_time(entry, collective, size_bytes, group_size)


def mesh_bytes(peers, size_bytes, group_size):
    """Bytes at the full link rate equal to ``size_bytes`` among ``group_size`` of a fully connected
    switchless NVLink mesh whose GPUs each split their links over ``peers`` peers: a ring (NCCL builds
    one per peer pairing) over n ranks drives n − 1 of the peer shares, so it runs at (n − 1)/peers of the
    rate the whole node's ring reaches (NVIDIA HGX 4-GPU: 6 of 18 NVLinks between two GPUs). S·peers/(n − 1)
    at that rate is the same time; n − 1 ≥ peers leaves S unchanged."""
    n = np.asarray(group_size, float)
    share = np.minimum(np.maximum(n - 1.0, 1.0), float(peers)) / float(peers)
    out = np.asarray(size_bytes, float) / share
    return float(out) if out.ndim == 0 else out


_COLLECTIVE_MEMO = IdentityMemo()
_HIERARCHICAL_MEMO = IdentityMemo()


# array results of up to ARRAY_MEMO_MAX elements (at most 32 MB): the default Llama-3-405B search on
# 16,384 H100 keeps ~500 (2 MB); fewer entries evict a root's collectives before its recompute variants reuse them
_ARRAY_MEMO = IdentityMemo(1024)
ARRAY_MEMO_MAX = 4096
PLAIN_NUMBERS = frozenset((float, int, np.float64, np.int64))


def _array_key(collective, size, rpn, nodes, algorithm):
    """A memo key of array arguments by their bytes, or None when they are large or not numbers."""
    try:
        arrays = [np.asarray(x, dtype=float) for x in (size, rpn, nodes)]
    except (TypeError, ValueError):
        return None
    if max(a.size for a in arrays) > ARRAY_MEMO_MAX:
        return None
    return (collective, algorithm, *((a.shape, a.tobytes()) for a in arrays))


def _scalar_key(*values):
    """A memo key of one-number arguments, or None when any of them is an array."""
    key = tuple([v if type(v) in PLAIN_TYPES else scalar(v) for v in values])
    return None if None in key else key


def _collective_time(entry: Mapping, collective: str, size_bytes, group_size) -> np.ndarray:
    form = comm_form(entry)
    factor = busbw_factor(collective, group_size)
    size = _array("size_bytes", size_bytes)
    n = _array("group_size", group_size, integer=True, minimum=1)
    t = form.evaluate(entry["params"], size=size, n=n, factor=factor)
    return np.where((size > 0) & (n > 1), t, 0.0)  # one rank or no bytes: nothing to send


def _level_time(entry: Mapping, collective: str, size: np.ndarray, n: np.ndarray) -> np.ndarray:
    """``_collective_time`` of float arrays ``_hierarchical_time`` has checked (sizes finite and >= 0,
    groups whole and >= 1, and what it derives from them), without checking them again."""
    form = comm_form(entry)
    t = form.evaluate(entry["params"], size=size, n=n, factor=np.asarray(BUSBW_FACTOR[collective](n)))
    return np.where((size > 0) & (n > 1), t, 0.0)  # one rank or no bytes: nothing to send


def _one_collective(entry: Mapping, collective: str, size_bytes, group_size) -> np.ndarray:
    """``_collective_time`` of one size and group on Python floats (the same operations); bad
    input goes the checked way, to its error."""
    form, size, n = comm_form(entry), float(size_bytes), float(group_size)
    if collective not in BUSBW_FACTOR or not (0 <= size < math.inf and 1 <= n < math.inf and n == round(n)):
        return _collective_time(entry, collective, size_bytes, group_size)
    if size > 0 and n > 1:
        return np.asarray(form.evaluate(entry["params"], size=size, n=n, factor=BUSBW_FACTOR[collective](n)), float)
    return np.asarray(0.0)  # one rank or no bytes: nothing to send


def datasheet_entry(bw_bytes_per_s: float, latency_s: float, *, source: str) -> dict:
    """Fallback entry from a link figure: constant bus bandwidth plus a latency.

    ``bw_bytes_per_s`` is the bus bandwidth NCCL reaches on the link (a Link's
    ``nccl_busbw_bytes_per_s``, else line rate times a cited efficiency).
    """
    bw = check_positive("bw_bytes_per_s", bw_bytes_per_s)
    latency = check_positive("latency_s", latency_s, allow_zero=True)
    if not isinstance(source, str) or not source.strip():
        raise InvalidInputError(f"'source' must name where the figure comes from: got {source!r}")
    return {
        "form": "comm_alpha_beta",
        "params": {"alpha_s": latency, "alpha_rank_s": 0.0, "busbw_bytes_per_s": bw},
        "cv_mape": None,
        "n_points": 0,
        "range_bytes": None,
        "source": source,
    }


def rail_busbw(nic_busbw_bytes_per_s: float, nics_per_node: int, ranks_per_node: int) -> float:
    """Inter-node bus bandwidth per rank when every rank of a node talks at once.

    Ranks share the node's NICs: each gets ``nic_busbw * min(nics, ranks) / ranks``
    (one NIC per GPU on DGX A100/H100: 8 x 24 GB/s HDR -> 192 GB/s, NVIDIA/nccl#812).
    """
    bw = check_positive("nic_busbw_bytes_per_s", nic_busbw_bytes_per_s)
    nics = check_int("nics_per_node", nics_per_node)
    ranks = check_int("ranks_per_node", ranks_per_node)
    return bw * min(nics, ranks) / ranks


def formula(entry: Mapping, collective: str, *, size=None, n=None) -> sp.Expr:
    """Sympy expression of ``collective_time`` (valid for n >= 2 and S > 0); ``size`` and ``n``
    default to the symbols S and n."""
    size = sp.Symbol("S") if size is None else size
    n = sp.Symbol("n") if n is None else n
    _check_collective(collective)
    form = comm_form(entry)
    params = {k: float(v) for k, v in entry["params"].items()}
    return collective_expression(form, params, collective, size=size, n=n)


# --- across nodes ---------------------------------------------------------------------------


def lookup_entry(collectives: Mapping[str, Mapping[str, dict]], level: str, collective: str) -> dict:
    """Entry of ``collective`` at ``level``, else that level's all_reduce entry.

    The fallback reads busbw as the fabric's speed whatever the collective
    (nccl-tests doc/PERFORMANCE.md); an NVLS-fitted all_reduce overstates the
    others by about 480/370 on NVLink4 (NVIDIA/nccl-tests#212).
    """
    _check_collective(collective)
    check_choice("level", level, LEVELS)
    if level not in collectives:
        raise ProfileError(
            f"profile has no {level!r} collectives (levels: {', '.join(sorted(collectives)) or 'none'}); "
            f"add a fitted entry or datasheet_entry(bw, latency, source=...)"
        )
    entries = collectives[level]
    for name in (collective, "all_reduce"):
        if name in entries:
            return entries[name]
    raise ProfileError(
        f"profile has no {level!r} entry for {collective!r} nor 'all_reduce' "
        f"(has: {', '.join(sorted(entries)) or 'none'})"
    )


def _nccl_priced(entry: Mapping, collective: str) -> bool:
    """Whether an inter-node entry is priced by NCCL's own model (``nccl_tuning``) for ``collective``."""
    return "nccl" in entry and collective in NCCL_COLLECTIVES


def _inter_time(entry, collective, size, rpn, nodes, level=collective_time):
    """Seconds of ``collective`` over ``rpn`` ranks on each of ``nodes`` nodes whose inter-node part runs on
    ``entry``: NCCL's model where the entry asks for it, else the entry's form on S/rpn per rail over all ranks."""
    if _nccl_priced(entry, collective):
        return nccl_time(collective, size, rpn, nodes, entry["params"]["busbw_bytes_per_s"], **entry["nccl"])
    return level(entry, collective, size / rpn, rpn * nodes)


def _spanning_time(intra, inter, collective, size, rpn, nodes, algorithm, level=collective_time):
    """Time of a group with ``rpn`` ranks on each of ``nodes`` nodes, both > 1 (``level``: the price of
    one fabric level, ``_level_time`` for arrays already checked)."""
    ti = lambda c, s, n: level(intra(c), c, s, n)  # noqa: E731
    tx = lambda c, s, n: _inter_time(inter(c), c, s, 1.0, n, level)  # noqa: E731 (one rank per node per rail)
    rails = size / rpn  # after an intra reduce-scatter each rank holds S / rpn, one rail each
    if algorithm == "ring" and collective in ("all_reduce", "all_gather", "reduce_scatter"):
        # flat ring over all ranks (Gibiansky 2017): NVLink carries S f(N) per rank, each rail S f(N) / rpn;
        # NCCL's model (nccl_tuning) also weighs its tree against the ring and picks the protocol
        return np.maximum(ti(collective, size, rpn * nodes), _inter_time(inter(collective), collective, size, rpn,
                                                                         nodes, level))
    if collective == "all_reduce":
        # reduce-scatter inside, all-reduce of S/rpn on rpn rails at once, all-gather inside
        # (Horovod hierarchical allreduce, Sergeev & Del Balso 2018)
        return ti("reduce_scatter", size, rpn) + tx("all_reduce", rails, nodes) + ti("all_gather", size, rpn)
    if collective == "reduce_scatter":  # first half of the all-reduce above
        return ti("reduce_scatter", size, rpn) + tx("reduce_scatter", rails, nodes)
    if collective == "all_gather":  # second half: gather S/rpn across rails, then S inside
        return tx("all_gather", rails, nodes) + ti("all_gather", size, rpn)
    if collective == "broadcast":
        # NCCL pipelines the broadcast chain through every rank: the slower fabric bounds it
        return np.maximum(tx("broadcast", size, nodes), ti("broadcast", size, rpn))
    if collective == "all_to_all":
        # grouped send/recv run at once: S (nodes-1)/nodes leaves each rank by NIC, S (rpn-1)/N by NVLink
        return np.maximum(tx("all_to_all", size, nodes), ti("all_to_all", size / nodes, rpn))
    return tx("sendrecv", size, np.full_like(size, 2.0))  # sendrecv: a pair across nodes


def hierarchical_time(
    collectives: Mapping[str, Mapping[str, dict]],
    collective: str,
    size_bytes,
    ranks_per_node,
    nodes,
    *,
    algorithm: str = "hierarchical",
) -> np.ndarray:
    """Seconds for a collective over ``ranks_per_node`` ranks on each of ``nodes`` nodes.

    ``nodes == 1`` uses the intra entry only, ``ranks_per_node == 1`` the inter
    entry only; otherwise the hierarchical composition (or a flat NCCL ring with
    ``algorithm="ring"``). ``size_bytes`` is the nccl-tests S of the whole group.
    One-number calls are remembered per collectives mapping (by identity), as ``collective_time``'s.
    """
    key = _scalar_key(collective, size_bytes, ranks_per_node, nodes, algorithm)
    memo = _HIERARCHICAL_MEMO
    if key is None:  # arrays: a search prices the same groups under each recompute policy
        key, memo = _array_key(collective, size_bytes, ranks_per_node, nodes, algorithm), _ARRAY_MEMO
        if key is None:
            return _hierarchical_time(collectives, collective, size_bytes, ranks_per_node, nodes, algorithm)
    hit = memo.get(collectives, key)
    if hit is None:
        hit = _hierarchical_time(collectives, collective, size_bytes, ranks_per_node, nodes, algorithm)
        memo.put(collectives, key, hit)
    return hit.copy()


def _hierarchical_time(collectives, collective, size_bytes, ranks_per_node, nodes, algorithm) -> np.ndarray:
    _check_collective(collective)
    check_choice("algorithm", algorithm, ALGORITHMS)
    size = _array("size_bytes", size_bytes)
    rpn = _array("ranks_per_node", ranks_per_node, integer=True, minimum=1)
    nodes = _array("nodes", nodes, integer=True, minimum=1)
    if size.ndim == 0 and rpn.ndim == 0 and nodes.ndim == 0:  # one group: its branch alone, no masks
        branch = 0 if nodes == 1 else 1 if rpn == 1 else 2
        return np.asarray(_branch_prices(collectives, collective, algorithm, collective_time)[branch](size, rpn, nodes),
                          float)
    size, rpn, nodes = np.broadcast_arrays(size, rpn, nodes)
    one_node = nodes == 1
    one_rank = (rpn == 1) & ~one_node
    masks = (one_node, one_rank, ~one_node & ~one_rank)
    prices = _branch_prices(collectives, collective, algorithm, _level_time)
    for mask, price in zip(masks, prices):
        if size.size and mask.all():  # a search's tensor groups sit in one node, its data-parallel groups span
            t = np.asarray(price(size, rpn, nodes), dtype=float)  # nodes: the branch on whole arrays, no gathers
            return t if t.shape == size.shape else np.array(np.broadcast_to(t, size.shape))
    out = np.zeros(size.shape)
    for mask, price in zip(masks, prices):
        if mask.any():
            out[mask] = price(size[mask], rpn[mask], nodes[mask])
    return out


def _branch_prices(collectives, collective, algorithm, level):
    """The price of a group inside one node, of one rank on each of several nodes, and of several ranks on
    each of several nodes: functions of (size, ranks per node, nodes); ``level`` prices one fabric level."""
    intra = lambda c: lookup_entry(collectives, "intra", c)  # noqa: E731
    inter = lambda c: lookup_entry(collectives, "inter", c)  # noqa: E731
    return (lambda size, rpn, nodes: level(intra(collective), collective, size, rpn),
            lambda size, rpn, nodes: _inter_time(inter(collective), collective, size, 1.0, nodes, level),
            lambda size, rpn, nodes: _spanning_time(intra, inter, collective, size, rpn, nodes, algorithm, level))


def ring_formula(collectives: Mapping[str, Mapping[str, dict]], collective: str, size, ranks_per_node, nodes,
                 n) -> sp.Expr:
    """Sympy twin of ``hierarchical_time(..., algorithm="ring")`` for a ring collective (all-reduce,
    all-gather, reduce-scatter) whose group of ``n`` ranks (a symbol or a number) sits as
    ``ranks_per_node`` ranks on each of ``nodes`` nodes (numbers: the placement is fixed)."""
    if collective not in ("all_reduce", "all_gather", "reduce_scatter"):
        raise InvalidInputError(f"'collective' must be a ring collective (all_reduce, all_gather, reduce_scatter): "
                                f"got {collective!r}")
    intra = lambda s: formula(lookup_entry(collectives, "intra", collective), collective, size=s, n=n)  # noqa: E731
    def inter(r):  # the inter-node part of a ring over r ranks per node, as ``_inter_time``
        entry = lookup_entry(collectives, "inter", collective)
        if _nccl_priced(entry, collective):
            return nccl_expression(collective, size, r, float(nodes), n, entry["params"]["busbw_bytes_per_s"],
                                   **entry["nccl"])
        return formula(entry, collective, size=size / r, n=n)

    if float(nodes) == 1:
        return intra(size)
    if float(ranks_per_node) == 1:
        return inter(1.0)
    # flat ring over all ranks (Gibiansky 2017), as ``_spanning_time``
    return sp.Max(intra(size), inter(float(ranks_per_node)), evaluate=False)  # comparing the pieces is slow
