"""Asynchronous parameter servers, server VMs with cloud caps, the TensorFlow stack, the CIFAR presets."""

from __future__ import annotations

import json
from importlib import resources

import pytest

import perfmodel as pm
from perfmodel.errors import InvalidInputError, UnsupportedError
from perfmodel.hardware.cloud import gcp_cap, instance_cap, server_vm
from perfmodel.parallel.ps_async import ServerCpu, ServerLoad, ServerSpec, async_ps, place_variables
from perfmodel.workload.variables import Variable, model_variables

TRAIN = dict(micro_batch=128, precision="fp32", optimizer="sgd", framework="tensorflow")
# two 4 MB variables; one update moves 8 MB each way through the server
VARS = (Variable("a", 10**6, True), Variable("b", 10**6, True), Variable("moving_mean", 64, False))
NIC = ServerSpec(egress_bytes_per_s=1e9, ingress_bytes_per_s=1e9, vcpus=4, latency_s=0.0)
CPU = ServerCpu(update_s_per_byte=1e-9, copy_s_per_byte=0.0, transfer_s_per_byte_per_end=0.0, message_s_per_end=0.0)


def _run(workers, spec=NIC, cpu=CPU, compute=0.1):
    return async_ps(compute_s=compute, backward_s=0.05, variables=VARS, workers=workers, servers=1, spec=spec,
                    worker_bw_bytes_per_s=1.25e9, cpu=cpu)


def test_compute_bound_cluster_is_the_sum_of_worker_rates():
    # pull: max(8 MB / 1.25 GB/s, 8 MB / 1 GB/s) = 8 ms; the 8 ms push hides behind 50 ms of backward
    r = _run(4)
    assert r.worker_step_s == pytest.approx(0.108)
    assert r.updates_per_second == pytest.approx(4 / 0.108)
    assert r.saturating_workers == pytest.approx(0.108 / 0.008)  # 13.5
    assert "workers' own steps" in r.bottleneck and r.mean_staleness == pytest.approx(3.0)


def test_nic_bound_server_caps_the_cluster():
    # NIC out 8 ms per update > CPU 8 MB x 1 ns / 4 vCPUs = 2 ms: 125 updates/s however many workers
    r = _run(20)
    assert r.server_cpu_s[0] == pytest.approx(0.002)
    assert r.updates_per_second == pytest.approx(125.0)
    assert r.worker_period_s == pytest.approx(20 / 125.0) and r.saturated
    assert "NIC out" in r.bottleneck and r.mean_staleness == pytest.approx(19.0)


def test_cpu_bound_server_caps_the_cluster():
    # one vCPU at 4 ns per byte: 32 ms per update > 8 ms of NIC: 31.25 updates/s, saturated from 3.375 workers
    r = _run(8, spec=ServerSpec(1e9, 1e9, 1, 0.0), cpu=ServerCpu(4e-9, 0.0, 0.0, 0.0))
    assert r.updates_per_second == pytest.approx(31.25)
    assert r.saturating_workers == pytest.approx(0.108 / 0.032)
    assert "CPU (1 vCPUs" in r.bottleneck


def test_a_server_without_a_vcpu_count_is_bound_by_its_nic_and_says_its_cpu_is_unpriced():
    # GPU nodes as servers give no vCPU count: the CPU term is None (not NaN) in the result and its JSON
    r = _run(20, spec=ServerSpec(1e9, 1e9, None, 0.0))
    assert r.server_cpu_s == (None,) and r.updates_per_second == pytest.approx(125.0)
    assert "NIC out" in r.bottleneck
    p = pm.predict("resnet-cifar32", pm.cluster("v100", 4, 1), pm.Strategy(ps_servers=2, ps_async=True, **TRAIN))
    assert "NaN" not in json.dumps(p.to_dict()) and None in p.ps.server_cpu_s


def test_rpc_and_byte_costs_add_on_the_server_cpu():
    cpu = ServerCpu(1e-9, 2e-9, 3e-9, 1e-5)
    # 8 MB x (2 x 3 + 2 + 1) ns + 4 RPCs (two per trainable variable) x 10 us, over 4 vCPUs
    r = _run(1, cpu=cpu)
    assert r.server_cpu_s[0] == pytest.approx((8e6 * 9e-9 + 4e-5) / 4)


