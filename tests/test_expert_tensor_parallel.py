"""Expert tensor parallelism (Megatron-Core --expert-tensor-parallel-size, parallel folding): each expert's linears
split over etp ranks instead of tp, the ep x etp expert grid folded over a stage's tp x cp x dp ranks."""

import dataclasses

import pytest

import perfmodel as pm
from perfmodel.explore.search import strategy_of
from perfmodel.parallel.config import StepConfig
from perfmodel.parallel.placement import layout
from perfmodel.step import param_counts
from perfmodel.workload.kernels import layer_kernels

MOE = pm.transformer(layers=4, hidden=1024, heads=8, seq=1024, vocab=32000, activation="swiglu", norm="rmsnorm",
                     bias=False, position="rotary", ffn_hidden=512, experts=8, experts_per_token=2)
NODE = pm.cluster("dgx-h100", nodes=2)  # 16 GPUs


def _megatron(**kw):
    base = dict(framework="megatron", tp=2, pp=1, sequence_parallel=True, micro_batch=1, global_batch=32)
    return pm.Strategy(**{**base, **kw})


def test_etp_unset_or_equal_to_tp_prices_the_same():
    unset = pm.predict(MOE, NODE, _megatron(ep=4))
    same = pm.predict(MOE, NODE, _megatron(ep=4, etp=2))
    assert same.step_time == pytest.approx(unset.step_time)
    assert same.peak_memory == pytest.approx(unset.peak_memory)
    assert _megatron(ep=4).expert_tp == 2 and _megatron(ep=4, etp=1).expert_tp == 1


def test_an_expert_split_over_etp_ranks_sees_etp_over_tp_of_the_gathered_tokens_at_full_width():
    tokens, k = 2 * MOE.seq, MOE.experts_per_token
    for ep, etp in ((1, 1), (4, 1), (4, 2)):
        fwd, _ = layer_kernels(MOE, 2, tp=2, sp=True, ep=ep, etp=etp)
        fc1 = [x for x in fwd if x.name == "moe.expert.fc1"]
        assert len(fc1) == 1 and fc1[0].count == MOE.experts // ep
        # m: the expert's rows, tokens · top_k · ep / experts gathered over etp of the tp sequence shards
        assert fc1[0].size["m"] == pytest.approx(tokens * k * ep / MOE.experts * etp / 2)
        assert fc1[0].size["n"] == pytest.approx(2 * 512 / etp)  # gate and up, split over etp
        # the rank's routed FLOPs are the same whatever etp: tokens · top_k / tp of whole experts
        routed = sum(x.flops * x.count for x in fwd if x.cls == "gemm" and x.name.startswith("moe.expert."))
        assert routed == pytest.approx(2 * tokens * k * 3 * 1024 * 512 / 2)


def test_a_rank_holds_its_experts_over_etp_and_shards_their_states_over_the_expert_data_parallel_ranks():
    s = pm.Strategy(framework="megatron", tp=2, dp=8, ep=4, etp=1, sequence_parallel=True, micro_batch=1, zero=1)
    c = StepConfig.from_strategy(s)
    assert c.expert_fold == pytest.approx(2.0)
    folded, plain = param_counts(MOE, c, 4), param_counts(MOE, None, 4)
    # the callers divide by tp: the expert share is counted x tp/etp so that leaves experts / (ep · etp)
    assert folded.expert_layer / 2 == pytest.approx(8 / 4 * 3 * 1024 * 512 / 1)
    assert folded.expert_layer == pytest.approx(2 * plain.expert_layer)
    one = pm.predict(MOE, NODE, _megatron(ep=4, etp=1, zero=1))
    two = pm.predict(MOE, NODE, _megatron(ep=4, zero=1))
    # bf16 weights of the routed experts: 4 layers x 2 experts x 3·1024·512, whole (etp 1) against halves (tp 2)
    assert one.memory["weights"] - two.memory["weights"] == pytest.approx(4 * 2 * 3 * 1024 * 512 * 2 / 2, rel=1e-6)
    # fp32 master and Adam states (12 B): twice the experts per rank over twice the expert data-parallel ranks
    assert one.memory["optimizer"] == pytest.approx(two.memory["optimizer"], rel=1e-6)


