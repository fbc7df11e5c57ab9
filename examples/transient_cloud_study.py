"""Training a CNN with parameter servers on transient (preemptible) cloud GPUs, mixed types.

The setting of Li, Walls & Guo, "Characterizing and Modeling Distributed
Training with Transient Cloud GPU Servers" (ICDCS 2020): a ResNet-style CNN
trained synchronously with parameter servers on Google Cloud workers of one
GPU each (K80, P100, V100), the workers preemptible. This script predicts the
step time of homogeneous and mixed clusters with ``perfmodel.predict_mixed``,
then the time and cost of a whole run under revocations with
``perfmodel.analysis.transient.plan_training`` (bundled GCP prices; revocation rates
are illustrative, see docs/transient.md).

Run it with::

    python examples/transient_cloud_study.py           # 10 000 Monte Carlo trials per scenario
    python examples/transient_cloud_study.py --quick   # 500 trials, a few seconds

Both write ``transient_cost_vs_mix.png`` (expected cost on preemptible vs
on-demand GPUs and the time to train, per cluster mix) and
``transient_time_distribution.png`` (the spread of the time to train of the
mixed cluster under synchronous training) in the current folder.
"""

from __future__ import annotations

import argparse

import pandas as pd

import perfmodel as pm
from perfmodel.report.transient_plots import plot_time_distribution  # noqa: E402
from perfmodel.analysis.transient import (
    checkpoint_time_s,
    default_checkpoint_bytes,
    load_revocation,
    plan_training,
    revocation_model,
    simulate_time,
)
from perfmodel.report.transient_plots import plot_cost_vs_mix
from perfmodel.analysis.transient.prices import select_row

# ResNet-50 (25.6 M parameters) at 32 images per worker, fp32: the K80 has no bf16 support.
MODEL = "resnet50"
STRATEGY = pm.Strategy(micro_batch=32, precision="fp32", optimizer="sgd")
STEPS = 20_000  # an illustrative run length: 20 000 steps x 32 images x 8 workers = 5.1 M images
CLUSTERS = {
    "8x K80": [("k80", 8)],
    "8x P100": [("p100", 8)],
    "8x V100": [("v100", 8)],
    "4 K80 + 2 P100 + 2 V100": [("k80", 4), ("p100", 2), ("v100", 2)],
    "4 P100 + 4 V100": [("p100", 4), ("v100", 4)],
}
COMMS = {"1 PS, 10 Gb/s": {"servers": 1}, "4 PS, 10 Gb/s": {"servers": 4}, "ring all-reduce": {"servers": 0}}


def speed_table(model) -> pd.DataFrame:
    """Step time and throughput of every cluster, gradient exchange and batch-split policy."""
    rows = []
    for name, workers in CLUSTERS.items():
        for comm, kw in COMMS.items():
            out = pm.predict_mixed(model, workers, STRATEGY, **kw)
            for _, r in out.iterrows():
                rows.append({"cluster": name, "exchange": comm, "policy": r.policy,
                             "step_ms": 1e3 * r.step_time_s, "compute_ms": 1e3 * r.compute_s,
                             "comm_ms": 1e3 * r.comm_s, "images_per_s": r.samples_per_second,
                             "efficiency": r.efficiency, "slowest": r.slowest})
    return pd.DataFrame(rows)


