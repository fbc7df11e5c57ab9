"""Software stacks: torchtitan (FSDP2), FSDP1, torch.compile, checkpointing policies, float8, losses."""

import dataclasses

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.core.errors import InvalidInputError, PerfModelError, UnsupportedError
from perfmodel.costs import stack_memory
from perfmodel.costs.memory import layer_activation_bytes
from perfmodel.explore import strategy_of
from perfmodel.validate.published import read_published_stacks
from perfmodel.workload import kernels as steps
from perfmodel.workload.ops import mem
from perfmodel.workload.stack import adapt_kernels
from perfmodel.workload.stacks.checkpointing import op_sac_recomputed
from perfmodel.workload.stacks.compile import fuse_memory_bound
from perfmodel.workload.stacks.float8 import torchao_float8
from perfmodel.workload.ops import linear

GiB = 2**30


@pytest.fixture(scope="module")
def llama8b():
    return dataclasses.replace(pm.preset("llama-3-8b"), seq=8192)


def test_torchtitan_alone_takes_its_defaults():
    s = pm.Strategy(dp=8, framework="torchtitan")
    assert (s.fsdp, s.recompute, s.loss, s.compile) == ("full", "every-2", "eager", False)
    assert pm.Strategy(dp=8, framework="torchtitan", compile=True).loss == "compiled"
    assert pm.Strategy(dp=8).recompute == "none" and pm.Strategy(dp=8).fsdp is None
    assert pm.Strategy(dp=8, framework="fsdp1").fsdp == "full"


def test_options_that_do_not_apply_name_the_stacks_that_take_them():
    with pytest.raises(UnsupportedError, match=r"'compile'=True does not apply to framework='megatron'.*"
                                               r"stacks that take it: pytorch, torchtitan, kempnerforge, fsdp1"):
        pm.Strategy(framework="megatron", compile=True)
    with pytest.raises(UnsupportedError, match=r"recompute='selective-op' is not a checkpointing policy of "
                                               r"framework='pytorch'.*stacks that take it: torchtitan"):
        pm.Strategy(recompute="selective-op")
    with pytest.raises(UnsupportedError, match=r"recompute='every-2'.*framework='megatron'"):
        pm.Strategy(framework="megatron", recompute="every-2")
    with pytest.raises(InvalidInputError, match=r"'recompute'='every-0': every-<k> needs a whole k >= 1"):
        pm.Strategy(recompute="every-0")
    with pytest.raises(PerfModelError, match=r"unknown recompute 'some'.*every-<k>"):
        pm.Strategy(recompute="some")
    with pytest.raises(PerfModelError, match=r"unknown loss 'fast' \(known: chunked, compiled, eager, fused\)"):
        pm.Strategy(loss="fast")
    with pytest.raises(UnsupportedError, match=r"no fp8 support.*'torchtitan' with torchao"):
        pm.predict("gpt2-small", pm.cluster("a100-sxm4-80gb"), pm.Strategy(precision="fp8-mixed",
                                                                           framework="torchtitan"))


def test_fsdp2_model_states_and_buffers_by_hand():
    # 8e9 parameters over 8 ranks: 4 + 8 + 4 bytes each, sharded
    st = stack_memory.fsdp_model_states(8e9, 8, optimizer="adamw")
    assert (st["weights"], st["optimizer"], st["gradients"], st["weight_copies"]) == (4e9, 8e9, 4e9, 0.0)
    # a 2e8-parameter block, a 5e8-parameter head kept unsharded: around the loss 2·(5e8 + 2·2e8) = 1.8e9;
    # a block's backward (2·2 + 2 + 4)·2e8 = 2e9 bytes, the larger
    assert stack_memory.fsdp_buffers(2e8, 5e8) == pytest.approx(2e9)
    assert stack_memory.fsdp_buffers(2e8, 2e9) == pytest.approx(2 * (2e9 + 4e8))


