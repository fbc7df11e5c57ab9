"""The MLPerf GPT-3 check rows: step times read from the submissions' result logs, and the rows as priced."""

from __future__ import annotations

import numpy as np

from perfmodel.validate.published import read_published_checks
from tools.mlperf_gpt3 import SYSTEMS, block_steps


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
    rows = {c.label: c for c in read_published_checks() if c.label.startswith("mlperf-")}
    assert set(rows) == {name for name, _, _ in SYSTEMS}
    v4 = rows["mlperf-v4.0-gpt3-10752"]
    assert (v4.strategy.tp, v4.strategy.pp, v4.strategy.virtual_stages, v4.strategy.micro_batch) == (4, 6, 8, 1)
    assert v4.strategy.fp8_params and v4.strategy.dp * 24 == 10752 and v4.measured == 0.9207