def test_the_folded_expert_grid_lies_over_tp_ranks_and_lands_the_all_to_all_in_one_node():
    # tp 2, dp 8 on two 8-GPU nodes: ep 8 over data-parallel ranks spaced tp apart spans both nodes, folded
    # (etp 1) it is 8 consecutive ranks of one node
    plain = layout(8, 2, 1, 8, cp=1, ep=8)
    folded = layout(8, 2, 1, 8, cp=1, ep=8, etp=1)
    assert (float(plain["ep"][0]), float(plain["ep"][1])) == (4.0, 2.0)
    assert (float(folded["ep"][0]), float(folded["ep"][1])) == (8.0, 1.0)
    assert float(folded["etp"][0]) == 1.0 and folded["dp"] == plain["dp"]  # the dense grid is untouched
    one = pm.predict(MOE, NODE, _megatron(ep=8, etp=1))
    two = pm.predict(MOE, NODE, _megatron(ep=4))
    # no expert collectives over tp, and the all-to-all within NVLink: less tensor-parallel time per step
    assert one.breakdown["tp_comm"] < two.breakdown["tp_comm"]


def test_deepseek_v3_style_folding_is_accepted_where_ep_exceeds_dp():
    # DGX Cloud's DeepSeek-V3 recipe on 128 GB200 (v25.05): TP 2, PP 4, EP 32, ETP 1, DP 16
    s = pm.Strategy(framework="megatron", tp=2, pp=4, dp=16, ep=32, etp=1, sequence_parallel=True, micro_batch=1)
    assert s.expert_tp == 1
    with pytest.raises(pm.InvalidInputError, match="'ep'=32 must divide dp × cp = 16"):
        pm.Strategy(framework="megatron", tp=2, pp=4, dp=16, ep=32, sequence_parallel=True, micro_batch=1)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(framework="pytorch", tp=2, etp=1), pm.UnsupportedError, "'etp'=1 .* use framework='megatron'"),
    (dict(framework="megatron", tp=2, dp=8, ep=4, etp=3, sequence_parallel=True), pm.InvalidInputError,
     r"ep × etp = 4 × 3 must divide a stage's tp × cp × dp = 16"),
    (dict(framework="megatron", tp=2, etp=0), pm.InvalidInputError, "'etp'"),
])
def test_bad_etp_names_the_field(kwargs, error, message):
    with pytest.raises(error, match=message):
        pm.Strategy(**kwargs)


def test_etp_on_a_dense_model_or_an_expert_width_it_does_not_divide_is_refused():
    dense = pm.transformer(layers=2, hidden=1024, heads=8, seq=1024, vocab=32000)
    with pytest.raises(pm.InvalidInputError, match="'etp'=1 splits a mixture-of-experts model's experts"):
        pm.predict(dense, NODE, _megatron(etp=1))
    odd = pm.transformer(**{**dict(layers=2, hidden=1024, heads=8, seq=1024, vocab=32000, experts=8,
                                   experts_per_token=2), "ffn_hidden": 510})
    with pytest.raises(pm.InvalidInputError, match="etp"):
        pm.predict(odd, pm.cluster("dgx-h100", nodes=1), _megatron(tp=1, dp=8, ep=2, etp=4, sequence_parallel=False))


def test_the_command_line_takes_etp(capsys):
    from perfmodel.cli import main
    args = ["predict", "--model", "mixtral-8x7b", "--gpu", "h100", "--nodes", "2", "--gpus-per-node", "8",
            "--framework", "megatron", "--tp", "2", "--ep", "8", "--sequence-parallel", "--global-batch", "64"]
    assert main(args + ["--etp", "1"]) == 0
    folded = capsys.readouterr().out
    assert main(args) == 0
    assert folded != capsys.readouterr().out


def test_search_holds_a_fixed_etp_for_megatron_and_refuses_it_for_other_stacks():
    df = pm.search(MOE, NODE, 32, framework=("megatron",), ep=8, fixed={"etp": 1}, top_k=5000, max_micro_batch=2)
    assert len(df) and (df.etp == 1).all()
    folded = df[df.tp > 1]
    assert len(folded) and ((folded.tp * folded.dp) % (folded.ep * folded.etp) == 0).all()
    assert (folded.dp < folded.ep).any()  # ep over more ranks than dp: only a folded grid allows it
    with pytest.raises(pm.InvalidInputError, match="no job of the search takes fixed"):
        pm.search(MOE, NODE, 32, framework=("pytorch",), ep=8, fixed={"etp": 1})


