"""Command line of compare, sweep and search.

    perfmodel compare --model llama-2-13b --gpu dgx-a100-80gb --nodes 8 --global-batch 512 \\
        --strategies "dp=64,mb=1,zero=3" "tp=8,mb=1" "tp=4,pp=2,mb=1" [--out cmp.md] [--plot cmp.png]
    perfmodel sweep --model llama-3-70b --gpu dgx-h100 --over nodes --values 4 8 16 \\
        --tp 8 --pp 4 --micro-batch 1 --global-batch 256 [--scaling strong] [--plot scaling.png]
    perfmodel search --model llama-2-13b --gpu dgx-a100-80gb --nodes 8 --global-batch 512 \\
        [--top-k 10] [--sort-by mfu] [--price 2.0] [--out top.csv]
"""

from __future__ import annotations

from pathlib import Path

from perfmodel import cli
from perfmodel.cli import POSITIVE_FLOAT, POSITIVE_INT
from perfmodel.core.errors import InvalidInputError
from perfmodel.explore.stack_options import mixed_precision
from perfmodel.workload.stack import FRAMEWORKS
from perfmodel.core.readers import read_json_file, read_toml_file
from perfmodel.explore.caveats import search_intervals
from perfmodel.explore.compare import _value, compare
from perfmodel.explore.output import FLOPS_NOTE, format_table, stack_label, write_table
from perfmodel.explore.search import FIXED_FIELDS, FIXED_FLAGS, search
from perfmodel.explore.sweep import AXES, SCALE_AXES, sweep
from perfmodel.explore.ties import tie_line
from perfmodel.interval import UNCALIBRATED
from perfmodel.predict import INTERVAL_KIND
from perfmodel.report.plots import compare_figure, save_figure, sweep_figure


def _strategies(items: list[str]):
    """Strategy specs from the command line, or from one TOML/JSON file of them."""
    if len(items) == 1 and Path(items[0]).suffix.lower() in (".toml", ".json"):
        return load_strategies(items[0])
    return items


def load_strategies(path):
    """A list (or label -> spec mapping) of strategies from TOML or JSON.

    TOML: ``[[strategy]]`` tables, or one table per label (``[fsdp] zero = 3``).
    JSON: a list of objects, or an object label -> object.
    """
    path = Path(path)
    if path.suffix.lower() == ".json":
        data = read_json_file(path, field="strategies", expect="a JSON list of strategies")
    else:
        data = read_toml_file(path, field="strategies", expect="a TOML file of strategies")
        data = data.get("strategy", data)
    if not isinstance(data, (list, dict)) or not data:
        raise InvalidInputError(f"{str(path)!r} must hold a list of strategies or a table of them by label")
    return data


def _notes(df) -> str:
    """What the interval column is, which rows' intervals are uncalibrated and why, and how TFLOP/s differs from
    MFU, below a table."""
    kind = df.attrs.get("interval_kind") or INTERVAL_KIND
    level = f"; stated at {df['interval_level'].iloc[0]:.0%}" if "interval_level" in df.columns and len(df) else ""
    return f"\ninterval: {kind}{level}{_uncalibrated(df)}\n{FLOPS_NOTE}"


def _uncalibrated(df) -> str:
    """The rows of ``df`` whose interval no calibrated regime gives, counted by reason ("" when none)."""
    if "interval_regime" not in df.columns:
        return ""
    regimes = df["interval_regime"].astype(str)
    found = regimes[regimes.str.startswith(UNCALIBRATED)].value_counts()
    parts = [f"{n} row{'s' * (n > 1)}: {r.removeprefix(UNCALIBRATED + ': ')}" for r, n in found.items()]
    return ("\nuncalibrated intervals (the pooled width of the profile's origin, docs/accuracy.md): "
            + "; ".join(parts)) if parts else ""


def _out(df, args, figure=None) -> None:
    if args.out:
        print(f"wrote {write_table(df, args.out)}")
    if args.plot and figure is not None:
        print(f"wrote {save_figure(figure(df), args.plot)}")


