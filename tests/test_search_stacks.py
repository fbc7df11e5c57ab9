"""The stack options as axes of the default search space: frameworks, compile, float8, offload,
each stack's checkpointing policies; the rows agree with ``pm.predict``, and pruning a job by its
family's root loses no row (``perfmodel/explore/stack_options.py``, ``pruning.price_jobs``)."""

from __future__ import annotations

import importlib

import numpy as np
import pandas as pd
import pytest

import perfmodel as pm
from perfmodel.explore import strategy_of
from perfmodel import step as compose
from perfmodel.explore.chunks import CHUNK, _collectives, _configs, _parts, chunks, pipeline_floor
from perfmodel.explore.search import FIXED_FIELDS
from perfmodel.explore.space import NUMERIC
from perfmodel.validate.published import read_published

chunks_module = importlib.import_module("perfmodel.explore.chunks")
pruning_module = importlib.import_module("perfmodel.explore.pruning")
search_module = importlib.import_module("perfmodel.explore.search")  # the module (the package exports the function)
MODEL = pm.transformer(layers=4, hidden=1024, heads=16, seq=1024, vocab=32000, name="small")
H100 = pm.cluster("dgx-h100", nodes=1)
SMALL = dict(max_micro_batch=2, max_virtual_stages=2, cp=(1, 2), bucket_mib=(25, 100))


def _priced(model, cl, batch, cp, framework=None):
    """Every job of the default space (small limits) and its priced columns, fitting or not."""
    opts = search_module._options(None, None, (0, 1, 2, 3), "adamw", "tp-pp-dp", {
        "framework": framework, "attention": "flash", "tp_overlap": (False, True), "dp_overlap": (True, False),
        "cp": cp, "ep": 1, "sequence_parallel": (False, True), "compile": None, "offload_layers": None})
    opts["level"] = 0.9
    limits = {"max_micro_batch": 2, "max_virtual_stages": 2, "max_tp_nodes": 1, "ep": 1,
              "fsdp": (None, "full", "hybrid"), "bucket_mib": (25.0, 100.0)}
    jobs, *_ = search_module._jobs(model, cl, batch, opts, limits, None, None)
    out = []
    for job in jobs:
        for cols, _ in chunks(model, job, opts, CHUNK):
            out.append((job, pd.DataFrame({k: np.asarray(cols[k]) for k in (*NUMERIC, "step_time", "host_overhead")})))
    return out


@pytest.fixture(scope="module")
def priced():
    return _priced(MODEL, H100, 16, (1, 2))


