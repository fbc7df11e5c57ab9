"""How much of the FSDP check rows' measured step their sharding collectives would explain unhidden.

    python -m tools.fsdp_overlap

For each FSDP check row (FSDP1 and FSDP2 stacks, no tensor or pipeline parallelism) it prints, per
micro-batch: the data-parallel seconds the step prices as exposed; that plus what the measurement leaves
unexplained ((measured − predicted step) / micro-batches), which is the exposed communication the row would
need if everything else were priced right; and every FSDP collective of the micro-batch added up (each
unit's forward and backward all-gather and its reduce-scatter, with a hybrid row's all-reduce across nodes),
which is what an unhidden micro-batch would add. Where the second tracks the third the measurement reads as
collectives that did not overlap; where it sits far under, the priced overlap holds. Check data: nothing is
fitted (docs/stacks.md, "The FSDP1 check rows").
"""

from __future__ import annotations

import argparse
from unittest import mock

import numpy as np

import perfmodel.parallel.data as data
from perfmodel.core.entry import run_command
from perfmodel.predict import predict
from perfmodel.validate.published import read_published_checks, read_published_stacks

SHARDED = ("fsdp1", "torchtitan", "composer")


def _first(x) -> float:
    return float(np.ravel(x)[0])


def collectives_per_micro_batch(case) -> tuple[float, object]:
    """(seconds of every FSDP collective of one micro-batch, the prediction) of a published ``case``."""
    seen = {}
    real = data.stacked_time

    def record(coll, name, sizes, *args, **kwargs):
        out = real(coll, name, sizes, *args, **kwargs)
        seen[name] = [_first(x) for x in out]
        return out

    with mock.patch.object(data, "stacked_time", record):
        p = predict(case.model, case.cluster, case.strategy)
    s = case.strategy
    hybrid = s.fsdp == "hybrid" and case.cluster.nodes > 1
    counts = (case.model.layers, 1, 1)  # the units zero3_time prices: blocks, embedding, head
    ag, rs, ar = seen["all_gather"], seen["reduce_scatter"], seen.get("all_reduce", [0.0] * 3)
    total = sum(n * (2.0 * ag[i] + rs[i] + (ar[i] if hybrid else 0.0)) for i, n in enumerate(counts))
    return total, p


def rows() -> list[dict]:
    """One dict per FSDP check row: name, GPU, micro-batches, error, and the three per-micro-batch seconds."""
    out = []
    for case in read_published_checks() + read_published_stacks():
        s = case.strategy
        if s.framework not in SHARDED or s.tp > 1 or s.pp > 1 or s.cp > 1:
            continue
        total, p = collectives_per_micro_batch(case)
        mb = s.micro_batches
        exposed = p.breakdown["dp_comm"] / mb
        out.append({"name": case.label, "gpu": case.cluster.gpu.name, "micro_batches": mb,
                    "error": case.measured / p.step_time - 1.0, "exposed_s": exposed,
                    "needed_s": exposed + (case.measured - p.step_time) / mb, "all_s": total})
    return out


def main(argv=None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print(f"{'row':40s} {'gpu':26s} {'mb':>4s} {'error':>7s}  per micro-batch, ms: exposed  needed  all")
    for r in sorted(rows(), key=lambda r: (r["gpu"], r["name"])):
        print(f"{r['name']:40s} {r['gpu']:26s} {r['micro_batches']:4d} {r['error']:+7.1%}  "
              f"{r['exposed_s'] * 1e3:24.1f} {r['needed_s'] * 1e3:7.1f} {r['all_s'] * 1e3:7.1f}")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
