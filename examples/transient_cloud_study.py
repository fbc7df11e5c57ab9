"""Training CIFAR-10 CNNs with asynchronous parameter servers on transient (preemptible) cloud GPUs.

The setting of Li, Walls & Guo, "Characterizing and Modeling Distributed
Training with Transient Cloud GPU Servers" (ICDCS 2020): TensorFlow 1.10 with
Tensor2Tensor 1.9 trains ResNet-32 and Shake-Shake networks on Google Cloud
workers of one GPU each (K80, P100, V100) with asynchronous parameter servers on
CPU-only VMs. This script predicts the cluster's speed (global steps/s) as workers
and servers are added (``framework="tensorflow"``, ``ps_async=True``, GCP server VMs
of 4 vCPUs whose egress is capped at 2 Gb/s per vCPU), names what saturates, then
prices a whole run under revocations with ``perfmodel.analysis.transient.plan_training``
(bundled GCP prices; revocation rates are illustrative, see docs/transient.md).

Run it with::

    python examples/transient_cloud_study.py           # 10 000 Monte Carlo trials per scenario
    python examples/transient_cloud_study.py --quick   # 500 trials, a few seconds

Both write ``transient_cost_vs_mix.png`` (expected cost on preemptible vs
on-demand GPUs and the time to train, per cluster) and
``transient_time_distribution.png`` (the spread of the time to train of one
cluster under asynchronous training) in the current folder.
"""

from __future__ import annotations

import argparse

import pandas as pd

import perfmodel as pm
from perfmodel.analysis.transient import (
    checkpoint_time_s,
    default_checkpoint_bytes,
    load_revocation,
    plan_training,
    revocation_model,
    simulate_time,
)
from perfmodel.analysis.transient.prices import select_row
from perfmodel.hardware.cloud import server_vm
from perfmodel.report.transient_plots import plot_cost_vs_mix, plot_time_distribution

MODELS = ("resnet-cifar32", "shake-shake-big")
# T2T 1.9's CIFAR hparams: batch 128 per worker, fp32, momentum SGD; TensorFlow's asynchronous servers
STRATEGY = pm.Strategy(micro_batch=128, precision="fp32", optimizer="sgd", framework="tensorflow", ps_async=True)
GPUS = ("k80", "p100", "v100")
WORKERS = (1, 2, 4, 8)
SERVERS = (1, 2)
STEPS = 64_000  # an illustrative run: 64 000 global steps x 128 images = 164 epochs of CIFAR-10


def cluster_of(gpu: str, workers: int, servers: int):
    """``workers`` single-GPU VMs beside ``servers`` 4-vCPU GCP server VMs (n1: 8 Gb/s egress each)."""
    return pm.cluster(gpu, nodes=workers, servers=server_vm(vcpus=4, provider="gcp", count=servers))


def speed_table() -> pd.DataFrame:
    """Cluster steps/s, speed-up over one worker, the saturating worker count and the bottleneck."""
    rows = []
    for model in MODELS:
        for gpu in GPUS:
            for servers in SERVERS:
                solo = None
                for w in WORKERS:
                    p = pm.predict(model, cluster_of(gpu, w, servers), STRATEGY)
                    solo = solo or p.ps.updates_per_second
                    rows.append({"model": model, "gpu": gpu, "servers": servers, "workers": w,
                                 "steps_per_s": p.ps.updates_per_second, "speedup": p.ps.updates_per_second / solo,
                                 "worker_step_ms": 1e3 * p.ps.worker_step_s, "saturates_at": p.ps.saturating_workers,
                                 "staleness": p.ps.mean_staleness, "bottleneck": p.ps.bottleneck})
    return pd.DataFrame(rows)


MIXED = [("k80", 4), ("p100", 2), ("v100", 2)]


def mixed_table() -> pd.DataFrame:
    """4 K80 + 2 P100 + 2 V100 workers (each its own step time) with one and two server VMs."""
    rows = []
    for model in MODELS:
        for servers in SERVERS:
            r = pm.predict_mixed(model, MIXED, STRATEGY, servers=servers,
                                 server_node=server_vm(vcpus=4, provider="gcp")).iloc[0]
            rows.append({"model": model, "servers": servers, "steps_per_s": r.updates_per_second,
                         "efficiency": r.efficiency, "staleness": r.mean_staleness, "bottleneck": r.bottleneck})
    return pd.DataFrame(rows)


