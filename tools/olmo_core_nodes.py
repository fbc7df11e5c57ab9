"""What-if: OLMo-core's check rows priced on more nodes, as its code would run them there.

    python -m tools.olmo_core_nodes                  # 1, 2, 4 and 8 nodes of 8 H100
    python -m tools.olmo_core_nodes --nodes 1 16     # any node counts

The rows (``olmo-core-*`` of ``perfmodel/data/published_check_runs.csv``) assume one node of 8 H100, the
scripts' launch default; the README names no GPU count. On more than one node OLMo-core (e27ba74
``src/olmo_core/internal/experiment.py``) builds ``init_hybrid_shard_mesh()``: FSDP2 shards inside a node
and replicates across nodes, and every micro-batch all-reduces its fp32 gradient shard across them. This
prices each row so (``fsdp="hybrid"``, dp = 8 × nodes) at the same tokens/s per GPU. Check data: nothing
is fitted, and the rows keep their one-node assumption (docs/validation.md, "OLMo-core on 8 H100").
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from perfmodel.core.entry import run_command
from perfmodel.hardware import cluster
from perfmodel.predict import predict
from perfmodel.validate.published import read_published_checks

PREFIX = "olmo-core-"
ROW_NODES = 1  # what the rows assume (the scripts' BeakerLaunchConfig default)


def errors(nodes: int) -> dict[str, float]:
    """Row name -> measured / predicted step − 1 of each OLMo-core row on ``nodes`` nodes of 8 H100."""
    out = {}
    for case in read_published_checks():
        if not case.label.startswith(PREFIX):
            continue
        s = replace(case.strategy, dp=8 * nodes, fsdp="hybrid" if nodes > 1 else "full")
        p = predict(case.model, cluster(case.cluster.node.name, nodes=nodes), s)
        out[case.label] = case.measured * ROW_NODES / nodes / p.step_time - 1.0  # same tokens/s per GPU
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8], help="node counts to price")
    args = parser.parse_args(argv)
    for n in args.nodes:
        if n < 1:
            parser.error(f"--nodes takes positive node counts: got {n}")
    print("nodes  median error   range")
    for n in args.nodes:
        e = list(errors(n).values())
        print(f"{n:5d}  {statistics.median(e):+12.1%}   {min(e):+.1%} … {max(e):+.1%}")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
