"""Build-time tool: Tensor2Tensor 1.9's CIFAR-10 ResNets and Shake-Shake networks in plain torch.

    python -m tools.cifar_models --write-presets    # regenerate the four CIFAR graph presets (needs torch)

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
         "shake-shake-small": ("shake", 32), "shake-shake-big": ("shake", 96)}


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

    return types.SimpleNamespace(CifarResNet=CifarResNet, ShakeShake=ShakeShake, torch=torch, nn=nn)


def build(name: str, device="meta"):
    """A freshly built CIFAR model by preset name (parameters on ``device``)."""
    kind, arg = CIFAR[name]
    nets = _nets()
    with nets.torch.device(device):
        return nets.CifarResNet(arg) if kind == "resnet" else nets.ShakeShake(arg)


def tf_variables(module) -> list[list]:
    """[name, elements, trainable] of the TensorFlow variables the T2T graph creates, in creation
    order: a convolution's kernel then bias, a batch norm's gamma, beta, moving_mean, moving_variance
    (tf.layers.batch_normalization), the dense logits' kernel and bias. The modules above are
    registered in the order the T2T code builds them."""
    nn = _nets().nn
    out = []
    for name, m in module.named_modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
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
            raise UnsupportedError(f"{key}: {count:,} parameters, T2T 1.9 has {spec['published_params']:,}")
        x = torch.empty(2, 3, spec["image"], spec["image"], device="meta")
        graph = from_torch(module, x, name=key)
        note = "input 3x32x32 (CIFAR-10); architecture written in plain torch after tensor2tensor v1.9.0"
        graph = GraphModel(**{**graph.__dict__, "source": spec["source"], "notes": graph.notes + (note,)})
        graph.save(folder / f"{key}.json")
        variables = {"source": "TensorFlow variables of the T2T v1.9.0 graph, in creation order",
                     "variables": tf_variables(module)}
        (folder / f"{key}.variables.json").write_text(json.dumps(variables, indent=0) + "\n")
        written += [folder / f"{key}.json", folder / f"{key}.variables.json"]
    return written


def main(argv=None) -> int:
    return presets_main(write_presets, __doc__.splitlines()[0], "the CIFAR graph presets", argv)


if __name__ == "__main__":
    raise SystemExit(run_command(main))
