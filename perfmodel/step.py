"""Compose kernel, collective and memory costs into a step (vectorised over configurations).

Everything here takes numpy arrays for the numeric strategy fields (dp, tp,
pp, micro_batch, micro-batches, virtual stages, ZeRO stage, sequence
parallelism, ...) and returns arrays, so ``predict`` (one configuration) and
``search`` (a million) run the same code and agree exactly. docs/distributed.md
derives every formula; the one-line comments name the sources.

Step = pipeline(forward + backward of every micro-batch, tensor-parallel
communication on the critical path) + point-to-point sends + exposed
data-parallel communication + optimizer.

``c`` keys: dp, tp, pp, micro_batch, m (micro-batches per step per data-parallel
rank), v (virtual stages), zero (0-3), sp (sequence parallel), ps (parameter
servers), bucket (DDP bucket bytes), hybrid (FSDP hybrid sharding), schedule
(0 1f1b, 1 gpipe, 2 interleaved), tp_overlap (Megatron-LM asynchronous
tensor-parallel communication in backward). Optional keys that hold one value
for every configuration: stage_layers (a tuple, layers per pipeline stage, for
one pp), framework ("pytorch" | "megatron"), attention ("flash" |
"unfused"; see ``perfmodel.workload.stack.adapt_kernels``), cp and ep (the
context- and expert-parallel sizes).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from perfmodel.costs import memory as mem, stack_memory
from perfmodel.costs.comm import collective_time, hierarchical_time, lookup_entry
from perfmodel.costs.compute import kernel_time, phase_time
from perfmodel.core.errors import PerfModelError
from perfmodel.core.memo import memo_by_fields
from perfmodel.parallel.data import dp_collectives, dp_comm_time  # noqa: F401 (dp_collectives: re-exported)
from perfmodel.parallel.placement import layout, pipeline_crossings
from perfmodel.parallel.tp_overlap import overlapped_layer
from perfmodel.workload import kernels as steps
from perfmodel.workload.ops import Kernel, mem as mem_kernel
from perfmodel.workload.stack import adapt_kernels
from perfmodel.workload.stacks.checkpointing import checkpointed_share

_UB_GEMMS = tuple(f"{n}{s}" for n in ("qkv", "proj", "fc1", "fc2") for s in ("", ".dgrad", ".wgrad"))
PREFETCH_UNITS = 2  # FSDP limit_all_gathers: the unit computing and the one being gathered


def dtype_bytes(precision: str, framework: str = "pytorch") -> dict[str, float]:
    """Bytes per element that the data-parallel collectives move.

    pytorch: autocast over fp32 parameters, so .grad and the weights are fp32.
    megatron (Micikevicius et al. 2018 master weights): 16-bit weights; gradients
    accumulate in fp32 main_grad under bf16 and stay 16-bit under fp16
    (Megatron-LM arguments: accumulate_allreduce_grads_in_fp32 is forced for bf16).
    ``lo``: the activation dtype (what ZeRO-3/FSDP gathers and reduces).
    """
    lo = 2.0 if steps.is_mixed(precision) else 4.0
    if framework == "megatron" and steps.is_mixed(precision):
        return {"grad": 2.0 if precision == "fp16-mixed" else 4.0, "param": lo, "lo": lo}
    return {"grad": 4.0, "param": 4.0, "lo": lo}


def _params(model, c=None, ep=1):
    """Parameter counts by part: per layer, embedding, head, GEMM weights per layer and head.

    With a configuration ``c`` the vocabulary rows are those the framework allocates
    (Megatron-LM pads them, ``steps.vocab_shard``), per configuration; with expert
    parallelism (``ep``) a layer holds experts/ep of its experts.
    """
    if hasattr(model, "param_parts"):  # workloads other than the transformer builder's (no experts)
        return {"expert_layer": 0.0, **model.param_parts()}
    lp = model.layer_params()
    layer = float(sum(lp.values()))
    h = model.hidden
    gemm_layer = float(h * model.qkv_out + h * h + model.experts * (h * model.mlp_in_out + model.ffn_hidden * h)
                       + (h * model.experts if model.experts > 1 else 0))
    pad = 0.0
    if c is not None:
        multiple = _vocab_multiple(c.get("framework", "pytorch"))
        pad = (steps.vocab_shard(model.vocab, c["tp"], multiple) * np.asarray(c["tp"], float) - model.vocab) * h
    # expert parallelism: a rank holds experts/ep of each MoE layer's experts (the router stays whole)
    experts = float(lp["mlp"] - h * model.experts) if model.experts > 1 else 0.0
    expert_layer = experts / ep
    layer = layer - experts + expert_layer
    gemm_layer = gemm_layer - (model.experts - model.experts / ep) * (h * model.mlp_in_out + model.ffn_hidden * h)
    head_gemm = float(model.vocab * h) + pad  # a tied matrix is still cast for the LM head GEMM
    return {"layer": layer, "embed": float(model.embedding_params) + pad,
            "head": float(model.head_params) + (0.0 if model.tied_embeddings else pad),
            "gemm_layer": gemm_layer, "gemm_head": head_gemm, "expert_layer": expert_layer}


def _one_value(c, key) -> int:
    """A strategy field that holds one value for every configuration priced together (cp, ep)."""
    values = np.unique(np.asarray(c.get(key, 1)))
    if values.size != 1:
        raise PerfModelError(f"configurations priced together must share {key!r}: got {sorted(values.tolist())}")
    return int(values[0])


def _one_choice(c, key, default):
    """A stack option (compile, loss) that holds one value for every configuration priced together."""
    values = np.unique(np.asarray(c.get(key, default)))
    if values.size != 1:
        raise PerfModelError(f"configurations priced together must share {key!r}: got {sorted(values.tolist())}")
    return values[0].item() if hasattr(values[0], "item") else values[0]


# --- pipeline stages ------------------------------------------------------------------------


def stage_layers(layers: int, pp):
    """Layers on the first, the fullest middle and the last stage (even split, remainder first)."""
    pp = np.asarray(pp, float)
    base = np.floor(layers / pp)
    rem = layers - base * pp
    first = base + (rem > 0)
    last = np.where(pp > 1, base, layers)
    middle = np.where(pp > 2, base + (rem > 1), 0.0)
    return first, middle, last


def stages(model, c):
    """Representative pipeline stages: dicts of layers, index, has_embed, has_head, valid.

    Even split: the first, the fullest middle and the last stage stand for all
    of them (a middle stage holds no more layers than the first and no
    embedding, so it never sets a maximum the first does not). With an explicit
    ``c["stage_layers"]`` every stage is listed.
    """
    pp = np.asarray(c["pp"], float)
    explicit = c.get("stage_layers")
    if explicit is not None:
        n = len(explicit)
        return [{"layers": float(lay), "index": float(i), "embed": i == 0, "head": i == n - 1, "valid": True}
                for i, lay in enumerate(explicit)]
    first, middle, last = stage_layers(model.layers, pp)
    single = pp == 1
    return [{"layers": first, "index": 0.0, "embed": True, "head": single, "valid": True},
            {"layers": middle, "index": 1.0, "embed": False, "head": False, "valid": pp > 2},
            {"layers": last, "index": pp - 1, "embed": False, "head": True, "valid": ~single}]


def _stage_time(st, t, key):
    """Seconds of one micro-batch on a stage: ``key`` "f", "b" or "fb"."""
    total = 0.0
    for k in key:
        total = total + st["layers"] * t[f"layer_{k}"] + np.where(st["embed"], t[f"embed_{k}"], 0.0) \
            + np.where(st["head"], t[f"head_{k}"], 0.0)
    return total


def pipeline_time(model, t, sts, c):
    """All micro-batches through the pipeline; returns (seconds, bottleneck stage seconds).

    Narayanan et al. 2021 §2.2: with m micro-batches and stage times S_s = f_s + b_s,
    T = m·max S + (Σ S − max S)/v; balanced stages give (m + (p−1)/v)(f + b), a bubble of
    (p−1)/(v·m) of the ideal time. For unequal stages the fill and the drain pass each
    stage once while the slowest stage sets the steady-state pace (PipeDream, Narayanan
    et al. 2019, §3.1). GPipe and 1F1B have the same bubble; they differ in memory.
    """
    worst = 0.0
    for st in sts:
        worst = np.maximum(worst, np.where(st["valid"], _stage_time(st, t, "fb"), 0.0))
    if c.get("stage_layers") is not None:
        everything = sum(_stage_time(st, t, "fb") for st in sts)
    else:
        everything = model.layers * (t["layer_f"] + t["layer_b"]) + t["embed_f"] + t["embed_b"] \
            + t["head_f"] + t["head_b"]
    pipe = c["m"] * worst + np.maximum(everything - worst, 0.0) / c["v"]
    return pipe, worst


# --- compute ----------------------------------------------------------------------------------


def _times(profile, kernels):
    wall, gpu, _ = phase_time(profile, kernels)
    return wall, gpu


def _flops(kernels, cls=None):
    return sum(k.flops * np.asarray(k.count, float) for k in kernels if cls is None or k.cls == cls)


def _vocab_multiple(framework):
    return steps.MEGATRON_VOCAB_MULTIPLE if framework == "megatron" else 1


def ring_attention(kernels, cp: int, causal: bool) -> list[Kernel]:
    """The attention blocks a context-parallel rank computes beyond its own (Liu et al. 2023, ring attention).

    With the sequence in 2·cp chunks, rank i holding chunks i and 2·cp − 1 − i (Megatron-Core's
    load balancing for causal masks), each rank's own q·kᵀ block is the local causal attention
    over s/cp tokens; each of the cp − 1 blocks it receives is half a full s/cp × s/cp block when
    causal, a whole one otherwise. FLOPs follow the full-s² convention, so a rank's attention
    FLOPs are 1/cp of the whole sequence's.
    """
    out = []
    for k in kernels:
        if k.cls != "sdpa" or cp <= 1:
            continue
        share = 0.5 if causal else 1.0
        out.append(Kernel(k.name + ".ring", k.cls, k.phase, {**k.size, "causal": 0.0},
                          np.multiply(k.count, (cp - 1) * share), np.divide(k.flops, share), k.variant, k.dtype))
    return out


@memo_by_fields(("micro_batch", "tp", "sp", "framework", "attention", "compile", "loss"))  # the entries of c it reads
def compute_times(model, profile, c, *, precision, recompute, cp=1, ep=1):
    """Per-micro-batch wall/GPU seconds of a layer, the embedding and the head, fwd and bwd.

    ``model`` is what one rank computes: with context parallelism (``cp`` > 1) its sequence
    is the rank's s/cp tokens, and the ring's other attention blocks are added (``ring_attention``).
    """
    stack = {"precision": precision, "framework": c.get("framework", "pytorch"),
             "attention": c.get("attention", "flash"), "compiled": _one_choice(c, "compile", False),
             "loss": "eager" if _one_choice(c, "loss", "eager") == "chunked" else _one_choice(c, "loss", "eager")}
    multiple = _vocab_multiple(stack["framework"])
    lf, lb = (adapt_kernels(ks, **stack) for ks in steps.layer_kernels(
        model, c["micro_batch"], tp=c["tp"], sp=c["sp"], precision=precision, recompute=recompute, ep=ep))
    causal = bool(getattr(model, "causal", True))
    ring_f, ring_b = ring_attention(lf, cp, causal), ring_attention(lb, cp, causal)
    lf, lb = lf + ring_f, lb + ring_b
    ef, eb = (adapt_kernels(ks, **stack) for ks in steps.embedding_kernels(
        model, c["micro_batch"], tp=c["tp"], precision=precision, vocab_multiple=multiple))
    hf, hb = (adapt_kernels(ks, **stack) for ks in steps.head_kernels(
        model, c["micro_batch"], tp=c["tp"], sp=c["sp"], precision=precision, vocab_multiple=multiple))
    out = {}
    for name, ks in (("layer_f", lf), ("layer_b", lb), ("embed_f", ef), ("embed_b", eb), ("head_f", hf), ("head_b", hb),
                     ("ring_f", ring_f), ("ring_b", ring_b)):
        out[name], out[name + "_gpu"] = _times(profile, ks) if ks else (0.0, 0.0)
    out["layer_flops_f"] = _flops(lf)
    out["layer_attn_flops_f"] = sum(k.flops * np.asarray(k.count, float) for k in lf
                                    if k.cls == "sdpa" or k.name.startswith("attn.sdpa."))
    out["layer_flops_b"] = _flops(lb)
    out["tp_gemms"] = _linear_gemm_times(profile, lf + lb)
    out["layer_recompute_flops"] = sum(k.flops * np.asarray(k.count, float) for k in lb if ".recompute" in k.name)
    out["head_flops"] = _flops(hf + hb)
    return out


def _linear_gemm_times(profile, kernels) -> dict:
    """GPU seconds of each tensor-parallel linear's GEMMs (forward, dgrad, wgrad) in one block."""
    out = {}
    for k in kernels:
        base = k.name.replace("attn.", "").replace("mlp.", "")
        if k.cls == "gemm" and base.split(".")[0] in ("qkv", "proj", "fc1", "fc2") and ".recompute" not in k.name:
            out[base] = out.get(base, 0.0) + kernel_time(profile, k)[0] * np.asarray(k.count, float)
    return out


