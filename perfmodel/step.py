"""Compose kernel, collective and memory costs into a step (vectorised over configurations).

Everything here takes a ``StepConfig`` (numpy arrays for the numeric strategy
fields: dp, tp, pp, micro_batch, micro-batches, virtual stages, sharding stage,
sequence parallelism, ...) and returns arrays, so ``predict`` (one configuration)
and ``search`` (a million) run the same code and agree exactly. The parallelism
formulas live in ``perfmodel.parallel`` (pipeline, tensor, context, expert,
data); docs/distributed.md derives every formula; the one-line comments name
the sources.

Step = pipeline(forward + backward of every micro-batch, tensor-parallel
communication on the critical path) + point-to-point sends + exposed
data-parallel communication + optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from perfmodel.core.algebra import floats, is_symbolic, maximum, number, pick, to_sympy
from perfmodel.costs import offload
from perfmodel.costs.compute import copy_pricer, kernel_time, phase_time
from perfmodel.costs.host import HostCosts
from perfmodel.core.errors import PerfModelError
from perfmodel.hardware import compute_capability, tensor_core_dtypes
from perfmodel.core.frozen import FrozenDict
from perfmodel.core.memo import PLAIN_TYPES, ChainMemo, canonical, fields_key, memo_by_fields, scalar_fields
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.context import cp_comm_times, ring_kernels
from perfmodel.parallel.data import BucketCosts, DataParallelWork, dp_comm_time
from perfmodel.parallel.deepspeed import engine_exposed
from perfmodel.parallel.expert import ep_comm_times, sharded
from perfmodel.parallel.fabric import parameter_server_links
from perfmodel.parallel.pipeline import (ParamCounts, PhaseTimes, p2p_time, pipeline_time, reruns_backward,
                                         splits_every_backward, stages, zero_bubble)
from perfmodel.parallel.placement import expert_grid, layout
from perfmodel.parallel.zero_bubble import weight_groups
from perfmodel.parallel.stage_memory import activation_terms, memory_terms, vocab_multiple
from perfmodel.parallel.stragglers import FLEET_SPREAD, device_spread, lagged_seconds, slowest_device_lag
from perfmodel.parallel.tensor import tp_comm_times
from perfmodel.parallel.tp_overlap import UB_PIPELINE_SPLITS
from perfmodel.parallel.wire import activation_bytes, wire_bytes
from perfmodel.workload import kernels as steps
from perfmodel.workload.ops import Kernel, mem as mem_kernel
from perfmodel.workload.stack import adapt_kernels
from perfmodel.workload.stacks import megatron_code
from perfmodel.workload.stacks.experts import group_expert_kernels, grouped_experts

def param_counts(model, c: StepConfig | None = None, ep=1) -> ParamCounts:
    """Parameter counts by part (``ParamCounts``).

    With a configuration ``c`` the vocabulary rows are those the framework allocates
    (Megatron-LM pads them, ``steps.vocab_shard``), per configuration; with expert
    parallelism (``ep``) a layer holds experts/ep of its experts.
    """
    if hasattr(model, "param_parts"):  # workloads other than the transformer builder's (no experts)
        return ParamCounts(**model.param_parts())
    lp, share = model.layer_params(), model.moe_share  # per average block: dense ones hold dense_ffn's MLP
    dense = (1 - share) * (model.dense_mlp_params - lp["mlp"])
    layer = float(sum(lp.values())) + dense
    h = model.hidden
    moe_gemms = (model.experts * model.mlp_weights(model.ffn_hidden) + (h * model.experts if model.experts > 1 else 0)
                 + model.mlp_weights(model.shared_ffn) + h * int(model.shared_gate))  # a dense model: its one MLP
    gemm_layer = float(model.attention_in_weights + model.attn_width * h + share * moe_gemms
                       + (1 - share) * model.mlp_weights(model.dense_ffn))
    pad = 0.0
    if c is not None:
        multiple = vocab_multiple(c.framework)
        pad = (steps.vocab_shard(model.vocab, c.tp, multiple) * floats(c.tp) - model.vocab) * h
    # expert parallelism: a rank holds experts/ep of each MoE layer's experts (the router and a shared expert stay),
    # split over etp ranks: counted here x tp/etp, so the callers' division by tp leaves the etp split
    fold = 1.0 if c is None else c.expert_fold
    experts = share * float(lp["mlp"] - h * model.experts - model.shared_params) if model.experts > 1 else 0.0
    expert_layer = experts / ep * fold
    layer = layer - experts + expert_layer
    gemm_layer = gemm_layer - share * (model.experts - model.experts / ep * fold) * model.mlp_weights(model.ffn_hidden)
    head_gemm = float(model.vocab * h) + pad  # a tied matrix is still cast for the LM head GEMM
    return ParamCounts(layer=layer, embed=float(model.embedding_params) + pad,
                       head=float(model.head_params) + (0.0 if model.tied_embeddings else pad),
                       gemm_layer=gemm_layer, gemm_head=head_gemm, expert_layer=expert_layer)


# --- compute ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ComputeTimes:
    """Per-micro-batch wall, GPU and host seconds of a layer, the embedding and the head by phase; ring GPU s; FLOPs."""

    wall: PhaseTimes
    gpu: PhaseTimes
    ring_gpu: tuple
    layer_flops_f: np.ndarray | float
    layer_attn_flops_f: np.ndarray | float
    layer_flops_b: np.ndarray | float
    head_flops: np.ndarray | float
    layer_recompute_flops: np.ndarray | float = 0.0  # FLOPs of the backward's recomputed kernels
    tp_gemms: tuple = ()  # (name, GPU seconds) of each tensor-parallel linear's GEMMs in one block
    cpu: PhaseTimes | None = None  # host seconds issuing each part (None: not priced)
    layer_recompute: tuple = (0.0, 0.0)  # (wall, GPU) seconds of a layer backward's recomputed forward kernels

    def tp_gemm(self, name):
        return dict(self.tp_gemms).get(name, 0.0)


def _flops(kernels):
    return sum(k.flops * floats(k.count) for k in kernels)


def kernel_lists(model, c: StepConfig, precision, recompute, gpu_name: str = ""):
    """Kernels of a layer, the embedding and the head (forward, backward), and the ring's (``ring_kernels``).

    ``gpu_name``: the profile's GPU, whose tensor cores decide which fp32 convolutions run as tf32 and which
    convolutions an NCHW layout transposes (``c.memory_format``; workload/stack.py ``adapt_kernels``)."""
    stack = {"precision": precision, "framework": c.framework, "attention": c.attention, "compiled": c.compile,
             "loss": "eager" if c.loss == "chunked" else c.loss, "tensor_cores": tensor_core_dtypes(gpu_name),
             "memory_format": c.memory_format, "norm_kernels": c.norm_kernels, "float8_recipe": c.float8_recipe,
             "fp8_params": c.fp8_params, "cp": c.cp}
    multiple = vocab_multiple(c.framework)
    layer = steps.layer_kernels(model, c.micro_batch, tp=c.tp, sp=c.sequence_parallel, precision=precision,
                                recompute=recompute, ep=c.ep, etp=c.etp)
    if getattr(model, "experts", 1) > 1 and grouped_experts(c.grouped_experts, c.framework, compute_capability(gpu_name),
                                                            gpu_name):
        layer = tuple(group_expert_kernels(ks, model.experts // c.ep) for ks in layer)
    lf, lb = (adapt_kernels(ks, **stack) for ks in layer)
    ring = ring_kernels(lf, lb, c.cp, bool(getattr(model, "causal", True)), c.framework, c.cp_comm)
    ef, eb = (adapt_kernels(ks, **stack) for ks in steps.embedding_kernels(
        model, c.micro_batch, tp=c.tp, precision=precision, vocab_multiple=multiple))
    hf, hb = (adapt_kernels(ks, **stack) for ks in steps.head_kernels(
        model, c.micro_batch, tp=c.tp, sp=c.sequence_parallel, precision=precision, vocab_multiple=multiple))
    return {"layer_f": lf + ring[0], "layer_b": lb + ring[1], "embed_f": ef, "embed_b": eb, "head_f": hf,
            "head_b": hb}, ring


# the StepConfig fields kernel_lists reads
COMPUTE_FIELDS = ("micro_batch", "tp", "sequence_parallel", "framework", "attention", "compile", "loss", "cp", "ep", "cp_comm",
                  "memory_format", "norm_kernels", "float8_recipe", "fp8_params", "tp_comm_overlap", "grouped_experts", "etp")


@memo_by_fields(COMPUTE_FIELDS)
def compute_times(model, profile, c: StepConfig, *, precision, recompute) -> ComputeTimes:
    """Per-micro-batch wall/GPU seconds of a layer, the embedding and the head, fwd and bwd.

    ``model`` is what one rank computes: with context parallelism (``c.cp`` > 1) its sequence
    is the rank's s/cp tokens, and the ring's other attention blocks are added (``ring_attention``).
    """
    parts, ring = kernel_lists(model, c, precision, recompute, profile.gpu)
    wall, gpu, cpu = {}, {}, {}
    for name, ks in parts.items():
        wall[name], gpu[name], cpu[name] = phase_time(profile, ks) if ks else (0.0, 0.0, 0.0)
    ring_gpu = tuple(phase_time(profile, ks)[1] if ks else 0.0 for ks in ring)
    lf = parts["layer_f"]
    return ComputeTimes(
        wall=PhaseTimes(**wall), gpu=PhaseTimes(**gpu), ring_gpu=ring_gpu, layer_flops_f=_flops(lf),
        layer_attn_flops_f=sum(k.flops * floats(k.count) for k in lf
                               if k.cls == "sdpa" or k.name.startswith("attn.sdpa.")),
        layer_flops_b=_flops(parts["layer_b"]), head_flops=_flops(parts["head_f"] + parts["head_b"]),
        layer_recompute_flops=sum(k.flops * floats(k.count) for k in parts["layer_b"]
                                  if ".recompute" in k.name),
        tp_gemms=_linear_gemm_times(profile, lf + parts["layer_b"], c.tp if c.tp_comm_overlap else None),
        cpu=PhaseTimes(**cpu), layer_recompute=_recompute_seconds(profile, parts["layer_b"]))


def _recompute_seconds(profile, backward) -> tuple:
    """(wall, GPU) seconds of the recomputed forward kernels in a layer's backward (0, 0 without recomputation)."""
    again = [k for k in backward if ".recompute" in k.name]
    return phase_time(profile, again)[:2] if again else (0.0, 0.0)