def cost_table(model, speeds: pd.DataFrame, trials: int) -> pd.DataFrame:
    """Time and cost of STEPS steps on each cluster (4 servers, best policy), on-demand vs preemptible."""
    rows = []
    best = speeds[speeds.exchange == "4 PS, 10 Gb/s"].sort_values("step_ms").groupby("cluster").head(1)
    for _, r in best.iterrows():
        gpus = [g for g, n in CLUSTERS[r.cluster] for _ in range(n)]
        # the mixed cluster's step time is passed explicitly: plan_training itself prices each
        # worker's revocations and dollars by its own GPU type, but cannot predict a mixed step
        plan = plan_training(model, {"worker_gpus": gpus, "gpus_per_node": 1}, STRATEGY, STEPS,
                             step_time_s=r.step_ms / 1e3, trials=trials, seed=0).set_index("scenario")
        od, spot = plan.loc["on-demand"], plan.loc["spot async (parameter server)"]
        rows.append({"cluster": r.cluster, "policy": r.policy, "step_ms": r.step_ms,
                     "sync_interval_s": plan.loc["spot sync, Daly interval"].interval_s,
                     "on_demand_h": od.expected_time_s / 3600, "on_demand_usd": od.expected_cost_usd,
                     "spot_h": spot.expected_time_s / 3600, "spot_p90_h": spot.p90_s / 3600,
                     "spot_usd": spot.expected_cost_usd, "revocations": spot.revocations_expected,
                     "savings_pct": spot.savings_pct})
    return pd.DataFrame(rows).sort_values("spot_usd")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="500 Monte Carlo trials instead of 10 000")
    args = parser.parse_args(argv)
    pd.set_option("display.width", 160)
    pd.set_option("display.float_format", lambda x: f"{x:,.2f}")
    model = pm.preset(MODEL)

    speeds = speed_table(model)
    print(f"{MODEL}: {model.params / 1e6:.1f} M parameters, {STRATEGY.micro_batch} images per worker, "
          f"{STRATEGY.precision}\n")
    print(speeds.to_string(index=False))
    # What the table shows:
    # * One parameter server on a 10 Gb/s NIC takes in 8 workers x 102 MB of fp32 gradients and
    #   sends as much weight back per step: 2 x 8 x 102 MB / 1.25 GB/s = 1.31 s, three to ten
    #   times any GPU's compute. The GPU type hardly matters then: the server NIC is the
    #   bottleneck (an all-V100 cluster is only 22% faster than an all-K80 one).
    # * Four servers divide that by four (327 ms); the servers still bind, since
    #   8 / (4 x 1.25 GB/s) > 1 / 3.125 GB/s (a worker's 25 Gb/s NIC binds from 20 servers on).
    # * With equal batches a mixed cluster runs at the pace of its K80s (446 ms of compute):
    #   adding P100s and V100s to K80s buys nothing. Splitting the batch in proportion to each
    #   worker's speed gives the K80s 16 images and the V100s ~59, so compute falls to 230 ms.
    # * A ring all-reduce needs no servers and moves 2(n-1)/n x 102 MB through each worker's
    #   25 Gb/s NIC: 57 ms, so compute dominates and the proportional split nearly doubles the
    #   mixed cluster's throughput (508 -> 890 images/s, 79% of its workers' solo sum).

    trials = 500 if args.quick else 10_000
    costs = cost_table(model, speeds, trials)
    print(f"\n{STEPS:,} steps with 4 parameter servers, GCP us-central1 prices "
          f"(GPU only, the servers' CPU VMs not included), {trials:,} trials:\n")
    print(costs.drop(columns="sync_interval_s").to_string(index=False))
    # What the table shows:
    # * Preemptible GPUs cost a fraction of on-demand in the bundled prices (K80 $0.038 vs $0.45,
    #   V100 $0.74 vs $2.48 per GPU-hour). With asynchronous parameter-server training a revoked
    #   worker only leaves the others to go on without it until its replacement arrives, so a
    #   spot run takes about 1-2% longer than on-demand and saves 70-90% of the GPU bill.
    # * Because the 10 Gb/s servers bound the step, faster GPUs raise the price per hour much
    #   more than they shorten the run: 8 V100s finish 1.8 h sooner than 8 K80s at 11x the
    #   spot cost. The mixed cluster sits between: split by speed, its step is close to the
    #   all-P100 one at a lower price. Mixed clusters help when cheap slow GPUs are on hand and
    #   the batch is split by speed; with equal batches they cost more than all-K80 for no gain.
    write_plots(model, costs, trials)
    return 0


def write_plots(model, costs: pd.DataFrame, trials: int) -> None:
    """Cost and time per cluster mix; the time-to-train spread of the mixed cluster (sync, Daly interval)."""
    mix = costs.rename(columns={"cluster": "mix"}).assign(
        expected_cost_usd=costs.spot_usd, on_demand_cost_usd=costs.on_demand_usd,
        expected_time_s=costs.spot_h * 3600, on_demand_time_s=costs.on_demand_h * 3600)
    path = plot_cost_vs_mix(mix, "transient_cost_vs_mix.png", label="mix",
                            title=f"{MODEL}, {STEPS:,} steps, 4 parameter servers, preemptible (async) vs on-demand")
    print(f"\nwrote {path}")
    name = "4 K80 + 2 P100 + 2 V100"
    r = costs.set_index("cluster").loc[name]
    table = load_revocation()
    rows = [select_row(table, g, "gcp", None, what="revocation") for g, n in CLUSTERS[name] for _ in range(n)]
    delta = checkpoint_time_s(default_checkpoint_bytes(model), rows[0]["storage_bw_bytes_per_s"])
    down = rows[0]["replacement_wait_s"] + rows[0]["restart_s"] + delta  # wait + restart + restore
    times = simulate_time(r.on_demand_h * 3600, revocation=[revocation_model(x) for x in rows],
                          workers=len(rows), checkpoint_s=delta, restart_s=down,
                          interval_s=r.sync_interval_s, trials=trials, seed=0, mode="sync")
    path = plot_time_distribution(times, "transient_time_distribution.png", on_demand_s=r.on_demand_h * 3600,
                                  title=f"{name}: sync, preemptible ({trials:,} trials)")
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