def step_flops(model, out, recompute):
    """(model FLOPs, executed FLOPs) of one micro-batch on one tensor-parallel GPU.

    Narayanan et al. 2021, eq. 3 convention: forward FLOPs from the layer shapes
    (2·m·n·k per GEMM, 4·b·s²·h attention), backward twice the forward, the LM head
    forward + backward; but causal attention counts the s(s+1)/2 scores it computes,
    not the full s² (a causal kernel skips the masked half, and its time is priced
    so: counting s² gave MFU above 100% at long sequences); docs/model.md. Executed
    FLOPs add the recomputed forward (all of it under full recompute, the attention
    core under selective, Korthikanti et al. 2022 §5). Model FLOPs (no recompute) give MFU.
    """
    attn = np.asarray(out["layer_attn_flops_f"], float)
    seq = float(getattr(model, "seq", 1))
    masked = attn * (1.0 - (seq + 1.0) / (2.0 * seq)) if getattr(model, "causal", False) else 0.0
    fwd = np.asarray(out["layer_flops_f"], float) - masked
    recomputed = {"none": 0.0, "full": fwd, "selective": attn - masked}.get(
        recompute, out.get("layer_recompute_flops", 0.0))  # selective-op, every-k: the repeated kernels' FLOPs
    model_flops = model.layers * 3.0 * fwd + out["head_flops"]
    return model_flops, model_flops + model.layers * recomputed


