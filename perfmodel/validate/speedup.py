"""The two errors of a multi-GPU check row: its absolute throughput and its speed-up over one GPU."""

from __future__ import annotations

import statistics


class SpeedupErrors:
    """Errors of a row with ``measured`` / ``predicted`` throughput and their speed-ups over the 1-GPU row
    (``measured_speedup`` / ``predicted_speedup``, NaN on that row)."""

    @property
    def error(self) -> float:
        """Predicted / measured throughput − 1 (+: predicted too fast)."""
        return self.predicted / self.measured - 1.0

    @property
    def speedup_error(self) -> float:
        """Predicted / measured speed-up − 1 (NaN on the 1-GPU rows)."""
        return self.predicted_speedup / self.measured_speedup - 1.0


def median_abs(values) -> float:
    """Median of |v| over the values that are not NaN (NaN when none are)."""
    vals = [abs(v) for v in values if v == v]
    return statistics.median(vals) if vals else float("nan")


def speedup_cell(r: SpeedupErrors, gpus: int) -> str:
    """The report's speed-up column of one row: measured / predicted and its error ("" on a 1-GPU row)."""
    return "" if gpus == 1 else f"{r.measured_speedup:5.2f}/{r.predicted_speedup:5.2f}  {r.speedup_error:+7.1%}"


def print_medians(medians: dict, width: int) -> None:
    """The report's closing medians: group -> (median |error| of throughput, of the speed-up, rows)."""
    print("\nmedian |error|: images/s, speed-up over 1 GPU (rows)")
    for k, (e, s, n) in medians.items():
        print(f"  {k:<{width}} {e:6.1%} {s:6.1%}  ({n})")
