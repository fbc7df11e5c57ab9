"""Step times of the MLPerf Training Llama 3.1 405B submissions on H100 and GB200, read from their public result logs.

    python -m tools.mlperf_llama31 CLONE_OF_training_results_v5.0

(a clone of github.com/mlcommons/training_results_v5.0). The submission's callback logs every optimizer step's
wall time (``tracked_stats`` ``train_step_time``, ``NVIDIA/benchmarks/llama31_405b/implementations/*/
custom_callbacks.py``), evaluations apart (``validation_step_time``). The printed step is the median over every
logged training step of the system's runs, with the run's batch keys. The rows of
``perfmodel/data/published_check_runs.csv`` named ``mlperf-v5.0-llama31-*`` carry these medians: NVIDIA's on Eos
(DGX H100) and Tyche (GB200 NVL72), and IBM, CoreWeave and NVIDIA's on Carina (GB200 NVL72, CoreWeave's cloud).
"""

from __future__ import annotations

import argparse
import json
import statistics

from perfmodel.core.entry import run_command
from tools.mlperf_gpt3 import clone, result_logs

# (row name, result folder) as published_check_runs.csv names them: Eos DGX H100, NeMo 25.01
SYSTEMS = [("mlperf-v5.0-llama31-405b-512", "eos-dfw_n64_ngc25.01_nemo"),
           ("mlperf-v5.0-llama31-405b-2048", "eos-dfw_n256_ngc25.01_nemo"),
           ("mlperf-v5.0-llama31-405b-2432", "eos-dfw_n304_ngc25.01_nemo"),
           ("mlperf-v5.0-llama31-405b-2560", "eos-dfw_n320_ngc25.01_nemo"),
           ("mlperf-v5.0-llama31-405b-8192", "eos-dfw_n1024_ngc25.01_nemo"),
           # GB200 NVL72 racks, NeMo 25.04; a folder of another submitter is named with it (tools.mlperf_gpt3.result_logs)
           ("mlperf-v5.0-llama31-405b-gb200-256", "tyche_ngpu256_ngc25.04_nemo"),
           ("mlperf-v5.0-llama31-405b-gb200-512", "tyche_ngpu512_ngc25.04_nemo"),
           *((f"mlperf-v5.0-llama31-405b-gb200-{n}-cw", f"IBM+CoreWeave+NVIDIA/carina_ngpu{n}_ngc25.04_nemo")
             for n in (512, 1024, 1536, 2048, 2496))]
KEYS = ("global_batch_size", "max_sequence_length", "gradient_accumulation_steps")


def logged_steps(log: str) -> tuple[list[float], dict]:
    """(each training step's logged seconds, the run's batch keys) of one MLPerf result log."""
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.splitlines() if ":::MLLOG " in line]
    keys = {e["key"]: e["value"] for e in events if e["key"] in KEYS}
    steps = [float(e["value"]["train_step_time"]) for e in events
             if e["key"] == "tracked_stats" and isinstance(e["value"], dict) and "train_step_time" in e["value"]
             and "reduced_train_loss" in e["value"]]  # per step; the block summary repeats a mean without the loss
    return steps, keys


def system_step(repo: str, folder: str) -> tuple[float, int, dict]:
    """(median step seconds, steps, batch keys) over the result logs of one system's Llama 3.1 405B runs."""
    steps, keys = [], {}
    for log in result_logs(repo, folder, "llama31_405b"):
        these, keys = logged_steps(log)
        steps += these
    return statistics.median(steps), len(steps), keys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("training_results_v5_0", type=clone, help="a clone of training_results_v5.0")
    repo = parser.parse_args(argv).training_results_v5_0
    for row, folder in SYSTEMS:
        step, n, keys = system_step(repo, folder)
        print(f"{row}: {step:.4f} s per step over {n} steps ({folder}; {keys})")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