def test_placement_greedy_by_bytes_and_round_robin_in_creation_order():
    sizes = [8, 1, 1, 1, 7]
    assert list(place_variables(sizes, 2, "greedy")) == [0, 1, 1, 1, 1]
    assert list(place_variables(sizes, 2, "round-robin")) == [0, 1, 0, 1, 0]


@pytest.mark.parametrize("name, params", [("resnet-cifar15", 693_818), ("resnet-cifar32", 1_857_722),
                                          ("shake-shake-small", 2_926_986), ("shake-shake-big", 26_204_362)])
def test_cifar_presets_have_t2t_parameter_counts_exactly(name, params):
    assert pm.preset(name).params == params
    variables = model_variables(pm.preset(name))
    assert sum(v.elements for v in variables if v.trainable) == params
    assert variables[0].name == "global_step"


def test_gcp_aws_azure_caps():
    assert gcp_cap(4)[0] == pytest.approx(1e9)           # 4 x 2 Gb/s
    assert gcp_cap(32)[0] == pytest.approx(4e9)          # n1 cap 32 Gb/s
    assert gcp_cap(16, "e2")[0] == pytest.approx(2e9)    # e2 cap 16 Gb/s
    assert instance_cap("aws", "m5.xlarge")[:2] == (4, pytest.approx(1.25e9 / 8))  # sustained baseline
    assert instance_cap("azure", "Standard_D4_v3")[:2] == (4, pytest.approx(2e9 / 8))
    vm = server_vm(vcpus=4, nic="5Gb/s", provider="gcp")
    assert vm.egress_bytes_per_s == pytest.approx(5e9 / 8)  # the lower of the NIC and the cap
    assert "cloud.google.com" in vm.source


@pytest.mark.parametrize("kw, field", [({"vcpus": 4}, "NIC"), ({"vcpus": 0, "nic": "1Gb/s"}, "'vcpus'"),
                                       ({"vcpus": 2.5, "nic": "1Gb/s"}, "'vcpus'"),
                                       ({"vcpus": "4", "nic": "1Gb/s"}, "'vcpus'")])
def test_server_vm_bad_input_names_the_field(kw, field):
    with pytest.raises(InvalidInputError, match=field):
        server_vm(**kw)


@pytest.fixture(scope="module")
def cluster_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("roles") / "gcp.toml"
    path.write_text('name = "gcp-p100"\nnodes = 4\nnode = "p100"\n[servers]\nvcpus = 4\nprovider = "gcp"\ncount = 2\n')
    return path


def test_cluster_toml_servers_role(cluster_file, tmp_path):
    c = pm.cluster(str(cluster_file))
    assert c.n_gpus == 4 and c.servers.count == 2 and c.servers.vcpus == 4
    assert c.servers.egress_bytes_per_s == pytest.approx(1e9)
    bad = tmp_path / "bad.toml"
    bad.write_text('node = "p100"\n[servers]\nvcpus = 4\n')
    with pytest.raises(InvalidInputError, match=r"\[servers\].*NIC"):
        pm.cluster(str(bad))


@pytest.fixture(scope="module")
def async_run(cluster_file):
    return pm.predict("resnet-cifar32", pm.cluster(str(cluster_file)), pm.Strategy(ps_async=True, **TRAIN))


def test_predict_async_reports_cluster_rate_and_worker_period(async_run):
    p, ps = async_run, async_run.ps
    assert ps.servers == 2 and ps.workers == 4 and ps.placement == "round-robin"  # T2T 1.9's placement
    assert p.samples_per_second == pytest.approx(ps.updates_per_second * 128)
    assert p.step_time == pytest.approx(ps.worker_period_s)
    assert p.breakdown["optimizer"] == 0.0  # the update runs on the servers
    assert ps.mean_staleness == pytest.approx(3.0) and p.interval_regime.startswith("uncalibrated")


def test_async_without_servers_and_contradicting_counts(cluster_file):
    with pytest.raises(InvalidInputError, match="'ps_async'=True needs parameter servers"):
        pm.predict("resnet-cifar15", pm.cluster("p100", nodes=2), pm.Strategy(ps_async=True, **TRAIN))
    with pytest.raises(InvalidInputError, match="'ps_servers'=3 contradicts"):
        pm.predict("resnet-cifar15", pm.cluster(str(cluster_file)), pm.Strategy(ps_async=True, ps_servers=3, **TRAIN))


