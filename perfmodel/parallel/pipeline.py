"""Pipeline parallelism: stages, the schedule's step time, point-to-point sends, in-flight micro-batches.

Vectorised over configurations (``StepConfig`` arrays); docs/distributed.md derives
every formula, the one-line comments name the sources.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from perfmodel.core.algebra import floats, maximum, pick, where
from perfmodel.costs.comm import collective_time, hierarchical_time, lookup_entry
from perfmodel.parallel.config import Schedule, StepConfig
from perfmodel.parallel.placement import pipeline_crossings
from perfmodel.parallel.looped_bfs import LOOPED_BFS, late_chunk_waits
from perfmodel.parallel.zero_bubble import SPLITS_EVERY_BACKWARD, V_SHAPED, ZERO_BUBBLE, drain_ratio


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds of one micro-batch by part (a layer, the embedding, the LM head) and phase (f, b)."""

    layer_f: np.ndarray | float = 0.0
    layer_b: np.ndarray | float = 0.0
    embed_f: np.ndarray | float = 0.0
    embed_b: np.ndarray | float = 0.0
    head_f: np.ndarray | float = 0.0
    head_b: np.ndarray | float = 0.0

    def __add__(self, other: PhaseTimes) -> PhaseTimes:
        return PhaseTimes(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def on(self, stage: Stage, phases: str = "fb"):
        """Seconds of one micro-batch on ``stage``: ``phases`` "f", "b" or "fb"."""
        total = 0.0
        for k in phases:
            total = total + stage.layers * getattr(self, f"layer_{k}") \
                + where(stage.embed, getattr(self, f"embed_{k}"), 0.0) \
                + where(stage.head, getattr(self, f"head_{k}"), 0.0)
        return total

    @property
    def layers_fb(self):
        return self.layer_f + self.layer_b


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by part: per layer, the embedding, the LM head, the GEMM weights per layer and of
    the head (what autocast casts), and per layer those of the rank's experts."""

    layer: np.ndarray | float
    embed: np.ndarray | float
    head: np.ndarray | float
    gemm_layer: np.ndarray | float
    gemm_head: np.ndarray | float
    expert_layer: np.ndarray | float = 0.0


@dataclass(frozen=True)
class Stage:
    """One representative pipeline stage: its layers, its 0-based index, whether it holds the
    embedding and the LM head, and whether it exists for each configuration (``valid``)."""

    layers: np.ndarray | float
    index: np.ndarray | float
    embed: np.ndarray | bool
    head: np.ndarray | bool
    valid: np.ndarray | bool

    def params(self, p, tp):
        """Parameters this stage's tensor-parallel rank holds (``p``: ``ParamCounts``)."""
        return (self.layers * p.layer + pick(self.embed, p.embed, 0.0) + pick(self.head, p.head, 0.0)) / tp


def stage_layers(layers: int, pp):
    """Layers on the first, the fullest middle and the last stage (even split, remainder first)."""
    pp = floats(pp)
    base = np.floor(layers / pp)
    rem = layers - base * pp
    first = base + (rem > 0)
    last = pick(pp > 1, base, layers)
    middle = pick(pp > 2, base + (rem > 1), 0.0)
    return first, middle, last


def stages(model, c: StepConfig) -> list[Stage]:
    """Representative pipeline stages.

    Even split: the first, the fullest middle and the last stage stand for all
    of them (a middle stage holds no more layers than the first and no
    embedding, so it never sets a maximum the first does not). With an explicit
    ``c.stage_layers`` every stage is listed.
    """
    if c.stage_layers is not None:
        n, v_shape = len(c.stage_layers), bool(np.all(v_shaped(c)))
        return [Stage(float(lay), float(i), i == 0, i == (0 if v_shape else n - 1), True)
                for i, lay in enumerate(c.stage_layers)]
    pp = floats(c.pp)
    first, middle, last = stage_layers(model.layers, pp)
    single = pp == 1
    head_first = single | v_shaped(c)  # the V (ZBV, DualPipeV) brings the last chunk back to the first rank
    return [Stage(first, 0.0, True, head_first, True), Stage(middle, 1.0, False, False, pp > 2),
            Stage(last, pp - 1, False, ~head_first, ~single)]


def schedule_seconds(slowest_s, all_stages_s, micro_batches, virtual_stages=1.0, drain=1.0):
    """Seconds of all micro-batches through a pipeline whose slowest stage takes ``slowest_s``
    and whose stages together take ``all_stages_s`` per micro-batch.

    Narayanan et al. 2021 §2.2: with m micro-batches, T = m·max S + (Σ S − max S)/v; balanced
    stages give (m + (p−1)/v)(f + b), a bubble of (p−1)/(v·m) of the ideal time. For unequal
    stages the fill and the drain pass each stage once while the slowest stage sets the pace
    (PipeDream, Narayanan et al. 2019, §3.1). GPipe and 1F1B have the same bubble; a zero-bubble
    schedule leaves ``drain`` of it (``zero_bubble.drain_ratio``). The times may be arrays or sympy
    expressions.
    """
    return micro_batches * slowest_s + maximum(all_stages_s - slowest_s, 0.0) / virtual_stages * drain


def _runs(c: StepConfig, names: tuple):
    """Whether ``c`` runs one of the schedules ``names`` (numbers or arrays)."""
    out = False
    for name in names:
        out = out | (c.schedule == Schedule.named(name))
    return out


def zero_bubble(c: StepConfig):
    """Whether ``c`` runs one of torch's zero-bubble schedules (``parallel/zero_bubble.py``)."""
    return _runs(c, tuple(ZERO_BUBBLE))


def splits_every_backward(c: StepConfig):
    """Whether ``c``'s schedule splits every backward into input- and weight-gradient passes (interleaved ZB, ZBV)."""
    return _runs(c, SPLITS_EVERY_BACKWARD)


def reruns_backward(c: StepConfig):
    """Whether every backward of ``c`` runs twice: torch's split-backward schedules that split all of them (interleaved
    ZB, ZBV) over compiled blocks, whose input- and weight-gradient passes each run the block's whole compiled
    backward (``parallel/zero_bubble.py``)."""
    return splits_every_backward(c) & bool(c.compile)


def v_shaped(c: StepConfig):
    """Whether ``c``'s schedule places two chunks per rank in a V (ZBV, DualPipeV: rank r runs r and 2p − 1 − r)."""
    return _runs(c, V_SHAPED)


def holds_all(c: StepConfig):
    """Whether ``c``'s schedule runs every forward of the step before its first backward (GPipe, looped BFS)."""
    return _runs(c, ("gpipe", LOOPED_BFS))


def pipeline_time(model, t: PhaseTimes, sts: list[Stage], c: StepConfig, wgrad_share=0.0, weight_recompute=0.0):
    """All micro-batches through the pipeline; returns (seconds, bottleneck stage seconds).

    ``wgrad_share``: the weight gradients' share of a layer's backward, which a zero-bubble schedule
    moves into its fill and drain. ``weight_recompute``: seconds a layer's split weight-gradient pass recomputes
    over checkpointed eager blocks (``zero_bubble.weight_groups`` recomputations), which DualPipeV pays on the
    first rank's 2p − 1 split backwards."""
    worst = 0.0
    for st in sts:
        worst = np.maximum(worst, pick(st.valid, t.on(st), 0.0))
    if c.stage_layers is not None:
        everything = sum(t.on(st) for st in sts)
    else:
        everything = model.layers * t.layers_fb + t.embed_f + t.embed_b + t.head_f + t.head_b
    drain, zb = 1.0, zero_bubble(c)
    if np.any(zb):
        ratio = drain_ratio(t.layer_f, t.layer_b, wgrad_share * t.layer_b, c.pp, c.schedule == Schedule.ZBV,
                            c.schedule == Schedule.DUALPIPEV, compiled=bool(c.compile))
        drain = pick(zb, ratio, 1.0)
    seconds = schedule_seconds(worst, everything, c.micro_batches, c.virtual_stages, drain)
    dualpipev = (c.schedule == Schedule.DUALPIPEV) & (not bool(c.compile))
    if np.any(dualpipev) and np.any(weight_recompute):  # in its fill and drain, as the compiled chain read off
        # torch's orders (parallel/zero_bubble.py); an approximation: the forms with B != I + W are not derived
        chunk_layers = model.layers / (2.0 * np.maximum(c.pp, 1.0))
        seconds = seconds + pick(dualpipev, (2.0 * c.pp - 1.0) * weight_recompute * chunk_layers, 0.0)
    looped = c.schedule == Schedule.LOOPED_BFS
    if np.any(looped):  # breadth first with m < p: each later chunk pass waits for its first input (looped_bfs.py)
        waits = late_chunk_waits(c.pp, c.micro_batches, c.virtual_stages) * worst / np.maximum(c.virtual_stages, 1.0)
        seconds = seconds + pick(looped, waits, 0.0)
    return seconds, worst


def sendrecv_time(coll, level, size):
    """Seconds of one point-to-point transfer of ``size`` bytes over ``level`` ("intra", "inter")."""
    return collective_time(lookup_entry(coll, level, "sendrecv"), "sendrecv", size, 2)


def p2p_time(coll, lay, c: StepConfig, act_bytes):
    """Activation and gradient sends between pipeline stages on the critical path, per step.

    Each boundary carries b·s·h (``act_bytes``) forward and its gradient backward per
    micro-batch (per virtual stage with interleaving, whose communication grows by v;
    Narayanan et al. 2021, §2.2.2). With tp > 1 each of the t ranks sends 1/t and the
    receiver all-gathers over NVLink (scatter/gather optimisation, §4.1); with sequence
    parallelism the output is already split t ways. The bottleneck stage waits on
    2·m·v transfers; the fill and the drain cross every boundary once each way.
    """
    size = act_bytes / c.tp
    crossings = pipeline_crossings(lay["pp"])
    boundaries = np.maximum(c.pp - 1.0, 0.0)
    t_intra, t_inter = sendrecv_time(coll, "intra", size), sendrecv_time(coll, "inter", size)
    gather = pick((c.tp > 1) & ~np.asarray(c.sequence_parallel, bool),
                      hierarchical_time(coll, "all_gather", act_bytes, *lay["tp"], algorithm="ring"), 0.0)
    slowest = pick(crossings > 0, t_inter, t_intra) + gather
    fill = crossings * t_inter + (boundaries - crossings) * t_intra + boundaries * gather
    return pick(c.pp > 1, 2.0 * c.micro_batches * c.virtual_stages * slowest + 2.0 * fill, 0.0)


def in_flight(c: StepConfig, index):
    """Micro-batches whose activations a stage holds at its peak.

    GPipe and torch's looped BFS: all m. torch's zero-bubble orders: p on every rank, DualPipeV's p + 1/2 (counted
    on torch's orders: ``parallel/zero_bubble.py``). 1F1B: stage s (0-based) of p holds min(m, p − s) (Narayanan et al.
    2021, §2.2.1). Interleaved over v chunks (Megatron-LM core_r0.10.0
    ``schedules.forward_backward_pipelining_with_interleaving``, groups of N = p micro-batches per
    chunk, ``microbatch_group_size_per_vp_stage``'s default and the fewest it allows): rank s runs
    W = 2(p − s − 1) + (v − 1)·p warm-up chunk forwards and one more before its first backward, or
    all m·v forwards first where W ≥ m·v; each chunk holds 1/v of the stage's layers. On the first
    stage that is p·(1 + (p−1)/(p·v)) (Korthikanti et al. 2022, §4.2.3). (core_r0.9.0 ran every
    forward first on every rank when m = p; core_r0.10.0 does so only where W ≥ m·v.)
    """
    pp, v, m = c.pp, c.virtual_stages, c.micro_batches
    f1b = np.minimum(m, np.maximum(pp - index, 1.0))
    interleaved = np.minimum(2.0 * (pp - index - 1.0) + (v - 1.0) * pp + 1.0, m * v) / v
    # torch's zero-bubble orders hold p·v chunk forwards on every rank, DualPipeV's 2p + 1 (parallel/zero_bubble.py)
    held = pick(c.schedule == Schedule.DUALPIPEV, pp + 0.5, pp)
    interleaved = pick(zero_bubble(c), np.minimum(m, held), interleaved)
    # GPipe, and torch's breadth-first loop (all m·v chunk forwards first: parallel/looped_bfs.py), hold all m
    return pick(holds_all(c), m, pick(v > 1, interleaved, f1b))


def _chunk_forwards(chunks, pp, v, chunk):
    """How many of a rank's first ``chunks`` forwards run model chunk ``chunk``: Megatron-LM's schedule
    table (core_r0.10.0 ``forward_backward_pipelining_with_interleaving``) runs groups of p micro-batches
    per chunk, chunk 0 to v−1, then the next group."""
    group = pp * v
    rest = chunks - np.floor(chunks / group) * group
    return np.floor(chunks / group) * pp + np.clip(rest - chunk * pp, 0.0, pp)


def layer_batches(c: StepConfig, st: Stage):
    """Layers × micro-batches whose activations a stage holds at its peak.

    ``in_flight`` micro-batches of the stage's layers, except where an explicit ``c.stage_layers``
    gives the first (last) stage d layers fewer than the fullest one, d at most a chunk's: there the
    embedding (loss) takes the slots of the first (last) chunk (Megatron-LM
    ``account_for_embedding/loss_in_pipeline_split``, ``transformer_block.get_num_layers_to_build``),
    which holds d layers fewer in each of its forwards in flight, not an even share of them.
    """
    held = st.layers * in_flight(c, st.index)
    v = floats(c.virtual_stages)
    if c.stage_layers is None or np.all(holds_all(c)) or np.all(zero_bubble(c)):
        return held
    full = float(max(c.stage_layers))
    d, per_chunk = full - st.layers, full / v
    chunks = in_flight(c, st.index) * v                       # chunk forwards alive at the peak
    slot = 0.0 if st.embed else v - 1.0                       # the chunk the embedding or the loss takes
    exact = chunks * per_chunk - _chunk_forwards(chunks, floats(c.pp), v, slot) * d
    short = (v > 1) & (d > 0) & (d <= per_chunk) & (np.asarray(st.embed) | np.asarray(st.head))
    return pick(short, exact, held)


def pipeline_waits(forward_s, c: StepConfig, index):
    """Seconds stage ``index`` waits between its first and its last backward, (p − 1 − i)·f / v: of the bubble
    (p − 1)(f + b)/v (Narayanan et al. 2021, §2.2), stage i of 1F1B waits i·f + (p − 1 − i)·b before its first
    backward and i·b after its last (the drain ``data.dp_comm_time`` credits); the rest falls between them. A stream
    issued beside the step (``data.streamed_exposed``) runs through those waits as through compute."""
    p, v = np.maximum(c.pp, 1.0), np.maximum(c.virtual_stages, 1.0)
    return maximum(p - 1.0 - index, 0.0) * forward_s / v


def prefetched_gather(gather_s, forward_s, c: StepConfig, index, slowdown=0.0):
    """Exposed seconds of the parameter all-gather when it is prefetched beside the next step's forwards.

    Llama 3 (arXiv 2407.21783, §3.3.2): data parallelism "can tolerate longer network latency by asynchronously
    prefetching sharded model weights". The first model chunk's weights (1/v of ``gather_s``) are waited for;
    the rest are gathered beside the forwards the stage runs before its first backward (``pipeline.in_flight``):
    max(g/v, g − warm·f), plus the compute's slowdown over the seconds both run (``overlapped_cost``).
    """
    v = np.maximum(c.virtual_stages, 1.0)
    window = np.minimum(in_flight(c, index), c.micro_batches) * forward_s
    return slowed(maximum(gather_s / v, gather_s - window), gather_s, slowdown)


def slowed(exposed_s, comm_s, slowdown=0.0):
    """``exposed_s`` of ``comm_s`` seconds of communication, plus the compute's slowdown over the rest, which ran
    beside compute (as ``data.overlapped_cost`` counts it)."""
    return exposed_s + slowdown * maximum(comm_s - exposed_s, 0.0)

