"""Shipped CNN/ViT graphs, the GraphModel contract with the predictor, and the conv2d cost class."""

import subprocess
import sys

import numpy as np
import pytest

import perfmodel as pm
from perfmodel.costs.conv import conv_kernels, conv_output_size, conv_time
from perfmodel.fit.conv import fit_conv
from perfmodel.fit.tables import read_compute_table
from perfmodel.workload.cnn_presets import GRAPH_PRESETS, graph_preset, list_graph_presets
from perfmodel.workload.graph import GraphModel, conv_gemm_shapes

# torchvision.models documentation (weights tables), parameter counts
TORCHVISION_PARAMS = {"resnet50": 25_557_032, "resnet101": 44_549_160, "vgg16": 138_357_544,
                      "inception-v3": 27_161_264, "vit-b-16": 86_567_656, "resnet152": 60_192_808,
                      "efficientnet-b2": 9_109_994, "efficientnet-b3": 12_233_232, "efficientnet-b4": 19_341_616}
# timm's results/benchmark-train-*.csv list these in millions to two decimals: 44.18, 27.56, 48.96
TIMM_PARAMS_M = {"resnext101-32x4d": (44_177_704, 44.18), "seresnext50-32x4d": (27_559_896, 27.56),
                 "seresnext101-32x4d": (48_955_416, 48.96)}


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
def test_preset_parameter_counts_are_torchvisions(name):
    g = pm.preset(name)
    assert isinstance(g, GraphModel)
    assert g.params == TORCHVISION_PARAMS[name] == GRAPH_PRESETS[name]["published_params"]
    assert (g.layers, g.seq, g.hidden, g.vocab) == (1, 1, 0, 1000)


@pytest.mark.parametrize("name", sorted(TIMM_PARAMS_M))
def test_timm_preset_parameter_counts(name):
    exact, millions = TIMM_PARAMS_M[name]
    assert pm.preset(name).params == exact == GRAPH_PRESETS[name]["published_params"]
    assert round(exact / 1e6, 2) == millions


def test_plain_torch_models_match_torchvision_counts():
    torch = pytest.importorskip("torch")  # noqa: F841
    from tools.cnn_models import build

    for name, count in TORCHVISION_PARAMS.items():
        assert sum(p.numel() for p in build(name).parameters()) == count
    inception = build("inception-v3")
    assert sum(p.numel() for n, p in inception.named_parameters() if not n.startswith("aux")) == 23_834_568


def test_resnet50_forward_flops_are_torchvisions():
    # torchvision lists ResNet-50 at 4.09 GFLOPS, counted as multiply-adds: 2 x 4.09e9 FLOPs forward
    # (torch's FlopCounterMode counts 2 per multiply-add). Backward is twice that, less the input
    # gradient of the stem conv, which the image does not need (one stem forward's FLOPs).
    g = pm.preset("resnet50")
    fwd = sum(o.flops[1] * o.count for o in g.ops if o.phase == "fwd")
    assert fwd == pytest.approx(2 * 4.09e9, rel=0.01)
    stem = 2 * 112 * 112 * 64 * 3 * 49
    assert g.flops_per_step(1) == pytest.approx(3 * fwd - stem, rel=1e-9)


def test_tensorflows_inception_v3_has_the_published_size():
    # tf_cnn_benchmarks' inception3 (no auxiliary head): 23.8 M parameters and 5.7 G multiply-adds per 299x299
    # image forward (Szegedy et al. 2016, Table 3: "5 billion multiply-adds"; torchvision lists 5.71 GFLOPS)
    tf, tv = pm.preset("inception-v3-tf"), pm.preset("inception-v3")
    assert tf.params == 23_834_568 and tv.params - tf.params == 3_326_696  # the auxiliary head
    fwd = sum(o.flops[1] * o.count for o in tf.ops if o.phase == "fwd")
    assert fwd == pytest.approx(2 * 5.71e9, rel=0.01)
    def losses(g):
        return sum(o.count for o in g.ops if o.op == "aten._log_softmax")
    assert (losses(tf), losses(tv)) == (1, 2)  # one loss: no auxiliary logits
    kinds = {(o.size["kh"][0], o.size["kw"][0], o.size["stride"][0]) for o in tf.ops if o.cls == "conv"}
    assert {(1.0, 7.0, 1.0), (7.0, 1.0, 1.0), (1.0, 3.0, 1.0), (3.0, 1.0, 1.0), (3.0, 3.0, 2.0), (5.0, 5.0, 1.0)} <= kinds


