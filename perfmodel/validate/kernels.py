"""Bundled GPU profiles against published kernel microbenchmarks and published runs.

    python -m perfmodel.validate.kernels            # prints three tables

1. attention: each profile's ``sdpa:fa1``/``fa2``/``fa3``/``cudnn``/``triton`` classes against the digitised rows
   (fitted: the error is in-sample) and the Azure AI-benchmarking-guide FlashAttention-2
   point (not fitted: a check);
2. GEMM: each profile against the Maximum Achievable Matmul FLOPS rows and FBGEMM's 500 W H100 rows
   (``gemm_checks_published.csv``; not fitted: a check), and the Blackwell profiles' bf16 rate over the H100's
   against XLA's sm_100 / sm_90 matmul tables (``gemm_generations_published.csv``; a check);
3. float8 linears: torchao's published LayerNorm -> Linear -> Sigmoid speedups over bfloat16 against the profile's
   pricing with its fitted ``fp8_linear:<recipe>`` (fitted: in-sample; ``cv_mape`` holds the held-out error);
4. runs: TorchTitan (Liang et al. 2024, arXiv 2410.06511) Tables 1-2, Llama 3.1 8B on 8 H100 (96 GB
   HBM2e at 500 W: ``grand-teton-h100``), tokens/s per GPU predicted against published (not fitted: a check).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

import perfmodel as pm
from perfmodel.core.entry import no_options, run_command
from perfmodel.costs.compute import kernel_time
from perfmodel.fit.published_float8 import block_seconds
from perfmodel.profiles.published import (GENERATION_GPUS, attention_flops, attention_pass_flops, attention_table,
                                          float8_linear_table, gemm_check_table, generation_table)
from perfmodel.profiles.mamf import mamf_calibrates
from perfmodel.profiles.reference import microbench_rows
from perfmodel.validate.published import read_published_stacks
from perfmodel.workload.ops import Kernel

def sdpa_tflops(profile, batch, heads, seq, head_dim, causal, which="fwd", kernel="fa2") -> float:
    """TFLOP/s of ``profile``'s attention class (``kernel``: "fa2" for ``attention="flash2"``, "fa3" for
    "flash3", None for the profile's own), FLOPs counted as the FlashAttention papers do; ``which``
    "fwd", "bwd" or "fwdbwd" (3.5x the forward's FLOPs over both passes' time)."""
    size = {"batch": float(batch), "heads": float(heads), "kv_heads": float(heads), "seq": float(seq),
            "head_dim": float(head_dim), "causal": float(causal)}
    seconds = 0.0
    for phase in (("fwd", "bwd") if which == "fwdbwd" else (which,)):
        variant = f"{kernel}.{phase}" if kernel else phase
        gpu, _ = kernel_time(profile, Kernel("attn", "sdpa", phase, size, 1, 0.0, variant, "bf16"))
        seconds += float(gpu)
    return float(attention_pass_flops(batch, heads, seq, head_dim, causal, which) / seconds / 1e12)


def attention_errors(gpu: str = "h100-sxm5-80gb", kernel: str = "fa2", priced_as: str | None = "") -> pd.DataFrame:
    """Predicted vs published TFLOP/s of every digitised ``kernel`` row of ``gpu`` (fitted: in-sample),
    priced by the profile's ``sdpa:<kernel>`` classes, or by ``priced_as`` (None: the profile's own)."""
    profile = pm.load_profile(gpu)
    t = attention_table()
    t = t[(t.gpu == gpu) & (t.kernel == kernel)]
    by = kernel if priced_as == "" else priced_as
    pred = [sdpa_tflops(profile, r.batch, r.heads, r.seq, r.head_dim, r.causal, r["pass"], by)
            for _, r in t.iterrows()]
    return t.assign(predicted=pred, error=np.asarray(pred) / t.tflops.to_numpy() - 1)


def azure_flash_check(gpu: str) -> tuple[float, float] | None:
    """(predicted, published) fwd+bwd TFLOP/s at the Azure guide's FlashAttention-2 point (batch 2,
    seq 8192; taken as head_dim 128, 16 heads, not causal, as flash-attn's benchmark script runs)."""
    t = microbench_rows()
    t = t[(t.catalog == gpu) & t.benchmark.str.startswith("FlashAttention-2") & (t.param == "flash")]
    if t.empty:
        return None
    p = pm.load_profile(gpu)
    fwd, bwd = (attention_flops(2, 16, 8192, 128, False, w) / sdpa_tflops(p, 2, 16, 8192, 128, False, w, "fa2")
                for w in ("fwd", "bwd"))
    total = attention_flops(2, 16, 8192, 128, False, "fwd") * (1 + 2.5)
    return float(total / (fwd + bwd)), float(t.value.iloc[0])


