"""Zero-bubble pipeline schedules as torch.distributed.pipelining runs them (torch 2.13 ``schedules.py``).

Zero-bubble schedules (Qi et al., ICLR 2024, "Zero Bubble Pipeline Parallelism") split a backward into
its input gradient (I: the activations' gradient, which the previous stage waits for) and its weight
gradient (W: the weights' gradient, which nothing downstream waits for), and move W into the fill and
the drain. torch ships two that torchtitan names in ``parallelism.pipeline_parallel_schedule``:

* ``"interleaved-zb"`` (``ScheduleInterleavedZeroBubble``): v >= 2 chunks per rank, looped as interleaved
  1F1B;
* ``"zbv"`` (``ScheduleZBVZeroBubble``): two chunks per rank in a V (rank r runs chunks r and 2p − 1 − r,
  so the first rank holds the embedding and the LM head);
* ``"dualpipev"`` (``ScheduleDualPipeV``, torchtitan's ``DualPipeV``): DeepSeek's DualPipe cut in half onto the
  same V (DeepSeek-AI 2024, arXiv 2412.19437 §3.2.1; github.com/deepseek-ai/DualPipe). Its steady state pairs one
  micro-batch's forward through one chunk with another's whole backward through the other (``OVERLAP_F_B``).
  torch's runtime runs such a pair as the forward, then the backward (``_PipelineScheduleRuntime``: ``for sub_a
  in action.sub_actions: _perform_action(sub_a)``; torchtitan's trainer registers nothing else for it), so on
  these stacks the pair takes f + b + w: the communication the pairing hides in DeepSeek's own runtime (expert
  all-to-alls beside the other micro-batch's compute) is not hidden here.

Each schedule is a fixed order of actions per rank. Its step is the longest chain through those orders,
a maximum of linear forms in a chunk's forward f, input-gradient b and weight-gradient w seconds. The
forms below were read off torch 2.13's own orders (``_schedule_visualizer.get_schedule_ops``) by running
them with f, b and w as durations; ``tests/test_zero_bubble.py`` runs those orders again for random
(p, m, v, f, b, w) and checks the forms exactly. With m micro-batches on p ranks, balanced chunks and no
send time:

* interleaved 1F1B: m·v·(f + b + w) + (p − 1)(f + b + w)  (Narayanan et al. 2021, §2.2);
* interleaved zero bubble: m·v·(f + b + w) + (p − 1)·max(f + b − w, f, b), for m >= p;
* ZBV: 2m·(f + b + w) + max of the eight forms of ``ZBV_FORMS``, for m >= 2p − 1 (below that torch pads
  the schedule to 2p − 1 micro-batches);
* DualPipeV: 2m·(f + b + w) + max of the six forms of ``DUALPIPEV_FORMS``, for m >= 2p (torch refuses fewer
  micro-batches than stages).

**Compiled blocks run their whole backward twice.** A split backward asks autograd for the input gradient
(``_backward.stage_backward_input``) and later for the weights' (``stage_backward_weight``, from the nodes it
saved). torch.compile makes a block one autograd node (AOTAutograd's compiled backward) that returns every
gradient at once, so each of the two passes runs the whole of it: measured on the CPU with torch 2.13 and per-block
in-place ``module.compile()`` as torchtitan compiles (``distributed/compile.py:apply_compile``), Inductor and
aot_eager alike, I and W each took the whole backward's time. torch refuses compiled stage modules for these three
schedules (``_check_torch_compile_compatibility``: "not supported with stage modules that have used torch.compile")
but checks for ``OptimizedModule`` wrappers only, which in-place compile does not leave. So with ``compile=True``
I = W = c, a block's whole backward: interleaved ZB and ZBV split every backward, their forms above hold with
b = w = c, and every micro-batch's backward costs 2c; DualPipeV splits 2p − 1 − r of rank r's 2m backwards (its
paired ones run whole), and its step is 2m·(f + c) + c + 2(p − 1)·max(f, c) (``compiled_dualpipev_drain``, read
off the same orders).

**Checkpointed eager blocks recompute their forward once per weight.** Under activation checkpointing
(non-reentrant ``torch.utils.checkpoint``, torchtitan's ``checkpoint_wrapper``) the input-gradient pass recomputes
a block's forward once, as a whole backward does; the weight-gradient pass then asks autograd for each weight
group's gradient in a call of its own (``stage_backward_weight``: one ``autograd.grad`` per param group), and each
call finds the recomputed tensors freed and recomputes the forward again. Counted with torch 2.13 on a Llama
block as torchtitan writes it (wq, wk, wv, wo, w1, w2, w3, two RMSNorm weights): 9 recomputations in the
weight-gradient pass; with biases and LayerNorm still 9 (a bias shares its weight's group), with a two-linear MLP 8
(``weight_groups``). Where interleaved ZB or ZBV split every backward, each backward pays those recomputations too.

At f = b = w, all three leave (p − 1)·f of the (p − 1)·3f that interleaved 1F1B leaves; off that point
DualPipeV's fill and drain are longer than ZBV's for some ratios and shorter for others (a weight gradient
long next to the forward favours it). Interleaved ZB and ZBV hold the activations of p micro-batches on
every rank at its peak (p·v chunk forwards in flight, counted on the same orders), as 1F1B does on its
first stage; DualPipeV holds 2p + 1 chunk forwards, p + 1/2 micro-batches of the rank's layers.
"""