# --- tensor and pipeline parallel communication ------------------------------------------------


def _act_bytes(model, c, precision):
    """Bytes of one micro-batch's hidden states (b·s·h) in the activation dtype."""
    return c["micro_batch"] * model.seq * model.hidden * dtype_bytes(precision)["lo"]


def tp_comm_times(model, coll, lay, c, *, precision, recompute, t=None):
    """Tensor-parallel seconds per micro-batch on the critical path: per layer fwd/bwd, embedding, head.

    Megatron-LM (Shoeybi et al. 2019, §3): the attention and the MLP each end in an
    all-reduce of b·s·h (the g operator) and each start with one in backward (f), so
    2 forward + 2 backward per layer. Sequence parallelism (Korthikanti et al. 2022,
    §4.2.2) turns each all-reduce into an all-gather + reduce-scatter of the same
    b·s·h (same bus bytes). Full recompute re-runs the forward ones in backward.
    The vocabulary-parallel embedding all-reduces (SP: reduce-scatters) its output;
    the LM head's input gradient is all-reduced (SP: the input is all-gathered
    forward and its gradient reduce-scattered backward). With sequence parallelism
    the column-parallel layers keep their input sharded and gather it again in
    backward for the weight gradient (Korthikanti et al. 2022, §4.2.2).

    ``tp_overlap`` (Megatron-LM ``LinearWithGradAccumulationAndAsyncCommunication``):
    in backward the input-gradient all-reduce (SP: its reduce-scatter) runs while the
    weight-gradient GEMM computes, and the SP re-gather while the input-gradient GEMM
    computes; a weight-gradient GEMM takes as long as the layer's forward GEMMs, so
    each hides behind up to one forward's worth of compute. Only the gradient of the
    forward reduce-scatter (an all-gather) stays exposed under SP.
    """
    act = _act_bytes(model, c, precision)
    rpn, nodes = lay["tp"]
    ar = hierarchical_time(coll, "all_reduce", act, rpn, nodes, algorithm="ring")
    rs = hierarchical_time(coll, "reduce_scatter", act, rpn, nodes, algorithm="ring")
    ag = hierarchical_time(coll, "all_gather", act, rpn, nodes, algorithm="ring")
    on = c["tp"] > 1
    sp = np.asarray(c["sp"], bool)
    one = np.where(on, np.where(sp, rs + ag, ar), 0.0)
    fwd = 2 * one
    hidden_by = np.asarray(t["layer_f_gpu"] if t is not None else 0.0, float)
    plain = np.where(sp, 2 * (ag + rs + ag), 2 * ar)
    overlapped = np.where(sp, 2 * ag + np.maximum(2 * (rs + ag) - 2 * hidden_by, 0.0),
                          np.maximum(2 * ar - hidden_by, 0.0))
    bwd = np.where(on, np.where(np.asarray(c.get("tp_overlap", False), bool), overlapped, plain), 0.0)
    method = _one_choice(c, "tp_comm_overlap", "")
    if method and t is not None:  # TE userbuffers / torchtitan async TP (parallel/tp_overlap.py)
        ub_f, ub_b = overlapped_layer(ag, rs, {k: t["tp_gemms"].get(k, 0.0) for k in _UB_GEMMS}, c["tp"],
                                      c.get("sms", 132), method=method)
        fwd, bwd = np.where(on & sp, ub_f, fwd), np.where(on & sp, ub_b, bwd)
    bwd = bwd + fwd * checkpointed_share(recompute)  # a checkpointed block's forward collectives run again
    return {"layer_f": fwd, "layer_b": bwd, "embed_f": np.where(on, np.where(sp, rs, ar), 0.0),
            "head_f": np.where(on & sp, ag, 0.0), "head_b": np.where(on, np.where(sp, rs, ar), 0.0)}


