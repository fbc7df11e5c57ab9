"""perfmodel command line.

    perfmodel predict --model gpt2-small --gpu h200 --micro-batch 8 [--json]
    perfmodel fit TABLES_DIR... -o profile.json
    perfmodel calibrate --out DIR [--quick]
    perfmodel import-nccl-tests LOG... --out DIR
    perfmodel list models|gpus|nodes|profiles|frameworks

Errors from perfmodel become one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import signal
import subprocess
import sys
from pathlib import Path

from perfmodel.core.entry import run_command
from perfmodel.core.errors import InvalidInputError
from perfmodel.cli.argtypes import NONNEGATIVE_FLOAT, NONNEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT, headroom_fraction, renamed_bucket
from perfmodel import __version__
from perfmodel.cli.listing import LISTINGS, listing
from perfmodel.core.extras import require_installed
from perfmodel.fit.device import CPU, choose_gpu, host_slug, measured_device
from perfmodel.fit.nccl_tests import import_logs
from perfmodel.fit.tables import read_compute_table
from perfmodel.hardware import cluster, load_gpu
from perfmodel.explore.stack_options import mixed_precision
from perfmodel.parallel.strategy import PS_PLACEMENTS, SCHEDULES, TP_COMM_OVERLAPS, Strategy, parse_stage_layers
from perfmodel.predict import predict
from perfmodel.profiles.origin import profile_origin
from perfmodel.report.fit_plots import write_residual_plots
from perfmodel.report.tables import REPORT_WIDTH, fit_report_table, fit_target_summary, kernel_table, prediction_table
from perfmodel.analysis.kernel_breakdown import kernel_breakdown
from perfmodel.workload.hf import from_hf_config
from perfmodel.workload.hf_hub import from_hf_hub
from perfmodel.workload.presets import model_from_toml, preset
from perfmodel.workload.stack import ATTENTIONS
from perfmodel.costs.memory import OPTIMIZER_STATES
from perfmodel.workload.stacks.layout import DEFAULT_MEMORY_FORMAT, MEMORY_FORMATS
from perfmodel.workload.stacks import FRAMEWORKS, composer, float8
from perfmodel.validate.host import write_host_gpu
from perfmodel.fit.compute import POWER_ONSET_S
from perfmodel.fit.build import build_profile

# Modules that add their own sub-commands (compare/sweep/search, validate, plan).
EXTENSIONS = tuple(f"perfmodel.cli.{name}" for name in ("explore", "validate", "transient", "sites", "share"))


class Parser(argparse.ArgumentParser):
    """Usage mistakes, like every other error, are one line on stderr and exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Model, cluster and profile options shared by predict and the explore commands."""
    p.add_argument("--model", default="gpt2-small",
                   help="preset name (perfmodel list models), HF config.json path, Hugging Face Hub id "
                        "(owner/name; pip install 'perfmodel[hf]'), or a model TOML")
    p.add_argument("--gpu", default=None, help="GPU or node preset (or cluster TOML); default h200")
    p.add_argument("--nodes", type=POSITIVE_INT, default=1, help="number of nodes (default 1)")
    p.add_argument("--gpus-per-node", type=POSITIVE_INT, default=None, help="GPUs per node for a bare GPU name")
    p.add_argument("--speed-spread", type=NONNEGATIVE_FLOAT, default=None, metavar="SIGMA",
                   help="σ of a GPU's speed over the fleet's median, a fraction (default: the GPU file's, else "
                        "0.0148, Sinha et al. SC22); a synchronous step waits for its slowest GPU")
    p.add_argument("--profile", default=None, help="profile JSON (default: the GPU's bundled profile)")
    p.add_argument("--seq", type=POSITIVE_INT, default=None, help="override the model's sequence length")


def add_headroom_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--memory-headroom", type=headroom_fraction, default=0.0, metavar="FRACTION",
                   help="a plan fits only if it leaves this fraction of each GPU's memory free (default 0)")


def add_strategy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dp", type=POSITIVE_INT, default=None, help="data-parallel size (default: GPUs / (tp × pp))")
    p.add_argument("--tp", type=POSITIVE_INT, default=1)
    p.add_argument("--pp", type=POSITIVE_INT, default=1)
    p.add_argument("--micro-batch", type=POSITIVE_INT, default=8)
    p.add_argument("--global-batch", type=POSITIVE_INT, default=None)
    p.add_argument("--zero", type=int, default=0, choices=range(4))
    p.add_argument("--fsdp", default=None, choices=["full", "hybrid", "shard-grad-op"])
    p.add_argument("--recompute", default=None,
                   help="none, selective, full, selective-op (torchtitan) or every-<k>; default: the framework's")
    p.add_argument("--precision", default=None, help="default: bf16-mixed, fp16-mixed on GPUs without bf16, fp32 on the K80")
    p.add_argument("--optimizer", default="adamw")
    p.add_argument("--schedule", default="1f1b", choices=list(SCHEDULES))
    p.add_argument("--virtual-stages", type=POSITIVE_INT, default=1)
    p.add_argument("--sequence-parallel", action="store_true")
    p.add_argument("--ps-servers", type=NONNEGATIVE_INT, default=0)
    p.add_argument("--ps-async", action="store_true",
                   help="asynchronous parameter servers: workers push and pull without waiting (docs/parameter-servers.md)")
    p.add_argument("--ps-placement", default=None, choices=list(PS_PLACEMENTS), help="variables over the servers: "
                   "greedy by bytes or round-robin (default: the framework's)")
    p.add_argument("--ps-local-reduce", action="store_true", help="synchronous ps: a machine sums its GPUs' gradients "
                   "and pushes once (tf_cnn_benchmarks distributed_replicated)")
    p.add_argument("--bucket-mib", type=POSITIVE_FLOAT, default=None, help="gradient bucket size in MiB (default: the "
                   "framework's; 25 as torch's bucket_cap_mb, Megatron-Core max(4e7, 1e6 x dp) fp32 elements)")
    p.add_argument("--bucket-mb", type=renamed_bucket, help=argparse.SUPPRESS)
    p.add_argument("--placement", default="tp-pp-dp", help="order groups fill the nodes (default tp-pp-dp)")
    p.add_argument("--stage-layers", default=None, help="uneven pipeline split, layers per stage: e.g. 7,8,8,7")
    p.add_argument("--loss", default=None, choices=["eager", "compiled", "fused", "chunked"], help="cross-entropy: "
                   "eager fp32 logits, Inductor-compiled, a fused kernel or chunked (default: the framework's)")
    p.add_argument("--tp-comm-overlap", default=None, choices=list(TP_COMM_OVERLAPS),
                   help="tensor-parallel collectives beside their GEMMs: TE userbuffers, with NeMo's tuned SMs (megatron), async TP (torchtitan)")
    p.add_argument("--offload-layers", type=NONNEGATIVE_INT, default=0,
                   help="activation CPU offload of the first k blocks: save_on_cpu (pytorch), --cpu-offloading-num-layers (megatron)")
    p.add_argument("--cp-comm", default=None, choices=["p2p", "all_gather", "all_to_all"],
                   help="context-parallel K/V exchange (--cp-comm-type, set_rotate_method); default: the framework's")
    p.add_argument("--grad-reduce", default=None, choices=["fp32", "bf16"], help="gradient reduction dtype: megatron's "
                   "main_grad (default fp32), an FSDP stack's reduce_dtype (default: the stack's)")
    p.add_argument("--optimizer-states", default=None, choices=list(OPTIMIZER_STATES),
                   help="megatron: fp32 (distributed optimizer), remainders (Apex, NeMo 1.x), bf16; docs/memory.md")
    p.add_argument("--fp8-params", action="store_true", help="fp8-mixed: GEMM weights as fp8 parameters (megatron: NeMo "
                   "fp8_params, --fp8-param-gather), or gathered in fp8 (torchtitan: enable_fsdp_float8_all_gather)")
    p.add_argument("--float8-recipe", default=None, choices=list(dict.fromkeys(r for names in float8.RECIPES.values() for r in names)),
                   help="fp8 scaling: torchao's recipes (torchtitan), TE's delayed or tensorwise (default: the framework's)")
    p.add_argument("--memory-format", default=DEFAULT_MEMORY_FORMAT, choices=list(MEMORY_FORMATS),
                   help="CNN activations: channels_last (NHWC) or contiguous (NCHW: cuDNN transposes; docs/cnn.md)")
    p.add_argument("--norm-kernels", default="fused", choices=["fused", "composite"],
                   help="eager RMSNorm: one fused kernel, or HF's / fms's elementwise ops (docs/stacks.md)")
    p.add_argument("--fc-type", default=None, choices=list(composer.FC_TYPES), help="composer: MPT's linears, torch (amp_fp8 runs "
                   "them bf16) or te (fp8); default te under fp8-mixed, as llm-foundry's tutorial pairs them")
    p.add_argument("--allocator", default=None, choices=["expandable", "fixed"], help="PyTorch's caching allocator: "
                   "expandable_segments on or off (default: as the framework's launch scripts set it; docs/memory.md)")
    p.add_argument("--experts-gemm", default=None, choices=list(EXPERTS_GEMM)[1:], help="MoE: routed experts as one "
                   "grouped GEMM per linear or one GEMM each (default: the framework's; docs/stacks.md)")
    add_stack_args(p)


def add_stack_args(p: argparse.ArgumentParser, framework_args=None) -> None:
    """The software stack, the context- and expert-parallel sizes (``framework_args``: what adds --framework and
    --compile instead of one framework, compiled or not)."""
    p.add_argument("--cp", type=POSITIVE_INT, default=1, help="context-parallel size: the sequence split over cp ranks")
    p.add_argument("--ep", type=POSITIVE_INT, default=None, help="expert-parallel size (MoE; default 1, search: the powers of two dividing its experts)")
    p.add_argument("--etp", type=POSITIVE_INT, default=None, help="megatron: expert tensor-parallel size, each expert split over etp ranks, the ep x etp grid folded over tp x cp x dp (default: tp)")
    if framework_args:
        framework_args(p)
    else:
        p.add_argument("--framework", default="pytorch", choices=list(FRAMEWORKS), help="the training framework, "
                       "with its defaults: pytorch (eager autocast), megatron, torchtitan (FSDP2), fsdp1, ... "
                       "(docs/stacks.md)")
        p.add_argument("--compile", action="store_true", help="torch.compile of each block (Inductor fusion)")
    p.add_argument("--attention", default=None, choices=list(ATTENTIONS), help="attention kernel (default: the framework's; docs/hardware.md)")
    p.add_argument("--tp-overlap", action="store_true", help="Megatron's asynchronous tensor-parallel communication")
    p.add_argument("--no-dp-overlap", dest="dp_overlap", action="store_false",
                   help="gradient reduction after the backward pass (Megatron-LM local DDP, DeepSpeed pipeline); with --zero 3, gathers and reduce-scatters serialized with compute (DeepSpeed ZeRO-3, early 2021)")


def load_model(args):
    spec = args.model
    if Path(spec).is_dir():  # a folder holding a config.json (a Hugging Face snapshot)
        model = from_hf_config(spec)
    elif not spec.endswith((".json", ".toml")) and "/" in spec and not Path(spec).exists():
        model = from_hf_hub(spec)  # a Hub id such as meta-llama/Meta-Llama-3-8B (the 'hf' extra)
    elif spec.endswith(".json"):
        model = from_hf_config(spec)
    elif spec.endswith(".toml"):
        model = model_from_toml(spec)
    else:
        model = preset(spec)
    if getattr(args, "seq", None):
        model = model.with_(seq=args.seq)
    return model


def load_cluster(args):
    return cluster(args.gpu or "h200", nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                   speed_spread=getattr(args, "speed_spread", None))


def strategy_from_args(args, n_gpus: int, gpu=None):
    dp = args.dp or max(1, n_gpus // (args.tp * args.pp * args.cp))
    precision = args.precision or (mixed_precision(gpu) if gpu is not None else "bf16-mixed")
    return Strategy(dp=dp, tp=args.tp, pp=args.pp, micro_batch=args.micro_batch, global_batch=args.global_batch,
                    zero=args.zero, fsdp=args.fsdp, recompute=args.recompute, precision=precision,
                    optimizer=args.optimizer, schedule=args.schedule, virtual_stages=args.virtual_stages,
                    sequence_parallel=args.sequence_parallel, ps_servers=args.ps_servers,
                    bucket_mib=args.bucket_mib, placement=args.placement, stage_layers=parse_stage_layers(args.stage_layers or ""),
                    framework=args.framework, attention=args.attention, tp_overlap=args.tp_overlap,
                    dp_overlap=args.dp_overlap, cp=args.cp, ep=args.ep or 1, etp=getattr(args, "etp", None), compile=args.compile, loss=getattr(args, "loss", None),
                    tp_comm_overlap=getattr(args, "tp_comm_overlap", None), ps_async=getattr(args, "ps_async", False),
                    ps_placement=getattr(args, "ps_placement", None), ps_local_reduce=getattr(args, "ps_local_reduce", False),
                    offload_layers=getattr(args, "offload_layers", 0), cp_comm=getattr(args, "cp_comm", None),
                    grad_reduce_fp32=GRAD_REDUCE[getattr(args, "grad_reduce", None)],
                    optimizer_states=getattr(args, "optimizer_states", None), fp8_params=getattr(args, "fp8_params", False),
                    memory_format=getattr(args, "memory_format", DEFAULT_MEMORY_FORMAT),
                    norm_kernels=getattr(args, "norm_kernels", "fused"), float8_recipe=getattr(args, "float8_recipe", None),
                    fc_type=getattr(args, "fc_type", None), expandable_segments=ALLOCATOR[getattr(args, "allocator", None)],
                    grouped_experts=EXPERTS_GEMM[getattr(args, "experts_gemm", None)])


# --grad-reduce, --allocator and --experts-gemm as Strategy.grad_reduce_fp32, expandable_segments and grouped_experts
GRAD_REDUCE, ALLOCATOR = {None: None, "fp32": True, "bf16": False}, {None: None, "expandable": True, "fixed": False}
EXPERTS_GEMM = {None: None, "grouped": True, "loop": False}


def cmd_predict(args) -> int:
    model, cl = load_model(args), load_cluster(args)
    s = strategy_from_args(args, cl.n_gpus, cl.gpu)
    p = predict(model, cl, s, profile=args.profile, level=args.level, memory_headroom=args.memory_headroom)
    kernels = kernel_breakdown(model, cl, s, profile=args.profile) if args.kernels else None
    if args.json:
        out = p.to_dict() if kernels is None else {**p.to_dict(), "kernels": kernels.to_dict(orient="records")}
        print(json.dumps(out, indent=1, default=str))
    else:
        print(prediction_table(p) + ("" if kernels is None else "\n\n" + kernel_table(kernels)))
    return 0


def _fit_progress(done: int, total: int, key: str) -> None:
    """One line on stderr that a terminal redraws; elsewhere a line at each quarter."""
    if sys.stderr.isatty():
        end = "\n" if done + 1 == total else ""
        print(f"\rperfmodel: fitting class {done + 1}/{total}: {key:<40}", end=end, file=sys.stderr, flush=True)
    elif done * 4 // total != (done - 1) * 4 // total or done == 0:
        print(f"perfmodel: fitting class {done + 1}/{total} ({key})", file=sys.stderr, flush=True)


def _fit_device(args):
    """(gpu, profile name) of a fit: the device the tables' metadata names, a CPU host written as a TOML
    beside the profile, or --gpu as given (refused when it contradicts the tables)."""
    measured = measured_device(args.tables)
    gpu = choose_gpu(measured, args.gpu, allow_mismatch=args.allow_gpu_mismatch)
    if gpu != CPU:
        return gpu, args.name

    tables = [read_compute_table(f) for f in args.tables if (Path(f) / "compute.csv").exists()]
    if not tables:
        raise InvalidInputError("--gpu cpu describes the host from its compute.csv: the tables have none")
    import pandas as pd

    slug = host_slug(measured.device_name)
    meta = measured.meta or {}
    toml = write_host_gpu(Path(args.output).with_name(f"{slug}.toml"), pd.concat(tables, ignore_index=True), meta,
                          int(meta.get("torch_threads") or 1))
    print(f"wrote {toml} (the CPU host as a device: {measured.device_name or 'CPU'})")
    return str(toml), args.name or slug


def _fit_notes(profile) -> list[str]:
    """Lines on terms fitted from these tables only (fallback classes carry the reference GPU's)."""
    lines = []
    if profile.meta.get("rejected_rows"):
        lines.append("rejected rows: " + ", ".join(f"{n} {why}" for why, n in profile.meta["rejected_rows"].items()))
    limited = {k: e["power_limited"]["rate_fraction"] for k, e in profile.compute.items()
               if "power_limited" in e and "fallback" not in str(e.get("source", ""))}
    if limited:
        lines.append(f"power limit: rows under > {POWER_ONSET_S * 1e3:.0f} ms of back-to-back load ran at "
                     + ", ".join(f"{v:.2f} ({k})" for k, v in limited.items()) + " of the burst rate kept")
    if "step_overhead_source" in profile.host:
        per_kernel, per_step = profile.host["cpu_extra_per_kernel_s"], profile.host["step_extra_s"]
        if per_kernel > 0 or per_step > 0:
            lines.append(f"step overhead: {per_kernel * 1e6:.2f} us per kernel + {per_step * 1e3:.3f} ms per step")
        else:
            lines.append("step overhead: none beyond the priced kernels")
        lines.append(f"  ({profile.host['step_overhead_source']})")
    return lines


def cmd_fit(args) -> int:
    import textwrap

    gpu, name = _fit_device(args)
    profile, report = build_profile(args.tables, gpu=gpu, name=name, progress=_fit_progress)
    print(fit_report_table(report))
    print(fit_target_summary(report))
    for line in _fit_notes(profile):
        print(textwrap.fill(line, REPORT_WIDTH, subsequent_indent="  "))
    profile.save(args.output)
    print(f"wrote {args.output}: profile {profile.name!r} of {profile.gpu} ({profile_origin(profile)})")

    fp32 = "" if "bf16" in load_gpu(gpu).peak_flops else " --precision fp32"  # a CPU host measures fp32 only
    print(f"predict with it: perfmodel predict --gpu {gpu} --profile {args.output}{fp32} ...")
    if args.plots:
        paths = write_residual_plots(report.attrs["points"], args.plots)
        print(f"wrote {len(paths)} residual plots to {args.plots}")
    return 0


def cmd_calibrate(args) -> int:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise InvalidInputError("calibrating needs torch, which is not installed: pip install 'perfmodel[torch]' "
                                "(or a torch build for your accelerator)")
    if args.collectives:
        return _run_child(_collectives_command(args))
    cmd = [sys.executable, "-m", "calibration.compute", "--out", args.out]
    cmd += ["--quick"] if args.quick else []
    cmd += ["--budget", str(args.budget)] if args.budget else []
    cmd += ["--dtypes", args.dtypes] if args.dtypes else []
    cmd += ["--device", args.device] if args.device else []
    cmd += ["--ops", args.ops] if args.ops else []
    cmd += ["--timing", args.timing] if args.timing else []
    cmd += ["--force-mix"] if args.force_mix else []
    return _run_child(cmd)


def _collectives_command(args) -> list[str]:
    """torchrun of calibration.collectives: this node alone (--standalone), or one of --nnodes nodes
    meeting at --rdzv-endpoint (the same command on every node)."""
    run = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={args.nproc_per_node}"]
    if args.nnodes > 1:
        if not args.rdzv_endpoint:
            raise InvalidInputError(f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (a host every node "
                                    "reaches; run the same command on every node)")
        run += [f"--nnodes={args.nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={args.rdzv_endpoint}"]
    else:
        run += ["--standalone"]
    cmd = run + ["-m", "calibration.collectives", "--out", args.out]
    cmd += ["--quick"] if args.quick else []
    cmd += ["--force-mix"] if args.force_mix else []
    return cmd


def _run_child(cmd: list[str]) -> int:
    child = subprocess.Popen(cmd)
    # Ctrl-C reaches the child too, which keeps its finished rows and exits 130: wait for it. A SIGTERM
    # sent to this process is passed on, so the child does not go on measuring on its own.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
    try:
        while True:
            try:
                code = child.wait()
            except KeyboardInterrupt:
                continue
            # a child ended by signal N reads -N; a shell reports that as 128 + N (143 SIGTERM, 137 SIGKILL)
            return 128 - code if code < 0 else code
    finally:
        signal.signal(signal.SIGTERM, previous)


def cmd_import_nccl(args) -> int:
    table = import_logs(args.logs, args.out)
    print(f"imported {len(table)} rows into {args.out}/collectives.csv")
    if table.attrs.get("bad_lines"):
        print(f"skipped {table.attrs['bad_lines']} unreadable lines, e.g.: {table.attrs.get('bad_examples', [])[:3]}")
    return 0


def cmd_list(args) -> int:
    print(listing(args.what))
    return 0


def _add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine's kernels (python -m calibration.compute) or, "
                                         "with --collectives, its collectives (torchrun -m calibration.collectives)")
    p.add_argument("--out", required=True, help="output folder (compute.csv or collectives.csv, metadata.json); "
                                                "a rerun continues where it stopped")
    p.add_argument("--quick", action="store_true",
                   help="a small grid for tests and smoke checks (under a minute on 2 CPU cores; docs/calibration.md)")
    p.add_argument("--budget", type=POSITIVE_FLOAT, default=None, metavar="SECONDS",
                   help="stop cleanly after this many seconds (finished rows are kept)")
    p.add_argument("--dtypes", default=None, help="comma-separated: bf16,fp16,fp32,tf32,fp8 (default: all the "
                                                  "device supports)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--ops", default=None, help="comma-separated op families to measure")
    p.add_argument("--timing", default=None, help="eager, graph or eager,graph (CUDA graphs strip launch costs)")
    p.add_argument("--force-mix", action="store_true", help="allow adding to a folder from another machine")
    p.add_argument("--collectives", action="store_true",
                   help="measure collectives instead: one process per GPU via torchrun (gloo on a CPU)")
    p.add_argument("--nproc-per-node", type=POSITIVE_INT, default=2,
                   help="with --collectives: processes per node, one per GPU (default 2)")
    p.add_argument("--nnodes", type=POSITIVE_INT, default=1, help="with --collectives: nodes taking part (run "
                                                                 "the same command on each)")
    p.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                   help="with --collectives and --nnodes > 1: where the nodes meet")
    p.set_defaults(func=cmd_calibrate)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="perfmodel", description="Predict distributed training speed and memory.")
    parser.add_argument("--version", action="version", version=f"perfmodel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("predict", help="predict one configuration")
    add_model_args(p)
    add_strategy_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--level", type=POSITIVE_FLOAT, default=0.9,
                   help="coverage level of the step-time interval (default 0.9; docs/accuracy.md)")
    add_headroom_arg(p)
    p.add_argument("--kernels", action="store_true",
                   help="also list the busiest stage's kernel time by part, phase and class (GEMM, attention, ...)")
    p.set_defaults(func=cmd_predict)
    p = sub.add_parser("fit", help="fit calibration tables into a profile")
    p.add_argument("tables", nargs="+", help="folders holding compute.csv / collectives.csv (several: one profile)")
    p.add_argument("-o", "--output", default="profile.json", help="profile JSON to write (default profile.json)")
    p.add_argument("--gpu", default=None,
                   help="catalog GPU, GPU TOML or 'cpu' the tables describe (default: the device their "
                        "metadata.json names; a CPU host is written as a TOML beside the profile)")
    p.add_argument("--allow-gpu-mismatch", action="store_true",
                   help="accept a --gpu other than the measured device (a deliberate what-if)")
    p.add_argument("--name", default=None, help="profile name (default: the device's name)")
    p.add_argument("--plots", default=None, metavar="DIR", help="write one residual plot per class here")
    p.set_defaults(func=cmd_fit)
    _add_calibrate_parser(sub)
    p = sub.add_parser("import-nccl-tests", help="parse nccl-tests logs into collectives.csv")
    p.add_argument("logs", nargs="+")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_import_nccl)
    p = sub.add_parser("list", help="list bundled models, GPUs, nodes or profiles")
    p.add_argument("what", choices=list(LISTINGS))
    p.set_defaults(func=cmd_list)
    for name in EXTENSIONS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue
            raise
        module.add_parsers(sub)
    return parser


