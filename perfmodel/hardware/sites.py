"""Several datacenters ("sites") joined by a wide-area network (WAN).

    import perfmodel as pm
    us, eu = pm.cluster("dgx-h100", nodes=4), pm.cluster("hgx-h200", nodes=4)
    sites = pm.multi_cluster([us, eu], wan=pm.wan_link("100Gb/s", "40ms"), names=["us", "eu"])
    sites = pm.multi_cluster("two_regions.toml")        # [[sites]] and [wan] (docs/datacenters.md)

Each site is an ordinary :class:`~perfmodel.hardware.node.Cluster` (its GPU type may differ
from the others'). The WAN is either one link that every pair of sites shares the figures of
(``wan``) or one link per pair (``links``); a pair's own link wins over the shared one.

A WAN link's bandwidth is what one *site* can send to another, per direction, with all its
ranks sending at once (its uplink), and its latency the one-way delay. An optional measured
curve (``curve``: points of size in bytes and seconds of an all-reduce with one rank per site
over all the sites) replaces the bandwidth-latency model where it is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from perfmodel.core.errors import InvalidInputError, unknown_name
from perfmodel.hardware.common import FrozenMap, check_name
from perfmodel.hardware.node import Cluster
from perfmodel.core.units import format_rate, format_seconds, parse_bandwidth, parse_duration
from perfmodel.core.checks import check_positive
from perfmodel.hardware import catalog
from perfmodel.hardware.build import cluster

SITES_FIELDS = ("name", "sites", "wan", "description")
SITE_FIELDS = ("name", "cluster", "nodes", "gpus_per_node", "price_usd_per_gpu_hour", "provider",
               "region")
WAN_FIELDS = ("bandwidth", "latency", "curve", "source", "links")
LINK_FIELDS = ("sites", "bandwidth", "latency", "curve", "source")


def _curve(points, where: str) -> tuple[tuple[float, float], ...]:
    """Measured (size_bytes, time_s) points, sorted by size, sizes distinct and all > 0."""
    try:
        pairs = [(float(s), float(t)) for s, t in points]
    except (TypeError, ValueError):
        raise InvalidInputError(f"{where}: 'curve' must be (size_bytes, time_s) pairs: got {points!r}") from None
    for s, t in pairs:
        check_positive(f"{where} curve size_bytes", s)
        check_positive(f"{where} curve time_s", t)
    pairs.sort()
    if len(pairs) < 2 or len({s for s, _ in pairs}) != len(pairs):
        raise InvalidInputError(f"{where}: 'curve' needs at least 2 points of distinct sizes: got {len(pairs)}")
    return tuple(pairs)


@dataclass(frozen=True, repr=False)
class WanLink:
    """A WAN link: per-site bandwidth per direction (bytes/s), one-way latency, measured curve."""

    bw_bytes_per_s: float
    latency_s: float
    curve: tuple[tuple[float, float], ...] | None = None  # all-reduce over the sites, one rank each
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "bw_bytes_per_s", check_positive("wan bandwidth", self.bw_bytes_per_s))
        object.__setattr__(self, "latency_s", check_positive("wan latency", self.latency_s, allow_zero=True))
        if self.curve is not None:
            object.__setattr__(self, "curve", _curve(self.curve, "wan"))

    def replace_bandwidth(self, bw_bytes_per_s: float) -> WanLink:
        """The same link at another bandwidth (a measured curve no longer applies, so it is dropped)."""
        return WanLink(bw_bytes_per_s, self.latency_s, None, f"{self.source} (bandwidth changed)".strip())

    def __repr__(self) -> str:
        curve = f", curve of {len(self.curve)} points" if self.curve else ""
        return (f"WanLink({format_rate(self.bw_bytes_per_s * 8, 'b/s')}, "
                f"latency {format_seconds(self.latency_s)}{curve})")


def wan_link(bandwidth, latency, *, curve=None, source: str = "") -> WanLink:
    """A WAN link from ``"10Gb/s"``-style bandwidth and ``"30ms"``-style one-way latency (or SI numbers)."""
    return WanLink(parse_bandwidth(bandwidth, "wan bandwidth"), parse_duration(latency, "wan latency"),
                   curve, source)


@dataclass(frozen=True, repr=False)
class Site:
    """One datacenter: its cluster and, optionally, its price and where it is (for cost plans)."""

    name: str
    cluster: Cluster
    price_usd_per_gpu_hour: float | None = None
    provider: str | None = None
    region: str | None = None

    def __post_init__(self) -> None:
        check_name("site", self.name)
        if not isinstance(self.cluster, Cluster):
            raise InvalidInputError(f"site {self.name!r}: 'cluster' must be a Cluster (pm.cluster): "
                                    f"got {self.cluster!r}")
        if self.price_usd_per_gpu_hour is not None:
            check_positive(f"site {self.name!r} price_usd_per_gpu_hour", self.price_usd_per_gpu_hour)

    def __repr__(self) -> str:
        return f"Site({self.name!r}, {self.cluster.name}, {self.cluster.n_gpus} GPUs)"


@dataclass(frozen=True, repr=False)
class MultiCluster:
    """Sites joined by a WAN. Build one with :func:`multi_cluster`."""

    sites: tuple[Site, ...]
    wan: WanLink | None = None  # shared by every pair without a link of its own
    links: Mapping[frozenset, WanLink] = field(default_factory=FrozenMap)
    name: str = ""

    def __post_init__(self) -> None:
        sites = tuple(self.sites)
        if len(sites) < 2 or not all(isinstance(s, Site) for s in sites):
            raise InvalidInputError(f"'sites' must list at least 2 Site objects: got {self.sites!r}")
        names = [s.name for s in sites]
        if len(set(names)) != len(names):
            raise InvalidInputError(f"'sites' names must be unique: got {names}")
        if self.wan is not None and not isinstance(self.wan, WanLink):
            raise InvalidInputError(f"'wan' must be a WanLink (pm.wan_link): got {self.wan!r}")
        links = FrozenMap({frozenset(k): v for k, v in dict(self.links).items()})
        for pair, link in links.items():
            unknown = [n for n in pair if n not in names]
            if len(pair) != 2 or unknown or not isinstance(link, WanLink):
                raise InvalidInputError(f"'links' must map pairs of site names {names} to WanLinks: "
                                        f"got {sorted(pair)} -> {link!r}")
        object.__setattr__(self, "sites", sites)
        object.__setattr__(self, "links", links)
        missing = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]
                   if frozenset((a, b)) not in links and self.wan is None]
        if missing:
            raise InvalidInputError(f"'wan' is needed: no link joins sites {missing[0][0]!r} and "
                                    f"{missing[0][1]!r} (give wan=pm.wan_link(...) or a link per pair)")
        if not self.name:
            object.__setattr__(self, "name", " + ".join(names))

    def link(self, a: str, b: str) -> WanLink:
        """The WAN link between sites ``a`` and ``b``."""
        return self.links.get(frozenset((a, b)), self.wan)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.sites)

    @property
    def n_sites(self) -> int:
        return len(self.sites)

    @property
    def n_gpus(self) -> int:
        return sum(s.cluster.n_gpus for s in self.sites)

    def site(self, name: str) -> Site:
        for s in self.sites:
            if s.name == name:
                return s
        raise unknown_name("site", name, self.names)

    def with_wan(self, wan: WanLink) -> MultiCluster:
        """The same sites, every pair joined by ``wan`` (the inverse questions vary the WAN)."""
        return MultiCluster(self.sites, wan, FrozenMap(), self.name)

    def __repr__(self) -> str:
        wan = repr(self.wan) if self.wan is not None else f"{len(self.links)} links"
        return f"MultiCluster({self.name!r}: {self.n_sites} sites, {self.n_gpus} GPUs, {wan})"


def _as_site(item, name: str) -> Site:
    if isinstance(item, Site):
        return item
    if isinstance(item, Cluster):
        return Site(name, item)
    raise InvalidInputError(f"'clusters' items must be Clusters (pm.cluster) or Sites: got {item!r}")


def multi_cluster(clusters, wan=None, *, links=None, names=None, name: str = "") -> MultiCluster:
    """Sites joined by a WAN, from a list of clusters (or Sites) or a TOML path.

    ``wan``: a :class:`WanLink` shared by every pair (or a ``{"bandwidth", "latency"}`` mapping);
    ``links``: ``{("a", "b"): WanLink}`` per pair; ``names``: one per cluster (default
    ``site0``, ``site1``, ...).
    """
    if isinstance(clusters, (str, Path)):
        return load_multi_cluster(clusters)
    if not isinstance(clusters, Sequence) or isinstance(clusters, str):
        raise InvalidInputError(f"'clusters' must be a list of clusters or a TOML path: got {clusters!r}")
    if names is not None and len(names) != len(clusters):
        raise InvalidInputError(f"'names' must give one name per cluster ({len(clusters)}): got {names!r}")
    names = names or [getattr(c, "name", "") if isinstance(c, Site) else f"site{i}" for i, c in enumerate(clusters)]
    sites = tuple(_as_site(c, n) for c, n in zip(clusters, names))
    if isinstance(wan, Mapping):
        wan = _wan_from_dict(wan, "wan")
    return MultiCluster(sites, wan, FrozenMap(links or {}), name)


# --- files -------------------------------------------------------------------------------------


def _check_fields(data, allowed, where: str, required=()) -> None:
    if not isinstance(data, Mapping):
        raise InvalidInputError(f"{where}: must be a table of fields: got {data!r}")
    for key in data:
        if key not in allowed:
            raise InvalidInputError(f"{where}: {unknown_name('field', key, allowed)}")
    for key in required:
        if key not in data:
            raise InvalidInputError(f"{where}: missing field {key!r} (required: {', '.join(required)})")


def _curve_from(value, where: str, base: Path | None):
    """A curve given inline as pairs or as a CSV file with columns size_bytes and time_s (a
    calibration.collectives table: its cross-site all_reduce rows)."""
    if value is None or not isinstance(value, str):
        return value
    import pandas as pd

    path = Path(value).expanduser()
    path = base / path if base is not None and not path.is_absolute() else path
    if not path.is_file():
        raise InvalidInputError(f"{where}: 'curve' file {value!r} does not exist")
    table = pd.read_csv(path)
    if "scope" in table.columns:  # a calibration.collectives table: its cross-site all-reduce rows
        table = table[(table["scope"] == "cross-site") & (table["collective"] == "all_reduce")]
    if not {"size_bytes", "time_s"} <= set(table.columns):
        raise InvalidInputError(f"{where}: 'curve' file {value!r} needs columns size_bytes and time_s "
                                f"(has: {', '.join(table.columns)})")
    grouped = table.groupby("size_bytes")["time_s"].median()  # repeated sizes: their median
    return list(zip(grouped.index, grouped.to_numpy()))


def _wan_from_dict(data: Mapping, where: str, base: Path | None = None, fields=WAN_FIELDS) -> WanLink:
    _check_fields(data, fields, where, required=("bandwidth", "latency"))
    return WanLink(parse_bandwidth(data["bandwidth"], f"{where} bandwidth"),
                   parse_duration(data["latency"], f"{where} latency"),
                   _curve_from(data.get("curve"), where, base), str(data.get("source", where)))


def _site_from_dict(data: Mapping, where: str, base: Path) -> Site:
    _check_fields(data, SITE_FIELDS, where, required=("name", "cluster"))
    spec = data["cluster"]
    if isinstance(spec, str) and spec.endswith(".toml") and not Path(spec).expanduser().is_absolute():
        spec = str(base / spec)
    c = cluster(spec, nodes=data.get("nodes", 1), gpus_per_node=data.get("gpus_per_node"))
    return Site(data["name"], c, data.get("price_usd_per_gpu_hour"), data.get("provider"), data.get("region"))


def load_multi_cluster(path) -> MultiCluster:
    """Sites and WAN from a TOML file: ``[[sites]]`` tables and a ``[wan]`` table (docs/datacenters.md)."""
    resolved = catalog.existing_file(path, "sites")
    shown = str(path)
    data = catalog.read_toml_file(resolved, shown)
    _check_fields(data, SITES_FIELDS, shown, required=("sites",))
    if not isinstance(data["sites"], list):
        raise InvalidInputError(f"{shown}: 'sites' must be an array of tables ([[sites]]): got {data['sites']!r}")
    sites = tuple(_site_from_dict(s, f"{shown} [[sites]] #{i + 1}", resolved.parent)
                  for i, s in enumerate(data["sites"]))
    wan_data = data.get("wan", {})
    _check_fields(wan_data, WAN_FIELDS, f"{shown} [wan]")
    shared = (_wan_from_dict({k: v for k, v in wan_data.items() if k != "links"}, f"{shown} [wan]",
                             resolved.parent) if "bandwidth" in wan_data or "latency" in wan_data else None)
    links = {}
    for i, item in enumerate(wan_data.get("links", [])):
        where = f"{shown} [[wan.links]] #{i + 1}"
        _check_fields(item, LINK_FIELDS, where, required=("sites", "bandwidth", "latency"))
        pair = item["sites"]
        if not isinstance(pair, list) or len(pair) != 2 or not all(isinstance(n, str) for n in pair):
            raise InvalidInputError(f"{where}: 'sites' must name two sites: got {pair!r}")
        links[frozenset(pair)] = _wan_from_dict({k: v for k, v in item.items() if k != "sites"}, where,
                                                resolved.parent, LINK_FIELDS)
    return MultiCluster(sites, shared, FrozenMap(links), str(data.get("name", "")))


# --- an iperf-style measurement --------------------------------------------------------------------

_IPERF_RECEIVER = re.compile(r"([\d.]+)\s*([KMGT]?)bits/sec(?=.*receiver)")
_IPERF_RATE = re.compile(r"([\d.]+)\s*([KMGT]?)bits/sec")
_PING_RTT = re.compile(r"(?:rtt|round-trip)[^=]*=\s*[\d.]+/([\d.]+)/")
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def wan_from_iperf(report: str, *, latency=None, ping: str | None = None) -> WanLink:
    """A WAN link from an iperf3 report (text, or ``iperf3 --json``) and a latency.

    Bandwidth: the receiver's rate (the ``[SUM]`` line when several streams ran, i.e. the last
    receiver line; JSON ``end.sum_received.bits_per_second``; iperf2: the last rate printed). Latency, one way: ``latency`` if
    given, else half the average round trip of a ``ping`` summary line, else half of iperf3
    JSON's ``mean_rtt`` (microseconds, TCP info of the sender).
    """
    if not isinstance(report, str) or not report.strip():
        raise InvalidInputError(f"'report' must be the text of an iperf3 run: got {report!r}")
    rtt_s = None
    if report.lstrip().startswith("{"):
        try:
            end = json.loads(report)["end"]
            bits = float(end["sum_received"]["bits_per_second"])
            rtts = [s["sender"]["mean_rtt"] for s in end.get("streams", []) if "mean_rtt" in s.get("sender", {})]
        except (ValueError, KeyError, TypeError):
            raise InvalidInputError("'report' is iperf3 JSON without end.sum_received.bits_per_second") from None
        rtt_s = sum(rtts) / len(rtts) * 1e-6 if rtts else None
    else:
        # iperf3 marks the receiver's summary; iperf2 prints only rates, its summary last
        found = _IPERF_RECEIVER.findall(report) or _IPERF_RATE.findall(report)
        if not found:
            raise InvalidInputError("'report' has no iperf rate line ('... 9.41 Gbits/sec ... receiver')")
        value, prefix = found[-1]
        bits = float(value) * _PREFIX[prefix]
    if latency is not None:
        one_way = parse_duration(latency, "latency")
    elif ping is not None:
        match = _PING_RTT.search(ping)
        if not match:
            raise InvalidInputError("'ping' has no 'rtt min/avg/max/mdev = ...' summary line")
        one_way = float(match.group(1)) * 1e-3 / 2
    elif rtt_s is not None:
        one_way = rtt_s / 2
    else:
        raise InvalidInputError("'latency' is needed: the iperf3 text report has no round-trip time "
                                "(give latency='30ms' or a ping summary)")
    return WanLink(bits / 8, one_way, None, "iperf3 measurement")
