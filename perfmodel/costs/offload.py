"""Activation CPU offload: the host copies of the offloaded blocks and the seconds they add to a step.

The stacks' behaviour (which tensors leave, how the copies overlap compute) is in
``perfmodel.workload.stacks.offload``; docs/stacks.md and docs/memory.md describe the terms.
"""

from __future__ import annotations

import numpy as np

from perfmodel.costs.memory import model_state_bytes
from perfmodel.hardware import load_link
from perfmodel.hardware.catalog import DEFAULT_PCIE
from perfmodel.workload.stacks.offload import OFFLOAD_MODES, overlap_layers

DIRECTIONS = ("d2h", "h2d")


def host_link(cluster):
    """The GPU's host interface (its PCIe generation from the catalog; PCIe 4 when unnamed)."""
    return load_link(getattr(getattr(cluster, "gpu", None), "pcie", None) or DEFAULT_PCIE)


def host_copy_seconds(profile, link, nbytes, direction: str):
    """Seconds of one pinned host copy of ``nbytes`` bytes: t = latency + bytes · s_per_byte.

    Hockney's alpha-beta form (Hockney 1994), fitted to the profile's measured pinned
    ``h2d`` / ``d2h`` copies where it has them (``host.<direction>_latency_s`` and
    ``host.<direction>_s_per_byte``, perfmodel/fit/host_copy.py), else the link's line rate and latency.
    """
    host = profile.host
    latency, per_byte = host.get(f"{direction}_latency_s"), host.get(f"{direction}_s_per_byte")
    if latency is None or per_byte is None:
        latency, per_byte = link.latency_s, 1.0 / link.bw_bytes_per_s
    return latency + np.asarray(nbytes, float) * per_byte


def offloaded_bytes(act_bytes_per_token, tokens, gemm_layer_params, tp, *, precision, framework):
    """Bytes one offloaded block copies out per micro-batch (and back in backward).

    Its saved activations; under ``pytorch`` (``save_on_cpu`` packs every saved tensor) also the
    16-bit weight casts autocast made for its GEMMs, which ``mm`` saves for the input gradient.
    """
    acts = np.asarray(act_bytes_per_token, float) * tokens
    if framework != "pytorch":
        return acts
    return acts + model_state_bytes(precision, framework=framework)["weight_copies"] * gemm_layer_params / tp


def exposed_copy_seconds(framework: str, offload_layers: int, layers: int, d2h_s, h2d_s, layer_f_s, layer_b_s):
    """(forward, backward) seconds per micro-batch the compute stream waits for offload copies.

    ``d2h_s`` / ``h2d_s``: one block's copy out and back; ``layer_f_s`` / ``layer_b_s``: one
    block's forward and backward. ``serial`` (save_on_cpu: the copies run on the compute stream):
    k · d2h and k · h2d. ``windowed`` (Transformer Engine): group i's copy overlaps n_i layers
    (``overlap_layers``), so Σ_i max(0, d2h − n_i · t_f) in forward, the same with h2d and t_b in backward.
    """
    k = int(offload_layers)
    if not k:
        return 0.0, 0.0
    if OFFLOAD_MODES[framework] == "serial":
        return k * np.asarray(d2h_s, float), k * np.asarray(h2d_s, float)
    fwd = bwd = 0.0
    for n in overlap_layers(k, layers):
        fwd = fwd + np.maximum(d2h_s - n * np.asarray(layer_f_s, float), 0.0)
        bwd = bwd + np.maximum(h2d_s - n * np.asarray(layer_b_s, float), 0.0)
    return fwd, bwd


def offload_seconds(profile, cluster, p, c, act_bytes_per_token, tokens, layers, wall, *, precision):
    """(forward, backward) exposed offload seconds per micro-batch, spread over the model's layers.

    ``p``: the parameter counts (``step.param_counts``), ``layers``: the model's blocks (all on one
    stage: offload is priced with pp = 1), ``wall``: a micro-batch's seconds by part
    (``PhaseTimes``); the result is added to each layer's forward and backward, so the stage's
    layers carry the offloaded blocks' waits between them.
    """
    link = host_link(cluster)
    nbytes = offloaded_bytes(act_bytes_per_token, tokens, p.gemm_layer, c.tp, precision=precision,
                             framework=c.framework)
    d2h, h2d = (host_copy_seconds(profile, link, nbytes, d) for d in DIRECTIONS)
    fwd, bwd = exposed_copy_seconds(c.framework, c.offload_layers, layers, d2h, h2d, wall.layer_f, wall.layer_b)
    return fwd / layers, bwd / layers