def cmd_compare(args) -> int:
    model, cl = cli.load_model(args), cli.load_cluster(args)
    defaults = {k: getattr(args, k) for k in ("global_batch", "micro_batch", "precision", "recompute")
                if getattr(args, k) is not None}
    defaults.setdefault("precision", mixed_precision(cl.gpu))
    df = compare(model, cl, _strategies(args.strategies), profile=args.profile, defaults=defaults, level=args.level,
                 memory_headroom=args.memory_headroom)
    print(f"{getattr(model, 'name', '')} on {cl.name} ({cl.n_gpus} GPUs); * = fastest that fits\n")
    print(format_table(df, ("label", "global_batch", "step_time", "interval", "tokens_per_second", "tflops_per_gpu",
                            "mfu", "peak_memory", "fits", "bottleneck", "caveat")))
    print(_notes(df))

    print(tie_line(df, df.loc[df["tie"], "label"]))

    title = f"{getattr(model, 'name', '')} on {cl.n_gpus} × {cl.gpu.name} ({cl.name})"
    _out(df, args, lambda d: compare_figure(d, title=title))
    return 0


def _sweep_values(over: str, values: list[str]):
    # "--values 1,2,4" as well as "--values 1 2 4": no axis value holds a comma
    values = [v for value in values for v in value.split(",") if v]
    if over in (*SCALE_AXES, "global_batch", "micro_batch", "seq"):
        try:
            return [int(v) for v in values]
        except ValueError:
            raise InvalidInputError(f"'--values' of {over} must be integers: got {values}") from None
    if over == "gpu":
        return values
    return [_value(over, v) for v in values]


def cmd_sweep(args) -> int:
    model, cl = cli.load_model(args), cli.load_cluster(args)
    s = cli.strategy_from_args(args, cl.n_gpus, cl.gpu)
    df = sweep(model, args.over, _sweep_values(args.over, args.values), cluster=cl, strategy=s,
               profile=args.profile, scaling=args.scaling, level=args.level, memory_headroom=args.memory_headroom,
               own_precision=args.over == "gpu" and args.precision is None)
    how = f" ({args.scaling} scaling)" if args.over in ("nodes", "gpus") else ""
    print(f"{getattr(model, 'name', '')} on {cl.gpu.name}: sweep over {args.over}{how}, strategy {df.attrs['strategy']}")
    if df.attrs.get("batch_note"):
        print(df.attrs["batch_note"])
    print()
    precision = ("precision",) if df["precision"].nunique() > 1 else ()  # GPU types each at their own
    columns = dict.fromkeys((args.over, "gpus", *precision, "label", "global_batch", "step_time", "interval",
                             "tokens_per_second", "scaling_efficiency", "speedup", "mfu", "peak_memory", "fits",
                             "bottleneck"))
    print(format_table(df, tuple(columns), best_column=None))
    print(_notes(df))
    _out(df, args, sweep_figure)
    return 0


def _search_framework_args(p) -> None:
    """``perfmodel search``'s --framework (a list) and --compile / --no-compile: by default, as ``pm.search``."""
    p.add_argument("--framework", default=None, help="comma-separated frameworks searched (default: every one whose "
                   f"code runs the model, as pm.search; known: {', '.join(FRAMEWORKS)}; docs/stacks.md)")
    p.add_argument("--compile", default=None, action="store_true", help="compiled jobs only (default: with and "
                   "without torch.compile where the stack compiles)")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="uncompiled jobs only")


def _csv(text: str, cast):
    try:
        return tuple(cast(v.strip()) for v in text.split(",") if v.strip())
    except ValueError:
        raise InvalidInputError(f"expected a comma-separated list: got {text!r}") from None


def _bool(text: str) -> bool:
    low = text.lower()
    if low not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(text)
    return low in ("true", "1", "yes")


