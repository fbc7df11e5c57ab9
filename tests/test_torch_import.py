"""from_torch: FLOPs equal torch's FlopCounterMode, saved bytes by hand, errors with hints."""

import warnings

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.workload.graph import GraphModel

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional


def small_cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))


def gpt(layers=2, h=64, heads=4, seq=32, vocab=256):
    """The project's GPT (pre-LN blocks, learned positions, untied head, loss on fp32 logits)."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = (z.view(b, t, heads, h // heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(h, -1))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, h)
            x = x + self.proj(y)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, h), nn.Embedding(seq, h)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln, self.head = nn.LayerNorm(h), nn.Linear(h, vocab, bias=False)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            return self.head(self.ln(self.blocks(x))).float()
    return GPT()


def counted_flops(module, x, batch_targets):
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(module(x).reshape(-1, 10), torch.zeros(batch_targets, dtype=torch.long)).backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("make, shape", [(small_cnn, (4, 3, 32, 32)), (mlp, (4, 16))])
def test_flops_match_flop_counter_mode(make, shape):
    module = make()
    x = torch.randn(*shape)
    g = pm.from_torch(module, x)
    assert isinstance(g, GraphModel)
    expected = counted_flops(module, x, shape[0])
    assert g.flops_per_step(shape[0]) == pytest.approx(expected, rel=0.01)
    # sizes are affine in the batch: the same module at 16 samples, without re-tracing
    assert g.flops_per_step(16) == pytest.approx(counted_flops(module, torch.randn(16, *shape[1:]), 16), rel=0.01)


def test_gpt_flops_equal_flop_counter_and_the_transformer_builder():
    from torch.utils.flop_counter import FlopCounterMode

    from perfmodel.workload.torch_import import _flash_routing

    with torch.device("meta"):  # FlashAttention has no CPU kernel; meta tensors take any kernel
        module = gpt()
        idx = torch.zeros(2, 32, dtype=torch.long)
    g = pm.from_torch(module, idx, name="tiny-gpt")
    counter = FlopCounterMode(display=False)
    with _flash_routing(), counter:  # the fused attention kernel a GPU would run
        logits = module(idx)
        target = torch.zeros(64, dtype=torch.long, device="meta")
        F.cross_entropy(logits.reshape(-1, 256), target).backward()
    ref = pm.transformer(layers=2, hidden=64, heads=4, seq=32, vocab=256)
    assert g.flops_per_step(2) == pytest.approx(counter.get_total_flops(), rel=0.01)
    assert g.flops_per_step(2) == pytest.approx(ref.flops_per_step(2), rel=1e-9)
    assert g.params == ref.params
    assert g.classes == 32 * 256  # loss elements per sample: positions x vocabulary
    assert g.flops_by_class(2)["sdpa"] == pytest.approx(3.5 * 4 * 2 * 4 * 32 * 32 * 16 * 2)


def test_traced_gpt_prices_like_the_builder():
    """Same kernels as pm.transformer except views/copies: step times agree within 10%."""
    g = pm.from_torch(gpt(2, 256, 4, 128, 1024), torch.zeros(2, 128, dtype=torch.long))
    ref = pm.transformer(layers=2, hidden=256, heads=4, seq=128, vocab=1024)
    for precision in ("bf16-mixed", "fp32"):
        s = pm.Strategy(micro_batch=16, precision=precision)
        a, b = pm.predict(g, pm.cluster("h200"), s), pm.predict(ref, pm.cluster("h200"), s)
        assert a.step_time == pytest.approx(b.step_time, rel=0.10)


def test_saved_activation_bytes_by_hand():
    # Linear(16,32) saves its fp32 input x (16/sample); ReLU saves its output (32/sample), which the
    # second Linear saves too (same storage, counted once); weights are parameters, not activations.
    g = pm.from_torch(mlp(), torch.randn(4, 16))
    assert g.activation == {"low": 32.0, "f32": 16.0, "bytes": 0.0}
    assert g.activation_bytes_per_token(precision="bf16-mixed") == 16 * 4 + 32 * 2
    assert g.activation_bytes_per_token(precision="fp32") == 16 * 4 + 32 * 4
    assert g.activation_bytes_per_token(recompute="full") == 16 * 4  # only the input
    assert g.params == 16 * 32 + 32 + 32 * 10 + 10
    assert g.gemm_params == g.params  # every weight and bias feeds a GEMM autocast casts


def test_kernels_scale_with_batch_and_casts_follow_precision():
    g = pm.from_torch(small_cnn(), torch.randn(2, 3, 32, 32))
    fwd, _ = g.layer_kernels(np.array([8.0, 64.0]))
    conv = next(k for k in fwd if k.name == "aten.convolution" and k.cls == "conv")
    assert conv.variant == "fwd" and conv.size["kh"][0] == 3 and conv.size["groups"][0] == 1
    assert list(conv.size["m"]) == [8 * 32 * 32, 64 * 32 * 32]   # implicit-GEMM M = N·P·Q
    assert list(conv.size["n"]) == [8, 8] and list(conv.size["k"]) == [8 * 9, 8 * 9]  # Cout; Cin 3 -> 8, x 3x3
    weight_cast = next(k for k in fwd if k.name.endswith("weight_cast") and np.all(k.size["x"] == 216))
    assert weight_cast.cls == "cast_fp32_to_bf16"                  # 8x3x3x3 weights, batch-independent
    fwd32, _ = g.layer_kernels(8, precision="fp32")
    assert not any(k.cls.startswith("cast_") for k in fwd32)
    assert {k.dtype for k in fwd32 if k.cls in ("gemm", "conv")} == {"fp32"}


def test_json_round_trip(tmp_path):
    g = pm.from_torch(small_cnn(), torch.randn(2, 3, 16, 16), name="tiny-cnn")
    path = tmp_path / "tiny.json"
    g.save(path)
    from perfmodel.workload.graph import load_graph

    back = load_graph(path)
    assert back == g
    assert GraphModel.from_dict(g.to_dict()) == g


def test_unknown_op_is_counted_and_warned():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 4)

        def forward(self, x):
            return self.lin(torch.logcumsumexp(x, 1))
    with pytest.warns(UserWarning, match=r"not classified.*aten\.logcumsumexp \(x1\)"):
        g = pm.from_torch(Odd(), torch.randn(2, 8))
    odd = [o for o in g.ops if o.op == "aten.logcumsumexp"]
    assert odd and odd[0].cls == "bytes" and odd[0].size["f32"][1] > 0
    assert any("logcumsumexp" in n for n in g.notes)


def test_known_ops_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pm.from_torch(small_cnn(), torch.randn(2, 3, 16, 16))


def test_forward_failure_reraises_with_hint():
    with pytest.raises(RuntimeError) as info:
        pm.from_torch(nn.Linear(10, 5), torch.randn(2, 7))
    text = str(info.value) + "".join(getattr(info.value, "__notes__", []))
    assert "same reduction dim" in text  # the original (meta) error is kept
    assert "from_torch: the module's forward failed on the example inputs" in text


def test_data_dependent_forward_gets_the_hint():
    class ReadsValues(nn.Module):
        def forward(self, x):
            return x * float(x.sum().item())
    with pytest.raises(Exception) as info:
        pm.from_torch(ReadsValues(), torch.randn(2, 3))
    assert "does not read tensor values" in str(info.value) + "".join(getattr(info.value, "__notes__", []))


def test_bad_arguments():
    with pytest.raises(pm.InvalidInputError, match="'module' must be a torch.nn.Module: got str"):
        pm.from_torch("resnet", torch.randn(2, 3))
    with pytest.raises(pm.InvalidInputError, match="'example_inputs' must be a tensor"):
        pm.from_torch(mlp(), 3.0)
    with pytest.raises(pm.UnsupportedError, match="the loss must be a scalar tensor"):
        pm.from_torch(mlp(), torch.randn(2, 16), loss=lambda out: out)


def test_user_module_is_left_untouched():
    module = small_cnn().eval()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    pm.from_torch(module, torch.randn(2, 3, 16, 16))
    assert not module.training  # mode restored
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert all(p.grad is None and p.device.type == "cpu" for p in module.parameters())


def test_multihead_attention_is_routed_to_the_fused_kernel():
    mha = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0)
    g = pm.from_torch(mha, torch.randn(2, 16, 64), loss=lambda out: out.sum())
    assert {o.variant for o in g.ops if o.cls == "sdpa"} == {"fwd", "bwd"}
    assert not any(o.op == "aten.bmm" for o in g.ops)


def test_tensor_parallel_is_rejected():
    g = pm.from_torch(mlp(), torch.randn(2, 16))
    with pytest.raises(pm.UnsupportedError, match="only data parallelism is modelled"):
        g.check_strategy(pm.Strategy(tp=2, micro_batch=4))
    with pytest.raises(pm.UnsupportedError, match="tensor/sequence parallelism cannot split it"):
        g.layer_kernels(4, tp=2)


def test_a_dropout_mask_takes_its_templates_kind_so_traces_agree():
    """Dropout's mask comes from empty_like, which runs no kernel and is not recorded; its storage may reuse
    a freed tensor's address. Traced many times in one process (addresses reused differently each time),
    every trace records the same ops, and the mask is as low-precision as the activation it masks, so the
    next linear gets no input cast (autocast on a GPU runs dropout in bf16)."""
    from perfmodel.workload.torch_import import _trace

    module = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)  # dropout 0.1
    sigs = set()
    for _ in range(12):
        records = _trace(module, (torch.randn(2, 32, 64, device="meta"),), {}, lambda y: y.float().sum())["records"]
        sigs.add(tuple((r["op"], r["cls"], r["phase"], r["dtype"]) for r in records))
    assert len(sigs) == 1
    casts = [op for op, *_ in next(iter(sigs)) if op == "autocast.addmm.input_cast"]
    assert len(casts) == 1  # linear1, fed by the first layer norm's fp32 output; not linear2, fed by the dropout
