"""perfmodel: predict distributed training speed and memory before renting the cluster.

    import perfmodel as pm
    p = pm.predict(pm.preset("gpt2-small"), pm.cluster("h200"), pm.Strategy(micro_batch=8))
"""

from perfmodel import errors  # noqa: F401 (pm.errors: the public exception module)
from perfmodel.errors import (
    InfeasibleError,
    InvalidInputError,
    PerfModelError,
    ProfileError,
    UnknownNameError,
    UnsupportedError,
)
from perfmodel.hardware import cluster, load_gpu, load_node
from perfmodel.predict import Prediction, predict
from perfmodel.profiles.profile import Profile, load_profile
from perfmodel.parallel.strategy import Strategy
from perfmodel.workload.model import Transformer, transformer
from perfmodel.workload.presets import list_presets, preset

__version__ = "0.1.0"

__all__ = [
    "InfeasibleError", "InvalidInputError", "PerfModelError", "Prediction", "Profile", "ProfileError",
    "Strategy", "Transformer", "UnknownNameError", "UnsupportedError", "cluster", "list_presets",
    "load_gpu", "load_node", "load_profile", "predict", "preset", "transformer",
    # loaded on first use (_LAZY)
    "compare", "fill_dp", "from_hf_config", "from_hf_hub", "from_torch", "plan_training", "predict_mixed",
    "search", "sweep", "symbolic_step_time",
]


# heavier entry points load on first use, yet are listed by __all__ and dir(perfmodel)
_LAZY = {
    "compare": "perfmodel.explore", "sweep": "perfmodel.explore", "search": "perfmodel.explore",
    "from_torch": "perfmodel.workload.torch_import", "from_hf_config": "perfmodel.workload.hf",
    "from_hf_hub": "perfmodel.workload.hf_hub", "fill_dp": "perfmodel.parallel.strategy",
    "plan_training": "perfmodel.analysis.transient", "symbolic_step_time": "perfmodel.analysis.symbolic",
    "predict_mixed": "perfmodel.analysis.hetero",
    "multi_cluster": "perfmodel.hardware.sites", "wan_link": "perfmodel.hardware.sites",
    "wan_from_iperf": "perfmodel.hardware.sites", "MultiCluster": "perfmodel.hardware.sites",
    "Site": "perfmodel.hardware.sites", "WanLink": "perfmodel.hardware.sites",
    "MultiSiteStrategy": "perfmodel.analysis.multisite", "predict_multisite": "perfmodel.analysis.multisite",
    "required_wan_bandwidth": "perfmodel.analysis.multisite_inverse",
    "inner_steps_for": "perfmodel.analysis.multisite_inverse",
    "plan_multisite": "perfmodel.analysis.multisite_inverse",
    "predict_shared": "perfmodel.analysis.contention", "predict_cluster": "perfmodel.analysis.network",
    "advise_packing": "perfmodel.analysis.packing", "kernel_breakdown": "perfmodel.analysis.kernel_breakdown",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'perfmodel' has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_LAZY})
