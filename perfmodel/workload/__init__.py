"""Workloads: model descriptions and the kernels a training step launches."""

from perfmodel.workload.model import Transformer, transformer

__all__ = ["Transformer", "transformer"]
