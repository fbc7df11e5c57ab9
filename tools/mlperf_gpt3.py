"""Step times of MLPerf Training GPT-3 175B submissions on H100 (NVIDIA, Azure, Oracle), read from their logs.

    python -m tools.mlperf_gpt3 CLONE_OF_training_results_v3.1 CLONE_OF_training_results_v4.0 CLONE_OF_..._v4.1

(clones of github.com/mlcommons/training_results_v3.1, _v4.0 and _v4.1). Each ``result_<n>.txt`` logs MLPerf's
``block_start`` / ``block_stop`` events around the training between two evaluations, with the block's size in
tokens (``epoch_count``) and the run's ``global_batch_size`` and ``max_sequence_length``: a block is
epoch_count / (global batch x sequence) optimizer steps, its step time the block's wall time over that. The
printed step is the median over every block of every run of a system (the evaluations are outside the blocks).
The rows of ``perfmodel/data/published_check_runs.csv`` named ``mlperf-*`` carry these medians.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess

from perfmodel.core.entry import run_command

# (row name, training_results version, result folder) as published_check_runs.csv names them; a folder is
# NVIDIA's unless it names its submitter ("Azure+NVIDIA/...")
SYSTEMS = [("mlperf-v3.1-gpt3-512", "v3.1", "eos_n64_ngc23.09_nemo"),
           ("mlperf-v3.1-gpt3-768", "v3.1", "eos_n96_ngc23.09_nemo"),
           ("mlperf-v3.1-gpt3-4096", "v3.1", "eos-dfw_n512_ngc23.09_nemo"),
           ("mlperf-v3.1-gpt3-6144", "v3.1", "eos-dfw_n768_ngc23.09_nemo"),
           ("mlperf-v3.1-gpt3-8192", "v3.1", "eos-dfw_n1024_ngc23.09_nemo"),
           ("mlperf-v3.1-gpt3-10240", "v3.1", "eos-dfw_n1280_ngc23.09_nemo"),
           ("mlperf-v3.1-gpt3-10752", "v3.1", "eos-dfw_n1344_ngc23.09_nemo"),
           ("mlperf-v3.1-gpt3-10752-azure", "v3.1", "Azure+NVIDIA/ND_H100_v5_n1344_pytorch"),
           ("mlperf-v4.0-gpt3-512", "v4.0", "eos_n64_ngc24.04_nemo"),
           ("mlperf-v4.0-gpt3-10752", "v4.0", "eos-dfw_n1344_ngc24.04_nemo"),
           ("mlperf-v4.0-gpt3-11616", "v4.0", "eos-dfw_n1452_ngc24.04_nemo"),
           ("mlperf-v4.1-gpt3-256", "v4.1", "eos_n32_ngc24.09_nemo"),
           ("mlperf-v4.1-gpt3-512", "v4.1", "eos_n64_ngc24.09_nemo"),
           ("mlperf-v4.1-gpt3-1536-oci", "v4.1", "Oracle/1536xBM.GPU.H100.8"),
           ("mlperf-v4.1-gpt3-3072-oci", "v4.1", "Oracle/3072xBM.GPU.H100.8")]


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True, check=True).stdout


def block_steps(log: str) -> tuple[list[float], dict]:
    """(seconds per step of each training block, the run's batch keys) of one MLPerf result log."""
    events = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.splitlines() if ":::MLLOG " in line]
    keys = {e["key"]: e["value"] for e in events
            if e["key"] in ("global_batch_size", "max_sequence_length", "gradient_accumulation_steps")}
    tokens_per_step = keys["global_batch_size"] * keys["max_sequence_length"]
    steps, start = [], None
    for e in events:
        if e["key"] == "block_start":
            start = e
        elif e["key"] == "block_stop" and start is not None:
            n = e["metadata"]["epoch_count"] / tokens_per_step
            steps.append((e["time_ms"] - start["time_ms"]) / 1000.0 / n)
            start = None
    return steps, keys


def result_logs(repo: str, folder: str, benchmark: str = "gpt3") -> list[str]:
    """The text of every ``result_<n>.txt`` of one system's submission to ``benchmark``, in run order."""
    org, _, folder = folder.rpartition("/")
    names = _git(repo, "ls-tree", "--name-only", "HEAD", f"{org or 'NVIDIA'}/results/{folder}/{benchmark}/").split()
    logs = sorted(n for n in names if re.search(r"result_\d+\.txt$", n))
    return [_git(repo, "show", f"HEAD:{name}") for name in logs]


def system_step(repo: str, folder: str) -> tuple[float, int, dict]:
    """(median step seconds, blocks, batch keys) over the result logs of one system's GPT-3 submission."""
    steps, keys = [], {}
    for log in result_logs(repo, folder):
        these, keys = block_steps(log)
        steps += these
    return statistics.median(steps), len(steps), keys


def clone(path: str) -> str:
    """``path`` if it is a git clone (the argument type of the commands), else an error naming it."""
    if subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        raise argparse.ArgumentTypeError(f"{path!r} is not a clone of an mlcommons training_results repository")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for version in ("v3.1", "v4.0", "v4.1"):
        parser.add_argument(f"training_results_{version}", type=clone, help=f"a clone of training_results_{version}")
    args = vars(parser.parse_args(argv))
    for row, version, folder in SYSTEMS:
        step, blocks, keys = system_step(args[f"training_results_{version}"], folder)
        print(f"{row}: {step:.4f} s per step over {blocks} blocks ({folder}; {keys})")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
