"""The shortcuts a large search takes give the numbers and the pruning of the plain way: GEMM tile
terms priced at once, each sharding branch priced on its own choices, compute times once per distinct
grid row, columns gathered at the kept rows only, and root floors computed only where needed."""

from __future__ import annotations

import importlib
from dataclasses import replace
from itertools import product

import numpy as np
import pandas as pd
import pytest

import perfmodel as pm
from perfmodel import step as compose
from perfmodel.core import layout, memo
from perfmodel.explore.space import enumerate_space, tp_pp_pairs
from perfmodel.costs.comm import _hierarchical_time
from perfmodel.forms.compute import _fastest_tile_one, _fastest_tile_terms, _tile_terms, gemm_tiles_gpu
from perfmodel.parallel.config import MIB, StepConfig
from perfmodel.parallel.data import by_sharding
from perfmodel.parallel.strategy import interleaves
from perfmodel.predict import default_profile

chunks_module = importlib.import_module("perfmodel.explore.chunks")
data_module = importlib.import_module("perfmodel.parallel.data")
stacked_module = importlib.import_module("perfmodel.parallel.stacked")
MODEL = pm.transformer(layers=4, hidden=1024, heads=16, seq=1024, vocab=32000, name="small")
H100 = pm.cluster("dgx-h100", nodes=2)
PROFILE = default_profile(H100)
# a tile-form GEMM entry (the H100's fp16 curve, fitted on its published shapes; its bf16 now carries the
# same die's measured two-regime curve): the tile fast paths below are checked on it
TILES = PROFILE.entry("gemm:fp16")


@pytest.fixture(scope="module")
def grid():
    space = enumerate_space(MODEL, 16, 8, 32, max_micro_batch=2, max_virtual_stages=2, fsdp=(None, "full", "hybrid"),
                            bucket_mib=(25.0, 100.0), dp_overlap=(True, False), tp_overlap=(False, True))
    g = space.grid()
    c = replace(StepConfig.from_space(g.columns, pm.Strategy(framework="megatron")),
                bucket_bytes=g.columns["bucket_mib"] * MIB, dp_overlap=g.columns["dp_overlap"])
    return g, c


def test_tile_terms_at_once_equal_the_terms_one_by_one():
    assert TILES["form"] == "gemm_tiles"
    rng = np.random.default_rng(7)
    p = {**TILES["params"], "t_cpu": 0.0}
    m = rng.choice([0.0, 1.0, 64.0, 1000.0, 8192.0, 3e5], size=(40, 1))
    n = rng.integers(0, 20_000, size=(1, 9)).astype(float)
    k = rng.choice([0.0, 8.0, 4096.0, 53248.0], size=(40, 9))
    for params in (p, {**p, "stream_k": 0.0}):
        with np.errstate(all="ignore"):
            one_by_one = np.minimum.reduce(_tile_terms(params, m, n, k))
            at_once = _fastest_tile_terms(params, m, n, k)
        assert np.array_equal(one_by_one, at_once, equal_nan=True)
    ints = rng.integers(1, 300_000, size=17), rng.integers(1, 60_000, size=17), rng.integers(1, 60_000, size=17)
    assert np.array_equal(np.minimum.reduce(_tile_terms(p, *ints)), _fastest_tile_terms(p, *ints))


def test_one_gemm_on_floats_is_the_least_of_its_terms():
    rng = np.random.default_rng(11)
    p = {**TILES["params"], "t_cpu": 0.0}
    for params in (p, {**p, "stream_k": 0.0}):
        for _ in range(400):
            m, n, k = (float(x) for x in (rng.integers(1, 300_000), rng.integers(1, 60_000), rng.integers(1, 60_000)))
            assert _fastest_tile_one(params, m, n, k) == min(_tile_terms(params, m, n, k))