def _linear_gemm_times(profile, kernels, chunks=None) -> tuple:
    """GPU seconds of each tensor-parallel linear's GEMMs (forward, dgrad, wgrad) in one block.

    ``chunks``: the tensor-parallel size when the GEMMs run in chunks beside their collectives
    (``parallel/tp_overlap.py``); then also ``<name>@ring``, the GEMM as tp chunks of its tokens
    (Transformer Engine ``CommOverlapP2PBase::split_overlap_ag``, torch's fused all-gather/reduce-scatter
    matmuls), and ``<name>@split``, as ``UB_PIPELINE_SPLITS`` chunks of its output features
    (``CommOverlapBase::split_overlap_rs``; TransformerEngine v2.1 ``comm_gemm_overlap.cpp``): one GEMM
    per chunk, each less efficient than the whole.
    """
    out = {}
    for k in kernels:
        base = k.name.replace("attn.", "").replace("mlp.", "")
        if k.cls == "gemm" and base.split(".")[0] in ("qkv", "proj", "fc1", "fc2") and ".recompute" not in k.name:
            count = floats(k.count)
            out[base] = out.get(base, 0.0) + kernel_time(profile, k)[0] * count
            if chunks is None or base.endswith(".wgrad"):  # the overlaps chunk forward and dgrad GEMMs only
                continue
            tp = floats(chunks)
            ring = replace(k, size={**k.size, "m": np.divide(k.size["m"], tp)}, flops=np.divide(k.flops, tp))
            split = replace(k, size={**k.size, "n": np.divide(k.size["n"], UB_PIPELINE_SPLITS)},
                            flops=np.divide(k.flops, UB_PIPELINE_SPLITS))
            out[base + "@ring"] = out.get(base + "@ring", 0.0) + tp * kernel_time(profile, ring)[0] * count
            out[base + "@split"] = out.get(base + "@split", 0.0) + \
                UB_PIPELINE_SPLITS * kernel_time(profile, split)[0] * count
    return tuple(out.items())