def test_default_space_holds_every_stack_option(priced):
    specs = {j.spec for j, _ in priced}
    assert {s.framework for s in specs} == {"pytorch", "megatron", "deepspeed", "torchtitan", "fsdp1"}
    assert {s.framework for s in specs if s.precision == "fp8-mixed"} == {"megatron", "torchtitan", "fsdp1"}  # H100 fp8
    assert {s.framework for s in specs if s.compile} == {"pytorch", "torchtitan", "fsdp1"}
    assert {(s.framework, s.offload_layers) for s in specs if s.offload_layers} == {
        ("pytorch", 2), ("pytorch", 4), ("megatron", 2), ("megatron", 3)}  # half and all (Megatron keeps one)
    assert {s.recompute for s in specs if s.framework == "torchtitan"} == {"none", "full", "selective-op", "every-2"}
    assert {s.recompute for s in specs if s.framework == "fsdp1"} == {"none", "full"}
    # each stack's own tensor-parallel overlaps beside none: userbuffers (Megatron-Core, TE's and NeMo's tables),
    # async TP (torchtitan, compiled)
    assert {(s.framework, s.tp_comm_overlap) for s in specs if s.tp_comm_overlap} == {
        ("megatron", "userbuffers"), ("megatron", "userbuffers-nemo"), ("torchtitan", "async")}
    assert all(s.compile for s in specs if s.tp_comm_overlap == "async")
    assert all(s.family[3:5] == (s.tp_comm_overlap, s.schedule) for s in specs)  # its own root bounds each
    # the stack fields searched beside their defaults: bf16 gradient reduction (bounded by its root), fp8
    # parameters at fp8 only; Megatron-Core's are their own family (the distributed optimizer only)
    extras = {(s.framework, s.precision, s.extras) for s in specs if s.extras}
    assert {(fw, x) for fw, _, x in extras} == {
        (fw, x) for fw in ("megatron", "torchtitan") for x in ((("grad_reduce_fp32", False),), (("fp8_params", True),),
                                                               (("grad_reduce_fp32", False), ("fp8_params", True)))}
    assert all(p == "fp8-mixed" for _, p, x in extras if dict(x).get("fp8_params"))
    assert {s.family[5] for s in specs if s.framework == "megatron" and s.precision == "fp8-mixed"} == {
        tuple(zip(("grad_reduce_fp32", "fp8_params"), v)) for v in ((None, False), (None, True), (False, False),
                                                                   (False, True))}
    # torchtitan: bf16 reduction and the float8 all-gather bound the rest: their job is the root
    assert all(s.extras == (("grad_reduce_fp32", False),) + (("fp8_params", True),) * (s.precision == "fp8-mixed")
               for s in specs if s.root and s.framework == "torchtitan")
    for job, rows in priced:  # Megatron-Core gathers fp8 parameters in its distributed optimizer only
        if dict(job.spec.extras).get("fp8_params") and job.spec.framework == "megatron":
            assert (rows["zero"] >= 1).all()
    # torch's zero-bubble schedules for torchtitan's chunked rows (not with offload, which runs without pipelining)
    assert {(s.framework, s.schedule) for s in specs if s.schedule != "interleaved"} == {
        ("torchtitan", "interleaved-zb"), ("torchtitan", "zbv"), ("torchtitan", "dualpipev")}
    for job, rows in priced:  # a zero-bubble job prices pipelined rows with virtual stages only
        if job.spec.schedule != "interleaved":
            assert ((rows["pp"] > 1) & (rows["virtual_stages"] >= 2)).all()
    for job, rows in priced:  # an overlap job prices tensor groups with sequence parallelism only
        assert not job.spec.tp_comm_overlap or ((rows["tp"] > 1) & rows["sequence_parallel"].astype(bool)).all()
    assert all(s.recompute == "none" for s in specs if s.offload_layers)
    for job, rows in priced:  # offload runs without pipelining
        assert not job.spec.offload_layers or (rows["pp"] == 1).all()


def _never_faster_than_the_root(priced) -> tuple[int, bool]:
    """(configurations checked, whether one beat its root's step): a job's step is at least its family
    root's on each configuration, less the root's host seconds where the root is DeepSpeed's (its engine
    hides more host work behind a longer backward)."""
    roots = {j.spec.family: (j, rows) for j, rows in priced if j.spec.root}
    checked, faster = 0, False
    for job, rows in priced:
        if job.spec.root or rows.empty:
            continue
        root, root_rows = roots[job.spec.family]
        both = rows.merge(root_rows, on=[*NUMERIC], suffixes=("", "_root"))
        assert len(both) == len(rows)
        floor = both["step_time_root"] - (both["host_overhead_root"] if root.spec.framework == "deepspeed" else 0.0)
        assert (both["step_time"] >= floor * (1 - 1e-12)).all(), job.spec
        faster |= bool((both["step_time"] < both["step_time_root"]).any())
        checked += len(both)
    return checked, faster


def test_a_job_is_never_faster_than_its_root(priced):
    # recomputation, offload and no compilation only add time, configuration by configuration; DeepSpeed
    # is its own family (its 16-bit reduction can beat Megatron-LM's fp32 one)
    checked, _ = _never_faster_than_the_root(priced)
    assert checked > 5_000
    assert {j.spec.family[0] for j, _ in priced if j.spec.framework == "deepspeed"} == {"deepspeed"}
    alone = _priced(MODEL, H100, 16, (1,), framework=("deepspeed",))
    checked, _ = _never_faster_than_the_root(alone)
    assert checked > 200  # alone, its own root, less the host seconds it hides (no interleaving,
    # no ZeRO-2/3 with pp > 1: the rows DeepSpeed's pipeline engine refuses are not searched); whether a
    # job beats its root depends on the backward the GPU still has queued (costs/engine_host.py)


