"""The validation rows the prediction intervals are calibrated on, each predicted and scored.

    rows = scored_rows()   # every row: regime, configuration, run source, ln(measured / predicted) step and memory

Sources (``SOURCE_FILES``): the H200 development steps and validation runs, the published large runs,
the published runs of other stacks, the published check set, the committed CPU steps
(``data/cpu-interference-2026-12-01``, on their host profile) and ``examples/measured_sample.csv``
(rows another source already gives are dropped). docs/accuracy.md.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import statistics
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from perfmodel import interval as iv
from perfmodel.hardware import cluster
from perfmodel.parallel.paths import priced_paths
from perfmodel.parallel.strategy import Strategy
from perfmodel.predict import default_profile, predict
from perfmodel.profiles.profile import load_profile
from perfmodel.validate import cnn, cnn_ddp, pytorch_cifar, tf_cifar, tf_ps
from perfmodel.validate.measured import Case, read_measured
from perfmodel.costs.memory import CUDA_CONTEXT_BYTES  # what a reserved reading adds beyond the allocator
from perfmodel.validate.published import (read_published, read_published_checks,
                                          read_published_stacks)
from perfmodel.workload.model import transformer

DATA = Path(__file__).resolve().parent.parent / "data"
TRAIN_DEV = DATA / "h200-2026-11-29" / "train_dev.jsonl"
GPU_RUNS = DATA / "h200-calibration-2026-11-30" / "gpu_runs.csv"
CPU_RUNS = DATA / "cpu-interference-2026-12-01"  # train.csv: each job's steps alone, beside co-located ones
SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "measured_sample.csv"  # in the repository only
SOURCE_FILES = {"published cnn": "perfmodel/data/published_cnn_runs.csv (one GPU, PyTorch)",
                "cnn ddp": "perfmodel/data/published_cnn_ddp_runs.csv (V100, PyTorch DDP, 1-32 GPUs)",
                "tensorflow ps": "perfmodel/data/published_tf_ps_runs.csv (K80, TensorFlow 1.x, 1-64 GPUs)",
                "tensorflow cifar": "perfmodel/data/published_tf_cifar_runs.csv (K80, P100, TensorFlow 1.2, one GPU)",
                "pytorch cifar": "perfmodel/data/published_pytorch_cifar_runs.csv (K80, P100, PyTorch 0.1.12, one GPU)",
                "h200 train_dev": "perfmodel/data/h200-2026-11-29/train_dev.jsonl",
                "h200 gpu_runs": "perfmodel/data/h200-calibration-2026-11-30/gpu_runs.csv",
                "published": "perfmodel/data/published_runs.csv (sources: published_runs.md)",
                "published stacks": "perfmodel/data/published_stack_runs.csv",
                "published checks": "perfmodel/data/published_check_runs.csv (sources: published_runs.md)",
                "cpu steps": "perfmodel/data/cpu-interference-2026-12-01/train.csv (jobs.json, host-profile.json)",
                "measured_sample": "examples/measured_sample.csv"}


@dataclass(frozen=True)
class Scored:
    """One validation row predicted: what picks its regime, and its score."""

    source: str
    group: str
    label: str
    kind: str
    stack: str
    hidden: int
    seq: int
    profile_gpu: str
    cluster_gpu: str
    share: float
    host_share: float
    log_ratio: float  # ln(measured / predicted step)
    framework: str = "pytorch"
    step_s: float = 1.0  # predicted step
    memory_log_ratio: float | None = None  # ln(measured / predicted peak memory), where measured
    memory_reading: str = "allocated"  # what the memory reading is (``perfmodel.interval.MEMORY_READINGS``)
    n_gpus: int = 1
    power_capped: bool = False  # priced on a power-capped part's profile (profiles/power_cap.py)
    run_source: str = ""  # the run source it comes from (:func:`run_source`): held-back splits keep it whole
    traced: bool = False  # a traced graph's step (a CNN): a regime ``cnn/<framework>`` (``interval.traced_regime``)
    experts: int = 1  # experts per MoE layer of its model (1: dense)
    paths: tuple = ()  # its pricing paths (``parallel/paths.py``), as sorted (name, value) pairs

    @cached_property
    def features(self) -> tuple:
        """Its difficulty features (``perfmodel.interval.DIFFICULTY``), known before measuring."""
        return tuple(iv.difficulty_features(self.share, self.n_gpus, self.power_capped).tolist())

    @property
    def memory_regime(self) -> str:
        """The regime predict looks up (:func:`perfmodel.interval.memory_log_interval`)."""
        return iv.memory_regime(self.framework, self.n_gpus)

    @property
    def memory_cell(self) -> str:
        """The memory regime its row calibrates: a reserved reading also prices the allocator (``/reserved``)."""
        return self.memory_regime + ("/reserved" if self.memory_reading == "reserved" else "")

    @property
    def cell(self) -> str:
        return iv.traced_regime(self.framework) if self.traced else iv.regime_name(self.kind, self.share, self.framework,
                                                                                    self.step_s)


def read_train_dev(path: Path = TRAIN_DEV) -> list[Case]:
    """The H200 development steps (GPT-style, untied head, eager bf16 autocast, fused AdamW, one GPU)."""
    cases = []
    for line, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        r = json.loads(text)
        m = transformer(r["layers"], r["hidden"], r["heads"], r["seq"], r["vocab"], tied_embeddings=False,
                        name=r["model"])
        s = Strategy(micro_batch=r["batch"], recompute="full" if r["checkpoint"] else "none")
        cases.append(Case(line=line, label=r["model"], model=m, cluster=cluster("h200"), strategy=s,
                          metric="step_time_s", measured=float(r["step_sec"]), source=f"train_dev.jsonl line {line}",
                          peak_memory_bytes=float(r["peak_mem_bytes"])))
    return cases


def read_cpu_steps(folder: Path = CPU_RUNS) -> list[Case]:
    """The one-thread CPU training jobs of ``folder`` (``jobs.json``), each predicted on the folder's host profile:
    the median over its runs alone (``train.csv``) of the CPU seconds per step. That is its step on a core of its
    own; its wall time alone is 2.3-2.8x longer, waiting behind the other processes the 2-core host ran then."""
    jobs = json.loads((folder / "jobs.json").read_text(encoding="utf-8"))
    alone = {}
    for row in csv.DictReader(io.StringIO((folder / "train.csv").read_text(encoding="utf-8"))):
        alone.setdefault(row["job"], []).append(float(row["cpu_alone_s"]))
    host, profile = cluster(str(folder / "cpu-host.toml")), str(folder / "host-profile.json")
    cases = []
    for line, (name, spec) in enumerate(sorted(jobs.items()), start=1):
        fields = {k: v for k, v in spec.items() if k not in ("micro_batch", "precision", "threads")}
        s = Strategy(micro_batch=spec["micro_batch"], precision=spec["precision"])
        cases.append(Case(line=line, label=f"cpu-{name}", model=transformer(**fields, name=name), cluster=host,
                          strategy=s, metric="step_time_s", measured=statistics.median(alone[name]), profile=profile,
                          source=f"train.csv job {name} ({len(alone[name])} runs alone)"))
    return cases


def validation_cases() -> list[tuple[str, Case]]:
    """(source, case) of every validation row; a row another source already holds is dropped."""
    found = [("h200 train_dev", c) for c in read_train_dev()]
    found += [("h200 gpu_runs", c) for c in read_measured(GPU_RUNS)[0]]
    found += [("published", c) for c in read_published()]
    found += [("published stacks", c) for c in read_published_stacks()]
    found += [("published checks", c) for c in read_published_checks()]
    found += [("cpu steps", c) for c in read_cpu_steps()]
    seen = {(c.label, round(math.log(c.measured), 3)) for _, c in found}
    if SAMPLE.is_file():
        for c in read_measured(SAMPLE)[0]:
            if c.metric == "step_time_s" and (c.label, round(math.log(c.measured), 3)) not in seen:
                found.append(("measured_sample", c))
    return found


def score(source: str, case: Case) -> Scored:
    """Predict one case and score it."""
    p = predict(case.model, case.cluster, case.strategy, profile=case.profile)
    prof = load_profile(case.profile) if case.profile else default_profile(case.cluster)
    share, host = iv.shares(p.step_time, p.breakdown)
    s = case.strategy
    return Scored(source=source, group=_configuration(case), label=case.label,
                  kind=iv.profile_kind(prof), stack=iv.stack_key(s.framework, s.attention, s.precision),
                  hidden=int(case.model.hidden), seq=int(case.model.seq), profile_gpu=prof.gpu,
                  cluster_gpu=case.cluster.gpu.name, share=float(share), host_share=float(host),
                  log_ratio=math.log(case.measured / p.step_time), framework=s.framework, step_s=p.step_time,
                  memory_log_ratio=_memory_log_ratio(case, p), n_gpus=case.cluster.n_gpus,
                  memory_reading="allocated" if case.peak_memory_bytes else "reserved",
                  power_capped=iv.power_capped(prof), run_source=run_source(source, case),
                  experts=int(getattr(case.model, "experts", 1)), paths=tuple(sorted(priced_paths(s, case.model, prof.gpu).items())))


OWN_RUNS = ("h200 train_dev", "h200 gpu_runs", "cpu steps", "measured_sample")


def run_source(source: str, case: Case) -> str:
    """The run source of a row: the publication table (or report) of a published row, whose rows share the
    authors' software, setup and way of measuring, so near-duplicates never sit on both sides of a split;
    for the project's own runs (one machine, the profile's own) the configuration, each measured apart."""
    if source in OWN_RUNS:
        return f"{source}|{_configuration(case)}"
    cited = re.split(r"[;:] ", case.source.split("): ", 1)[-1])[0]
    return f"{source}|{re.sub(r', experiment [0-9]+$', '', cited)}"


def _memory_log_ratio(case: Case, p) -> float | None:
    """ln(measured / predicted memory): peak allocated where measured so, else the stack's reserved reading
    (which includes the CUDA context) against the predicted reserved memory; None without a reading."""
    if case.peak_memory_bytes:
        return math.log(case.peak_memory_bytes / p.peak_memory)
    if "reserved_memory_bytes" in case.extra:
        return math.log(case.extra["reserved_memory_bytes"] / (p.reserved_memory + CUDA_CONTEXT_BYTES))
    return None


def _configuration(case: Case) -> str:
    """What makes two rows repeats of one configuration (they stay on one side of a split)."""
    m, s = case.model, case.strategy
    fields = (case.label, m.layers, m.hidden, m.seq, m.vocab, case.cluster.n_gpus, s.dp, s.tp, s.pp, s.cp,
              s.micro_batch, s.global_batch, s.recompute, s.shard, s.fsdp, s.framework, s.attention, s.precision)
    return "|".join(map(str, fields))


def scored_rows() -> list[Scored]:
    """Every validation row predicted and scored."""
    return [score(source, case) for source, case in validation_cases()]


def traced_scored_rows() -> list[Scored]:
    """The published CNN checks predicted and scored, each in its regime ``cnn/<framework>``: the one-GPU
    PyTorch rows (``validate/cnn.py``), the V100 data-parallel PyTorch rows (``validate/cnn_ddp.py``), the K80
    TensorFlow parameter-server rows (``validate/tf_ps.py``) and the one-GPU TensorFlow and PyTorch CIFAR rows
    (``validate/tf_cifar.py``, ``validate/pytorch_cifar.py``); a row's step is its batch (per GPU, or over the
    cluster) over its published throughput."""
    found = []
    for r in cnn.read_cnn_runs():
        model, gpu, strategy = cnn.row_inputs(r)
        measured = int(r["batch"]) / float(r["samples_per_s"])
        found.append(_traced("published cnn", r["source"], f"{r['model']}|{gpu}|{r['layout']}|{r['batch']}",
                             model, cluster(gpu), strategy, measured))
    for r in cnn_ddp.load_rows():  # one cluster measured by one team: one run source
        model, c, strategy = cnn_ddp.row_inputs(r)
        measured = int(r["batch"]) * int(r["gpus"]) / float(r["images_per_s"])
        found.append(_traced("cnn ddp", r["source"], f"{r['setting']}|{r['gpus']}",
                             model, c, strategy, measured))
    for r in tf_ps.load_rows():
        model, c, strategy = tf_ps.row_inputs(r)
        measured = int(r["batch"]) * int(r["gpus"]) / float(r["images_per_s"])
        found.append(_traced("tensorflow ps", r["source"], "|".join(str(r[k]) for k in
                                                                     ("setting", "model", "batch", "gpus")),
                             model, c, strategy, measured))
    for r in tf_cifar.load_rows():  # one harness on three machines: one run source
        model, c, strategy = tf_cifar.row_inputs(r)
        found.append(_traced("tensorflow cifar", r["source"], f"{r['setting']}|{r['model']}",
                             model, c, strategy, 1.0 / float(r["steps_per_s"])))
    for r in pytorch_cifar.load_rows():  # an epoch's seconds, read as a step at the epoch's measured/predicted ratio
        model, c, strategy = pytorch_cifar.row_inputs(r)
        p = predict(model, c, strategy)
        found.append(_traced("pytorch cifar", r["source"], f"{r['setting']}|{r['model']}", model, c, strategy,
                             float(r["epoch_s"]) / pytorch_cifar.predicted_epoch(r, p) * p.step_time, p))
    return found


def _traced(source: str, cited: str, group: str, model, c, s, measured: float, p=None) -> Scored:
    p = predict(model, c, s) if p is None else p
    prof = default_profile(c)
    share, host = iv.shares(p.step_time, p.breakdown)
    return Scored(source=source, group=group, label=group, kind=iv.profile_kind(prof),
                  stack=iv.stack_key(s.framework, s.attention, s.precision), hidden=0, seq=0, profile_gpu=prof.gpu,
                  cluster_gpu=c.gpu.name, share=float(share), host_share=float(host),
                  log_ratio=math.log(measured / p.step_time), framework=s.framework, step_s=p.step_time,
                  n_gpus=c.n_gpus, power_capped=iv.power_capped(prof), traced=True,
                  run_source=f"{source}|{cited.split(':')[0]}")  # the repository: timm's layouts are one harness
