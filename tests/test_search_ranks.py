"""Where a published run's plan ranks in ``pm.search`` (``perfmodel/validate/search_ranks.py``)."""

from __future__ import annotations

import pandas as pd

import perfmodel as pm
from perfmodel.validate.runs import published_cases
from perfmodel.validate.search_ranks import _rank, rank_case, space_gaps


def test_the_rank_counts_the_plans_strictly_faster_and_says_when_it_is_past_the_rows_kept():
    top = pd.DataFrame({"step_time": [1.0, 2.0, 2.0, 3.0]})
    assert _rank(top, 2.0, 4) == "2"      # one plan faster; the ties do not push it down
    assert _rank(top, 0.5, 4) == "1"
    assert _rank(top, 9.0, 4) == ">4"     # all four kept rows are faster: its place is unknown past them


def test_the_gaps_name_the_published_options_the_default_space_does_not_try():
    s = pm.Strategy(dp=4, tp=8, micro_batch=16, global_batch=64, framework="megatron", sequence_parallel=True,
                    tp_comm_overlap="userbuffers-nemo", grad_reduce_fp32=False)
    assert space_gaps(s) == ("micro_batch=16 > 8",)  # NeMo's userbuffers and bf16 gradients are searched
    # ... under the stacks whose default space has them: fp32 reduction under FSDP1 (bf16 by default) is not
    assert space_gaps(pm.Strategy(dp=4, global_batch=64, framework="fsdp1", grad_reduce_fp32=True)) == \
        ("grad_reduce_fp32=True",)
    fp8 = dict(dp=4, global_batch=64, precision="fp8-mixed", fp8_params=True)
    assert space_gaps(pm.Strategy(framework="megatron", zero=1, **fp8)) == ()
    assert space_gaps(pm.Strategy(framework="torchtitan", **fp8)) == ()
    assert space_gaps(pm.Strategy(dp=4, global_batch=64, framework="megatron", attention="unfused")) == \
        ("attention='unfused'",)
    assert space_gaps(pm.Strategy(dp=4, tp=2, pp=2, micro_batch=2, global_batch=64, zero=1,
                                  framework="megatron", sequence_parallel=True)) == ()
    # optimizer_states="fp32" is what leaving it unset prices (Megatron's fp32 main params and moments)
    assert space_gaps(pm.Strategy(dp=4, global_batch=64, zero=1, framework="megatron", optimizer_states="fp32")) == ()
    assert space_gaps(pm.Strategy(dp=4, global_batch=64, zero=1, framework="megatron", optimizer_states="bf16")) == \
        ("optimizer_states='bf16'",)


def test_nemotron4_340b_as_published_fits_and_its_step_is_near_the_best_of_its_precisions_search():
    # Nemotron-4 340B on 3,072 H100 (published_check_runs.csv): the plan that ran is predicted to fit, the search
    # at its own precision finds one at least as fast, and the published plan is priced within 10% of that best
    # (its rank counts the many near-equal ZeRO-3 variants ahead of it: 37 with the H100's carried bf16 curve)
    case = {c.label: c for _, c in published_cases()}["nemotron4-340B-3072"]
    r = rank_case(case, top_k=10, whole_space=False)
    assert r.fits and r.best_same_precision_s <= r.published_s <= 1.10 * r.best_same_precision_s
    assert r.gaps == ()  # TE userbuffers, its overlap, is in the default space


def test_the_own_stack_space_holds_the_published_plan():
    """like_space: the published stack and settings held (fixed fields included), the layout searched, the
    bounds raised to the plan's own micro-batch and virtual stages: the plan is one of its rows."""
    from perfmodel.validate.search_ranks import like_space

    m = pm.transformer(layers=8, hidden=1024, heads=16, seq=1024, vocab=32000, name="small")
    c = pm.cluster("dgx-h100")
    s = pm.Strategy(dp=2, tp=2, pp=2, micro_batch=1, global_batch=32, zero=1, framework="megatron",
                    sequence_parallel=True, schedule="interleaved", virtual_stages=2, grad_reduce_fp32=False,
                    optimizer_states="remainders")
    kw, gaps = like_space(s)
    # fp8 parameters and the MoE options: fields the default space varies under Megatron-LM, held at the plan's
    # own values (off; unset: etp = tp, one GEMM per expert)
    assert gaps == () and kw["fixed"] == {"grad_reduce_fp32": False, "optimizer_states": "remainders",
                                          "fp8_params": False, "etp": None, "grouped_experts": None}
    assert kw["zero"] == (1,) and kw["cp"] == (1,) and kw["max_virtual_stages"] == 16
    df = pm.search(m, c, 32, top_k=5000, **kw)
    mine = df[(df.dp == 2) & (df.tp == 2) & (df.pp == 2) & (df.virtual_stages == 2) & (df.micro_batch == 1)]
    step = pm.predict(m, c, s).step_time
    assert any(abs(t / step - 1) < 1e-9 for t in mine["step_time"])