def _fixed(text: str | None) -> dict | None:
    """``--fixed grad_reduce_fp32=false,optimizer_states=remainders`` as ``search(fixed=...)`` takes it."""
    if not text:
        return None
    out = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in FIXED_FIELDS:
            raise InvalidInputError(f"--fixed takes FIELD=VALUE items with FIELD one of {', '.join(FIXED_FIELDS)}: "
                                    f"got {item!r}")
        try:
            out[name] = _bool(value.strip()) if name in FIXED_FLAGS else value.strip()
        except ValueError:
            raise InvalidInputError(f"--fixed {name}= takes true or false: got {value!r}") from None
    return out


def cmd_search(args) -> int:
    model, cl = cli.load_model(args), cli.load_cluster(args)
    df = search(model, cl, args.global_batch, top_k=args.top_k, sort_by=args.sort_by, prices=args.price,
                profile=args.profile, max_micro_batch=args.max_micro_batch,
                max_virtual_stages=args.max_virtual_stages,
                recompute=_csv(args.recompute, str) if args.recompute else None,
                zero=_csv(args.zero, int), sequence_parallel=_csv(args.sequence_parallel, _bool),
                precision=_csv(args.precision, str) if args.precision else None, optimizer=args.optimizer,
                max_tp_nodes=args.max_tp_nodes,
                framework=_csv(args.framework, str) if args.framework else None, attention=args.attention,
                tp_overlap=args.tp_overlap, dp_overlap=args.dp_overlap, cp=args.cp, ep=args.ep, compile=args.compile,
                bucket_mib=_csv(args.bucket_mib, float), offload_layers=_csv(args.offload_layers, int),
                tp_comm_overlap=None if args.tp_comm_overlap is None else
                _csv(args.tp_comm_overlap, lambda v: None if v == "none" else v),
                schedule=None if args.schedules is None else _csv(args.schedules, str), level=args.level,
                fixed=_fixed(args.fixed), memory_headroom=args.memory_headroom)
    a = df.attrs
    rejected = ", ".join(f"{k} {v:,}" for k, v in a["rejected"].items())
    with_cp = (f", context parallel {args.cp}" if args.cp > 1 else "") + (f", expert parallel {args.ep}"
                                                                          if (args.ep or 1) > 1 else "")
    with_cp += f", holding {args.fixed}" if args.fixed else ""
    print(f"{getattr(model, 'name', '')} on {cl.name} ({cl.n_gpus} GPUs{with_cp}), global batch {args.global_batch}: "
          f"{a['evaluated']:,} configurations evaluated in {a['seconds'] * 1e3:.0f} ms "
          f"({a['pruned']:,} more pruned: bounded by a faster one), {a['feasible']:,} fit; "
          f"rejected: {rejected}; sorted by {a['sort_by']}\n")

    df = search_intervals(df, model, cl, profile=args.profile, level=args.level)
    df.attrs.update(a, model=getattr(model, "name", ""), gpu=cl.gpu.name)
    df.insert(0, "rank", range(1, len(df) + 1))
    shown = df.assign(stack=[stack_label(row) for _, row in df.iterrows()])  # which framework, precision, ...
    split = tuple(k for k in ("cp", "ep") if k in df.columns and (df[k] > 1).any())  # context and expert parallel
    print(format_table(shown, ("rank", "dp", "tp", "pp", *split, "virtual_stages", "micro_batch", "micro_batches", "zero",
                               "recompute", "sequence_parallel", "stack", "step_time", "interval", "tokens_per_second",
                               "tflops_per_gpu", "mfu", "peak_memory", "usd_per_million_tokens", "bottleneck", "caveat"),
                       best_column=None))
    print(_notes(df))

    print(tie_line(df, [f"rank {r}" for r in df.loc[df["tie"], "rank"]]))
    _out(df, args)
    return 0


def _common(p) -> None:
    p.add_argument("--out", default=None, help="also write the table: FILE.csv, FILE.json or FILE.md")
    p.add_argument("--level", type=POSITIVE_FLOAT, default=0.9,
                   help="coverage level of each row's step-time interval (default 0.9; docs/accuracy.md)")
    cli.add_headroom_arg(p)