def test_per_op_checkpointing_saves_every_other_mm(llama8b):
    # block input 2h, wq 2h, wv 2·kv·d, w1 2f, w2 2h, SDPA output 2h + fp32 lse 4·heads
    h, f, kvd = 4096, 14336, 8 * 128
    expected = 2 * h + 2 * h + 2 * kvd + 2 * f + 2 * h + 2 * h + 4 * 32
    assert layer_activation_bytes(llama8b, recompute="selective-op", framework="torchtitan") == expected
    fwd, _ = steps.layer_kernels(llama8b, 1, precision="bf16-mixed")
    redo = op_sac_recomputed(fwd, llama8b)
    gemm_flops = sum(k.flops for k in redo if k.cls == "gemm")
    T = llama8b.seq
    assert gemm_flops == pytest.approx(2 * T * h * (kvd + h + f))  # wk, wo, w3
    assert not any(k.cls == "sdpa" for k in redo)


def test_every_k_is_the_average_of_checkpointed_and_plain_blocks(llama8b):
    kw = {"framework": "torchtitan"}
    full = layer_activation_bytes(llama8b, recompute="full", **kw)
    none = layer_activation_bytes(llama8b, recompute="none", **kw)
    assert layer_activation_bytes(llama8b, recompute="every-2", **kw) == pytest.approx((full + none) / 2)
    _, b2 = steps.layer_kernels(llama8b, 1, recompute="every-2")
    _, bf = steps.layer_kernels(llama8b, 1, recompute="full")
    count = sum(np.asarray(k.count, float) * k.flops for k in b2 if ".recompute" in k.name)
    assert count == pytest.approx(0.5 * sum(k.flops for k in bf if ".recompute" in k.name))


def test_compile_prices_a_chain_by_the_bytes_it_moves_once():
    x = 1e6
    chain = [mem("res", "residual_add", "fwd", x, dtype="bf16"), mem("ln", "rmsnorm", "fwd", x, dtype="bf16")]
    fused = fuse_memory_bound(chain)
    assert len(fused) == 1
    # residual add 2 reads + 1 write, norm 1 + 1, 2 bytes each: 10 MB, less the sum passed in registers 4 MB
    assert fused[0].size["x"] * 8 == pytest.approx(6e6)
    f, _ = linear("fc", 10, 8, 8)
    assert [k.cls for k in fuse_memory_bound(chain + f + chain)] == ["copy", "gemm", "copy"]


def test_compile_is_faster_and_torchao_float8_adds_casts(llama8b):
    c = pm.cluster("dgx-h100")
    base = pm.Strategy(dp=8, micro_batch=2, framework="torchtitan", recompute="selective-op")
    eager = pm.predict(llama8b, c, base)
    compiled = pm.predict(llama8b, c, base.replace(compile=True, loss="eager"))
    assert compiled.step_time < eager.step_time
    assert compiled.peak_memory == pytest.approx(eager.peak_memory)  # per-op policy decides what is saved
    fwd, bwd = linear("attn.proj", 1024, 4096, 4096, dtype="fp8")
    kinds = [k.name for k in torchao_float8(fwd[0])]
    assert kinds == ["attn.proj.fp8_cast", "attn.proj.fp8_w_cast", "attn.proj", "attn.proj.fp8_extra"]
    head = linear("lm_head", 1024, 4096, 128256, dtype="fp8")[0][0]
    assert torchao_float8(head)[0].dtype == "bf16"  # torchtitan filters the output layer


