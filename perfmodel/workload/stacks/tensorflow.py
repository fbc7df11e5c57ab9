"""TensorFlow 1.x with parameter servers, as Tensor2Tensor 1.9 on TensorFlow 1.10 trains CIFAR models.

What its runtime does, from the code (TensorFlow v1.10, tensor2tensor v1.9.0):

* Variables live on the ``ps`` tasks: ``tf.train.replica_device_setter`` (python/training/
  device_setter.py) places every Variable/VariableV2/VarHandleOp (``STANDARD_PS_OPS``) on a ps task,
  round-robin in creation order unless a ``ps_strategy`` is given; ``tf.contrib.training.
  GreedyLoadBalancingStrategy`` with ``byte_size_load_fn`` (contrib/training/python/training/
  device_setter.py) puts each on the least-loaded task by bytes. T2T 1.9 (utils/devices.py
  ``_replica_device_setter``) passes no ``ps_strategy``: round-robin. Optimizer slots (momentum)
  are colocated with their variable; BN moving statistics and ``global_step`` are variables too.
* Per step each worker's graph partition reads every variable it uses (a ``_Recv`` whose
  RecvTensor RPC the ps answers: core/distributed_runtime/rpc/grpc_worker_service.cc) and the ps
  partition pulls each gradient from the worker (another RecvTensor) and runs the update op there
  (ApplyMomentum, core/kernels/training_ops.cc): two RPCs per trainable variable, the update on the
  server's CPU. Received tensors are copied out of the gRPC buffer (grpc_tensor_coding.cc,
  tensor_response.cc).
* Asynchronous by default: each worker runs its own ``session.run`` loop (no SyncReplicasOptimizer
  in T2T's async mode), so updates are applied as they arrive.
* Per-op host cost: the graph executor (core/common_runtime/executor.cc) dispatches ops from C++
  threads and enqueues GPU kernels asynchronously on the compute stream (gpu_device.cc), the same
  structure as eager dispatch: a per-op host floor beside the GPU time. It is priced with the
  profile's measured per-kernel host cost (the eager PyTorch measurement; TensorFlow's own was not
  measured: a limit, docs/parameter-servers.md).

Priced here: traced-graph workloads (CNNs) in fp32, data parallel, with parameter servers.
"""

from __future__ import annotations

from perfmodel.core.errors import UnsupportedError

PLACEMENTS = ("greedy", "round-robin")
SOURCE = ("tensorflow v1.10 python/training/device_setter.py, contrib/training/python/training/device_setter.py, "
          "core/kernels/training_ops.cc; tensor2tensor v1.9.0 utils/devices.py")
DEFAULT_PLACEMENT = {"tensorflow": "round-robin"}  # T2T 1.9 passes no ps_strategy; others: greedy by size
TRANSFORMER_STACKS = "pytorch, megatron, torchtitan, fsdp1"


def default_placement(framework: str) -> str:
    """How variables are spread over the servers when the strategy names no ``ps_placement``."""
    return DEFAULT_PLACEMENT.get(framework, "greedy")


def check_tensorflow(model, s) -> None:
    """Raise when framework='tensorflow' cannot price this workload or strategy, naming what can."""
    if not hasattr(model, "ops"):  # a Transformer: its kernels are PyTorch's eager ones
        raise UnsupportedError(f"framework='tensorflow' prices traced-graph workloads (CNN presets such as "
                               f"'resnet-cifar32', or pm.from_torch graphs): got {type(model).__name__} "
                               f"{getattr(model, 'name', '')!r}; stacks that price transformers: {TRANSFORMER_STACKS}")
    if s.precision != "fp32":
        raise UnsupportedError(f"framework='tensorflow' (TensorFlow 1.10, Tensor2Tensor 1.9) trains in fp32: "
                               f"got precision={s.precision!r}; for mixed precision use framework='pytorch'")
    if s.dp > 1 and not s.ps_servers and not s.ps_async:
        raise UnsupportedError("framework='tensorflow' trains with parameter servers (replica_device_setter): "
                               "give ps_servers (and ps_async=True for its default asynchronous mode); "
                               "all-reduce data parallelism: framework='pytorch'")