def test_tensorflow_stack_refuses_what_it_cannot_price():
    with pytest.raises(UnsupportedError, match="stacks that price transformers: pytorch"):
        pm.predict("gpt2-small", pm.cluster("h100"), pm.Strategy(framework="tensorflow", precision="fp32"))
    with pytest.raises(UnsupportedError, match="trains in fp32"):
        pm.predict("resnet-cifar15", pm.cluster("h100"), pm.Strategy(framework="tensorflow"))
    with pytest.raises(InvalidInputError, match="'ps_placement'"):
        pm.Strategy(ps_placement="greedy")


def test_bundled_cpu_costs_are_measured_and_positive():
    data = json.loads((resources.files("perfmodel.parallel") / "data" / "ps_cpu.json").read_text())
    assert all(data[k] > 0 for k in ("update_s_per_byte", "copy_s_per_byte", "transfer_s_per_byte_per_end",
                                     "message_s_per_end"))
    assert data["transfer_measured_by"] == "grpc_call"
    assert "calibration.ps_cpu" in data["source"]


def test_round_robin_puts_every_shake_shake_kernel_on_one_of_two_servers():
    # 6 variables per conv + BN (kernel, bias, gamma, beta, moving mean, moving variance) after
    # global_step: round-robin over 2 servers sends every kernel to server 1; greedy splits them
    variables = model_variables(pm.preset("shake-shake-big"))
    rr = ServerLoad.of(variables, 2, "round-robin").pull_bytes
    greedy = ServerLoad.of(variables, 2, "greedy").pull_bytes
    assert rr[1] / rr.sum() > 0.99
    assert max(greedy) / greedy.sum() < 0.55


def test_cli_predict_async_names_the_bottleneck(cluster_file, capsys):
    from perfmodel.cli import main

    code = main(["predict", "--model", "resnet-cifar32", "--gpu", str(cluster_file), "--micro-batch", "128",
                 "--precision", "fp32", "--optimizer", "sgd", "--framework", "tensorflow", "--ps-async", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ps"]["servers"] == 2 and out["strategy"]["ps_async"] is True
    assert out["samples_per_second"] == pytest.approx(out["ps"]["updates_per_second"] * 128)


def test_mixed_gpu_types_async_sum_worker_rates_and_agree_with_predict():
    s = pm.Strategy(ps_async=True, **TRAIN)
    vm = server_vm(vcpus=4, provider="gcp")
    one_type = pm.predict_mixed("resnet-cifar15", [("p100", 4)], s, servers=1, server_node=vm)
    p = pm.predict("resnet-cifar15", pm.cluster("p100", nodes=4, servers=vm), s.replace(ps_servers=1))
    assert one_type.updates_per_second[0] == pytest.approx(p.ps.updates_per_second, rel=1e-12)
    mixed = pm.predict_mixed("resnet-cifar15", [("k80", 2), ("p100", 2)], s, servers=1, server_node=vm).iloc[0]
    k80 = pm.predict_mixed("resnet-cifar15", [("k80", 1)], s, servers=1, server_node=vm).updates_per_second[0]
    p100 = pm.predict_mixed("resnet-cifar15", [("p100", 1)], s, servers=1, server_node=vm).updates_per_second[0]
    assert mixed.updates_per_second == pytest.approx(2 * k80 + 2 * p100)  # below saturation: rates add
    with pytest.raises(InvalidInputError, match="needs parameter servers"):
        pm.predict_mixed("resnet-cifar15", [("k80", 2)], s)


def test_worker_vms_take_their_cloud_cap(tmp_path):
    from perfmodel.parallel.fabric import parameter_server_links

    path = tmp_path / "workers.toml"
    path.write_text('nodes = 2\nnode = "p100"\n[workers]\nvcpus = 8\nprovider = "gcp"\n')
    c = pm.cluster(str(path))
    assert c.node.nic.bw_bytes_per_s == pytest.approx(2e9)  # n1 with 8 vCPUs: 16 Gb/s
    assert parameter_server_links(c)["worker"] == pytest.approx(2e9)  # the cap is what the VM reaches
    path.write_text('node = "p100"\n[workers]\nvcpu = 8\n')
    with pytest.raises(InvalidInputError, match=r"\[workers\].*'vcpu'"):
        pm.cluster(str(path))