def test_float8_quantizes_only_the_gemms_each_stack_its_own_way(llama8b):
    # Transformer Engine (Megatron-Core; FSDP1 under Composer's amp_fp8 with TE linears) and torchao
    # (torchtitan) cast a GEMM's operands; norms and residual adds stay on the bf16 residual stream
    fwd, bwd = steps.layer_kernels(llama8b, 2, precision="fp8-mixed")
    for framework, cast in (("megatron", "attn.qkv.fp8_cast"), ("fsdp1", "attn.qkv.fp8_cast"),
                            ("torchtitan", "attn.qkv.fp8_w_cast")):
        out = adapt_kernels(fwd + bwd, precision="fp8-mixed", framework=framework)
        assert {k.dtype for k in out if k.cls in ("rmsnorm", "residual_add")} == {"bf16"}, framework
        assert cast in {k.name for k in out}, framework
        assert {k.dtype for k in out if k.cls == "gemm"} == {"fp8"}
    assert pm.predict(llama8b, pm.cluster("dgx-h100"), pm.Strategy(dp=8, micro_batch=2, framework="fsdp1",
                                                                    precision="fp8-mixed")).step_time > 0


def test_transformer_engine_casts_the_weights_again_where_no_one_caches_them(llama8b):
    # Megatron-Core passes is_first_microbatch, so TE keeps each weight's fp8 cast; the fsdp1 and composer stacks
    # does not, so every forward, the recomputed one too, casts each weight to fp8 and its transpose: 4 B a weight
    fwd, bwd = steps.layer_kernels(llama8b, 2, precision="fp8-mixed", recompute="full")
    casts = {fw: {k.name: float(k.size["x"]) for k in adapt_kernels(fwd + bwd, precision="fp8-mixed", framework=fw)
                  if k.name.endswith("fp8_w_cast")} for fw in ("megatron", "fsdp1", "composer")}
    assert casts["megatron"] == {} and casts["fsdp1"] == casts["composer"]
    qkv = 4096 * (4096 + 2 * 1024)
    assert casts["fsdp1"]["attn.qkv.fp8_w_cast"] == casts["fsdp1"]["attn.qkv.recompute.fp8_w_cast"] == 0.5 * qkv
    assert not any(".dgrad" in name or ".wgrad" in name for name in casts["fsdp1"])


def test_losses_compiled_and_chunked_hold_less(llama8b):
    c = pm.cluster("dgx-h100")
    s = pm.Strategy(dp=8, micro_batch=2, framework="torchtitan", recompute="selective-op")
    logits = 2 * 8192 * 128256
    eager = pm.predict(llama8b, c, s).memory["loss"]
    assert eager == pytest.approx(12 * logits)
    assert pm.predict(llama8b, c, s.replace(loss="compiled")).memory["loss"] == pytest.approx(4 * logits)
    assert stack_memory.chunked_loss_bytes(2 * 8192, 4096) == 8 * 2 * 8192 * 4096
    preds = [pm.predict(llama8b, c, s.replace(loss=loss)) for loss in ("eager", "compiled", "chunked", "fused")]
    assert preds[0].peak_memory > preds[1].peak_memory > preds[2].peak_memory
    assert preds[3].peak_memory == preds[1].peak_memory and preds[3].step_time < preds[0].step_time



def test_composer_is_fsdp1_with_mpt_fused_loss():
    """framework="composer" alone takes MPT's fused cross-entropy; the rest is Composer's FSDP1, so with the
    loss named the two stacks price the same step and memory."""
    m, c = pm.preset("mpt-7b", seq=8192), pm.cluster("dgx-h100")
    mpt = pm.Strategy(dp=8, micro_batch=2, framework="composer", recompute="full")
    assert mpt.loss == "fused" and mpt.is_default("loss") and mpt.fsdp == "full"
    assert mpt.attention == "flash2"
    fsdp1 = pm.Strategy(dp=8, micro_batch=2, framework="fsdp1", recompute="full")
    assert fsdp1.loss == "eager"
    logits = 2 * 8192 * m.vocab
    a, b = pm.predict(m, c, mpt), pm.predict(m, c, fsdp1)
    assert a.memory["loss"] == pytest.approx(4 * logits) and b.memory["loss"] == pytest.approx(12 * logits)
    assert a.peak_memory < b.peak_memory
    same = pm.predict(m, c, fsdp1.replace(loss="fused"))
    assert same.peak_memory == pytest.approx(a.peak_memory, rel=1e-12)
    assert a.step_time > same.step_time  # MPT's flash path adds its unpad and pad copies (next test)
    unfused = [pm.predict(m, c, s.replace(attention="unfused")) for s in (mpt, fsdp1.replace(loss="fused"))]
    assert unfused[0].step_time == pytest.approx(unfused[1].step_time, rel=1e-12)  # attn_impl='torch': none
    with pytest.raises(UnsupportedError, match="recompute='selective-op' is not a checkpointing policy of "
                                               "framework='composer'"):
        pm.Strategy(dp=8, framework="composer", recompute="selective-op")


