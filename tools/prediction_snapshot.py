"""Build-time tool: a snapshot of bundled predictions, to show a restructuring changed none of them.

    python -m tools.prediction_snapshot before.json          # on the old commit
    python -m tools.prediction_snapshot after.json           # on the new one
    python -m tools.prediction_snapshot --compare before.json after.json

A snapshot holds 100 seeded random configurations (model, node, nodes, tp, pp, micro-batch, ZeRO,
recompute, framework, sequence parallelism, TP overlap, schedule) priced with the bundled profiles
(step time, peak memory, breakdown, interval, MFU; or the error's class and message), the top rows
and rejection counts of seven searches, one spot-training plan, the tidy H200 microbenchmark table and, with torch, three
small traced modules. ``--compare`` reports the entries that differ (floats compared exactly).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import warnings
from pathlib import Path

from perfmodel.core.entry import run_command
import perfmodel as pm
from perfmodel.fit.tables import legacy_h200_to_tidy

MODELS = ("gpt2-small", "gpt2-medium", "gpt2-large", "bert-base", "llama-2-7b", "llama-3-8b", "llama-2-13b",
          "llama-3-70b", "mixtral-8x7b", "resnet50", "inception-v3", "vgg16", "vit-b-16")
NODES = ("dgx-a100-80gb", "dgx-h100", "hgx-h200", "dgx-1-v100", "dgx-a100-40gb")
# searches: name -> (preset, node, nodes, global batch, options); the last four are the default
# spaces a search-speed change must leave as they were (top-20 rows and the rejection counts)
SEARCHES = {"llama-3-8b": ("llama-3-8b", "dgx-h100", 2, 256, {}), "gpt2-small": ("gpt2-small", "hgx-h200", 1, 64, {}),
            "resnet50": ("resnet50", "dgx-a100-80gb", 2, 256, {}),
            "llama-3-405b": ("llama-3-405b", "dgx-h100", 2048, 2048, {}),
            "llama-3-70b": ("llama-3-70b", "dgx-h100", 64, 512, {}),
            "gpt2-small 2 nodes": ("gpt2-small", "dgx-h100", 2, 256, {}),
            "llama-3-8b torchtitan": ("llama-3-8b", "dgx-h100", 8, 256, {"framework": "torchtitan"})}
COUNTS = ("rejected", "rejected_detail", "evaluated", "feasible", "pruned")
H200_TABLES = Path(pm.__file__).parent / "data" / "h200-2026-11-29"


def _random_strategy(rng: random.Random) -> dict:
    tp = rng.choice([1, 2, 4, 8])
    return dict(tp=tp, pp=rng.choice([1, 1, 2, 4]), micro_batch=rng.choice([1, 2, 4, 8]),
                zero=rng.choice([0, 1, 2, 3]), recompute=rng.choice([None, "none", "full", "selective"]),
                framework=rng.choice(["pytorch", "megatron"]),
                sequence_parallel=rng.choice([False, True]) and tp > 1,
                tp_overlap=rng.choice([False, True]) and tp > 1, schedule=rng.choice(["1f1b", "gpipe"]))


def _priced(model, cluster, strategy) -> list:
    try:
        p = pm.predict(model, cluster, strategy)
    except pm.PerfModelError as exc:
        return ["error", type(exc).__name__, str(exc)]
    return [float(p.step_time), float(p.peak_memory), {k: float(v) for k, v in p.breakdown.items()},
            [float(x) for x in p.interval], p.interval_regime, bool(p.fits), float(p.mfu)]


def _traced() -> dict:
    try:
        import torch
    except ImportError:
        return {}
    nn = torch.nn
    torch.manual_seed(0)
    modules = {"mlp": (nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10)), torch.randn(4, 16)),
               "cnn": (nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                     nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10)),
                       torch.randn(4, 3, 16, 16)),
               "attention": (nn.TransformerEncoderLayer(64, 4, 128, batch_first=True), torch.randn(2, 32, 64))}
    out = {}
    for name, (module, x) in modules.items():
        g = pm.from_torch(module, x, loss=(lambda y: y.float().sum()) if name == "attention" else None)
        out[f"torch {name}"] = [repr(g.ops), _priced(g, pm.cluster("h200"), pm.Strategy(micro_batch=4))]
    return out


def snapshot(seed: int = 1234) -> dict:
    """Every entry the snapshot compares, keyed by a readable description."""
    warnings.filterwarnings("ignore")
    rng, out = random.Random(seed), {}
    for i in range(100):
        model, node, nodes = rng.choice(MODELS), rng.choice(NODES), rng.choice([1, 2, 4])
        kw = _random_strategy(rng)
        out[f"{i} {model} {node}x{nodes} {sorted(kw.items())}"] = _priced(
            pm.preset(model), pm.cluster(node, nodes=nodes), pm.Strategy(**kw))
    for name, (model, node, nodes, batch, options) in SEARCHES.items():
        df = pm.search(pm.preset(model), pm.cluster(node, nodes=nodes), batch, top_k=20, **options)
        out[f"search {name}"] = df.to_csv(float_format="%.17g")
        out[f"search {name} counts"] = json.loads(json.dumps({k: df.attrs.get(k, 0) for k in COUNTS}, default=str))
    plan = pm.plan_training(pm.preset("gpt2-small"), pm.cluster("h100-sxm5-80gb", nodes=4),
                            pm.Strategy(micro_batch=8), 1000, trials=200)
    out["plan gpt2-small"] = plan.to_csv(float_format="%.17g")
    out["h200 tidy table sha256"] = hashlib.sha256(legacy_h200_to_tidy(H200_TABLES).to_csv().encode()).hexdigest()
    return {**out, **_traced()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="the snapshot to write, or with --compare the two to compare")
    parser.add_argument("--compare", action="store_true")
    args = parser.parse_args(argv)
    if not args.compare:
        with open(args.paths[0], "w") as f:
            json.dump(snapshot(), f, indent=0)
        return 0
    a, b = (json.load(open(p)) for p in args.paths)
    differ = sorted(k for k in a.keys() | b.keys() if json.dumps(a.get(k)) != json.dumps(b.get(k)))  # NaN == NaN
    print(f"{len(a)} entries, {len(differ)} differ" + "".join(f"\n  {k}" for k in differ[:20]))
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
