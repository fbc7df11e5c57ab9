"""Validation: measure real training steps (or read measured ones), predict them, report the error.

    from perfmodel.validate import validate_measured, summarize, results_table
    results, bad = validate_measured("examples/measured_sample.csv")
    print(results_table(results))

Command line: ``perfmodel validate --measured FILE.csv`` or ``perfmodel validate --quick``.
See docs/validation.md.
"""

from perfmodel.validate.loop import (
    CPU_RUNS,
    GPU_RUNS,
    QUICK_RUNS,
    Run,
    Validation,
    calibrate_host,
    compare,
    coverage_by_regime,
    measure_runs,
    results_table,
    summarize,
    validate_measured,
    validate_runs,
)
from perfmodel.validate.measured import COLUMNS, RUN_COLUMNS, BadRow, Case, read_measured

__all__ = [
    "COLUMNS", "CPU_RUNS", "GPU_RUNS", "QUICK_RUNS", "RUN_COLUMNS", "BadRow", "Case", "Run", "Validation", "calibrate_host",
    "compare", "coverage_by_regime", "measure_runs", "read_measured", "results_table", "summarize", "validate_measured",
    "validate_runs",
]