def test_mpt_unpads_around_flash_attention_by_hand():
    """MPT's flash_attn_fn gathers q, k, v (2 + 2 B an element) and pads the output (zeros 2 B, index_put
    2 + 2); backward gathers the output gradient (2 + 2) and scatters each of dq, dk, dv into zeros (2, then 2 + 2)."""
    from perfmodel.workload.ops import Kernel
    from perfmodel.workload.stack import unpad_copies
    size = {"batch": 2.0, "heads": 8.0, "kv_heads": 2.0, "seq": 128.0, "head_dim": 64.0, "causal": 1.0}
    q, kv = 2 * 128 * 8 * 64, 2 * 128 * 2 * 64
    fwd = unpad_copies(Kernel("attn.sdpa", "sdpa", "fwd", size, 1, 0.0, "fa2.fwd", "bf16"))
    bwd = unpad_copies(Kernel("attn.sdpa.bwd", "sdpa", "bwd", size, 1, 0.0, "fa2.bwd", "bf16"))
    assert len(fwd) == 5 and len(bwd) == 7 and all(k.cls == "copy" for k in fwd + bwd)
    assert sum(k.size["x"] for k in fwd) * 8 == pytest.approx(4 * (q + 2 * kv) + 6 * q)
    assert sum(k.size["x"] for k in bwd) * 8 == pytest.approx(4 * q + 6 * (q + 2 * kv))
    names = {(s, a): [k.name for k in adapt_kernels(steps.step_kernels(pm.preset("mpt-125m"), 1)[0],
                                                     precision="bf16-mixed", framework=s, attention=a)]
             for s in ("composer", "fsdp1") for a in ("flash1", "flash2", "triton")}
    assert "attn.sdpa.unpad_q" in names["composer", "flash2"] and not any("unpad" in n for n in names["fsdp1", "flash2"])
    # flash-attn 1 took unpadded q, k, v too (flash_attn_unpadded_func); MPT's Triton path takes them padded
    assert "attn.sdpa.unpad_q" in names["composer", "flash1"] and not any("unpad" in n for n in names["composer", "triton"])


