"""A search priced in small chunks, or shared among processes, ranks exactly as one pass does.

``perfmodel/explore/chunks.py`` keeps only the best ``top_k`` rows of each chunk; a row lost
between chunks, a tie broken differently or a count added twice would change the table.
"""

from __future__ import annotations

import multiprocessing

import pandas as pd
import pytest

import perfmodel as pm
from perfmodel.explore import search

MODEL = pm.transformer(layers=8, hidden=1024, heads=16, seq=1024, vocab=32000, name="small")
CLUSTER = pm.cluster("dgx-h100", nodes=2)


@pytest.fixture(scope="module")
def whole():
    return search(MODEL, CLUSTER, 64, top_k=50, chunk=1_000_000)


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_exact=True)
    for k in ("rejected", "rejected_detail", "evaluated", "feasible"):
        assert a.attrs[k] == b.attrs[k], k


def test_small_chunks_give_the_same_table(whole):
    assert whole.attrs["evaluated"] > 5_000 and len(whole) == 50
    _same(whole, search(MODEL, CLUSTER, 64, top_k=50, chunk=3000))  # several chunks (of grid rows) per space


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_two_processes_give_the_same_table(whole):
    _same(whole, search(MODEL, CLUSTER, 64, top_k=50, workers=2))


def test_default_space_spans_context_parallelism_stacks_and_sharding(whole):
    assert {1, 2, 4, 8, 16} == set(search(MODEL, CLUSTER, 64, top_k=1_000_000, recompute="full")["cp"])
    assert set(whole["framework"]) <= {"pytorch", "megatron", "deepspeed", "torchtitan", "fsdp1"}
    narrow = search(MODEL, CLUSTER, 64, top_k=1, cp=1, framework="pytorch", tp_overlap=False, fsdp=(None,))
    # the valid configurations of each space: priced, or left unpriced because their job's bound missed the top rows
    valid = lambda df: df.attrs["evaluated"] + df.attrs["pruned"]  # noqa: E731
    assert valid(narrow) * 5 < valid(whole)


def test_a_cp_list_leaves_out_sizes_the_sequence_cannot_take():
    odd = pm.transformer(layers=4, hidden=512, heads=8, seq=12, vocab=1000, name="short")
    top = search(odd, CLUSTER, 16, top_k=1000, recompute="none")
    assert set(top["cp"]) == {1, 2}  # 12 tokens: 2 × cp chunks for cp 1, 2 (3 and 6 are not tried)


def test_the_best_rows_are_what_predict_says(whole):
    # the factored grid (rows x sharding x sp x overlap x bucket x dp overlap) against one prediction each
    from perfmodel.explore import strategy_of

    for _, row in whole.head(8).iterrows():
        p = pm.predict(MODEL, CLUSTER, strategy_of(row))
        for k in ("step_time", "peak_memory", "tokens_per_second", "mfu"):
            assert row[k] == pytest.approx(getattr(p, k), rel=1e-9), k
        assert (row["step_time_low"], row["step_time_high"]) == pytest.approx(p.interval, rel=1e-9)


def test_the_factored_grid_reads_out_the_flat_space_in_order():
    from perfmodel.explore.space import NUMERIC, enumerate_space

    space = enumerate_space(MODEL, 16, 8, 64, cp=1, tp_overlap=(False, True), fsdp=(None, "full", "hybrid"),
                            bucket_mib=(25.0, 100.0), dp_overlap=(True, False))
    grid = space.grid()
    assert grid.mask.sum() == len(space) < grid.mask.size
    for k in NUMERIC:
        assert grid.flat(grid.columns[k]).tolist() == space.arrays[k].tolist(), k
    sharded = grid.columns["zero"].reshape(-1) == 3  # ZeRO-3 / FSDP: nothing bucketed, one bucket tried
    assert sharded.any() and not grid.mask[:, sharded][..., 1:, :].any()


@pytest.mark.parametrize("options, message", [
    ({"bucket_mib": 0}, "'bucket_mib' must be > 0: got 0"),
    ({"bucket_mib": ()}, "'bucket_mib' must list at least one value"),
    ({"bucket_mib": 1e-9}, "'bucket_mib' must be >="),
    ({"dp_overlap": "maybe"}, "dp_overlap"),
])
def test_bucket_and_overlap_options_are_checked(options, message):
    from perfmodel.core.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match=message.replace("(", r"\(")):
        search(MODEL, CLUSTER, 64, **options)
