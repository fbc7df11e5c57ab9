"""Build-time tool: the plain-torch CNN/ViT models behind the shipped graph presets.

    python -m tools.cnn_models --write-presets      # regenerate perfmodel/workload/data/graphs/*.json (needs torch)

The layer structure follows torchvision.models exactly, so the parameter counts
equal torchvision's (checked on writing); written here so that neither the
generator nor the tests need torchvision. Not part of the installed package:
predictions read the JSON graphs only.
"""

from __future__ import annotations

import math
import types
from functools import lru_cache
from pathlib import Path

from perfmodel.core.entry import run_command
from perfmodel.core.errors import unknown_name
from perfmodel.workload.cnn_presets import GRAPH_PRESETS, GRAPHS_DIR, _key
from tools.cifar_models import CIFAR
from tools.presets_cli import presets_main


def write_presets(folder=None, names=None) -> list:
    """Trace the plain-torch models below and write their graphs as JSON (needs torch)."""
    import torch

    from perfmodel.core.errors import UnsupportedError
    from perfmodel.workload.graph import GraphModel
    from perfmodel.workload.torch_import import from_torch

    folder = Path(folder) if folder else GRAPHS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for key in names or [k for k in GRAPH_PRESETS if k not in CIFAR]:  # CIFAR: tools/cifar_models.py
        spec = GRAPH_PRESETS[key]
        module = build(key, device="meta")
        count = sum(p.numel() for p in module.parameters())
        if count != spec["published_params"]:
            raise UnsupportedError(f"{key}: {count:,} parameters, torchvision has {spec['published_params']:,}")
        x = torch.empty(2, 3, spec["image"], spec["image"], device="meta")
        graph = from_torch(module, x, loss=loss_for(key), name=key)
        note = (f"input 3x{spec['image']}x{spec['image']}; architecture written in plain torch after "
                "torchvision.models (parameter count checked equal)")
        graph = GraphModel(**{**graph.__dict__, "source": spec["source"], "notes": graph.notes + (note,)})
        graph.save(folder / f"{key}.json")
        written.append(folder / f"{key}.json")
    return written


RESNET_BLOCKS = {"resnet50": (3, 4, 6, 3), "resnet101": (3, 4, 23, 3), "resnet152": (3, 8, 36, 3)}
# ResNeXt 32x4d: (blocks per stage, squeeze-excitation) -- timm resnet.py resnext*/seresnext* (SE after bn3)
RESNEXT = {"resnext50-32x4d": ((3, 4, 6, 3), False), "resnext101-32x4d": ((3, 4, 23, 3), False),
           "seresnext50-32x4d": ((3, 4, 6, 3), True), "seresnext101-32x4d": ((3, 4, 23, 3), True)}
# torchvision.models.efficientnet: (width_mult, depth_mult, dropout) of efficientnet_b0 .. b4
EFFICIENTNET_SCALE = {"efficientnet-b0": (1.0, 1.0, 0.2), "efficientnet-b2": (1.1, 1.2, 0.3),
                      "efficientnet-b3": (1.2, 1.4, 0.3), "efficientnet-b4": (1.4, 1.8, 0.4)}


# -- the models, in plain torch (torch imported only when building) ---------------------------------
def build(name: str, *, num_classes: int = 1000, device="meta"):
    """A freshly built model by preset name (parameters on ``device``; meta by default)."""
    import torch

    key = _key(name)
    if key not in GRAPH_PRESETS:
        raise unknown_name("graph preset", name, GRAPH_PRESETS)
    if key in CIFAR:
        from tools.cifar_models import build as build_cifar

        return build_cifar(key, device=device)
    nets = _nets()
    with torch.device(device):
        if key in RESNEXT:
            blocks, se = RESNEXT[key]
            return nets.resnet(blocks, num_classes, groups=32, group_width=4, se=se)
        if key in EFFICIENTNET_SCALE:
            return nets.efficientnet(num_classes, *EFFICIENTNET_SCALE[key])
        if key.startswith("resnet"):
            return nets.resnet(RESNET_BLOCKS[key], num_classes)
        if key == "vgg16":
            return nets.vgg16(num_classes)
        if key in ("inception-v3", "inception-v3-tf"):
            return nets.Inception3(num_classes, tf=key == "inception-v3-tf")
        return nets.vit_b_16(num_classes)


def loss_for(name: str):
    """Training loss of a preset: cross-entropy, plus 0.4 × the auxiliary head's for Inception-v3."""
    if _key(name) != "inception-v3":
        return None

    def inception_loss(out):
        import torch
        import torch.nn.functional as F

        logits, aux = out
        target = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        return F.cross_entropy(logits, target) + 0.4 * F.cross_entropy(aux, target)
    return inception_loss


