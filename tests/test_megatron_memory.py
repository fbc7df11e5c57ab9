"""Memory terms taken from Megatron-Core, Transformer Engine and the caching allocator, term by term.

Each number is checkable by hand on a two-layer model (h = 256, f = 1024, no biases): a layer's GEMM
weights are 4h² + 2hf = 786,432 parameters.
"""

import pytest

import perfmodel as pm
from perfmodel.costs import memory as mem, stack_memory as sm
from perfmodel.parallel.wire import wire_bytes
from perfmodel.validate.published import read_published

GEMM_PER_LAYER = 4 * 256**2 + 2 * 256 * 1024


@pytest.fixture(scope="module")
def tiny():
    return pm.transformer(layers=2, hidden=256, heads=4, seq=512, vocab=32768, bias=False)


def test_main_grad_dtype_defaults_and_override():
    # Megatron-LM forces fp32 main_grad under bf16 (and fp8); fp16 keeps 16-bit gradients
    assert mem.megatron_grad_bytes("bf16-mixed") == mem.megatron_grad_bytes("fp8-mixed") == 4.0
    assert mem.megatron_grad_bytes("fp16-mixed") == 2.0
    assert mem.megatron_grad_bytes("bf16-mixed", False) == 2.0 and mem.megatron_grad_bytes("fp16-mixed", True) == 4.0
    # one rule for the buffer and for what the data-parallel reduction moves
    assert wire_bytes("bf16-mixed", "megatron", False).grad == 2.0
    assert wire_bytes("bf16-mixed", "megatron").grad == 4.0
    assert wire_bytes("bf16-mixed", "pytorch").grad == 4.0


def test_grad_reduce_fp32_is_megatrons_and_the_fsdp_stacks_option():
    assert pm.Strategy(framework="megatron", grad_reduce_fp32="false").grad_reduce_fp32 is False
    assert pm.Strategy(framework="torchtitan", grad_reduce_fp32=False).grad_reduce_fp32 is False
    with pytest.raises(pm.errors.UnsupportedError, match="'grad_reduce_fp32'.*framework='pytorch'.*megatron, torchtitan"):
        pm.Strategy(framework="pytorch", grad_reduce_fp32=False)
    with pytest.raises(pm.errors.UnsupportedError, match="stacks that take it: megatron, torchtitan, kempnerforge, "
                                                         "fsdp1, composer$"):
        pm.Strategy(framework="deepspeed", grad_reduce_fp32=False)
    with pytest.raises(pm.errors.InvalidInputError, match="'grad_reduce_fp32' must be True or False"):
        pm.Strategy(framework="megatron", grad_reduce_fp32="half")


def test_bf16_main_grad_halves_the_gradient_buffer(tiny):
    # gradient accumulation (4 micro-batches) keeps the buffer alive all step: 4 B vs 2 B per parameter
    s = pm.Strategy(micro_batch=1, global_batch=4, framework="megatron")
    fp32 = pm.predict(tiny, "h100", s)
    bf16 = pm.predict(tiny, "h100", s.replace(grad_reduce_fp32=False))
    assert fp32.memory["gradients"] == pytest.approx(4 * tiny.params)
    assert bf16.memory["gradients"] == pytest.approx(2 * tiny.params)


def test_transformer_engine_keeps_fp8_weights_and_transposes(tiny):
    assert mem.fp8_weight_bytes("fp8-mixed", "megatron") == 2.0
    assert mem.fp8_weight_bytes("bf16-mixed", "megatron") == 0.0
    assert mem.fp8_weight_bytes("fp8-mixed", "torchtitan") == 0.0   # torchao casts per use, keeps no cache
    s = pm.Strategy(micro_batch=1, framework="megatron", precision="fp8-mixed")
    p = pm.predict(tiny, "h100", s)
    assert p.memory["fp8_weights"] == pytest.approx(2 * 2 * GEMM_PER_LAYER)    # 2 layers, 1 + 1 B, no LM head
    assert pm.predict(tiny, "h100", s.replace(precision="bf16-mixed")).memory["fp8_weights"] == 0.0
    assert sum(p.memory.values()) == pytest.approx(p.peak_memory)


def test_megatron_loss_works_in_place(tiny):
    # vocab_parallel_cross_entropy: one fp32 softmax, turned into the gradient in place, + the bf16 gradient
    assert sm.loss_bytes_per_logit("eager", 2.0, megatron=True) == (6.0, 6.0)
    assert sm.loss_bytes_per_logit("eager", 2.0) == (12.0, 10.0)
    p = pm.predict(tiny, "h100", pm.Strategy(micro_batch=2, framework="megatron"))
    assert p.memory["loss"] == pytest.approx(6 * 2 * 512 * 32768)


def test_freed_bf16_logits_stay_reserved(tiny):
    # eager F.cross_entropy(logits.float()): the freed 2-byte block fits neither 4-byte backward request
    assert sm.loss_hole_bytes_per_logit("eager", 2.0) == 2.0
    assert sm.loss_hole_bytes_per_logit("eager", 4.0) == 0.0              # fp32 training: no cast
    assert sm.loss_hole_bytes_per_logit("compiled", 2.0) == 0.0
    assert sm.loss_hole_bytes_per_logit("eager", 2.0, megatron=True) == 0.0
    p = pm.predict(tiny, "h100", pm.Strategy(micro_batch=2))
    assert p.memory["loss"] == pytest.approx(12 * 2 * 512 * 32768)        # the peak is the loss backward
    assert p.reserved_memory - 1.05 * p.peak_memory == pytest.approx(2 * 2 * 512 * 32768)
    fused = pm.predict(tiny, "h100", pm.Strategy(micro_batch=2, loss="fused"))
    assert fused.reserved_memory == pytest.approx(1.05 * fused.peak_memory)


def test_nemo_llama3_8b_cp2_fits_as_its_recipe_runs():
    # NeMo scripts/llm/performance/llama3_8b.py: grad_reduce_in_fp32 = False (bf16 main_grad); it ran
    case = next(c for c in read_published() if c.label == "nemo-llama3-8B-8-cp2")
    assert case.strategy.grad_reduce_fp32 is False
    p = pm.predict(case.model, case.cluster, case.strategy)
    assert p.fits
    assert p.memory["gradients"] == pytest.approx(2 * case.model.params, rel=1e-6)
    layer_gemm = 4096 * (4096 + 1024 + 1024 + 4096) + 3 * 4096 * 14336      # q, k, v, o; gate, up, down
    assert p.memory["fp8_weights"] == pytest.approx(2 * 32 * layer_gemm)        # 32 layers, 1 + 1 B, tp = 1
    fp32 = pm.predict(case.model, case.cluster, case.strategy.replace(grad_reduce_fp32=None))
    assert not fp32.fits                                                      # Megatron-LM's default would not
