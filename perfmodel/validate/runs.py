"""The published multi-GPU runs scored per stack and per GPU, with the worst rows' term breakdown.

    python -m perfmodel.validate.runs               # per-stack and per-GPU medians, the 8 worst rows
    python -m perfmodel.validate.runs --worst 15    # ... the 15 worst
    perfmodel validate --published                  # the same from the command line

Rows: ``published_runs.csv`` (Megatron-LM, DeepSpeed and Llama 3 runs), ``published_stack_runs.csv``
(TorchTitan paper) and ``published_check_runs.csv`` (FSDP1, FSDP2 and Megatron-Core runs), each
predicted with its GPU's bundled profile. Nothing is fitted to them: this is the project's own check
set. The error is on throughput, measured step / predicted step - 1: positive when the model
predicts the run faster than it ran. A row's terms are shares of its predicted step: compute
(forward, backward, optimizer), exposed communication (tensor, data, pipeline p2p), the pipeline
bubble and exposed host overhead.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import pandas as pd

from perfmodel.core.entry import run_command
from perfmodel.predict import predict
from perfmodel.validate.measured import Case
from perfmodel.validate.published import read_published, read_published_checks, read_published_stacks

SOURCES = {"published_runs.csv": read_published, "published_stack_runs.csv": read_published_stacks,
           "published_check_runs.csv": read_published_checks}
TERMS = {"compute": ("forward", "backward", "optimizer"), "exposed_comm": ("tp_comm", "dp_comm", "p2p"),
         "bubble": ("pipeline_bubble",), "host": ("host_overhead",)}


@dataclass(frozen=True)
class ScoredRun:
    """One published run against its prediction."""

    file: str
    name: str
    stack: str
    gpu: str
    gpus: int
    measured_s: float
    predicted_s: float
    fits: bool
    shares: dict  # term -> share of the predicted step

    @property
    def error(self) -> float:
        """Throughput error: measured step / predicted step - 1 (positive: predicted too fast)."""
        return self.measured_s / self.predicted_s - 1


def published_cases() -> list[tuple[str, Case]]:
    """(file, case) of every bundled published run."""
    return [(name, c) for name, read in SOURCES.items() for c in read()]


def score_case(file: str, case: Case) -> ScoredRun:
    """Predict one published run and split its predicted step into terms."""
    p = predict(case.model, case.cluster, case.strategy)
    b = p.breakdown
    shares = {term: float(sum(b[k] for k in keys) / p.step_time) for term, keys in TERMS.items()}
    return ScoredRun(file=file, name=case.label, stack=case.strategy.framework, gpu=case.cluster.gpu.name,
                     gpus=int(case.cluster.n_gpus), measured_s=float(case.measured), predicted_s=float(p.step_time),
                     fits=bool(p.fits), shares=shares)


def score_runs(cases: list[tuple[str, Case]] | None = None) -> pd.DataFrame:
    """One row per published run: file, name, stack, GPU, GPUs, steps, error and the term shares."""
    scored = [score_case(f, c) for f, c in (published_cases() if cases is None else cases)]
    return pd.DataFrame([{"file": s.file, "name": s.name, "stack": s.stack, "gpu": s.gpu, "gpus": s.gpus,
                          "measured_s": s.measured_s, "predicted_s": s.predicted_s, "error": s.error,
                          "fits": s.fits, **s.shares} for s in scored])


def by_group(results: pd.DataFrame, key: str) -> pd.DataFrame:
    """Per value of ``key`` ("stack", "gpu"): rows, median |error|, median error, and the range."""
    g = results.assign(abs_error=results.error.abs()).groupby(key)
    return pd.DataFrame({"rows": g.size(), "median_abs_error": g.abs_error.median(),
                         "median_error": g.error.median(), "min_error": g.error.min(),
                         "max_error": g.error.max()}).sort_index()


def worst(results: pd.DataFrame, n: int = 8) -> pd.DataFrame:
    """The ``n`` rows of largest |error|, with their term shares."""
    order = results.error.abs().sort_values(ascending=False).index[:n]
    return results.loc[order, ["name", "stack", "gpu", "gpus", "measured_s", "predicted_s", "error", *TERMS]]


def report(results: pd.DataFrame, n_worst: int = 8) -> str:
    """The per-stack and per-GPU tables and the worst rows, as text."""
    pct = {"median_abs_error": "{:.1%}".format, "median_error": "{:+.1%}".format, "min_error": "{:+.1%}".format,
           "max_error": "{:+.1%}".format}
    share = {t: "{:.0%}".format for t in TERMS} | {"error": "{:+.1%}".format, "measured_s": "{:.3g}".format,
                                                   "predicted_s": "{:.3g}".format}
    lines = [f"{len(results)} published runs; error = measured step / predicted step - 1 (+: predicted too fast); "
             f"median |error| {results.error.abs().median():.1%}", "", "per stack:",
             by_group(results, "stack").to_string(formatters=pct), "", "per GPU:",
             by_group(results, "gpu").to_string(formatters=pct), "", f"worst {n_worst} (terms: shares of the "
             "predicted step):", worst(results, n_worst).to_string(index=False, formatters=share)]
    unfit = results["name"][~results["fits"]].tolist()
    if unfit:
        lines.append(f"predicted not to fit in memory although they ran: {', '.join(unfit)}")
    return "\n".join(lines)


def median_abs_error(results: pd.DataFrame) -> float:
    return float(np.median(results.error.abs()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m perfmodel.validate.runs", description=__doc__.splitlines()[0])
    ap.add_argument("--worst", type=int, default=8, help="how many of the worst rows to list (default 8)")
    args = ap.parse_args(argv)
    if args.worst < 0:
        ap.error(f"--worst must be >= 0: got {args.worst}")
    pd.set_option("display.width", 200)
    print(report(score_runs(), args.worst))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
