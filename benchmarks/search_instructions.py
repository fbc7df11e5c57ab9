"""One cold default search, for counting CPU instructions (a figure the machine's load does not move).

Run:  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=/dev/null \
          python benchmarks/search_instructions.py

Searches the case of ``benchmarks/speed.py`` (Llama-3-405B on 16,384 H100, default space) once
uninstrumented (imports, profile loading), empties every cache, then turns callgrind's
instrumentation on (``callgrind_control -i on``) for one search only: callgrind's "Collected"
count is that search's instructions. Outside valgrind it prints the search's CPU seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's perfmodel, installed or not


def _instrument(on: bool) -> None:
    """Turn callgrind's instrumentation of this process on or off (nothing outside valgrind)."""
    try:
        subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())],
                       capture_output=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        pass


def main() -> int:
    import perfmodel as pm
    from perfmodel.core.memo import clear_memos
    from speed import SEARCH_CASE

    model, cluster = pm.preset(SEARCH_CASE["model"]), pm.cluster(SEARCH_CASE["node"], nodes=SEARCH_CASE["nodes"])
    pm.search(model, cluster, SEARCH_CASE["global_batch"])
    clear_memos()
    _instrument(True)
    t0 = time.process_time()
    df = pm.search(model, cluster, SEARCH_CASE["global_batch"])
    cpu = time.process_time() - t0
    _instrument(False)
    print(f"{df.attrs['evaluated']:,} configurations priced in {cpu:.3f} CPU s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
