"""Collectives over several sites: the WAN as a third, slowest fabric level.

A group spread over sites has, in each site, ``ranks_per_node`` ranks on each of ``nodes``
nodes. Its collectives compose the two levels inside a site
(:func:`perfmodel.costs.comm.hierarchical_time`) with one WAN level over the sites, the way
hierarchical all-reduce composes node and network (Horovod, Sergeev & Del Balso 2018):

* all-reduce: reduce-scatter inside each site, all-reduce over the WAN, all-gather inside;
* reduce-scatter: inside, then over the WAN; all-gather: over the WAN, then inside;
* broadcast: pipelined through every level, so the slowest bounds it (as across nodes);
* sendrecv: one pair of sites.

Every rank of a site holds a distinct 1/r share after the site's reduce-scatter and all of
them cross the WAN at once, so the WAN level carries the group's whole ``S`` through the
site's uplink: it is priced as one collective of ``S`` with one "rank" per site. Several
groups crossing at once (the tensor x pipeline shards of a model) multiply the WAN bytes.

Over the sites, ``algorithm="ring"`` is a ring in the order the sites are listed, paced by its
slowest link (the smallest bandwidth, the largest latency of the ring's edges), latency per
step as NCCL's tuning model charges it (the rule of ``perfmodel.parallel.fabric.datasheet_entry``);
``algorithm="tree"`` is a binary tree over the sites in that order (site i's parent is
(i - 1) // 2), latency twice the slowest root-to-leaf path (reduce up, broadcast down), bus
bandwidth as the ring's (NCCL's double binary tree reaches full bandwidth, Jeaugey 2019,
"Massively scale your deep learning training with NCCL 2.4", NVIDIA blog). A measured curve
on the WAN (all-reduce, one rank per site, all the sites) replaces both where given: its
time is interpolated in log-log between the measured points and follows the last point's
bus bandwidth beyond them.
"""

from __future__ import annotations

import numpy as np

from perfmodel.costs.comm import BUSBW_FACTOR, collective_time, datasheet_entry, hierarchical_time
from perfmodel.core.errors import UnsupportedError
from perfmodel.core.checks import check_choice

SITE_ALGORITHMS = ("ring", "tree")
WAN_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "sendrecv")


def ring_edges(names) -> list[tuple[str, str]]:
    """The edges of a ring over the sites in the order given (two sites: one edge)."""
    names = list(names)
    if len(names) == 2:
        return [(names[0], names[1])]
    return [(names[i], names[(i + 1) % len(names)]) for i in range(len(names))]


def tree_paths(names) -> list[list[tuple[str, str]]]:
    """Root-to-leaf paths (lists of edges) of the binary tree whose site i has parent (i - 1) // 2."""
    names = list(names)
    leaves = [i for i in range(len(names)) if 2 * i + 1 >= len(names)]
    paths = []
    for leaf in leaves:
        path, i = [], leaf
        while i > 0:
            path.append((names[(i - 1) // 2], names[i]))
            i = (i - 1) // 2
        paths.append(path)
    return paths


def ring_entry(bw_bytes_per_s: float, latency_s: float, *, source: str) -> dict:
    """A datasheet entry whose latency grows by one link latency per ring step, the rule the
    site levels follow (perfmodel.parallel.fabric.datasheet_entry; NVIDIA/nccl src/graph/tuning.cc)."""
    entry = datasheet_entry(bw_bytes_per_s, latency_s, source=source)
    entry["params"]["alpha_rank_s"] = float(latency_s)
    return entry


def wan_entry(multi, algorithm: str = "ring") -> dict:
    """The collective entry (perfmodel.costs.comm form) of the WAN level over all the sites."""
    check_choice("algorithm", algorithm, SITE_ALGORITHMS)
    names = multi.names
    if algorithm == "ring":
        links = [multi.link(a, b) for a, b in ring_edges(names)]
        bw = min(link.bw_bytes_per_s for link in links)
        latency = max(link.latency_s for link in links)
        return ring_entry(bw, latency, source=f"WAN ring over {', '.join(names)}: slowest link")
    paths = tree_paths(names)
    edges = {edge for path in paths for edge in path}
    bw = min(multi.link(a, b).bw_bytes_per_s for a, b in edges)
    depth_s = max(sum(multi.link(a, b).latency_s for a, b in path) for path in paths)
    return datasheet_entry(bw, 2.0 * depth_s, source=f"WAN binary tree over {', '.join(names)}")


def _measured_curve(multi):
    """The one measured WAN curve that applies to every edge, else None."""
    curves = {multi.link(a, b).curve for i, a in enumerate(multi.names) for b in multi.names[i + 1:]}
    return curves.pop() if len(curves) == 1 else None


def curve_time(curve, size_bytes) -> np.ndarray:
    """Seconds of the measured all-reduce at ``size_bytes``: log-log interpolation, then the last busbw."""
    sizes, times = (np.array(v, float) for v in zip(*curve))
    size = np.maximum(np.asarray(size_bytes, float), 1e-300)
    inside = np.exp(np.interp(np.log(size), np.log(sizes), np.log(times)))
    beyond = times[-1] * size / sizes[-1]  # past the largest point: bandwidth-bound at the last busbw
    return np.where(size > sizes[-1], beyond, inside)


def wan_time(multi, collective: str, size_bytes, *, algorithm: str = "ring") -> np.ndarray:
    """Seconds of ``collective`` of ``size_bytes`` (nccl-tests S) over the WAN, one "rank" per site."""
    check_choice("collective", collective, WAN_COLLECTIVES)
    size = np.asarray(size_bytes, float)
    n = multi.n_sites if collective != "sendrecv" else 2
    curve = _measured_curve(multi)
    if curve is not None:
        # the curve is an all-reduce; another collective moves factor_c / factor_ar as many bus bytes
        ratio = BUSBW_FACTOR[collective](n) / BUSBW_FACTOR["all_reduce"](multi.n_sites)
        return np.where(size > 0, curve_time(curve, size * ratio), 0.0)
    return collective_time(wan_entry(multi, algorithm), collective, size, n)


def three_level_time(multi, site_collectives, collective: str, size_bytes, layouts, *,
                     algorithm: str = "ring", concurrent_groups=1) -> np.ndarray:
    """Seconds of a collective over a group spread over every site.

    ``site_collectives[name]``: the site's two-level entries (:func:`perfmodel.parallel.fabric.cluster_collectives`);
    ``layouts[name]``: ``(ranks_per_node, nodes)`` of the group inside that site; ``size_bytes``:
    the group's nccl-tests S; ``concurrent_groups``: groups crossing the WAN at the same time
    (their bytes share the uplinks). The slowest site sets each in-site phase.
    """
    check_choice("collective", collective, (*WAN_COLLECTIVES, "all_to_all"))
    if collective == "all_to_all":
        raise UnsupportedError("an all-to-all across sites is not modelled: expert groups stay inside "
                               "a site (use ep that divides each site's data-parallel ranks)")
    size = np.asarray(size_bytes, float)

    def inside(c):
        return np.max([hierarchical_time(site_collectives[n], c, size, *layouts[n])
                       for n in multi.names], axis=0)

    wan = wan_time(multi, collective, size * concurrent_groups, algorithm=algorithm)
    if collective == "all_reduce":
        return inside("reduce_scatter") + wan + inside("all_gather")
    if collective == "reduce_scatter":
        return inside("reduce_scatter") + wan
    if collective == "all_gather":
        return wan + inside("all_gather")
    if collective == "broadcast":
        return np.maximum(wan, inside("broadcast"))
    return wan  # sendrecv: a pair of sites