def test_composer_amp_fp8_runs_fp8_only_in_transformer_engine_linears():
    """Composer's amp_fp8 is te.fp8_autocast alone: MPT's torch linears (fc_type="torch") run the bf16 step, TE's
    ("te") the fp8 one, which fc_type=None prices too and says so; fc_type belongs to composer alone."""
    m, c = pm.preset("mpt-3b"), pm.cluster("dgx-h100")
    base = dict(dp=8, micro_batch=8, framework="composer", recompute="full")
    bf16 = pm.predict(m, c, pm.Strategy(**base))
    torch_fc = pm.predict(m, c, pm.Strategy(**base, precision="fp8-mixed", fc_type="torch"))
    assert torch_fc.step_time == pytest.approx(bf16.step_time, rel=1e-12)
    assert torch_fc.peak_memory == pytest.approx(bf16.peak_memory, rel=1e-12)
    assert torch_fc.strategy.precision == "fp8-mixed" and "turns no nn.Linear fp8" in torch_fc.caveats[-1]
    te = pm.predict(m, c, pm.Strategy(**base, precision="fp8-mixed", fc_type="te"))
    default = pm.predict(m, c, pm.Strategy(**base, precision="fp8-mixed"))
    assert te.step_time < 0.9 * bf16.step_time and default.step_time == pytest.approx(te.step_time, rel=1e-12)
    assert not te.caveats and "fc_type='torch' to price that" in default.caveats[-1]
    assert not bf16.caveats  # no fp8 asked, nothing to say
    with pytest.raises(UnsupportedError, match="'fc_type'='te' .* framework='fsdp1'; the stack that takes it: "
                                               "composer"):
        pm.Strategy(dp=8, framework="fsdp1", fc_type="te")
    with pytest.raises(pm.UnknownNameError, match="unknown fc_type 'linear'"):
        pm.Strategy(dp=8, framework="composer", fc_type="linear")
    # the analyses that price a Strategy themselves take the step it runs too (mixed GPU types here)
    small, mixed = pm.preset("mpt-125m"), {"h100": 2, "h200": 2}
    a, b = (pm.predict_mixed(small, mixed, pm.Strategy(**{**base, "dp": None}, **kw))
            for kw in (dict(precision="fp8-mixed", fc_type="torch"), {}))
    assert a["step_time_s"].tolist() == pytest.approx(b["step_time_s"].tolist(), rel=1e-12)
    # search holds it like the other fixed fields: torch linears price (and show) the bf16 step
    rows = pm.search(m, c, 64, framework="composer", precision="fp8-mixed", fixed={"fc_type": "torch"}, top_k=3)
    assert set(rows["precision"]) == {"bf16-mixed"} and set(rows["fc_type"]) == {"torch"}
    s = strategy_of(rows.iloc[0])
    assert pm.predict(m, c, s).step_time == pytest.approx(rows["step_time"].iloc[0], rel=1e-9)

# TorchTitan (Liang et al. 2024, arXiv 2410.06511), Table 1 and Table 2: Llama 3.1 8B on 8 H100
# (96 GB HBM2e), memory as torchtitan logs it (max reserved, GiB). Table 1: local batch 2, seq 8192,
# per-op selective checkpointing; Table 2: local batch 1, full checkpointing, compile + float8.
# The torch.compile of that version compiled the blocks, not the loss (loss="eager").
@pytest.mark.parametrize("case", [c for c in read_published_stacks() if "reserved_memory_bytes" in c.extra],
                         ids=lambda c: c.label)
def test_torchtitan_reserved_memory_within_five_percent_of_the_paper(case):
    # the paper's rows (published_stack_runs.csv) on its hosts (96 GB HBM2e at 500 W)
    p = pm.predict(case.model, case.cluster, case.strategy)
    # torchtitan logs reserved_bytes.all.peak: the allocator's, no CUDA context
    assert abs(p.reserved_memory / case.extra["reserved_memory_bytes"] - 1) < 0.05


def test_tensor_parallel_overlap_by_hand():
    from perfmodel.parallel import tp_overlap as ub
    # 8 ms all-gather in 7 transfers beside a 8 ms GEMM in 8 chunks: 8 - 7 = 1 ms exposed
    assert ub.ring_exchange(8e-3, 8e-3, 8) == pytest.approx(1e-3)
    # 132 SMs, 16 for the reduce-scatter: the GEMM takes 132/116 as long
    assert ub.slowed(1.0, 132) == pytest.approx(132 / 116)
    # pipeline: a quarter of the collective waits for the last chunk, the rest hides behind the GEMM
    assert ub.pipeline(4e-3, 8e-3, 132) == pytest.approx(1e-3 + 8e-3 * (132 / 116 - 1))
    assert ub.bulk(10e-3, 4e-3, 132) == pytest.approx(10e-3 - 4e-3)
    # run as chunk GEMMs (TE split_overlap_ag / _rs): what the chunks take beyond the whole GEMM is exposed too
    o = ub.UbOverlap("ring_exchange")
    assert ub.exposed(8e-3, 8e-3, o, 8, 132, {"ring": 9e-3}) == pytest.approx(8e-3 - 9e-3 * 7 / 8 + 1e-3)
    assert ub.exposed(8e-3, 8e-3, o, 8, 132) == pytest.approx(1e-3)
    split = ub.UbOverlap("pipeline", 16, True)
    assert ub.exposed(4e-3, 8e-3, split, 8, 132, {"split": 9e-3}) == \
        pytest.approx(1e-3 + max(3e-3 - 9e-3 * (132 / 116) * 0.75, 0.0) + 9e-3 * 132 / 116 - 8e-3)


