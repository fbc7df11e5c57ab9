"""From Python as the README shows it: dp filled like the CLI, sweeps that say what they did, plots,
and a package whose names, types and extras are declared."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.explore.sweep import sweep

ROOT = Path(__file__).resolve().parents[1]


# --- item 2: Python fills dp as the CLI does ---------------------------------------------------


def test_strategy_dp_fills_from_the_cluster_as_the_cli_does():
    from perfmodel.cli import main

    p = pm.predict(pm.preset("gpt2-small"), pm.cluster("dgx-h100"),
                   pm.Strategy(fsdp="full", micro_batch=1, global_batch=64))
    assert p.strategy.dp == 8 and p.strategy.micro_batches == 8
    explicit = pm.predict("gpt2-small", "dgx-h100", pm.Strategy(dp=8, fsdp="full", micro_batch=1, global_batch=64))
    assert p.step_time == explicit.step_time
    assert pm.predict("llama-2-7b", pm.cluster("dgx-h100", nodes=2), pm.Strategy(tp=4, pp=2, micro_batch=1)).strategy.dp == 2
    with pytest.raises(pm.InvalidInputError, match=r"tp × pp × cp = 3 × 1 × 1 = 3 must divide the cluster's GPU "
                                                   r"count 8 to fill dp"):
        pm.predict("gpt2-small", "dgx-h100", pm.Strategy(tp=3))
    with pytest.raises(pm.InvalidInputError, match=r"'dp' is not set yet"):
        _ = pm.Strategy(global_batch=64).micro_batches  # needs dp: filled by predict, or given
    with pytest.raises(pm.InvalidInputError, match=r"'dp' is not set yet"):
        _ = pm.Strategy().batch
    assert pm.fill_dp(pm.Strategy(tp=2), 8).dp == 4 and pm.fill_dp(pm.Strategy(dp=2, tp=2), 8).dp == 2
    # the same as `perfmodel predict` without --dp
    assert main(["predict", "--model", "gpt2-small", "--gpu", "dgx-h100", "--fsdp", "full", "--micro-batch", "1",
                 "--global-batch", "64", "--json"]) == 0


def test_explore_and_analysis_take_a_strategy_without_dp():
    c = pm.cluster("dgx-h100")
    df = pm.compare("gpt2-small", c, [pm.Strategy(micro_batch=2), pm.Strategy(tp=2, micro_batch=2)])
    assert df["dp"].tolist() == [8, 4]
    assert sweep("gpt2-small", "micro_batch", [1, 2], cluster=c, strategy=pm.Strategy(tp=2))["dp"].tolist() == [4, 4]
    expr = pm.symbolic_step_time("gpt2-small", "h200", pm.Strategy(micro_batch=4), free=())
    assert float(expr) == pytest.approx(pm.predict("gpt2-small", "h200", pm.Strategy(micro_batch=4)).step_time,
                                        rel=0.02)


# --- item 3: sweep scaling ---------------------------------------------------------------------


def test_sweep_scaling_weak_and_strong_and_unfit_points():
    c = pm.cluster("dgx-h100")
    s = pm.Strategy(micro_batch=1, global_batch=32)
    weak = sweep("gpt2-small", "gpus", [8, 16, 32], cluster=c, strategy=s, scaling="weak")
    strong = sweep("gpt2-small", "gpus", [8, 16], cluster=c, strategy=s, scaling="strong")
    assert weak["global_batch"].tolist() == [32, 64, 128] and strong["global_batch"].tolist() == [32, 32]
    assert weak.attrs["batch_note"].startswith("weak scaling: the global batch grows with the GPU count, from 32 at 8")
    assert strong.attrs["batch_note"].startswith("strong scaling: the global batch stays 32")
    with pytest.raises(pm.UnknownNameError, match=r"unknown scaling 'linear' \(known: strong, weak\)"):
        sweep("gpt2-small", "gpus", [8], cluster=c, strategy=s, scaling="linear")
    # a first point that does not fit has no speed-up or efficiency; the first that fits is the base
    big = pm.Strategy(fsdp="full", micro_batch=1, global_batch=256, recompute="full")
    df = sweep("llama-2-70b", "nodes", [1, 4], cluster=c, strategy=big, scaling="strong")
    assert df["fits"].tolist() == [False, True]
    assert np.isnan(df["speedup"][0]) and np.isnan(df["scaling_efficiency"][0])
    assert df["speedup"][1] == 1.0 and df["scaling_efficiency"][1] == 1.0
    none = sweep("llama-2-70b", "nodes", [1], cluster=c, strategy=big)
    assert np.isnan(none["scaling_efficiency"]).all()


# --- item 4: plots -------------------------------------------------------------------------------


def _overlaps(fig, ax) -> bool:
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.get_xticklabels() if t.get_text()]
    return any(a.overlaps(b) for a, b in zip(boxes, boxes[1:]))


def test_plots_overlay_title_log_axes_and_labels():
    pytest.importorskip("matplotlib")
    from perfmodel.report.plots import compare_figure, sweep_figure

    c = pm.cluster("dgx-h100")
    fsdp = sweep("llama-2-7b", "nodes", [1, 2, 4, 8, 16], cluster=c, scaling="strong",
                 strategy=pm.Strategy(fsdp="full", micro_batch=1, global_batch=512))
    three_d = sweep("llama-2-7b", "nodes", [1, 2, 4, 8, 16], cluster=c, scaling="strong",
                    strategy=pm.Strategy(tp=4, pp=2, micro_batch=1, global_batch=512))
    fig = sweep_figure({"FSDP": fsdp, "3D": three_d})
    throughput = fig.axes[0]
    assert [line.get_label() for line in throughput.get_lines()][:2] == [
        f"FSDP ({fsdp.attrs['strategy']})", f"3D ({three_d.attrs['strategy']})"]
    assert "FSDP vs 3D" in fig._suptitle.get_text()
    one = sweep_figure(fsdp)
    title = one._suptitle.get_text()
    assert "llama-2-7b on h100-sxm5-80gb" in title and "fsdp=full" in title and "global batch 512" in title
    time_axis = one.axes[2]
    assert fsdp["step_time"].max() / fsdp["step_time"].min() > 10 and time_axis.get_yscale() == "log"
    # no point fits: no 100% efficiency drawn
    unfit = sweep("llama-2-70b", "nodes", [1], cluster=c, strategy=pm.Strategy(micro_batch=1, global_batch=64))
    eff = sweep_figure(unfit).axes[1]
    assert not eff.get_lines() and any("no point fits" in t.get_text() for t in eff.texts)
    # seven strategies: tick labels do not overlap
    specs = ["dp=8,mb=1", "tp=2,mb=1", "tp=4,mb=1", "tp=8,mb=1", "pp=2,mb=1", "tp=2,pp=2,mb=1", "dp=8,mb=1,zero=3"]
    cmp = compare_figure(pm.compare("llama-2-7b", c, specs, defaults={"global_batch": 64}))
    assert not any(_overlaps(cmp, ax) for ax in cmp.axes)


# --- item 12: package hygiene --------------------------------------------------------------------


def test_lazy_names_are_listed_and_typed_marker_ships():
    for name in ("compare", "sweep", "search", "from_torch", "from_hf_config", "from_hf_hub", "plan_training",
                 "predict_mixed", "symbolic_step_time", "fill_dp"):
        assert name in pm.__all__ and name in dir(pm)
        assert callable(getattr(pm, name))
    assert all(hasattr(pm, name) for name in pm.__all__)
    assert (ROOT / "perfmodel" / "py.typed").exists()
    text = (ROOT / "pyproject.toml").read_text()
    core = re.search(r"dependencies = \[(.*?)\]", text, re.S).group(1)
    assert "matplotlib" not in core and "tqdm" not in core and "scikit-learn" not in core
    assert re.search(r'^plot = \["matplotlib', text, re.M) and re.search(r'^torch = \["torch[^"]*", "tqdm', text, re.M)
    assert re.search(r'^hf = \["huggingface_hub', text, re.M) and "py.typed" in text


def test_missing_matplotlib_names_the_extra(monkeypatch, capsys):
    from perfmodel.report.plots import compare_figure

    df = pm.compare("gpt2-small", "dgx-h100", ["dp=8"])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(pm.UnsupportedError, match=r"plots need matplotlib, which is not installed: "
                                                  r"pip install 'perfmodel\[plot\]'"):
        compare_figure(df)
    from perfmodel.cli import main

    assert main(["compare", "--model", "gpt2-small", "--gpu", "dgx-h100", "--strategies", "dp=8", "--plot",
                 "c.png"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "pip install 'perfmodel[plot]'" in captured.err  # refused before any work

def test_mape_and_kfold_by_hand():
    from perfmodel.fit.regression import kfold, mape

    pred, meas = np.array([1.1, 1.8, 3.0]), np.array([1.0, 2.0, 3.0])
    assert mape(pred, meas) == pytest.approx((0.1 + 0.1 + 0.0) / 3)
    assert np.isnan(mape([], []))
    folds = list(kfold(7, 3, seed=0))
    assert [len(test) for _, test in folds] == [3, 2, 2]  # the first n % k folds one row larger
    held = np.concatenate([test for _, test in folds])
    assert sorted(held) == list(range(7))  # every row held out exactly once
    assert all(set(train).isdisjoint(test) and len(train) + len(test) == 7 for train, test in folds)
