"""``perfmodel sites``: one run over several datacenters (docs/datacenters.md).

    perfmodel sites --sites two_regions.toml --model gpt2-xl --micro-batch 8
    perfmodel sites --sites two_regions.toml --model gpt2-xl --sync diloco --inner-steps 100 \\
        --outer-precision int8 --fragments 16 --overlap-steps 1 --target 0.95
"""

from __future__ import annotations

import json

from perfmodel.cli import (NONNEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT, add_strategy_args, load_model,
                           strategy_from_args)
from perfmodel.analysis.multisite import (ACROSS, MultiSiteStrategy, OUTER_PRECISION_BYTES, SYNCS,
                                          predict_multisite)
from perfmodel.costs.wan import SITE_ALGORITHMS
from perfmodel.hardware.sites import load_multi_cluster
from perfmodel.analysis.multisite_inverse import inner_steps_for, required_wan_bandwidth


def add_parsers(subparsers) -> None:
    p = subparsers.add_parser("sites", help="predict a run spanning datacenters joined by a WAN")
    p.add_argument("--sites", required=True, metavar="FILE.toml", help="[[sites]] and [wan] (docs/datacenters.md)")
    p.add_argument("--model", default="gpt2-small", help="preset name, HF config.json path, or a model TOML")
    p.add_argument("--profile", default=None, help="profile JSON for every site (default: each GPU's bundled one)")
    p.add_argument("--seq", type=POSITIVE_INT, default=None, help="override the model's sequence length")
    add_strategy_args(p)
    p.add_argument("--sync", default="sync", choices=SYNCS, help="sync: every step; diloco: every --inner-steps")
    p.add_argument("--inner-steps", type=POSITIVE_INT, default=1, help="DiLoCo's H")
    p.add_argument("--outer-precision", default="fp32", choices=sorted(OUTER_PRECISION_BYTES))
    p.add_argument("--fragments", type=POSITIVE_INT, default=1, help="Streaming DiLoCo fragments")
    p.add_argument("--overlap-steps", type=NONNEGATIVE_INT, default=0, help="inner steps a sync may overlap")
    p.add_argument("--across", default="dp", choices=ACROSS, help="what spans the sites (default dp)")
    p.add_argument("--algorithm", default="ring", choices=SITE_ALGORITHMS, help="collective over the sites")
    p.add_argument("--target", type=POSITIVE_FLOAT, default=None,
                   help="also the WAN bandwidth (and, with diloco, the inner steps) for this compute utilisation")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_sites)


def cmd_sites(args) -> int:
    sites = load_multi_cluster(args.sites)
    model = load_model(args)
    site = (strategy_from_args(args, sites.n_gpus) if args.across == "pp"
            else {s.name: strategy_from_args(args, s.cluster.n_gpus, s.cluster.gpu) for s in sites.sites})
    strategy = MultiSiteStrategy(site, sync=args.sync, inner_steps=args.inner_steps,
                                 outer_precision=args.outer_precision, streaming_fragments=args.fragments,
                                 overlap_steps=args.overlap_steps, across=args.across, algorithm=args.algorithm)
    p = predict_multisite(model, sites, strategy, profile=args.profile)
    out = {"model": p.model, "sites": p.sites, "sync": args.sync, "step_time_s": p.step_time,
           "compute_utilization": p.compute_utilization, "tokens_per_second": p.tokens_per_second,
           "outer_sync_s": p.outer_sync_s, "wan_bytes_per_sync": p.wan_bytes_per_sync, "mfu": p.mfu,
           "fits": p.fits, "inner_step_s": dict(p.inner_step_s)}
    if args.target is not None:
        out["target"] = args.target
        out["required_wan_gbps"] = required_wan_bandwidth(model, sites, strategy, args.target,
                                                          profile=args.profile) * 8 / 1e9
        if args.sync == "diloco":
            out["inner_steps_for_target"] = inner_steps_for(model, sites, strategy, args.target, profile=args.profile)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(repr(p))
    if args.target is not None:
        extra = (f"; {out['inner_steps_for_target']} inner steps at this WAN"
                 if "inner_steps_for_target" in out else "")
        print(f"compute utilisation {args.target:.0%} needs {out['required_wan_gbps']:.3g} Gb/s per site{extra}")
    return 0
