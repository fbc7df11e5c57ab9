"""Measure what a parameter server's CPU spends per byte: the update, the tensor copy, the TCP stack.

Run::

    python -m calibration.ps_cpu --out perfmodel/data/ps-cpu-2026-12-01      # ~1 min on one core
    python -m calibration.ps_cpu --out /tmp/ps --quick                        # a few seconds

One thread (one vCPU) each, fp32 tensors of 4 KiB to 64 MiB, the fastest of ``--repeats`` runs:

* ``momentum_update``: TensorFlow's ApplyMomentum (tensorflow/core/kernels/training_ops.cc,
  v1.10: ``accum = accum * momentum + grad; var -= lr * accum``) in numpy, in place;
* ``tensor_copy``: the copy of a received tensor out of the RPC buffer into its own storage
  (TensorResponse parses the gRPC byte buffer into a new Tensor: grpc_tensor_coding.cc,
  tensor_response.cc in TensorFlow v1.10);
* ``tcp_loopback``: bytes sent through a loopback TCP socket and received into a buffer,
  sender and receiver threads in this process; ``seconds`` is the process's CPU time (both
  ends: kernel copies, checksums, the system calls), so one end costs about half of it;
* ``grpc_call``: one unary gRPC call carrying the bytes to an in-process server (grpcio, raw
  bytes, no protobuf: gRPC's framing and slice copies over loopback TCP; NaN without grpcio);
* ``tcp_message``: one small request and its reply on an open loopback connection (CPU time of
  both ends per round trip): the floor of the per-tensor cost of an RPC.

Writes ``ps_cpu.csv`` (op, bytes, seconds, repeats) and ``metadata.json`` (host, date);
``python -m perfmodel.fit.ps_cpu <folder>`` fits them into the table the asynchronous
parameter-server model reads (perfmodel/parallel/data/ps_cpu.json).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import socket
import threading
import time
from datetime import date
from pathlib import Path

import numpy as np

SIZES = [2**k for k in range(12, 27, 2)]  # 4 KiB .. 64 MiB
QUICK_SIZES = [2**12, 2**16, 2**20, 2**22]


def _fastest_s(fn, repeats: int, clock=time.perf_counter) -> float:
    """The fastest of ``repeats`` timed runs after a warm one: on a shared host other work only adds
    time (the timeit module's advice), so the minimum is the cost itself."""
    fn()  # warm: pages touched, caches filled
    out = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return float(np.min(out))


def momentum_update(nbytes: int, repeats: int) -> float:
    n = nbytes // 4
    var, accum, grad = (np.ones(n, np.float32) for _ in range(3))

    def step():
        np.multiply(accum, np.float32(0.9), out=accum)
        np.add(accum, grad, out=accum)
        var.__isub__(np.float32(0.1) * accum)
    return _fastest_s(step, repeats)


def tensor_copy(nbytes: int, repeats: int) -> float:
    buf = bytearray(os.urandom(min(nbytes, 1 << 16)) * max(1, nbytes // (1 << 16)))[:nbytes]
    return _fastest_s(lambda: np.frombuffer(buf, np.uint8).copy(), repeats)


def tcp_loopback(nbytes: int, repeats: int) -> float:
    """CPU seconds (both ends) to move ``nbytes`` through a loopback TCP connection."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    payload = memoryview(bytearray(nbytes))
    sink = bytearray(1 << 20)

    def receive():
        got = 0
        while got < nbytes:
            got += conn.recv_into(sink, min(len(sink), nbytes - got))

    def transfer():
        reader = threading.Thread(target=receive)
        reader.start()
        client.sendall(payload)
        reader.join()
    try:
        return _fastest_s(transfer, repeats, clock=time.process_time)
    finally:
        for s in (client, conn, server):
            s.close()


def tcp_message(nbytes: int, repeats: int, rounds: int = 500) -> float:
    """CPU seconds (both ends) of one small request and its reply on an open loopback connection:
    the floor of a per-tensor RPC (``nbytes`` each way; an echo thread answers)."""
    a, b = socket.socketpair()
    msg = bytes(nbytes)

    def echo():
        for _ in range(rounds * (repeats + 1)):
            got = 0
            while got < nbytes:
                got += len(b.recv(nbytes - got))
            b.sendall(msg)
    th = threading.Thread(target=echo)
    th.start()

    def ping():
        for _ in range(rounds):
            a.sendall(msg)
            got = 0
            while got < nbytes:
                got += len(a.recv(nbytes - got))
    try:
        return _fastest_s(ping, repeats, clock=time.process_time) / rounds
    finally:
        th.join()
        a.close()
        b.close()


def grpc_call(nbytes: int, repeats: int, rounds: int = 4) -> float:
    """CPU seconds (both ends) of one unary gRPC call carrying ``nbytes`` to an in-process server on
    loopback (raw bytes, no protobuf), as a RecvTensor response carries a tensor; None without grpcio."""
    try:
        import grpc
    except ModuleNotFoundError:
        return float("nan")
    from concurrent import futures

    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    handler = grpc.method_handlers_generic_handler("ps", {"push": grpc.unary_unary_rpc_method_handler(
        lambda request, context: b"ok", request_deserializer=None, response_serializer=None)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=options)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=options)
    call = channel.unary_unary("/ps/push")
    payload = bytes(nbytes)

    def calls():
        for _ in range(rounds):
            call(payload)
    try:
        return _fastest_s(calls, repeats, clock=time.process_time) / rounds
    finally:
        channel.close()
        server.stop(None)


OPS = {"momentum_update": momentum_update, "tensor_copy": tensor_copy, "tcp_loopback": tcp_loopback,
       "grpc_call": grpc_call}
MESSAGE_SIZES = [64, 1024]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write ps_cpu.csv and metadata.json to")
    parser.add_argument("--quick", action="store_true", help="four sizes, 3 repeats")
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sizes, repeats = (QUICK_SIZES, 3) if args.quick else (SIZES, args.repeats)
    rows = []
    for op, fn in OPS.items():
        for nbytes in sizes:
            rows.append({"op": op, "bytes": nbytes, "seconds": fn(nbytes, repeats), "repeats": repeats})
            print(f"{op:16s} {nbytes:>10,d} B  {rows[-1]['seconds'] * 1e6:10.1f} us", flush=True)
    for nbytes in MESSAGE_SIZES:
        rows.append({"op": "tcp_message", "bytes": nbytes, "seconds": tcp_message(nbytes, repeats), "repeats": repeats})
        print(f"tcp_message      {nbytes:>10,d} B  {rows[-1]['seconds'] * 1e6:10.1f} us", flush=True)
    with open(out / "ps_cpu.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    meta = {"date": date.today().isoformat(), "host": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "numpy": np.__version__, "threads": 1,
            "load_average": os.getloadavg()[0]}
    (out / "metadata.json").write_text(json.dumps(meta, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