def test_megatron_lays_its_experts_out_by_their_own_generator_also_when_etp_is_unset():
    # core_r0.10 on: etp (= tp) fastest, then ep, context parallel size 1 in the expert grid, so with cp 2 the
    # ep ranks are tp apart, not tp x cp apart as in the older tp-cp-ep-dp-pp order the other stacks keep
    s = _megatron(ep=4, cp=2, dp=4, global_batch=16)
    unset, folded = pm.predict(MOE, NODE, s), pm.predict(MOE, NODE, dataclasses.replace(s, etp=2))
    assert unset.step_time == pytest.approx(folded.step_time)
    generator, older = layout(4, 2, 1, 8, cp=2, ep=4, etp=2)["ep"], layout(4, 2, 1, 8, cp=2, ep=4)["ep"]
    assert (float(generator[0]), float(generator[1])) == (4.0, 1.0)  # ranks 0, 2, 4, 6: one node
    assert (float(older[0]), float(older[1])) == (2.0, 2.0)  # ranks 0, 4, 8, 12: two nodes


def test_a_folded_expert_grid_no_validation_row_ran_is_labelled_uncalibrated():
    folded = pm.predict(MOE, NODE, _megatron(ep=8, etp=1))
    assert folded.interval_regime.startswith("uncalibrated: expert_grid=folded in no validation row")
    assert "expert_grid" not in pm.predict(MOE, NODE, _megatron(ep=4)).interval_regime


def test_the_command_line_search_holds_etp(capsys):
    from perfmodel.cli import main
    assert main(["search", "--model", "mixtral-8x7b", "--gpu", "h100", "--nodes", "2", "--gpus-per-node", "8",
                 "--framework", "megatron", "--ep", "8", "--fixed", "etp=1", "--global-batch", "64", "--top-k", "2",
                 "--max-micro-batch", "1"]) == 0
    assert "expert_grid=folded in no validation row" in capsys.readouterr().out
    with pytest.raises(pm.InvalidInputError, match="'etp' must be an integer"):
        pm.search(MOE, NODE, 32, framework=("megatron",), ep=8, fixed={"etp": "x"})


def test_symbolic_step_times_refuse_a_folded_expert_grid():
    from perfmodel.analysis.symbolic import symbolic_step_time
    with pytest.raises(pm.UnsupportedError, match="etp unset or 1; got tp=1, cp=1, ep=1, etp=2"):
        symbolic_step_time(MOE, NODE, _megatron(tp=1, dp=16, etp=2, sequence_parallel=False, zero=0))


def test_the_default_search_tries_megatron_moe_options_for_moe_models_only():
    df = pm.search(MOE, NODE, 32, framework=("megatron",), ep=(4, 8), top_k=5000, max_micro_batch=1)
    folded, plain = df[df.etp == 1], df[df.etp.isna()]
    assert len(folded) and len(plain)
    assert (folded.tp > 1).all()  # at tp 1 whole experts are the default grid: not priced twice
    assert ((folded.tp * folded.dp) % folded.ep == 0).all()
    row = folded.iloc[0]  # a folded row is priced as the strategy it names
    again = pm.predict(MOE, NODE, strategy_of(row))
    assert again.step_time == pytest.approx(row.step_time)
    assert again.interval_regime.startswith("uncalibrated: ")  # no validation row runs a folded grid
    # grouped expert GEMMs (--moe-grouped-gemm) beside one GEMM per expert, where a rank holds several experts
    assert set(df[df.ep == 4].grouped_experts.map(str)) == {"None", "True"}
    assert set(df[df.ep == 8].grouped_experts.map(str)) == {"None"}  # one expert per rank: the two agree
    held = pm.search(MOE, NODE, 32, framework=("megatron",), ep=8, fixed={"etp": 2}, top_k=50, max_micro_batch=1)
    assert (held.etp == 2).all()  # a held etp is not varied
    dense = dataclasses.replace(MOE, experts=1, experts_per_token=1, ffn_hidden=1024)
    assert "etp" not in pm.search(dense, NODE, 32, framework=("megatron",), top_k=5, max_micro_batch=1).columns
