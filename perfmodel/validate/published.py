"""The published large training runs bundled in ``perfmodel/data/published_runs.csv``, as cases to predict.

    from perfmodel.validate.published import read_published
    cases = read_published()          # one Case per row, metric step_time_s

Each row names its source (``perfmodel/data/published_runs.md``). A row that gives
TFLOP/s per GPU instead of an iteration time is turned back into a step time with
the FLOP formula its authors used (``flops_formula``), so the measured quantity is
always a step time.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path

from perfmodel.core.checks import read_text_file
from perfmodel.core.errors import InvalidInputError
from perfmodel.validate.measured import Case
from perfmodel.hardware import cluster, load_link
from perfmodel.parallel.strategy import Strategy
from perfmodel.workload.model import transformer
from perfmodel.workload.presets import preset

PUBLISHED_CSV = Path(__file__).resolve().parent.parent / "data" / "published_runs.csv"


def _yes(text: str) -> bool:
    return text.strip().lower() == "true"


PRESET_COLUMNS = ("layers", "hidden", "heads", "seq", "vocab")  # what a row naming a preset must agree with


def model_of(r: dict):
    """The transformer of one published row: its columns, or the preset it names (``preset``), which its
    layer, width, head, sequence and vocabulary columns must match."""
    if r.get("preset"):
        m = preset(r["preset"])
        wrong = [c for c in PRESET_COLUMNS if int(r[c]) != getattr(m, c)]
        if wrong:
            raise InvalidInputError(f"row {r['name']!r} names preset {r['preset']!r} but its {', '.join(wrong)} "
                                    f"differ from the preset's ({', '.join(str(getattr(m, c)) for c in wrong)})")
        return m
    return transformer(int(r["layers"]), int(r["hidden"]), int(r["heads"]), int(r["seq"]), int(r["vocab"]),
                       kv_heads=int(r["kv_heads"]), ffn_hidden=int(r["ffn_hidden"]), activation=r["activation"],
                       norm=r["norm"], bias=_yes(r["bias"]), tied_embeddings=_yes(r["tied"]),
                       position=r["position"], name=r["name"], qk_norm=r.get("qk_norm") or "none",
                       experts=int(r.get("experts") or 1), experts_per_token=int(r.get("experts_per_token") or 1))


def cluster_of(r: dict):
    """The cluster of one published row (its NICs where the site's differ from the preset's)."""
    c = cluster(r["node"], nodes=int(r["nodes"]))
    if r["nic"]:  # a site whose NICs differ from the preset's
        node = dataclasses.replace(c.node, nic=load_link(r["nic"]), nics_per_node=int(r["nics_per_node"]))
        c = dataclasses.replace(c, node=node)
    return c


def strategy_of(r: dict):
    """The strategy of one published row."""
    stages = tuple(int(x) for x in r["stage_layers"].split()) if r["stage_layers"] else None
    return Strategy(dp=int(r["dp"]), tp=int(r["tp"]), pp=int(r["pp"]), micro_batch=int(r["micro_batch"]),
                    global_batch=int(r["global_batch"]), zero=int(r["zero"]), fsdp=r["fsdp"] or None,
                    recompute=r["recompute"], precision=r["precision"], schedule=r["schedule"],
                    virtual_stages=int(r["virtual_stages"]), sequence_parallel=_yes(r["sequence_parallel"]),
                    stage_layers=stages, framework=r["framework"], attention=r["attention"],
                    tp_overlap=_yes(r["tp_overlap"]), dp_overlap=_yes(r["dp_overlap"]), cp=int(r["cp"] or 1),
                    grad_reduce_fp32=_yes(r["grad_reduce_fp32"]) if r.get("grad_reduce_fp32") else None,
                    cp_comm=r.get("cp_comm") or None, tp_comm_overlap=r.get("tp_comm_overlap") or None,
                    optimizer_states=r.get("optimizer_states") or None, fp8_params=_yes(r.get("fp8_params") or "false"),
                    norm_kernels=r.get("norm_kernels") or "fused", ep=int(r.get("ep") or 1),
                    etp=int(r["etp"]) if r.get("etp") else None,
                    grouped_experts=_yes(r["grouped_experts"]) if r.get("grouped_experts") else None)


def formula_flops(r: dict, m) -> float:
    """FLOPs of one step by the row's published convention."""
    b, s, n_layers, h, v = int(r["global_batch"]), m.seq, m.layers, m.hidden, m.vocab
    kind = r["flops_formula"]
    if kind == "narayanan":      # Narayanan et al. 2021 eq. 3: full recompute, 4 passes
        return 96 * b * s * n_layers * h * h * (1 + s / (6 * h) + v / (16 * n_layers * h))
    if kind == "korthikanti-model":  # Korthikanti et al. 2022 §6: model FLOPs (MFU), 3 passes
        return 72 * b * s * n_layers * h * h * (1 + s / (6 * h) + v / (12 * n_layers * h))
    if kind == "model-6n":       # 6 × GEMM parameters a token uses (LM head included) + attention 12·l·s·h per token
        mlp = m.experts_per_token * m.mlp_weights(m.ffn_hidden) + m.mlp_weights(m.shared_ffn)  # MoE: its experts
        mlp = m.moe_share * mlp + (1 - m.moe_share) * m.mlp_weights(m.dense_ffn)  # and its dense blocks' MLP
        gemm = n_layers * (m.attention_in_weights + m.attn_width * h + mlp) + v * h
        return 6 * b * s * gemm + 12 * n_layers * s * h * b * s
    raise InvalidInputError(f"'flops_formula' of {r['name']!r} must be one of narayanan, korthikanti-model, "
                            f"model-6n: got {kind!r}")


