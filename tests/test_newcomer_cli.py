"""A new user's first commands: what the outputs say, exports, list, --version, pipes, Hub ids, fit naming."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import perfmodel as pm
from perfmodel.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ["--model", "llama-2-13b", "--gpu", "dgx-a100-80gb", "--nodes", "8"]


def _cli(*args, env=None, shell=None):
    """Run the command line in a fresh process (what a user types)."""
    full_env = {**os.environ, **(env or {})}
    if shell:
        return subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=120, env=full_env,
                              cwd=ROOT)
    return subprocess.run([sys.executable, "-m", "perfmodel.cli", *args], capture_output=True, text=True,
                          timeout=120, env=full_env, cwd=ROOT)


# --- item 1: the first output says what its numbers are ------------------------------------------


def test_predict_output_names_interval_profile_origin_and_loss(capsys):
    assert main(["predict", "--model", "gpt2-small", "--gpu", "h200", "--micro-batch", "8"]) == 0
    out = capsys.readouterr().out
    p = pm.predict("gpt2-small", "h200", pm.Strategy(micro_batch=8))
    step = next(line for line in out.splitlines() if line.startswith("step time"))
    assert p.interval_kind in step and f"{p.interval_level:.0%}" in step and p.interval_regime in step
    assert re.search(r"^profile +h200-sxm-141gb \(measured: fitted to h200-2026-11-29; published measurements: "
                     r"fp8_linear:rowwise, fp8_linear:tensorwise, overlap_compute_slowdown, sdpa:cudnn.bwd, sdpa:cudnn.fwd, sdpa:fa1.bwd, sdpa:fa1.fwd, "
                     r"sdpa:fa2.bwd, sdpa:fa2.fwd, "
                     r"sdpa:fa3.bwd, sdpa:fa3.fwd\)$", out, re.M)
    assert re.search(r"^  loss .*cross-entropy over tokens × vocab \(a CNN: samples × classes\): what its backward holds "
                     r"\(eager: 3 fp32", out, re.M)
    assert "executed FLOPs" in out and "model FLOPs" in out
    assert re.search(r"^  optimizer .*optimizer states \(AdamW: two fp32 moments\)$", out, re.M)
    # the optimizer line names the states of the optimizer priced, not AdamW's
    assert main(["predict", "--model", "resnet20-cifar-tf", "--gpu", "k80", "--framework", "tensorflow",
                 "--precision", "fp32", "--micro-batch", "128", "--optimizer", "sgd"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  optimizer .*optimizer states \(SGD: an fp32 momentum buffer\)$", out, re.M)
    # a CNN has no tokens: its rate is samples alone, not a tokens/s line equal to it
    assert re.search(r"^samples/s  ", out, re.M) and not re.search(r"^tokens/s", out, re.M)
    # the parameter-server fields the API takes, from the command line too
    assert main(["predict", "--model", "resnet-cifar32", "--gpu", "k80", "--nodes", "4", "--gpus-per-node", "1",
                 "--framework", "tensorflow", "--precision", "fp32", "--micro-batch", "128", "--ps-servers", "2",
                 "--ps-async", "--ps-placement", "round-robin"]) == 0
    assert "ps_async=True ps_placement=round-robin" in capsys.readouterr().out
    assert main(["predict", "--model", "resnet-cifar32", "--gpu", "k80", "--nodes", "4", "--gpus-per-node", "1",
                 "--framework", "tensorflow", "--precision", "fp32", "--micro-batch", "128", "--ps-servers", "2",
                 "--ps-local-reduce"]) == 0
    assert "ps_local_reduce=True" in capsys.readouterr().out
    # a datasheet-derived profile says so
    assert main(["predict", "--model", "gpt2-small", "--gpu", "h100", "--micro-batch", "8"]) == 0
    assert re.search(r"^profile +h100-sxm5-80gb \(datasheet: h200-sxm-141gb's fits scaled", capsys.readouterr().out,
                     re.M)
    assert pm.predict("gpt2-small", "h100").to_dict()["profile_origin"].startswith("datasheet")


# --- items 3, 9, 10: sweep, compare and search tables and exports -----------------------------------


def test_sweep_output_says_what_happens_to_the_batch(capsys):
    assert main(["sweep", "--model", "gpt2-small", "--gpu", "dgx-h100", "--over", "gpus", "--values", "8", "16",
                 "--micro-batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "weak scaling: the global batch grows with the GPU count, from 16 at 8 GPUs to 32 at 16" in out
    header = next(line for line in out.splitlines() if "tokens/s" in line)
    assert header.split().count("GPUs") == 1  # over=gpus is not printed twice
    assert "interval" in header and "interval: conformal" in out


def test_compare_rows_carry_interval_caveat_and_exports_are_self_describing(tmp_path, capsys):
    csv, md = tmp_path / "c.csv", tmp_path / "c.md"
    strategies = ["--strategies", "dp=64,mb=1,zero=3", "tp=8,mb=1", "tp=4,pp=2,mb=1"]
    assert main(["compare", *CLUSTER, "--global-batch", "512", *strategies, "--out", str(csv)]) == 0
    out = capsys.readouterr().out
    zero3 = next(line for line in out.splitlines() if "dp=64,mb=1,zero=3" in line)
    assert re.search(r"\d s – \d+\.\d+ (s|min)", zero3) and "ZeRO-3 without tp/pp: optimistic" in zero3
    tp8 = next(line for line in out.splitlines() if "tp=8,mb=1" in line)
    assert "optimistic" not in tp8
    written = pd.read_csv(csv)
    assert list(written.columns[:3]) == ["model", "cluster", "gpu"]
    assert (written["model"] == "llama-2-13b").all() and (written["gpu"] == "a100-sxm4-80gb").all()
    for column in ("step_time_s", "peak_memory_bytes", "interval_low_s", "interval_high_s", "forward_s",
                   "executed_tflops_per_gpu", "mfu_fraction"):
        assert column in written.columns
    assert (written["interval_low_s"] < written["step_time_s"]).all()
    assert main(["compare", *CLUSTER, "--global-batch", "512", *strategies, "--out", str(md)]) == 0
    text = md.read_text()
    lines = text.splitlines()
    assert lines[0].count("|") <= 26 and "e+" not in text and "e-0" not in text
    assert "| step |" in lines[0] and "GiB" in lines[2] and "executed FLOPs" in lines[-1]


def test_search_rows_carry_their_interval(capsys):
    assert main(["search", *CLUSTER, "--global-batch", "512", "--top-k", "3", "--recompute", "none",
                 "--zero", "0,3"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if re.match(r"^\s+[123]\s", line)]
    assert len(rows) == 3 and all(re.search(r"\d s – \d", row) for row in rows)
    assert "interval: conformal" in out


# --- item 11: CLI basics ---------------------------------------------------------------------------


def test_version_and_a_closed_pipe(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"perfmodel {pm.__version__}"
    # `true` exits before perfmodel writes: the write meets a closed pipe
    proc = _cli(shell=f"set -o pipefail; {sys.executable} -m perfmodel.cli predict --json | true")
    assert proc.returncode == 0, proc.stderr
    assert "Broken pipe" not in proc.stderr and "BrokenPipeError" not in proc.stderr


def test_list_tells_entries_apart(capsys):
    assert main(["list", "profiles"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^h200-sxm-141gb-calibrated +h200-sxm-141gb +measured", out, re.M)
    assert re.search(r"^h100-sxm5-80gb +h100-sxm5-80gb +datasheet", out, re.M)
    assert main(["list", "models"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^gpt2-small +124M +1\.9 GiB", out, re.M) and re.search(r"^llama-3-70b +70\.\dB", out, re.M)
    assert re.search(r"^resnet20-cifar-tf +269K .* traced graph \(CNN/ViT\)$", out, re.M)  # no transformer shape
    assert re.search(r"^gemma-3-1b +1B +", out, re.M)  # 999,885,952 rounds up to the next unit, not "1e+03M"
    assert re.search(r"^--model also takes a Hugging Face config.json \(model_type .*qwen3_moe\)", out, re.M)
    assert main(["list", "gpus"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^h200-sxm-141gb +140 GiB .*profile: measured", out, re.M)
    assert re.search(r"^a100-sxm4-80gb +80 GiB .*profile: datasheet", out, re.M)
    assert main(["list", "frameworks"]) == 0  # each stack record with the defaults it takes
    out = capsys.readouterr().out
    assert re.search(r"^composer +fsdp1 +full +none +flash2 +fused +te: delayed, tensorwise", out, re.M)
    assert re.search(r"^torchtitan +fsdp2 +full +every-2 .*torchao: tensorwise, rowwise", out, re.M)


def _fake_hub_cache(root: Path, repo: str, config: dict) -> Path:
    """The Hugging Face cache layout (models--owner--name/refs/main, snapshots/<commit>/config.json)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = root / ("models--" + repo.replace("/", "--"))
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True)
    (folder / "snapshots" / commit / "config.json").write_text(json.dumps(config))
    return root


