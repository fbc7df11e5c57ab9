"""One prediction (``pm.predict``, its pieces remembered by what they depend on) equals the
vectorised path (``step.evaluate`` over arrays of configurations, as ``search`` prices them).

Seeded random configurations are drawn in groups that share what a search shares (model,
cluster, profile, software stack, precision, recompute, optimizer, placement) and differ in the
numeric strategy fields; every group is priced once as arrays (no memo: arrays run straight
through), and each configuration is predicted one by one, twice, in a shuffled order, with the
caches warm and shared across groups. Every field of the Prediction must agree to rtol 1e-12.
A second test checks that each memoised piece of ``evaluate`` is keyed by every StepConfig
field it reads (a missing field would hand one configuration another's price).
"""

from __future__ import annotations

import dataclasses
import importlib
import random

import numpy as np
import pytest

import perfmodel as pm
from perfmodel import step
from perfmodel.core.errors import PerfModelError
from perfmodel.core.memo import clear_memos
from perfmodel.interval import Interval, bounds
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.paths import priced_paths

predict_module = importlib.import_module("perfmodel.predict")

RTOL = 1e-12
NODES = ("dgx-h100", "hgx-h200", "dgx-a100-80gb", "h200", "dgx-1-v100")
MODELS = ("gpt2-small", "llama-3-8b", "mixtral-8x7b", "gpt3-1.3b")
STACKS = (  # framework, compile, loss, recompute choices, tp_comm_overlap
    ("pytorch", False, "eager", ("none", "selective", "full"), None),
    ("megatron", False, "eager", ("none", "selective", "full"), "userbuffers"),
    ("torchtitan", True, "compiled", ("every-2", "selective-op", "full", "none"), "async"),
    ("fsdp1", False, "eager", ("none", "full"), None),
)
FIELDS = ("step_time", "tokens_per_second", "samples_per_second", "tflops_per_gpu", "mfu", "peak_memory",
          "memory_capacity", "over_capacity", "model_flops", "reserved_memory")


def _model(rng):
    name = rng.choice([m for m in MODELS if m in pm.list_presets()])
    m = pm.preset(name)
    if rng.random() < 0.3:  # a shape no preset has (misaligned hidden, short sequence)
        heads = rng.choice([8, 12, 16])
        m = pm.transformer(layers=rng.choice([4, 6, 12]), hidden=heads * rng.choice([60, 64, 100]), heads=heads,
                           seq=rng.choice([512, 1024, 2048]), vocab=rng.choice([32000, 50257, 50304]),
                           activation=rng.choice(["gelu", "swiglu"]), norm=rng.choice(["layernorm", "rmsnorm"]))
    return m


def _group(rng):
    """What the configurations of one search share, or None when the draw cannot run."""
    model = _model(rng)
    cluster = pm.cluster(rng.choice(NODES), nodes=rng.choice([1, 2, 4]))
    framework, compile_, loss, recomputes, tp_comm = rng.choice(STACKS)
    precision = rng.choice(["bf16-mixed", "bf16-mixed", "fp16-mixed", "fp32", "fp8-mixed"])
    if precision == "fp8-mixed" and framework not in ("megatron", "torchtitan"):
        precision = "bf16-mixed"
    heads = model.heads
    tps = [d for d in (1, 2, 4, 8) if cluster.n_gpus % d == 0 and heads % d == 0 and model.kv_heads % d == 0]
    cp = rng.choice([1, 1, 1, 2]) if framework in ("megatron", "torchtitan") and cluster.n_gpus % 2 == 0 else 1
    ep = rng.choice([1, 2]) if getattr(model, "experts", 1) > 1 and framework == "megatron" else 1
    shared = {"framework": framework, "precision": precision, "recompute": rng.choice(recomputes),
              "optimizer": rng.choice(["adamw", "sgd"]), "placement": rng.choice(["tp-pp-dp", "dp-tp-pp"]),
              "attention": "flash" if cp > 1 or rng.random() < 0.8 else "unfused", "cp": cp, "ep": ep}
    if compile_ and rng.random() < 0.5:
        shared["compile"] = True
        shared["loss"] = loss
    if tp_comm and rng.random() < 0.3:
        shared["tp_comm_overlap"] = tp_comm
    profile = rng.choice([None, None, "h200-sxm-141gb-calibrated"]) if "h200" in cluster.name else None
    return model, cluster, profile, shared, tps


