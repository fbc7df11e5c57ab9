"""Compiled blocks under torch's split-backward schedules: each of the two passes runs the whole backward."""

from __future__ import annotations

import random

import pytest

import perfmodel as pm
from perfmodel.parallel.zero_bubble import compiled_dualpipev_drain, interleaved_zb_drain, zbv_drain
from test_zero_bubble import _orders, _run


def _compiled_backward_runs(split: bool) -> int:
    """How often the compiled blocks' backward graphs run for one backward of three compiled blocks, split
    into torch pipelining's input- and weight-gradient passes or whole."""
    torch = pytest.importorskip("torch")
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    runs = [0]

    def counted(gm, _inputs):
        def backward(*args):
            runs[0] += 1
            return gm(*args)
        return make_boxed_func(backward)

    backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm), bw_compiler=counted)
    torch._dynamo.reset()
    class Block(torch.nn.Module):  # a module of its own: dynamo traces no torch.nn built-in's frame alone
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x):
            return x + self.b(torch.relu(self.a(x)))

    blocks = torch.nn.Sequential(*[Block() for _ in range(3)])
    for block in blocks:
        block.compile(backend=backend, fullgraph=True)  # in place, as torchtitan's apply_compile does
    x = torch.randn(4, 16, requires_grad=True)
    y = blocks(x)
    grad = torch.ones_like(y)
    if split:
        _, groups = stage_backward_input([y], [grad], [x], blocks.parameters())
        stage_backward_weight(blocks.parameters(), groups)
    else:
        y.backward(grad)
    assert all(p.grad is not None for p in blocks.parameters())
    return runs[0]


def test_torch_runs_a_compiled_blocks_backward_in_both_split_passes():
    assert _compiled_backward_runs(split=False) == 3
    assert _compiled_backward_runs(split=True) == 6


def _checkpointed_forward_runs(split: bool) -> int:
    """How often three eager blocks under activation checkpointing run their forward for one forward and backward,
    the backward split into torch pipelining's two passes or whole."""
    torch = pytest.importorskip("torch")
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    from torch.utils.checkpoint import checkpoint

    runs = [0]

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def inner(self, x):
            runs[0] += 1
            return x + self.b(torch.relu(self.a(x)))

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False)  # torchtitan's checkpoint_wrapper: non-reentrant

    blocks = torch.nn.Sequential(*[Block() for _ in range(3)])
    x = torch.randn(4, 16, requires_grad=True)
    y = blocks(x)
    if split:
        _, groups = stage_backward_input([y], [torch.ones_like(y)], [x], blocks.parameters())
        stage_backward_weight(blocks.parameters(), groups)
    else:
        y.backward(torch.ones_like(y))
    return runs[0]


def test_torch_recomputes_a_checkpointed_forward_in_both_split_passes():
    assert _checkpointed_forward_runs(split=False) == 6  # the forward and one recomputation
    # and again in the weight-gradient pass, once per weight group: two linears per block
    assert _checkpointed_forward_runs(split=True) == 6 + 3 * 2


def test_the_compiled_forms_are_torchs_orders_with_whole_backwards():
    rng = random.Random(20261207)
    for _ in range(24):
        schedule = rng.choice(["interleaved-zb", "zbv", "dualpipev"])
        pp = rng.choice([2, 3, 4, 6])
        m = rng.randint(2 * pp, 3 * pp) if schedule != "interleaved-zb" else pp * rng.choice([1, 2, 3])
        f, c = (10 ** rng.uniform(-1.0, 1.0) for _ in range(2))
        # a split pass (I or W) runs the whole compiled backward c, and so does a whole one (DualPipeV's pairs)
        step = _run(_orders(schedule, pp, m, 2), f, c, c, whole=c)
        if schedule == "dualpipev":
            assert step == pytest.approx(2 * m * (f + c) + compiled_dualpipev_drain(f, c, pp), rel=1e-12)
        else:  # every backward split: the forms of eager blocks with b = w = c
            drain = (zbv_drain if schedule == "zbv" else interleaved_zb_drain)(f, c, c, pp)
            assert step == pytest.approx(2 * m * (f + 2 * c) + drain, rel=1e-12)


def test_a_compiled_zbv_plan_pays_its_backward_twice_and_dualpipev_in_its_bubble():
    model, cl = pm.preset("llama-3-8b"), pm.cluster("dgx-h100", nodes=1)

    def plan(schedule, compiled):
        return pm.predict(model, cl, pm.Strategy(dp=2, pp=4, micro_batch=1, global_batch=32, framework="torchtitan",
                                                 schedule=schedule, virtual_stages=2, compile=compiled,
                                                 recompute="none"))  # checkpointed eager blocks pay more: below

    base = plan("interleaved", True)
    for schedule in ("zbv", "interleaved-zb"):
        eager, compiled = plan(schedule, False), plan(schedule, True)
        assert compiled.breakdown["backward"] > 1.8 * base.breakdown["backward"]
        assert compiled.step_time > eager.step_time  # compiling loses more than its fusions save here
    dpv = plan("dualpipev", True)
    assert 1.7 < plan("zbv", True).breakdown["backward"] / dpv.breakdown["backward"] < 2.0  # its pairs run once
    assert dpv.breakdown["pipeline_bubble"] > 2 * plan("dualpipev", False).breakdown["pipeline_bubble"]
    assert dpv.step_time < plan("zbv", True).step_time


def test_an_eager_zbv_plan_recomputes_once_per_weight_group_where_it_checkpoints():
    model, cl = pm.preset("llama-3-8b"), pm.cluster("dgx-h100", nodes=1)

    def backward(schedule, recompute):
        return pm.predict(model, cl, pm.Strategy(dp=2, pp=4, micro_batch=1, global_batch=32, framework="torchtitan",
                                                 schedule=schedule, virtual_stages=2, recompute=recompute)
                          ).breakdown["backward"]

    assert backward("zbv", "none") == pytest.approx(backward("interleaved", "none"), rel=0.03)  # the head's rank only
    # nine forwards more per backward (a Llama block's weight groups), a forward about a third of such a backward
    grown = backward("zbv", "full") / backward("interleaved", "full")
    assert 3.0 < grown < 4.5


def test_a_checkpointed_eager_dualpipev_plan_pays_its_first_ranks_split_recomputations():
    model, cl = pm.preset("llama-3-8b"), pm.cluster("dgx-h100", nodes=1)

    def plan(schedule, recompute):
        return pm.predict(model, cl, pm.Strategy(dp=2, pp=4, micro_batch=1, global_batch=32, framework="torchtitan",
                                                 schedule=schedule, virtual_stages=2, recompute=recompute))

    dpv, plain = plan("dualpipev", "every-2"), plan("dualpipev", "none")
    assert dpv.breakdown["pipeline_bubble"] > 3 * plain.breakdown["pipeline_bubble"]  # 7 x 9 chunk recomputations
    assert plan("interleaved", "every-2").step_time < dpv.step_time < plan("zbv", "every-2").step_time
