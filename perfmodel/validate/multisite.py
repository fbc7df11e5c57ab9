"""Check the cross-site model against Streaming DiLoCo's simulated bandwidth table.

    python -m perfmodel.validate.multisite

Douillard et al. 2025 (arXiv:2501.18512), Table 4 (``perfmodel/data/streaming_diloco_table4.csv``):
the Gbit/s each method needs to reach a compute utilisation of 50 ... 99 % for 1B, 10B and
100B models whose pure-compute step takes 0.1, 0.8 and 4.9 s; H = 100 inner steps, fragments
of 3 layers (8, 16, 36 fragments), overlap τ = 1 step where overlapped, FP4 where named.
The table reports the smallest bandwidth of its grid (steps of about x1.2) that reaches each
target. The same pricing functions as :func:`perfmodel.predict_multisite` answer it here
(``diloco_period`` over ``wan_time``), under the simulator's assumptions (its §3.1 and the
authors' online simulator): two replicas, no latency, each sync overlapping the backward pass
that produces it, backward = 2/3 of a step (forward, backward w.r.t. activations and w.r.t.
parameters per layer). Not stated there: the wire format of the unquantised methods, taken as
bf16 (2 bytes per parameter); fp32 doubles every bandwidth. Data-parallel is DiLoCo with H = 1.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import pandas as pd
from perfmodel.core.entry import no_options, run_command
from perfmodel.core.lazy import scipy_optimize

from perfmodel.analysis.multisite import MultiSiteStrategy, diloco_period
from perfmodel.costs.wan import wan_time
from perfmodel.hardware import cluster
from perfmodel.hardware.sites import WanLink, multi_cluster, wan_link

TARGETS = (0.5, 0.8, 0.9, 0.95, 0.99)
BACKWARD_SHARE = 2.0 / 3.0
FRAGMENT_LAYERS = 3


def _table() -> pd.DataFrame:
    return pd.read_csv(Path(__file__).resolve().parent.parent / "data" / "streaming_diloco_table4.csv")


def _strategy(method: str, layers: int):
    if method == "data-parallel":
        return MultiSiteStrategy(sync="diloco", inner_steps=1, overlap_backward=True), 2.0
    fragments = layers // FRAGMENT_LAYERS if method.startswith("streaming") else 1
    overlap = 1 if "overlap" in method else 0
    wire = 0.5 if method.endswith("fp4") else 2.0
    return MultiSiteStrategy(sync="diloco", inner_steps=100, streaming_fragments=fragments,
                             overlap_steps=overlap, overlap_backward=True), wire


@cache
def _two_sites():
    """Two replicas; their own hardware does not enter (the step time is given)."""
    one = cluster("h100")
    return multi_cluster([one, one], wan=wan_link("1Gb/s", 0.0))


def utilisation(params: float, step_s: float, strategy, wire_bytes: float, bw_bytes_per_s: float) -> float:
    """Compute utilisation of two replicas joined by a WAN of ``bw_bytes_per_s``, no latency."""
    sites = _two_sites().with_wan(WanLink(bw_bytes_per_s, 0.0, None, "simulated WAN"))
    sync = float(wan_time(sites, "all_reduce", params * wire_bytes / strategy.streaming_fragments))
    period, _ = diloco_period(step_s, sync, strategy, BACKWARD_SHARE * step_s)
    return strategy.inner_steps * step_s / period


def _required_gbps(params, step_s, strategy, wire_bytes, target) -> float:
    def gap(log_bw):
        return utilisation(params, step_s, strategy, wire_bytes, math.exp(log_bw)) - target

    return math.exp(scipy_optimize.brentq(gap, math.log(1e3), math.log(1e15))) * 8 / 1e9


def compare(wire_bytes: float | None = None) -> pd.DataFrame:
    """One row per table cell: the paper's Gbit/s, ours, and our utilisation at the paper's Gbit/s."""
    rows = []
    for _, r in _table().iterrows():
        strategy, wire = _strategy(r["method"], int(r["layers"]))
        wire = wire if wire_bytes is None or r["method"].endswith("fp4") else wire_bytes
        for target in TARGETS:
            paper = float(r[f"cu_{round(target * 100)}"])

            ours = _required_gbps(r["params"], r["step_s"], strategy, wire, target)
            at_paper = utilisation(r["params"], r["step_s"], strategy, wire, paper * 1e9 / 8)
            rows.append({"model": r["model"], "method": r["method"], "target_cu": target,
                         "paper_gbps": paper, "ours_gbps": ours, "ratio": ours / paper,
                         "ours_cu_at_paper_gbps": at_paper})
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    no_options(__doc__, argv)
    table = compare()
    pd.set_option("display.width", 140)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    diloco = table[table["method"] != "data-parallel"]
    for name, part in (("DiLoCo variants", diloco), ("all", table)):
        err = (part["ours_cu_at_paper_gbps"] - part["target_cu"]) * 100
        print(f"{name}: bandwidth ratio median {part['ratio'].median():.2f} "
              f"[{part['ratio'].min():.2f}, {part['ratio'].max():.2f}]; utilisation at the paper's "
              f"bandwidth minus target: median {err.median():+.1f} points, worst {err.min():+.1f}")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