def _strategy(rng, model, cluster, shared, tps):
    n = cluster.n_gpus
    cp = shared["cp"]
    tp = rng.choice([t for t in tps if (n // t) % cp == 0])
    pp = rng.choice([d for d in (1, 2, 4) if (n // tp) % (d * cp) == 0 and d <= model.layers])
    dp = n // (tp * pp * cp)
    mb = rng.choice([1, 2, 4])
    sharded = shared["framework"] in ("torchtitan", "fsdp1")
    fsdp = rng.choice(["full", "hybrid"]) if sharded else None
    schedule = rng.choice(["1f1b", "gpipe", "interleaved"]) if pp > 1 and not sharded else "1f1b"
    options = {"sequence_parallel": tp > 1 and (shared["ep"] > 1 or "tp_comm_overlap" in shared
                                                or rng.random() < 0.5),
               "tp_overlap": shared["framework"] == "megatron" and rng.random() < 0.5,
               "dp_overlap": rng.random() < 0.8, "bucket_mib": rng.choice([25.0, 40.0])}
    if not sharded:
        options["zero"] = rng.choice([0, 1, 2, 3]) if shared["framework"] == "pytorch" else rng.choice([0, 1])
    else:
        options["fsdp"] = fsdp
    return pm.Strategy(dp=dp, tp=tp, pp=pp, micro_batch=mb, global_batch=dp * mb * pp * rng.choice([1, 2, 4]),
                       schedule=schedule, virtual_stages=2 if schedule == "interleaved" else 1,
                       **options, **shared)


def _groups(n_groups, per_group, seed):
    rng = random.Random(seed)
    out = []
    while len(out) < n_groups:
        model, cluster, profile, shared, tps = _group(rng)
        strategies = []
        for _ in range(per_group * 3):
            try:
                s = _strategy(rng, model, cluster, shared, tps)
                predict_module.check_strategy(model, cluster, s)
            except PerfModelError:
                continue
            if s not in strategies:
                strategies.append(s)
            if len(strategies) == per_group:
                break
        if len(strategies) >= 2:
            out.append((model, cluster, profile, strategies))
    return out


def _vectorised(model, cluster, profile, strategies):
    """The group's predictions as the search path computes them: one ``evaluate`` over arrays."""
    s0 = strategies[0]
    prof = predict_module.default_profile(cluster) if profile is None else pm.load_profile(profile)
    coll = predict_module._collectives(cluster, prof)
    c = StepConfig.stack([StepConfig.from_strategy(s) for s in strategies])
    out = step.evaluate(model, cluster, prof, coll, c, precision=s0.precision, recompute=s0.recompute,
                        optimizer=s0.optimizer, placement=s0.placement)
    out["micro_batch"] = np.array([float(s.micro_batch) for s in strategies])
    batch = np.array([float(s.batch) for s in strategies])
    derived = predict_module.finish(model, cluster, batch, out, s0.precision, s0.recompute, cluster.n_gpus)
    breakdown = {k: np.broadcast_to(np.asarray(out[k], float), batch.shape) for k in predict_module.BREAKDOWN_KEYS}
    step_time = np.broadcast_to(np.asarray(out["step_time"], float), batch.shape)
    low, high, regime = np.empty(batch.shape), np.empty(batch.shape), np.empty(batch.shape, dtype=object)
    paths = [priced_paths(s) for s in strategies]
    for kind in {tuple(sorted(p.items())) for p in paths}:  # one bounds call per set of pricing paths, as search
        mask = np.array([tuple(sorted(p.items())) == kind for p in paths])
        found = bounds(step_time[mask], {k: v[mask] for k, v in breakdown.items()}, profile=prof, cluster=cluster,
                       model=model, framework=s0.framework, attention=s0.attention, precision=s0.precision,
                       paths=dict(kind))
        low[mask], high[mask], regime[mask] = found.low, found.high, found.regime
    return out, derived, breakdown, Interval(low, high, found.level, regime)


def _check(p, i, out, derived, breakdown, iv):
    def at(x):
        return float(np.broadcast_to(np.asarray(x, float), (len(iv.low),))[i])

    reference = {"step_time": at(out["step_time"]), "peak_memory": at(out["peak_memory"]),
                 **{k: at(derived[k]) for k in FIELDS if k in derived}}
    for k in FIELDS:
        np.testing.assert_allclose(getattr(p, k), reference[k], rtol=RTOL, atol=0, err_msg=k)
    assert p.fits == bool(np.broadcast_to(derived["fits"], (len(iv.low),))[i])
    assert p.breakdown.keys() == breakdown.keys()
    np.testing.assert_allclose([p.breakdown[k] for k in breakdown], [at(breakdown[k]) for k in breakdown],
                               rtol=RTOL, atol=0)
    worst = max(p.breakdown, key=p.breakdown.get)
    assert p.bottleneck == predict_module.BOTTLENECK_WORDS[worst]
    assert p.memory.keys() == out["memory"].keys()
    np.testing.assert_allclose([p.memory[k] for k in p.memory], [at(out["memory"][k]) for k in p.memory],
                               rtol=RTOL, atol=0)
    np.testing.assert_allclose(p.interval, (at(iv.low), at(iv.high)), rtol=RTOL, atol=0)
    assert p.interval_regime == str(np.broadcast_to(iv.regime, (len(iv.low),))[i])


@pytest.fixture(scope="module")
def groups():
    return _groups(n_groups=20, per_group=10, seed=22)


def test_one_prediction_equals_the_vectorised_path(groups):
    clear_memos()
    references = [_vectorised(*g) for g in groups]
    calls = [(gi, si) for gi, g in enumerate(groups) for si in range(len(g[3]))] * 2
    random.Random(5).shuffle(calls)
    for gi, si in calls:
        model, cluster, profile, strategies = groups[gi]
        p = pm.predict(model, cluster, strategies[si], profile=profile)
        _check(p, si, *references[gi])
    configurations = sum(len(g[3]) for g in groups)
    frameworks = {g[3][0].framework for g in groups}
    assert configurations >= 200 and frameworks == {"pytorch", "megatron", "torchtitan", "fsdp1"}
    assert any(g[2] is not None for g in groups) and any(g[3][0].cp > 1 for g in groups)


_NAMES = {f.name for f in dataclasses.fields(StepConfig)}


class _Recorded(StepConfig):
    """A StepConfig that notes which fields are read, and by which memoised piece."""

    reads: dict = {}
    piece: list = []

    def __getattribute__(self, name):
        if name in _NAMES and _Recorded.piece:
            _Recorded.reads.setdefault(_Recorded.piece[-1], set()).add(name)
        return object.__getattribute__(self, name)


class _Labelled:
    """Stands in for the pieces' memo: computes every piece, noting which one runs."""

    def __call__(self, owners, key, compute):
        label = key if isinstance(key, str) else key[1][0] if isinstance(key, tuple) else None
        _Recorded.piece.append(label)
        try:
            return compute()
        finally:
            _Recorded.piece.pop()


def test_memo_keys_cover_the_fields_each_piece_reads(groups, monkeypatch):
    monkeypatch.setattr(step, "_PIECES", _Labelled())
    _Recorded.reads.clear()
    clear_memos()  # the kernel lists read their fields, not a memo's key
    for model, cluster, profile, strategies in groups[::2]:
        s = strategies[0]
        prof = predict_module.default_profile(cluster) if profile is None else pm.load_profile(profile)
        plain = StepConfig.from_strategy(s)
        c = _Recorded(**{f.name: getattr(plain, f.name) for f in dataclasses.fields(StepConfig)})
        step.evaluate(model, cluster, prof, predict_module._collectives(cluster, prof), c, precision=s.precision,
                      recompute=s.recompute, optimizer=s.optimizer, placement=s.placement)
    declared = {"shape": step.SHAPE_FIELDS, "compute": step.COMPUTE_FIELDS, "critical": step.CRITICAL_FIELDS,
                "exposed": step.EXPOSED_FIELDS, "memory": step.MEMORY_FIELDS, "local": ("cp",), "step": step.STEP_FIELDS}
    by_identity = {"values", "dpc"}  # keyed by the configuration object itself
    assert set(_Recorded.reads) - by_identity <= set(declared)
    for piece, read in _Recorded.reads.items():
        if piece not in by_identity:
            assert read <= set(declared[piece]), (piece, sorted(read - set(declared[piece])))
    assert {"shape", "compute", "critical", "exposed", "memory", "step"} <= set(_Recorded.reads)
