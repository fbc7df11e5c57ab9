"""Data parallel vs FSDP vs 3D parallel for Llama-2-13B on 64 A100s (8 x DGX A100 80GB).

Run:
    python examples/dp_fsdp_3d_13b.py             # compare 8 recipes, search the best; writes dp_fsdp_3d_13b.png
    python examples/dp_fsdp_3d_13b.py --quick     # 4 recipes, top 3 (what the test suite runs)
    python examples/dp_fsdp_3d_13b.py --out DIR   # put the plot in DIR (default: the current folder)

One global batch of 512 sequences of 4,096 tokens (2M tokens per step) is
trained eight ways: plain DDP (every GPU holds weights, gradients and AdamW
states, 16 bytes per parameter: 208 GB for 13B, so it cannot fit in 80 GB);
ZeRO-1 (optimizer states sharded, as Megatron-LM's distributed optimizer);
FSDP full and hybrid sharding (ZeRO-3); FSDP with full recomputation and
larger micro-batches; Megatron tensor parallelism inside a node; and two 3D
layouts with pipelines (one interleaved). Then ``pm.search`` ranks every
valid configuration for the same batch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import perfmodel as pm
from perfmodel.explore.output import format_table
from perfmodel.report.plots import compare_figure, save_figure

RECIPES = {
    "DDP": "dp=64,mb=1",
    "ZeRO-1": "dp=64,mb=1,zero=1",
    "FSDP": "dp=64,mb=1,fsdp=full",
    "FSDP hybrid": "dp=64,mb=1,fsdp=hybrid",
    "FSDP+recompute": "dp=64,mb=4,fsdp=full,recompute=full",
    "TP=8": "tp=8,mb=1,sp=true",
    "TP=4 PP=2": "tp=4,pp=2,mb=1,sp=true,zero=1",
    "TP=2 PP=4 (v=5)": "tp=2,pp=4,v=5,mb=1,sp=true,zero=1",
}
QUICK = ("DDP", "FSDP", "TP=8", "TP=4 PP=2")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="DP vs FSDP vs 3D parallelism for Llama-2-13B on 64 A100s.")
    parser.add_argument("--quick", action="store_true", help="4 recipes and the top 3 configurations")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for the plot")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = pm.preset("llama-2-13b")
    cluster = pm.cluster("dgx-a100-80gb", nodes=8)
    recipes = {k: v for k, v in RECIPES.items() if not args.quick or k in QUICK}

    df = pm.compare(model, cluster, recipes, defaults={"global_batch": 512})
    print(f"Llama-2-13B on {cluster.name} ({cluster.n_gpus} GPUs), global batch 512 x 4,096 tokens; "
          "* = fastest that fits\n")
    print(format_table(df, ("label", "micro_batches", "step_time", "tokens_per_second", "tflops_per_gpu", "mfu",
                            "peak_memory", "fits", "bottleneck")))
    fig = compare_figure(df, title="Llama-2-13B on 64 A100 80GB: DP vs FSDP vs 3D")
    print(f"\nwrote {save_figure(fig, args.out / 'dp_fsdp_3d_13b.png')}\n")

    top = pm.search(model, cluster, 512, top_k=3 if args.quick else 8)
    a = top.attrs
    print(f"search: {a['evaluated']:,} configurations priced in {a['seconds'] * 1e3:.0f} ms, {a['feasible']:,} fit "
          f"(rejected: {', '.join(f'{k} {v:,}' for k, v in a['rejected'].items())})\n")
    top.insert(0, "rank", range(1, len(top) + 1))
    print(format_table(top, ("rank", "dp", "tp", "pp", "virtual_stages", "micro_batch", "zero", "recompute",
                             "sequence_parallel", "step_time", "tokens_per_second", "mfu", "peak_memory",
                             "bottleneck"), best_column=None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
