"""Host seconds the DeepSpeed engine adds to a training step, measured on one process.

    DS_ACCELERATOR=cpu python -m calibration.deepspeed_host --out deepspeed_host.csv

A GPT-shaped stack of ``blocks`` tiny blocks (12 parameter tensors each, width 8, so the
arithmetic is negligible) is trained twice with the same micro-batches: by a plain loop
(forward, ``loss.backward()``, ``AdamW.step()``, ``zero_grad``) and by
``deepspeed.initialize`` with bf16 and ZeRO stage 0, 1 or 2. The difference per optimizer
step and per extra micro-step (``gradient_accumulation_steps``) is the engine's own host
work: its gradient hooks and bucket bookkeeping per parameter tensor, the flat-buffer
copies, the overflow and gradient-norm passes and the step bookkeeping of
``deepspeed/runtime/engine.py`` and ``zero/stage_1_and_2.py``. Rows:
``stage, blocks, tensors, accumulation, plain_s, deepspeed_s, extra_s`` (per optimizer step: medians over
alternating rounds, ``extra_s`` the median of the paired differences).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time


def _model(blocks: int, width: int = 8):
    import torch

    layers = []
    for _ in range(blocks):  # LN, qkv, proj, LN, fc1, fc2: 12 tensors as a GPT block
        layers += [torch.nn.LayerNorm(width), torch.nn.Linear(width, 3 * width), torch.nn.Linear(3 * width, width),
                   torch.nn.LayerNorm(width), torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)]
    return torch.nn.Sequential(*layers)


def _paired_extra_s(plain, deepspeed_run, rounds: int) -> tuple[float, float, float]:
    """(plain s, DeepSpeed s, median of the paired differences) over ``rounds`` alternating runs.

    The two loops run one after the other in each round, so load from other work on a shared
    host falls on both; the median of the per-round differences is the engine's extra.
    """
    plain()
    deepspeed_run()  # warm-up: optimizer state, buffers
    p_s, d_s, diff = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        plain()
        t1 = time.perf_counter()
        deepspeed_run()
        t2 = time.perf_counter()
        p_s.append(t1 - t0)
        d_s.append(t2 - t1)
        diff.append((t2 - t1) - (t1 - t0))
    return statistics.median(p_s), statistics.median(d_s), statistics.median(diff)


def plain_loop(blocks: int, accumulation: int):
    """One optimizer step of the plain loop, as a callable."""
    import torch

    torch.manual_seed(0)
    m = _model(blocks).to(torch.bfloat16)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=False)
    x = torch.randn(2, 8, dtype=torch.bfloat16)

    def run():
        for _ in range(accumulation):
            m(x).float().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return run


def deepspeed_loop(blocks: int, accumulation: int, stage: int):
    """One optimizer step through the DeepSpeed engine (bf16, ZeRO ``stage``), as a callable."""
    import deepspeed
    import torch

    torch.manual_seed(0)
    m = _model(blocks)
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": accumulation,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
           "bf16": {"enabled": True}, "zero_optimization": {"stage": stage}, "steps_per_print": 10**9}
    eng, *_ = deepspeed.initialize(model=m, model_parameters=m.parameters(), config=cfg)
    x = torch.randn(2, 8, dtype=torch.bfloat16)

    def run():
        for _ in range(accumulation):
            eng.backward(eng(x).float().sum())
            eng.step()  # a boundary only on the last micro-step
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--blocks", default="4,16,48")
    ap.add_argument("--stages", default="0,1,2")
    ap.add_argument("--accumulation", default="1,4")
    ap.add_argument("--steps", type=int, default=15)
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # tiny tensors: threads only add contention
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29561", "RANK": "0", "WORLD_SIZE": "1",
                 "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    rows = []
    for blocks in (int(b) for b in a.blocks.split(",")):
        for acc in (int(x) for x in a.accumulation.split(",")):
            plain = plain_loop(blocks, acc)
            for stage in (int(s) for s in a.stages.split(",")):
                p_s, d_s, extra = _paired_extra_s(plain, deepspeed_loop(blocks, acc, stage), a.steps)
                rows.append({"stage": stage, "blocks": blocks, "tensors": 12 * blocks, "accumulation": acc,
                             "plain_s": f"{p_s:.6g}", "deepspeed_s": f"{d_s:.6g}", "extra_s": f"{extra:.6g}"})
                print(rows[-1], flush=True)
    with open(a.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