def step_flops(model, t: ComputeTimes, recompute):
    """(model FLOPs, executed FLOPs) of one micro-batch on one tensor-parallel GPU.

    Narayanan et al. 2021, eq. 3 convention: forward FLOPs from the layer shapes
    (2·m·n·k per GEMM, 4·b·s²·h attention), backward twice the forward, the LM head
    forward + backward; but causal attention counts the s(s+1)/2 scores it computes,
    not the full s² (a causal kernel skips the masked half, and its time is priced
    so: counting s² gave MFU above 100% at long sequences); docs/model.md. Executed
    FLOPs add the recomputed forward (all of it under full recompute, the attention
    core under selective, Korthikanti et al. 2022 §5). Model FLOPs (no recompute) give MFU.
    """
    attn = floats(t.layer_attn_flops_f)
    seq = float(getattr(model, "seq", 1))
    masked = attn * (1.0 - (seq + 1.0) / (2.0 * seq)) if getattr(model, "causal", False) else 0.0
    fwd = floats(t.layer_flops_f) - masked
    recomputed = {"none": 0.0, "full": fwd, "selective": attn - masked}.get(
        recompute, t.layer_recompute_flops)  # selective-op, every-k: the repeated kernels' FLOPs
    model_flops = model.layers * 3.0 * fwd + t.head_flops
    return model_flops, model_flops + model.layers * recomputed