def _sendrecv(coll, level, size):
    return collective_time(lookup_entry(coll, level, "sendrecv"), "sendrecv", size, 2)


def cp_comm_times(model, coll, lay, c, *, precision, recompute, t, cp):
    """Context-parallel ring exchange per micro-batch and layer, the part no attention block hides.

    Ring attention (Liu et al. 2023; Megatron-Core / Transformer Engine context parallelism):
    in forward each of the cp − 1 steps passes the rank's K and V chunk (2·b·(s/cp)·kv_heads·d
    elements) to the next rank while the current block computes; backward passes K, V and their
    gradients (twice the bytes) beside each backward block, after the recomputed forward ring
    when the attention core is recomputed. ``model`` holds the rank's s/cp tokens.
    """
    if cp <= 1:
        return {"layer_f": 0.0, "layer_b": 0.0}
    lo = dtype_bytes(precision)["lo"]
    kv = 2.0 * c["micro_batch"] * model.seq * model.kv_heads / c["tp"] * model.head_dim * lo
    inter = np.asarray(lay["cp"][1]) > 1  # the ring leaves the node
    send = np.where(inter, _sendrecv(coll, "inter", kv), _sendrecv(coll, "intra", kv))
    both = np.where(inter, _sendrecv(coll, "inter", 2 * kv), _sendrecv(coll, "intra", 2 * kv))
    n = cp - 1.0
    again = recompute in ("selective", "full")  # the attention core runs forward again in backward
    block_f = np.asarray(t["ring_f_gpu"], float) / n
    block_b = (np.asarray(t["ring_b_gpu"], float) - (t["ring_f_gpu"] if again else 0.0)) / n
    fwd = n * np.maximum(send - block_f, 0.0)
    return {"layer_f": fwd, "layer_b": n * np.maximum(both - block_b, 0.0) + (fwd if again else 0.0)}


