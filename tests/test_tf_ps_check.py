"""The TensorFlow parameter-server check set and the single-machine parameter-server links."""

import pytest

import perfmodel as pm
from perfmodel.parallel.fabric import parameter_server_links
from perfmodel.validate import tf_ps


@pytest.fixture(scope="module")
def gce_resnet50():
    rows = [r for r in tf_ps.load_rows() if r["setting"] == "gce-k80" and r["model"] == "resnet50"
            and r["batch"] == 64 and r["gpus"] in (1, 8)]
    return tf_ps.score(rows)


def test_check_set_rows_are_complete():
    rows = tf_ps.load_rows()
    assert len(rows) == 73
    assert {r["variable_update"] for r in rows} == {"parameter_server", "replicated", "distributed_replicated"}
    assert all(r["nodes"] * r["gpus_per_node"] == r["gpus"] for r in rows)


@pytest.fixture(scope="module")
def k80_one_gpu():
    return tf_ps.score([r for r in tf_ps.load_rows() if r["gpus"] == 1])


def test_one_k80_is_checked_per_model(k80_one_gpu):
    # check data (TensorFlow's page, May 2017), nothing fitted to it. VGG16 (3x3 convolutions only) was
    # -31...-33% with the H200's bf16 corrections, -7...-10% with cuDNN 6's fp32 3x3 classes carried from
    # the P100 and the K80's published copy bandwidth; ResNets +9...+23%, InceptionV3 +50...+56% with the
    # shapes no Winograd algorithm runs at the P100's GEMM-only pool (docs/parameter-servers.md)
    vgg = [r.error for r in k80_one_gpu if r.model == "vgg16"]
    assert len(vgg) == 2 and all(abs(e) < 0.15 for e in vgg)
    errors = sorted(abs(r.error) for r in k80_one_gpu)
    assert len(errors) == 17 and errors[len(errors) // 2] < 0.30


def test_a_machine_without_a_network_prices_one_node_only():
    row = {**tf_ps.load_rows()[0], "machine": "dgx-1", "nodes": 2, "gpus_per_node": 4, "gpus": 8}
    with pytest.raises(pm.errors.InvalidInputError, match="'dgx-1' spans 2 nodes but has no network"):
        tf_ps.predict_row(row)


def test_speedup_is_over_the_one_gpu_row(gce_resnet50):
    one, eight = sorted(gce_resnet50, key=lambda r: r.gpus)
    assert one.speedup_error != one.speedup_error  # NaN on the 1-GPU row
    assert eight.measured_speedup == pytest.approx(387.0 / 51.9)
    assert eight.predicted_speedup == pytest.approx(eight.predicted / one.predicted)
    assert 1.0 < eight.predicted_speedup < 8.0
    e, s, n = tf_ps.summary(gce_resnet50)["all"]
    assert n == 2 and s == pytest.approx(abs(eight.speedup_error))


def test_one_machine_parameter_server_runs_over_pcie():
    # K80: two GK210 share the board's x16 link; the host takes all links at once
    links = parameter_server_links(pm.cluster("k80", nodes=1, gpus_per_node=8))
    assert links["worker"] == pytest.approx(0.8 * 15.75e9 / 2, rel=0.01)
    assert links["server"] == pytest.approx(4 * 0.8 * 15.75e9, rel=0.01)
    solo = parameter_server_links(pm.cluster("k80", nodes=1, gpus_per_node=1))
    assert solo["worker"] == pytest.approx(0.8 * 15.75e9, rel=0.01)
    multi = parameter_server_links(pm.cluster("k80", nodes=2, gpus_per_node=8))
    assert multi["worker"] < links["worker"]  # across machines: the NIC, shared by the node's GPUs


def test_local_reduce_pushes_once_per_machine():
    from perfmodel.parallel.config import StepConfig
    from perfmodel.parallel.data import ps_time

    links = {"server": 1e9, "worker": 0.125e9, "node": 1e9, "local": 4e9, "gpus_per_node": 8, "latency": 0.0}
    base = pm.Strategy(dp=32, micro_batch=8, ps_servers=4)
    per_gpu = ps_time(StepConfig.from_strategy(base), 1e8, 0.0, links)
    per_machine = ps_time(StepConfig.from_strategy(base.replace(ps_local_reduce=True)), 1e8, 0.0, links)
    # 4e8 B each way: each GPU through 1/8 of the NIC (3.2 s) vs 4 machines' sums over 4 servers (0.4 s)
    assert per_gpu == pytest.approx(2 * 4e8 / 0.125e9)
    assert per_machine == pytest.approx(2 * 4e8 / 1e9)


@pytest.mark.parametrize("kw", [{"ps_local_reduce": True}, {"ps_local_reduce": True, "ps_servers": 2, "ps_async": True}])
def test_local_reduce_needs_synchronous_servers(kw):
    with pytest.raises(pm.errors.InvalidInputError, match="ps_local_reduce"):
        pm.Strategy(dp=8, **kw)


@pytest.mark.parametrize("bad", [0, 1.5, "two"])
def test_gpus_per_pcie_must_be_a_positive_integer(bad):
    from perfmodel.hardware.catalog import gpu_from_dict

    data = {"name": "x", "memory_bandwidth": "240GB/s", "memory": "12GiB", "sm_count": 13,
            "peak_flops": {"fp32": "4TFLOPS"}, "gpus_per_pcie": bad}
    with pytest.raises(pm.errors.InvalidInputError, match="gpus_per_pcie"):
        gpu_from_dict(data, "test")


def test_the_pages_inception_is_tensorflows_own_model():
    # tf_cnn_benchmarks @9165a70 inception3: no auxiliary head (its 3.3 M parameters and second loss)
    row = next(r for r in tf_ps.load_rows() if r["model"] == "inception-v3" and r["gpus"] == 1)
    assert tf_ps.TF_MODELS["inception-v3"] == "inception-v3-tf"
    c = pm.cluster("k80", nodes=1, gpus_per_node=1, nic=None)
    s = pm.Strategy(dp=1, micro_batch=int(row["batch"]), precision="fp32", optimizer="sgd", framework="tensorflow",
                    ps_servers=int(row["ps_servers"]))
    own = pm.predict(pm.preset("inception-v3-tf"), c, s).samples_per_second
    assert tf_ps.predict_row({**row, "machine": "DGX-1"}) == pytest.approx(own, rel=1e-12)
