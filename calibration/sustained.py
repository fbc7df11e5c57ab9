"""GEMM throughput over time under continuous load: does the GPU hold its clocks?

A microbenchmark case lasts a fraction of a second; a training run keeps the GPU
busy for hours, at its power limit. This runs one large matrix product back to
back for ``--seconds`` and records, every ``--every`` seconds, the throughput of
the last batch with the SM clock and power draw ``nvidia-smi`` reports::

    python -m calibration.sustained --out sustained.csv --seconds 30
    python -m calibration.sustained --out sustained.csv --dtype fp16 --size 16384

Columns: ``t_s`` (since the start), ``tflops``, ``batch_s``, ``sm_clock_mhz``,
``power_w``. The ratio of the late to the first throughput is the sustained
factor a burst-timed calibration misses.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch

from calibration.env import command_output
from calibration.ops import DTYPES

COLUMNS = ("t_s", "tflops", "batch_s", "sm_clock_mhz", "power_w", "dtype", "m", "n", "k", "device")


def _smi() -> tuple[float | None, float | None]:
    out = command_output(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"], 5.0)
    try:
        clock, power = (float(v) for v in out.splitlines()[0].split(","))
        return clock, power
    except (ValueError, IndexError):
        return None, None


def run(out: str | Path, *, seconds: float, every: float, size: int, dtype: str) -> list[dict]:
    if not torch.cuda.is_available():
        raise SystemExit("calibration.sustained: needs a CUDA GPU (none is visible to torch)")
    if dtype not in DTYPES:
        raise SystemExit(f"calibration.sustained: --dtype must be one of {', '.join(DTYPES)}: got {dtype!r}")
    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    a = torch.randn(size, size, device="cuda", dtype=DTYPES[dtype])
    b = torch.randn(size, size, device="cuda", dtype=DTYPES[dtype])
    flop = 2.0 * size ** 3
    torch.mm(a, b)
    torch.cuda.synchronize()
    start = time.monotonic()
    one = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    one[0].record()
    torch.mm(a, b)
    one[1].record()
    one[1].synchronize()
    calls = max(1, int(0.05 / (one[0].elapsed_time(one[1]) / 1e3)))  # batches of ~50 ms
    rows, last = [], -every
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        while (now := time.monotonic() - start) < seconds:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(calls):
                torch.mm(a, b)
            e.record()
            e.synchronize()
            if now - last >= every:
                last = now
                batch = s.elapsed_time(e) / 1e3
                clock, power = _smi()
                row = {"t_s": round(now, 3), "tflops": flop * calls / batch / 1e12, "batch_s": batch,
                       "sm_clock_mhz": clock, "power_w": power, "dtype": dtype, "m": size, "n": size,
                       "k": size, "device": torch.cuda.get_device_name(0)}
                writer.writerow(row)
                f.flush()
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m calibration.sustained", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="CSV to write")
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--every", type=float, default=1.0, help="seconds between recorded batches")
    p.add_argument("--size", type=int, default=8192, help="m = n = k")
    p.add_argument("--dtype", default="bf16", help="bf16, fp16, tf32 or fp32")
    args = p.parse_args(argv)
    rows = run(args.out, seconds=args.seconds, every=args.every, size=args.size, dtype=args.dtype)
    if rows:
        first, late = rows[0]["tflops"], sorted(r["tflops"] for r in rows[len(rows) // 2:])
        median_late = late[len(late) // 2]
        print(f"{args.dtype} {args.size}^3: first {first:.0f} TFLOP/s, median of the second half "
              f"{median_late:.0f} TFLOP/s (ratio {median_late / first:.3f}) over {args.seconds:g} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
