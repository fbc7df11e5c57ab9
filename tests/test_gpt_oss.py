"""gpt-oss as transformers builds it: biases on the attention, the experts and the router, a sink logit per head,
a sliding window on every other block (``from_hf_config``, presets ``gpt-oss-120b`` and ``gpt-oss-20b``)."""

import json
from pathlib import Path

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.explore import strategy_of
from perfmodel.workload.kernels import layer_kernels

FIXTURES = Path(__file__).parent / "fixtures" / "hf"


def test_counts_and_fields_follow_the_model_card():
    m = pm.from_hf_config(FIXTURES / "gpt-oss-120b.json")
    assert (m.window, m.global_layers, m.attention_sinks, m.bias, m.experts, m.experts_per_token, m.head_dim) == \
        (128, 18, True, True, 128, 4, 64)
    # model card Table 1: 116.83B total, 5.13B active (counting the unembedding, not the embedding)
    assert m.params == 116_829_156_672 and m.active_params - m.embedding_params == 5_132_849_472
    assert pm.preset("gpt-oss-120b").params == m.params and pm.preset("gpt-oss-20b").params == 20_914_757_184
    sinkless = m.with_(attention_sinks=False)
    assert m.params - sinkless.params == 36 * 64  # one logit per head per block
    unbiased = m.with_(bias=False)
    per_block = 64 * 64 + 2 * 8 * 64 + 2880 + 128 * (2 * 2880 + 2880) + 128  # q, k, v, o; experts; router
    assert m.params - unbiased.params == 36 * per_block


def test_a_biased_router_adds_its_bias_gradient():
    cfg = json.loads((FIXTURES / "gpt-oss-20b.json").read_text())
    m = pm.from_hf_config({**cfg, "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"]},
                          seq=4096)
    _, bwd = layer_kernels(m, 1)
    assert "moe.router.b_grad" in {k.name for k in bwd}
    _, plain = layer_kernels(m.with_(bias=False), 1)
    assert "moe.router.b_grad" not in {k.name for k in plain}


def test_search_rows_are_what_predict_says_and_the_interval_names_the_window():
    m = pm.preset("gpt-oss-20b").with_(layers=4, global_layers=2)
    node = pm.cluster("dgx-h100")
    top = pm.search(m, node, 8, top_k=3, framework="megatron", max_micro_batch=2, cp=(1,))
    assert len(top)
    for _, row in top.iterrows():
        p = pm.predict(m, node, strategy_of(row))
        np.testing.assert_allclose(row["step_time"], p.step_time, rtol=1e-9)
    p = pm.predict(m, node, pm.Strategy(dp=8, ep=8, micro_batch=1, framework="megatron", zero=1))
    assert p.interval_regime.startswith("uncalibrated:") and p.fits


def test_bad_values_name_the_field():
    with pytest.raises(pm.InvalidInputError, match="'attention_sinks' must be True or False"):
        pm.transformer(attention_sinks=2)
    cfg = json.loads((FIXTURES / "gpt-oss-20b.json").read_text())
    with pytest.raises(pm.InvalidInputError, match="lacks required keys: num_local_experts"):
        pm.from_hf_config({k: v for k, v in cfg.items() if k != "num_local_experts"})
