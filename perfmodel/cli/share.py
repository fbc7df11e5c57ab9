"""``perfmodel share``, ``perfmodel pack``, ``perfmodel share-network``: co-located jobs (docs/contention.md).

    perfmodel share --job gpt2-small:mb=8 --job gpt2-medium:mb=4 --gpu h100 [--mode mps]
    perfmodel share --job gpt2-small:mb=8 --job gpt2-small:mb=8 --gpu h100 --mode mig --mig-profile 3g.40gb
    perfmodel pack --job gpt2-small --job gpt2-small --job gpt2-medium --gpu h100 --gpus-per-node 2 \\
        [--objective slowest --steps 1000 1000 500]
    perfmodel share-network --job gpt2-small:dp=8@0,1 --job gpt2-small:dp=8@0,1 --gpu h100 --nodes 4 \\
        --gpus-per-node 8 [--search-offsets] [--nodes-per-rack 2 --oversubscription 2]

A job reads MODEL[:STRATEGY][@NODES]: a model as ``perfmodel predict --model`` takes it, a strategy
as ``perfmodel compare --strategies`` does ("dp=8,mb=4"; default: one GPU, micro-batch 8), and for
share-network the node indices it is placed on.
"""

from __future__ import annotations

import argparse

from perfmodel import cli
from perfmodel.analysis.contention import MODES, predict_shared
from perfmodel.analysis.network import predict_cluster
from perfmodel.analysis.packing import OBJECTIVES, advise_packing
from perfmodel.cli import POSITIVE_FLOAT, POSITIVE_INT
from perfmodel.core.errors import InvalidInputError
from perfmodel.explore.compare import parse_strategy


def parse_job(spec: str, *, placed: bool = False):
    """(model, strategy, label[, nodes]) of a MODEL[:STRATEGY][@NODES] job spec."""
    text, _, nodes = spec.partition("@")
    if placed != bool(nodes):
        want = "MODEL[:STRATEGY]@NODES (e.g. gpt2-small:dp=8@0,1)" if placed else "MODEL[:STRATEGY] (no @NODES)"
        raise InvalidInputError(f"--job {spec!r} must read {want}")
    name, _, strategy = text.partition(":")
    model = cli.load_model(argparse.Namespace(model=name, seq=None))
    s = parse_strategy(strategy or {}, 1, dp=1, micro_batch=8)
    if not placed:
        return model, s, name
    try:
        at = [int(x) for x in nodes.split(",")]
    except ValueError:
        raise InvalidInputError(f"--job {spec!r}: nodes must be comma-separated indices such as @0,1") from None
    return model, s, at, name


def _labelled(jobs: list) -> list:
    """Jobs with distinct labels: a repeated model gets #2, #3, ..."""
    seen: dict = {}
    out = []
    for job in jobs:
        label = job[-1]
        seen[label] = seen.get(label, 0) + 1
        out.append((*job[:-1], label if seen[label] == 1 else f"{label}#{seen[label]}"))
    return out


