"""Shipped CNN/ViT workloads: traced graphs stored as JSON, and the plain-torch models they came from.

``graph_preset("resnet50")`` (what ``pm.preset("resnet50")`` returns) reads
``data/graphs/resnet50.json``: no torch needed. The JSON files are written by
``python -m tools.cnn_models --write-presets`` (a checkout's build-time tool), which
builds the plain-torch models (their layer structure follows torchvision.models
exactly, so the parameter counts equal torchvision's, and neither the generator
nor the tests need torchvision) and traces them with ``from_torch``.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

from perfmodel.core.errors import InvalidInputError, unknown_name
from perfmodel.workload.graph import GraphModel

GRAPHS_DIR = Path(__file__).resolve().parent / "data" / "graphs"
TV = "torchvision.models"
TIMM = "timm (huggingface/pytorch-image-models) timm/models"
T2T = "tensor2tensor v1.9.0 tensor2tensor/models"
DAWN = ("stanford-futuredata/dawn-bench-models @faacf04 tensorflow/CIFAR10/resnet/resnet_model.py (tensorflow/models' "
        "CIFAR ResNet: pre-activation units, batch norm without gamma, leaky ReLU 0.1 as tf.where)")
DAWN_PT = ("stanford-futuredata/dawn-bench-models @faacf04 pytorch/CIFAR10/benchmark/cifar10/models/resnet.py (full "
           "pre-activation, batch norm with gamma and beta, ReLU, 1x1 projection where the width or stride changes)")
GRAPH_PRESETS = {
    "resnet50": {"image": 224, "published_params": 25_557_032,
                 "source": f"He et al. 2016, ResNet-50 (v1.5: stride on the 3x3 conv); {TV}.resnet50, 25,557,032 parameters"},
    "resnet101": {"image": 224, "published_params": 44_549_160,
                  "source": f"He et al. 2016, ResNet-101 (v1.5); {TV}.resnet101, 44,549,160 parameters"},
    "resnet152": {"image": 224, "published_params": 60_192_808,
                  "source": f"He et al. 2016, ResNet-152 (v1.5); {TV}.resnet152, 60,192,808 parameters"},
    "resnext101-32x4d": {"image": 224, "published_params": 44_177_704,
                         "source": f"Xie et al. 2017, ResNeXt-101 (32x4d); {TIMM}/resnet.py resnext101_32x4d, "
                                   "44,177,704 parameters (timm lists 44.18 M)"},
    "seresnext50-32x4d": {"image": 224, "published_params": 27_559_896,
                          "source": f"Hu et al. 2018, SE-ResNeXt-50 (32x4d); {TIMM}/resnet.py seresnext50_32x4d "
                                    "(SE after the third BN, C/16 rounded to 8), 27,559,896 parameters (timm: 27.56 M)"},
    "seresnext101-32x4d": {"image": 224, "published_params": 48_955_416,
                           "source": f"Hu et al. 2018, SE-ResNeXt-101 (32x4d); {TIMM}/resnet.py seresnext101_32x4d, "
                                     "48,955,416 parameters (timm: 48.96 M)"},
    "resnext50-32x4d": {"image": 224, "published_params": 25_028_904,
                        "source": f"Xie et al. 2017, ResNeXt-50 (32x4d); {TV}.resnext50_32x4d, 25,028,904 parameters"},
    "efficientnet-b0": {"image": 224, "published_params": 5_288_548,
                        "source": f"Tan & Le 2019, EfficientNet-B0; {TV}.efficientnet_b0, 5,288,548 parameters "
                                  "(stochastic depth not traced)"},
    "efficientnet-b2": {"image": 256, "published_params": 9_109_994,
                        "source": f"Tan & Le 2019, EfficientNet-B2; {TV}.efficientnet_b2, 9,109,994 parameters; "
                                  "traced at 256 px, timm's training resolution (stochastic depth not traced)"},
    "efficientnet-b3": {"image": 288, "published_params": 12_233_232,
                        "source": f"Tan & Le 2019, EfficientNet-B3; {TV}.efficientnet_b3, 12,233,232 parameters; "
                                  "traced at 288 px, timm's training resolution (stochastic depth not traced)"},
    "efficientnet-b4": {"image": 320, "published_params": 19_341_616,
                        "source": f"Tan & Le 2019, EfficientNet-B4; {TV}.efficientnet_b4, 19,341,616 parameters; "
                                  "traced at 320 px, timm's training resolution (stochastic depth not traced)"},
    "vgg16": {"image": 224, "published_params": 138_357_544,
              "source": f"Simonyan & Zisserman 2015, VGG-16 (config D); {TV}.vgg16, 138,357,544 parameters"},
    "inception-v3": {"image": 299, "published_params": 27_161_264,
                     "source": f"Szegedy et al. 2016, Inception-v3 with auxiliary classifier (loss = main + 0.4 aux); "
                               f"{TV}.inception_v3, 27,161,264 parameters (23,834,568 without aux)"},
    "inception-v3-tf": {"image": 299, "published_params": 23_834_568,
                        "source": "Szegedy et al. 2016, Inception-v3 as TensorFlow's benchmarks ran it: tensorflow/benchmarks "
                                  "@9165a70 scripts/tf_cnn_benchmarks/inception_model.py inception3 (no auxiliary "
                                  "head, no dropout, max pooling in the last E block); 23,834,568 parameters "
                                  f"({TV}.inception_v3 without aux; TF's batch norm, scale=False, has no gamma: "
                                  "17,216 fewer)"},
    "vit-b-16": {"image": 224, "published_params": 86_567_656,
                 "source": f"Dosovitskiy et al. 2021, ViT-B/16; {TV}.vit_b_16, 86,567,656 parameters"},
    # CIFAR-10 models of tensor2tensor v1.9.0 (tools/cifar_models.py builds them)
    "resnet-cifar15": {"image": 32, "published_params": 693_818,
                       "source": f"{T2T}/resnet.py resnet_cifar_15 (residual blocks [2, 2, 2]), 693,818 parameters"},
    "resnet-cifar32": {"image": 32, "published_params": 1_857_722,
                       "source": f"{T2T}/resnet.py resnet_cifar_32 (residual blocks [5, 5, 5]), 1,857,722 parameters"},
    "shake-shake-small": {"image": 32, "published_params": 2_926_986,
                          "source": f"{T2T}/shake_shake.py shakeshake_small (26 2x32d), 2,926,986 parameters"},
    "shake-shake-big": {"image": 32, "published_params": 26_204_362,
                        "source": f"{T2T}/shake_shake.py shakeshake_big (26 2x96d), 26,204,362 parameters"},
    # the CIFAR-10 ResNets of tensorflow/models' resnet example as DAWNBench trained them (tools/cifar_models.py)
    "resnet20-cifar-tf": {"image": 32, "published_params": 269_034,
                          "source": f"{DAWN}, model resnet20 (3 basic units per stage), 269,034 parameters (TF: 269.03k)"},
    "resnet56-cifar-tf": {"image": 32, "published_params": 850_986,
                          "source": f"{DAWN}, model resnet56 (9 basic units per stage), 850,986 parameters (TF: 850.99k)"},
    "resnet164-cifar-tf": {"image": 32, "published_params": 1_691_146,
                           "source": f"{DAWN}, model resnet164 --use_bottleneck (18 bottleneck units per stage), "
                                     "1,691,146 parameters (TF: 1.69m)"},
    "resnet164-basic-cifar-tf": {"image": 32, "published_params": 2_596_842,
                                 "source": f"{DAWN}, model resnet164 without bottleneck (27 basic units per stage), "
                                           "2,596,842 parameters (TF: 2.60m)"},
    # the same depths in DAWNBench's PyTorch code (tools/cifar_models.py); counts as its utils.count_parameters gives
    "preact-resnet164-cifar": {"image": 32, "published_params": 1_703_258,
                               "source": f"{DAWN_PT}, arch preact164 (PreActResNet164: 18 bottleneck blocks per "
                                         "stage, widths 16/32/64 x 4), 1,703,258 parameters"},
    "preact-resnet164-basic-cifar": {"image": 32, "published_params": 2_605_466,
                                     "source": f"{DAWN_PT}, arch preact164-basic (PreActResNet164Basic: 27 basic "
                                               "blocks per stage, widths 16/32/64), 2,605,466 parameters"},
}


def _key(name: str) -> str:
    return str(name).lower().replace("_", "-")


def is_graph_preset(name) -> bool:
    return _key(name) in GRAPH_PRESETS


def list_graph_presets() -> list[str]:
    return sorted(GRAPH_PRESETS)


@cache
def _load(key: str):
    import json

    text = (resources.files("perfmodel.workload") / "data" / "graphs" / f"{key}.json").read_text()
    return GraphModel.from_dict(json.loads(text), origin=f"bundled graph {key!r}")


def graph_preset(name: str, **overrides):
    """A shipped traced workload by name (see :data:`GRAPH_PRESETS`); rename with ``.with_name()``."""
    key = _key(name)
    if key not in GRAPH_PRESETS:
        raise unknown_name("graph preset", name, GRAPH_PRESETS)
    if overrides:
        raise InvalidInputError(f"graph preset {key!r} is a traced graph and takes no overrides: got "
                                f"{', '.join(sorted(overrides))} (trace a modified model with perfmodel.from_torch)")
    return _load(key)
