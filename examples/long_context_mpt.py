"""MPT-7B trained through Composer on 8 H100s: how far the sequence can grow, and what fits.

Run:
    python examples/long_context_mpt.py           # sequence 2k to 64k, bf16 and fp8, three loss/stack choices
    python examples/long_context_mpt.py --quick   # 2k and 32k, bf16 only (what the test suite runs)

MPT's trainer runs Composer's FSDP1 (``framework="composer"``: FULL_SHARD, bf16 parameters
and reductions, flash-attn 2, and MPT's fused cross-entropy, which holds 4 bytes per logit where an eager
``F.cross_entropy`` over fp32 logits holds 12; docs/stacks.md). Each row keeps one sequence per GPU and
checkpoints every block (``recompute="full"``), as MPT's pretraining configs do from 3B up, and
is priced three ways: Composer as MPT runs it, the same FSDP1 step with an eager loss (``framework="fsdp1"``,
as a Hugging Face model under accelerate would compute it), and Composer with fp8 through Transformer
Engine (Composer's ``amp_fp8`` over ``fc_type="te"`` linears, the only ones it turns fp8; every forward casts
the weights again, as no caller keeps TE's cache).
"""

from __future__ import annotations

import argparse

import pandas as pd

import perfmodel as pm
from perfmodel.explore.output import format_table

STACKS = {"composer": dict(framework="composer"), "fsdp1, eager loss": dict(framework="fsdp1"),
          "composer, fp8": dict(framework="composer", precision="fp8-mixed", fc_type="te")}
SEQS = (2048, 8192, 32768, 65536)
QUICK = {"seqs": (2048, 32768), "stacks": ("composer", "fsdp1, eager loss")}


def rows(seqs, stacks, cluster):
    """One row per (sequence, stack): step, tokens/s per GPU, MFU, peak and reserved memory, fit."""
    out = []
    for seq in seqs:
        model = pm.preset("mpt-7b", seq=seq)
        for name in stacks:
            s = pm.Strategy(dp=cluster.n_gpus, micro_batch=1, recompute="full", **STACKS[name])
            p = pm.predict(model, cluster, s)
            out.append({"label": f"{seq // 1024}k {name}", "step_time": p.step_time,
                        "tokens_per_second": p.tokens_per_second / cluster.n_gpus, "mfu": p.mfu,
                        "peak_memory": p.peak_memory, "reserved": f"{p.reserved_memory / 2**30:.1f} GiB",
                        "peak at": p.peak_moment, "fits": p.fits})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two sequence lengths, bf16 only")
    args = ap.parse_args(argv)
    seqs, stacks = (QUICK["seqs"], QUICK["stacks"]) if args.quick else (SEQS, tuple(STACKS))
    cluster = pm.cluster("dgx-h100")
    df = pd.DataFrame(rows(seqs, stacks, cluster))
    print(f"MPT-7B (mosaicml/mpt-7b: ALiBi, no biases), one sequence per GPU, every block checkpointed, on "
          f"{cluster.n_gpus} H100 ({cluster.name}); tokens/s per GPU\n")
    print(format_table(df, ("label", "step_time", "tokens_per_second", "mfu", "peak_memory", "reserved", "peak at",
                            "fits"), best_column=None))
    print("\nMFU counts model FLOPs over the peak of the precision the GEMMs run in (fp8's is twice bf16's).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
