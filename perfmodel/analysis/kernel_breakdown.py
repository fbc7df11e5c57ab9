"""Where a step's kernel time goes: one rank's kernels by part, phase and cost class.

``kernel_breakdown(model, cluster, strategy)`` lists the kernels ``pm.predict`` prices for the busiest
pipeline stage (its transformer blocks, the embedding on the first stage, the head and loss on the last) by
cost class (``gemm``, ``sdpa``, ``copy``, ``rope``, ``swiglu``, ``layernorm``, ...), with GPU and host seconds
per micro-batch and per step. It answers "is this step GEMM-bound, attention-bound or memory-bound?" before
anyone profiles it. The seconds are the kernels' own, each priced alone (``costs.compute.kernel_time``): the
prediction's forward and backward add the pipeline's composition, host time where it exceeds the GPU's, and
the slowest GPU's pace (docs/distributed.md); communication, the optimizer and waits are not kernels of a
block and are in ``Prediction.breakdown``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from perfmodel.core.errors import InvalidInputError
from perfmodel.costs.compute import class_totals
from perfmodel.hardware import as_cluster
from perfmodel.parallel.pipeline import stages
from perfmodel.parallel.strategy import Strategy
from perfmodel.predict import checked_step, default_profile, profile_for
from perfmodel.step import kernel_lists
from perfmodel.workload.graph import GraphModel
from perfmodel.workload.presets import as_model
from perfmodel.workload.stacks.composer import run_strategy

PARTS = {"layer_f": ("blocks", "forward"), "layer_b": ("blocks", "backward"), "embed_f": ("embedding", "forward"),
         "embed_b": ("embedding", "backward"), "head_f": ("head and loss", "forward"),
         "head_b": ("head and loss", "backward")}
COLUMNS = ("part", "phase", "class", "launches", "gpu_s_per_micro_batch", "gpu_s_per_step", "cpu_s_per_step", "share")


def kernel_breakdown(model, cluster=None, strategy: Strategy | None = None, *, profile=None) -> pd.DataFrame:
    """One row per (part, phase, class) of the busiest pipeline stage's kernels, largest first: launches and GPU
    seconds per micro-batch (per block for the blocks), GPU and host seconds per step (x micro-batches, x the
    stage's blocks) and the share of the stage's kernel GPU time. A traced graph (a CNN) is one part, "whole
    graph". ``attrs`` hold the stage's blocks (0 for a graph), the micro-batches per step and the profile's name."""
    cluster, model = as_cluster(cluster), as_model(model)
    s = strategy or Strategy()
    if not isinstance(s, Strategy):
        raise InvalidInputError(f"'strategy' must be a perfmodel.Strategy: got {type(s).__name__}")
    s, c, cluster = checked_step(model, cluster, s)  # what pm.predict refuses, refused alike
    prof = default_profile(cluster) if profile is None else profile_for(cluster, profile)
    local = replace(model, seq=model.seq // s.cp) if s.cp > 1 else model
    parts, _ = kernel_lists(local, c, run_strategy(s).precision, s.recompute, prof.gpu)
    blocks = float(max(np.max(st.layers) for st in stages(model, c)))
    m = float(np.max(c.micro_batches))
    graph = isinstance(model, GraphModel)
    rows = []
    for key, kernels in parts.items():
        part, phase = PARTS[key]
        part = "whole graph" if graph and part == "blocks" else part
        per_step = m * (blocks if part == "blocks" else 1.0)  # a graph's one part is its whole step
        rows += [{"part": part, "phase": phase, "class": cls, "launches": float(np.max(n)),
                  "gpu_s_per_micro_batch": float(np.max(g)), "gpu_s_per_step": float(np.max(g)) * per_step,
                  "cpu_s_per_step": float(np.max(h)) * per_step}
                 for cls, (n, g, h) in class_totals(prof, kernels).items()]
    df = pd.DataFrame(rows, columns=COLUMNS[:-1])
    total = df["gpu_s_per_step"].sum()
    df["share"] = df["gpu_s_per_step"] / total if total > 0 else 0.0
    df = df.sort_values("gpu_s_per_step", ascending=False, kind="stable").reset_index(drop=True)
    df.attrs.update(blocks=0.0 if graph else blocks, micro_batches=m, profile=prof.name)
    return df


def class_shares(df: pd.DataFrame) -> pd.Series:
    """Each class's share of the kernel GPU time, over parts and phases, largest first."""
    return df.groupby("class")["share"].sum().sort_values(ascending=False)
