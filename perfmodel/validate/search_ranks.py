"""Where each published run's own plan ranks in ``pm.search`` for its model, cluster and global batch.

    python -m perfmodel.validate.search_ranks              # every published run (a few minutes)
    python -m perfmodel.validate.search_ranks --only llama3-405B --top 500

For each run of ``validate.runs`` (check data, nothing fitted): the published configuration priced by
``pm.predict`` (fits or not), then the default search space twice: as it is (every stack, fp8 where it
applies) and at the run's own precision; and a third time over the layouts of the run's own stack and
settings (``like``: its framework, precision, attention, compile, overlaps, ZeRO stage or FSDP mode,
checkpointing and sequence parallelism, its other stack fields held by ``search(fixed=...)``, those the default
space varies among them (``stack_options.SEARCHED_FIELDS``) at their published values too; dp, tp, pp,
virtual stages, micro-batch and cp (1 or its own) searched, the bounds raised to hold its own), which holds
the published plan unless ``like_gaps`` says why not: which layout an expert would pick with that software.
The rank is 1 + the fitting plans predicted strictly faster than the published one (">N" past the ``top`` rows kept), ``gap`` how much slower the published plan is priced
than the best of its own stack's space, and "beaten" says whether the best plan is at
least as fast. ``gaps`` names the published options the default space does not try.
"""

from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass, fields

import pandas as pd

from perfmodel.core.entry import run_command
from perfmodel.core.errors import PerfModelError
from perfmodel.explore.search import FIXED_FIELDS, STACK_FIELDS, search
from perfmodel.explore.stack_options import SEARCHED_FIELDS
from perfmodel.parallel.strategy import Strategy
from perfmodel.parallel.zero_bubble import ZERO_BUBBLE
from perfmodel.predict import predict
from perfmodel.validate.runs import published_cases

NEAR_TOP = 10  # "near the top": within this many rows of the search at the run's own precision
# the Strategy fields pm.search bounds by a keyword, and the bound it takes by default
SEARCH_LIMITS = {k: inspect.signature(search).parameters[f"max_{k}"].default for k in ("micro_batch", "virtual_stages")}
# Strategy fields the search varies (besides dp, tp, pp, micro_batch, virtual_stages); any other field set
# away from its default is a published option the default space does not hold
SEARCHED = {"dp", "tp", "pp", "micro_batch", "virtual_stages", "schedule", "global_batch", "zero", "recompute",
            "precision", "sequence_parallel", "fsdp", "bucket_mib", "stage_layers", "optimizer", *STACK_FIELDS}


@dataclass(frozen=True)
class SearchRank:
    """One published run against the default search for its model, cluster and batch."""

    name: str
    published_s: float
    fits: bool
    rank: str            # in the default space (every precision the stacks have)
    rank_same_precision: str
    best_s: float
    best_same_precision_s: float
    gaps: tuple
    rank_like: str = ""      # in the space of the run's own stack (``like_space``)
    like_gaps: tuple = ()    # the published fields that space still does not hold
    best_like_s: float = float("nan")  # the best plan of that space

    @property
    def like_gap(self) -> float:
        """How much slower the published plan is priced than the best of its own stack's space (NaN: none)."""
        return self.published_s / self.best_like_s - 1.0

    @property
    def beaten(self) -> bool:
        """Whether the default space's best plan is at least as fast as the published one."""
        return self.best_s <= self.published_s


def _set_away(s: Strategy, k: str, defaults: Strategy) -> bool:
    """Whether field ``k`` of ``s`` is set away from what leaving it unset prices (optimizer_states "fp32" is
    None's own layout: costs/memory.py ``optimizer_state_bytes``)."""
    value = getattr(s, k)
    return value != getattr(defaults, k) and not (k == "optimizer_states" and value == "fp32")


def _searched_value(s: Strategy, k: str) -> bool:
    """Whether the default space tries field ``k`` at ``s``'s value for ``s``'s stack (``SEARCHED_FIELDS``)."""
    values = SEARCHED_FIELDS.get(s.framework, {}).get(k)
    return values is not None and getattr(s, k) in values[0]


def space_gaps(s: Strategy) -> tuple:
    """The published options the default search space does not try (field=value)."""
    defaults = Strategy()
    gaps = [f"{k}={getattr(s, k)!r}" for k in (f.name for f in fields(Strategy)) if k not in SEARCHED
            and _set_away(s, k, defaults) and not k.startswith("bucket_mb") and not _searched_value(s, k)]
    if s.attention != Strategy(framework=s.framework).attention:  # the search takes each stack's own kernel
        gaps.append(f"attention={s.attention!r}")
    gaps += [f"{k}={getattr(s, k)} > {limit}" for k, limit in SEARCH_LIMITS.items() if getattr(s, k) > limit]
    if s.global_batch is None:
        gaps.append("global_batch unset")
    return tuple(gaps)


