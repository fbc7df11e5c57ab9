"""Sliding-window attention (``Transformer.window``): flash-attn 2/3 skip the key blocks outside the window, torch
SDPA and a context-parallel ring run the whole causal square (workload/stack.py ``windowed``)."""

import json
from pathlib import Path

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.explore import strategy_of
from perfmodel.workload.kernels import layer_kernels
from perfmodel.workload.stack import adapt_kernels

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
BASE = dict(layers=2, hidden=2048, heads=16, kv_heads=4, seq=8192, vocab=32000, activation="swiglu",
            norm="rmsnorm", position="rotary", bias=False)
H100 = pm.cluster("h100")


def _sdpa(model, attention, **kw):
    fwd, _ = layer_kernels(model, 2)
    return next(k for k in adapt_kernels(fwd, precision="bf16-mixed", attention=attention, **kw) if k.cls == "sdpa")


def test_a_windowed_kernel_is_causal_attention_over_the_window_for_more_sequences():
    """b·(s·W − W²/2) query-key pairs: causal attention of W tokens over b·(2s/W − 1) sequences."""
    full, windowed = pm.transformer(**BASE), pm.transformer(**BASE, window=2048)
    k = _sdpa(windowed, "flash2")
    assert (k.size["batch"], k.size["seq"], k.size["causal"]) == (2 * (2 * 8192 / 2048 - 1), 2048, 1.0)
    assert "window" not in k.size and "window" not in _sdpa(windowed, "flash").size
    pairs = lambda kern: kern.size["batch"] * kern.size["seq"] ** 2 / 2  # noqa: E731 (causal pairs per head)
    assert pairs(k) == 2 * (8192 * 2048 - 2048 ** 2 / 2)
    assert k.flops == _sdpa(full, "flash2").flops * 7 * (2048 / 8192) ** 2
    assert _sdpa(windowed, "flash").size == _sdpa(full, "flash").size  # SDPA: the whole square
    assert _sdpa(windowed, "flash3", cp=2).size == _sdpa(full, "flash3").size  # a ring's


def test_the_window_shortens_the_step_only_where_a_kernel_skips_blocks():
    full, windowed = pm.transformer(**BASE), pm.transformer(**BASE, window=2048)
    for attention in ("flash2", "flash3"):
        s = pm.Strategy(micro_batch=1, attention=attention)
        a, b = pm.predict(full, H100, s), pm.predict(windowed, H100, s)
        assert b.step_time < a.step_time and not b.caveats
        # model FLOPs count the scores computed: 3 passes x layers x 4 h d x (causal pairs of s, of the window)
        s_, w, per_pair = 8192, 2048, 3 * 2 * 4 * 16 * 128
        pairs = s_ * (s_ + 1) / 2 - (2 * s_ / w - 1) * w ** 2 * (s_ + 1) / (2 * s_)
        assert a.model_flops - b.model_flops == pytest.approx(per_pair * pairs, rel=1e-9)
    s = pm.Strategy(micro_batch=1)
    p = pm.predict(windowed, H100, s)
    assert p.step_time == pm.predict(full, H100, s).step_time
    assert "sliding window 2048 of 8192 tokens priced as full causal attention" in p.caveats[0]
    assert pm.predict(pm.transformer(**BASE, window=8192), H100, s).step_time == pm.predict(full, H100, s).step_time
    ring = pm.Strategy(dp=4, cp=2, micro_batch=1, attention="flash2", framework="torchtitan", global_batch=4)
    node = pm.cluster("dgx-h100")
    p = pm.predict(windowed, node, ring)
    assert p.step_time == pm.predict(full, node, ring).step_time and "context-parallel ring" in p.caveats[0]


def test_search_rows_of_a_windowed_model_are_what_predict_says():
    windowed = pm.transformer(**{**BASE, "seq": 4096}, window=1024)
    top = pm.search(windowed, pm.cluster("dgx-h100"), 16, top_k=3, attention="flash2", framework="pytorch",
                    max_micro_batch=2, cp=(1,))
    for _, row in top.iterrows():
        p = pm.predict(windowed, pm.cluster("dgx-h100"), strategy_of(row))
        np.testing.assert_allclose(row["step_time"], p.step_time, rtol=1e-9)


def test_configs_and_bad_values():
    mistral = json.loads((FIXTURES / "mistral-7b-v0.1.json").read_text())
    assert pm.from_hf_config(mistral).window == 4096
    assert pm.from_hf_config({**mistral, "sliding_window": None}).window == 0
    assert pm.from_hf_config(FIXTURES / "phi-3-mini-4k-instruct.json").window == 2047
    qwen2 = json.loads((FIXTURES / "qwen2-7b.json").read_text())
    assert pm.from_hf_config(qwen2).window == 0  # sliding_window set, use_sliding_window false
    # Qwen2Config: the window on the blocks from max_window_layers on (Qwen2-7B's 28 = all its blocks: none)
    assert pm.from_hf_config({**qwen2, "use_sliding_window": True}).window == 0
    some = pm.from_hf_config({**qwen2, "use_sliding_window": True, "max_window_layers": 21})
    assert (some.window, some.global_layers, some.window_share) == (131072, 21, 7 / 28)
    with pytest.raises(pm.InvalidInputError, match="'window' must be an integer >= 0: got -1"):
        pm.transformer(**BASE, window=-1)
    assert "window=2048" in repr(pm.transformer(**BASE, window=2048))
