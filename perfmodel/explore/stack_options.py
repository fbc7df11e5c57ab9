"""The software-stack options of a search space: frameworks, torch.compile, float8, activation offload
and each stack's checkpointing policies, as they apply to one model on one cluster.

Each combination (framework, context-parallel size, compile, offload, precision, recompute) is one
``JobSpec``: ``step.evaluate`` takes these as fields of the call, not as axes of the grid
(``chunks.py`` prices one job per spec). By default the space holds every framework whose code
can run the model (``workload/stacks``: not TensorFlow's parameter servers; a traced graph: the
stacks that wrap any torch module), compile where the stack compiles, fp8 where the GPU has fp8
tensor cores and the stack float8 training, activation offload where the stack has it (pp = 1,
no recomputation: ``workload/stacks/offload.py``) and the policies the stack's ``searched`` lists.

``JobSpec.family`` groups the specs that differ only in compile, offload and recompute; its
``root`` is the one without recomputation or offload, compiled where it can be. Recomputation
only adds kernels, offload only adds copies the compute stream waits for, and compilation only
fuses memory-bound kernels (docs/explore.md), so a configuration's step is never shorter than
the same configuration's step under its family's root, less the root's exposed host work where
the stack has an engine whose host work a longer backward hides (DeepSpeed: costs/engine_host.py;
each framework is its own family, see ``job_specs``):
``pruning.price_jobs`` prunes a job whose root's fastest configuration cannot enter the top rows
(tests/test_search_stacks.py checks the order configuration by configuration).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.core.checks import check_int
from perfmodel.core.errors import InvalidInputError, PerfModelError, UnsupportedError
from perfmodel.parallel.strategy import CHUNKED_SCHEDULES, TP_COMM_OVERLAPS, Strategy, check_against
from perfmodel.parallel.zero_bubble import ZERO_BUBBLE
from perfmodel.workload import stacks
from perfmodel.workload.graph import GraphModel
from perfmodel.workload.kernels import gemm_dtype
from perfmodel.workload.stacks.checkpointing import check_recompute
from perfmodel.workload.stacks.offload import OFFLOAD_MODES, check_offload_layers
from perfmodel.workload.stack import NO_RING_ATTENTIONS

# frameworks whose code runs a transformer preset (TensorFlow 1.x parameter servers are searched by
# compare/sweep only), and those that wrap any torch module (a traced graph: eager DDP, FSDP1 as
# accelerate applies it; Megatron-LM and torchtitan run their own model code)
TRANSFORMER_FRAMEWORKS = tuple(n for n, s in stacks.STACKS.items() if s.sharding != "ps" and s.default_search)
GRAPH_FRAMEWORKS = tuple(f for f in stacks.GRAPH_FRAMEWORKS if stacks.STACKS[f].sharding != "ps")
# blocks offloaded by default besides none, as fractions of the layers (Megatron keeps one on the GPU)
OFFLOAD_FRACTIONS = (0.5, 1.0)
FLOAT8 = "fp8-mixed"


@dataclass(frozen=True)
class JobSpec:
    """One (framework, cp, compile, offload, precision, recompute, tensor-parallel overlap, ep) to price over a space."""

    framework: str
    cp: int
    compile: bool
    offload_layers: int
    precision: str
    recompute: str
    family: tuple   # (framework, cp, precision, tp_comm_overlap, schedule, extras, ep[, compile for a split backward]):
    # the specs one root bounds
    root: bool      # no recomputation, no offload, compiled where the stack compiles (but a split backward's)
    # Strategy.tp_comm_overlap ("" none): its jobs price only tp > 1 with sequence parallelism
    tp_comm_overlap: str = ""
    # the schedule of the rows with virtual stages: "interleaved", or one of torch's zero-bubble ones, whose
    # jobs price only those rows
    schedule: str = "interleaved"
    # (field, value) pairs of ``SEARCHED_FIELDS`` this job sets away from its stack's default
    extras: tuple = ()
    ep: int = 1     # the expert-parallel size (MoE)


# the tensor-parallel overlaps searched by default beside none (Strategy.tp_comm_overlap): Megatron-Core's
# --tp-comm-overlap (Transformer Engine userbuffers, TE's default SMs), the same with NeMo's per-model userbuffers
# tables, and torchtitan's async TP (compiled only)
SEARCHED_OVERLAPS = {"megatron": ("userbuffers", "userbuffers-nemo"), "torchtitan": ("async",)}
# Strategy fields the default space varies for a stack beside its default (the first value): options of its code
# that change only speed and memory, or, bf16 gradient reduction, the rounding of the reduced gradients
# (a row names the value it took; search(fixed={"grad_reduce_fp32": True}) holds fp32). fp8_params only at fp8.
# - megatron: Megatron-Core DistributedDataParallelConfig.grad_reduce_in_fp32=False (Megatron-LM core_r0.11.0
#   --main-grads-dtype bf16; NeMo MegatronMixedPrecision(grad_reduce_in_fp32=False), as NeMo's performance
#   recipes and the MLPerf submissions set it) and --fp8-param-gather (the distributed optimizer only:
#   arguments.py asserts it, so its jobs take zero >= 1)
# - torchtitan: job_config mixed_precision_reduce="bfloat16" and float8 enable_fsdp_float8_all_gather
# Each field: (its values, the default first; whether the last bounds the others configuration by configuration).
# Under FSDP2 bf16 reduction moves and keeps fewer gradient bytes, nothing else changes: its job is its family's
# root and bounds the fp32 one; torchao's float8 all-gather likewise (fewer bytes gathered and held, no forward
# weight cast). Megatron-Core's bf16 gradients are their own family (a bucket of bucket_mib holds twice the
# gradients, so fewer buckets overlap the backward and the last one, left for after it, can be longer: not a
# bound), and so are its fp8 parameters (zero >= 1 only: job_zeros).
# - megatron, MoE models only: --expert-tensor-parallel-size 1 beside its default (etp = tp): each expert whole on
#   its rank, the ep x 1 expert grid folded over a stage's tp x cp x dp ranks (Megatron-Core core_v0.12.0
#   parallel_state; the layout of DGX Cloud's DeepSeek-V3 recipes); its jobs price tp > 1 only (at tp 1 the two agree);
#   and --moe-grouped-gemm beside its default, one GEMM per local expert (core_r0.9 gpt_layer_specs.py: TEGroupedMLP
#   against SequentialMLP; NeMo's MoE recipes turn it on): not a bound, a grouped GEMM's shapes are not the loop's
SEARCHED_FIELDS = {"megatron": {"grad_reduce_fp32": ((None, False), False), "fp8_params": ((False, True), False),
                                "etp": ((None, 1), False), "grouped_experts": ((None, True), False)},
                   "torchtitan": {"grad_reduce_fp32": ((None, False), True), "fp8_params": ((False, True), True)}}
MOE_FIELDS = ("etp", "grouped_experts")  # searched only for a model with routed experts
# the chunked pipeline schedules searched by default (Strategy.schedule with virtual stages): torch's zero-bubble
# ones for torchtitan, which pipelines with torch.distributed.pipelining (parallel/zero_bubble.py)
SEARCHED_SCHEDULES = {"torchtitan": CHUNKED_SCHEDULES}


def default_frameworks(model) -> tuple:
    return GRAPH_FRAMEWORKS if isinstance(model, GraphModel) else TRANSFORMER_FRAMEWORKS


def _compile_choices(spec, compile, given: bool) -> tuple:
    if compile is None:  # both, where the stack compiles
        return (False, True) if spec.compiles else (False,)
    values = (compile,) if isinstance(compile, bool) else tuple(bool(v) for v in compile)
    if not values:
        raise InvalidInputError("'compile' must list at least one value: got an empty list")
    if given:
        for v in values:
            stacks.check_stack_options(spec.name, recompute="none", compile=v)
    return tuple(dict.fromkeys(v for v in values if spec.compiles or not v))


DEFAULT_PRECISIONS = ("bf16-mixed", "fp16-mixed", "fp32")  # most preferred first (mixed_precision)


def _precision_choices(spec, gpu, precision, given: bool = False) -> tuple:
    if precision is not None:  # fp8 only where the stack has fp8 linears (an error if a framework asked for takes none)
        kept = tuple(p for p in precision if p != FLOAT8 or spec.float8)
        if given and not kept:
            stacks.check_stack_options(spec.name, recompute="none", precision=FLOAT8)
        return kept
    fp8 = spec.float8 and gemm_dtype(FLOAT8) in gpu.peak_flops
    return (mixed_precision(gpu), FLOAT8) if fp8 else (mixed_precision(gpu),)


def mixed_precision(gpu) -> str:
    """The precision a search tries by default on ``gpu``: bf16 autocast where its tensor cores take bf16, else fp16
    autocast (V100, T4, P100's 2x fp16 rate), else fp32 (a K80)."""
    return next((p for p in DEFAULT_PRECISIONS if gemm_dtype(p) in gpu.peak_flops), "fp32")


def _recompute_choices(spec, recompute, given: bool) -> tuple:
    if recompute is None:
        return tuple(spec.searched)
    for r in recompute:
        check_recompute(r)
        if given:  # a framework asked for: a policy it lacks is an error naming the stacks that have it
            stacks.check_stack_options(spec.name, recompute=r)
    return tuple(r for r in recompute if ("every-k" if r.startswith("every-") else r) in spec.recompute)


def _offload_choices(spec, model, offload, given: bool) -> tuple:
    layers = int(getattr(model, "layers", 0) or 0)
    if spec.name not in OFFLOAD_MODES or isinstance(model, GraphModel):
        if given and offload is not None and any(offload):
            raise UnsupportedError(f"'offload_layers'={list(offload)} does not apply to framework={spec.name!r}; "
                                   f"stacks that take it: {', '.join(OFFLOAD_MODES)}")
        return (0,)
    if offload is None:
        most = layers - 1 if spec.name == "megatron" else layers
        return tuple(dict.fromkeys([0, *(min(most, max(1, round(f * layers))) for f in OFFLOAD_FRACTIONS)]))
    for k in offload:
        check_offload_layers(spec.name, check_int("offload_layers", k, minimum=0), layers)
    return tuple(dict.fromkeys(int(k) for k in offload))


def layouts(model, cl, st: dict, cp_fixed: bool, ep_fixed: bool = True) -> list:
    """The (context-parallel, expert-parallel) sizes of ``st["cp"]`` × ``st["ep"]`` that ``cl`` and ``model`` allow.

    A tuple keeps those the cluster and model allow (cp divides the GPUs, the sequence splits into 2 × cp
    chunks; ep divides the experts and the GPUs), as the space keeps only the tp that divide the GPUs; a single
    value that does not fit (``cp_fixed``, ``ep_fixed``) is an error. Both above 1 only where cp was asked for as
    one value: expert parallelism takes its ranks from the data-parallel ones, which context parallelism divides.
    """
    pairs, refused = [], None
    for cp, ep in ((cp, ep) for cp in st["cp"] for ep in st["ep"]):
        if cl.n_gpus % cp:
            if cp_fixed:
                raise InvalidInputError(f"'cp'={cp} must divide the GPU count {cl.n_gpus} of {cl.name}")
            continue
        if cp > 1 and ep > 1 and not cp_fixed:
            continue
        if cp > 1 or ep > 1:  # the sequence (2·cp chunks) and expert rules, once, on the simplest layout
            try:
                check_against(model, cl.n_gpus, Strategy(dp=cl.n_gpus // cp, cp=cp, ep=ep, micro_batch=1))
            except PerfModelError as e:
                if (cp_fixed or cp == 1) and (ep_fixed or ep == 1):
                    raise
                refused = e
                continue
        pairs.append((cp, ep))
    if not pairs and refused is not None:  # every size asked for refused: say why, for the last of them
        raise refused
    return pairs


def runs_ring(framework: str, attention: str | None) -> bool:
    """Whether context parallelism can take ``attention`` (None: the framework's own) as a ring of blocks."""
    return (attention or stacks.stack(framework).default_attention) not in NO_RING_ATTENTIONS


def job_specs(model, cl, options: dict, pairs: list) -> list[JobSpec]:
    """Every (framework, cp, ep, compile, offload, precision, recompute) of the space on ``cl``, in
    enumeration order; ``pairs``: the (cp, ep) sizes (:func:`layouts`). ``options``: framework (a tuple, or None
    for the default), compile, precision, recompute and offload_layers as ``search`` received them (None: default)."""
    given = options["framework"] is not None
    frameworks = options["framework"] if given else default_frameworks(model)
    tp_can_split = cl.gpus_per_node > 1 and not isinstance(model, GraphModel)
    out = []
    for cp, ep in pairs:
        moe = moe_fields(model, ep, tp_can_split)
        for fw in frameworks:
            spec = stacks.stack(fw)
            if cp > 1 and not runs_ring(fw, options.get("attention")):
                continue  # its attention runs no ring (Megatron-DeepSpeed's CoreAttention by default)
            compiles = _compile_choices(spec, options["compile"], given)
            policies = _recompute_choices(spec, options["recompute"], given)
            offloads = _offload_choices(spec, model, options["offload_layers"], given)
            precisions = _precision_choices(spec, cl.gpu, options["precision"], given)
            # each stack is its own family: Megatron-DeepSpeed reduces 16-bit gradients where Megatron-LM
            # reduces fp32 ones (parallel/deepspeed.py), so Megatron-LM's root does not bound it
            under = fw
            for c, k, p in ((c, k, p) for c in compiles for k in offloads for p in precisions):
                for o, sch, (x, x_family, x_root) in (
                        (o, sch, x) for o in _overlap_choices(fw, c, options.get("tp_comm_overlap"), tp_can_split)
                        for sch in _schedule_choices(fw, k, options.get("schedule"))
                        for x in extra_choices(fw, p, options.get("fixed") or {}, moe)):
                    # compiled blocks run a split backward twice (parallel/zero_bubble.py): there compiling can
                    # lose, so each compile setting is a family of its own, with its own root
                    split = sch in ZERO_BUBBLE
                    family = (under, cp, p, o, sch, x_family, ep) + ((c,) if split else ())
                    for r in policies if not k else [r for r in policies if r == "none"]:
                        root = under == fw and r == "none" and not k and (split or c == max(compiles)) and x_root
                        out.append(JobSpec(fw, cp, c, k, p, r, family, root, o, sch, x, ep))
    return out


def moe_fields(model, ep: int, tp_can_split: bool) -> tuple:
    """The ``MOE_FIELDS`` a job at expert-parallel size ``ep`` varies: none for a dense model; a folded expert grid
    where a tensor group can form; grouped GEMMs where a rank holds several experts (with one, the two agree)."""
    experts = getattr(model, "experts", 1)
    if experts <= 1:
        return ()
    return tuple(f for f in MOE_FIELDS if (f != "etp" or tp_can_split) and (f != "grouped_experts" or experts // ep > 1))


def extra_choices(fw: str, precision: str, fixed: dict, moe: tuple = ()) -> list[tuple]:
    """The ``SEARCHED_FIELDS`` settings of framework ``fw`` at ``precision``, each (the (field, value) pairs it
    sets away from the stack's default; those that name its family; whether it can be its family's root: each
    bounding field at its last value); a field in ``fixed`` is held, not varied; of ``MOE_FIELDS`` those in ``moe``
    (what a model with routed experts takes)."""
    settings = [((), (), True)]
    for name, (values, bounds) in SEARCHED_FIELDS.get(fw, {}).items():
        if name in fixed or (name == "fp8_params" and precision != FLOAT8) or (name in MOE_FIELDS and name not in moe):
            continue
        settings = [(x + (((name, v),) if v != values[0] else ()), family + ((name, v),) * (not bounds),
                     root and (v == values[-1] or not bounds)) for x, family, root in settings for v in values]
    return settings


def searched_fields(specs) -> dict:
    """The ``SEARCHED_FIELDS`` some job of ``specs`` sets, with the default each other job's row shows."""
    return {name: SEARCHED_FIELDS[s.framework][name][0][0] for s in specs for name, _ in s.extras}


def job_zeros(spec: JobSpec, zeros: tuple, fixed: dict) -> tuple:
    """The ZeRO stages a job's space takes: Megatron-Core gathers fp8 parameters only under its distributed
    optimizer (zero >= 1; Megatron-LM core_r0.9.0 megatron/training/arguments.py asserts it)."""
    fp8_params = dict(spec.extras).get("fp8_params", fixed.get("fp8_params", False))
    if fp8_params and stacks.stack(spec.framework).sharding == "megatron":
        return tuple(z for z in zeros if z >= 1)
    return zeros


def _schedule_choices(fw: str, offload: int, asked) -> tuple:
    """The chunked schedules to try for framework ``fw`` (``SEARCHED_SCHEDULES``; "interleaved" elsewhere);
    ``asked`` keeps those the stack runs. Offload runs without pipelining: interleaved only (nothing to chunk),
    and none where ``asked`` leaves it out (a list of chunked schedules alone prices pipelined rows only)."""
    runs = SEARCHED_SCHEDULES.get(fw, ("interleaved",))
    if offload:
        return ("interleaved",) if asked is None or "interleaved" in asked else ()
    if asked is None:
        return runs
    return tuple(v for v in asked if v in runs)


def _overlap_choices(fw: str, compiled: bool, asked, tp_can_split: bool) -> tuple:
    """The tensor-parallel overlaps to try for framework ``fw`` ("" none): by default none and the stack's own
    (``SEARCHED_OVERLAPS``; torchtitan's async TP only compiled) where a tensor group can form; ``asked``
    (a tuple with None or "" for none) keeps those the stack takes."""
    def runs(v):  # the stack's code has it (torchtitan's async TP only compiled)
        return TP_COMM_OVERLAPS.get(v) == fw and (v != "async" or compiled)

    if asked is None:
        return ("", *(v for v in SEARCHED_OVERLAPS.get(fw, ()) if runs(v))) if tp_can_split else ("",)
    return tuple(dict.fromkeys(v or "" for v in asked if not v or runs(v)))


def check_frameworks(framework) -> tuple | None:
    """``framework`` as a tuple of known names (None: the default for the model)."""
    if framework is None:
        return None
    values = (framework,) if isinstance(framework, str) else tuple(framework)
    if not values:
        raise InvalidInputError("'framework' must list at least one value: got an empty list")
    for fw in values:
        stacks.stack(fw)
    return values
