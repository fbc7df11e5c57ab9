"""Compose kernel, collective and memory costs into a step (vectorised over configurations).

Everything here takes numpy arrays for the numeric strategy fields (dp, tp,
pp, micro_batch, micro-batches, virtual stages, ZeRO stage, sequence
parallelism) and returns arrays, so ``predict`` (one configuration) and
``search`` (a million) run the same code and agree exactly.

Step = pipeline(forward + backward per micro-batch, incl. exposed tensor-parallel
communication) + point-to-point + exposed data-parallel communication + optimizer.

* Pipeline (Narayanan et al. 2021, §2.2): with m micro-batches, stage times
  S_s = f_s + b_s and v virtual stages per GPU,
  T = m · max_s S_s + (Σ_s S_s − max_s S_s) / v — for balanced stages the
  familiar (m + p − 1)(f + b) and a bubble (p − 1)/(v·m).
* Tensor parallel (Shoeybi et al. 2019): 2 all-reduces of b·s·h activations in
  each layer's forward and 2 in its backward, on the critical path; sequence
  parallel replaces each by a reduce-scatter + all-gather of the same bytes
  (Korthikanti et al. 2022).
* Data parallel as PyTorch DDP (Li et al. 2020, VLDB): gradients all-reduced in
  buckets of ``bucket_mb`` while backward runs; the last bucket is exposed.
  ZeRO-1/2: reduce-scatter the gradients, all-gather updated parameters;
  ZeRO-3/FSDP: all-gather parameters before each layer's forward and backward
  (prefetched, hidden behind compute where it fits) and reduce-scatter
  gradients (Rajbhandari et al. 2020: 1.5× the DDP volume).
* Parameter server (Li et al. 2014, OSDI): each worker pushes gradients and
  pulls weights, 4 B/param each way; the S servers' NICs carry all workers.
"""

from __future__ import annotations

import numpy as np

from perfmodel.costs import memory as mem
from perfmodel.costs.comm import collective_time, hierarchical_time, lookup_entry
from perfmodel.costs.compute import kernel_time, phase_time
from perfmodel.placement import layout
from perfmodel.workload import step as steps
from perfmodel.workload.ops import Kernel, mem as mem_kernel

GRAD_BYTES = 4.0  # fp32 gradients (autocast keeps fp32 parameters; DDP reduces them as they are)


def _params(model):
    """Parameter counts by part: per layer, embedding, head, GEMM weights per layer and head."""
    if hasattr(model, "param_parts"):  # workloads other than the transformer builder's
        return model.param_parts()
    lp = model.layer_params()
    layer = float(sum(lp.values()))
    h = model.hidden
    gemm_layer = float(h * model.qkv_out + h * h + model.experts * (h * model.mlp_in_out + model.ffn_hidden * h)
                       + (h * model.experts if model.experts > 1 else 0))
    head_gemm = 0.0 if model.tied_embeddings else float(model.vocab * h)
    if model.tied_embeddings:
        head_gemm = float(model.vocab * h)  # the tied matrix is still cast for the LM head GEMM
    return {"layer": layer, "embed": float(model.embedding_params), "head": float(model.head_params),
            "gemm_layer": gemm_layer, "gemm_head": head_gemm}


def stage_layers(layers: int, pp):
    """Layers on the first, the last and the fullest middle stage (even split, remainder first)."""
    pp = np.asarray(pp, float)
    base = np.floor(layers / pp)
    rem = layers - base * pp
    first = base + (rem > 0)
    last = np.where(pp > 1, base, layers)
    middle = np.where(pp > 2, base + (rem > 1), 0.0)
    return first, middle, last


def _times(profile, kernels):
    wall, gpu, _ = phase_time(profile, kernels)
    return wall, gpu


def compute_times(model, profile, c, *, precision, recompute):
    """Per-micro-batch wall/GPU seconds of a layer, the embedding and the head, fwd and bwd."""
    lf, lb = steps.layer_kernels(model, c["micro_batch"], tp=c["tp"], sp=c["sp"], precision=precision,
                                 recompute=recompute)
    ef, eb = steps.embedding_kernels(model, c["micro_batch"], tp=c["tp"], precision=precision)
    hf, hb = steps.head_kernels(model, c["micro_batch"], tp=c["tp"], sp=c["sp"], precision=precision)
    out = {}
    for name, ks in (("layer_f", lf), ("layer_b", lb), ("embed_f", ef), ("embed_b", eb), ("head_f", hf), ("head_b", hb)):
        out[name], out[name + "_gpu"] = _times(profile, ks)
    out["layer_flops_f"] = sum(k.flops * np.asarray(k.count, float) for k in lf)
    out["layer_attn_flops_f"] = sum(k.flops * np.asarray(k.count, float) for k in lf if k.cls == "sdpa")
    out["layer_flops_b"] = sum(k.flops * np.asarray(k.count, float) for k in lb)
    out["head_flops"] = sum(k.flops * np.asarray(k.count, float) for k in hf + hb)
    return out


