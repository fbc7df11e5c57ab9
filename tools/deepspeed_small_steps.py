"""Predicted Megatron-DeepSpeed steps of small GPTs on one DGX A100 node, and how much is host work.

    python -m tools.deepspeed_small_steps            # the grid's summary and its ten most host-bound rows
    python -m tools.deepspeed_small_steps --all      # every row
    python -m tools.deepspeed_small_steps --recompute full   # the same grid under full recomputation

The grid: hidden 1024/1536/2048, 12 or 24 layers, sequence 1024, bf16, ZeRO-1 where dp > 1, on 2, 4
or 8 GPUs split every way tp · pp · dp allows (tp ≤ gpus, pp dividing the layers), micro-batch 1, 2,
4 or 8 and 1 or 8 micro-batches per step. No measurement is compared: it shows where the engine's
host work (``costs/engine_host.py``) sets a step, and by how much the breakdown's terms move.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

import perfmodel as pm
from perfmodel.core.entry import run_command
from perfmodel.core.errors import PerfModelError


def _splits(gpus, layers):
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8):
            if gpus % (tp * pp) == 0 and layers % pp == 0:
                yield tp, pp, gpus // (tp * pp)


def grid(recompute: str = "none") -> pd.DataFrame:
    """One row per configuration: step seconds, its host-work share and the engine's host seconds."""
    rows = []
    for hidden in (1024, 1536, 2048):
        for layers in (12, 24):
            m = pm.transformer(layers=layers, hidden=hidden, heads=16, seq=1024, vocab=50304)
            for gpus in (2, 4, 8):
                c = pm.cluster("dgx-a100-80gb", gpus_per_node=gpus)  # part of one node: NVSwitch between them
                for tp, pp, dp in _splits(gpus, layers):
                    for mb in (1, 2, 4, 8):
                        for m_count in (1, 8):
                            s = pm.Strategy(dp=dp, tp=tp, pp=pp, micro_batch=mb, global_batch=dp * mb * m_count,
                                            zero=1 if dp > 1 else 0, precision="bf16-mixed", framework="deepspeed",
                                            recompute=recompute)
                            try:
                                p = pm.predict(m, c, s)
                            except PerfModelError:
                                continue
                            b = p.breakdown
                            rows.append({"hidden": hidden, "layers": layers, "gpus": gpus, "tp": tp, "pp": pp,
                                         "dp": dp, "mb": mb, "m": m_count, "step_ms": 1e3 * p.step_time,
                                         "host_ms": 1e3 * float(b["host_overhead"]),
                                         "host_share": float(b["host_overhead"]) / p.step_time})
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="print every configuration, not the ten most host-bound")
    parser.add_argument("--recompute", choices=("none", "selective", "full"), default="none",
                        help="the checkpointing policy of every configuration (default none)")
    args = parser.parse_args(argv)
    show_all = args.all
    t = grid(args.recompute)
    print(f"{len(t)} configurations; host share of the step: median {t.host_share.median():.1%}, "
          f"p90 {np.percentile(t.host_share, 90):.1%}; steps with host share > 25%: {(t.host_share > 0.25).sum()}")
    print(f"median step {t.step_ms.median():.1f} ms, median host {t.host_ms.median():.2f} ms")
    shown = t if show_all else t.sort_values("host_share", ascending=False).head(10)
    print(shown.to_string(index=False, float_format=lambda v: f"{v:.3g}"))


if __name__ == "__main__":
    raise SystemExit(run_command(main))
