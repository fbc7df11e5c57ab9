"""Scaling Llama-3-70B from 8 to 1,024 H100s (DGX H100 nodes, 8 GPUs and 8 x 400 Gb/s NICs each).

Run:
    python examples/scaling_llama3_70b.py             # 8 ... 1,024 GPUs; writes scaling_llama3_70b.png
    python examples/scaling_llama3_70b.py --quick     # 8 ... 32 GPUs (what the test suite runs)
    python examples/scaling_llama3_70b.py --out DIR   # put the plot in DIR (default: the current folder)

Part 1 sweeps one recipe over node counts: tensor parallelism inside each node
(TP=8 with sequence parallelism) and ZeRO-3 sharding across nodes, micro-batch 1,
4 micro-batches per data-parallel rank (weak scaling: at 1,024 GPUs the global
batch is 512 sequences of 8,192 tokens, 4M tokens). On one or two nodes the
model's 16 bytes per parameter do not fit; the table and the plot say so.

Part 2 asks ``pm.search`` for the fastest configuration at each size for a fixed
global batch of 512 sequences (strong scaling), with every TP/PP/DP split,
micro-batch, ZeRO stage and recomputation policy on the table.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import perfmodel as pm
from perfmodel.explore.output import format_table
from perfmodel.report.plots import save_figure, sweep_figure


def recipe_sweep(model, nodes: list[int], out: Path) -> None:
    cluster = pm.cluster("dgx-h100", nodes=nodes[0])
    recipe = pm.Strategy(dp=cluster.n_gpus // 8, tp=8, micro_batch=1, global_batch=4 * cluster.n_gpus // 8,
                         zero=3, sequence_parallel=True)
    df = pm.sweep(model, over="nodes", values=nodes, cluster=cluster, strategy=recipe)
    print("Part 1: TP=8 inside a node, ZeRO-3 across nodes (weak scaling)\n")
    print(format_table(df, ("gpus", "dp", "global_batch", "step_time", "tokens_per_second", "scaling_efficiency",
                            "mfu", "peak_memory", "fits", "bottleneck"), best_column=None))
    fig = sweep_figure(df, title="Llama-3-70B on DGX H100: TP=8 + ZeRO-3, weak scaling")
    print(f"\nwrote {save_figure(fig, out / 'scaling_llama3_70b.png')}\n")


def best_per_size(model, nodes: list[int], global_batch: int) -> None:
    print(f"Part 2: the fastest configuration that fits, global batch {global_batch} (strong scaling)\n")
    print(f"{'GPUs':>6}  {'searched':>8}  {'fit':>6}  best")
    for n in nodes:
        cluster = pm.cluster("dgx-h100", nodes=n)
        try:
            top = pm.search(model, cluster, global_batch, top_k=1)
        except pm.InfeasibleError as err:
            print(f"{cluster.n_gpus:>6,}  nothing fits: {str(err)[:110]}...")
            continue
        b, a = top.iloc[0], top.attrs
        print(f"{cluster.n_gpus:>6,}  {a['evaluated']:>8,}  {a['feasible']:>6,}  "
              f"dp={b.dp} tp={b.tp} pp={b.pp} v={b.virtual_stages} mb={b.micro_batch} zero={b.zero} "
              f"recompute={b.recompute}{' sp' if b.sequence_parallel else ''}: {b.step_time:.2f} s/step, "
              f"{b.tokens_per_second:,.0f} tokens/s, MFU {b.mfu:.1%}, {b.peak_memory / 2**30:.0f} GiB/GPU")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Scale Llama-3-70B from 8 to 1,024 H100s.")
    parser.add_argument("--quick", action="store_true", help="8 to 32 GPUs only")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for the plot")
    args = parser.parse_args(argv)
    nodes = [1, 2, 4] if args.quick else [1, 2, 4, 8, 16, 32, 64, 128]
    args.out.mkdir(parents=True, exist_ok=True)
    model = pm.preset("llama-3-70b")
    recipe_sweep(model, nodes, args.out)
    best_per_size(model, nodes, global_batch=512)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