def test_the_floor_bounds_every_step_of_its_job(priced):
    # the floor a root is pruned by: never above a step of its job (all, and at pp = 1), and at pp = 1
    # (one stage) the pipeline + dp_comm seconds step.evaluate reports, not a second copy of them
    opts = {"placement": "tp-pp-dp", "optimizer": "adamw"}
    tight = {False: 0.0, True: 0.0}  # the highest floor / shortest step, without and with an engine
    for job, rows in priced:
        if rows.empty or not job.spec.root:  # the roots are the jobs price_jobs floors
            continue
        floor = pipeline_floor(MODEL, job, opts, CHUNK)
        # DeepSpeed's root bounds its family by its step less its host seconds: its floor bounds that
        steps = rows["step_time"] - (rows["host_overhead"] if job.spec.framework == "deepspeed" else 0.0)
        assert floor["all"] <= steps.min()
        at_pp1 = steps[rows["pp"] == 1]
        assert floor["pp1"] <= (at_pp1.min() if len(at_pp1) else np.inf)
        tight[job.spec.framework == "deepspeed"] = max(tight[job.spec.framework == "deepspeed"],
                                                       floor["all"] / steps.min())
    assert tight[True] > 0.9  # DeepSpeed's floor holds its first stage's reduction, not the pipeline alone
    for framework in ("megatron", "torchtitan"):  # DDP and ZeRO-1/2/3; FSDP2
        job = max((j for j, _ in priced if j.spec.framework == framework and j.spec.root), key=lambda j: len(j.space))
        (part, numeric), = _parts(job.space, CHUNK)
        c, = _configs(job, [(part, None)])
        out = compose.evaluate(MODEL, H100, job.profile, _collectives(H100, job.profile), c,
                               precision=job.spec.precision, recompute=job.spec.recompute, optimizer="adamw")
        low = part.flat(out["pipeline"] + out["dp_comm"])[numeric["pp"] == 1]
        assert pipeline_floor(MODEL, job, opts, CHUNK)["pp1"] == low.min()
        assert (part.flat(out["dp_comm"])[numeric["pp"] == 1] > 0).any()


@pytest.mark.parametrize("sort_by, top_k", [("tokens_per_second", 1), ("step_time", 10)])
def test_pruning_loses_no_row(sort_by, top_k, monkeypatch):
    small = {**SMALL, "cp": 1, "max_virtual_stages": 1, "bucket_mib": 25}
    roots, real = [], pruning_module.price_job
    monkeypatch.setattr(pruning_module, "price_job", lambda job, *a: (roots.append(job.spec.root), real(job, *a))[1])
    full = pm.search(MODEL, H100, 16, top_k=top_k, prune=False, sort_by=sort_by, **small)
    every, roots[:] = sum(roots), []
    pruned = pm.search(MODEL, H100, 16, top_k=top_k, sort_by=sort_by, **small)
    pd.testing.assert_frame_equal(pruned.reset_index(drop=True), full.reset_index(drop=True), check_exact=True)
    assert pruned.attrs["pruned"] > 0 and full.attrs["pruned"] == 0
    assert pruned.attrs["evaluated"] + pruned.attrs["pruned"] == full.attrs["evaluated"]
    assert top_k > 1 or sum(roots) < every  # a root pruned by its pipeline floor


def test_deepspeed_roots_and_jobs_below_a_root_are_floored(monkeypatch):
    # DeepSpeed's roots are bounded before they are priced, and so is a job its root's bound cannot
    # prune (test_pruning_loses_no_row: the same table as prune=False)
    floored, init = [], chunks_module.Floor.__init__
    monkeypatch.setattr(chunks_module.Floor, "__init__",
                        lambda self, model, job, *a: (floored.append(job.spec), init(self, model, job, *a))[1])
    pm.search(MODEL, H100, 16, top_k=10, sort_by="step_time", **{**SMALL, "cp": 1, "max_virtual_stages": 1})
    assert any(s.framework == "deepspeed" and s.root for s in floored)
    assert any(not s.root for s in floored)


@pytest.mark.parametrize("options", [dict(framework="torchtitan", precision="fp8-mixed", compile=True),
                                     dict(framework="deepspeed"), dict(framework="pytorch", compile=True),
                                     dict(framework="megatron", precision="fp8-mixed"),
                                     dict(framework="fsdp1", compile=True, recompute="full")])
def test_stack_rows_are_what_predict_says(options):
    top = pm.search(MODEL, H100, 16, top_k=2, **options, **SMALL)
    for _, row in top.iterrows():
        s = strategy_of(row)
        assert all(getattr(s, k) == v for k, v in options.items())
        p = pm.predict(MODEL, H100, s)
        np.testing.assert_allclose([row["step_time"], row["peak_memory"], row["tokens_per_second"]],
                                   [p.step_time, p.peak_memory, p.tokens_per_second], rtol=1e-9)


