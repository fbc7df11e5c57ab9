"""Cold single predictions, for counting CPU instructions (a figure the machine's load does not move).

Run:  valgrind --tool=callgrind --callgrind-out-file=/dev/null python benchmarks/cold_predict.py N [--repeated | --distinct]

Predicts the ten Megatron-LM SC21 configurations of ``benchmarks/speed.py`` once (imports,
profile loading), then N rounds of the ten with every cache emptied before each call
(``--repeated``: the caches kept, as speed.py's "repeated"). callgrind's "Collected" count of
a run with N rounds minus that of a run with 0 rounds, over 10 N, is the instructions of one
prediction. ``--distinct``: after the first round, the caches emptied and the ten predicted
again, then N rounds of speed.py's distinct variants (``distinct_cases``: 50 strategies, each
predicted once per round, the caches emptied and the ten predicted before each round but the
first); the difference of N = 1 and N = 0 over 50 is one prediction of a configuration not seen
before, the model and cluster warm.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rounds", type=int, help="rounds of the ten configurations after the first")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--repeated", action="store_true", help="keep the caches between calls")
    mode.add_argument("--distinct", action="store_true", help="each of speed.py's variants once per round")
    args = parser.parse_args(argv)
    import perfmodel as pm
    from perfmodel.core.memo import clear_memos
    from test_published_runs import cluster_of, load_rows, model_of, strategy_of

    rows = [r for r in load_rows() if r["name"].startswith("megatron-")]
    cases = [(model_of(r), cluster_of(r), strategy_of(r)) for r in rows]
    for case in cases:
        pm.predict(*case)
    if args.distinct:
        return distinct_rounds(cases, args.rounds)
    for _ in range(args.rounds):
        for case in cases:
            if not args.repeated:
                clear_memos()
            pm.predict(*case)
    return 0


def distinct_rounds(cases, rounds: int) -> int:
    """``rounds`` rounds of speed.py's distinct variants, the ten ``cases`` warm before each."""
    import perfmodel as pm
    from perfmodel.core.memo import clear_memos
    from speed import distinct_cases

    variants = distinct_cases(cases)
    clear_memos()
    for case in cases:
        pm.predict(*case)
    for i in range(rounds):
        if i:
            clear_memos()
            for case in cases:
                pm.predict(*case)
        for case in variants:
            pm.predict(*case)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
