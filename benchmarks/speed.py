"""Import time, single predictions per second and search configurations per second, beside llm-analysis.

Run:  python benchmarks/speed.py [--repeat 5] [--peer-python PATH] [--no-install] [--smoke] [--search-only]

Every number is the median of ``--repeat`` runs (at least 5 unless ``--smoke``), measured in this
one run on this machine, perfmodel and the peer one after the other, so ratios compare like with
like even on a busy machine (the absolute numbers do not).

* import: seconds of ``import perfmodel`` in a fresh interpreter beyond ``import numpy, pandas``
  (the peer: ``import llm_analysis.analysis`` beyond what it needs of numpy).
* predict/s: ``pm.predict`` calls per second over the ten Megatron-LM configurations of Narayanan
  et al. 2021, Table 1 (perfmodel/data/published_runs.csv). "repeated": the ten called over and
  over (the caches of perfmodel/core/memo.py warm, as in a notebook or a loop over strategies);
  "cold": every cache emptied before each call; "each configuration once": the 50 valid variants of
  the ten a loop over strategies makes (micro-batch 1, 2, 4 times global batch x1, x2), each predicted
  once after the caches were emptied and the ten predicted (what depends on the model, the cluster and
  the profile warm, nothing of the strategy). Each rate is given per wall-clock second and per
  CPU second of the measuring process (``time.process_time``: on cores shared with other jobs the
  wall clock also counts the time they take). The peer: ``LLMAnalysis.training`` on the same
  ten (model, parallelism, micro-batch, global batch, full recomputation) on its A100 config; it
  keeps no cache, so its one rate stands beside all three.
* search: ``pm.search`` of Llama-3-405B on 16,384 H100 (2,048 x dgx-h100), global batch 2,048,
  default space, caches emptied before each run; configurations priced per second, and the
  whole enumerated space (priced + pruned + rejected by rule) per second. llm-analysis has no search: its
  rate is one ``training`` call per configuration.

llm-analysis 0.2.2 runs in its own virtual environment (``benchmarks/.peer-venv``, created with
pip unless ``--no-install`` or ``--peer-python`` names another interpreter); it is not a
dependency of perfmodel. Without it, perfmodel's numbers are printed alone.
``--smoke`` (CI): two repeats (one search each, no warm-up; four of the distinct variants, once),
short timings, no install, no assertion on speed: it checks that the benchmark runs.
``--search-only``: the search case alone, one process, medians of ``--repeat`` (with ``--smoke``: one,
no warm-up), its wall and CPU seconds: what a change to the search moves, without the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's perfmodel, installed or not
PEER_VENV = ROOT / "benchmarks" / ".peer-venv"
PEER_PACKAGE = "llm-analysis==0.2.2"
SEARCH_CASE = {"model": "llama-3-405b", "node": "dgx-h100", "nodes": 2048, "global_batch": 2048}

IMPORT_PROBE = """
import importlib, sys, time
for name in {pre!r}:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
t = time.perf_counter()
importlib.import_module({module!r})
print(time.perf_counter() - t)
"""

PEER_PROBE = """
import json, logging, sys, time
from llm_analysis.analysis import ActivationRecomputation, LLMAnalysis
from llm_analysis.config import GPUConfig, ModelConfig, ParallelismConfig, get_gpu_config_by_name
logging.getLogger("__name__").setLevel(logging.ERROR)
rows, seconds, repeat = json.loads(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
gpu = get_gpu_config_by_name("a100-sxm-80gb")
def call(r):
    m = ModelConfig(name=r["name"], num_layers=r["layers"], n_head=r["heads"], hidden_dim=r["hidden"],
                    vocab_size=r["vocab"], max_seq_len=r["seq"], ffn_embed_dim=r["ffn_hidden"])
    p = ParallelismConfig(tp_size=r["tp"], pp_size=r["pp"], dp_size=r["dp"])
    a = LLMAnalysis(m, gpu, parallelism_config=p, flops_efficiency=0.5, hbm_memory_efficiency=0.9)
    return a.training(batch_size_per_gpu=r["micro_batch"], global_batch_size=r["global_batch"], seq_len=r["seq"],
                      activation_recomputation=ActivationRecomputation.FULL)
for r in rows:
    call(r)
rates = []
for _ in range(repeat):
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        for r in rows:
            call(r)
        n += len(rows)
    rates.append((n / (time.perf_counter() - t0), n / max(time.process_time() - c0, 1e-9)))
print(json.dumps(rates))
"""


def median_import(python: str, module: str, pre: tuple, repeat: int) -> float | None:
    """Median seconds of importing ``module`` in a fresh ``python`` after importing ``pre``."""
    code = IMPORT_PROBE.format(pre=pre, module=module)
    times = []
    for _ in range(repeat):
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=ROOT)
        if out.returncode:
            return None
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def megatron_rows() -> list[dict]:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_published_runs import load_rows

    return [r for r in load_rows() if r["name"].startswith("megatron-")]


def rate(fn, items, seconds: float) -> tuple[float, float]:
    """Calls of ``fn`` per second over ``items``, looped for at least ``seconds``: (per wall-clock
    second, per CPU second of this process: the time other jobs on the cores take does not count)."""
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        for x in items:
            fn(x)
        n += len(items)
        if time.perf_counter() - t0 >= seconds:
            return n / (time.perf_counter() - t0), n / max(time.process_time() - c0, 1e-9)


def medians(rates) -> tuple[float, float]:
    """Median (wall, CPU) rates of repeated ``rate`` calls."""
    rates = list(rates)
    return statistics.median(r[0] for r in rates), statistics.median(r[1] for r in rates)


def perfmodel_predict(rows, repeat: int, seconds: float, smoke: bool = False) -> dict:
    """Predictions per second, repeated, cold and each configuration once (``smoke``: four of the
    variants, measured once: the smoke run's cost stays about what it was without them)."""
    import perfmodel as pm
    from perfmodel.core.memo import clear_memos
    from test_published_runs import cluster_of, model_of, strategy_of

    cases = [(model_of(r), cluster_of(r), strategy_of(r)) for r in rows]
    for c in cases:
        pm.predict(*c)
    variants = distinct_cases(cases, 4 if smoke else None)

    def cold(c):
        clear_memos()
        return pm.predict(*c)

    return {"repeated": medians(rate(lambda c: pm.predict(*c), cases, seconds) for _ in range(repeat)),
            "cold": medians(rate(cold, cases, seconds) for _ in range(repeat)),
            "distinct": medians(distinct_rate(cases, variants) for _ in range(1 if smoke else repeat))}


def distinct_cases(cases, limit: int | None = None) -> list[tuple]:
    """Variants of ``cases`` a loop over strategies makes: micro-batch 1, 2, 4 times global batch x1, x2
    (``dataclasses.replace`` on the strategy), each valid one not among ``cases``, in a fixed order;
    the first ``limit`` of them."""
    import perfmodel as pm
    from perfmodel.errors import PerfModelError

    out, seen = [], {c[2] for c in cases}
    for model, cluster, strategy in cases:
        for micro in (1, 2, 4):
            for times in (1, 2):
                s = dataclasses.replace(strategy, micro_batch=micro, global_batch=strategy.global_batch * times)
                if s in seen:
                    continue
                try:
                    pm.predict(model, cluster, s)
                except PerfModelError:
                    continue
                seen.add(s)
                out.append((model, cluster, s))
                if len(out) == limit:
                    return out
    return out


def distinct_rate(cases, variants) -> tuple[float, float]:
    """Each of ``variants`` predicted once, after the caches were emptied and the ten ``cases``
    predicted (model-, cluster- and profile-level caches warm, as in a loop over strategies of one
    job): (per wall-clock second, per CPU second)."""
    import perfmodel as pm
    from perfmodel.core.memo import clear_memos

    clear_memos()
    for c in cases:
        pm.predict(*c)
    t0, c0 = time.perf_counter(), time.process_time()
    for c in variants:
        pm.predict(*c)
    return len(variants) / (time.perf_counter() - t0), len(variants) / max(time.process_time() - c0, 1e-9)


def perfmodel_search(repeat: int, workers: int, warm_up: bool = True) -> dict:
    import perfmodel as pm
    from perfmodel.core.memo import clear_memos

    model, cluster = pm.preset(SEARCH_CASE["model"]), pm.cluster(SEARCH_CASE["node"], nodes=SEARCH_CASE["nodes"])
    if warm_up:
        pm.search(model, cluster, SEARCH_CASE["global_batch"], workers=workers)  # profile loading, imports
    walls, cpus, attrs = [], [], None
    for _ in range(repeat):
        clear_memos()
        t0, c0 = time.perf_counter(), _cpu_seconds()
        df = pm.search(model, cluster, SEARCH_CASE["global_batch"], workers=workers)
        walls.append(time.perf_counter() - t0)
        cpus.append(_cpu_seconds() - c0)
        attrs = df.attrs
    wall, cpu = statistics.median(walls), statistics.median(cpus)
    rules = attrs["rejected"]["divisibility"] + attrs["rejected"]["batch"]
    space = attrs["evaluated"] + attrs["pruned"] + rules  # pruned: valid, bounded by a job priced before
    return {"wall_s": wall, "cpu_s": cpu, "priced": attrs["evaluated"], "pruned": attrs["pruned"], "space": space,
            "priced_per_s": attrs["evaluated"] / wall, "space_per_s": space / wall}


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its finished children (a search's worker processes)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def peer_python(args) -> str | None:
    """An interpreter with llm-analysis: the one named, the benchmark's venv, or a new venv (pip)."""
    if args.peer_python:
        return args.peer_python
    python = PEER_VENV / "bin" / "python"
    if not python.exists() and not args.no_install:
        print(f"creating {PEER_VENV.relative_to(ROOT)} with {PEER_PACKAGE} (once) ...", flush=True)
        made = subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], capture_output=True)
        if made.returncode == 0:
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", PEER_PACKAGE], capture_output=True)
    if python.exists() and subprocess.run([str(python), "-c", "import llm_analysis"], capture_output=True).returncode == 0:
        return str(python)
    return None


def peer_numbers(python: str, rows, repeat: int, seconds: float) -> dict | None:
    keys = ("name", "layers", "heads", "hidden", "vocab", "seq", "ffn_hidden", "tp", "pp", "dp", "micro_batch",
            "global_batch")
    plain = [{k: (r[k] if k == "name" else int(r[k])) for k in keys} for r in rows]
    out = subprocess.run([python, "-c", PEER_PROBE, json.dumps(plain), str(seconds), str(repeat)],
                         capture_output=True, text=True, cwd=ROOT)
    if out.returncode:
        print(f"llm-analysis probe failed: {out.stderr.strip().splitlines()[-1:]}")
        return None
    calls = medians(json.loads(out.stdout.strip().splitlines()[-1]))
    return {"import": median_import(python, "llm_analysis.analysis", ("numpy",), repeat), "predict": calls}


def table(ours: dict, peer: dict | None) -> list[str]:
    def ratio(a, b, higher_better=True):
        if b is None or a is None:
            return "-"
        return f"{a / b:.1f}x" if higher_better else f"{b / a:.1f}x"

    p = peer or {}
    calls = p.get("predict", (None, None))  # (per wall second, per CPU second)
    lines = [f"{'':60} {'perfmodel':>14} {'llm-analysis':>14} {'perfmodel faster by':>20}"]
    rows = [
        ("import, s (fresh process, beyond numpy+pandas)", ours["import"], p.get("import"), False, "{:.3f}"),
        ("predict/s, 10 SC21 configs repeated", ours["predict"]["repeated"][0], calls[0], True, "{:,.0f}"),
        ("  per CPU second of the process", ours["predict"]["repeated"][1], calls[1], True, "{:,.0f}"),
        ("predict/s, every cache emptied first", ours["predict"]["cold"][0], calls[0], True, "{:,.0f}"),
        ("  per CPU second of the process", ours["predict"]["cold"][1], calls[1], True, "{:,.0f}"),
        ("predict/s, each configuration once (model and cluster warm)", ours["predict"]["distinct"][0], calls[0],
         True, "{:,.0f}"),
        ("  per CPU second of the process", ours["predict"]["distinct"][1], calls[1], True, "{:,.0f}"),
        ("search configs/s priced, 1 process", ours["search"][1]["priced_per_s"], calls[0], True, "{:,.0f}"),
        ("search configs/s whole space, 1 process", ours["search"][1]["space_per_s"], calls[0], True, "{:,.0f}"),
        ("search configs/s priced, 2 processes", ours["search"][2]["priced_per_s"], calls[0], True, "{:,.0f}"),
    ]
    for name, a, b, higher, fmt in rows:
        shown_b = fmt.format(b) if b is not None else "n/a"
        lines.append(f"{name:60} {fmt.format(a):>14} {shown_b:>14} {ratio(a, b, higher):>20}")
    return lines


def search_only(repeat: int, warm_up: bool) -> int:
    """The search case alone in one process (``perfmodel_search``), printed with the machine's load."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    s = perfmodel_search(repeat, 1, warm_up)
    print(f"{os.cpu_count()} CPU cores, load average {load:.1f}; medians of {repeat} runs, caches emptied before each")
    print(f"search case: {SEARCH_CASE['model']} on {SEARCH_CASE['nodes'] * 8:,} H100: {s['priced']:,} priced and "
          f"{s['pruned']:,} pruned of {s['space']:,} enumerated; {s['wall_s']:.3f} s wall, {s['cpu_s']:.3f} CPU s; "
          f"{s['space_per_s'] / 1e6:.1f} M enumerated configurations per second")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per number; the median is printed (>= 5)")
    parser.add_argument("--peer-python", help="a python with llm-analysis installed (default: benchmarks/.peer-venv)")
    parser.add_argument("--no-install", action="store_true", help="do not create the llm-analysis venv")
    parser.add_argument("--smoke", action="store_true", help="2 repeats, short timings, no install (CI)")
    parser.add_argument("--search-only", action="store_true",
                        help="only the search case, one process: wall and CPU seconds, counts (for profiling)")
    args = parser.parse_args(argv)
    if args.search_only:
        return search_only(1 if args.smoke else max(5, args.repeat), not args.smoke)
    repeat = 2 if args.smoke else max(5, args.repeat)
    seconds = 0.1 if args.smoke else 1.0
    args.no_install = args.no_install or args.smoke
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{os.cpu_count()} CPU cores, load average {load:.1f}; medians of {repeat} runs\n", flush=True)
    rows = megatron_rows()
    ours = {"import": median_import(sys.executable, "perfmodel", ("numpy", "pandas"), repeat),
            "predict": perfmodel_predict(rows, repeat, seconds, args.smoke),
            "search": {w: perfmodel_search(1 if args.smoke else repeat, w, not args.smoke) for w in (1, 2)}}
    python = peer_python(args)
    peer = peer_numbers(python, rows, repeat, seconds) if python else None
    if peer is None:
        print("llm-analysis not available: perfmodel's numbers alone\n")
    s = ours["search"][1]
    print(f"search case: {SEARCH_CASE['model']} on {SEARCH_CASE['nodes'] * 8:,} H100, global batch "
          f"{SEARCH_CASE['global_batch']:,}: {s['priced']:,} configurations priced and {s['pruned']:,} pruned of "
          f"{s['space']:,} enumerated, "
          f"{s['wall_s']:.2f} s (1 process), {ours['search'][2]['wall_s']:.2f} s (2 processes); CPU seconds "
          f"{s['cpu_s']:.2f} (1 process), {ours['search'][2]['cpu_s']:.2f} (2 processes, all of them)\n")
    print("\n".join(table(ours, peer)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