def test_offload_rows_are_what_predict_says():
    top = pm.search(MODEL, H100, 16, top_k=3, offload_layers=(2,), framework=("pytorch", "megatron"), **SMALL)
    assert set(top["offload_layers"]) == {2} and (top["pp"] == 1).all()
    for _, row in top.iterrows():
        np.testing.assert_allclose(row["step_time"], pm.predict(MODEL, H100, strategy_of(row)).step_time, rtol=1e-9)


def test_each_option_can_be_restricted():
    top = pm.search(MODEL, H100, 16, top_k=50, framework="torchtitan", compile=False, precision="bf16-mixed",
                    recompute="full", **SMALL)
    assert set(top["framework"]) == {"torchtitan"} and not top["compile"].any()
    assert set(top["precision"]) == {"bf16-mixed"} and set(top["recompute"]) == {"full"}
    with pytest.raises(pm.UnsupportedError, match="does not apply to framework='megatron'"):
        pm.search(MODEL, H100, 16, framework="megatron", compile=True, **SMALL)
    with pytest.raises(pm.UnsupportedError, match="offload"):
        pm.search(MODEL, H100, 16, framework="torchtitan", offload_layers=2, **SMALL)
    with pytest.raises(pm.InvalidInputError, match="'offload_layers' must be at most 3"):
        pm.search(MODEL, H100, 16, framework="megatron", offload_layers=4, **SMALL)


def test_published_llama_405b_in_the_default_space_is_beaten():
    # Llama 3 (arXiv:2407.21783) Table 4 on 16,384 H100: predicted to fit, and the default space (every stack)
    # holds a plan at least as fast
    case = {c.label: c for c in read_published()}["llama3-405B-16384"]
    published = pm.predict(case.model, case.cluster, case.strategy)
    assert published.fits
    top = pm.search(case.model, case.cluster, case.strategy.global_batch, top_k=1)
    assert top["fits"].all() and top["step_time"].iloc[0] <= published.step_time
    assert top.attrs["evaluated"] + top.attrs["pruned"] > 350_000


_flag = FIXED_FIELDS["grad_reduce_fp32"]  # how search reads an optional flag's cell back (None or NaN: unset)


def test_an_overlap_row_is_the_prediction_of_its_strategy():
    df = pm.search(MODEL, H100, 16, framework="megatron", top_k=4000, **{k: v for k, v in SMALL.items() if k != "cp"})
    ub = df[df["tp_comm_overlap"] != ""]
    assert set(ub["tp_comm_overlap"]) == {"userbuffers", "userbuffers-nemo"}
    assert (ub["tp"] > 1).all() and ub["sequence_parallel"].all()
    picked = [ub[ub["tp_comm_overlap"] == "userbuffers"].head(2), ub[ub["tp_comm_overlap"] == "userbuffers-nemo"].head(2),
              df[df["tp_comm_overlap"] == ""].head(2)]
    for _, row in pd.concat(picked).iterrows():  # each row's searched stack fields read back into its Strategy
        s = strategy_of(row)
        assert s.tp_comm_overlap == (row["tp_comm_overlap"] or None)
        assert (s.grad_reduce_fp32, s.fp8_params) == (_flag(row["grad_reduce_fp32"]), bool(row["fp8_params"]))
        assert pm.predict(MODEL, H100, s).step_time == row["step_time"]
    assert {(_flag(g), bool(f)) for g, f in zip(df["grad_reduce_fp32"], df["fp8_params"])} == {
        (None, False), (False, False), (None, True), (False, True)}  # fp8 is searched, so fp8 parameters are
    none = pm.search(MODEL, H100, 16, framework="megatron", tp_comm_overlap=[None], top_k=5, max_micro_batch=2)
    assert set(none["tp_comm_overlap"]) == {""}
    with pytest.raises(pm.errors.InvalidInputError, match="tp_comm_overlap"):
        pm.search(MODEL, H100, 16, framework="torchtitan", tp_comm_overlap="userbuffers")


