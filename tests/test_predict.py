"""The predictor's contract: every catalog GPU out of the box, precisions, CLI, errors."""

import json
import subprocess
import sys

import pytest

import perfmodel as pm


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "perfmodel.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("gpu", pm.hardware.list_gpus())
def test_every_catalog_gpu_predicts_out_of_the_box(gpu):
    spec = pm.load_gpu(gpu)
    precision = "bf16-mixed" if "bf16" in spec.peak_flops else "fp16-mixed" if "fp16" in spec.peak_flops else "fp32"
    p = pm.predict(pm.preset("gpt2-small"), pm.cluster(gpu), pm.Strategy(micro_batch=2, precision=precision))
    assert 0 < p.step_time < 10
    assert 0 < p.mfu < 1
    assert p.peak_memory > 0


def test_prediction_fields_and_breakdown_sum():
    p = pm.predict(pm.preset("gpt2-medium"), pm.cluster("h100"), pm.Strategy(micro_batch=4))
    parts = sum(p.breakdown.values())
    assert parts == pytest.approx(p.step_time, rel=1e-9)
    assert p.tokens_per_second == pytest.approx(4 * 1024 / p.step_time)
    assert p.interval[0] < p.step_time < p.interval[1]
    assert set(p.memory) >= {"weights", "optimizer", "gradients", "activations"}
    assert p.fits and p.bottleneck


def test_precisions_optimizers_and_recompute_order_sensibly():
    m, c = pm.preset("gpt2-medium"), pm.cluster("a100")
    bf16 = pm.predict(m, c, pm.Strategy(micro_batch=4))
    fp32 = pm.predict(m, c, pm.Strategy(micro_batch=4, precision="fp32"))
    fp16 = pm.predict(m, c, pm.Strategy(micro_batch=4, precision="fp16-mixed"))
    sgd = pm.predict(m, c, pm.Strategy(micro_batch=4, optimizer="sgd"))
    sel = pm.predict(m, c, pm.Strategy(micro_batch=4, recompute="selective"))
    assert fp32.step_time > 3 * bf16.step_time
    assert fp16.step_time == pytest.approx(bf16.step_time, rel=0.3)
    assert sgd.breakdown["optimizer"] < bf16.breakdown["optimizer"]
    assert sgd.peak_memory < bf16.peak_memory
    assert bf16.step_time < sel.step_time < pm.predict(m, c, pm.Strategy(micro_batch=4, recompute="full")).step_time


def test_gradient_accumulation_scales_compute_not_optimizer():
    m, c = pm.preset("gpt2-small"), pm.cluster("h200")
    one = pm.predict(m, c, pm.Strategy(micro_batch=4))
    four = pm.predict(m, c, pm.Strategy(micro_batch=4, global_batch=16))
    assert four.step_time == pytest.approx(4 * one.step_time - 3 * one.breakdown["optimizer"], rel=0.05)


