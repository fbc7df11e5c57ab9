"""``perfmodel plan`` and the cost-against-mix plot."""

from __future__ import annotations

import pandas as pd
import pytest

from perfmodel import cli
from perfmodel.core.errors import InvalidInputError
from perfmodel.cli.transient import parse_workers
from perfmodel.report.transient_plots import plot_cost_vs_mix


def test_parse_workers():
    assert parse_workers("k80:4, p100:2,v100:2") == [("k80", 4), ("p100", 2), ("v100", 2)]
    for bad in ("k80", "k80:0", "k80:x", ":3"):
        with pytest.raises(InvalidInputError, match="'--workers' must be GPU:COUNT pairs"):
            parse_workers(bad)


def test_plan_homogeneous_table_csv_and_plot(tmp_path, capsys):
    out, png = tmp_path / "plan.csv", tmp_path / "plan.png"
    rc = cli.main(["plan", "--model", "gpt2-small", "--gpu", "h100", "--nodes", "2", "--steps", "1000",
                   "--trials", "200", "--interval-s", "300", "--out", str(out), "--plot", str(png)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "1,000 steps on 2 x 1 h100-sxm5-80gb" in text
    for scenario in ("on-demand", "spot sync, Daly interval", "spot sync, given interval",
                     "spot async (parameter server)"):
        assert scenario in text
    table = pd.read_csv(out)
    assert table.workers.eq(2).all() and table.gpu.eq("h100-sxm5-80gb").all()
    od = table.set_index("scenario").loc["on-demand"]
    assert od.expected_cost_usd == od.on_demand_cost_usd  # on-demand costs itself
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plan_mixed_workers_uses_predict_mixed(capsys):
    from perfmodel import Strategy
    from perfmodel.analysis.hetero import predict_mixed
    from perfmodel.workload.presets import preset

    args = ["plan", "--model", "gpt2-small", "--precision", "fp16-mixed", "--micro-batch", "4", "--steps", "100",
            "--trials", "100", "--workers", "t4:2,a100:2", "--servers", "2"]
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    step = predict_mixed(preset("gpt2-small"), [("t4", 2), ("a100", 2)],
                         Strategy(micro_batch=4, precision="fp16-mixed"), servers=2).step_time_s.min()
    assert f"step {step * 1e3:.1f} ms (2 parameter server(s))" in text
    assert "mixed workers t4:2,a100:2" in text


def test_plan_errors_are_one_line_exit_2(capsys):
    assert cli.main(["plan", "--steps", "10", "--workers", "k80"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("perfmodel: error: '--workers' must be GPU:COUNT pairs") and "\n" not in err
    with pytest.raises(SystemExit) as exit_:  # argparse refuses it before anything runs
        cli.main(["plan", "--steps", "0", "--gpu", "h100"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "argument --steps: must be an integer >= 1: got '0'" in err and "\n" not in err


def test_plot_cost_vs_mix(tmp_path):
    df = pd.DataFrame({"mix": ["8x K80", "4 K80 + 4 V100"], "expected_cost_usd": [1.3, 9.0],
                       "on_demand_cost_usd": [15.0, 40.0], "expected_time_s": [15600.0, 10000.0],
                       "on_demand_time_s": [15500.0, 9800.0]})
    path = plot_cost_vs_mix(df, tmp_path / "mix.png")
    assert path.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(InvalidInputError, match=r"missing \['expected_time_s'\]"):
        plot_cost_vs_mix(df.drop(columns="expected_time_s"), tmp_path / "bad.png")
    with pytest.raises(InvalidInputError, match="non-empty DataFrame"):
        plot_cost_vs_mix(df.iloc[:0], tmp_path / "empty.png")


def test_plan_prices_the_step_with_the_profile_given(capsys):
    from perfmodel import Strategy, cluster, predict

    assert cli.main(["plan", "--steps", "1000", "--gpu", "a100", "--profile", "h100-sxm5-80gb", "--trials", "10"]) == 0
    text = capsys.readouterr().out
    step = predict("gpt2-small", cluster("a100"), Strategy(), profile="h100-sxm5-80gb").step_time
    assert f"{1000 * step:,.4g}" in text  # on-demand time = steps x the step under that profile