from __future__ import annotations

import numpy as np

from perfmodel.core.algebra import maximum, pick
from perfmodel.core.errors import InvalidInputError, UnsupportedError

ZERO_BUBBLE = {"interleaved-zb": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
               "dualpipev": "ScheduleDualPipeV"}
V_SHAPED = ("zbv", "dualpipev")  # two chunks per rank in a V: rank r runs chunks r and 2p − 1 − r
SPLITS_EVERY_BACKWARD = ("interleaved-zb", "zbv")  # every backward as I then W (DualPipeV: its fill and drain only)
TORCH_PIPELINING = ("torchtitan", "pytorch")  # the stacks that pipeline with torch's own schedules

# ZBV's fill and drain: the forms (a, c, d) of a·f + c·b + d·w in q = p − 1, their maximum over q
ZBV_FORMS = (
    lambda q: (0.0, 2.0 * q, -2.0 * q),
    lambda q: (2.0 * q - 1.0, 1.0 - q, 0.0),
    lambda q: (2.0 * q, -q, -1.0),
    lambda q: (0.0, 1.0, q - 1.0),
    lambda q: (0.0, q, 0.0),
    lambda q: (2.0 * q, 0.0, -(2.0 * q + 1.0)),
    lambda q: (1.0, 0.0, q - 1.0),
    lambda q: (2.0 * q - 1.0, 1.0, -2.0 * q),
)

# DualPipeV's fill and drain, likewise: q·max(f, f + b − w, 2f − b − w, 2f − 2w) or q·max(b, 2b − w) − f
DUALPIPEV_FORMS = (
    lambda q: (q, 0.0, 0.0),
    lambda q: (q, q, -q),
    lambda q: (2.0 * q, -q, -q),
    lambda q: (2.0 * q, 0.0, -2.0 * q),
    lambda q: (-1.0, q, 0.0),
    lambda q: (-1.0, 2.0 * q, -q),
)


def _largest_form(forms, f, b, w, pp):
    """The largest of ``forms`` (a, c, d) of a·f + c·b + d·w at q = p − 1 (numbers, arrays or sympy)."""
    q = pp - 1.0
    out = None
    for form in forms:
        a, c, d = form(q)
        term = a * f + c * b + d * w
        out = term if out is None else maximum(out, term)
    return out


def interleaved_zb_drain(f, b, w, pp):
    """Fill and drain of ``ScheduleInterleavedZeroBubble``: (p − 1)·max(f + b − w, f, b), chunk seconds."""
    return (pp - 1.0) * maximum(maximum(f + b - w, f), b)


def zbv_drain(f, b, w, pp):
    """Fill and drain of ``ScheduleZBVZeroBubble``: the largest of ``ZBV_FORMS`` at q = p − 1, chunk seconds."""
    return _largest_form(ZBV_FORMS, f, b, w, pp)


def dualpipev_drain(f, b, w, pp):
    """Fill and drain of ``ScheduleDualPipeV`` as torch runs it: the largest of ``DUALPIPEV_FORMS``, chunk seconds."""
    return _largest_form(DUALPIPEV_FORMS, f, b, w, pp)


def weight_groups(model) -> int:
    """The weight groups torch's weight-gradient pass differentiates one at a time in a transformer block written
    as torchtitan's: four attention projections, the MLP's two or three (gated) linears, two norms."""
    return 4 + (3 if getattr(model, "activation", "") == "swiglu" else 2) + 2


def compiled_dualpipev_drain(f, c, pp):
    """Fill and drain of ``ScheduleDualPipeV`` over compiled blocks, whose split passes each run the whole backward
    ``c``: c + 2(p − 1)·max(f, c), chunk seconds (the step is 2m·(f + c) plus this)."""
    return c + 2.0 * (pp - 1.0) * maximum(f, c)


