"""Explore the parallel space: compare strategies, sweep scale, search every configuration.

    import perfmodel as pm
    pm.compare(model, cluster, ["dp=8", "tp=8", "tp=4,pp=2,micro_batch=1"])
    pm.sweep(model, over="nodes", values=[1, 2, 4, 8], cluster=cluster, strategy=strategy)
    pm.search(model, cluster, global_batch=512, top_k=10)
"""

from perfmodel.explore.compare import compare, parse_strategy
from perfmodel.explore.search import search, strategy_of
from perfmodel.explore.sweep import sweep

__all__ = ["compare", "parse_strategy", "search", "strategy_of", "sweep"]