def test_gemm_arrays_of_one_alignment_family_equal_the_mixed_arrays():
    """An array of aligned (or of misaligned) GEMMs prices one family only: each element as it is
    priced beside GEMMs of the other family, and as it is priced alone."""
    p = {**TILES["params"], "t_cpu": 0.0}
    m = np.array([[512.0], [8192.0], [3e4]])
    n = np.array([[4096.0, 4099.0, 1000.0, 12288.0, 12290.0, 12291.0]])
    k = np.array([[8192.0, 8192.0, 1002.0, 4096.0, 4096.0, 6000.0]])
    mixed = gemm_tiles_gpu(p, m, n, k)
    aligned = (n % 8 == 0) & (k % 8 == 0)  # 16-byte rows of 2-byte elements
    for cols in (np.flatnonzero(aligned[0]), np.flatnonzero(~aligned[0])):
        assert np.array_equal(gemm_tiles_gpu(p, m, n[:, cols], k[:, cols]), mixed[:, cols])
    for i, j in np.ndindex(*mixed.shape):
        assert gemm_tiles_gpu(p, np.array([m[i, 0]]), np.array([n[0, j]]), np.array([k[0, j]]))[0] == mixed[i, j]


def test_collective_arrays_in_one_branch_equal_them_priced_among_others():
    """Groups that all sit in one node (or all span nodes) are priced on the whole arrays: the same
    seconds as each group priced beside groups of the other branches."""
    coll = chunks_module._collectives(H100, PROFILE)
    size = np.array([1e3, 2**20, 3e8, 5e9, 7.0, 0.0])
    for algorithm in ("ring", "hierarchical"):
        for collective in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"):
            for rpn, nodes in ((np.full(6, 8.0), np.full(6, 1.0)), (np.full(6, 1.0), np.full(6, 4.0)),
                               (np.full(6, 4.0), np.full(6, 2.0))):
                alone = _hierarchical_time(coll, collective, size, rpn, nodes, algorithm)
                mixed = _hierarchical_time(coll, collective, np.r_[size, size], np.r_[rpn, [8.0] * 3 + [1.0] * 3],
                                           np.r_[nodes, [1.0] * 3 + [2.0] * 3], algorithm)
                assert np.array_equal(alone, mixed[:6])