def read_published(path: str | Path = PUBLISHED_CSV) -> list[Case]:
    """Every row of the published-runs table as a Case measuring ``step_time_s``."""
    text = read_text_file(Path(path), field="published", expect="the published-runs CSV")
    cases = []
    for line, r in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=2):
        m, c, s = model_of(r), cluster_of(r), strategy_of(r)
        step = (float(r["published_step_s"]) if r["published_step_s"]
                else formula_flops(r, m) / (float(r["published_tflops_per_gpu"]) * 1e12 * c.n_gpus))
        cases.append(Case(line=line, label=r["name"], model=m, cluster=c, strategy=s, metric="step_time_s",
                          measured=step, source=f"published_runs.csv ({r['certainty']}): {r['source']}"))
    return cases


STACK_RUNS_CSV = PUBLISHED_CSV.parent / "published_stack_runs.csv"


def read_published_stacks(path: str | Path = STACK_RUNS_CSV) -> list[Case]:
    """The published runs of other software stacks (torchtitan ...) as Cases measuring ``step_time_s``.

    A row gives tokens per second per GPU as torchtitan logs it (local batch x seq / (step x cp)), so
    the step is micro_batch x seq / (cp x rate); its memory (``published_memory_gib``, what the stack
    logs: max reserved; blank where the source gives none) is kept as ``extra["reserved_memory_bytes"]``.
    ``attention`` names the SDPA backend the run's torch picked (blank: the stack's default, under context
    parallelism its ring's); ``fc_type``, MPT's linears under Composer (blank: None).
    """
    text = read_text_file(Path(path), field="published", expect="the published stack-runs CSV")
    cases = []
    for line, r in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=2):
        m = dataclasses.replace(preset(r["preset"]), seq=int(r["seq"]), name=r["name"])
        cp, mb = int(r["cp"]), int(r["micro_batch"])
        s = Strategy(dp=int(r["dp"]), cp=cp, micro_batch=mb, framework=r["framework"], recompute=r["recompute"],
                     compile=_yes(r["compile"]), loss=r["loss"], precision=r["precision"],
                     attention=r["attention"] or None, norm_kernels=r.get("norm_kernels") or "fused",
                     float8_recipe=r.get("float8_recipe") or None, fp8_params=_yes(r.get("fp8_params") or "false"),
                     fc_type=r.get("fc_type") or None)
        step = mb * m.seq / (cp * float(r["published_tokens_per_s_per_gpu"]))
        memory = r["published_memory_gib"]  # blank where the source gives none
        cases.append(Case(line=line, label=r["name"], model=m, cluster=cluster(r["node"], nodes=int(r["nodes"])),
                          strategy=s, metric="step_time_s", measured=step,
                          source=f"published_stack_runs.csv ({r['certainty']}, {r['date']}): {r['source']}",
                          extra={"reserved_memory_bytes": float(memory) * 2**30} if memory else {}))
    return cases


CHECK_RUNS_CSV = PUBLISHED_CSV.parent / "published_check_runs.csv"


def read_published_checks(path: str | Path = CHECK_RUNS_CSV) -> list[Case]:
    """The published check-set runs (``published_check_runs.csv``: several stacks and GPUs, columns as
    ``published_runs.csv`` plus ``gpus_per_node``, ``compile`` and ``published_tokens_per_s_per_gpu``) as Cases measuring
    ``step_time_s``. A row gives its iteration time, or tokens per second per GPU (then the step is
    micro_batch x seq / (cp x rate), no gradient accumulation)."""
    text = read_text_file(Path(path), field="published", expect="the published check-runs CSV")
    cases = []
    for line, r in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=2):
        m, c = model_of(r), cluster_of(r)
        if r["gpus_per_node"]:  # a site whose nodes hold fewer GPUs than the preset's
            c = dataclasses.replace(c, node=dataclasses.replace(c.node, gpus_per_node=int(r["gpus_per_node"])))
        s = dataclasses.replace(strategy_of(r), compile=_yes(r["compile"]))
        if r["published_step_s"]:
            step = float(r["published_step_s"])
        elif r["published_tokens_per_s_per_gpu"]:
            step = s.micro_batch * m.seq / (s.cp * float(r["published_tokens_per_s_per_gpu"]))
        else:
            raise InvalidInputError(f"row {line} ({r['name']!r}) of {Path(path).name} needs 'published_step_s' or "
                                    f"'published_tokens_per_s_per_gpu': both are blank")
        cases.append(Case(line=line, label=r["name"], model=m, cluster=c, strategy=s, metric="step_time_s",
                          measured=step, source=f"published_check_runs.csv ({r['certainty']}, {r['date']}): "
                                                f"{r['source']}"))
    return cases