def add_parsers(sub) -> None:
    """Add the compare, sweep and search sub-commands to the perfmodel command line."""
    p = sub.add_parser("compare", help="compare parallel strategies side by side")
    cli.add_model_args(p)
    p.add_argument("--strategies", nargs="+", required=True,
                   help='strategies such as "dp=8" "tp=4,pp=2,micro_batch=1", or one TOML/JSON file of them')
    p.add_argument("--global-batch", type=POSITIVE_INT, default=None, help="global batch for strategies that do not set one")
    p.add_argument("--micro-batch", type=POSITIVE_INT, default=None, help="micro-batch for strategies that do not set one")
    p.add_argument("--precision", default=None)
    p.add_argument("--recompute", default=None, help="checkpointing for strategies that do not set one: none, "
                   "selective, full, selective-op (torchtitan) or every-<k>")
    _common(p)
    p.add_argument("--plot", default=None, help="draw throughput, time and memory: FILE.png, .svg or .pdf")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("sweep", help="one strategy across node counts, batch sizes, sequence lengths or GPUs")
    cli.add_model_args(p)
    cli.add_strategy_args(p)
    p.add_argument("--over", required=True, choices=AXES, metavar="AXIS",
                   help="nodes, gpus, global_batch, micro_batch, seq, gpu, or a strategy field (tp, zero, ...)")
    p.add_argument("--values", nargs="+", required=True, help="values of the axis (space- or comma-separated)")
    p.add_argument("--scaling", default="weak", choices=["weak", "strong"],
                   help="over nodes/gpus: weak keeps the per-GPU batch, strong the global batch")
    _common(p)
    p.add_argument("--plot", default=None, help="draw the sweep: FILE.png, .svg or .pdf")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("search", help="rank every valid parallel configuration")
    cli.add_model_args(p)
    p.add_argument("--global-batch", type=POSITIVE_INT, required=True)
    p.add_argument("--top-k", type=POSITIVE_INT, default=10)
    p.add_argument("--sort-by", default=None, help="tokens_per_second (default), mfu, step_time, peak_memory, ...")
    p.add_argument("--price", type=POSITIVE_FLOAT, default=None, help="$ per GPU-hour: adds cost columns, ranks by $/M tokens")
    p.add_argument("--max-micro-batch", type=POSITIVE_INT, default=8)
    p.add_argument("--max-virtual-stages", type=POSITIVE_INT, default=16)
    p.add_argument("--max-tp-nodes", type=POSITIVE_INT, default=1, help="nodes a tensor group may span")
    p.add_argument("--recompute", default=None, help="comma-separated policies (default: the framework's)")
    p.add_argument("--zero", default="0,1,2,3")
    p.add_argument("--sequence-parallel", default="false,true")
    p.add_argument("--precision", default=None, help="comma-separated precisions tried (default, as pm.search: "
                   "bf16-mixed where the GPU takes bf16, else fp16-mixed, else fp32; and fp8-mixed where it and the "
                   "stack do)")
    p.add_argument("--optimizer", default="adamw")
    p.add_argument("--bucket-mib", default="25", help="comma-separated DDP / ZeRO-1/2 gradient buckets in MiB "
                   "(default 25, as torch's bucket_cap_mb; pm.search tries 25,100,400)")
    p.add_argument("--offload-layers", default="0", help="comma-separated activation CPU offloads tried (blocks, pp = 1, "
                   "no recomputation; pytorch and megatron; default 0: none)")
    p.add_argument("--tp-comm-overlap", default=None, help="comma-separated tensor-parallel overlaps tried: none, "
                   "userbuffers, userbuffers-nemo, async (default: none and each stack's own)")
    p.add_argument("--schedules", default=None, help="comma-separated schedules of the rows with virtual stages: "
                   "interleaved, interleaved-zb, zbv, dualpipev (default: interleaved, and torch's zero-bubble ones "
                   "for torchtitan)")
    p.add_argument("--fixed", default=None, help="Strategy fields held for every candidate, FIELD=VALUE,...: "
                   "e.g. grad_reduce_fp32=false,optimizer_states=remainders (docs/explore.md)")
    cli.add_stack_args(p, _search_framework_args)
    _common(p)
    p.set_defaults(func=cmd_search, plot=None)
