"""Blocks as Gemma 2 and 3 build them: a sliding window on some blocks only (``Transformer.global_layers``), a norm
on each branch's output (``post_norms``) and capped logits (``logit_softcap``)."""

import json
from pathlib import Path

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.workload.kernels import head_kernels, layer_kernels
from perfmodel.workload.stack import adapt_kernels

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
BASE = dict(layers=6, hidden=2048, heads=16, kv_heads=4, seq=8192, vocab=32000, activation="swiglu",
            norm="rmsnorm", position="rotary", bias=False)
H100 = pm.cluster("h100")


def _sdpa(model, attention):
    fwd, bwd = layer_kernels(model, 1)
    return [k for k in adapt_kernels(fwd + bwd, precision="bf16-mixed", attention=attention) if k.cls == "sdpa"]


def _executed(kernels):
    return sum(k.flops * k.count for k in kernels)


def test_the_average_block_runs_the_windowed_kernel_in_its_share_of_the_blocks():
    full, near = pm.transformer(**BASE), pm.transformer(**BASE, window=1024)
    mixed = pm.transformer(**BASE, window=1024, global_layers=2)
    assert mixed.window_share == 4 / 6 and near.window_share == 1.0 and full.window_share == 0.0
    got = _sdpa(mixed, "flash2")
    assert sorted(k.count for k in got) == pytest.approx([1 / 3, 1 / 3, 2 / 3, 2 / 3])
    expected = 4 / 6 * _executed(_sdpa(near, "flash2")) + 2 / 6 * _executed(_sdpa(full, "flash2"))
    assert _executed(got) == pytest.approx(expected, rel=1e-12)
    # torch SDPA runs the whole causal square in every block
    assert _executed(_sdpa(mixed, "flash")) == pytest.approx(_executed(_sdpa(full, "flash")), rel=1e-12)
    s = pm.Strategy(micro_batch=1, attention="flash2")
    t = [pm.predict(m, H100, s).step_time for m in (near, mixed, full)]
    assert t[0] < t[1] < t[2]
    # the attention is the only kernel that changes: the step moves by the share of the windowed kernel's saving
    assert (t[2] - t[1]) == pytest.approx(4 / 6 * (t[2] - t[0]), rel=1e-6)
    assert pm.predict(mixed, H100, s).model_flops < pm.predict(full, H100, s).model_flops


def test_norms_on_the_branch_outputs():
    plain, sandwich = pm.transformer(**BASE), pm.transformer(**BASE, post_norms=True)
    assert sandwich.params - plain.params == 6 * 2 * 2048  # two RMSNorm weights more per block
    fwd, bwd = layer_kernels(sandwich, 1)
    names = [k.name for k in fwd]
    assert names.index("attn.proj") < names.index("ln1_post") < names.index("res1")
    assert names.index("mlp.fc2") < names.index("ln2_post") < names.index("res2")
    assert {"ln1_post.bwd", "ln2_post.bwd"} <= {k.name for k in bwd}
    s = pm.Strategy(micro_batch=1)
    a, b = pm.predict(plain, H100, s), pm.predict(sandwich, H100, s)
    assert b.step_time > a.step_time
    assert b.memory["activations"] > a.memory["activations"]  # each norm keeps its input and rstd


def test_capped_logits_cost_three_elementwise_kernels_each_way_and_keep_the_tanh_output():
    plain, capped = pm.transformer(**BASE), pm.transformer(**BASE, logit_softcap=30.0)
    fwd, bwd = head_kernels(capped, 2)
    caps = [k for k in fwd + bwd if k.name.startswith("softcap")]
    assert len(caps) == 6 and all(k.size["x"] == 2 * 8192 * 32000 for k in caps)
    assert not [k for k in sum(head_kernels(plain, 2), []) if k.name.startswith("softcap")]
    s = pm.Strategy(micro_batch=2)
    a, b = pm.predict(plain, H100, s), pm.predict(capped, H100, s)
    assert b.step_time > a.step_time
    assert b.memory["loss"] - a.memory["loss"] == pytest.approx(2.0 * 2 * 8192 * 32000)  # bf16 tanh output
    chunked = pm.Strategy(micro_batch=2, loss="chunked")  # no logits tensor of the whole batch, capped or not
    assert pm.predict(capped, H100, chunked).memory["loss"] == pm.predict(plain, H100, chunked).memory["loss"]


