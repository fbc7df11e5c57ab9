"""One run over two datacenters: synchronous data parallelism, DiLoCo and Streaming DiLoCo.

GPT-2 XL on two sites of 4 x DGX H100 (32 GPUs each) joined by a 10 Gb/s, 35 ms WAN: the step
time, compute utilisation and synchronisation time of each algorithm, the WAN bandwidth DiLoCo
needs for 95 % utilisation, the inner steps that reach it at 10 Gb/s, and the cost over both
sites (docs/datacenters.md has the table this prints).

Run it with::

    python examples/datacenters.py           # the worked example of docs/datacenters.md
    python examples/datacenters.py --quick   # GPT-2 small on one node per site, a few seconds
"""

from __future__ import annotations

import argparse

import perfmodel as pm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small model on one node per site")
    args = parser.parse_args()
    model = pm.preset("gpt2-small" if args.quick else "gpt2-xl")
    site = pm.cluster("dgx-h100", nodes=1 if args.quick else 4)
    sites = pm.multi_cluster([site, site], wan=pm.wan_link("10Gb/s", "35ms"), names=["us-east", "eu-west"])
    inner = pm.Strategy(dp=site.n_gpus, micro_batch=8)
    print(f"{model.name} on {sites}; one site alone: {pm.predict(model, site, inner).step_time * 1e3:.1f} ms/step")
    runs = {
        "synchronous DP, 25 MB buckets": {},
        "synchronous DP, 1 GiB buckets": {"strategy": inner.replace(bucket_mib=1024)},
        "DiLoCo H=100, bf16": {"sync": "diloco", "inner_steps": 100, "outer_precision": "bf16"},
        "DiLoCo H=100, int8": {"sync": "diloco", "inner_steps": 100, "outer_precision": "int8"},
        "Streaming DiLoCo H=100, F=16, tau=1, fp4": {"sync": "diloco", "inner_steps": 100,
                                                     "outer_precision": "fp4", "streaming_fragments": 16,
                                                     "overlap_steps": 1},
    }
    print(f"{'algorithm':42s} {'step ms':>9s} {'CU':>7s} {'sync s':>8s} {'WAN GB':>7s}")
    for label, kw in runs.items():
        p = pm.predict_multisite(model, sites, kw.pop("strategy", inner), **kw)
        print(f"{label:42s} {p.step_time * 1e3:9.1f} {p.compute_utilization:7.1%} {p.outer_sync_s:8.3f} "
              f"{p.wan_bytes_per_sync / 1e9:7.2f}")
    diloco = pm.MultiSiteStrategy(inner, sync="diloco", inner_steps=100, outer_precision="bf16")
    bw = pm.required_wan_bandwidth(model, sites, diloco, target=0.95)
    print(f"DiLoCo bf16 reaches 95% at {bw * 8 / 1e9:.1f} Gb/s, or at 10 Gb/s with "
          f"H={pm.inner_steps_for(model, sites, diloco, target=0.95)}")
    plan = pm.plan_multisite(model, sites, diloco, steps=50_000, trials=200 if args.quick else 2000)
    total = plan[plan["site"] == "all sites"].set_index("scenario")
    print("50 000 steps, both sites:",
          ", ".join(f"{k}: {v.expected_time_s / 3600:.1f} h, ${v.expected_cost_usd:,.0f}" for k, v in total.iterrows()))


if __name__ == "__main__":
    main()