def test_a_zero_bubble_row_is_the_prediction_of_its_strategy():
    model = pm.transformer(layers=8, hidden=1024, heads=16, seq=1024, vocab=32000, name="eight")
    df = pm.search(model, H100, 32, framework="torchtitan", schedule=["zbv"], top_k=2000, max_micro_batch=2,
                   max_virtual_stages=2)
    assert set(df["schedule"]) == {"zbv"}  # a zero-bubble job prices only its own rows (no 1F1B without "interleaved")
    zbv = df[df["schedule"] == "zbv"]
    assert (zbv["virtual_stages"] == 2).all() and (zbv["micro_batches"] >= 2 * zbv["pp"] - 1).all()
    for _, row in zbv.head(3).iterrows():
        s = strategy_of(row)
        assert s.schedule == "zbv" and pm.predict(model, H100, s).step_time == row["step_time"]
    with pytest.raises(pm.InvalidInputError, match="rows without them run 1f1b, so '1f1b' is not a choice here"):
        pm.search(model, H100, 32, framework="torchtitan", schedule="1f1b")
    with pytest.raises(pm.errors.UnknownNameError, match="schedule"):
        pm.search(model, H100, 32, framework="torchtitan", schedule="looped")


def test_fp8_is_searched_only_with_the_stacks_that_have_fp8_linears():
    df = pm.search(MODEL, H100, 16, precision="fp8-mixed", top_k=5000, max_micro_batch=2, max_virtual_stages=2)
    assert set(df["framework"]) <= {"megatron", "torchtitan", "fsdp1"} and (df["precision"] == "fp8-mixed").all()
    both = pm.search(MODEL, H100, 16, precision=["bf16-mixed", "fp8-mixed"], framework=("pytorch", "megatron"),
                     top_k=5000, max_micro_batch=2, max_virtual_stages=2)
    assert set(both.loc[both["framework"] == "pytorch", "precision"]) == {"bf16-mixed"}
    with pytest.raises(pm.errors.UnsupportedError, match="fp8-mixed.*framework='pytorch'.*megatron, torchtitan"):
        pm.search(MODEL, H100, 16, precision="fp8-mixed", framework="pytorch")


def test_fixed_fields_hold_for_every_row_and_read_back():
    """search(fixed=...) holds Strategy fields search does not vary: the jobs whose stack or precision does not
    take them are left out, every row shows them, and each row is what pm.predict says of its Strategy."""
    fixed = {"grad_reduce_fp32": False, "optimizer_states": "remainders"}
    df = pm.search(MODEL, H100, 64, top_k=20, fixed=fixed, **SMALL)
    assert set(df["framework"]) == {"megatron"}  # the only stack with Megatron-Core's optimizer states
    assert (df["grad_reduce_fp32"] == False).all() and (df["optimizer_states"] == "remainders").all()  # noqa: E712
    plain = pm.search(MODEL, H100, 64, top_k=20, framework="megatron", fixed={"grad_reduce_fp32": True}, **SMALL)
    assert df["step_time"].iloc[0] <= plain["step_time"].iloc[0]  # bf16 gradients move half the bytes
    for _, row in df.head(4).iterrows():
        s = strategy_of(row)
        assert (s.grad_reduce_fp32, s.optimizer_states) == (False, "remainders")
        assert pm.predict(MODEL, H100, s).step_time == pytest.approx(row["step_time"], rel=1e-9)
    fp8 = pm.search(MODEL, H100, 64, top_k=5, framework="torchtitan", fixed={"fp8_params": True}, **SMALL)
    assert set(fp8["precision"]) == {"fp8-mixed"}  # the bf16 jobs do not take the float8 all-gather
    with pytest.raises(pm.UnknownNameError, match="unknown fixed field 'dp'"):
        pm.search(MODEL, H100, 64, fixed={"dp": 2}, **SMALL)
    with pytest.raises(pm.InvalidInputError, match="no job of the search takes fixed=.*grad_reduce_fp32"):
        pm.search(MODEL, H100, 64, framework="pytorch", fixed={"grad_reduce_fp32": False}, **SMALL)


@pytest.mark.parametrize("framework", ["torchtitan", "megatron", "pytorch", "deepspeed"])
def test_rows_of_a_model_with_wide_heads_and_qk_norms_are_what_predict_says(framework):
    """heads · head_dim above hidden and per-head q/k norms (Qwen3-4B's shape in small): search's vectorised rows
    price the same kernels and saved bytes as predict."""
    wide = pm.transformer(layers=4, hidden=640, heads=8, kv_heads=2, head_dim=128, qk_norm="head", seq=1024,
                          vocab=32000, activation="swiglu", norm="rmsnorm", position="rotary", bias=False)
    top = pm.search(wide, H100, 16, top_k=2, framework=framework, **SMALL)
    for _, row in top.iterrows():
        p = pm.predict(wide, H100, strategy_of(row))
        np.testing.assert_allclose([row["step_time"], row["peak_memory"]], [p.step_time, p.peak_memory], rtol=1e-9)