def ep_comm_times(model, coll, lay, c, *, precision, recompute, ep):
    """Expert-parallel token exchange per micro-batch and MoE layer, on the critical path.

    Megatron-Core's all-to-all token dispatcher: forward dispatches each rank's routed
    tokens (tokens·top_k hidden vectors; its 1/tp sequence shard under the sequence
    parallelism MoE requires with tp > 1) to the ranks holding their experts and
    combines the results back, two all-to-alls; backward does the same with the
    gradients. Full recomputation repeats the forward pair. Not overlapped with compute.
    """
    if ep <= 1 or getattr(model, "experts", 1) <= 1:
        return {"layer_f": 0.0, "layer_b": 0.0}
    lo = dtype_bytes(precision)["lo"]
    tokens = c["micro_batch"] * model.seq / np.where(np.asarray(c["sp"], bool), c["tp"], 1.0)
    size = tokens * model.experts_per_token * model.hidden * lo
    fwd = 2.0 * hierarchical_time(coll, "all_to_all", size, *lay["ep"])
    return {"layer_f": fwd, "layer_b": fwd + (fwd if recompute == "full" else 0.0)}


def p2p_time(model, coll, lay, c, *, precision):
    """Activation and gradient sends between pipeline stages on the critical path, per step.

    Each boundary carries b·s·h forward and its gradient backward per micro-batch
    (per virtual stage with interleaving, whose communication grows by v; Narayanan
    et al. 2021, §2.2.2). With tp > 1 each of the t ranks sends 1/t and the receiver
    all-gathers over NVLink (scatter/gather optimisation, §4.1); with sequence
    parallelism the output is already split t ways. The bottleneck stage waits on
    2·m·v transfers; the fill and the drain cross every boundary once each way.
    """
    size = _act_bytes(model, c, precision) / c["tp"]
    crossings = pipeline_crossings(lay["pp"])
    boundaries = np.maximum(c["pp"] - 1.0, 0.0)
    t_intra, t_inter = _sendrecv(coll, "intra", size), _sendrecv(coll, "inter", size)
    gather = np.where((c["tp"] > 1) & ~np.asarray(c["sp"], bool),
                      hierarchical_time(coll, "all_gather", _act_bytes(model, c, precision), *lay["tp"],
                                        algorithm="ring"), 0.0)
    slowest = np.where(crossings > 0, t_inter, t_intra) + gather
    fill = crossings * t_inter + (boundaries - crossings) * t_intra + boundaries * gather
    return np.where(c["pp"] > 1, 2.0 * c["m"] * c["v"] * slowest + 2.0 * fill, 0.0)


# --- optimizer -----------------------------------------------------------------------------------


def _expert_shard_ranks(shard_ranks, ep):
    """Ranks a rank's experts shard over: the shard_ranks / ep replicas that hold the same experts."""
    return np.maximum(np.asarray(shard_ranks, float) / ep, 1.0)


def _sharded(params, expert, shard_ranks, ep, on):
    """Parameters a rank keeps where sharding is ``on``: the dense ones over ``shard_ranks``, its
    experts over ``_expert_shard_ranks``."""
    dense = params - expert
    return (dense / np.where(on, shard_ranks, 1.0)
            + expert / np.where(on, _expert_shard_ranks(shard_ranks, ep), 1.0))


