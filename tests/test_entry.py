"""Module commands (the docs' reproduce lines) fail with one line and status 2, and refuse unknown options."""

from __future__ import annotations

import importlib

import pytest

from perfmodel.core.entry import USAGE_ERROR, no_options, run_command
from perfmodel.core.errors import InvalidInputError

# every ``python -m`` command of the package and of tools/ (tools.cifar_models / cnn_models need torch)
COMMANDS = (
    "perfmodel.fit.build", "perfmodel.fit.comm", "perfmodel.fit.engine_host", "perfmodel.fit.gpu_interference",
    "perfmodel.fit.ps_cpu", "perfmodel.fit.published_gemm", "perfmodel.validate.cnn",
    "perfmodel.validate.cnn_ddp", "perfmodel.validate.cnn_whatif", "perfmodel.validate.dlperf_megatron",
    "perfmodel.validate.interference", "perfmodel.validate.intervals", "perfmodel.validate.kernels",
    "perfmodel.validate.memory_checks", "perfmodel.validate.multisite",
    "perfmodel.validate.nccl_multinode", "perfmodel.validate.runs", "perfmodel.validate.search_ranks",
    "perfmodel.validate.tf_cifar", "perfmodel.validate.pytorch_cifar", "perfmodel.validate.tf_ps",
    "tools.azure_gemm", "tools.cnn_report", "tools.deepbench_compare", "tools.deepbench_conv",
    "tools.deepbench_gemm", "tools.deepspeed_small_steps", "tools.olmo_core_nodes", "tools.p100_tf_check",
    "tools.prediction_snapshot", "tools.mlperf_gpt3", "tools.mlperf_llama31")


def test_an_input_error_is_one_line_and_status_2(capsys):
    def main(argv=None):
        raise InvalidInputError("field 'x' = -1: must be positive")

    assert run_command(main, [], prog="cmd") == USAGE_ERROR
    err = capsys.readouterr().err
    assert err == "cmd: error: field 'x' = -1: must be positive\n"


def test_a_missing_file_is_one_line_and_status_2(capsys, tmp_path):
    def main(argv=None):
        open(tmp_path / "absent.csv").close()

    assert run_command(main, [], prog="cmd") == USAGE_ERROR
    assert "Traceback" not in capsys.readouterr().err


def test_status_is_mains_and_none_is_success():
    assert run_command(lambda argv: None, []) == 0
    assert run_command(lambda argv: 1, []) == 1


def test_a_bug_is_not_hidden():
    def main(argv=None):
        raise ZeroDivisionError("a programming error keeps its traceback")

    with pytest.raises(ZeroDivisionError):
        run_command(main, [])


def test_a_command_without_options_refuses_one():
    assert no_options("Doc line.\n\nmore", []) is not None
    with pytest.raises(SystemExit) as exc:
        no_options("Doc line.", ["--bogus"])
    assert exc.value.code == USAGE_ERROR


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_refuses_an_unknown_option(name):
    module = importlib.import_module(name)
    with pytest.raises(SystemExit) as exc:
        module.main(["--no-such-option"])
    assert exc.value.code == USAGE_ERROR


def test_cnn_breakdown_names_the_precision_the_gpu_has(capsys):
    from perfmodel.validate.cnn import main

    assert run_command(main, ["--breakdown", "resnet50", "k80", "32"], prog="cnn") == USAGE_ERROR
    assert "valid here: fp32" in capsys.readouterr().err
    assert run_command(main, ["--breakdown", "resnet50", "k80", "zero"], prog="cnn") == USAGE_ERROR
    assert "positive whole number" in capsys.readouterr().err