@lru_cache(maxsize=1)
def _nets():
    """Module classes, defined on first use so that importing this file does not import torch."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    def bn_conv(cin, cout, kernel, stride=1, padding=0, eps=1e-5, groups=1):
        return [nn.Conv2d(cin, cout, kernel, stride, padding, groups=groups, bias=False),
                nn.BatchNorm2d(cout, eps=eps)]

    class SEModule(nn.Module):  # timm layers/squeeze_excite.py SEModule: mean, 1x1 (C/16, to 8), ReLU, 1x1, sigmoid
        def __init__(self, channels):
            super().__init__()
            rd = max(8, int(channels / 16 + 4) // 8 * 8)
            self.fc1, self.fc2 = nn.Conv2d(channels, rd, 1), nn.Conv2d(rd, channels, 1)

        def forward(self, x):
            return x * self.fc2(F.relu(self.fc1(x.mean((2, 3), keepdim=True)))).sigmoid()

    class Bottleneck(nn.Module):  # torchvision.models.resnet.Bottleneck (expansion 4, stride on conv2)
        def __init__(self, cin, width, stride, groups=1, group_width=64, se=False):
            super().__init__()
            out, inner = width * 4, int(width * group_width / 64) * groups  # ResNeXt: C groups of d channels
            self.body = nn.Sequential(*bn_conv(cin, inner, 1), nn.ReLU(inplace=True),
                                      *bn_conv(inner, inner, 3, stride, 1, groups=groups), nn.ReLU(inplace=True),
                                      *bn_conv(inner, out, 1), *([SEModule(out)] if se else []))
            self.down = nn.Sequential(*bn_conv(cin, out, 1, stride)) if stride != 1 or cin != out else None

        def forward(self, x):
            identity = x if self.down is None else self.down(x)
            return F.relu(self.body(x) + identity)

    def resnet(blocks, num_classes, groups=1, group_width=64, se=False):
        layers, cin = [*bn_conv(3, 64, 7, 2, 3), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)], 64
        for stage, count in enumerate(blocks):
            width = 64 * 2 ** stage
            for i in range(count):
                layers.append(Bottleneck(cin, width, 2 if stage > 0 and i == 0 else 1, groups, group_width, se))
                cin = width * 4
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, num_classes))

    def vgg16(num_classes):
        layers, cin = [], 3
        for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"):
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, v, 3, padding=1), nn.ReLU(inplace=True)]
                cin = v
        head = [nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(True),
                nn.Dropout(), nn.Linear(4096, num_classes)]
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(7), nn.Flatten(), *head)

    ns = types.SimpleNamespace(resnet=resnet, vgg16=vgg16, torch=torch, nn=nn, F=F, bn_conv=bn_conv)
    _efficientnet_classes(ns)
    _inception_classes(ns)
    _vit_classes(ns)
    return ns


# torchvision.models.efficientnet _efficientnet_conf("efficientnet_b0"): (expand, kernel, stride, in, out, layers)
EFFICIENTNET_B0 = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
                   (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))


def _efficientnet_classes(ns) -> None:
    """torchvision.models.efficientnet: MBConv (expand 1x1, depthwise kxk, squeeze-excitation, project 1x1),
    SiLU, stochastic depth left out (an identity in the step's kernels at inference of the count)."""
    nn, F = ns.nn, ns.F

    def conv_bn_act(cin, cout, kernel, stride=1, groups=1, act=True):
        layers = ns.bn_conv(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups)
        return layers + ([nn.SiLU(inplace=True)] if act else [])

    class SE(nn.Module):  # torchvision.ops.SqueezeExcitation: avg pool, 1x1 conv, SiLU, 1x1 conv, sigmoid, scale
        def __init__(self, channels, squeeze):
            super().__init__()
            self.fc1, self.fc2 = nn.Conv2d(channels, squeeze, 1), nn.Conv2d(squeeze, channels, 1)

        def forward(self, x):
            s = F.adaptive_avg_pool2d(x, 1)
            return x * self.fc2(F.silu(self.fc1(s))).sigmoid()

    class MBConv(nn.Module):
        def __init__(self, expand, kernel, stride, cin, cout):
            super().__init__()
            mid = cin * expand
            layers = conv_bn_act(cin, mid, 1) if expand != 1 else []
            layers += conv_bn_act(mid, mid, kernel, stride, groups=mid) + [SE(mid, max(1, cin // 4))]
            self.body = nn.Sequential(*layers, *conv_bn_act(mid, cout, 1, act=False))
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            return x + self.body(x) if self.residual else self.body(x)

    def efficientnet(num_classes, width=1.0, depth=1.0, dropout=0.2):
        ch = lambda c: _make_divisible(c * width)  # noqa: E731  (torchvision _MBConvConfig.adjust_channels)
        layers = conv_bn_act(3, ch(32), 3, 2)
        for expand, kernel, stride, cin, cout, count in EFFICIENTNET_B0:
            layers += [MBConv(expand, kernel, stride if i == 0 else 1, ch(cin) if i == 0 else ch(cout), ch(cout))
                       for i in range(math.ceil(count * depth))]  # adjust_depth
        last = 4 * ch(320)
        layers += conv_bn_act(ch(320), last, 1)
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout),
                             nn.Linear(last, num_classes))

    ns.efficientnet = efficientnet


def _make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision.models._utils._make_divisible: round to a multiple of 8, never below 90% of ``v``."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def _inception_convs(ns):
    """torchvision.models.inception.BasicConv2d (conv + BN eps 1e-3 + ReLU), and ``seq(*specs)``: a
    Sequential of them, each spec (cin, cout, kernel[, keyword arguments])."""
    nn, F = ns.nn, ns.F

    class BC(nn.Module):
        def __init__(self, cin, cout, kernel, stride=1, padding=0):
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, kernel, stride, padding, bias=False)
            self.bn = nn.BatchNorm2d(cout, eps=0.001)

        def forward(self, x):
            return F.relu(self.bn(self.conv(x)), inplace=True)

    def seq(*specs):
        return nn.Sequential(*(BC(*s[:3], **(s[3] if len(s) > 3 else {})) for s in specs))
    return seq


def _inception_blocks(ns, seq) -> types.SimpleNamespace:
    """torchvision.models.inception's InceptionA-E as builders ``a(c, pool)``, ``b(c)``, ``c(c, c7)``,
    ``d(c)``, ``e(c)``: parallel branches concatenated on channels."""
    nn, F, torch = ns.nn, ns.F, ns.torch
    p1, p2 = {"padding": 1}, {"padding": 2}
    row, col = {"padding": (0, 3)}, {"padding": (3, 0)}

    class Mixed(nn.Module):
        """Parallel branches concatenated on channels; a branch is a Sequential or (pool, Sequential)."""

        def __init__(self, branches, pools, splits=None):
            super().__init__()
            self.branches = nn.ModuleList(branches)
            self.pools, self.splits = pools, nn.ModuleList(splits or [])

        def forward(self, x):
            outs = []
            for i, branch in enumerate(self.branches):
                pool = self.pools[i]
                h = x if pool is None else pool(x)
                outs.append(branch(h) if branch is not None else h)
            for j, (a, b) in enumerate(zip(self.splits[::2], self.splits[1::2])):  # Inception-E split heads
                h = outs[1 + j]
                outs[1 + j] = torch.cat([a(h), b(h)], 1)
            return torch.cat(outs, 1)

    avg = lambda x: F.avg_pool2d(x, 3, 1, 1)  # noqa: E731
    mx = lambda x: F.max_pool2d(x, 3, 2)  # noqa: E731

    def block_a(c, pool):
        return Mixed([seq((c, 64, 1)), seq((c, 48, 1), (48, 64, 5, p2)),
                      seq((c, 64, 1), (64, 96, 3, p1), (96, 96, 3, p1)), seq((c, pool, 1))], [None, None, None, avg])

    def block_b(c):
        return Mixed([seq((c, 384, 3, {"stride": 2})), seq((c, 64, 1), (64, 96, 3, p1), (96, 96, 3, {"stride": 2})),
                      None], [None, None, mx])

    def block_c(c, c7):
        return Mixed([seq((c, 192, 1)), seq((c, c7, 1), (c7, c7, (1, 7), row), (c7, 192, (7, 1), col)),
                      seq((c, c7, 1), (c7, c7, (7, 1), col), (c7, c7, (1, 7), row), (c7, c7, (7, 1), col),
                          (c7, 192, (1, 7), row)), seq((c, 192, 1))], [None, None, None, avg])

    def block_d(c):
        return Mixed([seq((c, 192, 1), (192, 320, 3, {"stride": 2})),
                      seq((c, 192, 1), (192, 192, (1, 7), row), (192, 192, (7, 1), col), (192, 192, 3, {"stride": 2})),
                      None], [None, None, mx])

    def block_e(c, pool=avg):
        a, b = {"padding": (0, 1)}, {"padding": (1, 0)}
        splits = [seq((384, 384, (1, 3), a)), seq((384, 384, (3, 1), b)),
                  seq((384, 384, (1, 3), a)), seq((384, 384, (3, 1), b))]
        return Mixed([seq((c, 320, 1)), seq((c, 384, 1)), seq((c, 448, 1), (448, 384, 3, p1)), seq((c, 192, 1))],
                     [None, None, None, pool], splits)
    same_max = lambda x: F.max_pool2d(x, 3, 1, 1)  # noqa: E731  (tf_cnn_benchmarks' second E block)
    return types.SimpleNamespace(a=block_a, b=block_b, c=block_c, d=block_d, e=block_e, same_max=same_max)


def _inception_classes(ns) -> None:
    """torchvision.models.inception.Inception3 (stem, blocks A-E, the auxiliary head) as ``ns.Inception3``;
    ``Inception3(n, tf=True)`` is tf_cnn_benchmarks' inception3 instead (tensorflow/benchmarks @9165a70
    scripts/tf_cnn_benchmarks/inception_model.py): no auxiliary head, no dropout, max pooling in the last
    E block."""
    nn, F, torch = ns.nn, ns.F, ns.torch
    seq = _inception_convs(ns)
    blocks = _inception_blocks(ns, seq)
    block_a, block_b, block_c, block_d, block_e = blocks.a, blocks.b, blocks.c, blocks.d, blocks.e
    p1, avg = {"padding": 1}, lambda x: F.avg_pool2d(x, 3, 1, 1)

    class Aux(nn.Module):
        def __init__(self, c, num_classes):
            super().__init__()
            self.convs = seq((c, 128, 1), (128, 768, 5))
            self.fc = nn.Linear(768, num_classes)

        def forward(self, x):
            x = self.convs(F.avg_pool2d(x, 5, 3))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

    class Inception3(nn.Module):
        def __init__(self, num_classes, tf=False):
            super().__init__()
            self.stem = nn.Sequential(seq((3, 32, 3, {"stride": 2}), (32, 32, 3), (32, 64, 3, p1)), nn.MaxPool2d(3, 2),
                                      seq((64, 80, 1), (80, 192, 3)), nn.MaxPool2d(3, 2),
                                      block_a(192, 32), block_a(256, 64), block_a(288, 64), block_b(288),
                                      block_c(768, 128), block_c(768, 160), block_c(768, 160), block_c(768, 192))
            self.aux = None if tf else Aux(768, num_classes)
            self.tail = nn.Sequential(block_d(768), block_e(1280), block_e(2048, blocks.same_max if tf else avg))
            self.fc = nn.Linear(2048, num_classes)
            self.dropout = 0.0 if tf else 0.5

        def forward(self, x):
            x = self.stem(x)
            aux = self.aux(x) if self.training and self.aux is not None else None
            x = F.dropout(torch.flatten(F.adaptive_avg_pool2d(self.tail(x), 1), 1), self.dropout, self.training)
            return self.fc(x) if self.aux is None else (self.fc(x), aux)

    ns.Inception3 = Inception3


def _vit_classes(ns) -> None:
    """torchvision.models.vision_transformer.vit_b_16: patch conv, class token, 12 pre-LN blocks."""
    nn, torch = ns.nn, ns.torch

    class Block(nn.Module):
        def __init__(self, h=768, heads=12, mlp=3072):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(h, eps=1e-6), nn.LayerNorm(h, eps=1e-6)
            self.self_attention = nn.MultiheadAttention(h, heads, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(h, mlp), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp, h), nn.Dropout(0.0))

        def forward(self, x):
            y = self.ln_1(x)
            x = x + self.self_attention(y, y, y, need_weights=False)[0]
            return x + self.mlp(self.ln_2(x))

    class ViT(nn.Module):
        def __init__(self, num_classes, h=768, patch=16, image=224, layers=12):
            super().__init__()
            self.conv_proj = nn.Conv2d(3, h, patch, patch)
            self.class_token = nn.Parameter(torch.zeros(1, 1, h))
            self.pos_embedding = nn.Parameter(torch.zeros(1, (image // patch) ** 2 + 1, h))
            self.layers = nn.Sequential(*(Block(h) for _ in range(layers)))
            self.ln = nn.LayerNorm(h, eps=1e-6)
            self.head = nn.Linear(h, num_classes)

        def forward(self, x):
            x = self.conv_proj(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embedding
            return self.head(self.ln(self.layers(x))[:, 0])

    ns.vit_b_16 = ViT


def main(argv=None) -> int:
    return presets_main(write_presets, __doc__.splitlines()[0], "data/graphs/*.json", argv)


if __name__ == "__main__":
    raise SystemExit(run_command(main))