def test_loading_a_preset_does_not_import_torch():
    code = ("import sys, perfmodel as pm; g = pm.preset('vit-b-16'); "
            "p = pm.predict(g, pm.cluster('h200'), pm.Strategy(micro_batch=32)); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_preset_names_and_errors():
    assert list_graph_presets() == ["efficientnet-b0", "efficientnet-b2", "efficientnet-b3", "efficientnet-b4",
                                    "inception-v3", "inception-v3-tf", "preact-resnet164-basic-cifar",
                                    "preact-resnet164-cifar", "resnet-cifar15", "resnet-cifar32", "resnet101",
                                    "resnet152", "resnet164-basic-cifar-tf", "resnet164-cifar-tf", "resnet20-cifar-tf",
                                    "resnet50", "resnet56-cifar-tf", "resnext101-32x4d", "resnext50-32x4d", "seresnext101-32x4d",
                                    "seresnext50-32x4d", "shake-shake-big", "shake-shake-small", "vgg16", "vit-b-16"]
    assert pm.preset("VIT_B_16").name == "vit-b-16"
    assert graph_preset("resnet50").with_name("rn50").name == "rn50"
    with pytest.raises(pm.InvalidInputError, match="is a traced graph and takes no overrides: got seq"):
        pm.preset("resnet50", seq=4)
    with pytest.raises(pm.UnknownNameError, match="unknown graph preset 'resnet51'; did you mean 'resnet50'"):
        graph_preset("resnet51")


def test_predict_single_gpu_and_data_parallel():
    g = pm.preset("resnet50")
    one = pm.predict(g, pm.cluster("h200"), pm.Strategy(micro_batch=64))
    assert one.fits and 0.002 < one.step_time < 0.2
    assert one.breakdown["tp_comm"] == 0 and one.breakdown["p2p"] == 0
    # the predictor counts backward as 2x forward (Narayanan et al. 2021); the trace knows the stem
    # conv computes no input gradient, 1% less
    assert one.model_flops == pytest.approx(g.flops_per_step(64), rel=0.02)
    dgx = pm.cluster("dgx-a100-80gb")
    ddp = pm.predict(g, dgx, pm.Strategy(dp=8, micro_batch=64))
    single = pm.predict(g, pm.cluster("a100-sxm4-80gb"), pm.Strategy(micro_batch=64))
    assert ddp.samples_per_second <= 8 * single.samples_per_second * (1 + 1e-9)
    assert ddp.samples_per_second > 6 * single.samples_per_second  # 25.6M gradients hide behind backward
    two = pm.cluster("dgx-a100-80gb", nodes=2)
    ps = pm.predict(g, two, pm.Strategy(dp=16, micro_batch=64, ps_servers=1))
    ring = pm.predict(g, two, pm.Strategy(dp=16, micro_batch=64))
    assert ps.breakdown["dp_comm"] > ring.breakdown["dp_comm"]  # one server's NICs carry 16 workers
    fused = pm.predict(g, two, pm.Strategy(dp=16, micro_batch=64, bucket_mib=64.0))  # Horovod-style fusion buffer
    assert fused.step_time > 0


def test_only_the_stacks_that_wrap_any_module_train_a_traced_graph():
    # Megatron-LM, Megatron-DeepSpeed, torchtitan, KempnerForge and Composer (MPT) run their own transformer code
    g, c = pm.preset("resnet50"), pm.cluster("dgx-a100-80gb")
    for framework in ("megatron", "deepspeed", "torchtitan", "kempnerforge", "composer"):
        with pytest.raises(pm.UnsupportedError, match=f"framework='{framework}' trains its own transformer code.*"
                                                      "'pytorch' or 'fsdp1' or 'tensorflow'"):
            pm.predict(g, c, pm.Strategy(dp=8, micro_batch=32, framework=framework))
    assert pm.predict(g, c, pm.Strategy(dp=8, micro_batch=32, framework="fsdp1", fsdp="full")).step_time > 0
    # search takes the graph stacks by default, and refuses one that cannot run it when asked
    assert set(pm.search(g, c, 256, top_k=3)["framework"]) <= {"pytorch", "fsdp1"}
    with pytest.raises(pm.UnsupportedError, match="framework='megatron' trains its own transformer code"):
        pm.search(g, c, 256, top_k=3, framework=["pytorch", "megatron"])


def test_tensor_and_pipeline_parallel_are_rejected():
    g = pm.preset("resnet50")
    with pytest.raises(pm.UnsupportedError, match="only data parallelism is modelled for it"):
        pm.predict(g, pm.cluster("dgx-a100-80gb"), pm.Strategy(dp=4, tp=2, micro_batch=32))
    with pytest.raises(pm.PerfModelError, match="pp"):
        pm.predict(g, pm.cluster("dgx-a100-80gb"), pm.Strategy(dp=4, pp=2, micro_batch=32, global_batch=256))
    with pytest.raises(pm.UnsupportedError, match="traced graph and takes no overrides: got seq"):
        pm.sweep(g, "seq", [512, 1024], cluster=pm.cluster("dgx-a100-80gb"), strategy=pm.Strategy(dp=8))
    with pytest.raises(pm.UnsupportedError, match="attention kernels it was traced with"):
        pm.predict(pm.preset("vit-b-16"), pm.cluster("dgx-a100-80gb"), pm.Strategy(dp=8, attention="unfused"))


def test_every_preset_predicts_on_every_precision():
    for name in TORCHVISION_PARAMS:
        for precision in ("bf16-mixed", "fp32"):
            p = pm.predict(pm.preset(name), pm.cluster("h100-sxm5-80gb"), pm.Strategy(micro_batch=32, precision=precision))
            assert p.step_time > 0 and np.isfinite(p.peak_memory)


def test_round_trip_of_a_shipped_graph():
    g = pm.preset("inception-v3")
    assert GraphModel.from_dict(g.to_dict()) == g
    with pytest.raises(pm.ProfileError, match="not a graph workload"):
        GraphModel.from_dict({"kind": "transformer"})


# -- convolution as implicit GEMMs -------------------------------------------------------------------
def test_conv_gemm_shapes_by_hand():
    # 3x3, 64 -> 64 channels, 56x56, batch 64 (ResNet-50 stage 1)
    s = conv_gemm_shapes(64, 64, 64, 56 * 56, 56 * 56, 9)
    assert s["fwd"] == (200704, 64, 576)          # M = N·P·Q, N = Cout, K = Cin·R·S
    assert s["dgrad"] == (200704, 576, 64)        # dX_col = dY · W
    assert s["wgrad"] == (64, 576, 200704)        # dW = dY^T · X_col
    stem = conv_gemm_shapes(1, 3, 64, 224 * 224, 112 * 112, 49)
    assert stem["fwd"] == (12544, 64, 8 * 49)     # 3 channels run as 8 (NHWC tensor-core padding)
    assert conv_output_size(224, 7, 2, 3) == 112 and conv_output_size(56, 3, 1) == 56


def test_conv_time_is_gemms_plus_overhead():
    prof = pm.load_profile("h200-sxm-141gb")
    kernels = conv_kernels(64, 64, 64, 56, 3, 1, phase="bwd")
    assert [k.name for k in kernels] == ["conv.dgrad", "conv.wgrad", "conv.overhead"]
    t = float(conv_time(prof, 64, 64, 64, 56, 3, 1, phase="fwd"))
    measured = 9.18e-05  # compute.csv: conv2d fwd, batch 64, 64->64, 56x56, 3x3 (bf16, H200)
    assert t == pytest.approx(measured, rel=0.5)


def test_conv_fit_on_the_bundled_rows():
    from perfmodel.fit.build import BUNDLED_H200_TABLES

    table = read_compute_table(BUNDLED_H200_TABLES)
    gemm = pm.load_profile("h200-sxm-141gb").entry("gemm:bf16")
    fwd = fit_conv(table, variant="fwd", gemm_entry=gemm)
    bwd = fit_conv(table, variant="bwd", gemm_entry=gemm, fwd_entry=fwd)
    assert fwd["n_points"] == bwd["n_points"] == 10
    # measured in this repository: forward CV MAPE ~0.34 (GEMMs alone 0.52), backward ~0.24
    assert fwd["cv_mape"] < fwd["gemm_only_mape"] and fwd["cv_mape"] < 0.45
    assert bwd["cv_mape"] < 0.35 and bwd["harness_floor_s"] > 1e-4
    assert fit_conv(table, variant="bwd", gemm_entry=gemm, fwd_entry=None) is None
    assert fit_conv(table[table.op != "conv2d"], variant="fwd", gemm_entry=gemm) is None
    prof = pm.load_profile("h200-sxm-141gb")
    assert prof.entry("conv2d:bf16:fwd")["params"] == pytest.approx(fwd["params"])
    assert "datasheet-scaled" in pm.load_profile("a100-sxm4-80gb").entry("conv2d:bf16:fwd")["source"]


def test_shipped_graphs_are_what_the_generator_writes(tmp_path):
    pytest.importorskip("torch")
    from perfmodel.workload.cnn_presets import GRAPHS_DIR
    from tools.cnn_models import write_presets

    (path,) = write_presets(tmp_path, names=["vit-b-16"])
    assert path.read_text() == (GRAPHS_DIR / "vit-b-16.json").read_text()
