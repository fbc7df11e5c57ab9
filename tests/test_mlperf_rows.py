"""The MLPerf GPT-3 check rows: step times read from the submissions' result logs, and the rows as priced."""

from __future__ import annotations

import subprocess

import numpy as np

from perfmodel.validate.published import read_published_checks
from tools.mlperf_gpt3 import SYSTEMS, block_steps, result_logs
from tools.mlperf_llama31 import SYSTEMS as LLAMA_SYSTEMS
from tools.mlperf_llama31 import logged_steps as llama_steps


def test_an_mlperf_block_gives_its_wall_time_over_its_steps():
    log = "\n".join([
        ':::MLLOG {"key": "global_batch_size", "value": 4, "time_ms": 0, "metadata": {}}',
        ':::MLLOG {"key": "max_sequence_length", "value": 8, "time_ms": 0, "metadata": {}}',
        ':::MLLOG {"key": "block_start", "value": null, "time_ms": 1000, "metadata": {"epoch_count": 96}}',
        ':::MLLOG {"key": "block_stop", "value": null, "time_ms": 7000, "metadata": {"epoch_count": 96}}',
        ':::MLLOG {"key": "eval_start", "value": null, "time_ms": 7000, "metadata": {}}',
        ':::MLLOG {"key": "block_start", "value": null, "time_ms": 9000, "metadata": {"epoch_count": 64}}',
        ':::MLLOG {"key": "block_stop", "value": null, "time_ms": 13000, "metadata": {"epoch_count": 64}}'])
    steps, keys = block_steps(log)
    assert np.allclose(steps, [6.0 / 3, 4.0 / 2])  # 96 / (4 x 8) = 3 steps in 6 s; 64 tokens: 2 steps in 4 s
    assert keys == {"global_batch_size": 4, "max_sequence_length": 8}


def test_every_mlperf_system_is_a_check_row_priced_with_its_configuration():
    rows = {c.label: c for c in read_published_checks() if c.label.startswith("mlperf-") and "gpt3" in c.label}
    assert set(rows) == {name for name, _, _ in SYSTEMS}
    v4 = rows["mlperf-v4.0-gpt3-10752"]
    assert (v4.strategy.tp, v4.strategy.pp, v4.strategy.virtual_stages, v4.strategy.micro_batch) == (4, 6, 8, 1)
    assert v4.strategy.fp8_params and v4.strategy.dp * 24 == 10752 and v4.measured == 0.9207


def test_an_mlperf_llama_log_gives_each_logged_training_step():
    log = "\n".join([
        ':::MLLOG {"key": "global_batch_size", "value": 1152, "time_ms": 0, "metadata": {}}',
        ':::MLLOG {"key": "tracked_stats", "value": {"train_step_time": 14.2, "reduced_train_loss": 7.7}, '
        '"time_ms": 1, "metadata": {"step": 1152.0}}',
        ':::MLLOG {"key": "tracked_stats", "value": {"validation_step_time": 4.9}, "time_ms": 2, "metadata": {}}',
        ':::MLLOG {"key": "tracked_stats", "value": {"throughput": 81.0, "train_step_time": 14.22}, '
        '"time_ms": 3, "metadata": {"step": 0}}',  # a block's summary: a mean, not a step
        ':::MLLOG {"key": "tracked_stats", "value": {"train_step_time": 16.0, "reduced_train_loss": 7.6}, '
        '"time_ms": 4, "metadata": {"step": 2304.0}}'])
    steps, keys = llama_steps(log)
    assert steps == [14.2, 16.0] and keys == {"global_batch_size": 1152}


def test_every_mlperf_llama_system_is_a_check_row_priced_with_its_configuration():
    rows = {c.label: c for c in read_published_checks() if c.label.startswith("mlperf-v5.0-llama31")}
    assert set(rows) == {name for name, _ in LLAMA_SYSTEMS}
    r = rows["mlperf-v5.0-llama31-405b-2432"]
    s = r.strategy
    assert (s.tp, s.pp, s.virtual_stages, s.cp, s.micro_batch, s.dp) == (8, 8, 8, 2, 1, 19)
    assert s.global_batch == 1216 and s.fp8_params and s.stage_layers[0] == s.stage_layers[-1] == 15
    assert r.model.layers == 126 and r.measured == 12.7273


def test_result_logs_are_nvidias_unless_the_folder_names_its_submitter(tmp_path):
    for path, text in (("NVIDIA/results/eos/gpt3/result_1.txt", "b"), ("NVIDIA/results/eos/gpt3/result_0.txt", "a"),
                       ("Oracle/results/oci/gpt3/result_0.txt", "c"), ("Oracle/results/oci/gpt3/scaling.json", "{}")):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "logs"], check=True)
    assert result_logs(str(tmp_path), "eos") == ["a", "b"]
    assert result_logs(str(tmp_path), "Oracle/oci") == ["c"]


def test_the_gb200_llama_rows_are_nvl72_racks_of_64_gpus():
    rows = {c.label: c for c in read_published_checks() if c.label.startswith("mlperf-v5.0-llama31-405b-gb200")}
    assert len(rows) == 7
    r = rows["mlperf-v5.0-llama31-405b-gb200-2496-cw"]
    s, node = r.strategy, r.cluster.node
    assert (s.tp, s.pp, s.virtual_stages, s.cp, s.dp, s.global_batch) == (4, 8, 8, 2, 39, 1248)
    assert r.cluster.gpu.name == "gb200-186gb" and r.cluster.n_gpus == 2496  # 39 racks of 16 trays of 4
    assert node.gpus_per_node == 64 and node.nics_per_node == 64 and r.measured == 5.8258