def _gemm_tflops(gpu: str, dtype: str, m: float, n: float, k: float) -> float:
    kernel = Kernel("mm", "gemm", "fwd", {"m": m, "n": n, "k": k}, 1, 2.0 * m * n * k, "fwd", dtype)
    return 2.0 * m * n * k / float(kernel_time(pm.load_profile(gpu), kernel)[0]) / 1e12


def gemm_checks() -> pd.DataFrame:
    """Predicted vs published TFLOP/s at each Maximum Achievable Matmul FLOPS shape and each other published
    GEMM rate that checks a profile (``gemm_check_table``: FBGEMM's on the 500 W H100)."""
    rows = []
    for _, r in gemm_check_table().iterrows():
        pred = _gemm_tflops(r.gpu, r["dtype"], float(r.m), float(r.n), float(r.k))
        rows.append({"gpu": r.gpu, "dtype": r["dtype"], "shape": f"{r.m}x{r.n}x{r.k}", "published": r.tflops,
                     "predicted": pred, "error": pred / r.tflops - 1,
                     "role": "calibrates" if mamf_calibrates(r.gpu, r["dtype"]) else "check"})
    return pd.DataFrame(rows)


def generation_checks(newer: str = "sm_100", older: str = "sm_90") -> pd.DataFrame:
    """Each profile of the ``newer`` generation over the ``older``'s, GEMM rate at XLA's shapes, against the ratio
    of XLA's two tables there (one generator on both GPUs; a batched row priced as batch x m rows; check)."""
    t = generation_table()
    base_gpu = GENERATION_GPUS[older][0]
    rows = []
    for (dtype, b, m, n, k), sub in t.groupby(["dtype", "batch", "m", "n", "k"]):
        rates = dict(zip(sub.key, sub.tflops))
        if newer not in rates or older not in rates:
            continue
        base = _gemm_tflops(base_gpu, dtype, b * m, n, k)
        for gpu in GENERATION_GPUS[newer]:
            pred = _gemm_tflops(gpu, dtype, b * m, n, k) / base
            published = rates[newer] / rates[older]
            rows.append({"gpu": gpu, "over": base_gpu, "dtype": dtype, "shape": f"{b}x{m}x{n}x{k}",
                         "published": published, "predicted": pred, "error": pred / published - 1})
    return pd.DataFrame(rows)


def float8_linear_checks(gpu: str = "h100-sxm5-80gb") -> pd.DataFrame:
    """Published against predicted speedup of each float8 linear row of ``gpu`` (perfmodel/fit/published_float8.py)."""
    p = pm.load_profile(gpu)
    t = float8_linear_table()
    t = t[t.gpu == gpu]
    pred = [block_seconds(p, r.m, r.k, r.n, None) / block_seconds(p, r.m, r.k, r.n, r.recipe) for r in t.itertuples()]
    return t[["recipe", "m", "k", "n", "speedup"]].assign(predicted=pred, error=np.asarray(pred) / t.speedup - 1)


TORCHTITAN_NODE = "grand-teton-h100"  # the paper's hosts (pytorch/torchtitan docs/performance.md)