def test_hub_id_is_read_from_the_local_cache_offline(tmp_path, monkeypatch, capsys):
    constants = pytest.importorskip("huggingface_hub.constants")
    config = json.loads((ROOT / "tests" / "fixtures" / "hf" / "meta-llama-3-8b.json").read_text())
    cache = _fake_hub_cache(tmp_path / "hub", "meta-llama/Meta-Llama-3-8B", config)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # what HF_HUB_CACHE=... sets
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # HF_HUB_OFFLINE=1: no network at all
    assert main(["predict", "--model", "meta-llama/Meta-Llama-3-8B", "--gpu", "h200", "--micro-batch", "1",
                 "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"] == "meta-llama/Meta-Llama-3-8B"
    assert data["step_time"] == pytest.approx(pm.predict(pm.from_hf_config(config), "h200", pm.Strategy(
        micro_batch=1)).step_time)
    assert main(["predict", "--model", "meta-llama/Not-Cached"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not in the local cache" in err


def test_hub_ids_without_the_extra_name_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # as if not installed
    with pytest.raises(pm.UnsupportedError, match=r"pip install 'perfmodel\[hf\]'"):
        pm.from_hf_hub("meta-llama/Meta-Llama-3-8B")
    with pytest.raises(pm.InvalidInputError, match=r"'models/llama/x' is neither a file nor a Hub id"):
        pm.from_hf_hub("models/llama/x")  # a mistyped path is not blamed on the missing extra


# --- items 6, 7: fit names the device and shows every class ----------------------------------------


def _cpu_tables(folder: Path, meta: dict | None = None) -> Path:
    """A few fp32 GEMM and add rows (measured on the H200, labelled as a CPU's) with their metadata."""
    from perfmodel.fit.build import CALIBRATED_H200_TABLES

    table = pd.read_csv(CALIBRATED_H200_TABLES / "compute.csv")
    rows = pd.concat([table[(table.op == "gemm") & (table.dtype == "fp32")].head(8), table[table.op == "add"].head(8)])
    folder.mkdir(parents=True, exist_ok=True)
    rows.to_csv(folder / "compute.csv", index=False)
    meta = meta or {"device": "cpu", "device_name": "Example CPU 9000", "cpu_model": "Example CPU 9000",
                    "torch_threads": 2, "memory_bytes": 8 * 2**30}
    (folder / "metadata.json").write_text(json.dumps(meta))
    return folder


def test_fit_names_a_cpu_profile_after_the_cpu_and_refuses_a_contradicting_gpu(tmp_path, capsys):
    tables = _cpu_tables(tmp_path / "cpu")
    out = tmp_path / "p.json"
    assert main(["fit", str(tables), "-o", str(out), "--gpu", "h200"]) == 2
    err = capsys.readouterr().err
    assert "--gpu h200 contradicts the tables, measured on 'Example CPU 9000'" in err
    assert "--allow-gpu-mismatch" in err
    assert main(["fit", str(tables), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert "fitting class 1/2" in captured.err  # progress while it works
    prof = pm.load_profile(str(out))
    host = tmp_path / "cpu-example-cpu-9000.toml"
    assert prof.name == prof.gpu == "cpu-example-cpu-9000" and host.exists()
    report = captured.out.split("\nwrote ")[0].split("\n", 1)[1]  # between the host TOML and the profile lines
    assert report.startswith("class ") and all(len(line) <= 100 for line in report.splitlines())
    assert re.search(r"^gemm:fp32 +8 .* fitted", captured.out, re.M)
    assert re.search(r"^datasheet fallback \(\d+, not measured here\): ", captured.out, re.M)
    assert "power limit" not in captured.out  # fallback classes' power limits are the reference GPU's
    assert f"--gpu {host} --profile {out} --precision fp32" in captured.out
    # predicting with it on the host says measured; on an H200 it warns
    assert main(["predict", "--model", "gpt2-small", "--gpu", str(host), "--profile", str(out),
                 "--precision", "fp32"]) == 0
    assert re.search(r"^profile +cpu-example-cpu-9000 \(measured: fitted to cpu;", capsys.readouterr().out, re.M)
    with pytest.warns(UserWarning, match="describes cpu-example-cpu-9000, not this cluster's h200-sxm-141gb"):
        assert main(["predict", "--model", "gpt2-small", "--gpu", "h200", "--profile", str(out),
                     "--precision", "fp32"]) == 0


def test_fit_reports_imported_collectives_and_names_their_gpu(tmp_path, capsys):
    log = ROOT / "tests" / "fixtures" / "nccl_tests" / "all_reduce_perf_1node_8gpu.log"
    folder = tmp_path / "nccl"
    assert main(["import-nccl-tests", str(log), "--out", str(folder)]) == 0
    assert main(["fit", str(folder), "-o", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^all_reduce@intra +21 +comm_\w+ +\d+\.\d% .*fitted", out, re.M)
    assert "CV MAPE <= 8%: 1 of 1 cross-validated classes" in out
    assert pm.load_profile(str(tmp_path / "p.json")).gpu == "h100-sxm5-80gb"  # "NVIDIA H100 80GB HBM3"


def test_catalog_gpu_from_device_names():
    from perfmodel.fit.device import catalog_gpu

    assert catalog_gpu("NVIDIA H200") == "h200-sxm-141gb"
    assert catalog_gpu("NVIDIA A100-SXM4-40GB") == "a100-sxm4-40gb"
    assert catalog_gpu("Tesla V100-SXM2-32GB") == "v100-sxm2-32gb"
    assert catalog_gpu("NVIDIA B200") == "b200-sxm-180gb"
    assert catalog_gpu("NVIDIA GB200") == "gb200-186gb"
    assert catalog_gpu("NVIDIA B300 SXM6 AC") is None


# --- item 8: help texts and documented numbers match the code ---------------------------------------


def test_calibrate_help_and_documented_quick_grid():
    pytest.importorskip("torch")  # calibration imports it
    from calibration import grids

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["calibrate"]
    undocumented = [a.dest for a in sub._actions if a.dest != "help" and not a.help]
    assert undocumented == []
    docs = (ROOT / "docs" / "calibration.md").read_text()
    cpu = len(grids.cases(grids.Request(device="cpu", dtypes=("fp32",), timings=("eager",), quick=True)))
    gpu = len(grids.cases(grids.Request(device="cuda:0", dtypes=("bf16", "fp16", "tf32", "fp32"),
                                        timings=("eager", "graph"), quick=True)))
    assert f"{cpu} cases on the CPU (fp32, eager), {gpu}\non a GPU" in docs
    assert "--index-url https://download.pytorch.org/whl/cpu" in docs


def test_calibrate_collectives_across_nodes_needs_a_meeting_point(tmp_path, capsys):
    pytest.importorskip("torch")
    assert main(["calibrate", "--collectives", "--nnodes", "2", "--out", str(tmp_path / "c")]) == 2
    assert "--nnodes 2 needs --rdzv-endpoint HOST:PORT" in capsys.readouterr().err


def test_compare_says_which_rows_intervals_are_uncalibrated_and_why(capsys):
    strategies = ["--strategies", "pp=2,mb=1,schedule=zbv,v=2,framework=torchtitan", "mb=1,framework=torchtitan"]
    assert main(["compare", "--model", "llama-3-8b", "--gpu", "h200", "--gpus-per-node", "8", "--global-batch", "64",
                 *strategies]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^uncalibrated intervals \(.*\): 1 row: schedule=zbv in no validation row$", out, re.M)
    # every row calibrated: no such line
    assert main(["compare", "--model", "llama-3-8b", "--gpu", "h200", "--gpus-per-node", "8", "--global-batch", "64",
                 "--strategies", "mb=1,framework=torchtitan", "mb=2,framework=torchtitan"]) == 0
    assert "uncalibrated intervals" not in capsys.readouterr().out


def test_without_precision_the_cli_takes_what_the_gpu_runs(capsys):
    """A V100 has no bf16 and a K80 no fp16: left out, --precision is the GPU's own 16-bit autocast (or fp32)."""
    expect = {"v100": "fp16-mixed", "k80": "fp32", "h100": "bf16-mixed"}
    for gpu, precision in expect.items():
        assert main(["predict", "--model", "resnet50", "--gpu", gpu, "--micro-batch", "32"]) == 0
        assert f"precision={precision} " in capsys.readouterr().out
    assert main(["compare", "--model", "resnet50", "--gpu", "t4", "--strategies", "micro_batch=16"]) == 0
    assert main(["predict", "--model", "resnet50", "--gpu", "v100", "--precision", "bf16-mixed"]) == 2
    assert "v100-sxm2-32gb has no bf16 support" in capsys.readouterr().err


def test_a_sweep_over_gpu_types_runs_each_at_its_own_precision(capsys):
    """Over GPUs of different generations, --precision left out is each GPU's own; given, it holds for all."""
    assert main(["sweep", "--model", "gpt2-small", "--over", "gpu", "--values", "h100,v100,k80"]) == 0
    out = capsys.readouterr().out
    for gpu, precision in (("h100", "bf16-mixed"), ("v100", "fp16-mixed"), ("k80", "fp32")):
        assert re.search(rf"^ *{gpu} +1 +{precision} ", out, re.M), out
    assert main(["sweep", "--model", "gpt2-small", "--over", "gpu", "--values", "h100,v100",
                 "--precision", "bf16-mixed"]) == 2
    assert "sweep over gpu='v100': v100-sxm2-32gb has no bf16 support" in capsys.readouterr().err
