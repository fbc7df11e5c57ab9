"""``perfmodel list``: bundled models, GPUs, nodes, profiles and the frameworks' stack records, one aligned
line each with what tells them apart (parameters, memory, measured or datasheet, a framework's defaults)."""

from __future__ import annotations

import re

from perfmodel.hardware import list_gpus, list_nodes, load_gpu, load_node
from perfmodel.profiles.origin import origin_word, profile_origin
from perfmodel.profiles.profile import list_profiles, load_profile
from perfmodel.workload.graph import GraphModel
from perfmodel.workload.hf import FAMILIES
from perfmodel.workload.presets import list_presets, preset
from perfmodel.workload.stacks import STACKS
from perfmodel.workload.stacks.composer import TAKES_FC_TYPE
from perfmodel.workload.stacks.float8 import RECIPES

# bytes per parameter of mixed-precision AdamW training state: fp32 weights, gradients and two moments,
# plus the 16-bit copy (Rajbhandari et al. 2020, ZeRO §3: 16 bytes per parameter)
TRAIN_STATE_BYTES_PER_PARAM = 16


def _table(head, rows) -> str:
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *rows])


def _count(n: float) -> str:
    shown = float(f"{n:.3g}")  # rounded first: 999,885,952 is "1B", not "1e+03M"
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if shown >= scale:
            return f"{shown / scale:.3g}{unit}"
    return f"{n:.0f}"


def _models():
    rows = []
    for name in list_presets():
        m = preset(name)
        shape = ("traced graph (CNN/ViT)" if isinstance(m, GraphModel)
                 else f"{m.layers} layers, hidden {m.hidden}, seq {m.seq}")
        state = m.params * TRAIN_STATE_BYTES_PER_PARAM / 2**30
        rows.append((name, _count(m.params), f"{state:,.1f} GiB", shape))
    return ("name", "params", "train state (16 B/param)", "shape"), rows


def _gpus():
    profiles = set(list_profiles())
    rows = []
    for name in list_gpus():
        g = load_gpu(name)
        dtype = "bf16" if "bf16" in g.peak_flops else "fp16" if "fp16" in g.peak_flops else "fp32"
        origin = origin_word(load_profile(name)) if name in profiles else "datasheet"
        rows.append((name, f"{g.mem_bytes / 2**30:.0f} GiB", f"{g.mem_bw_bytes_per_s / 1e12:.2f} TB/s",
                     f"{g.peak_flops[dtype] / 1e12:,.0f} TFLOP/s {dtype}", f"profile: {origin}"))
    return ("name", "memory", "bandwidth", "peak", "bundled profile"), rows


def _nodes():
    rows = []
    for name in list_nodes():
        n = load_node(name)
        rows.append((name, f"{n.gpus_per_node} x {n.gpu.name}", f"{n.gpu.mem_bytes / 2**30:.0f} GiB each",
                     repr(n).split(", ", 1)[1].rstrip(")")))
    return ("name", "GPUs", "memory", "links"), rows


def _profiles():
    rows = []
    for name in list_profiles():
        p = load_profile(name)
        rows.append((name, p.gpu, origin_word(p), profile_origin(p).split(": ", 1)[-1]))
    return ("name", "gpu", "origin", "from"), rows


def _code(source: str) -> str:
    """The code and version a stack record follows: the first two words of its source."""
    words = [w for w in re.split(r"[ ,():]+", source) if w]
    return " ".join(words[:2])


def _frameworks():
    """Each ``Strategy.framework`` with the defaults it takes when the user names none (workload/stacks)."""
    rows = []
    for name, st in STACKS.items():
        fp8 = f"{st.float8}: {', '.join(RECIPES[st.float8])}" if st.float8 else "-"
        fp8 += " (fc_type='te' linears)" if name in TAKES_FC_TYPE else ""  # Composer's amp_fp8 (stacks/composer.py)
        rows.append((name, st.sharding, st.default_fsdp or "-", st.default_recompute, st.default_attention,
                     st.default_loss, fp8, "yes" if st.compiles else "-", _code(st.source)))
    return ("framework", "sharding", "fsdp", "recompute", "attention", "loss", "float8 (recipes)", "compile",
            "code it follows (docs/stacks.md)"), rows


LISTINGS = {"models": _models, "gpus": _gpus, "nodes": _nodes, "profiles": _profiles, "frameworks": _frameworks}
# a line under a listing: what else the option it lists takes
FOOTNOTES = {"models": f"--model also takes a Hugging Face config.json (model_type {', '.join(sorted(FAMILIES))}), "
                       "a Hub id with the 'hf' extra, or a model TOML (docs/workloads.md)"}


def listing(what: str) -> str:
    """The aligned table of ``what``: one of ``LISTINGS``."""
    head, rows = LISTINGS[what]()
    return _table(head, rows) + (f"\n\n{FOOTNOTES[what]}" if what in FOOTNOTES else "")
