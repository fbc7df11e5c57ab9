"""``perfmodel plan``: time and cost of a training run on transient (spot) servers.

    perfmodel plan --model gpt2-small --gpu a100 --nodes 4 --steps 100000
    perfmodel plan --model resnet50 --precision fp32 --optimizer sgd --micro-batch 32 \\
        --steps 20000 --workers k80:4,p100:2,v100:2 --servers 4 --out plan.csv --plot plan.png
"""

from __future__ import annotations

from perfmodel.cli import (NONNEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT, add_model_args, add_strategy_args,
                           load_cluster, load_model, strategy_from_args)
from perfmodel.core.errors import InvalidInputError
from perfmodel.analysis.hetero import predict_mixed
from perfmodel.report.transient_plots import plot_cost_vs_mix
from perfmodel.analysis.transient.plan import plan_training

TABLE_COLUMNS = ["scenario", "interval_s", "expected_time_s", "expected_time_low_s", "expected_time_high_s", "p50_s",
                 "p90_s", "p99_s", "expected_cost_usd", "expected_cost_low_usd", "expected_cost_high_usd",
                 "on_demand_cost_usd", "savings_pct", "revocations_expected"]


def parse_workers(text: str) -> list[tuple[str, int]]:
    """``"k80:4,p100:2"`` -> ``[("k80", 4), ("p100", 2)]``."""
    out = []
    for item in text.split(","):
        gpu, sep, count = item.strip().partition(":")
        count = count.strip()  # ASCII digits only: str.isdigit also takes '²' and '٣'
        if not sep or not gpu or not (count.isascii() and count.isdigit()) or int(count) < 1:
            raise InvalidInputError(f"'--workers' must be GPU:COUNT pairs separated by commas "
                                    f"(e.g. k80:4,v100:2): got {item.strip()!r} in {text!r}")
        out.append((gpu.strip(), int(count)))
    return out


def add_parsers(subparsers) -> None:
    p = subparsers.add_parser("plan", help="time and cost of a run on spot vs on-demand servers")
    add_model_args(p)
    add_strategy_args(p)
    p.add_argument("--steps", type=POSITIVE_INT, required=True, help="training steps")
    p.add_argument("--provider", default=None, help="price / revocation table provider (default gcp)")
    p.add_argument("--region", default=None, help="region (default: the provider's first listed)")
    p.add_argument("--interval-s", type=POSITIVE_FLOAT, default=None, help="also simulate this checkpoint interval (s)")
    p.add_argument("--trials", type=POSITIVE_INT, default=10000, help="Monte Carlo trials per scenario")
    p.add_argument("--seed", type=NONNEGATIVE_INT, default=0)
    p.add_argument("--workers", default=None, metavar="GPU:N,...",
                   help="mixed single-GPU workers, e.g. k80:4,p100:2,v100:2 (step time from predict_mixed)")
    p.add_argument("--servers", type=NONNEGATIVE_INT, default=0, help="parameter servers for --workers (0: ring all-reduce)")
    p.add_argument("--out", default=None, metavar="FILE.csv", help="write the whole table as CSV")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="chart of cost and time per scenario")
    p.add_argument("--level", type=POSITIVE_FLOAT, default=0.9,
                   help="coverage level of the step interval the time and cost bounds scale by (default 0.9)")
    p.set_defaults(func=cmd_plan)


def _mixed(model, args, strategy):
    """(cluster description, step time, its interval, note) of a mixed cluster: the faster batch-split policy."""
    workers = parse_workers(args.workers)
    out = predict_mixed(model, workers, strategy, servers=args.servers, profile=args.profile, level=args.level)
    best = out.sort_values("step_time_s").iloc[0]
    gpus = [g for g, n in workers for _ in range(n)]
    note = (f"mixed workers {args.workers}: {best.policy} batch split, step {best.step_time_s * 1e3:.1f} ms "
            f"({best.comm}), {best.interval_level:.0%} interval {best.step_time_low_s * 1e3:.1f}-"
            f"{best.step_time_high_s * 1e3:.1f} ms ({best.interval_regime})")
    bounds = (float(best.step_time_low_s), float(best.step_time_high_s))
    return {"worker_gpus": gpus, "gpus_per_node": 1}, float(best.step_time_s), bounds, note


def cmd_plan(args) -> int:
    model = load_model(args)
    if args.workers is not None:  # parse_workers refuses an empty list too
        n = sum(c for _, c in parse_workers(args.workers))
        strategy = strategy_from_args(args, n).replace(dp=1, ps_servers=0)
        cluster, step_s, bounds, note = _mixed(model, args, strategy)
    else:
        cluster = load_cluster(args)
        strategy, step_s, bounds = strategy_from_args(args, cluster.n_gpus, cluster.gpu), None, None
        note = f"{cluster.nodes} x {cluster.gpus_per_node} {cluster.gpu.name}"
    plan = plan_training(model, cluster, strategy, args.steps, provider=args.provider, region=args.region,
                         step_time_s=step_s, interval_s=args.interval_s, trials=args.trials, seed=args.seed,
                         profile=args.profile, level=args.level, step_interval_s=bounds)
    first = plan.iloc[0]
    print(f"{model.name}, {args.steps:,} steps on {note}; {first.provider} {first.region}, "
          f"{args.trials:,} trials")
    print(f"time and cost bounds (_low/_high): the step's {first.interval_level:.0%} interval "
          f"({first.interval_regime}), scaled to the run")
    print(plan[TABLE_COLUMNS].to_string(index=False, na_rep="-", float_format=lambda x: f"{x:,.4g}"))
    if args.out:
        plan.to_csv(args.out, index=False)
        print(f"wrote {args.out}")
    if args.plot:
        spot = plan[plan.scenario != "on-demand"].assign(on_demand_time_s=float(first.expected_time_s))
        plot_cost_vs_mix(spot, args.plot, label="scenario", title=f"{model.name}: {note}")
        print(f"wrote {args.plot}")
    return 0
