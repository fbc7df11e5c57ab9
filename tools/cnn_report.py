"""Print the CNN kernel classes of bundled profiles: points, CV error, reference-only error, c.

    python -m tools.cnn_report h200-sxm-141gb h200-sxm-141gb-calibrated v100-sxm2-32gb
    python -m tools.cnn_report --steps      # step times of the CNN presets, batch 256, SGD, one GPU
"""

from __future__ import annotations

import argparse

import perfmodel as pm
from perfmodel.core.entry import run_command

PREFIXES = ("conv.", "batchnorm", "relu", "silu", "sigmoid", "maxpool", "avgpool", "se_pool", "se_scale")


def rows(name: str) -> list[str]:
    prof = pm.load_profile(name)
    out = []
    for key, e in sorted(prof.compute.items()):
        if key.startswith(PREFIXES) and e.get("n_points"):
            out.append(f"| {name} | `{key}` | {e['n_points']} | {e['cv_mape']:.1%} | "
                       f"{e['reference_only_mape']:.1%} | {e['params']['c']:.2f} |")
    return out


def steps() -> None:
    for name in ("resnet50", "efficientnet-b0", "resnext50-32x4d"):
        for gpu, precision in (("h200-sxm-141gb", "bf16-mixed"), ("a100-sxm4-80gb", "bf16-mixed"),
                               ("v100-sxm2-32gb", "fp16-mixed")):
            p = pm.predict(name, gpu, pm.Strategy(micro_batch=256, precision=precision, optimizer="sgd"))
            print(f"{name:16s} {gpu:16s} {precision:10s} {p.step_time * 1e3:7.1f} ms")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profiles", nargs="*", default=["h200-sxm-141gb", "v100-sxm2-32gb"],
                        help="bundled profile names or profile paths")
    parser.add_argument("--steps", action="store_true", help="print the presets' step times instead")
    args = parser.parse_args(argv)
    if args.steps:
        steps()
        return 0
    print("| profile | class | rows | CV error | reference alone | c |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.profiles:
        print("\n".join(rows(name)))
    return 0


if __name__ == "__main__":
    raise SystemExit(run_command(main))