def torchtitan_checks(attention: str = "flash2", node: str = TORCHTITAN_NODE) -> pd.DataFrame:
    """Predicted vs published tokens/s per GPU of the TorchTitan paper's Llama 3.1 8B rows. The paper's
    torchtitan (October 2024) let context-parallel SDPA use only the FLASH and EFFICIENT backends
    (torchtitan/distributed/utils.py before commit 5cfe514b6, 2025-03-20), hence FlashAttention-2."""
    rows = []
    for case in (c for c in read_published_stacks() if "Liang et al. 2024" in c.source):  # the paper's rows
        s = dataclasses.replace(case.strategy, attention=attention)
        p = pm.predict(case.model, pm.cluster(node), s)
        tps = s.micro_batch * case.model.seq / (s.cp * case.measured)
        pred = p.tokens_per_second / pm.cluster(node).n_gpus
        options = {"recompute": s.recompute, "compile": s.compile, "precision": s.precision}
        rows.append({"seq": case.model.seq, "cp": s.cp, "options": ",".join(f"{k}={v}" for k, v in options.items()),
                     "published": tps, "predicted": pred, "error": pred / tps - 1})
    return pd.DataFrame(rows)


def main(argv=None) -> None:
    no_options(__doc__, argv)
    pd.set_option("display.width", 160)
    for gpu, kernel in (("h100-sxm5-80gb", "fa2"), ("h100-sxm5-80gb", "fa3"), ("h100-sxm5-80gb", "cudnn"),
                        ("a100-sxm4-80gb", "fa2"), ("a100-sxm4-80gb", "fa1"), ("h100-sxm5-80gb", "fa1"),
                        ("a100-sxm4-80gb", "triton")):
        att = attention_errors(gpu, kernel)
        print(f"attention, {gpu} {kernel} rows (fitted):")
        print(att[["pass", "head_dim", "causal", "seq", "tflops", "predicted", "error"]].round(3)
              .to_string(index=False))
        print(f"median |error| {att.error.abs().median():.1%}, max {att.error.abs().max():.1%}\n")
    own = attention_errors("h100-sxm5-80gb", "cudnn", priced_as=None)
    print(f"the profile's own attention (attention='flash': the H200's measured SDPA, torch 2.11) against the "
          f"published cuDNN rows (check): median error {own.error.median():+.1%}, |error| "
          f"{own.error.abs().median():.1%}")
    for gpu in ("a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb"):
        hit = azure_flash_check(gpu)
        if hit:
            print(f"{gpu}: Azure FlashAttention-2 fwd+bwd {hit[1]:.0f} TFLOP/s, predicted {hit[0]:.0f} "
                  f"({hit[0] / hit[1] - 1:+.1%}, check)")
    print("\nGEMM at the Maximum Achievable Matmul FLOPS shapes and FBGEMM's 500 W H100 shapes (check):")
    print(gemm_checks().round(3).to_string(index=False))
    print("\nbf16 GEMM rate of sm_100 over sm_90 at XLA's shapes (its matmul table; check):")
    print(generation_checks().round(3).to_string(index=False))
    f8 = float8_linear_checks()
    print("\ntorchao float8 linear speedups over bf16, H100 (fitted: fp8_linear:<recipe>):")
    print(f8[f8.recipe == "tensorwise"].round(3).to_string(index=False))
    rw = f8[f8.recipe == "rowwise"]
    llama = rw[rw.m.isin([8192, 16384]) & rw.k.isin([4096, 16384]) & rw.n.isin([1024, 4096, 16384])]
    print(f"rowwise: {len(rw)} cells, median |error| {rw.error.abs().median():.1%} (max {rw.error.abs().max():.1%}); "
          f"M 8k/16k, K 4k/16k, N 1k/4k/16k (Llama 3 8B's linears): {llama.error.abs().median():.1%}")
    print(llama.round(3).to_string(index=False))
    for attention in ("flash2", "flash"):
        tt = torchtitan_checks(attention)
        print(f"\nTorchTitan paper, Llama 3.1 8B on 8 H100 ({TORCHTITAN_NODE}), tokens/s per GPU, "
              f"attention={attention!r} (check):")
        print(tt.round(3).to_string(index=False))
        print(f"median |error| {tt.error.abs().median():.1%}")


if __name__ == "__main__":
    raise SystemExit(run_command(main))