def test_megatron_pads_the_vocabulary_eager_pytorch_does_not():
    """GPT-2's 50257 tokens: eager PyTorch runs a misaligned LM head; Megatron-LM pads the vocabulary
    to a multiple of 128·tp (50304 at tp=1, 50432 at tp=2), so it runs as fast as the padded model."""
    def step(vocab, framework, tp):
        m = pm.transformer(layers=4, hidden=2048, heads=16, seq=2048, vocab=vocab)
        s = pm.Strategy(dp=8 // tp, tp=tp, micro_batch=4, framework=framework)
        return pm.predict(m, pm.cluster("dgx-h100", nodes=1), s).step_time
    assert step(50257, "pytorch", 1) > 1.05 * step(50304, "pytorch", 1)
    assert step(50257, "megatron", 1) == pytest.approx(step(50304, "megatron", 1), rel=1e-9)
    assert step(50257, "megatron", 2) == pytest.approx(step(50432, "megatron", 2), rel=1e-9)
    assert step(50304, "megatron", 2) == pytest.approx(step(50432, "megatron", 2), rel=1e-9)


def test_memory_that_does_not_fit_says_by_how_much():
    p = pm.predict(pm.preset("llama-2-13b"), pm.cluster("l4"), pm.Strategy(micro_batch=1))
    assert not p.fits and p.over_capacity > 100e9


def test_unsupported_dtype_is_a_clear_error():
    with pytest.raises(pm.UnsupportedError, match="t4 has no bf16"):
        pm.predict(pm.preset("gpt2-small"), pm.cluster("t4"), pm.Strategy(micro_batch=1))


def test_gpu_count_mismatch_names_fields():
    with pytest.raises(pm.InvalidInputError, match="must equal the cluster's GPU count 8"):
        pm.predict(pm.preset("gpt2-small"), pm.cluster("dgx-a100-80gb"), pm.Strategy(dp=4))
    with pytest.raises(pm.InvalidInputError, match="'tp' must divide heads=12: got 8"):
        pm.predict(pm.preset("gpt2-small"), pm.cluster("dgx-a100-80gb"), pm.Strategy(tp=8))


def test_models_are_taken_by_preset_name_like_clusters():
    by_name = pm.predict("llama-3-8b", "dgx-h100", pm.Strategy(dp=8, micro_batch=1))
    by_object = pm.predict(pm.preset("llama-3-8b"), pm.cluster("dgx-h100"), pm.Strategy(dp=8, micro_batch=1))
    assert by_name.step_time == by_object.step_time
    assert len(pm.compare("llama-3-8b", "dgx-h100", ["dp=8,micro_batch=1"])) == 1
    with pytest.raises(pm.InvalidInputError, match="'model' must be a preset name or a model"):
        pm.predict(42, "dgx-h100")
    with pytest.raises(pm.UnknownNameError, match="unknown model preset 'gpt5'"):
        pm.sweep("gpt5", "nodes", [1, 2])


def test_cli_takes_every_strategy_field():
    """Megatron-style options reach the Strategy: the CLI's JSON equals the library's prediction."""
    args = ("--model", "llama-3-8b", "--gpu", "dgx-h100", "--tp", "4", "--pp", "2", "--micro-batch", "1",
            "--global-batch", "16", "--stage-layers", "15,17", "--framework", "megatron", "--attention", "unfused",
            "--tp-overlap", "--sequence-parallel", "--placement", "tp-pp-dp", "--bucket-mib", "50")
    data = json.loads(run_cli("predict", *args, "--json").stdout)
    s = pm.Strategy(dp=1, tp=4, pp=2, micro_batch=1, global_batch=16, stage_layers=(15, 17), framework="megatron",
                    attention="unfused", tp_overlap=True, sequence_parallel=True, bucket_mib=50.0)
    expected = pm.predict(pm.preset("llama-3-8b"), pm.cluster("dgx-h100"), s)
    assert data["step_time"] == pytest.approx(float(expected.step_time), rel=1e-9)
    assert data["strategy"]["stage_layers"] == [15, 17] and data["strategy"]["framework"] == "megatron"
    cp = json.loads(run_cli("predict", "--model", "llama-3-8b", "--gpu", "dgx-h100", "--cp", "4", "--micro-batch", "1",
                            "--json").stdout)
    assert cp["strategy"]["cp"] == 4 and cp["strategy"]["dp"] == 2
    expected = pm.predict(pm.preset("llama-3-8b"), pm.cluster("dgx-h100"), pm.Strategy(dp=2, cp=4, micro_batch=1))
    assert cp["step_time"] == pytest.approx(float(expected.step_time), rel=1e-9)
    ep = json.loads(run_cli("predict", "--model", "mixtral-8x7b", "--gpu", "dgx-h100", "--ep", "4", "--micro-batch", "1",
                            "--framework", "megatron", "--json").stdout)
    assert ep["strategy"]["ep"] == 4 and ep["strategy"]["dp"] == 8


def test_cli_predict_table_and_json():
    proc = run_cli("predict", "--model", "gpt2-small", "--gpu", "h200", "--micro-batch", "8")
    assert proc.returncode == 0, proc.stderr
    assert "step time" in proc.stdout and "MFU" in proc.stdout and "activations" in proc.stdout
    proc = run_cli("predict", "--model", "gpt2-small", "--gpu", "h200", "--micro-batch", "8", "--json")
    data = json.loads(proc.stdout)
    assert data["step_time"] > 0 and data["strategy"]["micro_batch"] == 8


@pytest.mark.parametrize("args, message", [
    (("predict", "--model", "gpt5"), "unknown model preset 'gpt5'"),
    (("predict", "--gpu", "h300"), "unknown"),
    (("predict", "--micro-batch", "0"), "argument --micro-batch: must be an integer >= 1: got '0'"),
    (("predict", "--pp", "0"), "argument --pp: must be an integer >= 1: got '0'"),
    (("predict", "--seq", "0"), "argument --seq: must be an integer >= 1: got '0'"),
    (("compare", "--strategies", "dp=1", "--out", "/nonexistent/x.csv"), "folder '/nonexistent' does not exist"),
    (("compare", "--strategies", "dp=1", "--plot", "x.gif"), "unknown format '.gif' (valid: .png, .svg, .pdf)"),
    (("predict", "--precision", "bf17"), "unknown precision 'bf17'"),
    (("predict", "--pp", "2", "--stage-layers", "6,x"), "'stage_layers' must be whole numbers"),
    (("predict", "--placement", "pp-tp"), "unknown placement 'pp-tp'"),
])
def test_cli_errors_are_one_line_and_exit_2(args, message):
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_calibrate_without_torch_says_so(monkeypatch, capsys):
    import importlib.util

    from perfmodel.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    assert main(["calibrate", "--out", "unused"]) == 2
    assert "calibrating needs torch" in capsys.readouterr().err


def test_cli_list():
    proc = run_cli("list", "models")
    assert "llama-3-70b" in proc.stdout.split()


def test_cli_model_toml_from_fields_or_from_a_preset(tmp_path):
    (tmp_path / "mine.toml").write_text('preset = "llama-3-8b"\nseq = 4096\n')
    data = json.loads(run_cli("predict", "--model", str(tmp_path / "mine.toml"), "--json").stdout)
    llama = json.loads(run_cli("predict", "--model", "llama-3-8b", "--seq", "4096", "--json").stdout)
    assert data["model"] == "mine" and data["step_time"] == llama["step_time"]
    (tmp_path / "bad.toml").write_text("layers = 2\nhidden = 256\nheads = 4\ncolour = 1\n")
    proc = run_cli("predict", "--model", str(tmp_path / "bad.toml"))
    assert proc.returncode == 2 and "unknown model field 'colour'" in proc.stderr
