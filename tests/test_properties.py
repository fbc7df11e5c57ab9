"""Property-based tests (hypothesis, derandomized): the promise for any input.

predict, search, sweep, compare, Strategy, the profile loader and every file reader either raise a
perfmodel.core.errors exception or give finite, positive, self-consistent figures: the breakdown adds up to
the step, ``fits`` agrees with memory against capacity. Sizes span far past the bounds (10**300 and
friends), so the bounds themselves are exercised. No deadline: a busy machine must not fail a test;
bounded time comes from the bounds, which the regression tests pin.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import perfmodel as pm
from perfmodel.core.errors import PerfModelError

SETTINGS = dict(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
GPUS = ("h200", "h100", "a100", "t4", "k80", "hgx-h200", "dgx-a100-80gb")

# sizes: mostly sensible, sometimes absurd (negative, zero, past every bound, not integers at all)
sensible = st.one_of(st.sampled_from([1, 2, 4, 8]), st.integers(1, 64))
absurd = st.one_of(st.integers(-3, 0), st.just(10**300), st.integers(2**20, 2**40))
sizes = st.one_of(sensible, sensible, sensible, sensible, sensible, absurd)
anything = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=6),
                     st.integers(-10, 10**30), st.lists(st.integers(0, 4), max_size=3))


def check_prediction(p) -> None:
    figures = [p.step_time, p.peak_memory, p.tokens_per_second, p.samples_per_second, p.tflops_per_gpu, p.mfu]
    assert all(math.isfinite(x) and x > 0 for x in figures), figures
    assert sum(p.breakdown.values()) == pytest.approx(p.step_time, rel=1e-6)
    assert all(math.isfinite(v) and v >= 0 for v in p.breakdown.values())
    assert p.fits == (p.peak_memory <= p.memory_capacity)
    assert p.mfu < 1.0


def check_table(df) -> None:
    relative = [c for c in ("speedup", "scaling_efficiency") if c in df]  # NaN where a point does not fit
    numeric = df.select_dtypes("number").drop(columns=relative)
    assert np.isfinite(numeric.to_numpy(float)).all()
    if relative and "fits" in df:
        assert np.isfinite(df.loc[df["fits"].astype(bool), relative].to_numpy(float)).all()
    for col in ("step_time", "tokens_per_second", "peak_memory"):
        if col in df:
            assert (df[col] > 0).all()
    if {"fits", "peak_memory", "memory_capacity"} <= set(df.columns):
        assert (df["fits"].astype(bool) == (df["peak_memory"] <= df["memory_capacity"])).all()


@st.composite
def models(draw):
    if draw(st.booleans()):
        return draw(st.sampled_from(["gpt2-small", "gpt2-medium", "llama-3-8b", "resnet50", "vit-b-16"]))
    heads = draw(st.sampled_from([1, 2, 4, 8, 12, 16]))
    return dict(layers=draw(st.one_of(st.integers(1, 48), sizes)), hidden=heads * draw(st.sampled_from([8, 64, 128])),
                heads=heads, seq=draw(st.one_of(st.sampled_from([128, 1024, 8192]), sizes)),
                vocab=draw(st.one_of(st.sampled_from([1000, 50304]), sizes)),
                causal=draw(st.booleans()), activation=draw(st.sampled_from(["gelu", "swiglu"])))


def make_model(spec):
    return spec if isinstance(spec, str) else pm.transformer(**spec)


strategy_kwargs = st.fixed_dictionaries({}, optional={
    "dp": sizes, "tp": st.sampled_from([1, 2, 4, 8]), "pp": st.sampled_from([1, 2, 4]), "micro_batch": sizes,
    "global_batch": st.one_of(st.none(), sizes), "zero": st.integers(-1, 4), "recompute": st.sampled_from(
        ["none", "selective", "full", "x"]), "precision": st.sampled_from(["bf16-mixed", "fp32", "fp8-mixed", "int3"]),
    "schedule": st.sampled_from(["1f1b", "gpipe", "interleaved"]), "virtual_stages": st.sampled_from([1, 2, 10**6]),
    "sequence_parallel": st.one_of(st.booleans(), st.sampled_from([1, "on", "maybe"])),
    "tp_overlap": st.one_of(st.booleans(), st.sampled_from([0, "true", 2])), "dp_overlap": st.booleans(),
    "attention": st.sampled_from(["flash", "flash", "unfused"]), "framework": st.sampled_from(["pytorch", "megatron"]),
    "cp": st.sampled_from([1, 1, 1, 2, 3]), "fsdp": st.sampled_from([None, "full", "hybrid"]),
    "bucket_mib": st.one_of(st.floats(allow_nan=True), st.just(25.0)), "stage_layers": st.one_of(
        st.none(), st.lists(st.integers(-1, 30), max_size=5), st.text(max_size=8))})


@settings(max_examples=250, **SETTINGS)
@given(model=models(), gpu=st.sampled_from(GPUS), nodes=st.one_of(st.just(1), st.integers(1, 4), sizes),
       kwargs=strategy_kwargs)
def test_predict_is_finite_and_consistent_or_refused(model, gpu, nodes, kwargs):
    try:
        cl = pm.cluster(gpu, nodes=nodes)
        kwargs.setdefault("dp", cl.n_gpus // (kwargs.get("tp", 1) * kwargs.get("pp", 1) * kwargs.get("cp", 1)) or 1)
        p = pm.predict(make_model(model), cl, pm.Strategy(**kwargs))
    except PerfModelError:
        event("refused")
        return
    event("answered")
    check_prediction(p)


# a space of mostly valid strategies, so most examples are answered and their figures checked
valid_kwargs = st.fixed_dictionaries({"micro_batch": st.one_of(st.integers(1, 16), st.just(2**20))}, optional={
    "tp": st.sampled_from([1, 2, 4]), "pp": st.sampled_from([1, 2]), "zero": st.integers(0, 3),
    "recompute": st.sampled_from(["none", "selective", "full"]), "precision": st.sampled_from(["bf16-mixed", "fp32"]),
    "sequence_parallel": st.booleans(), "tp_overlap": st.booleans(), "dp_overlap": st.booleans(),
    "attention": st.sampled_from(["flash", "unfused"]), "framework": st.sampled_from(["pytorch", "megatron"]),
    "optimizer": st.sampled_from(["adamw", "sgd"]), "schedule": st.sampled_from(["1f1b", "gpipe"])})


@settings(max_examples=200, **SETTINGS)
@given(model=st.one_of(st.sampled_from(["gpt2-small", "gpt2-medium", "llama-3-8b"]), models()),
       gpu=st.sampled_from(["hgx-h200", "dgx-a100-80gb", "h100", "t4"]), kwargs=valid_kwargs,
       accumulate=st.integers(1, 4))
def test_predict_over_valid_strategies_is_finite_and_consistent(model, gpu, kwargs, accumulate):
    try:
        cl = pm.cluster(gpu)
        dp = max(1, cl.n_gpus // (kwargs.get("tp", 1) * kwargs.get("pp", 1)))
        s = pm.Strategy(dp=dp, global_batch=dp * kwargs["micro_batch"] * accumulate, **kwargs)
        p = pm.predict(make_model(model), cl, s)
    except PerfModelError:
        event("refused")
        return
    event("answered")
    check_prediction(p)


@settings(max_examples=500, **SETTINGS)
@given(kwargs=st.dictionaries(st.sampled_from(["dp", "tp", "pp", "micro_batch", "global_batch", "zero", "cp", "ep",
                                               "virtual_stages", "sequence_parallel", "tp_overlap", "stage_layers",
                                               "bucket_mib", "ps_servers", "fsdp", "placement"]),
                              st.one_of(sensible, sensible, anything), max_size=3))
def test_strategy_takes_any_value_or_names_the_field(kwargs):
    try:
        s = pm.Strategy(**kwargs)
    except PerfModelError as exc:
        assert "\n" not in str(exc)
        event("refused")
        return
    event("answered")
    if s.dp is None:  # dp unset: filled from a cluster, whose GPU count the other fields must then allow
        try:
            s = pm.fill_dp(s, s.tp * s.pp * s.cp * s.ep)
        except PerfModelError as exc:
            assert "\n" not in str(exc)
            return
    assert s.gpus >= 1 and s.micro_batches >= 1


@settings(max_examples=60, **SETTINGS)
@given(model=st.sampled_from(["gpt2-small", "resnet50"]), gpu=st.sampled_from(["h200", "hgx-h200", "t4"]),
       global_batch=st.one_of(st.sampled_from([8, 32, 64]), sizes), options=st.fixed_dictionaries({}, optional={
           "zero": st.one_of(st.sampled_from([0, 3, (0, 1), (3,), 3.0]), anything),
           "sequence_parallel": st.one_of(st.booleans(), st.just((False, True)), anything),
           "recompute": st.one_of(st.sampled_from(["none", ("none", "full")]), anything),
           "precision": st.one_of(st.sampled_from(["bf16-mixed", ("bf16-mixed", "fp32")]), anything),
           "max_micro_batch": st.one_of(st.integers(1, 16), sizes), "max_virtual_stages": st.one_of(st.integers(1, 4), sizes),
           "attention": st.sampled_from(["flash", "unfused"]), "top_k": st.one_of(st.integers(1, 5), sizes),
           "sort_by": st.sampled_from(["mfu", "step_time", "colour"])}))
def test_search_rows_are_finite_and_fit_or_refused(model, gpu, global_batch, options):
    try:
        df = pm.search(model, gpu, global_batch, **options)
    except PerfModelError:
        event("refused")
        return
    event("answered")
    check_table(df)
    assert df["fits"].all() and len(df) >= 1


strategy_text = st.lists(st.tuples(st.sampled_from(["dp", "tp", "pp", "mb", "gb", "zero", "sp", "v", "tp_overlap",
                                                    "dp_overlap", "recompute", "cp", "colour"]),
                                   st.one_of(st.sampled_from(["1", "2", "8", "true", "off", "full", "none"]),
                                             st.text(max_size=5), st.integers(-2, 10**25).map(str))),
                         max_size=4).map(lambda items: ",".join(f"{k}={v}" for k, v in items))


@settings(max_examples=120, **SETTINGS)
@given(specs=st.lists(strategy_text, min_size=1, max_size=3), gpu=st.sampled_from(["h200", "hgx-h200"]),
       defaults=st.one_of(st.none(), st.dictionaries(st.sampled_from(["global_batch", "micro_batch", "foo"]), sizes,
                                                      max_size=2)))
def test_compare_rows_are_finite_or_refused(specs, gpu, defaults):
    try:
        df = pm.compare("gpt2-small", gpu, specs, defaults=defaults)
    except PerfModelError:
        event("refused")
        return
    event("answered")
    check_table(df)
    assert df["best"].sum() == (1 if df["fits"].any() else 0)


@settings(max_examples=80, **SETTINGS)
@given(over=st.sampled_from(["nodes", "gpus", "global_batch", "micro_batch", "seq", "zero", "tp_overlap", "pp"]),
       values=st.lists(st.one_of(st.integers(1, 16), sizes, anything), min_size=1, max_size=3))
def test_sweep_rows_are_finite_or_refused(over, values):
    try:
        df = pm.sweep("gpt2-small", over, values, cluster="hgx-h200", strategy=pm.Strategy(dp=8, micro_batch=2))
    except PerfModelError:
        event("refused")
        return
    event("answered")
    check_table(df)


@pytest.fixture(scope="module")
def profile_dict():
    return pm.load_profile("h200-sxm-141gb").to_dict()


extreme = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([5e-324, 1e-300, 1e308, -1.0, 0.0]),
                    st.floats(1e-12, 1e16), st.text(max_size=3), st.none(), st.booleans())


@settings(max_examples=250, suppress_health_check=[HealthCheck.function_scoped_fixture, *SETTINGS["suppress_health_check"]],
          **{k: v for k, v in SETTINGS.items() if k != "suppress_health_check"})
@given(data=st.data())
def test_profile_loads_and_predicts_finite_or_is_refused(profile_dict, data):
    import copy

    from perfmodel.profiles.profile import Profile

    d = copy.deepcopy(profile_dict)
    entries = [*d["compute"].values(), *(e for lvl in d["collectives"].values() for e in lvl.values())]
    for _ in range(data.draw(st.integers(1, 4))):
        entry = entries[data.draw(st.integers(0, len(entries) - 1))]
        name = data.draw(st.sampled_from(sorted(entry["params"])))
        entry["params"][name] = data.draw(extreme)
    try:
        prof = Profile.from_dict(d)
        p = pm.predict("gpt2-small", pm.cluster("hgx-h200"), pm.Strategy(dp=8), profile=prof)
    except PerfModelError:
        event("refused")
        return
    event("answered")
    check_prediction(p)


json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(), st.text(max_size=5)),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)
file_text = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 3000).map(lambda n: b"a = " + b"[" * n + b"]" * n),
    st.sampled_from([b"layers = 2\nhidden = 64\nheads = 4\n", b'preset = "gpt2-small"\nseq = 99999999999\n',
                     b"name = 'g'\nmemory = '1GiB'\n[peak_flops]\nbf16 = '1e400FLOPS'\n", b"\xef\xbb\xbf{}", b""]))


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture, *SETTINGS["suppress_health_check"]],
          **{k: v for k, v in SETTINGS.items() if k != "suppress_health_check"})
@given(content=file_text, suffix=st.sampled_from([".json", ".toml", ".csv"]),
       reader=st.sampled_from(["model", "gpu", "profile", "strategies", "hf", "compute", "measured", "graph"]))
def test_every_file_reader_returns_or_refuses(tmp_path_factory, content, suffix, reader):
    from perfmodel.fit.tables import read_compute_table
    from perfmodel.validate import read_measured
    from perfmodel.workload.graph import GraphModel  # noqa: F401  (load_graph below)
    from perfmodel.workload.presets import model_from_toml

    path = tmp_path_factory.mktemp("f") / f"input{suffix}"
    path.write_bytes(content)
    readers = {"model": lambda: model_from_toml(path), "gpu": lambda: pm.cluster(str(path)),
               "profile": lambda: pm.load_profile(path), "hf": lambda: pm.from_hf_config(path),
               "strategies": lambda: __import__("perfmodel.cli.explore", fromlist=["x"]).load_strategies(path),
               "compute": lambda: read_compute_table(path), "measured": lambda: read_measured(path),
               "graph": lambda: __import__("perfmodel.workload.graph", fromlist=["x"]).load_graph(path)}
    try:
        result = readers[reader]()
    except PerfModelError as exc:
        assert "\n" not in str(exc).strip()  # the command line prints it as one line
        event("refused")
        return
    event("answered")
    if reader in ("model", "hf"):
        assert result.params > 0