def optimizer_time(profile, c, stage_params, shard_ranks, *, optimizer, precision, framework="pytorch",
                   expert_params=0.0, ep=1):
    """Optimizer step + gradient-accumulation adds (+ fp16 loss-scale unscale) per step.

    pytorch: autograd adds each micro-batch's .grad into the last (m − 1 adds).
    megatron: the weight-gradient GEMM accumulates into fp32 main_grad itself
    (gradient_accumulation_fusion), and after the update the optimizer writes the
    16-bit copy of its (shard of the) master weights once. ``expert_params`` of the
    stage shard over shard_ranks / ep (expert parallelism).
    """
    local = _sharded(stage_params, expert_params, shard_ranks, ep, c["zero"] >= 1)
    accumulated = _sharded(stage_params, expert_params, shard_ranks, ep, c["zero"] >= 2)
    kernels = [Kernel("optimizer", optimizer, "opt", {"params": local}, 1, 0.0, "fwd", "fp32")]
    if framework == "megatron" and steps.is_mixed(precision):
        kernels.append(mem_kernel("master_to_model", "cast_fp32_to_bf16", "opt", local, variant="fwd"))
    else:
        kernels.append(mem_kernel("grad_accumulate", "add", "opt", accumulated, count=np.maximum(c["m"] - 1, 0),
                                  variant="fwd"))
    if precision == "fp16-mixed":  # GradScaler: unscale and inf check over every gradient
        kernels += [mem_kernel("unscale", "scale", "opt", local, variant="fwd"),
                    mem_kernel("inf_check", "sum", "opt", local, variant="fwd")]
    total = 0.0
    for k in kernels:
        g, _ = kernel_time(profile, k)
        total = total + g * np.asarray(k.count, float)
    return total


# --- memory ----------------------------------------------------------------------------------------


def in_flight(c, index):
    """Micro-batches whose activations a stage holds at its peak.

    GPipe: all m. 1F1B: stage s (0-based) of p holds min(m, p − s) (Narayanan et al.
    2021, §2.2.1). Interleaved: the first stage holds p·(1 + (p−1)/(p·v)) chunks'
    worth (Korthikanti et al. 2022, §4.2.3), i.e. × (1 + (p−1)/(p·v)).
    """
    pp, v, m = c["pp"], c["v"], c["m"]
    f1b = np.minimum(m, np.maximum(pp - index, 1.0))
    interleave = np.where(v > 1, 1.0 + (pp - 1.0) / (pp * v), 1.0)
    return np.where(c["schedule"] == 1, m, f1b * np.where(index == 0, interleave, 1.0))