def like_space(s: Strategy) -> tuple[dict, tuple]:
    """(``search`` keywords whose space holds the plan ``s``: its own stack, its non-default fixed fields, bounds
    raised to its micro-batch and virtual stages; the fields of ``s`` that space still does not hold)."""
    # the stack fields the default space varies are held at the published values too (an fp32 reduction stays one)
    varied = SEARCHED_FIELDS.get(s.framework, {})
    fixed = {k: getattr(s, k) for k in FIXED_FIELDS if not s.is_default(k) or k in varied}
    kw = dict(framework=s.framework, precision=s.precision, attention=s.attention, compile=s.compile,
              tp_comm_overlap=(s.tp_comm_overlap or "",), fixed=fixed, zero=(s.zero,), fsdp=(s.fsdp,),
              recompute=(s.recompute,), sequence_parallel=(s.sequence_parallel,), tp_overlap=(s.tp_overlap,),
              dp_overlap=(s.dp_overlap,), cp=tuple(sorted({1, s.cp})), offload_layers=(s.offload_layers,),
              max_micro_batch=max(SEARCH_LIMITS["micro_batch"], s.micro_batch),
              max_virtual_stages=max(SEARCH_LIMITS["virtual_stages"], s.virtual_stages))
    if s.schedule in ZERO_BUBBLE:
        kw["schedule"] = (s.schedule,)
    held = SEARCHED | set(FIXED_FIELDS) | {"attention", "tp_comm_overlap"}
    defaults = Strategy()
    gaps = [f"{k}={getattr(s, k)!r}" for k in (f.name for f in fields(Strategy)) if k not in held
            and _set_away(s, k, defaults) and not k.startswith("bucket_mb")]
    return kw, tuple(gaps + (["global_batch unset"] if s.global_batch is None else []))


def _rank(top: pd.DataFrame, published_s: float, top_k: int) -> str:
    faster = int((top["step_time"] < published_s).sum())
    return f">{top_k}" if faster >= top_k else str(faster + 1)


def rank_case(case, top_k: int = 200, *, whole_space: bool = True) -> SearchRank:
    """The published plan of ``case`` priced and ranked in the default space (see the module docstring);
    ``whole_space=False`` searches only at the run's precision (the whole space's columns are then NaN)."""
    s = case.strategy
    p = predict(case.model, case.cluster, s)
    batch = s.global_batch if s.global_batch is not None else s.dp * s.micro_batch
    same = search(case.model, case.cluster, batch, top_k=top_k, precision=s.precision)
    top = search(case.model, case.cluster, batch, top_k=top_k) if whole_space else None
    like_kw, like_gaps = like_space(s)
    inf = float("inf")

    def best(df):
        return float("nan") if df is None else float(df["step_time"].min()) if len(df) else inf
    try:
        own = search(case.model, case.cluster, batch, top_k=top_k, **like_kw)
        like, best_like = _rank(own, p.step_time, top_k), best(own)
    except PerfModelError as e:  # e.g. one data-parallel rank: the space enumerates no sharded layout of it
        like, best_like = "-", float("nan")
        like_gaps = (*like_gaps, f"no layout of its stack: {str(e).split(':')[0]}")
    return SearchRank(case.label, float(p.step_time), bool(p.fits),
                      "" if top is None else _rank(top, p.step_time, top_k), _rank(same, p.step_time, top_k),
                      best(top), best(same), space_gaps(s), like, like_gaps, best_like)


def rank_runs(only: str | None = None, top_k: int = 200):
    """Every published run whose label contains ``only`` (all: None), ranked one after the other."""
    return (rank_case(c, top_k) for _, c in published_cases() if only is None or only in c.label)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perfmodel.validate.search_ranks", description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="rank only the runs whose name contains this")
    ap.add_argument("--top", type=int, default=200, help="search rows kept per run (default 200)")
    args = ap.parse_args(argv)
    if args.top < 1:
        ap.error(f"--top must be >= 1: got {args.top}")
    print(f"{'run':34} {'published s':>11} {'fits':>5} {'rank':>5} {'same prec':>9} {'like':>5} {'gap':>6} "
          f"{'best s':>8} {'best same':>9}  gaps (of the default space; of its own stack's)")
    ranks = []
    for r in rank_runs(args.only, args.top):
        ranks.append(r)
        print(f"{r.name:34} {r.published_s:11.3f} {str(r.fits):>5} {r.rank:>5} {r.rank_same_precision:>9} "
              f"{r.rank_like:>5} {r.like_gap:+6.1%} {r.best_s:8.3f} {r.best_same_precision_s:9.3f}  {', '.join(r.gaps)}"
              f"{'; ' + ', '.join(r.like_gaps) if r.like_gaps else ''}", flush=True)
    def near(key):
        return sum(getattr(r, key).isdigit() and int(getattr(r, key)) <= NEAR_TOP for r in ranks)
    print(f"{len(ranks)} runs: {sum(r.fits for r in ranks)} published plans predicted to fit; best plan at least as "
          f"fast in {sum(r.beaten for r in ranks)}; published plan in the first {NEAR_TOP} "
          f"at its own precision in {near('rank_same_precision')}, in its own stack's space in {near('rank_like')} "
          f"(that space holds it whole in {sum(not r.like_gaps for r in ranks)}), priced within 5% of that space's "
          f"best in {sum(r.like_gap <= 0.05 for r in ranks)}, within 10% in {sum(r.like_gap <= 0.10 for r in ranks)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