# --- optimizer -----------------------------------------------------------------------------------


def optimizer_time(profile, c: StepConfig, stage_params, shard_ranks, *, optimizer, precision,
                   expert_params=0.0):
    """Optimizer step + gradient-accumulation adds (+ fp16 loss-scale unscale) per step.

    pytorch: autograd adds each micro-batch's .grad into the last (m − 1 adds).
    megatron: the weight-gradient GEMM accumulates into fp32 main_grad itself
    (gradient_accumulation_fusion), and after the update the optimizer writes the
    16-bit copy of its (shard of the) master weights once. ``expert_params`` of the
    stage shard over shard_ranks / ep (expert parallelism). ``c.micro_batches`` may be a
    sympy symbol (``perfmodel.analysis.symbolic``).
    """
    local = sharded(stage_params, expert_params, shard_ranks, c.ep, c.shard_stage >= 1, c.expert_fold)
    accumulated = sharded(stage_params, expert_params, shard_ranks, c.ep, c.shard_stage >= 2, c.expert_fold)
    kernels = [Kernel("optimizer", optimizer, "opt", {"params": local}, 1, 0.0, "fwd", "fp32")]
    if megatron_code(c.framework) and steps.is_mixed(precision):
        kernels.append(mem_kernel("master_to_model", "cast_fp32_to_bf16", "opt", local, variant="fwd"))
    else:
        kernels.append(mem_kernel("grad_accumulate", "add", "opt", accumulated,
                                  count=maximum(c.micro_batches - 1, 0), variant="fwd"))
    if precision == "fp16-mixed":  # GradScaler: unscale and inf check over every gradient
        kernels += [mem_kernel("unscale", "scale", "opt", local, variant="fwd"),
                    mem_kernel("inf_check", "sum", "opt", local, variant="fwd")]
    total = 0.0
    for k in kernels:
        g, _ = kernel_time(profile, k)
        count = number(k.count)
        total = total + (to_sympy(g) if is_symbolic(count) else g) * count
    # the step's own host work (zero_grad, optimizer bookkeeping) on a CPU
    return total + HostCosts.of(profile).step_extra_s


def stages_optimizer_time(profile, c: StepConfig, sts, p: ParamCounts, shard_ranks, *, optimizer, precision):
    """Optimizer seconds of the slowest stage: every stage updates its own parameters."""
    opt = 0.0
    for st in sts:
        this = optimizer_time(profile, c, st.params(p, c.tp), shard_ranks, optimizer=optimizer,
                              precision=precision, expert_params=st.layers * p.expert_layer / c.tp)
        opt = np.maximum(opt, pick(st.valid, this, 0.0))
    return opt


# --- the step ----------------------------------------------------------------------------------------