def test_chunked_gemms_cost_their_chunks():
    """A GEMM split into tp chunks of its tokens, or 4 of its outputs, takes at least the whole GEMM's time and
    more where its chunks are small (step._linear_gemm_times); userbuffers rows price that time."""
    from perfmodel.step import _linear_gemm_times

    prof = pm.load_profile("h100-sxm5-80gb")
    fwd, bwd = steps.layer_kernels(pm.preset("llama-3-70b"), 1, tp=8, sp=True, precision="bf16-mixed")
    t = dict(_linear_gemm_times(prof, fwd + bwd, 8))
    assert set(t) >= {"qkv", "qkv@ring", "qkv@split", "fc2.dgrad@ring"}
    for name in ("qkv", "proj", "fc1", "fc2", "fc2.dgrad"):
        assert t[name + "@ring"] >= t[name] and t[name + "@split"] >= t[name]
    assert t["qkv@ring"] > 1.02 * t["qkv"]  # 1,024 of 8,192 tokens per chunk: not a whole wave's efficiency
    assert "qkv@ring" not in dict(_linear_gemm_times(prof, fwd + bwd))


def test_userbuffers_hide_tensor_parallel_time_and_bad_combinations_say_why():
    m = pm.preset("llama-3-70b")
    c = pm.cluster("dgx-h100", nodes=8)
    base = pm.Strategy(dp=8, tp=8, micro_batch=1, global_batch=64, framework="megatron", sequence_parallel=True,
                       zero=1, recompute="full")
    plain, ub = pm.predict(m, c, base), pm.predict(m, c, base.replace(tp_comm_overlap="userbuffers"))
    assert ub.breakdown["tp_comm"] < 0.5 * plain.breakdown["tp_comm"]
    assert ub.breakdown["forward"] == plain.breakdown["forward"]
    with pytest.raises(UnsupportedError, match=r"tp_comm_overlap='userbuffers' does not apply to framework='pytorch'"):
        pm.Strategy(tp=2, sequence_parallel=True, tp_comm_overlap="userbuffers")
    with pytest.raises(InvalidInputError, match=r"needs tp > 1 and sequence_parallel=True"):
        pm.Strategy(tp=2, framework="megatron", tp_comm_overlap="userbuffers")
    with pytest.raises(InvalidInputError, match=r"needs compile=True"):
        pm.Strategy(dp=2, tp=2, sequence_parallel=True, framework="torchtitan", tp_comm_overlap="async")


def test_torchtitan_pipeline_stages_keep_their_parameters_unsharded():
    m = pm.preset("llama-3-70b")
    c = pm.cluster("dgx-h100", nodes=4)
    s = pm.Strategy(dp=8, pp=4, micro_batch=1, global_batch=32, framework="torchtitan", recompute="full")
    p = pm.predict(m, c, s)
    stage_params = 70.6e9 / 4  # about a quarter of the model on the fullest stage
    assert p.memory["comm_buffers"] > 2 * 0.9 * stage_params
    flat = pm.predict(m, pm.cluster("dgx-h100", nodes=4), s.replace(dp=32, pp=1))
    assert flat.memory["comm_buffers"] < 0.3 * p.memory["comm_buffers"]  # two blocks + buffers, not a stage