# Output options that name a folder (the others name a file), by command
FOLDER_OUTPUTS = {"calibrate": ("out",), "import-nccl-tests": ("out",), "fit": ("plots",), "validate": ("work_dir",)}
# File formats by command and option, checked before any work is done
OUTPUT_SUFFIXES = {("compare", "out"): (".csv", ".json", ".md"), ("sweep", "out"): (".csv", ".json", ".md"),
                   ("search", "out"): (".csv", ".json", ".md"), ("plan", "out"): (".csv",),
                   ("validate", "out"): (".csv",), ("fit", "output"): (".json",)}
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def _unwritable(folder: Path) -> str | None:
    """Why no file can be created in ``folder`` (None if one can): tried, as permissions and special file
    systems (/proc, read-only mounts) only show when a file is made."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".perfmodel-write-test-"):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_outputs(args) -> None:
    """Refuse an output path that cannot be written before any work is done: a file where a folder
    is meant (or the reverse), a folder that does not exist, a format the command cannot write."""
    for attr in ("out", "output", "plot", "plots", "work_dir"):
        value = getattr(args, attr, None)
        if not isinstance(value, str) or not value:
            continue
        flag, path = "--" + attr.replace("_", "-"), Path(value)
        if attr in ("plot", "plots"):  # the extra is missing: say so before the work, not after it
            require_installed("matplotlib", extra="plot", feature=f"{flag}'s plots")
        if attr in FOLDER_OUTPUTS.get(args.command, ()):
            if path.exists() and not path.is_dir():
                raise InvalidInputError(f"{flag} {value!r} is a file; give a folder")
            base = _nearest_existing(path)
            why = f"{str(base)!r} is a file" if not base.is_dir() else _unwritable(base)
            if why:
                raise InvalidInputError(f"{flag} {value!r}: cannot create files there ({why})")
            continue
        if path.is_dir():
            raise InvalidInputError(f"{flag} {value!r} is a folder; give a file name")
        if not path.parent.is_dir():
            raise InvalidInputError(f"{flag} {value!r}: folder {str(path.parent)!r} does not exist")
        valid = PLOT_SUFFIXES if attr == "plot" else OUTPUT_SUFFIXES.get((args.command, attr))
        if valid and path.suffix.lower() not in valid:
            raise InvalidInputError(f"{flag} {value!r}: unknown format {path.suffix or '(none)'!r} "
                                    f"(valid: {', '.join(valid)})")
        why = _unwritable(path.parent)
        if why:
            raise InvalidInputError(f"{flag} {value!r}: cannot write in folder {str(path.parent)!r} ({why})")


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    return f"perfmodel: warning: {message}\n"


def main(argv=None) -> int:
    import warnings

    warnings.formatwarning = _one_line_warning  # a what-if the user should see, not a source location
    return run_command(_run, argv, prog="perfmodel")  # an input or file error: one line, status 2


def _run(argv) -> int:
    args = build_parser().parse_args(argv)
    check_outputs(args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
