"""Print the CNN kernel classes of bundled profiles: points, CV error, reference-only error, c.

    python -m tools.cnn_report h200-sxm-141gb h200-sxm-141gb-calibrated v100-sxm2-32gb
"""

from __future__ import annotations

import sys

import perfmodel as pm

PREFIXES = ("conv.", "batchnorm", "relu", "silu", "sigmoid", "maxpool", "avgpool", "se_pool")


def rows(name: str) -> list[str]:
    prof = pm.load_profile(name)
    out = []
    for key, e in sorted(prof.compute.items()):
        if key.startswith(PREFIXES) and e.get("n_points"):
            out.append(f"| {name} | `{key}` | {e['n_points']} | {e['cv_mape']:.1%} | "
                       f"{e['reference_only_mape']:.1%} | {e['params']['c']:.2f} |")
    return out


def main(argv=None) -> int:
    print("| profile | class | rows | CV error | reference alone | c |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in (argv if argv is not None else sys.argv[1:]) or ["h200-sxm-141gb", "v100-sxm2-32gb"]:
        print("\n".join(rows(name)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
