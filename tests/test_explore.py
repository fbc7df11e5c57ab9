"""compare / sweep / search: the space, the rules, agreement with predict, errors, tables, plots, CLI."""

from __future__ import annotations

import json
from itertools import product

import numpy as np
import pandas as pd
import pytest

import perfmodel as pm
from perfmodel.cli import main
from perfmodel.core.errors import InfeasibleError, InvalidInputError, UnknownNameError
from perfmodel.explore import compare, parse_strategy, search, strategy_of, sweep
from perfmodel.explore.output import format_table, markdown, write_table
from perfmodel.explore.space import enumerate_space
from perfmodel.predict import BREAKDOWN_KEYS
from perfmodel.report.plots import alive_at_peak, save_figure, sweep_figure

SMALL = pm.transformer(layers=4, hidden=256, heads=4, seq=128, vocab=1024, name="small")


@pytest.fixture(scope="module")
def a100x8():
    return pm.cluster("dgx-a100-80gb", nodes=8)


@pytest.fixture(scope="module")
def l13b():
    return pm.preset("llama-2-13b")


@pytest.fixture(scope="module")
def found(l13b, a100x8):
    # the space of PyTorch and Megatron-LM alone, uncompiled, no offload, no userbuffers (the stack axes: below and
    # tests/test_search_stacks.py)
    return search(l13b, a100x8, 512, top_k=300_000, framework=("pytorch", "megatron"), compile=False,
                  offload_layers=0, tp_comm_overlap=[None])


# --- the space --------------------------------------------------------------------------------


