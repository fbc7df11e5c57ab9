"""The one-GPU PyTorch CIFAR check set (DAWNBench's logs), the presets it prices, and what it says beside the
TensorFlow rows of the same machines."""

import pytest

import perfmodel as pm
from perfmodel.validate import pytorch_cifar, tf_cifar

# summed by hand from dawn-bench-models' pytorch/CIFAR10 models/resnet.py (PreActResNet164, PreActResNet164Basic)
COUNTS = {"preact-resnet164-cifar": 1_703_258, "preact-resnet164-basic-cifar": 2_605_466}


@pytest.mark.parametrize("name, params", COUNTS.items())
def test_presets_have_the_pytorch_codes_parameter_counts(name, params):
    assert pm.preset(name).params == params


def test_rows_are_complete_and_named_by_their_entry():
    rows = pytorch_cifar.load_rows()
    assert len(rows) == 6 and {r["model"] for r in rows} == set(COUNTS)
    assert {(r["setting"], r["gpu"]) for r in rows} == {("gce-k80", "k80"), ("ec2-k80", "k80"),
                                                        ("dawn-p100", "p100-pcie-16gb")}
    assert all(r["batch"] == 128 and r["epochs"] == 180 and r["source"].endswith("_pytorch.tsv") for r in rows)


@pytest.fixture(scope="module")
def scored():
    return {(r.setting, r.model): r for r in pytorch_cifar.score()}


def test_an_epoch_is_its_training_steps_and_one_pass_over_the_test_images(scored):
    r = next(r for r in pytorch_cifar.load_rows() if r["setting"] == "dawn-p100")
    p = pm.predict(*pytorch_cifar.row_inputs(r))
    expected = 50_000 / 128 * p.step_time + 10_000 / 128 * p.breakdown["forward"]
    assert scored[("dawn-p100", r["model"])].predicted == pytest.approx(expected, rel=1e-12)
    assert 0 < p.breakdown["forward"] < p.step_time / 2


def test_narrow_convolutions_keep_the_cifar_rows_near_their_measurements(scored):
    # check data, nothing fitted to it. Before a Winograd saving measured on 64 channels or more was kept to
    # that range, the K80's basic ResNet-164 was predicted 2.1x too fast and the P100's rows 38-43%
    assert all(abs(r.error) < 0.35 for r in scored.values())
    # the TensorFlow rows of the same depths on the same machines step 0-25% slower than PyTorch's, against the
    # +38...+115% the model was off: the gap was the GPU kernels', not TensorFlow's
    tf = {(r.setting, r.model): r for r in tf_cifar.score()}
    for setting in ("dawn-p100", "ec2-k80"):
        for pt, t in (("preact-resnet164-cifar", "resnet164-cifar-tf"),
                      ("preact-resnet164-basic-cifar", "resnet164-basic-cifar-tf")):
            tf_step, pt_train_share = 1 / tf[(setting, t)].measured, 391 / (391 + 79 / 3)
            assert 0.75 < scored[(setting, pt)].measured / 391 * pt_train_share / tf_step < 1.05
