"""Residual plots of a compute fit: measured against fitted time, one panel per class."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from perfmodel.core.extras import optional_import


def write_residual_plots(points: dict, folder: str | Path) -> list[Path]:
    """One PNG per class in ``folder``: fitted vs measured (log-log) and the relative residual."""
    matplotlib = optional_import("matplotlib", extra="plot", feature="residual plots")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for key, (measured, fitted) in points.items():
        measured, fitted = np.asarray(measured, float), np.asarray(fitted, float)
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
        ax1.loglog(measured * 1e6, fitted * 1e6, "o", ms=3)
        lo, hi = np.min(measured) * 1e6, np.max(measured) * 1e6
        ax1.plot([lo, hi], [lo, hi], "k--", lw=1)
        ax1.set_xlabel("measured time (µs)")
        ax1.set_ylabel("fitted time (µs)")
        ax1.set_title(key)
        ax2.semilogx(measured * 1e6, 100 * (fitted / measured - 1), "o", ms=3)
        ax2.axhline(0, color="k", lw=1)
        ax2.set_xlabel("measured time (µs)")
        ax2.set_ylabel("residual (%)")
        fig.tight_layout()
        path = folder / (key.replace(":", "_") + ".png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written