def _rows(header: tuple, rows: list) -> str:
    cells = [header] + [tuple(str(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def cmd_share(args) -> int:
    jobs = _labelled([parse_job(j) for j in args.job])
    mig = args.mig_profile if not args.mig_profile or len(args.mig_profile) > 1 else args.mig_profile[0]
    r = predict_shared(jobs, cli.load_cluster(args), mode=args.mode, profile=args.profile, mig_profile=mig)
    print(f"{len(jobs)} jobs on one {r.device}, {r.mode} (interference: {r.interference})")
    print(_rows(("job", "instance", "step_ms", "alone_ms", "slowdown", "gpu_share", "tokens/s", "memory_GiB", "fits"),
                [(j.name, j.instance or "-", f"{j.step_time * 1e3:.2f}", f"{j.solo_step_time * 1e3:.2f}",
                  f"{j.slowdown:.2f}", f"{j.gpu_share:.2f}", f"{j.tokens_per_second:,.0f}",
                  f"{j.memory_bytes / 2**30:.1f}", j.fits) for j in r.jobs]))
    print(f"throughput {r.throughput:.2f} GPUs' worth of solo progress; memory {r.memory_bytes / 2**30:.1f} of "
          f"{r.memory_capacity / 2**30:.0f} GiB {'fits' if r.fits else 'DOES NOT FIT'}")
    return 0


def cmd_pack(args) -> int:
    jobs = _labelled([parse_job(j) for j in args.job])
    choices = advise_packing(jobs, cli.load_cluster(args), objective=args.objective, modes=tuple(args.modes),
                             steps=args.steps, profile=args.profile, top=args.top_k)
    print(f"groupings of {len(jobs)} jobs, best first by {args.objective}")
    print(_rows(("rank", "groups (mode)", "throughput", "slowest_s"),
                [(i + 1, "  ".join(f"[{' '.join(g)}] ({m})" for g, m in zip(c.groups, c.modes)),
                  f"{c.throughput:.2f}", f"{c.slowest_s:.4g}") for i, c in enumerate(choices)]))
    return 0


def cmd_share_network(args) -> int:
    jobs = _labelled([parse_job(j, placed=True) for j in args.job])
    r = predict_cluster(jobs, cli.load_cluster(args), profile=args.profile, offsets=args.offsets,
                        search_offsets=args.search_offsets, nodes_per_rack=args.nodes_per_rack,
                        oversubscription=args.oversubscription)
    print(_rows(("job", "nodes", "step_ms", "alone_ms", "slowdown", "comm_ms", "offset_ms", "aligned_slowdown"),
                [(j.name, ",".join(map(str, j.nodes)), f"{j.step_time * 1e3:.2f}", f"{j.solo_step_time * 1e3:.2f}",
                  f"{j.slowdown:.2f}", f"{j.comm_s * 1e3:.2f}", f"{j.offset_s * 1e3:.2f}", f"{a:.2f}")
                 for j, a in zip(r.jobs, r.aligned_slowdowns)]))
    print("hottest links: " + (", ".join(f"{n} {u:.0%}" for n, u in r.hottest_links[:5]) or "none shared"))
    print(f"offset gain x{r.gain:.2f} (mean slowdown started together / with these offsets)")
    return 0


def _common(p, help_job: str) -> None:
    p.add_argument("--job", action="append", required=True, metavar="SPEC", help=help_job)
    p.add_argument("--gpu", default=None, help="GPU or node preset (or cluster TOML); default h200")
    p.add_argument("--nodes", type=POSITIVE_INT, default=1, help="number of nodes (default 1)")
    p.add_argument("--gpus-per-node", type=POSITIVE_INT, default=None, help="GPUs per node for a bare GPU name")
    p.add_argument("--profile", default=None, help="profile JSON (default: the GPU's bundled profile)")


def add_parsers(sub) -> None:
    """Add the share, pack and share-network sub-commands."""
    p = sub.add_parser("share", help="jobs co-located on one GPU: time-slicing, MPS or MIG")
    _common(p, "MODEL[:STRATEGY], once per job (e.g. gpt2-small:mb=4)")
    p.add_argument("--mode", default="time-slice", choices=MODES)
    p.add_argument("--mig-profile", nargs="+", default=None, help="MIG profile for all jobs, or one per job")
    p.set_defaults(func=cmd_share)

    p = sub.add_parser("pack", help="rank groupings of single-GPU jobs onto a cluster's GPUs")
    _common(p, "MODEL[:STRATEGY], once per job")
    p.add_argument("--objective", default="throughput", choices=OBJECTIVES)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="sharing modes tried per GPU")
    p.add_argument("--steps", nargs="+", type=POSITIVE_INT, default=None, help="steps each job runs (completion)")
    p.add_argument("--top-k", type=POSITIVE_INT, default=5)
    p.set_defaults(func=cmd_pack)

    p = sub.add_parser("share-network", help="jobs placed on nodes of one cluster sharing its NICs and uplinks")
    _common(p, "MODEL[:STRATEGY]@NODES, once per job (e.g. gpt2-small:dp=8@0,1)")
    p.add_argument("--offsets", nargs="+", type=float, default=None, help="seconds each job starts after the first")
    p.add_argument("--search-offsets", action="store_true", help="choose offsets for the lowest mean slowdown")
    p.add_argument("--nodes-per-rack", type=POSITIVE_INT, default=None)
    p.add_argument("--oversubscription", type=POSITIVE_FLOAT, default=1.0, help="rack uplink oversubscription")
    p.set_defaults(func=cmd_share_network)