def _brute_force(model, n_gpus, gpn, batch, max_mb, max_v, zeros):
    """The rules written out plainly, one configuration at a time (the reference)."""
    out = set()
    for tp, pp, mb, v, z, sp in product(range(1, n_gpus + 1), range(1, n_gpus + 1), range(1, max_mb + 1),
                                        range(1, max_v + 1), zeros, (False, True)):
        if n_gpus % (tp * pp) or tp > gpn:
            continue
        dp = n_gpus // (tp * pp)
        if (v > 1 and pp == 1) or (z > 0 and dp == 1) or (sp and tp == 1):
            continue  # equal to another configuration
        if model.heads % tp or model.kv_heads % tp or pp > model.layers:
            continue
        if v > 1 and model.layers % (pp * v) and (model.layers + 2) % (pp * v):  # embedding + loss as layers
            continue
        if batch % (dp * mb):
            continue
        if v > 1 and (batch // (dp * mb)) % pp:
            continue
        out.add((dp, tp, pp, v, mb, z, sp))
    return out


def test_space_matches_plain_enumeration():
    space = enumerate_space(SMALL, 8, 8, 16, max_micro_batch=4, max_virtual_stages=4, zero=(0, 3))
    a = space.arrays
    got = set(zip(*(a[k].tolist() for k in ("dp", "tp", "pp", "virtual_stages", "micro_batch", "zero",
                                             "sequence_parallel"))))
    assert got == _brute_force(SMALL, 8, 8, 16, 4, 4, (0, 3))
    assert len(got) == len(space)  # no duplicates
    assert np.all(a["dp"] * a["micro_batch"] * a["micro_batches"] == 16)


def test_space_counts_by_hand():
    # 2 GPUs, heads 4, layers 4, batch 2, micro-batch 1..2, no interleaving, ZeRO 0 only:
    # (tp, pp) = (1,1) dp 2, (1,2) dp 1, (2,1) dp 1 ; x mb {1, 2} ; x sp where tp = 2
    # (1,1): mb 1 ok (2 = 2*1*1), mb 2 breaks the batch rule (dp*mb = 4)
    # (1,2): mb 1, 2 ok; (2,1): mb 1, 2, each with sp False/True -> 4
    space = enumerate_space(SMALL, 2, 8, 2, max_micro_batch=2, max_virtual_stages=1, zero=(0,))
    assert len(space) == 1 + 2 + 4
    assert space.rejected == {"divisibility": 0, "batch": 1, "memory": 0}
    assert space.detail == {"global_batch=2 must be a multiple of dp × micro_batch": 1}


def test_tensor_groups_stay_in_a_node_unless_allowed():
    model = pm.transformer(layers=4, hidden=1024, heads=16, seq=128, vocab=1024)
    one = enumerate_space(model, 32, 8, 32, max_micro_batch=1)
    two = enumerate_space(model, 32, 8, 32, max_micro_batch=1, max_tp_nodes=2)
    assert one.arrays["tp"].max() == 8
    assert two.arrays["tp"].max() == 16


def _default_jobs(model):
    """(space, jobs priced over it) of the default space of ``model`` on 64 A100s (no fp8), by hand:
    per cp, DDP-like stacks (pytorch; deepspeed under its pipeline engine's rules, at cp = 1 only: its own
    attention is Megatron-DeepSpeed's unfused CoreAttention, no ring) without and Megatron-LM with and without overlapped
    tensor-parallel communication and gradient reduction, FSDP stacks (torchtitan, fsdp1) sharding
    all; pytorch and the FSDP stacks compiled or not, pytorch and Megatron-LM offloading 20 or all
    (Megatron: 39) of the 40 blocks at pp = 1 without recomputation; Megatron-LM's userbuffers (TE's and
    NeMo's tables) and compiled torchtitan's async TP again over tp > 1 with sequence parallelism; torchtitan's
    zero-bubble schedules. Megatron-LM and torchtitan each twice: fp32 and bf16 gradient reduction."""
    kw = dict(fsdp=(None, "full", "hybrid"), bucket_mib=(25.0, 100.0, 400.0), empty_ok=True)
    meg = dict(tp_overlap=(False, True), dp_overlap=(True, False))
    out = []
    for cp in (1, 2, 4, 8, 16):
        n = 64 // cp
        ddp, megatron = enumerate_space(model, n, 8, 512, cp=cp, **kw), enumerate_space(model, n, 8, 512, cp=cp, **meg, **kw)
        fsdp = enumerate_space(model, n, 8, 512, cp=cp, zero=(3,), **kw)
        ddp1 = enumerate_space(model, n, 8, 512, cp=cp, max_pp=1, **kw)
        megatron1 = enumerate_space(model, n, 8, 512, cp=cp, max_pp=1, **meg, **kw)
        deepspeed = enumerate_space(model, n, 8, 512, cp=cp, pipeline_engine=True, **kw)  # its pipeline engine's rules
        grads = 2  # Megatron-LM's and torchtitan's jobs at fp32 and at bf16 gradient reduction
        out += [(ddp, 2 * 3), (deepspeed, 3 if cp == 1 else 0), (ddp1, 2 * 2), (megatron, 3 * grads),
                (megatron1, 2 * grads), (fsdp, 2 * 4 * grads + 2 * 2)]
        tp_sp = dict(sequence_parallel=(True,), min_tp=2)  # an overlap of the tensor-parallel collectives
        out += [(enumerate_space(model, n, 8, 512, cp=cp, **meg, **kw, **tp_sp), 3 * 2 * grads),
                (enumerate_space(model, n, 8, 512, cp=cp, max_pp=1, **meg, **kw, **tp_sp), 2 * 2 * grads),
                (enumerate_space(model, n, 8, 512, cp=cp, zero=(3,), **kw, **tp_sp), 4 * grads)]
        for zb in ("interleaved-zb", "zbv", "dualpipev"):  # torchtitan's zero-bubble schedules: 8 jobs, 4 with async TP
            out += [(enumerate_space(model, n, 8, 512, cp=cp, zero=(3,), schedule=zb, **kw), 8 * grads),
                    (enumerate_space(model, n, 8, 512, cp=cp, zero=(3,), schedule=zb, **kw, **tp_sp), 4 * grads)]
    return out


def test_the_default_space_adds_up(l13b, a100x8):
    top = search(l13b, a100x8, 512, top_k=1)
    jobs = _default_jobs(l13b)
    assert top.attrs["evaluated"] + top.attrs["pruned"] == sum(len(sp) * n for sp, n in jobs)
    assert top.attrs["pruned"] > top.attrs["evaluated"]  # most jobs are bounded by their family's root
    r = top.attrs["rejected"]
    assert r["divisibility"] + r["batch"] == sum((sp.rejected["divisibility"] + sp.rejected["batch"]) * n
                                                 for sp, n in jobs)


def test_rejections_add_up(found, l13b, a100x8):
    # the default space: cp 1..16 (each divides 64 and seq 4096 / 2), PyTorch without and Megatron-LM with
    # and without overlapped tensor-parallel communication and gradient reduction, ZeRO 0-3 and FSDP full and
    # hybrid, buckets of 25, 100 and 400 MiB where gradients are bucketed
    spaces = [enumerate_space(l13b, 64 // cp, 8, 512, cp=cp, tp_overlap=overlap, fsdp=(None, "full", "hybrid"),
                              bucket_mib=(25.0, 100.0, 400.0), dp_overlap=(True, False) if megatron else (True,))
              for cp in (1, 2, 4, 8, 16) for megatron, overlap in ((False, (False,)), (True, (False, True)))]
    # recompute none / selective / full x one precision; Megatron-LM's at fp32 and bf16 gradient reduction
    combos = [3 * (1 + (i % 2)) for i in range(len(spaces))]
    r = found.attrs["rejected"]
    assert found.attrs["evaluated"] == sum(len(sp) * n for sp, n in zip(spaces, combos))
    assert set(found["cp"]) == {1, 2, 4, 8, 16} and set(found["framework"]) == {"pytorch", "megatron"}
    assert not (found["tp_overlap"] & (found["framework"] == "pytorch")).any()
    assert (found["tp_overlap"] & (found["framework"] == "megatron")).any()
    assert set(found["fsdp"].dropna()) == {"full", "hybrid"} and (found.loc[found["fsdp"].notna(), "zero"] == 3).all()
    assert set(found["bucket_mib"]) == {25.0, 100.0, 400.0}
    assert (found.loc[(found["zero"] == 3) | (found["dp"] == 1), "bucket_mib"] == 25.0).all()
    assert set(found.loc[found["framework"] == "pytorch", "dp_overlap"]) == {True}
    assert not found.loc[(found["framework"] == "megatron") & (found["zero"] < 3) & (found["dp"] > 1),
                         "dp_overlap"].all()
    assert r["divisibility"] + r["batch"] == sum((sp.rejected["divisibility"] + sp.rejected["batch"]) * n
                                                 for sp, n in zip(spaces, combos))
    assert r["memory"] == found.attrs["evaluated"] - found.attrs["feasible"] > 0
    assert sum(found.attrs["rejected_detail"].values()) == r["divisibility"] + r["batch"]


# --- search ----------------------------------------------------------------------------------


def test_search_ranks_fitting_configurations(found):
    assert found["fits"].all()
    tps = found["tokens_per_second"].to_numpy()
    assert np.all(np.diff(tps) <= 0)
    assert set(found["schedule"]) <= {"1f1b", "interleaved"}
    assert ((found["virtual_stages"] > 1) == (found["schedule"] == "interleaved")).all()
    assert (found["dp"] * found["tp"] * found["pp"] * found["cp"] == 64).all()
    assert found.attrs["sort_by"] == "tokens_per_second"


def test_search_agrees_with_predict_exactly(found, l13b, a100x8):
    # one row of each (recompute, zero) pair, an interleaved and a sequence-parallel pipeline, then evenly spread rows
    picked = list(found.groupby(["recompute", "zero"]).head(1).index)
    picked.append(found.index[found["virtual_stages"] > 1][0])
    picked.append(found.index[found["sequence_parallel"] & (found["pp"] > 1)][0])
    picked += [found.index[found["fsdp"] == mode][0] for mode in ("full", "hybrid")]
    picked.append(found.index[found["tp_overlap"] & (found["cp"] > 1)][0])
    picked += [found.index[found["bucket_mib"] == b][0] for b in (100.0, 400.0)]
    picked.append(found.index[~found["dp_overlap"].astype(bool)][0])
    picked += [i for i in np.linspace(0, len(found) - 1, 20).astype(int) if i not in picked][: 20 - len(picked)]
    rows = found.loc[picked]
    assert len(rows) == 20 and rows["recompute"].nunique() == 3 and rows["zero"].nunique() == 4
    assert (rows["virtual_stages"] > 1).any() and rows["sequence_parallel"].any()
    assert rows["bucket_mib"].nunique() == 3 and not rows["dp_overlap"].all()
    for _, row in rows.iterrows():
        p = pm.predict(l13b, a100x8, strategy_of(row))
        np.testing.assert_allclose(row["step_time"], p.step_time, rtol=1e-12)
        np.testing.assert_allclose(row["peak_memory"], p.peak_memory, rtol=1e-12)
        np.testing.assert_allclose(row["tokens_per_second"], p.tokens_per_second, rtol=1e-12)
        np.testing.assert_allclose([row[k] for k in BREAKDOWN_KEYS], [p.breakdown[k] for k in BREAKDOWN_KEYS],
                                   rtol=1e-12, atol=1e-15)
        assert row["bottleneck"] == p.bottleneck


def test_search_holds_the_software_stack_and_rows_carry_it(l13b, a100x8):
    stack = {"framework": "megatron", "attention": "unfused", "tp_overlap": True, "dp_overlap": False}
    top = search(l13b, a100x8, 512, top_k=5, **stack)
    for k, v in stack.items():
        assert (top[k] == v).all()
    for _, row in top.iterrows():
        s = strategy_of(row)
        assert (s.framework, s.attention, s.tp_overlap, s.dp_overlap) == tuple(stack.values())
        np.testing.assert_allclose(row["step_time"], pm.predict(l13b, a100x8, s).step_time, rtol=1e-12)
    eager = search(l13b, a100x8, 512, top_k=1, framework="pytorch", cp=1)
    assert eager["step_time"].iloc[0] != top["step_time"].iloc[0]
    with pytest.raises(pm.PerfModelError, match="framework 'jax'"):
        search(l13b, a100x8, 512, framework="jax")


def test_search_with_context_parallelism_fills_the_rest_of_the_gpus(l13b, a100x8):
    top = search(l13b, a100x8, 256, top_k=4, cp=2, framework="megatron")
    assert (top["cp"] == 2).all() and (top["dp"] * top["tp"] * top["pp"] * 2 == 64).all()
    for _, row in top.iterrows():
        s = strategy_of(row)
        assert s.cp == 2
        np.testing.assert_allclose(row["step_time"], pm.predict(l13b, a100x8, s).step_time, rtol=1e-12)
    with pytest.raises(pm.InvalidInputError, match="'cp'=3 must divide the GPU count 64"):
        search(l13b, a100x8, 256, cp=3)


def test_search_with_expert_parallelism_keeps_the_rows_ep_divides(a100x8):
    moe = pm.transformer(4, 2048, 16, 1024, 32000, ffn_hidden=5632, activation="swiglu", norm="rmsnorm",
                         bias=False, position="rotary", experts=8, experts_per_token=2)
    top = search(moe, a100x8, 256, top_k=5, ep=8, framework="megatron")
    assert (top["ep"] == 8).all() and (top["dp"] % 8 == 0).all()
    assert (~((top["tp"] > 1) & ~top["sequence_parallel"])).all()
    assert top.attrs["rejected_detail"]["ep=8 must divide dp × cp"] > 0
    for _, row in top.iterrows():
        np.testing.assert_allclose(row["step_time"], pm.predict(moe, a100x8, strategy_of(row)).step_time, rtol=1e-12)
    with pytest.raises(pm.InvalidInputError, match="mixture-of-experts"):
        search(pm.preset("llama-2-7b"), a100x8, 256, ep=2)


def test_search_top_k_and_other_sort(l13b, a100x8):
    top = search(l13b, a100x8, 512, top_k=3, sort_by="peak_memory", recompute="full", zero=(3,))
    assert len(top) == 3
    assert np.all(np.diff(top["peak_memory"].to_numpy()) >= 0)
    assert set(top["recompute"]) == {"full"} and set(top["zero"]) <= {0, 3}


def test_search_prices_rank_by_cost_across_clusters(l13b):
    clusters = [pm.cluster("dgx-a100-80gb", nodes=2), pm.cluster("dgx-h100", nodes=2)]
    prices = {"a100-sxm4-80gb": 1.0, "h100-sxm5-80gb": 100.0}
    df = search(l13b, clusters, 64, top_k=5, prices=prices, cp=1, framework="pytorch")
    assert df.attrs["sort_by"] == "usd_per_million_tokens"
    assert np.all(np.diff(df["usd_per_million_tokens"].to_numpy()) >= 0)
    row = df.iloc[0]
    assert row["cluster"] == "2x dgx-a100-80gb"  # 100x the price per GPU-hour loses
    # $/M tokens = $/GPU-hour x GPUs / 3600 s / (tokens/s) x 1e6
    assert row["usd_per_million_tokens"] == pytest.approx(1.0 * 16 / 3600 / row["tokens_per_second"] * 1e6)


def test_unknown_sort_column_lists_valid_ones(l13b, a100x8):
    with pytest.raises(UnknownNameError, match=r"unknown sort column 'speed'.*known: .*tokens_per_second"):
        search(l13b, a100x8, 512, sort_by="speed")
    with pytest.raises(UnknownNameError, match="unknown sort column 'usd_per_million_tokens'"):
        search(l13b, a100x8, 512, sort_by="usd_per_million_tokens")  # cost needs prices


def test_infeasible_batch_names_the_rule(a100x8):
    # heads 4 and 4 layers: tp <= 4 and pp <= 4 leave dp >= 4 on 64 GPUs, too many for 2 sequences
    with pytest.raises(InfeasibleError, match=r"64 GPUs is left after the batch rules \(the last, 'global_batch=2 "
                                              r"must be a multiple of dp × micro_batch', emptied it\).*"
                                              r"dp candidates: 4, 8, 16, 32, 64\)"):
        search(SMALL, a100x8, 2, cp=1)  # with cp = 16 four GPUs would hold dp = 1


def test_infeasible_memory_names_the_smallest(a100x8):
    with pytest.raises(InfeasibleError, match=r"no configuration fits in memory: all [\d,]+ .*need more than "
                                              r"80 GiB on dgx-a100-80gb; the smallest needs [\d.]+ GiB per GPU \(dp=.*\); "
                                              r"try more GPUs or GPUs with more memory$"):
        search(pm.preset("llama-3-70b"), pm.cluster("dgx-a100-80gb", nodes=1), 8)


def test_search_option_errors(l13b, a100x8):
    with pytest.raises(InvalidInputError, match="'zero' must list at least one value"):
        search(l13b, a100x8, 512, zero=())
    with pytest.raises(InvalidInputError, match=r"'zero' has invalid values \[4\]"):
        search(l13b, a100x8, 512, zero=(0, 4))
    with pytest.raises(UnknownNameError, match="unknown recompute 'some'"):
        search(l13b, a100x8, 512, recompute=("some",))
    with pytest.raises(pm.UnsupportedError, match="a100-sxm4-80gb has no fp8 support"):
        search(l13b, a100x8, 512, precision=("fp8-mixed",))


# --- compare ---------------------------------------------------------------------------------


def test_parse_strategy_forms():
    s = parse_strategy("tp=4,pp=2,mb=1,sp=true,v=2", 64, global_batch=512)
    assert (s.dp, s.tp, s.pp, s.micro_batch, s.virtual_stages, s.schedule) == (8, 4, 2, 1, 2, "interleaved")
    assert s.sequence_parallel and s.global_batch == 512
    assert parse_strategy({"dp": 64, "zero": 3}, 64).zero == 3
    with pytest.raises(UnknownNameError, match="unknown strategy field 'tensor'"):
        parse_strategy("tensor=2", 8)
    with pytest.raises(InvalidInputError, match=r"tp × pp × cp = 3 × 1 × 1 must divide the cluster's 8 GPUs"):
        parse_strategy("tp=3", 8)
    assert parse_strategy("cp=2", 8).dp == 4  # dp fills in the GPUs tp × pp × cp leave
    assert parse_strategy("pp=2,stage_layers=5/7", 2).stage_layers == (5, 7)  # commas separate the items
    assert pm.Strategy(pp=2, stage_layers="5,7").stage_layers == (5, 7)
    with pytest.raises(InvalidInputError, match="'tp' must be an integer >= 1: got 0"):
        parse_strategy("tp=0", 8)
    with pytest.raises(InvalidInputError, match="'virtual_stages' must be an integer >= 1: got None"):
        parse_strategy({"virtual_stages": None}, 8)
    with pytest.raises(InvalidInputError, match="must read key=value"):
        parse_strategy("tp4", 8)


def test_compare_rows_and_best(l13b, a100x8):
    df = compare(l13b, a100x8, ["dp=64,mb=1", "dp=64,mb=1,zero=3", "tp=8,mb=1", pm.Strategy(dp=16, tp=4, micro_batch=1,
                                                                                          global_batch=512)],
                 defaults={"global_batch": 512})
    assert list(df["label"][:3]) == ["dp=64,mb=1", "dp=64,mb=1,zero=3", "tp=8,mb=1"]
    assert not df.loc[0, "fits"]  # plain DDP keeps 16 B/param of a 13B model on every GPU
    best = df[df["best"]]
    assert len(best) == 1
    assert best["tokens_per_second"].iloc[0] == df.loc[df["fits"], "tokens_per_second"].max()
    p = pm.predict(l13b, a100x8, pm.Strategy(dp=8, tp=8, micro_batch=1, global_batch=512))
    assert df.loc[2, "step_time"] == p.step_time and df.loc[2, "bottleneck"] == p.bottleneck


def test_compare_error_names_the_strategy(l13b, a100x8):
    with pytest.raises(InvalidInputError, match=r"strategy 'tp=8,pp=2,mb=3': 'global_batch'=512 must be a multiple"):
        compare(l13b, a100x8, ["tp=8,mb=1", "tp=8,pp=2,mb=3"], defaults={"global_batch": 512})


# --- sweep -----------------------------------------------------------------------------------


def test_sweep_nodes_weak_and_strong(l13b, a100x8):
    s = pm.Strategy(dp=8, tp=8, micro_batch=1, global_batch=32)
    weak = sweep(l13b, "nodes", [1, 2, 4], cluster=a100x8, strategy=s)
    assert list(weak["gpus"]) == [8, 16, 32]
    assert list(weak["dp"]) == [1, 2, 4]
    assert list(weak["global_batch"]) == [4, 8, 16]  # 4 micro-batches of 1 per data-parallel rank kept
    strong = sweep(l13b, "nodes", [1, 2, 4], cluster=a100x8, strategy=s, scaling="strong")
    assert list(strong["global_batch"]) == [32, 32, 32]
    base = strong.index[strong["fits"]][0]
    assert strong.loc[base, "scaling_efficiency"] == 1.0
    eff = strong["tokens_per_second"] / strong["gpus"] / (strong.loc[base, "tokens_per_second"] / strong.loc[base, "gpus"])
    np.testing.assert_allclose(strong["scaling_efficiency"], eff)


def test_sweep_other_axes(l13b):
    h = pm.cluster("h100")
    seq = sweep(l13b, "seq", [1024, 2048], cluster=h, strategy=pm.Strategy(micro_batch=1))
    assert list(seq["seq"]) == [1024, 2048] and seq["step_time"].is_monotonic_increasing
    assert "scaling_efficiency" not in seq
    gpus = sweep(SMALL, "gpu", ["a100-sxm4-80gb", "h100-sxm5-80gb"], cluster=pm.cluster("h100"))
    assert list(gpus["gpu"]) == ["a100-sxm4-80gb", "h100-sxm5-80gb"]
    own = sweep(SMALL, "gpu", ["v100", "h100"], cluster=h, own_precision=True)
    assert list(own["precision"]) == ["fp16-mixed", "bf16-mixed"]
    with pytest.raises(InvalidInputError, match="'own_precision' applies to a sweep over 'gpu' only"):
        sweep(SMALL, "seq", [1024], cluster=h, own_precision=True)
    rec = sweep(SMALL, "recompute", ["none", "full"], cluster=h)
    assert rec.loc[1, "step_time"] > rec.loc[0, "step_time"] and rec.loc[1, "peak_memory"] < rec.loc[0, "peak_memory"]


def test_sweep_context_parallel_size_keeps_the_gpus_and_the_batch(l13b, a100x8):
    cps = sweep(l13b, "cp", [1, 2, 4], cluster=a100x8, strategy=pm.Strategy(dp=64, micro_batch=1, global_batch=64))
    assert list(cps["dp"]) == [64, 32, 16] and (cps["gpus"] == 64).all() and (cps["global_batch"] == 64).all()
    assert cps["mem_activations"].is_monotonic_decreasing  # s/cp tokens per rank
    nodes = sweep(l13b, "nodes", [4, 8], cluster=a100x8, strategy=pm.Strategy(dp=32, cp=2, micro_batch=1))
    assert list(nodes["dp"]) == [16, 32] and nodes["label"].str.endswith("cp=2").all()


def test_sweep_errors(l13b, a100x8):
    with pytest.raises(InvalidInputError, match=r"sweep over nodes=1: tp × pp = 32 must divide the GPU count 8"):
        sweep(l13b, "nodes", [1, 4], cluster=a100x8, strategy=pm.Strategy(dp=2, tp=8, pp=4))
    with pytest.raises(UnknownNameError, match="unknown over 'speed'"):
        sweep(l13b, "speed", [1], cluster=a100x8)
    with pytest.raises(InvalidInputError, match="'gpus'=12 must be below or a multiple of gpus_per_node=8"):
        sweep(SMALL, "gpus", [12], cluster=a100x8, strategy=pm.Strategy(dp=64, micro_batch=1))


# --- tables, files, plots ------------------------------------------------------------------------


def test_tables_and_files(found, tmp_path):
    top = found.head(3).copy()
    top["best"] = [True, False, False]
    text = format_table(top, ("dp", "tp", "pp", "step_time", "tokens_per_second", "mfu", "peak_memory", "fits"))
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["dp", "tp", "pp"] and lines[2].startswith("*") and len(lines) == 5
    assert len({len(line) for line in lines[:2]}) == 1  # header and rule aligned
    assert "GiB" in lines[2] and "%" in lines[2]
    md = markdown(top)
    assert md.splitlines()[1].startswith("|---|") and md.count("\n") == 7  # head, rule, 3 rows, blank, note
    assert "executed FLOPs" in md.splitlines()[-1] and "e+" not in md  # no scientific notation
    for suffix in (".csv", ".json", ".md"):
        write_table(top, tmp_path / f"t{suffix}")
    assert pd.read_csv(tmp_path / "t.csv")["dp"].tolist() == top["dp"].tolist()
    data = json.loads((tmp_path / "t.json").read_text())
    assert len(data["rows"]) == 3 and data["meta"]["rejected"]["memory"] > 0
    with pytest.raises(InvalidInputError, match=r"'--out' must end in one of .csv, .json, .md"):
        write_table(top, tmp_path / "t.xlsx")


def test_memory_stack_sums_to_peak(found):
    alive = alive_at_peak(found)
    np.testing.assert_allclose(sum(alive.values()), found["peak_memory"], rtol=1e-9)


def test_sweep_figure_axes(l13b, a100x8, tmp_path):
    s = pm.Strategy(dp=8, tp=8, micro_batch=1, global_batch=32)
    fig = sweep_figure(sweep(l13b, "nodes", [1, 2], cluster=a100x8, strategy=s))
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels == ["throughput (tokens/s)", "scaling efficiency (%)", "time per step (s)",
                      "memory per GPU at its peak (GiB)"]
    assert all(ax.get_xlabel() == "GPUs" for ax in fig.axes)
    path = save_figure(fig, tmp_path / "s.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(InvalidInputError, match=r"'--plot' must end in one of .png, .svg, .pdf"):
        save_figure(fig, tmp_path / "s.gif")


# --- command line ------------------------------------------------------------------------------


def test_cli_compare_search_sweep(tmp_path, capsys):
    args = ["--model", "llama-2-13b", "--gpu", "dgx-a100-80gb", "--nodes", "8"]
    assert main(["compare", *args, "--global-batch", "512", "--strategies", "dp=64,mb=1,zero=3", "tp=8,mb=1",
                 "--out", str(tmp_path / "c.md")]) == 0
    out = capsys.readouterr().out
    assert "* = fastest that fits" in out and "\n*  dp=64,mb=1,zero=3" in out
    assert (tmp_path / "c.md").read_text().startswith("| model | cluster | gpu | strategy |")
    assert main(["search", *args, "--global-batch", "512", "--top-k", "3", "--recompute", "full",
                 "--framework", "megatron", "--tp-overlap", "--out", str(tmp_path / "s.csv")]) == 0
    out = capsys.readouterr().out
    assert "configurations evaluated" in out and "rejected: divisibility" in out
    written = pd.read_csv(tmp_path / "s.csv")
    assert len(written) == 3 and (written["framework"] == "megatron").all() and written["tp_overlap"].all()
    assert main(["search", "--model", "llama-3-8b", "--gpu", "dgx-h100", "--nodes", "2", "--global-batch", "64",
                 "--top-k", "2", "--framework", "torchtitan", "--schedules", "zbv", "--tp-comm-overlap", "none",
                 "--out", str(tmp_path / "z.csv")]) == 0
    written = pd.read_csv(tmp_path / "z.csv", keep_default_na=False)
    assert (written["schedule"] == "zbv").all() and (written["tp_comm_overlap"] == "").all()
    assert main(["sweep", *args, "--over", "nodes", "--values", "1", "2", "--tp", "8", "--micro-batch", "1",
                 "--global-batch", "32", "--scaling", "strong", "--plot", str(tmp_path / "w.svg")]) == 0
    assert (tmp_path / "w.svg").read_text().lstrip().startswith("<?xml")


def test_cli_search_tries_the_frameworks_pm_search_does(tmp_path, capsys):
    args = ["search", "--model", "llama-3-8b", "--gpu", "dgx-h100", "--global-batch", "64", "--top-k", "400"]
    assert main([*args, "--out", str(tmp_path / "all.csv")]) == 0
    everything = pd.read_csv(tmp_path / "all.csv", keep_default_na=False)
    assert {"megatron", "torchtitan"} <= set(everything["framework"]) and everything["compile"].any()
    assert main([*args, "--framework", "megatron,pytorch", "--no-compile", "--out", str(tmp_path / "two.csv")]) == 0
    two = pd.read_csv(tmp_path / "two.csv", keep_default_na=False)
    assert set(two["framework"]) <= {"megatron", "pytorch"} and not two["compile"].any()
    assert main([*args, "--framework", "megatron", "--compile"]) == 2  # no compiled job: an error on one line
    capsys.readouterr()


def test_cli_errors_are_one_line(capsys):
    code = main(["search", "--model", "llama-2-13b", "--gpu", "dgx-a100-80gb", "--global-batch", "64",
                 "--sort-by", "fast"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("perfmodel: error: unknown sort column 'fast'") and err.count("\n") == 1
    for bad, said in (("dp=2", "--fixed takes FIELD=VALUE items"), ("fp8_params=maybe", "takes true or false")):
        code = main(["search", "--model", "llama-2-13b", "--gpu", "dgx-a100-80gb", "--global-batch", "64",
                     "--fixed", bad])
        err = capsys.readouterr().err
        assert code == 2 and said in err and err.count("\n") == 1


def test_cli_search_holds_fixed_fields(tmp_path, capsys):
    assert main(["search", "--model", "llama-2-7b", "--gpu", "dgx-h100", "--global-batch", "64", "--top-k", "2",
                 "--framework", "megatron", "--fixed", "grad_reduce_fp32=false,optimizer_states=remainders",
                 "--out", str(tmp_path / "f.csv")]) == 0
    written = pd.read_csv(tmp_path / "f.csv")
    assert (~written["grad_reduce_fp32"]).all() and (written["optimizer_states"] == "remainders").all()


def test_strategies_file(tmp_path, capsys):
    (tmp_path / "s.toml").write_text('[fsdp]\ndp = 8\nzero = 3\nmicro_batch = 1\n\n[tp8]\ntp = 8\nmicro_batch = 1\n')
    assert main(["compare", "--model", "llama-2-7b", "--gpu", "dgx-a100-80gb", "--strategies",
                 str(tmp_path / "s.toml")]) == 0
    out = capsys.readouterr().out
    assert "fsdp" in out and "tp8" in out


@pytest.mark.parametrize("call, message", [
    (lambda: pm.sweep("gpt2-small", "seq", [1.5]), "sweep over seq=1.5: 'seq' must be an integer >= 1: got 1.5"),
    (lambda: pm.sweep("gpt2-small", "nodes", ["abc"]), "'nodes' must be an integer >= 1: got 'abc'"),
    (lambda: pm.sweep("gpt2-small", "nodes", "12"), "'values' must be a list of values to sweep over: got '12'"),
    (lambda: pm.sweep("gpt2-small", "nodes", [1], cluster=5), "'cluster' must be a Cluster (pm.cluster) or its name"),
    (lambda: pm.sweep("gpt2-small", "nodes", [1], strategy={"dp": 1}), "'strategy' must be a pm.Strategy"),
    (lambda: pm.compare("gpt2-small", "h200", None), "'strategies' must be a list of strategies"),
    (lambda: pm.search("gpt2-small", "h200", 8, prices=float("nan")), "'prices' must be a finite number: got nan"),
    (lambda: pm.search("gpt2-small", "h200", 8, prices=-3), "'prices' must be > 0: got -3"),
    (lambda: pm.search("gpt2-small", "h200", 8, prices={"h200-sxm-141gb": 0}), "prices['h200-sxm-141gb']\" must be > 0"),
])
def test_explore_arguments_are_checked(call, message):
    with pytest.raises(pm.PerfModelError) as err:
        call()
    assert message in str(err.value)


def test_search_keeps_a_traced_graph_data_parallel():
    top = pm.search("resnet50", pm.cluster("h200", gpus_per_node=4), 128, top_k=50)
    assert len(top) and (top.tp == 1).all() and (top.pp == 1).all() and not top.sequence_parallel.any()
    assert (top.dp == 4).all()


def test_sweeping_virtual_stages_interleaves_the_schedule():
    df = pm.sweep("gpt2-small", "virtual_stages", [1, 2], cluster=pm.cluster("h200", gpus_per_node=2),
                  strategy=pm.Strategy(pp=2, micro_batch=1, global_batch=8))
    assert list(df.schedule) == ["1f1b", "interleaved"] and df.step_time.iloc[1] < df.step_time.iloc[0]


def test_a_search_row_names_its_stack_in_a_few_words():
    from perfmodel.explore.output import stack_label

    assert stack_label({"framework": "megatron", "precision": "fp8-mixed", "tp_comm_overlap": "userbuffers",
                        "cp": 2}) == "megatron fp8 userbuffers cp2"
    assert stack_label({"framework": "torchtitan", "precision": "bf16-mixed", "compile": True, "fsdp": "full",
                        "tp_comm_overlap": "", "schedule": "zbv", "offload_layers": 0}) == \
        "torchtitan compile fsdp-full zbv"
    assert stack_label({"framework": "pytorch", "precision": "bf16-mixed", "fsdp": float("nan"),
                        "schedule": "interleaved", "offload_layers": 4}) == "pytorch offload4"
    # the fields search(fixed=...) holds, where a row carries them
    assert stack_label({"framework": "megatron", "precision": "fp8-mixed", "grad_reduce_fp32": False,
                        "optimizer_states": "remainders", "fp8_params": True, "float8_recipe": "delayed"}) == \
        "megatron fp8 grad-bf16 states-remainders fp8-params"
    assert stack_label({"framework": "torchtitan", "precision": "fp8-mixed", "float8_recipe": "rowwise",
                        "grad_reduce_fp32": float("nan")}) == "torchtitan fp8 rowwise"
    # a MoE row's expert options where set (None, NaN: the stack's default)
    assert stack_label({"framework": "megatron", "etp": 1.0, "grouped_experts": np.True_}) == \
        "megatron etp1 grouped-experts"
    assert stack_label({"framework": "torchtitan", "etp": float("nan"), "grouped_experts": False}) == \
        "torchtitan looped-experts"
    assert stack_label({"framework": "megatron", "etp": None, "grouped_experts": None}) == "megatron"


def test_search_tries_the_mixed_precision_the_gpu_has():
    # a V100 or T4 has no bf16 tensor cores, a K80 no 16-bit rate: the default space is what each runs
    for gpu, expected in (("v100", "fp16-mixed"), ("t4", "fp16-mixed"), ("k80", "fp32"), ("a100", "bf16-mixed")):
        df = pm.search("gpt2-small", pm.cluster(gpu), global_batch=64, top_k=3)
        assert set(df["precision"]) == {expected}
    # asked for, bf16 on a V100 is still refused by name
    with pytest.raises(pm.UnsupportedError, match="drop \\['bf16-mixed'\\] from 'precision'"):
        pm.search("gpt2-small", pm.cluster("v100"), global_batch=64, precision="bf16-mixed")


def test_the_command_line_takes_every_checkpointing_policy_and_fsdp_mode_the_api_does(tmp_path, capsys):
    # compare's --recompute had three choices and predict's --fsdp two, where Strategy takes more
    out = tmp_path / "rows.csv"
    assert main(["compare", "--model", "llama-3-8b", "--gpu", "dgx-h100", "--micro-batch", "1", "--recompute",
                 "selective-op", "--strategies", "framework=torchtitan,fsdp=full", "--out", str(out)]) == 0
    assert pd.read_csv(out)["recompute"].tolist() == ["selective-op"]
    assert main(["compare", "--model", "llama-3-8b", "--gpu", "dgx-h100", "--micro-batch", "1", "--recompute",
                 "selective-op", "--strategies", "framework=megatron,tp=8"]) != 0
    assert "stacks that take it: torchtitan" in capsys.readouterr().err
    assert main(["predict", "--model", "llama-2-7b", "--gpu", "dgx-a100-80gb", "--framework", "fsdp1", "--fsdp",
                 "shard-grad-op", "--micro-batch", "2"]) == 0
    assert "fsdp=shard-grad-op" in capsys.readouterr().out
