"""Strategy validation: one clear error naming the fields and a valid nearby choice."""

import re

import pytest

import perfmodel as pm
from perfmodel.core.errors import InvalidInputError
from perfmodel.parallel.strategy import PLACEMENTS, Strategy, check_against

GPT2 = pm.preset("gpt2-small")          # 12 layers, 12 heads
LLAMA = pm.preset("llama-3-8b")         # 32 heads, 8 kv heads


def fails(match, fn, *args, **kwargs):
    with pytest.raises(InvalidInputError, match=re.escape(match)):
        fn(*args, **kwargs)


def test_tp_must_divide_heads_and_kv_heads():
    fails("'tp' must divide heads=12: got 5 (valid: 1, 2, 3, 4, 6, 12)", check_against, GPT2, 5, Strategy(tp=5))
    fails("'tp' must divide kv_heads=8: got 16 (valid: 1, 2, 4, 8)", check_against, LLAMA, 16, Strategy(tp=16))


def test_pp_at_most_layers():
    fails("'pp'=16 must be <= layers=12 (each stage needs a layer; e.g. pp=12)", check_against, GPT2, 16,
          Strategy(pp=16))


def test_gpu_count_mismatch_suggests_dp():
    fails("dp × tp × pp = 1 × 2 × 2 = 4 must equal the cluster's GPU count 16 (e.g. dp=4 with tp=2, pp=2)",
          check_against, GPT2, 16, Strategy(dp=1, tp=2, pp=2))
    fails("(e.g. tp=6, pp=1, dp=2: tp × pp must divide 12)", check_against, GPT2, 12, Strategy(tp=8, pp=1))
    check_against(GPT2, 16, Strategy(tp=2, pp=2))  # dp left out: filled, 16 / (2 × 2) = 4


def test_global_batch_divisible_by_dp_times_micro_batch():
    fails("'global_batch'=100 must be a multiple of dp × micro_batch = 16 (nearby: 96 or 112)",
          Strategy, dp=4, micro_batch=4, global_batch=100)


def test_parameter_server_excludes_sharding():
    fails("a parameter server ('ps_servers' > 0) cannot be combined with 'zero' or 'fsdp' sharding: got zero=2",
          Strategy, dp=4, ps_servers=2, zero=2)
    fails("parameter-server training here is data parallel only: use tp=1, pp=1", Strategy, tp=2, ps_servers=1)


def test_interleaving_rules():
    fails("'virtual_stages'=2 needs a schedule that loops over model chunks: 'interleaved', 'interleaved-zb', 'zbv', "
          "'dualpipev', 'looped-bfs' (got '1f1b')",
          Strategy, pp=2, virtual_stages=2)
    fails("schedule='interleaved' needs pp > 1", Strategy, schedule="interleaved")
    fails("interleaved schedule needs layers=12 divisible by pp × virtual_stages = 2 × 4 (try virtual_stages in "
          "[1, 2, 3, 6])", check_against, GPT2, 2,
          Strategy(pp=2, schedule="interleaved", virtual_stages=4, micro_batch=1, global_batch=4))
    fails("interleaved schedule needs the micro-batches per step (3) to be a multiple of pp=2",
          check_against, GPT2, 2, Strategy(pp=2, schedule="interleaved", virtual_stages=2, global_batch=24))


def test_stage_layers():
    fails("'stage_layers' must list one layer count per pipeline stage (pp=2): got 3 counts (4, 4, 4)",
          Strategy, pp=2, stage_layers=(4, 4, 4))
    fails("'stage_layers'=(5, 5) must add up to layers=12: got 10", check_against, GPT2, 2,
          Strategy(pp=2, stage_layers=(5, 5)))
    fails("'stage_layers'=(4, 5, 4) must be multiples of virtual_stages=2", Strategy, pp=3, schedule="interleaved",
          virtual_stages=2, stage_layers=(4, 5, 4))
    # the first and the last stage may be one short: the embedding / the loss takes a chunk's slot
    assert Strategy(pp=2, schedule="interleaved", virtual_stages=2, stage_layers=(5, 7)).stage_layers == (5, 7)
    fails("must be multiples of virtual_stages=4", Strategy, pp=2, schedule="interleaved", virtual_stages=4,
          stage_layers=(6, 8))
    assert Strategy(pp=2, stage_layers=[5, 7]).stage_layers == (5, 7)


def test_choices_name_the_field():
    for field, value in (("framework", "jax"), ("attention", "ring"), ("placement", "dp-dp-tp"),
                         ("schedule", "zb-h1")):
        with pytest.raises(pm.errors.PerfModelError, match=field):
            Strategy(**{field: value})
    assert len(PLACEMENTS) == 6
    with pytest.raises(InvalidInputError, match="'tp_overlap' must be True or False"):
        Strategy(tp_overlap=2)  # 1/0 and "true"/"off" are read as a TOML file or strategy text gives them
    assert Strategy(tp_overlap=1).tp_overlap is True


def test_predict_raises_the_same_messages():
    with pytest.raises(InvalidInputError, match=re.escape("'tp' must divide heads=12: got 8")):
        pm.predict(GPT2, pm.cluster("dgx-a100-80gb"), Strategy(tp=8))


def test_valid_strategies_pass():
    check_against(LLAMA, 64, Strategy(dp=2, tp=8, pp=4, micro_batch=1, global_batch=16, schedule="interleaved",
                                      virtual_stages=2, sequence_parallel=True, recompute="selective"))
    check_against(GPT2, 16, Strategy(dp=16, fsdp="hybrid"))


def test_booleans_are_not_sizes():
    with pytest.raises(pm.InvalidInputError, match="'dp' must be an integer >= 1: got True"):
        pm.Strategy(dp=True)
    assert pm.Strategy(dp=2.0).dp == 2  # a whole float is still a size
