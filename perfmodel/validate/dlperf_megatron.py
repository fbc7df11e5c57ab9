"""Megatron-LM of March 2021 on 1-32 V100, as OneFlow's DLPerf measured it: a check kept apart.

    python -m perfmodel.validate.dlperf_megatron     # every row: measured and predicted step, error, terms

``perfmodel/data/published_dlperf_megatron_runs.csv`` (the columns of ``published_check_runs.csv``; sources in
``published_runs.md``): 16 GPT runs (hidden 768-3,072, 12-32 layers, sequence 2,048, fp16, every layer
recomputed) of NVIDIA/Megatron-LM @8aa4619f under TP, PP and DP splits on four servers of 8 V100-SXM2-16GB
(NVLink hybrid cube mesh), each with one 100 Gb/s EDR port on its first socket. Nothing is fitted to them.

They are kept out of ``validate.runs`` and of the interval calibration: the rows predicted far too fast ran on
things ``pm.Strategy`` and the cluster files do not express, which would widen every interval of their regime
(docs/validation.md, "Megatron-LM of 2021 on V100"). That Megatron sends each pipeline activation whole from every
tensor-parallel rank (``training.communicate`` at that commit: no scatter/gather), about the whole gap of the three
rows with tp > 1 and pp > 1; a tensor-parallel pair on GPUs 0 and 1 of the hybrid cube mesh shares one NVLink of
six (``nvidia-smi topo -m`` on the DLPerf page), about the whole gap of the tp = 2 row; and the one NIC of each
server sits behind the inter-socket link for GPUs 4-7, whose cost to the rows with tensor parallelism across
servers (+47%, +79%) is not known.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from perfmodel.core.entry import no_options, run_command
from perfmodel.validate.published import read_published_checks
from perfmodel.validate.runs import TERMS, score_runs

DLPERF_CSV = Path(__file__).resolve().parent.parent / "data" / "published_dlperf_megatron_runs.csv"


def cases() -> list[tuple[str, object]]:
    """(file, case) of every row, as ``validate.runs.score_runs`` takes them."""
    return [(DLPERF_CSV.name, c) for c in read_published_checks(DLPERF_CSV)]


def main(argv=None) -> int:
    no_options(__doc__, argv)
    results = score_runs(cases())
    fmt = {"error": "{:+.1%}".format, "measured_s": "{:.3f}".format, "predicted_s": "{:.3f}".format,
           **{t: "{:.0%}".format for t in TERMS}}
    pd.set_option("display.width", 200)
    table = results[["name", "gpus", "measured_s", "predicted_s", "error", *TERMS]]
    print(table.to_string(index=False, formatters=fmt))
    print(f"\n{len(results)} rows; error = measured step / predicted step - 1 (+: predicted too fast); "
          f"median |error| {results.error.abs().median():.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
