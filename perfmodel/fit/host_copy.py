"""Host <-> device copies fitted into a profile's ``host`` section (what activation offload prices).

Rows ``op`` = ``h2d`` / ``d2h`` with ``dtype`` = ``pinned`` (the calibration's ``h2d.jsonl``:
``tensor.to(device, non_blocking=True)`` from and into pinned host memory) are fitted to
t = latency + bytes · s_per_byte (Hockney 1994) by non-negative least squares on relative
errors, so small and large copies weigh alike (numpy only: the command line stays free of scipy). Read by ``perfmodel.costs.offload.host_copy_seconds``.
"""

from __future__ import annotations

import numpy as np

MIN_COPY_POINTS = 2


def fit_host_copies(table) -> dict:
    """``{"<dir>_latency_s", "<dir>_s_per_byte"}`` for each direction with >= 2 pinned sizes measured."""
    out = {}
    for direction in ("h2d", "d2h"):
        rows = table[(table.op == direction) & (table.dtype == "pinned")]
        size = rows["bytes"].to_numpy(float)
        secs = rows["time_s"].to_numpy(float)
        if len(np.unique(size)) < MIN_COPY_POINTS:
            continue
        # relative least squares: each row divided by its own time
        a = np.stack([np.ones_like(size), size], axis=1) / secs[:, None]
        latency, per_byte = np.linalg.lstsq(a, np.ones_like(secs), rcond=None)[0]
        if latency < 0:  # the constraint latency >= 0 binds: the line through the origin
            latency, per_byte = 0.0, float(np.linalg.lstsq(a[:, 1:], np.ones_like(secs), rcond=None)[0][0])
        out[f"{direction}_latency_s"] = float(latency)
        out[f"{direction}_s_per_byte"] = float(per_byte)
    return out