def cost_table(trials: int) -> pd.DataFrame:
    """Time and cost of STEPS global steps with 8 workers and 2 servers per GPU type, on-demand vs
    preemptible; plan_training takes the asynchronous cluster's steps/s from the prediction."""
    rows = []
    for model in MODELS:
        for gpu in GPUS:
            plan = plan_training(model, cluster_of(gpu, 8, 2), STRATEGY, STEPS, trials=trials,
                                 seed=0).set_index("scenario")
            od, spot = plan.loc["on-demand"], plan.loc["spot async (parameter server)"]
            rows.append({"model": model, "cluster": f"8x {gpu.upper()}", "on_demand_h": od.expected_time_s / 3600,
                         "on_demand_usd": od.expected_cost_usd, "spot_h": spot.expected_time_s / 3600,
                         "spot_p90_h": spot.p90_s / 3600, "spot_usd": spot.expected_cost_usd,
                         "revocations": spot.revocations_expected, "savings_pct": spot.savings_pct})
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 Monte Carlo trials instead of 10 000")
    args = parser.parse_args(argv)
    pd.set_option("display.width", 200)
    pd.set_option("display.max_colwidth", 90)
    pd.set_option("display.float_format", lambda x: f"{x:,.2f}")
    speeds = speed_table()
    print(speeds.to_string(index=False))
    # What the table shows (each number is printed above; the model is docs/parameter-servers.md):
    # * Below the saturating worker count the cluster's steps/s is the sum of its workers' rates,
    #   so the speed-up from 1 to n workers is n: asynchronous workers never wait for each other.
    # * One 4-vCPU GCP server sends each worker its parameters at 8 Gb/s: 7.4 MB for ResNet-32,
    #   105 MB for Shake-Shake-big. Past ``saturates_at`` workers the server's NIC binds and more
    #   workers add only staleness (about workers - 1 updates between a read and a write).
    # * T2T 1.9 places variables round-robin in creation order (replica_device_setter's default).
    #   ResNet-32 creates 5 variables per conv + batch norm (kernel; gamma, beta, moving mean and
    #   variance), so a second server takes half the bytes and nearly doubles the ceiling.
    #   Shake-Shake's convolutions have a bias: 6 variables per conv + batch norm, so with two
    #   servers every kernel lands on the same one and the second server buys nothing (greedy
    #   placement, Strategy(ps_placement="greedy"), would split them).
    print("\n4 K80 + 2 P100 + 2 V100 workers, asynchronous (each worker at its own pace):\n")
    print(mixed_table().to_string(index=False))
    # Asynchronous workers never wait for the slowest: below saturation the mixed cluster's rate is
    # the sum of its workers' (efficiency 0.89-0.94 against their solo steps: their push and pull), and
    # the K80s, reading the oldest parameters, raise the mean staleness above workers - 1.
    trials = 500 if args.quick else 10_000
    costs = cost_table(trials)
    print(f"\n{STEPS:,} global steps, 8 workers + 2 servers, GCP prices (GPU only), {trials:,} trials:\n")
    print(costs.to_string(index=False))
    write_plots(costs, trials)
    return 0


def write_plots(costs: pd.DataFrame, trials: int) -> None:
    """Cost and time per cluster for the first model; the time-to-train spread of its P100 cluster."""
    first = costs[costs.model == MODELS[0]]
    mix = first.rename(columns={"cluster": "mix"}).assign(
        expected_cost_usd=first.spot_usd, on_demand_cost_usd=first.on_demand_usd,
        expected_time_s=first.spot_h * 3600, on_demand_time_s=first.on_demand_h * 3600)
    path = plot_cost_vs_mix(mix, "transient_cost_vs_mix.png", label="mix",
                            title=f"{MODELS[0]}, {STEPS:,} steps, async parameter servers, preemptible vs on-demand")
    print(f"\nwrote {path}")
    r = first.set_index("cluster").loc["8x P100"]
    row = select_row(load_revocation(), "p100", "gcp", None, what="revocation")
    delta = checkpoint_time_s(default_checkpoint_bytes(pm.preset(MODELS[0])), row["storage_bw_bytes_per_s"])
    down = row["replacement_wait_s"] + row["restart_s"] + delta  # wait + restart + restore
    times = simulate_time(r.on_demand_h * 3600, revocation=[revocation_model(row)] * 8, workers=8,
                          checkpoint_s=delta, restart_s=down, trials=trials, seed=0, mode="async")
    path = plot_time_distribution(times, "transient_time_distribution.png", on_demand_s=r.on_demand_h * 3600,
                                  title=f"8x P100, {MODELS[0]}: async, preemptible ({trials:,} trials)")
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