def test_shard_grad_op_keeps_the_parameters_unsharded_and_only_fsdp_stacks_take_it(llama8b):
    c = pm.cluster("dgx-h100")
    s = pm.Strategy(dp=8, micro_batch=1, framework="fsdp1", recompute="full")
    full, sgo = pm.predict(llama8b, c, s), pm.predict(llama8b, c, s.replace(fsdp="shard-grad-op"))
    # all blocks stay unsharded in bf16, not only the root (embedding and head, 1.05e9 parameters)
    assert sgo.memory["comm_buffers"] - full.memory["comm_buffers"] == pytest.approx(2 * (llama8b.params - 1.0507e9), rel=1e-3)
    with pytest.raises(UnsupportedError, match=r"fsdp='shard-grad-op'.*framework='fsdp1' or 'torchtitan'"):
        pm.Strategy(dp=8, fsdp="shard-grad-op")


def test_compile_saves_nothing_between_kernels_over_different_tensors():
    norm = mem("ln", "rmsnorm", "fwd", 1e6, dtype="bf16")
    wcast = mem("w_cast", "cast_fp32_to_bf16", "fwd", 4e6)
    fused = fuse_memory_bound([norm, wcast])[0]
    assert fused.size["x"] * 8 == pytest.approx(2 * 2e6 + 6 * 4e6)  # both tensors' traffic, nothing passed


def test_torchtitan_compile_with_an_eager_loss_leaves_the_loss_kernels_eager():
    # torchtitan 004b3148 (the TorchTitan paper) compiles the blocks only; v0.2.2 compiles the loss when
    # compile.components holds "loss": loss="eager" with compile=True keeps the cast and the cross-entropy apart
    m = dataclasses.replace(pm.preset("llama-3-8b"), seq=1024)
    hf, hb = steps.head_kernels(m, 2)
    names = {loss: [k.name for k in adapt_kernels(hf + hb, precision="bf16-mixed", framework="torchtitan",
                                                  compiled=True, loss=loss)] for loss in ("eager", "compiled")}
    assert {"logits.float", "loss", "loss.bwd", "logits.grad_cast"} <= set(names["eager"])
    assert not any(n.startswith("fused[") and "loss" in n for n in names["eager"])
    assert "logits.float" not in names["compiled"] and any("loss" in n and "fused" in n for n in names["compiled"])
    # a stack whose compile never takes the loss in is priced as before (the whole list fused)
    kf = [k.name for k in adapt_kernels(hf + hb, precision="bf16-mixed", framework="kempnerforge", compiled=True,
                                        loss="eager")]
    assert any(n.startswith("fused[logits.float+loss") for n in kf)


def test_fsdp_reduce_dtype_follows_grad_reduce_fp32():
    """Composer's FSDP default mixed_precision DEFAULT reduces in fp32, MPT's pretraining yamls' PURE in bf16 (the stack's
    default); torchtitan's mixed_precision_reduce float32 by default, bfloat16 when asked: the reduce-scatter moves
    that dtype and the block backward holds its input in it."""
    from perfmodel.workload.stacks import gradient_reduce_bytes
    assert gradient_reduce_bytes("composer") == 2.0 and gradient_reduce_bytes("composer", True) == 4.0
    assert gradient_reduce_bytes("torchtitan") == 4.0 and gradient_reduce_bytes("torchtitan", False) == 2.0
    m, c = pm.preset("mpt-1b"), pm.cluster("dgx-a100-40gb", nodes=8)
    pure, default = (pm.predict(m, c, pm.Strategy(dp=64, micro_batch=4, framework="composer", recompute="full",
                                                  grad_reduce_fp32=v)) for v in (None, True))
    assert default.breakdown["dp_comm"] > pure.breakdown["dp_comm"] and default.peak_memory > pure.peak_memory
    unit = (pm.predict(m, c, pm.Strategy(dp=64, micro_batch=4, framework="composer", recompute="full",
                                         grad_reduce_fp32=False)))
    assert unit.step_time == pytest.approx(pure.step_time, rel=1e-12)
