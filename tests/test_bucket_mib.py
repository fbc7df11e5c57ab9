"""The DDP bucket is given in MiB, as PyTorch's bucket_cap_mb (torch/nn/parallel/distributed.py)."""

import subprocess
import sys

import pytest

import perfmodel as pm
from perfmodel.parallel.config import StepConfig


def test_bucket_is_priced_in_mib():
    c = StepConfig.from_strategy(pm.Strategy(dp=8, bucket_mib=25.0))
    assert float(c.bucket_bytes) == 25 * 1024 * 1024


def test_the_old_name_is_refused_with_the_reason():
    with pytest.raises(pm.InvalidInputError, match=r"'bucket_mb' is now 'bucket_mib'.*MiB.*bucket_mib=25"):
        pm.Strategy(bucket_mb=25)


def test_the_old_cli_flag_names_the_new_one():
    run = subprocess.run([sys.executable, "-m", "perfmodel.cli", "predict", "--model", "gpt2-small", "--gpu", "h200",
                          "--bucket-mb", "25"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--bucket-mib 25" in run.stderr and "Traceback" not in run.stderr