def tp_comm_times(model, coll, lay, c, *, precision, recompute):
    """Exposed tensor-parallel seconds per micro-batch: per layer fwd/bwd, embedding, head."""
    lo = 2.0 if steps.is_mixed(precision) else 4.0
    act = c["micro_batch"] * model.seq * model.hidden * lo
    rpn, nodes = lay["tp"]
    ar = hierarchical_time(coll, "all_reduce", act, rpn, nodes, algorithm="ring")
    rs_ag = (hierarchical_time(coll, "reduce_scatter", act, rpn, nodes, algorithm="ring")
             + hierarchical_time(coll, "all_gather", act, rpn, nodes, algorithm="ring"))
    one = np.where(c["sp"], rs_ag, ar)
    one = np.where(c["tp"] > 1, one, 0.0)
    fwd = 2 * one
    bwd = 2 * one + (fwd if recompute == "full" else 0.0)
    return {"layer_f": fwd, "layer_b": bwd, "embed_f": one, "head_b": one}


def pipeline_time(t, n_first, n_mid, n_last, c):
    """Forward+backward of all micro-batches through the pipeline; returns (total, bottleneck stage)."""
    per_layer = t["layer_f"] + t["layer_b"]
    embed, head = t["embed_f"] + t["embed_b"], t["head_f"] + t["head_b"]
    single = c["pp"] == 1
    first = n_first * per_layer + embed + np.where(single, head, 0.0)
    last = np.where(single, first, n_last * per_layer + head)
    middle = n_mid * per_layer
    worst = np.maximum(np.maximum(first, last), middle)
    total_layers = n_first + np.where(single, 0.0, n_last) + np.maximum(c["pp"] - 2, 0) * (n_first + n_last) / 2
    everything = total_layers * per_layer + embed + head
    pipe = c["m"] * worst + np.maximum(everything - worst, 0.0) / c["v"]
    return pipe, worst


def p2p_time(model, coll, lay, c, *, precision):
    """Activation sends between stages: one forward, one backward per micro-batch per boundary."""
    lo = 2.0 if steps.is_mixed(precision) else 4.0
    size = c["micro_batch"] * model.seq * model.hidden * lo / np.where(c["sp"], c["tp"], 1.0)
    rpn, nodes = lay["pp"]
    level_inter = nodes > 1
    t_intra = collective_time(lookup_entry(coll, "intra", "sendrecv"), "sendrecv", size, 2)
    t_inter = collective_time(lookup_entry(coll, "inter", "sendrecv"), "sendrecv", size, 2)
    one = np.where(level_inter, t_inter, t_intra)
    return np.where(c["pp"] > 1, 2 * one * (c["m"] * c["v"] + c["pp"] - 1), 0.0)


def _bucketed(coll, collective, total, bucket, rpn, nodes):
    """(all buckets' seconds, last bucket's seconds) for bytes split into buckets."""
    bucket = np.minimum(bucket, np.maximum(total, 1.0))
    full = np.floor(total / bucket)
    rem = total - full * bucket
    t_bucket = hierarchical_time(coll, collective, bucket, rpn, nodes, algorithm="ring")
    t_rem = hierarchical_time(coll, collective, np.maximum(rem, 1.0), rpn, nodes, algorithm="ring") * (rem > 0)
    last = np.where(rem > 0, t_rem, t_bucket)
    return full * t_bucket + t_rem, last, bucket / np.maximum(total, 1.0)


