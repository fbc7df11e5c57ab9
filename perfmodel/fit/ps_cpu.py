"""Fit a parameter server's CPU costs per byte to ``calibration.ps_cpu`` tables.

    python -m perfmodel.fit.ps_cpu perfmodel/data/ps-cpu-2026-12-01            # print the fit
    python -m perfmodel.fit.ps_cpu perfmodel/data/ps-cpu-2026-12-01 --write    # bundle it

Each per-byte cost is the median of seconds / bytes over the rows of at least 16 MiB: memory
resident beyond the caches, as a server's whole state is (its variables and their slots, many MB,
each touched once an update; 1 MiB rows run from cache 5-10x faster), the per-call cost amortised.
Its spread is the ratio of the largest to the smallest of those rows. The numpy momentum update makes four
passes touching 10 words per element; TensorFlow's ApplyMomentum functor (training_ops.cc, v1.10:
``accum = accum * momentum + grad; var -= accum * lr``, two Eigen expressions) touches 6, so the
update cost is scaled by 6/10. TCP and gRPC rows time both ends of the connection: half is one
end. A tensor's transfer is priced by the gRPC call (grpcio over loopback: gRPC's framing and slice
copies on top of TCP) when the table has it, else by raw TCP. The per-call floor is the raw TCP
request-reply: grpcio's Python layer adds hundreds of microseconds per call that TensorFlow's C++
runtime does not pay.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from perfmodel.core.entry import run_command
from perfmodel.core.errors import InvalidInputError
from perfmodel.core.readers import read_csv_file, read_json_file

BUNDLED = Path(__file__).resolve().parents[1] / "parallel" / "data" / "ps_cpu.json"
LARGE_BYTES = 2**24  # 16 MiB: beyond the caches, as a server's state is (all variables and slots, touched once an update)
NUMPY_WORDS, EIGEN_WORDS = 10, 6  # words touched per element by the update (module docstring)
OPS = ("momentum_update", "tensor_copy", "tcp_loopback", "tcp_message")  # grpc_call: optional


def _per_byte(rows, op: str) -> tuple[float, float]:
    big = rows[(rows.op == op) & (rows.bytes >= LARGE_BYTES)]
    if big.empty:
        raise InvalidInputError(f"ps_cpu table has no {op!r} rows of at least {LARGE_BYTES} bytes")
    rate = big.seconds / big.bytes
    return float(np.median(rate)), float(rate.max() / rate.min())


def fit_ps_cpu(folder) -> dict:
    """The CPU costs per byte (one vCPU) a parameter server pays, from a ``calibration.ps_cpu`` folder."""
    folder = Path(folder)
    rows = read_csv_file(folder / "ps_cpu.csv", field="ps_cpu table")
    missing = [op for op in OPS if op not in set(rows.get("op", []))]
    if missing:
        raise InvalidInputError(f"ps_cpu table lacks the ops {missing} (calibration.ps_cpu measures {OPS})")
    meta = read_json_file(folder / "metadata.json", field="ps_cpu metadata")
    update, update_spread = _per_byte(rows, "momentum_update")
    copy, copy_spread = _per_byte(rows, "tensor_copy")
    tcp, tcp_spread = _per_byte(rows, "tcp_loopback")
    grpc = rows[(rows.op == "grpc_call") & rows.seconds.notna()]
    rpc, rpc_spread = _per_byte(grpc, "grpc_call") if len(grpc) else (tcp, tcp_spread)
    message = float(np.median(rows[rows.op == "tcp_message"].seconds))
    return {
        "update_s_per_byte": update * EIGEN_WORDS / NUMPY_WORDS,
        "copy_s_per_byte": copy,
        "tcp_s_per_byte_per_end": tcp / 2.0,
        # what one end of a tensor's transfer costs: the gRPC call when measured, else raw TCP
        "transfer_s_per_byte_per_end": rpc / 2.0,
        "transfer_measured_by": "grpc_call" if len(grpc) else "tcp_loopback",
        "message_s_per_end": message / 2.0,
        "spread": {"momentum_update": update_spread, "tensor_copy": copy_spread, "tcp_loopback": tcp_spread,
                   "transfer": rpc_spread},
        "measured": {"date": meta.get("date"), "host": meta.get("host"), "cpu_count": meta.get("cpu_count"),
                     "load_average": meta.get("load_average")},
        "source": f"calibration.ps_cpu on {meta.get('host')} ({meta.get('date')}), fitted by perfmodel.fit.ps_cpu",
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a calibration.ps_cpu output folder")
    parser.add_argument("--write", action="store_true", help=f"write {BUNDLED.name} into the package")
    args = parser.parse_args(argv)
    fit = fit_ps_cpu(args.folder)
    text = json.dumps(fit, indent=1) + "\n"
    if args.write:
        BUNDLED.write_text(text)
        print(f"wrote {BUNDLED}")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
