"""perfmodel share / pack / share-network: the command line of co-located jobs (docs/contention.md)."""

import pytest

import perfmodel as pm
from perfmodel.cli import main


def test_share_prints_the_rows_predict_shared_gives(capsys):
    assert main(["share", "--job", "gpt2-small:mb=8", "--job", "gpt2-small:mb=8", "--gpu", "h100"]) == 0
    out = capsys.readouterr().out
    s = pm.Strategy(micro_batch=8)
    r = pm.predict_shared([("gpt2-small", s), ("gpt2-small", s)], "h100")
    assert "gpt2-small#2" in out and f"{r.jobs[0].slowdown:.2f}" in out and f"throughput {r.throughput:.2f}" in out


def test_share_network_and_pack_run(capsys):
    assert main(["share-network", "--job", "gpt2-small:dp=8@0,1", "--job", "gpt2-small:dp=8@0,1", "--gpu", "h100",
                 "--nodes", "2", "--gpus-per-node", "8"]) == 0
    assert "node0.nic" in capsys.readouterr().out
    assert main(["pack", "--job", "gpt2-small", "--job", "gpt2-medium", "--gpu", "h100", "--modes", "time-slice",
                 "--top-k", "2"]) == 0
    assert "[gpt2-small gpt2-medium] (time-slice)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["share", "--job", "gpt2-small@0", "--gpu", "h100"], "must read MODEL[:STRATEGY] (no @NODES)"),
    (["share-network", "--job", "gpt2-small:dp=8", "--gpu", "h100"], "must read MODEL[:STRATEGY]@NODES"),
    (["share-network", "--job", "gpt2-small:dp=8@a", "--gpu", "h100"], "nodes must be comma-separated indices"),
])
def test_bad_job_specs_say_how_to_write_one(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err
