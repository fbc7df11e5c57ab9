"""Parallel strategies: the Strategy, placement, fabric, and one module per kind of parallelism."""