def drain_ratio(f, b_total, w, pp, zbv, dualpipev=False, compiled=False):
    """A zero-bubble schedule's fill and drain over interleaved 1F1B's, (p − 1)(f + b + w), from one layer's
    forward ``f``, backward ``b_total`` (input and weight gradients) and weight-gradient ``w`` seconds (a
    chunk's are these times its layers: the forms are homogeneous). ``zbv`` picks ZBV, ``dualpipev``
    DualPipeV, else interleaved ZB. ``compiled``: DualPipeV over compiled blocks (``compiled_dualpipev_drain``;
    the others take their forms with ``b_total`` the doubled backward and ``w`` half of it, as the caller gives)."""
    b = b_total - w
    q = np.maximum(np.asarray(pp, float) - 1.0, 1.0)  # pp = 1 has no fill to scale
    whole = np.maximum(q * (f + b_total), 1e-300)
    drain = pick(zbv, zbv_drain(f, b, w, q + 1.0), interleaved_zb_drain(f, b, w, q + 1.0))
    if np.any(dualpipev):
        dpv = compiled_dualpipev_drain(f, b_total, q + 1.0) if compiled else dualpipev_drain(f, b, w, q + 1.0)
        drain = pick(dualpipev, dpv, drain)
    return drain / whole


def stages_ok(schedule: str, pp, virtual_stages):
    """Where a zero-bubble schedule can run (numbers or arrays): pp > 1 with its chunks per rank (the V: 2)."""
    chunks = virtual_stages == 2 if schedule in V_SHAPED else virtual_stages >= 2
    return (pp > 1) & chunks


def batches_ok(schedule: str, m, pp):
    """Where a zero-bubble schedule's priced form holds for m micro-batches (numbers or arrays): interleaved ZB
    needs m >= pp and m a multiple of its rounds, max(1, m // pp) (torch's own check); ZBV m >= 2·pp − 1
    (torch pads its order to that many); DualPipeV m >= 2·pp (torch's own check: a micro-batch per stage)."""
    if schedule == "zbv":
        return m >= 2 * pp - 1
    if schedule == "dualpipev":
        return m >= 2 * pp
    return (m >= pp) & (m % np.maximum(m // pp, 1) == 0)


def check_torch_pipelining(schedule: str, torch_name: str, framework: str) -> str:
    """Refuse ``schedule`` (torch's ``torch_name``) under a stack that does not pipeline with torch's own schedules;
    returns the schedule's name for the caller's further errors."""
    name = f"schedule={schedule!r} (torch.distributed.pipelining {torch_name})"
    if framework not in TORCH_PIPELINING:
        raise UnsupportedError(f"{name} does not apply to framework={framework!r}; stacks that run "
                               f"torch's pipeline schedules: {', '.join(TORCH_PIPELINING)}")
    return name


def check_zero_bubble(schedule: str, framework: str, pp: int, virtual_stages: int) -> None:
    """torch's zero-bubble schedules: its own pipelining (torchtitan), pp > 1, their chunks per rank."""
    if schedule not in ZERO_BUBBLE:
        return
    name = check_torch_pipelining(schedule, ZERO_BUBBLE[schedule], framework)
    if not stages_ok(schedule, pp, virtual_stages):
        chunks = "two model chunks per rank in a V: virtual_stages=2" if schedule in V_SHAPED else \
            "model chunks in a loop: virtual_stages >= 2"
        raise InvalidInputError(f"{name} needs pp > 1 and {chunks} (got pp={pp}, virtual_stages={virtual_stages})")


def check_zero_bubble_batches(schedule: str, m: int, pp: int) -> None:
    """The micro-batches per step torch's zero-bubble schedules take (torch 2.13 ``schedules.py``) and that the
    forms above hold for."""
    if schedule not in ZERO_BUBBLE or batches_ok(schedule, m, pp):
        return
    if schedule == "zbv":
        raise InvalidInputError(f"schedule='zbv' is priced for at least 2·pp − 1 = {2 * pp - 1} micro-batches per step "
                                f"(got {m}): torch's ScheduleZBVZeroBubble pads its order to that many")
    if schedule == "dualpipev":
        raise InvalidInputError(f"schedule='dualpipev' needs at least as many micro-batches per step as stages, 2·pp = "
                                f"{2 * pp} (torch ScheduleDualPipeV; got {m})")
    raise InvalidInputError(f"schedule='interleaved-zb' needs at least pp={pp} micro-batches per step, a multiple of its "
                            f"rounds max(1, m // pp) = {max(1, m // pp)} (torch ScheduleInterleavedZeroBubble; got {m})")
