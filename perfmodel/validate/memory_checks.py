"""Memory verdicts and readings against published runs: does what ran fit, does what ran out of memory not.

Run: ``python -m perfmodel.validate.memory_checks`` (prints every row, then the summary).

Four sources, none fitted to: ``data/memory_checks.csv`` (runs a source reports as having run or
run out of memory), the Llama 3 405B rows of ``published_runs.csv`` (they ran), the DGX Cloud and MLPerf rows
of ``published_check_runs.csv`` (they ran) and the TorchTitan paper's max-reserved readings in
``published_stack_runs.csv``. Each is scored twice: with the
allocator per stack (``costs/stack_memory.py``) and with the flat rule it replaced
(allocated x 1.05 + 0.5 GiB for every stack), so the change shows row by row (docs/memory.md).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import statistics
from dataclasses import dataclass
from pathlib import Path

from perfmodel.core.entry import no_options, run_command
from perfmodel.costs import memory as mem
from perfmodel.hardware import cluster
from perfmodel.parallel.strategy import Strategy
from perfmodel.predict import predict
from perfmodel.core.readers import read_text_file
from perfmodel.validate.published import read_published, read_published_checks, read_published_stacks
from perfmodel.workload.presets import preset

CHECKS_CSV = Path(__file__).resolve().parent.parent / "data" / "memory_checks.csv"
LLAMA3 = "llama3-405B"  # the Llama 3 405B rows of published_runs.csv
DGX_CLOUD = "dgxc-"  # the check rows of NVIDIA's DGX Cloud recipes (published_check_runs.csv)
MLPERF = "mlperf-"  # the check rows of NVIDIA's MLPerf Training submissions (published_check_runs.csv)
GIB = 2**30


@dataclass(frozen=True)
class MemoryCheck:
    """One published run scored: its outcome ("ran", "oom" or a reading in GiB) and the two predictions."""

    name: str
    outcome: str
    measured_gib: float | None
    allocated_gib: float
    fits: bool
    fits_flat: bool
    reading_gib: float
    reading_flat_gib: float
    source: str

    @property
    def verdict_right(self) -> bool | None:
        """Whether the per-stack verdict agrees with what happened (None for a reading)."""
        return None if self.outcome == "reading" else self.fits == (self.outcome == "ran")

    @property
    def flat_verdict_right(self) -> bool | None:
        return None if self.outcome == "reading" else self.fits_flat == (self.outcome == "ran")


def _flat_fits(p) -> bool:
    """The rule before allocators per stack: allocated x 1.05 + the CUDA context within capacity."""
    return p.peak_memory * (1 + mem.ALLOCATOR_RESERVE) + mem.CUDA_CONTEXT_BYTES <= p.memory_capacity


def _scored(name, outcome, measured, p, source) -> MemoryCheck:
    """One run scored. A reading is torchtitan's ``max_reserved`` (metrics.py: ``memory_stats()
    ["reserved_bytes.all.peak"]``, the caching allocator's alone, without the CUDA context), so it is
    compared with ``reserved_memory``; the flat rule keeps its old form (+ the context) for reference."""
    flat = p.peak_memory * (1 + mem.ALLOCATOR_RESERVE) + mem.CUDA_CONTEXT_BYTES
    return MemoryCheck(name, outcome, measured, p.peak_memory / GIB, bool(p.fits), _flat_fits(p),
                       p.reserved_memory / GIB, flat / GIB, source)


def read_checks(path: str | Path = CHECKS_CSV) -> list[dict]:
    """The rows of ``memory_checks.csv`` (one run each, with the source that reports its outcome)."""
    text = read_text_file(Path(path), field="memory checks", expect="the memory-checks CSV")
    return list(csv.DictReader(io.StringIO(text, newline="")))


def _csv_checks(path) -> list[MemoryCheck]:
    out = []
    for r in read_checks(path):
        m = dataclasses.replace(preset(r["preset"]), seq=int(r["seq"]))
        s = Strategy(dp=int(r["dp"]), micro_batch=int(r["micro_batch"]), framework=r["framework"],
                     recompute=r["recompute"])
        p = predict(m, cluster(r["node"], nodes=int(r["nodes"])), s)
        out.append(_scored(r["name"], r["outcome"], None, p, r["source"]))
    return out


def score(path: str | Path = CHECKS_CSV) -> list[MemoryCheck]:
    """Every published memory outcome scored (see the module docstring)."""
    checks = _csv_checks(path)
    # runs that trained: Llama Team 2024, Table 4; NVIDIA's DGX Cloud recipes and MLPerf runs on 80 GB H100s
    ran = [c for c in read_published() if c.label.startswith(LLAMA3)]
    ran += [c for c in read_published_checks() if c.label.startswith((DGX_CLOUD, MLPERF))]
    for case in ran:
        checks.append(_scored(case.label, "ran", None, predict(case.model, case.cluster, case.strategy), case.source))
    for case in (c for c in read_published_stacks() if "reserved_memory_bytes" in c.extra):
        p = predict(case.model, case.cluster, case.strategy)
        checks.append(_scored(case.label, "reading", case.extra["reserved_memory_bytes"] / GIB, p, case.source))
    return checks


def summary(checks: list[MemoryCheck]) -> dict:
    """Verdicts right (per stack, flat) and the median |error| of the readings (per stack, flat)."""
    verdicts = [c for c in checks if c.outcome != "reading"]
    readings = [c for c in checks if c.outcome == "reading"]

    def median_error(attr):
        return statistics.median(abs(getattr(c, attr) / c.measured_gib - 1) for c in readings) if readings else 0.0

    return {"verdicts": len(verdicts), "right": sum(bool(c.verdict_right) for c in verdicts),
            "right_flat": sum(bool(c.flat_verdict_right) for c in verdicts), "readings": len(readings),
            "median_error": median_error("reading_gib"), "median_error_flat": median_error("reading_flat_gib")}


def main(argv=None) -> None:
    no_options(__doc__, argv)
    checks = score()
    print(f"{'run':34} {'outcome':>8} {'alloc':>7} {'fits':>5} {'flat':>5} {'reading':>8} {'flat':>7}")
    for c in checks:
        outcome = f"{c.measured_gib:.1f}" if c.measured_gib is not None else c.outcome
        print(f"{c.name:34} {outcome:>8} {c.allocated_gib:7.1f} {str(c.fits):>5} {str(c.fits_flat):>5} "
              f"{c.reading_gib:8.1f} {c.reading_flat_gib:7.1f}")
    s = summary(checks)
    print(f"verdicts right: {s['right']}/{s['verdicts']} per stack, {s['right_flat']}/{s['verdicts']} flat; "
          f"readings (max reserved, {s['readings']} rows): median |error| {100 * s['median_error']:.1f}% "
          f"per stack, {100 * s['median_error_flat']:.1f}% flat")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
