"""Expert parallelism (Megatron-Core MoE): the token all-to-alls and where experts' states shard."""

from __future__ import annotations

import numpy as np

from perfmodel.core.algebra import floats, pick
from perfmodel.costs.comm import hierarchical_time
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.pipeline import PhaseTimes
from perfmodel.parallel.wire import wire_bytes


def ep_comm_times(model, coll, lay, c: StepConfig, *, precision, recompute) -> PhaseTimes:
    """Expert-parallel token exchange per micro-batch and MoE layer, on the critical path.

    Megatron-Core's all-to-all token dispatcher: forward dispatches each rank's routed
    tokens (tokens·top_k hidden vectors; its 1/tp sequence shard under the sequence
    parallelism MoE requires with tp > 1) to the ranks holding their experts and
    combines the results back, two all-to-alls; backward does the same with the
    gradients. Full recomputation repeats the forward pair. Not overlapped with compute.
    """
    if c.ep <= 1 or getattr(model, "experts", 1) <= 1:
        return PhaseTimes()
    lo = wire_bytes(precision).activation
    tokens = c.micro_batch * model.seq / pick(np.asarray(c.sequence_parallel, bool), c.tp, 1.0)
    size = tokens * model.experts_per_token * model.hidden * lo
    # per average block: only the MoE blocks exchange tokens (workload/model.py moe_share)
    fwd = 2.0 * hierarchical_time(coll, "all_to_all", size, *lay["ep"]) * model.moe_share
    return PhaseTimes(layer_f=fwd, layer_b=fwd + (fwd if recompute == "full" else 0.0))


def expert_shard_ranks(shard_ranks, ep, fold=1.0):
    """Ranks a rank's experts shard over: the shard_ranks / ep replicas that hold the same experts, times ``fold``
    (``StepConfig.expert_fold``, tp / etp: the tensor-parallel ranks a folded expert grid adds to them)."""
    return np.maximum(floats(shard_ranks) * fold / ep, 1.0)


def sharded(params, expert, shard_ranks, ep, on, fold=1.0):
    """Parameters a rank keeps where sharding is ``on``: the dense ones over ``shard_ranks``, its
    experts over ``expert_shard_ranks``."""
    dense = params - expert
    return (dense / pick(on, shard_ranks, 1.0)
            + expert / pick(on, expert_shard_ranks(shard_ranks, ep, fold), 1.0))
