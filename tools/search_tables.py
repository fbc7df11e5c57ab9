"""Build-time tool: the top-20 tables of four default searches, to show a speed change moved none of them.

    python -m tools.search_tables before.pkl                 # on the old commit
    python -m tools.search_tables after.pkl                  # on the new one
    python -m tools.search_tables --compare before.pkl after.pkl

The searches: Llama-3-405B on 2,048 x dgx-h100 (global batch 2,048), Llama-3-70B on 64 x dgx-h100
(512), gpt2-small on 2 x dgx-h100 (256) and torchtitan Llama-3-8B on 8 x dgx-h100 (256), each with
every cache emptied first. ``--compare`` checks every column exactly and the counts in ``attrs``.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time

import pandas as pd

import perfmodel as pm
from perfmodel.core.memo import clear_memos

CASES = {"llama-3-405b": ("dgx-h100", 2048, 2048, {}), "llama-3-70b": ("dgx-h100", 64, 512, {}),
         "gpt2-small": ("dgx-h100", 2, 256, {}), "llama-3-8b torchtitan": ("dgx-h100", 8, 256,
                                                                           {"framework": "torchtitan"})}
COUNTS = ("rejected", "rejected_detail", "evaluated", "feasible")


def snapshot() -> dict:
    out = {}
    for name, (node, nodes, batch, options) in CASES.items():
        clear_memos()
        t = time.process_time()
        df = pm.search(name.split()[0], pm.cluster(node, nodes=nodes), batch, top_k=20, **options)
        print(f"{name}: {df.attrs['evaluated']:,} priced, {time.process_time() - t:.2f} CPU s")
        out[name] = (df, {k: df.attrs[k] for k in COUNTS})
    return out


def compare(before: dict, after: dict) -> int:
    differ = 0
    for name, (a, counts) in before.items():
        b, other = after[name]
        try:
            pd.testing.assert_frame_equal(a, b, check_exact=True)
            same = counts == other
        except AssertionError:
            same = False
        differ += not same
        print(f"{name}: {'identical' if same else 'DIFFERS'}")
    return 1 if differ else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+")
    parser.add_argument("--compare", action="store_true")
    args = parser.parse_args(argv)
    if args.compare:
        with open(args.files[0], "rb") as a, open(args.files[1], "rb") as b:
            return compare(pickle.load(a), pickle.load(b))
    with open(args.files[0], "wb") as f:
        pickle.dump(snapshot(), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