def bucket_costs(profile) -> BucketCosts:
    """DDP's bucket costs on this profile's host: its copy passes and, on a CPU, the measured extra."""
    return BucketCosts(copy_s=copy_pricer(profile), extra_s=HostCosts.of(profile).ddp_bucket_extra_s)


def dp_backward_windows(profile, timed: PhaseTimes, sts):
    """Each stage's backward seconds that data-parallel communication can overlap. On a CPU host
    gloo's transfers run on the cores the backward pass occupies: nothing hides them (measured,
    docs/distributed.md: DDP with overlap took as long as backward then one all-reduce)."""
    hides = not HostCosts.of(profile).serial
    return tuple(timed.on(st, "b") if hides else 0.0 for st in sts)


def _critical_comm(local, coll, lay, c, t: ComputeTimes, *, precision, recompute, sms, slowdown=0.0) -> PhaseTimes:
    """Tensor-, context- and expert-parallel seconds on the critical path, per micro-batch."""
    comm = tp_comm_times(local, coll, lay, c, precision=precision, recompute=recompute, hidden_by=t.gpu.layer_f,
                         gemms=t, sms=sms, slowdown=slowdown)
    comm = comm + cp_comm_times(local, coll, lay, c, precision=precision, recompute=recompute, ring_gpu_s=t.ring_gpu)
    return comm + ep_comm_times(local, coll, lay, c, precision=precision, recompute=recompute)


def evaluate(model, cluster, profile, coll, c: StepConfig, *, precision, recompute, optimizer,
             placement="tp-pp-dp", known=None):
    """All step quantities for the configurations ``c`` (``step_quantities``), as a dict the caller may change."""
    out = step_quantities(model, cluster, profile, coll, c, precision=precision, recompute=recompute,
                          optimizer=optimizer, placement=placement, known=known)
    return {**out, "memory": dict(out["memory"])}


