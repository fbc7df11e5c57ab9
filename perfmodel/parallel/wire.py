"""Bytes per element that the parallel collectives move, by precision and framework."""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.costs.memory import megatron_grad_bytes
from perfmodel.workload.kernels import is_mixed
from perfmodel.workload.stacks import megatron_code


@dataclass(frozen=True)
class WireBytes:
    """Bytes per element of gradients, of parameters and of activations on the wire.

    ``activation``: the activation dtype, what tensor, context, pipeline and expert parallelism
    send and what ZeRO-3 / FSDP gather and reduce.
    """

    grad: float
    param: float
    activation: float


def wire_bytes(precision: str, framework: str = "pytorch", grad_reduce_fp32: bool | None = None) -> WireBytes:
    """Bytes per element that the collectives move.

    pytorch: autocast over fp32 parameters, so .grad and the weights are fp32.
    megatron (Micikevicius et al. 2018 master weights): 16-bit weights; gradients
    accumulate in fp32 main_grad under bf16 and stay 16-bit under fp16
    (Megatron-LM arguments: accumulate_allreduce_grads_in_fp32 is forced for bf16), unless
    ``grad_reduce_fp32`` says otherwise (``costs.memory.megatron_grad_bytes``).
    """
    lo = 2.0 if is_mixed(precision) else 4.0
    if megatron_code(framework) and is_mixed(precision):
        return WireBytes(grad=megatron_grad_bytes(precision, grad_reduce_fp32), param=lo, activation=lo)
    return WireBytes(grad=4.0, param=4.0, activation=lo)


def activation_bytes(model, c, precision: str):
    """Bytes of one micro-batch's hidden states (b·s·h) in the activation dtype."""
    return c.micro_batch * model.seq * model.hidden * wire_bytes(precision).activation