def test_search_rows_of_a_gemma_model_are_what_predict_says():
    gemma = pm.preset("gemma-2-9b").with_(seq=4096, layers=4, global_layers=2)
    top = pm.search(gemma, pm.cluster("dgx-h100"), 8, top_k=3, attention="flash2", framework="pytorch",
                    max_micro_batch=2, cp=(1,))
    assert len(top)
    for _, row in top.iterrows():
        p = pm.predict(gemma, pm.cluster("dgx-h100"), pm.explore.strategy_of(row))
        np.testing.assert_allclose(row["step_time"], p.step_time, rtol=1e-9)


def test_configs_say_which_blocks_are_windowed():
    gemma2 = json.loads((FIXTURES / "gemma-2-2b.json").read_text())
    m = pm.from_hf_config(gemma2)  # Gemma2Config: block i windowed when i + 1 is odd
    assert (m.window, m.global_layers, m.post_norms, m.logit_softcap) == (4096, 13, True, 30.0)
    assert pm.from_hf_config({**gemma2, "num_hidden_layers": 5}).global_layers == 2
    types = ["full_attention"] * 20 + ["sliding_attention"] * 6
    assert pm.from_hf_config({**gemma2, "layer_types": types}).global_layers == 20
    assert pm.from_hf_config({**gemma2, "layer_types": ["full_attention"] * 26}).window == 0
    assert pm.from_hf_config({**gemma2, "final_logit_softcapping": None}).logit_softcap == 0.0
    gemma3 = pm.from_hf_config(FIXTURES / "gemma-3-1b-it.json")  # one block in sliding_window_pattern (6) global
    assert (gemma3.window, gemma3.global_layers, gemma3.qk_norm, gemma3.logit_softcap) == (512, 4, "head", 0.0)
    mistral = pm.from_hf_config(FIXTURES / "mistral-7b-v0.1.json")
    assert (mistral.window, mistral.global_layers) == (4096, 0)
    with pytest.raises(pm.InvalidInputError, match="'layer_types' must list one of"):
        pm.from_hf_config({**gemma2, "layer_types": ["sliding_attention"] * 3})
    with pytest.raises(pm.InvalidInputError, match="'final_logit_softcapping' must be > 0"):
        pm.from_hf_config({**gemma2, "final_logit_softcapping": -1.0})


def test_bad_values_name_the_field():
    with pytest.raises(pm.InvalidInputError, match="'global_layers'=2 are the blocks without the sliding window: it "
                                                   "needs window > 0"):
        pm.transformer(**BASE, global_layers=2)
    with pytest.raises(pm.InvalidInputError, match="'global_layers' must be an integer between 0 and 5"):
        pm.transformer(**BASE, window=1024, global_layers=6)
    with pytest.raises(pm.InvalidInputError, match="'logit_softcap' must be a finite number"):
        pm.transformer(**BASE, logit_softcap=float("nan"))
    with pytest.raises(pm.InvalidInputError, match="'post_norms' must be True or False"):
        pm.transformer(**BASE, post_norms="yes")
    r = repr(pm.transformer(**BASE, window=1024, global_layers=2, post_norms=True, logit_softcap=30.0))
    assert "window=1024, global_layers=2, post_norms=True, logit_softcap=30" in r


def test_no_validation_row_ran_a_sliding_window_and_the_interval_says_so():
    s = pm.Strategy(micro_batch=1, attention="flash2")
    assert pm.predict(pm.transformer(**BASE, window=1024, global_layers=2), H100, s).interval_regime == \
        "uncalibrated: sliding_window=on in no validation row"
    assert "sliding_window" not in pm.predict(pm.transformer(**BASE, window=8192), H100, s).interval_regime


def test_the_toml_form_keeps_gemma_blocks(tmp_path):
    from perfmodel.workload.presets import model_from_toml

    fields = {**BASE, "window": 1024, "global_layers": 2, "post_norms": True, "logit_softcap": 30.0}
    path = tmp_path / "m.toml"
    path.write_text("\n".join(f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}".replace("'", '"')
                              for k, v in fields.items()))
    assert model_from_toml(path) == pm.transformer(**fields, name="m")
