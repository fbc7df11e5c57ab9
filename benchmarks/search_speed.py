"""How fast ``pm.search`` prices the parallel space: configurations per second and wall time.

Run:  python benchmarks/search_speed.py [--repeat 7] [--quick]

Cases:
* gpt-1t: the 1-trillion-parameter GPT of Narayanan et al. 2021, Table 1 (128
  layers, hidden 25600, 160 heads, seq 2048, vocab 51200) on 3,072 A100s
  (384 x dgx-a100-80gb), global batch 3072, default search options.
* wide: Llama-3-70B on 1,024 H100s (128 x dgx-h100), global batch 1536, a
  wider space (micro-batch up to 32, virtual stages up to 16, tensor groups
  over up to 2 nodes, bf16 and fp8 precision): the throughput case.
* moe: Mixtral 8x7B on 64 H100s (8 x dgx-h100), global batch 512, default search
  options: every stack, expert-parallel sizes 1-8, and under Megatron-LM its
  whole-expert grid and grouped expert GEMMs (docs/explore.md).

Each case runs once to warm up (profile loading, imports), then ``--repeat``
times; the median is printed. Configurations counted are those priced (that
passed the divisibility and batch rules), for all precision x recompute
combinations. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import perfmodel as pm

GPT_1T = {"layers": 128, "hidden": 25600, "heads": 160, "seq": 2048, "vocab": 51200, "name": "gpt-1t"}


def cases(quick: bool):
    yield ("gpt-1t", pm.transformer(**GPT_1T), pm.cluster("dgx-a100-80gb", nodes=384 if not quick else 96),
           3072, {})
    yield ("wide", pm.preset("llama-3-70b"), pm.cluster("dgx-h100", nodes=128 if not quick else 8),
           1536 if not quick else 128,
           {"max_micro_batch": 32, "max_virtual_stages": 16, "max_tp_nodes": 2,
            "precision": ("bf16-mixed", "fp8-mixed")})
    yield ("moe", pm.preset("mixtral-8x7b"), pm.cluster("dgx-h100", nodes=8 if not quick else 2),
           512 if not quick else 64, {})


def measure(model, cluster, batch, options, repeat: int) -> dict:
    t0 = time.perf_counter()
    df = pm.search(model, cluster, batch, **options)
    cold = time.perf_counter() - t0
    walls = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        df = pm.search(model, cluster, batch, **options)
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
    n = df.attrs["evaluated"]
    return {"configurations": n, "feasible": df.attrs["feasible"], "cold_s": cold, "wall_s": wall,
            "per_s": n / wall, "best": df.iloc[0]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="small clusters, 2 repeats (for tests)")
    args = parser.parse_args(argv)
    repeat = 2 if args.quick else args.repeat
    print(f"{os.cpu_count()} CPU cores visible; median of {repeat} runs after one warm-up\n")
    print(f"{'case':<8} {'GPUs':>6} {'configs':>9} {'fit':>7} {'cold':>8} {'median':>8} {'configs/s':>11}  best")
    for name, model, cluster, batch, options in cases(args.quick):
        r = measure(model, cluster, batch, options, repeat)
        b = r["best"]
        best = (f"dp={b.dp} tp={b.tp} pp={b.pp} v={b.virtual_stages} mb={b.micro_batch} zero={b.zero} "
                f"{b.recompute} {b.precision}: {b.tokens_per_second:,.0f} tok/s, MFU {b.mfu:.1%}")
        print(f"{name:<8} {cluster.n_gpus:>6,} {r['configurations']:>9,} {r['feasible']:>7,} "
              f"{r['cold_s'] * 1e3:>6.0f}ms {r['wall_s'] * 1e3:>6.0f}ms {r['per_s']:>11,.0f}  {best}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