def test_space_counted_by_row_class_is_the_one_cell_by_cell():
    """Each configuration of a small space (DeepSpeed's pipeline-engine rule reads cells, not rows)
    checked one by one against the rules in order: the same configurations in the same order, and
    each rejection counted under the first rule it breaks."""
    n, batch, layers, heads = 16, 32, MODEL.layers, MODEL.heads
    space = enumerate_space(MODEL, n, 8, batch, max_micro_batch=2, max_virtual_stages=2, fsdp=(None, "full"),
                            tp_overlap=(False, True), bucket_mib=(25.0, 100.0), dp_overlap=(True, False),
                            pipeline_engine=True)
    sharding = [(z, None) for z in (0, 1, 2, 3)] + [(3, "full")]
    kept, detail = [], {}
    for (tp, pp), mb, v, (z, f), sp, o, b, d in product(tp_pp_pairs(n, 8), (1, 2), (1, 2), sharding, (0, 1), (0, 1),
                                                      (0, 1), (0, 1)):
        dp = n // (tp * pp)
        if (v > 1 and pp == 1) or (z > 0 and dp == 1) or ((sp or o) and tp == 1) or ((b or d) and (z >= 3 or dp == 1)):
            continue  # the same configuration as another one: not enumerated
        rules = [("tp must divide heads", heads % tp != 0), ("tp must divide kv_heads", heads % tp != 0),
                 ("pp must be <= layers", pp > layers), ("interleaving needs", v > 1 and not interleaves(layers, pp * v)),
                 ("DeepSpeed's pipeline engine", v > 1 or (pp > 1 and z >= 2)),
                 ("global_batch=", batch % (dp * mb) != 0), ("interleaving needs micro-batches", v > 1 and (batch // (dp * mb)) % pp)]
        broken = next((text for text, bad in rules if bad), None)
        if broken is None:
            kept.append((dp, tp, pp, v, mb, z, f, bool(sp), bool(o), (25.0, 100.0)[b], (True, False)[d]))
        else:
            detail[broken] = detail.get(broken, 0) + 1
    got = list(zip(*(space.arrays[k].tolist() for k in ("dp", "tp", "pp", "virtual_stages", "micro_batch", "zero", "fsdp",
                                                         "sequence_parallel", "tp_overlap", "bucket_mib", "dp_overlap"))))
    assert got == kept and len(kept) > 100
    counted = {}
    for text, count in space.detail.items():
        key = next(k for k in sorted(detail, key=len, reverse=True) if text.startswith(k))
        counted[key] = counted.get(key, 0) + count
    assert counted == detail


def test_each_sharding_branch_priced_on_its_own_choices_is_the_nested_where(grid):
    _, c = grid
    assert np.asarray(c.shard_stage).shape[1] == 6  # zero 0..3, FSDP full and hybrid along one axis
    branches = (lambda cc: cc.dp * 1.5 + cc.bucket_bytes * np.where(cc.dp_overlap, 1.0, 2.0),
                lambda cc: cc.shard_stage * 2.0 + cc.micro_batches,
                lambda cc: np.where(cc.hybrid, 7.0, 3.0) * cc.micro_batches + np.where(cc.fsdp, 1.0, 0.5))
    nested = np.where(c.shard_stage >= 3, branches[2](c), np.where(c.shard_stage >= 1, branches[1](c), branches[0](c)))
    for others in ((), (np.ones((1, 6, 1, 1, 1, 1)),)):  # the second varies along the sharding axis: no split
        got = by_sharding(c, branches, others)
        assert got.shape == nested.shape and np.array_equal(got, nested)


def test_one_configuration_prices_its_own_sharding_branch_alone():
    # predict's configuration (0-d fields): only the branch np.where would pick runs, and gives its number
    strategy = pm.Strategy(dp=4, tp=2, micro_batch=2, global_batch=64)
    ran = []
    def branch_of(i):
        return lambda cc: (ran.append(i), cc.micro_batches * (i + 1.5))[1]

    branches = tuple(branch_of(i) for i in range(3))
    for zero, branch in ((0, 0), (1, 1), (2, 1), (3, 2)):
        c = StepConfig.from_strategy(replace(strategy, zero=zero))
        ran.clear()
        got = by_sharding(c, branches, (np.float64(1.0),))
        nested = np.where(c.shard_stage >= 3, 8 * 3.5, np.where(c.shard_stage >= 1, 8 * 2.5, 8 * 1.5))
        assert ran == [branch] and got.shape == () and got == nested


def test_compute_times_once_per_distinct_row_equal_every_row(grid):
    _, c = grid
    rows = []
    plain = compose.compute_times.__wrapped__

    def recorded(model, profile, cc, **options):
        rows.append(np.asarray(cc.micro_batch).shape[0])
        return plain(model, profile, cc, **options)

    n = np.asarray(c.micro_batch).shape[0]
    shared = memo._grid_deduplicated(recorded, MODEL, PROFILE, c, {"precision": "bf16-mixed", "recompute": "none"},
                                     {f: np.asarray(getattr(c, f)) for f in compose.COMPUTE_FIELDS
                                      if not isinstance(getattr(c, f), str)})
    every = plain(MODEL, PROFILE, c, precision="bf16-mixed", recompute="none")
    assert rows and rows[0] < n  # (micro-batch, tp) repeat across the grid's rows
    for name in ("layer_f", "layer_b", "embed_f", "head_b"):
        a, b = getattr(shared.wall, name), getattr(every.wall, name)
        shape = np.broadcast_shapes(np.shape(a), np.shape(b))
        assert np.array_equal(np.broadcast_to(a, shape), np.broadcast_to(b, shape))
    assert dict(shared.tp_gemms).keys() == dict(every.tp_gemms).keys()


def test_columns_gathered_at_kept_rows_are_the_flat_ones(grid):
    g, c = grid
    cells = np.array([0, 3, 7, int(g.mask.sum()) - 1])
    for value in (c.dp * c.bucket_bytes, np.asarray(c.shard_stage) + 0.5, 4.0):
        assert np.array_equal(g.at(value, cells), g.flat(value)[cells])


def test_lazy_root_floors_price_and_prune_as_all_floors_computed(monkeypatch):
    kwargs = dict(max_micro_batch=2, max_virtual_stages=2, cp=(1, 2), bucket_mib=(25, 100), top_k=3)
    exact, real = [], chunks_module.Floor.exact

    def counted(self):
        exact.append(self.known)
        return real(self)

    monkeypatch.setattr(chunks_module.Floor, "exact", counted)
    lazy = pm.search(MODEL, H100, 32, **kwargs)
    computed = exact.count(False)
    init = chunks_module.Floor.__init__
    monkeypatch.setattr(chunks_module.Floor, "__init__", lambda self, *a: (init(self, *a), self.exact())[0])
    eager = pm.search(MODEL, H100, 32, **kwargs)
    pd.testing.assert_frame_equal(lazy, eager, check_exact=True)
    assert {k: lazy.attrs[k] for k in ("evaluated", "feasible", "pruned", "rejected")} == \
        {k: eager.attrs[k] for k in ("evaluated", "feasible", "pruned", "rejected")}
    assert lazy.attrs["pruned"] > 0 and computed < exact.count(False) - computed  # fewer floors in full


def test_distinct_collectives_of_broadcast_groups_equal_each_call():
    coll = chunks_module._collectives(H100, PROFILE)
    rpn = np.array([[1.0], [8.0], [4.0], [8.0]])
    nodes = np.array([[4.0], [1.0], [2.0], [2.0]])
    sizes = [np.array([[1e3, 2**20, 3e8]]), np.array([[5e9], [7.0], [1.0], [2**20]])]
    for collective in ("all_reduce", "all_gather", "reduce_scatter"):
        got = stacked_module.stacked_time(coll, collective, sizes, rpn, nodes)
        for s, t in zip(sizes, got):
            one = _hierarchical_time(coll, collective, *np.broadcast_arrays(s, rpn, nodes), "ring")
            assert np.array_equal(np.broadcast_to(t, one.shape), one)


def test_a_configuration_keeps_read_only_arrays_and_copies_writable_ones():
    base = StepConfig.from_strategy(pm.Strategy(dp=4, tp=2, micro_batch=2, global_batch=64))
    frozen = np.array([1.0, 2.0])
    frozen.flags.writeable = False
    writable = np.array([3.0, 4.0])
    view = np.array([5.0, 6.0, 7.0])[:2]
    view.flags.writeable = False  # a read-only view of writable memory: copied
    c = replace(base, dp=frozen, tp=writable, pp=view)
    assert c.dp is frozen and c.tp is not writable and c.pp is not view
    writable[0], view.base[0] = 9.0, 9.0
    assert c.tp[0] == 3.0 and c.pp[0] == 5.0 and not c.tp.flags.writeable



def _evaluated(c):
    memo.clear_memos()
    coll = chunks_module._collectives(H100, PROFILE)
    return compose.evaluate(MODEL, H100, PROFILE, coll, c, precision="bf16-mixed", recompute="none",
                            optimizer="adamw", placement="tp-pp-dp")


@pytest.mark.parametrize("framework", ["megatron", "pytorch", "fsdp1"])
def test_terms_laid_out_rows_innermost_are_the_numbers_in_c_order(grid, framework, monkeypatch):
    g, c = grid
    c = replace(c, framework=framework)
    assert np.asarray(c.dp_overlap).shape[-1] == 2  # the window varies along rows and the last axis
    laid_out = []
    real = data_module.rows_inner
    monkeypatch.setattr(data_module, "rows_inner", lambda a: (laid_out.append(real(a).flags.f_contiguous), real(a))[1])
    rows_inner = _evaluated(c)
    assert any(laid_out)
    monkeypatch.setattr(data_module, "rows_inner", lambda a: a)
    c_order = _evaluated(c)
    for k in ("step_time", "dp_comm", "peak_memory"):
        assert np.array_equal(g.flat(rows_inner[k]), g.flat(c_order[k])), k


def test_rows_inner_changes_the_memory_order_only():
    a = np.arange(24.0).reshape(4, 1, 3, 2)
    f = layout.rows_inner(a)
    assert f.flags.f_contiguous and np.array_equal(f, a) and f.reshape(-1).tolist() == a.reshape(-1).tolist()
    one = np.arange(4.0).reshape(4, 1, 1)
    assert layout.rows_inner(one) is one and layout.rows_inner(2.5) == 2.5
