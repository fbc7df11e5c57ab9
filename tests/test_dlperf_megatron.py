"""The DLPerf Megatron-LM V100 check rows (perfmodel/data/published_dlperf_megatron_runs.csv), kept apart."""

from __future__ import annotations

import math

from perfmodel.predict import predict
from perfmodel.validate import dlperf_megatron
from perfmodel.validate.runs import published_cases


def test_each_row_is_priced_as_its_script_ran_it():
    cases = [c for _, c in dlperf_megatron.cases()]
    assert len(cases) == 16
    for c in cases:
        s, m = c.strategy, c.model
        # --make-vocab-size-divisible-by 128, times the tensor-parallel size (GPT-2's 50,257 tokens)
        assert m.vocab % (128 * s.tp) == 0 and m.vocab - 50257 < 128 * s.tp
        assert (s.recompute, s.precision, s.framework, s.dp_overlap) == ("full", "fp16-mixed", "megatron", False)
        assert c.cluster.node.nics_per_node == 1 and c.cluster.n_gpus == s.dp * s.tp * s.pp
        p = predict(c.model, c.cluster, s)
        assert p.fits and math.isfinite(p.step_time) and p.step_time > 0


def test_they_are_not_among_the_rows_that_calibrate_the_intervals():
    assert not any(c.label.startswith("dlperf-") for _, c in published_cases())


def test_the_report_prints_every_row(capsys):
    assert dlperf_megatron.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("dlperf-megatron-") == 16 and "median |error|" in out