def step_quantities(model, cluster, profile, coll, c: StepConfig, *, precision, recompute, optimizer,
                    placement="tp-pp-dp", known=None):
    """All step quantities for the configurations ``c``, as one read-only mapping.

    One configuration (0-d fields, ``predict``) prices each piece once per what it depends on
    (``_PIECES``: the pieces before it by identity, the StepConfig fields it reads by value), the
    mapping included: the same object while its pieces stand (``predict`` keys on its identity);
    arrays of configurations (``search``) run straight through the same functions, but for the pieces ``known`` holds (shape, compute, critical, first_dp: those calls' results for these very configurations, explore/chunks.py's floors).
    """
    if not isinstance(c, StepConfig):
        raise PerfModelError(f"'c' must be a perfmodel.parallel.config.StepConfig: got {type(c).__name__}")
    one, one_dp = _values(c)  # the fields as plain values (c, and dp × cp); None for arrays of configurations
    same = canonical(_MODELS, model) if one is not None else None  # one object per model value
    if same is None:  # arrays of configurations, or a model that cannot be hashed: nothing is kept
        one = one_dp = None
    else:
        model = same
    gpn, known = cluster.gpus_per_node, known or {}
    lay, lay_dp, sts, p = _PIECES((model,), fields_key(one, SHAPE_FIELDS, "shape", gpn, placement),
                                  lambda: known.get("shape") or _shape(model, c, gpn, placement))
    # what one rank computes: with context parallelism its s/cp tokens of each sequence
    local = _PIECES((model,), fields_key(one, (), "local", c.cp), lambda: replace(model, seq=model.seq // c.cp)) \
        if c.cp > 1 else model
    t = _PIECES((local, profile), fields_key(one, COMPUTE_FIELDS, "compute", precision, recompute),
                lambda: known.get("compute") or compute_times(local, profile, c, precision=precision, recompute=recompute))
    sms = getattr(getattr(cluster, "gpu", None), "sm_count", 132)
    critical = _PIECES(
        (coll, lay, t, sts, local, model, profile, cluster, p), fields_key(one, CRITICAL_FIELDS, "critical", precision, recompute, sms),
        lambda: known.get("critical") or _critical_path(model, local, coll, lay, c, t, sts, precision, recompute, sms, (profile, cluster, p)))
    exposed = _PIECES(
        (coll, lay, lay_dp, p, sts, timed := critical[1], local, profile, cluster, t),
        fields_key(one_dp, EXPOSED_FIELDS, "exposed", precision, optimizer, recompute),
        lambda: _exposed(cluster, profile, coll, lay, lay_dp, c, _dp_config(one, c), p, sts, timed, local,
                         precision=precision, optimizer=optimizer, cpu=t.cpu, first=known.get("first_dp"), recompute=recompute))
    memory = _PIECES((lay_dp, sts, p, model), fields_key(one_dp, MEMORY_FIELDS, "memory", precision, recompute,
                                                         optimizer, local.seq),
                     lambda: memory_terms(model, lay_dp, _dp_config(one, c), sts, p, precision=precision,
                                          recompute=recompute, optimizer=optimizer, seq=local.seq))
    spread = device_spread(cluster)
    return _PIECES((critical, exposed, memory), fields_key(one, STEP_FIELDS, "step", spread),
                   lambda: _assemble(c, critical, exposed, memory, spread))


def slowest_pace(c: StepConfig, pipe, worst, parts: dict, spread: float = FLEET_SPREAD):
    """(pipeline s, bottleneck stage s, bubble s, ``parts`` (``_outputs``), lag) with the kernels at the
    pace of the slowest of the step's GPUs (``parallel/stragglers.py``); the optimizer is scaled by the caller."""
    lag = slowest_device_lag(c.dp * c.tp * c.pp * c.cp, spread)
    grow, host = lagged_seconds(parts["forward"] + parts["backward"], parts["host_overhead"], lag)
    bubble = pipe - c.micro_batches * worst
    # the bubble idles for other stages' kernels: it lengthens as the bottleneck stage does
    bubble = bubble * (1.0 + grow / maximum(c.micro_batches * worst, 1e-300))
    worst = worst + grow / c.micro_batches
    parts = {**parts, "forward": parts["forward"] * (1.0 + lag), "backward": parts["backward"] * (1.0 + lag),
             "host_overhead": host}
    return c.micro_batches * worst + bubble, worst, bubble, parts, lag


def _assemble(c: StepConfig, critical, exposed, memory, spread: float = FLEET_SPREAD) -> FrozenDict:
    """The step from its pieces: the pipeline (its kernels at the slowest GPU's pace, ``slowest_pace``), its
    sends, the exposed data-parallel and optimizer seconds."""
    (_, _, pipe, worst, parts), (p2p, dp_exposed, opt, engine), (peak, terms, *held) = critical, exposed, memory
    pipe, worst, bubble, parts, lag = slowest_pace(c, pipe, worst, parts, spread)
    opt = opt * (1.0 + lag)
    out = {"step_time": pipe + p2p + dp_exposed + opt + engine, "pipeline": pipe, "bottleneck_stage": worst, "p2p": p2p,
           "dp_comm": dp_exposed, "optimizer": opt, "pipeline_bubble": bubble, "slowest_device_lag": lag,
           "peak_memory": peak, "memory": FrozenDict(terms), "cp": float(c.cp)}
    # the caching allocator's bytes; the peak's moment (an index of costs.memory.PEAK_MOMENTS)
    out.update(parts, reserved_memory=held[0], required_memory=held[1], peak_moment=held[2])
    out["host_overhead"] = out["host_overhead"] + engine
    return FrozenDict(out)


# The StepConfig fields each memoised piece of ``evaluate`` reads (beyond the pieces it is given);
# tests/test_fast_predict.py checks them against the fields the pieces do read.
ALL_FIELDS = tuple(f.name for f in fields(StepConfig))
SHAPE_FIELDS = ("dp", "tp", "pp", "cp", "ep", "etp", "stage_layers", "framework", "schedule")
CRITICAL_FIELDS = ("tp", "sequence_parallel", "tp_overlap", "tp_comm_overlap", "micro_batch", "cp", "ep", "etp",
                   "framework", "micro_batches", "virtual_stages", "stage_layers", "pp", "offload_layers", "cp_comm",
                   "schedule", "compile")
# (dp is dp × cp here, as the data-parallel pieces read it)
EXPOSED_FIELDS = ("dp", "cp", "tp", "ep", "etp", "pp", "shard_stage", "bucket_bytes", "fsdp", "hybrid", "ps_servers",
                  "dp_overlap", "micro_batch", "micro_batches", "virtual_stages", "sequence_parallel", "framework",
                  "schedule", "grad_reduce_fp32", "ps_local_reduce", "fp8_params")
STEP_FIELDS = ("micro_batches", "cp", "dp", "tp", "pp")
MEMORY_FIELDS = ("dp", "tp", "pp", "ep", "etp", "micro_batch", "micro_batches", "virtual_stages", "schedule",
                 "shard_stage", "sequence_parallel", "ps_servers", "bucket_bytes", "hybrid", "fsdp", "reshard",
                 "framework", "attention", "compile", "loss", "offload_layers", "stage_layers", "grad_reduce_fp32",
                 "optimizer_states", "fp8_params", "norm_kernels", "expandable_segments")
_PIECES = ChainMemo(4096)
_MODELS = ChainMemo(256)


def _values(c: StepConfig):
    """(``c``'s fields as plain values by name, the same with dp × cp for the data-parallel pieces),
    computed once per configuration object; (None, None) for arrays of configurations and symbolic ones."""
    if type(c.dp) not in PLAIN_TYPES or type(c.micro_batches) not in PLAIN_TYPES:
        return None, None
    return _PIECES((c,), "values", lambda: _plain(c))


def _plain(c: StepConfig):
    got = scalar_fields(c, ALL_FIELDS)
    if got is None:
        return None, None
    one = dict(zip(ALL_FIELDS, got))
    return one, {**one, "dp": scalar_fields(_dp_config(one, c), ("dp",))[0]}


def _dp_config(one, c: StepConfig) -> StepConfig:
    """``c`` over the data- and context-parallel ranks together (dp × cp), once per configuration object."""
    return _PIECES((c,), None if one is None else "dpc", lambda: replace(c, dp=c.dp * c.cp))


def _shape(model, c: StepConfig, gpn, placement):
    """(placement of the groups, the same with dp × cp ranks, the pipeline stages, parameter counts)."""
    lay = layout(c.dp, c.tp, c.pp, gpn, placement, cp=c.cp, ep=c.ep, etp=expert_grid(c.framework, c.ep, c.tp, c.etp))
    return lay, {**lay, "dp": lay["dp_cp"]}, stages(model, c), param_counts(model, c, c.ep)


def _critical_path(model, local, coll, lay, c, t: ComputeTimes, sts, precision, recompute, sms, host=None):
    """(critical-path communication, compute + that communication per micro-batch, the pipeline's
    seconds, its bottleneck stage's seconds, the bottleneck stage's breakdown and FLOPs)."""
    comm = _critical_comm(local, coll, lay, c, t, precision=precision, recompute=recompute, sms=sms,
                          slowdown=HostCosts.of(host[0]).overlap_compute_slowdown if host else 0.0)
    if c.offload_layers:  # the compute stream waits for the copies it cannot hide (costs/offload.py)
        acts = activation_terms(local, c, precision=precision, recompute=recompute, seq=local.seq)["layer"]
        off = PhaseTimes(*offload.offload_seconds(*host, c, acts, c.micro_batch * local.seq, local.layers, t.wall,
                                                     precision=precision))
        t = replace(t, wall=t.wall + off, gpu=t.gpu + off)
    # (wall, GPU) seconds a split weight-gradient pass recomputes over checkpointed eager blocks
    regrouped = tuple(weight_groups(local) * x for x in t.layer_recompute)
    t, share = _split_backward(t, c, wgrad_share(t) if np.any(zero_bubble(c)) else 0.0, regrouped)
    timed = t.wall + comm
    return (comm, timed, *pipeline_time(model, timed, sts, c, share, regrouped[0]),
            _outputs(model, c, t, comm, sts, recompute))


def _split_backward(t: ComputeTimes, c: StepConfig, share, regrouped):
    """``t`` and the weight-gradient share as torch's split backward runs them where interleaved ZB or ZBV splits
    every backward (parallel/zero_bubble.py): over compiled blocks each pass runs the whole backward (twice the
    layer's backward, half of it deferred); over checkpointed eager blocks the weight-gradient pass recomputes the
    forward once per weight group (``regrouped``: those recomputations' wall and GPU seconds, deferred with the
    weight gradients)."""
    rerun, split = reruns_backward(c), splits_every_backward(c)
    again = pick(rerun, 1.0, 0.0)
    eager = np.logical_and(split, np.logical_not(rerun))
    wall_r, gpu_r = (pick(eager, x, 0.0) for x in regrouped)
    if not (np.any(rerun) or np.any(wall_r)):
        return t, share
    wall_b, gpu_b = t.wall.layer_b, t.gpu.layer_b
    t = replace(t, wall=t.wall + PhaseTimes(layer_b=again * wall_b + wall_r),
                gpu=t.gpu + PhaseTimes(layer_b=again * gpu_b + gpu_r))
    deferred = (share * gpu_b + gpu_r) / np.maximum(gpu_b + gpu_r, 1e-300)
    return t, pick(rerun, 0.5, pick(split, deferred, share))


def wgrad_share(t: ComputeTimes):
    """The weight-gradient GEMMs' share of a layer's backward GPU seconds (what a zero-bubble schedule defers)."""
    w = sum(s for name, s in t.tp_gemms if name.endswith(".wgrad"))
    return np.minimum(w / np.maximum(t.gpu.layer_b, 1e-300), 1.0)


def _exposed(cluster, profile, coll, lay, lay_dp, c, dpc, p, sts, timed, local, *, precision, optimizer, cpu, first=None, recompute="none"):
    """(sends, exposed dp × cp, optimizer, engine host) seconds per step, as the stack's engine runs them (``first``: ``dp_comm_time``'s)."""
    work = DataParallelWork(p, tuple(sts), timed, dp_backward_windows(profile, timed, sts),
                            wire_bytes(precision, dpc.framework, dpc.grad_reduce_fp32),
                            HostCosts.of(profile).overlap_compute_slowdown)
    dp_exposed = dp_comm_time(coll, lay_dp, dpc, work, parameter_server_links(cluster), bucket_costs(profile), first)
    p2p = p2p_time(coll, lay, c, activation_bytes(local, c, precision))
    opt = stages_optimizer_time(profile, c, sts, p, pick(c.hybrid, lay_dp["dp"][0], dpc.dp),
                                optimizer=optimizer, precision=precision)
    return engine_exposed(profile, coll, lay, lay_dp, c, dpc, work, local, (p2p, dp_exposed, opt), precision=precision, cpu=cpu, recompute=recompute)


def _outputs(model, c: StepConfig, t: ComputeTimes, comm: PhaseTimes, sts, recompute) -> dict:
    """Breakdown of the bottleneck stage (its m micro-batches + bubble + the rest = the step)."""
    best = None
    for st in sts:
        fwd_gpu = t.gpu.on(st, "f")
        bwd_gpu = t.gpu.on(st, "b")
        wall = t.wall.on(st)
        tp_share = st.layers * (comm.layer_f + comm.layer_b) + pick(st.embed, comm.embed_f + comm.embed_b, 0.0) + pick(
            st.head, comm.head_f + comm.head_b, 0.0)
        this = {"fb": pick(st.valid, wall + tp_share, -1.0), "forward": fwd_gpu, "backward": bwd_gpu,
                "host_overhead": np.maximum(wall - fwd_gpu - bwd_gpu, 0.0), "tp_comm": tp_share}
        if best is None:
            best = this
        else:
            worse = this["fb"] > best["fb"]
            best = {k: pick(worse, this[k], best[k]) for k in best}
    model_flops, hw_flops = step_flops(model, t, recompute)
    out = {k: c.micro_batches * best[k] for k in ("forward", "backward", "host_overhead", "tp_comm")}
    out.update({
        "head_share": pick(c.pp == 1, t.wall.head_f + t.wall.head_b, 0.0),
        "layer_flops_f": t.layer_flops_f, "layer_flops_b": t.layer_flops_b, "head_flops": t.head_flops,
        "layer_attn_flops_f": t.layer_attn_flops_f, "model_flops_mb": model_flops, "hw_flops_mb": hw_flops,
        "tp": c.tp,
    })
    return out
