"""Build-time tool: the CIFAR-10 ResNets and Shake-Shake networks of TensorFlow and PyTorch codes, in plain torch.

    python -m tools.cifar_models --write-presets    # regenerate the ten CIFAR graph presets (needs torch)

Tensor2Tensor 1.9's four (the CIFAR study's models) and tensorflow/models' CIFAR ResNet as DAWNBench trained
it (``resnet20-cifar-tf``, ``resnet56-cifar-tf``, ``resnet164-cifar-tf``, ``resnet164-basic-cifar-tf``: see
``TF_RESNET``'s comment below; their counts equal the TF profiler's in DAWNBench's logs, 269.03k, 850.99k,
1.69m and 2.60m), and the two ResNet-164s of DAWNBench's PyTorch code (``preact-resnet164-cifar``,
``preact-resnet164-basic-cifar``: ``PT_RESNET`` below; 1,703,258 and 2,605,466 parameters, summed by hand
from that code's layers).

The layer structure follows tensor2tensor v1.9.0 exactly, so the trainable parameter
counts equal T2T's (checked on writing):

* ``resnet-cifar15`` / ``resnet-cifar32``: ``models/resnet.py`` ``resnet_cifar_15`` /
  ``resnet_cifar_32`` (``block_fn="residual"``, ``is_cifar=True``, filter_sizes
  [16, 32, 64, 128], layer_sizes [2, 2, 2] / [5, 5, 5]): a 7x7 stride-1 stem without bias,
  BN + ReLU, three block layers of pre-activation residual blocks whose first block always
  has a 1x1 projection shortcut followed by BN (``block_layer``'s ``projection_shortcut``),
  global mean, dense to 10 classes with bias.
* ``shake-shake-small`` / ``shake-shake-big``: ``models/shake_shake.py`` ``shakeshake_small``
  / ``shakeshake_big`` (26 layers, hidden_size 32 / 96, so widths 16k, 32k, 64k with k = 2 / 6):
  a 3x3 stem with bias + BN, three layers of 4 blocks of two branches (ReLU, 3x3 conv with bias,
  BN, ReLU, 3x3 conv with bias, BN, then the shake scaling), a skip of two strided 1x1 convs with
  bias + BN where the width changes, ReLU, and the class-label modality's top (global mean, dense
  with bias).

Besides each graph it writes ``<name>.variables.json``: the TensorFlow variables the T2T graph
creates, in creation order (kernel, bias; BN gamma, beta, moving_mean, moving_variance), which
``replica_device_setter`` places on the parameter servers.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from tools.presets_cli import presets_main
from perfmodel.core.entry import run_command

CIFAR = {"resnet-cifar15": ("resnet", (2, 2, 2)), "resnet-cifar32": ("resnet", (5, 5, 5)),
         "shake-shake-small": ("shake", 32), "shake-shake-big": ("shake", 96),
         # tensorflow/models' CIFAR ResNet as DAWNBench ran it (TF_RESNET below): (residual units per stage, bottleneck)
         "resnet20-cifar-tf": ("tf-resnet", (3, False)), "resnet56-cifar-tf": ("tf-resnet", (9, False)),
         "resnet164-cifar-tf": ("tf-resnet", (18, True)), "resnet164-basic-cifar-tf": ("tf-resnet", (27, False)),
         # the same depths in DAWNBench's PyTorch code (PT_RESNET below): (blocks per stage, bottleneck)
         "preact-resnet164-cifar": ("pt-resnet", (18, True)), "preact-resnet164-basic-cifar": ("pt-resnet", (27, False))}
# the code each kind follows: (as the graph's note names it, as its variable list does)
ORIGINS = {"resnet": ("tensor2tensor v1.9.0", "T2T v1.9.0"), "shake": ("tensor2tensor v1.9.0", "T2T v1.9.0"),
           "tf-resnet": ("dawn-bench-models @faacf04 (tensorflow/models' CIFAR ResNet)",) * 2,
           "pt-resnet": ("dawn-bench-models @faacf04 (pytorch/CIFAR10 PreActResNet)", None)}
# PT_RESNET: stanford-futuredata/dawn-bench-models @faacf04 pytorch/CIFAR10/benchmark/cifar10/models/resnet.py,
# ResNet(PreActBlock | PreActBottleneck, layers=[n] * 3, filters=[16, 32, 64]): a 3x3 stem without bias, blocks
# that open with BN + ReLU (the activated input feeds the shortcut where the block projects: a 1x1 conv without
# bias or BN when the stride or width changes), stride 2 on the first block of stages 2 and 3, the bottleneck's
# 1x1 / 3x3 / 1x1 widening 4x; a final BN + ReLU, global average pooling and a dense layer with bias
# TF_RESNET: stanford-futuredata/dawn-bench-models @faacf04 tensorflow/CIFAR10/resnet/resnet_model.py (the CIFAR ResNet of
# tensorflow/models' resnet example): a 3x3 stem to 16, pre-activation units ("full preactivation"; the first unit
# activates before splitting the shortcut), widths [16, 16, 32, 64] (basic) or [16, 64, 128, 256] (bottleneck, the
# 3x3 at a quarter), strides 1, 2, 2 on each stage's first unit; a basic unit's shortcut where the width changes is
# avg_pool(stride) and a zero pad of the channels, a bottleneck's a strided 1x1 projection without bias; final BN,
# leaky ReLU, global mean, dense with bias. Batch norm is tf.contrib.layers.batch_norm(fused=True) with its default
# scale=False (beta, no gamma); the leaky ReLU (0.1) is tf.where(tf.less(x, 0), 0.1 * x, x): three kernels.


@lru_cache(maxsize=1)
def _nets():
    """Module classes, defined on first use so that importing this file does not import torch."""
    import types

    import torch
    from torch import nn
    import torch.nn.functional as F

    class PreActBlock(nn.Module):  # T2T resnet.residual_block: BN-ReLU, (projection), conv, BN-ReLU, conv
        def __init__(self, cin, cout, stride, project):
            super().__init__()
            self.bn1 = nn.BatchNorm2d(cin, eps=1e-5, momentum=0.1)
            self.proj = nn.Conv2d(cin, cout, 1, stride, bias=False) if project else None
            self.proj_bn = nn.BatchNorm2d(cout, eps=1e-5) if project else None
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout, eps=1e-5)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)

        def forward(self, x):
            x = F.relu(self.bn1(x))
            shortcut = x if self.proj is None else self.proj_bn(self.proj(x))
            return self.conv2(F.relu(self.bn2(self.conv1(x)))) + shortcut

    class CifarResNet(nn.Module):  # T2T resnet.Resnet.body with is_cifar=True
        def __init__(self, layers, filters=(16, 32, 64, 128), classes=10):
            super().__init__()
            self.stem = nn.Conv2d(3, filters[0], 7, 1, 3, bias=False)
            self.stem_bn = nn.BatchNorm2d(filters[0], eps=1e-5)
            blocks, cin = [], filters[0]
            for group, count in enumerate(layers):
                cout = filters[group + 1]
                for i in range(count):  # only the first block of a layer projects and strides
                    blocks.append(PreActBlock(cin, cout, (1 if group == 0 else 2) if i == 0 else 1, i == 0))
                    cin = cout
            self.blocks = nn.Sequential(*blocks)
            self.logits = nn.Linear(cin, classes)

        def forward(self, x):
            x = self.blocks(F.relu(self.stem_bn(self.stem(x))))
            return self.logits(x.mean(dim=(2, 3)))

    class Branch(nn.Module):  # shake_shake_branch: ReLU, conv1 (bias), bn1, ReLU, conv2 (bias), bn2
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1)
            self.bn1 = nn.BatchNorm2d(cout, eps=1e-3)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
            self.bn2 = nn.BatchNorm2d(cout, eps=1e-3)

        def forward(self, x):
            return self.bn2(self.conv2(F.relu(self.bn1(self.conv1(F.relu(x))))))

    class ShakeBlock(nn.Module):  # shake_shake_block with 2 branches, shake_shake_concat False
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.branches = nn.ModuleList([Branch(cin, cout, stride) for _ in range(2)])
            self.stride = stride
            self.skip = None
            if cin != cout:  # shake_shake_skip_connection: two offset strided 1x1 paths, concat, BN
                self.path1 = nn.Conv2d(cin, cout // 2, 1)
                self.path2 = nn.Conv2d(cin, cout // 2, 1)
                self.skip = nn.BatchNorm2d(cout, eps=1e-3)

        def forward(self, x):
            b = x.shape[0]
            fwd = torch.rand(2, b, 1, 1, 1, device=x.device)
            bwd = torch.rand(2, b, 1, 1, 1, device=x.device)
            fwd, bwd = fwd / fwd.sum(0), bwd / bwd.sum(0)
            out = 0
            for i, branch in enumerate(self.branches):  # x·r_bwd + stop_gradient(x·r_fwd − x·r_bwd)
                y = branch(x)
                out = out + y * bwd[i] + (y * fwd[i] - y * bwd[i]).detach()
            if self.skip is None:
                return out + x
            s = self.stride
            p1 = F.avg_pool2d(x, 1, s)
            p2 = F.avg_pool2d(F.pad(x, (0, 1, 0, 1))[:, :, 1:, 1:], 1, s)
            return out + self.skip(torch.cat([self.path1(p1), self.path2(p2)], dim=1))

    class ShakeShake(nn.Module):  # ShakeShake.body + ClassLabelModality.top
        def __init__(self, hidden, layers=26, classes=10):
            super().__init__()
            k, n = hidden // 16, (layers - 2) // 6
            self.stem = nn.Conv2d(3, 16, 3, 1, 1)
            self.stem_bn = nn.BatchNorm2d(16, eps=1e-3)
            blocks, cin = [], 16
            for width, stride in ((16 * k, 1), (32 * k, 2), (64 * k, 2)):
                for i in range(n):
                    blocks.append(ShakeBlock(cin, width, stride if i == 0 else 1))
                    cin = width
            self.blocks = nn.Sequential(*blocks)
            self.logits = nn.Linear(cin, classes)

        def forward(self, x):
            x = F.relu(self.blocks(self.stem_bn(self.stem(x))))
            return self.logits(x.mean(dim=(2, 3)))

    class BetaNorm(nn.Module):  # tf.contrib.layers.batch_norm(fused=True, scale=False): one kernel, beta only
        def __init__(self, c):
            super().__init__()
            self.beta = nn.Parameter(torch.zeros(c))
            self.register_buffer("moving_mean", torch.zeros(c))
            self.register_buffer("moving_variance", torch.ones(c))

        def forward(self, x):
            return F.batch_norm(x, self.moving_mean, self.moving_variance, None, self.beta, True, 0.1, 1e-3)

    def leaky(x):  # resnet_model._relu: tf.where(tf.less(x, 0.0), leakiness * x, x)
        return torch.where(x < 0.0, 0.1 * x, x)

    class TfUnit(nn.Module):  # resnet_model._residual / _bottleneck_residual
        def __init__(self, cin, cout, stride, first, bottleneck):
            super().__init__()
            self.first, self.stride, self.pad = first, stride, (cout - cin) // 2
            self.init_bn = BetaNorm(cin)
            mid = cout // 4 if bottleneck else cout
            shapes = ([(cin, mid, 1, stride), (mid, mid, 3, 1), (mid, cout, 1, 1)] if bottleneck
                      else [(cin, cout, 3, stride), (cout, cout, 3, 1)])
            self.convs = nn.ModuleList([nn.Conv2d(i, o, k, s, k // 2, bias=False) for i, o, k, s in shapes])
            self.bns = nn.ModuleList([BetaNorm(i) for i, _, _, _ in shapes[1:]])
            self.project = nn.Conv2d(cin, cout, 1, stride, bias=False) if bottleneck and cin != cout else None
            self.avg_pad = not bottleneck and cin != cout

        def forward(self, x):
            y = leaky(self.init_bn(x))
            shortcut = y if self.first else x
            for i, conv in enumerate(self.convs):
                y = conv(y if i == 0 else leaky(self.bns[i - 1](y)))
            if self.project is not None:
                shortcut = self.project(shortcut)
            elif self.avg_pad:
                shortcut = F.pad(F.avg_pool2d(shortcut, self.stride, self.stride), (0, 0, 0, 0, self.pad, self.pad))
            return y + shortcut

    class TfCifarResNet(nn.Module):  # resnet_model.ResNet._build_model
        def __init__(self, units, bottleneck, classes=10):
            super().__init__()
            filters = (16, 64, 128, 256) if bottleneck else (16, 16, 32, 64)
            self.stem = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
            blocks, cin = [], filters[0]
            for stage, stride in enumerate((1, 2, 2)):
                for i in range(units):
                    cout = filters[stage + 1]
                    blocks.append(TfUnit(cin, cout, stride if i == 0 else 1, stage == 0 and i == 0, bottleneck))
                    cin = cout
            self.blocks = nn.Sequential(*blocks)
            self.final_bn = BetaNorm(cin)
            self.logits = nn.Linear(cin, classes)

        def forward(self, x):
            x = leaky(self.final_bn(self.blocks(self.stem(x))))
            return self.logits(x.mean(dim=(2, 3)))

    class PtBlock(nn.Module):  # PreActBlock / PreActBottleneck
        def __init__(self, cin, planes, stride, bottleneck):
            super().__init__()
            cout = planes * (4 if bottleneck else 1)
            shapes = ([(cin, planes, 1, 1), (planes, planes, 3, stride), (planes, cout, 1, 1)] if bottleneck
                      else [(cin, planes, 3, stride), (planes, planes, 3, 1)])
            self.bns = nn.ModuleList([nn.BatchNorm2d(i) for i, _, _, _ in shapes])
            self.convs = nn.ModuleList([nn.Conv2d(i, o, k, s, k // 2, bias=False) for i, o, k, s in shapes])
            self.shortcut = nn.Conv2d(cin, cout, 1, stride, bias=False) if stride != 1 or cin != cout else None

        def forward(self, x):
            h = F.relu(self.bns[0](x))
            shortcut = x if self.shortcut is None else self.shortcut(h)
            for i, conv in enumerate(self.convs):
                h = conv(h if i == 0 else F.relu(self.bns[i](h)))
            return h + shortcut

    class PtCifarResNet(nn.Module):  # ResNet(pre-activation block, [n] * 3, [16, 32, 64])
        def __init__(self, blocks_per_stage, bottleneck, classes=10):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
            blocks, cin = [], 16
            for stage, planes in enumerate((16, 32, 64)):
                for i in range(blocks_per_stage):
                    blocks.append(PtBlock(cin, planes, 2 if stage and not i else 1, bottleneck))
                    cin = planes * (4 if bottleneck else 1)
            self.blocks = nn.Sequential(*blocks)
            self.final_bn = nn.BatchNorm2d(cin)
            self.logits = nn.Linear(cin, classes)

        def forward(self, x):
            x = F.relu(self.final_bn(self.blocks(self.stem(x))))
            return self.logits(F.avg_pool2d(x, x.shape[2:]).flatten(1))

    return types.SimpleNamespace(CifarResNet=CifarResNet, ShakeShake=ShakeShake, TfCifarResNet=TfCifarResNet,
                                 PtCifarResNet=PtCifarResNet, BetaNorm=BetaNorm, torch=torch, nn=nn)


def build(name: str, device="meta"):
    """A freshly built CIFAR model by preset name (parameters on ``device``)."""
    kind, arg = CIFAR[name]
    nets = _nets()
    with nets.torch.device(device):
        if kind == "tf-resnet":
            return nets.TfCifarResNet(*arg)
        if kind == "pt-resnet":
            return nets.PtCifarResNet(*arg)
        return nets.CifarResNet(arg) if kind == "resnet" else nets.ShakeShake(arg)


def tf_variables(module) -> list[list]:
    """[name, elements, trainable] of the TensorFlow variables the graph creates, in creation
    order: a convolution's kernel then bias, a batch norm's gamma, beta, moving_mean, moving_variance
    (tf.layers.batch_normalization; tf.contrib.layers.batch_norm with scale=False: beta, moving_mean,
    moving_variance), the dense logits' kernel and bias. The modules above are registered in the order
    the TensorFlow code builds them."""
    nets = _nets()
    nn = nets.nn
    out = []
    for name, m in module.named_modules():
        if isinstance(m, nets.BetaNorm):
            c = m.beta.numel()
            out += [[f"{name}/beta", c, True], [f"{name}/moving_mean", c, False], [f"{name}/moving_variance", c, False]]
        elif isinstance(m, (nn.Conv2d, nn.Linear)):
            out.append([f"{name}/kernel", m.weight.numel(), True])
            if m.bias is not None:
                out.append([f"{name}/bias", m.bias.numel(), True])
        elif isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            out += [[f"{name}/gamma", c, True], [f"{name}/beta", c, True],
                    [f"{name}/moving_mean", c, False], [f"{name}/moving_variance", c, False]]
    return out


def write_presets(folder=None, names=None) -> list:
    """Trace the CIFAR models and write their graphs and variable lists as JSON (needs torch)."""
    import torch

    from perfmodel.core.errors import UnsupportedError
    from perfmodel.workload.cnn_presets import GRAPH_PRESETS, GRAPHS_DIR
    from perfmodel.workload.graph import GraphModel
    from perfmodel.workload.torch_import import from_torch

    folder = Path(folder) if folder else GRAPHS_DIR
    written = []
    for key in names or CIFAR:
        spec = GRAPH_PRESETS[key]
        module = build(key)
        count = sum(p.numel() for p in module.parameters())
        if count != spec["published_params"]:
            raise UnsupportedError(f"{key}: {count:,} parameters, its source code has {spec['published_params']:,}")
        x = torch.empty(2, 3, spec["image"], spec["image"], device="meta")
        graph = from_torch(module, x, name=key)
        origin, variables_origin = ORIGINS[CIFAR[key][0]]
        note = f"input 3x32x32 (CIFAR-10); architecture written in plain torch after {origin}"
        graph = GraphModel(**{**graph.__dict__, "source": spec["source"], "notes": graph.notes + (note,)})
        graph.save(folder / f"{key}.json")
        written.append(folder / f"{key}.json")
        if variables_origin is None:  # a PyTorch model: no parameter servers to place its variables on
            continue
        variables = {"source": f"TensorFlow variables of the {variables_origin} graph, in creation order",
                     "variables": tf_variables(module)}
        (folder / f"{key}.variables.json").write_text(json.dumps(variables, indent=0) + "\n")
        written.append(folder / f"{key}.variables.json")
    return written


def main(argv=None) -> int:
    return presets_main(write_presets, __doc__.splitlines()[0], "the CIFAR graph presets", argv)


if __name__ == "__main__":
    raise SystemExit(run_command(main))