def memory_terms(model, lay, c, sts, p, *, precision, recompute, optimizer, seq=None, ep=1):
    """Peak bytes over the pipeline stages; returns (peak, terms of the fullest stage).

    ``p``: the parameter counts of ``_params``; ``seq``: the tokens of a sequence one rank
    holds (s/cp under context parallelism); ``ep``: the expert-parallel size.
    """
    tp = c["tp"]
    seq = model.seq if seq is None else seq
    tokens = c["micro_batch"] * seq
    framework = c.get("framework", "pytorch")
    nb = dtype_bytes(precision, framework)
    lo = nb["lo"]
    kw = {"framework": framework} if framework != "pytorch" else {}
    if _one_choice(c, "compile", False):
        kw["compiled"] = True
    act_layer = mem.layer_activation_bytes(model, tp=tp, sp=c["sp"], precision=precision, recompute=recompute, **kw)
    if c.get("attention", "flash") == "unfused" and recompute == "none":
        # softmax output, dropout mask and output over b·heads·s² (Korthikanti et al. 2022, eq. 1: 5as²b)
        act_layer = act_layer + 5.0 * model.heads / tp * seq
    full_layer = mem.layer_activation_bytes(model, tp=tp, sp=c["sp"], precision=precision, recompute="none", **kw)
    final = tokens * (4.0 * model.hidden + 8.0 + (2.0 * model.hidden if lo == 2.0 else 0.0))
    logits = tokens * steps.vocab_shard(model.vocab, tp, _vocab_multiple(framework))
    loss_kind = _one_choice(c, "loss", "eager")
    per_logit, per_logit_fwd = stack_memory.loss_bytes_per_logit(loss_kind, lo)
    chunked = stack_memory.chunked_loss_bytes(tokens, model.hidden, lo) if loss_kind == "chunked" else 0.0
    loss = per_logit * logits + chunked         # eager: log-softmax output, its gradient and the result, fp32
    loss_fwd = per_logit_fwd * logits + chunked  # eager: (bf16 logits +) fp32 cast + log-softmax output
    # autocast caches each cast weight until its context exits (all layers during the forward);
    # under full recomputation autograd saves only the head's, and a recomputed layer casts again
    per_copy = mem.model_state_bytes(precision, optimizer, framework)["weight_copies"]
    recompute_full = recompute == "full" or recompute == "selective-op" or recompute.startswith("every-")
    rpn, _ = lay["dp"]
    shard_ranks = np.where(c["hybrid"], rpn, c["dp"])
    tied_copy = p["embed"] if getattr(model, "tied_embeddings", False) else 0.0  # Megatron keeps it on the last stage
    best, best_terms = None, None
    for st in sts:
        head_params = np.where(st["head"], p["head"] + np.where(c["pp"] > 1, tied_copy, 0.0), 0.0)
        params = (st["layers"] * p["layer"] + np.where(st["embed"], p["embed"], 0.0) + head_params) / tp
        gemm = (st["layers"] * p["gemm_layer"] + np.where(st["head"], p["gemm_head"], 0.0)) / tp
        expert = st["layers"] * p["expert_layer"] / tp  # sharded over the replicas holding the same experts
        dense = mem.static_bytes(params - expert, gemm - expert, precision=precision, optimizer=optimizer,
                                 zero=c["zero"], dp=shard_ranks, framework=framework)
        experts = mem.static_bytes(expert, expert, precision=precision, optimizer=optimizer, zero=c["zero"],
                                   dp=_expert_shard_ranks(shard_ranks, ep), framework=framework)
        terms = {k: dense[k] + experts[k] for k in dense}
        unit = np.maximum(p["layer"], np.where(st["embed"], p["embed"], 0.0)) / tp
        terms["comm_buffers"] = mem.comm_buffer_bytes(params, unit, zero=c["zero"], dp=c["dp"], ps=c["ps"],
                                                      bucket=c["bucket"], lo=lo, prefetch=PREFETCH_UNITS,
                                                      grad_bytes=nb["grad"], framework=framework,
                                                      fsdp=c.get("fsdp", False))
        terms = stack_memory.stack_model_states(terms, framework, params, unit, shard_ranks, c, optimizer=optimizer,
                                                head=np.where(st["head"], p["head"], 0.0) / tp,
                                                embed=np.where(st["embed"], p["embed"], 0.0) / tp)
        acts = tokens * act_layer * st["layers"] * in_flight(c, st["index"])
        acts = acts + np.where(st["head"], final, 0.0) + np.where(st["embed"], tokens * 4.0 * model.hidden, 0.0)
        loss_here = np.where(st["head"], loss, 0.0)
        cache = terms["weight_copies"]
        transient = 0.0
        if recompute == "full":
            terms["weight_copies"] = np.where(np.asarray(c["zero"]) >= 3, 0.0,
                                              per_copy * np.where(st["head"], p["gemm_head"], 0.0) / tp)
        if recompute_full:  # full, selective-op, every-k: one block's forward is rebuilt in backward
            transient = np.where(st["layers"] > 0, tokens * full_layer + per_copy * p["gemm_layer"] / tp, 0.0)
        peak, terms = mem.peak_terms(terms, acts, loss_here, c["m"] > 1, cache=cache,
                                     loss_forward=np.where(st["head"], loss_fwd, 0.0), transient=transient)
        peak = np.where(st["valid"], peak, 0.0)
        if best is None:
            best, best_terms = peak, terms
        else:
            better = peak > best
            best_terms = {k: np.where(better, terms[k], best_terms[k]) for k in terms}
            best = np.maximum(best, peak)
    return best, best_terms


# --- the step ----------------------------------------------------------------------------------------


def _copy_pricer(profile):
    """Seconds of one fp32 copy of ``elements`` elements (the profile's copy class), or None."""
    try:
        profile.mem_entry("copy", "fp32", "fwd")
    except PerfModelError:
        return None

    def copy_s(elements):
        return phase_time(profile, [mem_kernel("ddp.bucket_copy", "copy", "fwd", elements, variant="fwd")])[0]
    return copy_s


