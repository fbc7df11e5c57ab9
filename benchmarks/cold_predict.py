"""Cold single predictions, for counting CPU instructions (a figure the machine's load does not move).

Run:  valgrind --tool=callgrind --callgrind-out-file=/dev/null python benchmarks/cold_predict.py N [--repeated]

Predicts the ten Megatron-LM SC21 configurations of ``benchmarks/speed.py`` once (imports,
profile loading), then N rounds of the ten with every cache emptied before each call
(``--repeated``: the caches kept, as speed.py's "repeated"). callgrind's "Collected" count of
a run with N rounds minus that of a run with 0 rounds, over 10 N, is the instructions of one
prediction.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", type=int, help="rounds of the ten configurations after the first")
    parser.add_argument("--repeated", action="store_true", help="keep the caches between calls")
    args = parser.parse_args(argv)
    import perfmodel as pm
    from perfmodel.core.memo import clear_memos
    from test_published_runs import cluster_of, load_rows, model_of, strategy_of

    rows = [r for r in load_rows() if r["name"].startswith("megatron-")]
    cases = [(model_of(r), cluster_of(r), strategy_of(r)) for r in rows]
    for case in cases:
        pm.predict(*case)
    for _ in range(args.rounds):
        for case in cases:
            if not args.repeated:
                clear_memos()
            pm.predict(*case)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
