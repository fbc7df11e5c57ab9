"""Asynchronous parameter servers over workers of mixed GPU types (``predict_mixed`` with ``ps_async``).

Each type's worker step is priced alone (``perfmodel.predict`` on one GPU, its optimizer step
moved to the servers); the cluster is ``perfmodel.parallel.ps_async.async_ps`` over one step
time per worker: rate min(sum_i 1/t_i, 1/D_max). Owns no formula.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfmodel.core.errors import InvalidInputError
from perfmodel.hardware.catalog import load_link
from perfmodel.hardware.servers import ServerVM
from perfmodel.parallel.ps_async import ServerSpec, async_ps
from perfmodel.workload.variables import model_variables


def server_spec_of(server_node, latency_s: float) -> ServerSpec:
    """The servers' rates: a ServerVM (NIC each way, vCPUs), else a node or link whose rate serves both
    ways with the CPU not priced (default 10 Gb/s Ethernet, as the synchronous exchange)."""
    if isinstance(server_node, ServerVM):
        return ServerSpec(server_node.egress_bytes_per_s, server_node.ingress_bytes_per_s, server_node.vcpus,
                          max(server_node.latency_s, latency_s))
    node = load_link("eth10" if server_node is None else server_node) if server_node is None or isinstance(
        server_node, str) else server_node
    bw = getattr(node, "inter_bw_bytes_per_s", None) or getattr(node, "bw_bytes_per_s", None)
    if bw is None:
        raise InvalidInputError("'server_node' must be a ServerVM, a Node, a Link or a link name (e.g. 'eth25'): "
                                f"got {server_node!r}")
    return ServerSpec(bw, bw, None, latency_s)


def mixed_async(model, types, strategy, servers: int, server_node) -> pd.DataFrame:
    """One row ("async"): the cluster's samples/s, each worker's mean period, the saturating worker
    count, the bottleneck and the staleness; ``types``: predict_mixed's per-GPU-type records."""
    if not servers:
        raise InvalidInputError("'ps_async'=True needs parameter servers: give servers=S (> 0)")
    mb = strategy.micro_batch
    preds = [t.predict(mb) for t in types]
    compute = np.concatenate([np.full(t.count, p.step_time - p.breakdown["optimizer"]) for t, p in zip(types, preds)])
    backward = np.concatenate([np.full(t.count, p.breakdown["backward"]) for t, p in zip(types, preds)])
    worst = min(types, key=lambda t: t.cluster.node.inter_bw_bytes_per_s).cluster.node
    ps = async_ps(compute_s=compute, backward_s=backward, variables=model_variables(model), workers=len(compute),
                  servers=servers, spec=server_spec_of(server_node, worst.nic.latency_s),
                  worker_bw_bytes_per_s=worst.inter_bw_bytes_per_s, placement=strategy.variable_placement)
    solo = sum(t.count * mb / p.step_time for t, p in zip(types, preds))
    row = {"policy": "async", "step_time_s": ps.worker_period_s, "samples_per_second": ps.updates_per_second * mb,
           "global_batch": mb * len(compute), "compute_s": float(compute.max()),
           "comm_s": ps.worker_period_s - float(compute.mean()), "comm": f"{servers} asynchronous parameter server(s)",
           "slowest": types[int(np.argmax([p.step_time for p in preds]))].gpu,
           "efficiency": ps.updates_per_second * mb / solo, "fits": all(p.fits for p in preds),
           "updates_per_second": ps.updates_per_second, "saturating_workers": ps.saturating_workers,
           "bottleneck": ps.bottleneck, "mean_staleness": ps.mean_staleness}
    for t, p in zip(types, preds):
        row[f"batch_{t.gpu}"], row[f"compute_s_{t.gpu}"] = mb, p.step_time - p.breakdown["optimizer"]
    return pd.DataFrame([row])