def evaluate(model, cluster, profile, coll, c, *, precision, recompute, optimizer, placement="tp-pp-dp"):
    """All step quantities for configurations ``c`` (a dict of broadcastable arrays)."""
    from perfmodel.parallel.fabric import parameter_server_links

    c = dict(c)
    c.setdefault("stage_layers", None)
    c.setdefault("sms", getattr(getattr(cluster, "gpu", None), "sm_count", 132))
    framework = c.setdefault("framework", "pytorch")
    cp, ep = _one_value(c, "cp"), _one_value(c, "ep")  # one value for every configuration, like the framework
    nb = dtype_bytes(precision, framework)
    lay = layout(c["dp"], c["tp"], c["pp"], cluster.gpus_per_node, placement, cp=cp, ep=ep)
    # what one rank computes: with context parallelism its s/cp tokens of each sequence
    local = replace(model, seq=model.seq // cp) if cp > 1 else model
    t = compute_times(local, profile, c, precision=precision, recompute=recompute, cp=cp, ep=ep)
    comm = tp_comm_times(local, coll, lay, c, precision=precision, recompute=recompute, t=t)
    for extra in (cp_comm_times(local, coll, lay, c, precision=precision, recompute=recompute, t=t, cp=cp),
                  ep_comm_times(local, coll, lay, c, precision=precision, recompute=recompute, ep=ep)):
        comm["layer_f"], comm["layer_b"] = comm["layer_f"] + extra["layer_f"], comm["layer_b"] + extra["layer_b"]
    timed = {k: t[k] + comm.get(k, 0.0) for k in ("layer_f", "layer_b", "embed_f", "embed_b", "head_f", "head_b")}
    sts = stages(model, c)
    pipe, worst = pipeline_time(model, timed, sts, c)
    p = _params(model, c, ep)
    # gradients are reduced (and ZeRO shards) over the data- and context-parallel ranks together
    dpc = {**c, "dp": c["dp"] * cp}
    lay_dp = {**lay, "dp": lay["dp_cp"]}
    # On a CPU host gloo's transfers run on the cores the backward pass occupies: nothing hides them
    # (measured, docs/distributed.md: DDP with overlap took as long as backward then one all-reduce).
    serial = bool(profile.host.get("serial"))
    dp_exposed = dp_comm_time(coll, lay_dp, dpc, p, sts, timed, nb, parameter_server_links(cluster),
                              [(not serial) * _stage_time(st, timed, "b") for st in sts],
                              bucket_copy_s=_copy_pricer(profile),
                              bucket_extra_s=float(profile.host.get("ddp_bucket_extra_s", 0.0)) if serial else 0.0)
    p2p = p2p_time(local, coll, lay, c, precision=precision)
    shard_ranks = np.where(c["hybrid"], lay_dp["dp"][0], dpc["dp"])
    opt = 0.0
    for st in sts:  # every stage updates its own parameters; the slowest sets the step
        params = (st["layers"] * p["layer"] + np.where(st["embed"], p["embed"], 0.0)
                  + np.where(st["head"], p["head"], 0.0)) / c["tp"]
        this = optimizer_time(profile, c, params, shard_ranks, optimizer=optimizer, precision=precision,
                              framework=framework, expert_params=st["layers"] * p["expert_layer"] / c["tp"], ep=ep)
        opt = np.maximum(opt, np.where(st["valid"], this, 0.0))
    if profile.host.get("serial"):  # the step's own host work (zero_grad, optimizer bookkeeping) on a CPU
        opt = opt + float(profile.host.get("step_extra_s", 0.0))
    step = pipe + p2p + dp_exposed + opt
    peak, terms = memory_terms(model, lay_dp, dpc, sts, p, precision=precision, recompute=recompute,
                               optimizer=optimizer, seq=local.seq, ep=ep)
    return _outputs(model, c, t, comm, sts, recompute, {
        "step_time": step, "pipeline": pipe, "bottleneck_stage": worst, "p2p": p2p, "dp_comm": dp_exposed,
        "optimizer": opt, "pipeline_bubble": pipe - c["m"] * worst, "peak_memory": peak, "memory": terms,
        "cp": float(cp)})


def _outputs(model, c, t, comm, sts, recompute, out):
    """Breakdown of the bottleneck stage (its m micro-batches + bubble + the rest = the step)."""
    best = None
    for st in sts:
        n, has_head, has_embed = st["layers"], st["head"], st["embed"]

        def part(k, flag):
            return np.where(flag, t[k], 0.0)

        fwd_gpu = n * t["layer_f_gpu"] + part("embed_f_gpu", has_embed) + part("head_f_gpu", has_head)
        bwd_gpu = n * t["layer_b_gpu"] + part("embed_b_gpu", has_embed) + part("head_b_gpu", has_head)
        wall = _stage_time(st, t, "fb")
        tp_share = n * (comm["layer_f"] + comm["layer_b"]) + np.where(has_embed, comm["embed_f"], 0.0) + np.where(
            has_head, comm["head_f"] + comm["head_b"], 0.0)
        this = {"fb": np.where(st["valid"], wall + tp_share, -1.0), "forward": fwd_gpu, "backward": bwd_gpu,
                "host_overhead": np.maximum(wall - fwd_gpu - bwd_gpu, 0.0), "tp_comm": tp_share}
        if best is None:
            best = this
        else:
            worse = this["fb"] > best["fb"]
            best = {k: np.where(worse, this[k], best[k]) for k in best}
    model_flops, hw_flops = step_flops(model, t, recompute)
    out.update({k: c["m"] * best[k] for k in ("forward", "backward", "host_overhead", "tp_comm")})
    out.update({
        "head_share": np.where(c["pp"] == 1, t["head_f"] + t["head_b"], 0.0),
        "layer_flops_f": t["layer_flops_f"], "layer_flops_b": t["layer_flops_b"], "head_flops": t["head_flops"],
        "layer_attn_flops_f": t["layer_attn_flops_f"], "model_flops_mb": model_flops, "hw_flops_mb": hw_flops,
        "tp": c["tp"],
    })
    return out