def dp_comm_time(coll, lay, c, stage_params, layer_params, backward_s, forward_s, ps_bw):
    """Exposed data-parallel seconds per step (DDP, ZeRO-1/2/3, FSDP hybrid, parameter server)."""
    rpn, nodes = lay["dp"]
    grads = stage_params * GRAD_BYTES
    params_lo = stage_params * c["lo"]
    shard = c["zero"]
    hybrid = c["hybrid"]
    # hybrid sharding: shard inside the node, all-reduce the shards across nodes
    s_nodes = np.where(hybrid, 1.0, nodes)
    s_rpn = rpn
    # DDP / ZeRO-1/2: gradients leave in buckets while backward runs
    ar_all, ar_last, frac = _bucketed(coll, "all_reduce", grads, c["bucket"], rpn, nodes)
    rs_all, rs_last, _ = _bucketed(coll, "reduce_scatter", grads, c["bucket"], rpn, nodes)
    window = backward_s * (1 - frac)
    ddp = np.maximum(ar_last, ar_all - window)
    ag_params = hierarchical_time(coll, "all_gather", params_lo, rpn, nodes, algorithm="ring")
    zero12 = np.maximum(rs_last, rs_all - window) + ag_params
    # ZeRO-3 / FSDP: per-layer all-gathers (fwd, bwd) and reduce-scatters, prefetched behind compute
    ag3 = hierarchical_time(coll, "all_gather", params_lo, s_rpn, s_nodes, algorithm="ring")
    rs3 = hierarchical_time(coll, "reduce_scatter", grads, s_rpn, s_nodes, algorithm="ring")
    layer_frac = np.minimum(1.0, layer_params / np.maximum(stage_params, 1.0))
    fwd_exposed = np.maximum(ag3 - forward_s, 0.0) + ag3 * layer_frac
    bwd_exposed = np.maximum(ag3 + rs3 - backward_s, 0.0) + rs3 * layer_frac
    cross = np.where(hybrid & (nodes > 1),
                     hierarchical_time(coll, "all_reduce", grads / np.maximum(rpn, 1.0), 1.0, nodes), 0.0)
    zero3 = c["m"] * (fwd_exposed + bwd_exposed) + cross
    out = np.where(shard >= 3, zero3, np.where(shard >= 1, zero12, ddp))
    # parameter server: push gradients (overlapping backward like DDP buckets), pull weights
    workers, servers = c["dp"], np.maximum(c["ps"], 1.0)
    per_way = grads * np.maximum(workers / (servers * ps_bw["server"]), 1.0 / ps_bw["worker"]) + ps_bw["latency"]
    ps = per_way + np.maximum(per_way * c["bucket"] / np.maximum(grads, 1.0), per_way - window)
    out = np.where(c["ps"] > 0, ps, out)
    return np.where((c["dp"] > 1) | (c["ps"] > 0), out, 0.0)


def optimizer_time(profile, c, stage_params, *, optimizer, precision):
    """Optimizer step + gradient-accumulation adds (+ fp16 loss-scale unscale) per step."""
    local = stage_params / np.where(c["zero"] >= 1, c["dp"], 1.0)
    kernels = [Kernel("optimizer", optimizer, "opt", {"params": local}, 1, 0.0, "fwd", "fp32"),
               mem_kernel("grad_accumulate", "add", "opt", stage_params, count=np.maximum(c["m"] - 1, 0), variant="fwd")]
    if precision == "fp16-mixed":  # GradScaler: unscale and inf check over every gradient
        kernels += [mem_kernel("unscale", "scale", "opt", stage_params, variant="fwd"),
                    mem_kernel("inf_check", "sum", "opt", stage_params, variant="fwd")]
    total = 0.0
    for k in kernels:
        g, _ = kernel_time(profile, k)
        total = total + g * np.asarray(k.count, float)
    return total


def memory_terms(model, c, n_first, n_last, *, precision, recompute, optimizer):
    """Peak bytes of the first and last pipeline stage; returns (peak, terms of the worse one)."""
    p = _params(model)
    tp, dp = c["tp"], c["dp"]
    tokens = c["micro_batch"] * model.seq
    act_layer = mem.layer_activation_bytes(model, tp=tp, sp=c["sp"], precision=precision, recompute=recompute)
    full_layer = mem.layer_activation_bytes(model, tp=tp, sp=c["sp"], precision=precision, recompute="none")
    inflight_first = np.where(c["schedule"] == 1, c["m"],
                              np.minimum(c["m"], c["pp"]) * np.where(c["v"] > 1, 1 + (c["pp"] - 1) / (c["pp"] * c["v"]), 1.0))
    inflight_last = np.where(c["schedule"] == 1, c["m"], 1.0)
    single = c["pp"] == 1
    lo = 2.0 if steps.is_mixed(precision) else 4.0
    final = tokens * (4.0 * model.hidden + 8.0 + (2.0 * model.hidden if lo == 2.0 else 0.0))
    loss = 3.0 * tokens * model.vocab / tp * 4.0
    recompute_peak = tokens * full_layer if recompute == "full" else 0.0
    peaks, terms_all = [], []
    for n_layers, inflight, has_embed, has_head in (
        (n_first, inflight_first, True, single), (n_last, inflight_last, single, True)
    ):
        params = (n_layers * p["layer"] + np.where(has_embed, p["embed"], 0.0) + np.where(has_head, p["head"], 0.0)) / tp
        gemm = (n_layers * p["gemm_layer"] + np.where(has_head, p["gemm_head"], 0.0)) / tp
        terms = mem.static_bytes(params, gemm, precision=precision, optimizer=optimizer, zero=c["zero"], dp=dp)
        acts = tokens * act_layer * n_layers * inflight + recompute_peak
        acts = acts + np.where(has_head, final, 0.0) + np.where(has_embed, tokens * 4.0 * model.hidden, 0.0)
        loss_here = np.where(has_head, loss, 0.0)
        peak = mem.peak_bytes(terms, acts, loss_here, c["m"] > 1)
        terms = {**terms, "activations": acts, "loss": loss_here}
        peaks.append(peak)
        terms_all.append(terms)
    worse_first = peaks[0] >= peaks[1]
    terms = {k: np.where(worse_first, terms_all[0][k], terms_all[1][k]) for k in terms_all[0]}
    return np.maximum(peaks[0], peaks[1]), terms


def evaluate(model, cluster, profile, coll, c, *, precision, recompute, optimizer, placement="tp-pp-dp"):
    """All step quantities for configurations ``c`` (a dict of broadcastable arrays)."""
    c = dict(c)
    c["lo"] = 2.0 if steps.is_mixed(precision) else 4.0
    lay = layout(c["dp"], c["tp"], c["pp"], cluster.gpus_per_node, placement)
    t = compute_times(model, profile, c, precision=precision, recompute=recompute)
    comm = tp_comm_times(model, coll, lay, c, precision=precision, recompute=recompute)
    timed = {k: t[k] + comm.get(k, 0.0) for k in ("layer_f", "layer_b", "embed_f", "embed_b", "head_f", "head_b")}
    n_first, n_mid, n_last = stage_layers(model.layers, c["pp"])
    pipe, worst = pipeline_time(timed, n_first, n_mid, n_last, c)
    p = _params(model)
    stage_params = (n_first * p["layer"] + p["embed"] + np.where(c["pp"] == 1, p["head"], 0.0)) / c["tp"]
    stage_bwd = n_first * timed["layer_b"] + timed["embed_b"]
    stage_fwd = n_first * timed["layer_f"] + timed["embed_f"]
    node = cluster.node
    ps_bw = {"server": node.nic.bw_bytes_per_s * node.nics_per_node, "worker": node.nic.bw_bytes_per_s
             * node.nics_per_node / node.gpus_per_node, "latency": node.nic.latency_s}
    dp_exposed = dp_comm_time(coll, lay, c, stage_params, p["layer"] / c["tp"], stage_bwd, stage_fwd, ps_bw)
    p2p = p2p_time(model, coll, lay, c, precision=precision)
    opt = optimizer_time(profile, c, stage_params, optimizer=optimizer, precision=precision)
    step = pipe + p2p + dp_exposed + opt
    peak, terms = memory_terms(model, c, n_first, n_last, precision=precision, recompute=recompute, optimizer=optimizer)
    per_mb = {k: n_first * t[f"layer_{k[0]}"] for k in ("fwd", "bwd")}
    gpu_share = {k: n_first * t[f"layer_{k[0]}_gpu"] for k in ("fwd", "bwd")}
    tp_share = n_first * (comm["layer_f"] + comm["layer_b"]) + comm["embed_f"] + comm["head_b"]
    head_share = np.where(c["pp"] == 1, t["head_f"] + t["head_b"], 0.0)
    host = (per_mb["fwd"] - gpu_share["fwd"]) + (per_mb["bwd"] - gpu_share["bwd"])
    return {
        "step_time": step, "pipeline": pipe, "bottleneck_stage": worst, "p2p": p2p, "dp_comm": dp_exposed,
        "optimizer": opt, "tp_comm": c["m"] * tp_share,
        "forward": c["m"] * (gpu_share["fwd"] + t["embed_f_gpu"] + np.where(c["pp"] == 1, t["head_f_gpu"], 0.0)),
        "backward": c["m"] * (gpu_share["bwd"] + t["embed_b_gpu"] + np.where(c["pp"] == 1, t["head_b_gpu"], 0.0)),
        "host_overhead": c["m"] * (host + (t["embed_f"] - t["embed_f_gpu"]) + (t["embed_b"] - t["embed_b_gpu"])
                                   + np.where(c["pp"] == 1, (t["head_f"] - t["head_f_gpu"]) + (t["head_b"] - t["head_b_gpu"]), 0.0)),
        "pipeline_bubble": pipe - c["m"] * worst, "head_share": head_share,
        "peak_memory": peak, "memory": terms,
        "layer_flops_f": t["layer_flops_f"], "layer_flops_b": t["layer_flops_b"], "head_flops": t["head_flops"],
        "layer_attn_flops_f": t["layer_attn_flops_f"], "tp": c["tp"],
    }
