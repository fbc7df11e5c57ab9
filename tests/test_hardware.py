"""The hardware catalog: bundled GPUs/links/nodes, user files, clusters, error messages."""

import dataclasses
import pickle
import subprocess
import sys

import pytest

import perfmodel as pm
from perfmodel.core.errors import InvalidInputError, UnknownNameError, UnsupportedError
from perfmodel.hardware import (
    DTYPES,
    GPU,
    LINK_KINDS,
    Cluster,
    Link,
    Node,
    cluster,
    list_gpus,
    list_links,
    list_nodes,
    load_gpu,
    load_link,
    load_node,
)

CATALOG_GPUS = [
    "a100-sxm4-40gb",
    "a100-sxm4-80gb",
    "b200-sxm-180gb",
    "gb200-186gb",
    "h100-sxm5-80gb",
    "h100-sxm5-96gb-hbm2e-500w",
    "h200-sxm-141gb",
    "k80",
    "l4",
    "p100-pcie-16gb",
    "rtx-3090",
    "t4",
    "v100-sxm2-32gb",
]
GiB = 2**30

# ---------------------------------------------------------------- GPUs


def test_catalog_lists_every_gpu():
    assert list_gpus() == CATALOG_GPUS


@pytest.mark.parametrize("name", CATALOG_GPUS)
def test_every_catalog_gpu_loads_with_sources(name):
    gpu = load_gpu(name)
    assert gpu.name == name
    assert set(gpu.peak_flops) <= set(DTYPES) and "fp32" in gpu.peak_flops
    assert all(v > 1e12 for v in gpu.peak_flops.values())
    assert gpu.mem_bytes > 10 * GiB and gpu.mem_bw_bytes_per_s > 1e11
    assert gpu.sm_count > 0 and gpu.pcie in list_links()
    assert gpu.nvlink is None or gpu.nvlink in list_links()
    assert gpu.source and gpu.year and gpu.tdp_w and gpu.l2_bytes
    # tensor-core dtypes are at least as fast as fp32
    assert max(gpu.peak_flops.values()) >= gpu.peak("fp32")


# datasheet values, dense (hand-checked: e.g. H100 132 SMs x 4096 FLOP/clk x 1.83 GHz = 989.4e12)
@pytest.mark.parametrize(
    ("name", "dtype", "flops"),
    [
        ("a100", "bf16", 312e12),
        ("a100-40gb", "tf32", 156e12),
        ("a100", "fp32", 19.5e12),
        ("h100", "bf16", 989.4e12),
        ("h100", "tf32", 494.7e12),
        ("h100", "fp8", 1978.9e12),
        ("h200", "bf16", 989.4e12),
        ("v100", "fp16", 125e12),
        ("v100", "fp32", 15.7e12),
        ("l4", "bf16", 121e12),
        ("l4", "fp8", 242.5e12),
        ("t4", "fp16", 65e12),
        ("t4", "fp32", 8.1e12),
        ("k80", "fp32", 4.37e12),
        ("p100", "fp32", 9.3e12),
        ("p100", "fp16", 18.7e12),
    ],
)
def test_peak_flops_match_datasheets(name, dtype, flops):
    assert load_gpu(name).peak(dtype) == pytest.approx(flops, rel=1e-12)


def test_memory_figures():
    assert load_gpu("a100-40gb").mem_bw_bytes_per_s == 1555e9
    assert load_gpu("a100-80gb").mem_bw_bytes_per_s == 2039e9
    assert load_gpu("h100").mem_bw_bytes_per_s == 3.35e12
    assert load_gpu("h200").mem_bw_bytes_per_s == 4.8e12
    assert load_gpu("h100").mem_bytes == 80 * GiB
    # H200: what CUDA reports as usable, not the datasheet's 141
    assert load_gpu("h200").mem_bytes == 150109880320
    assert load_gpu("k80").mem_bytes == 12 * GiB  # one GK210, half a board
    assert load_gpu("h100").nvlink_bw_bytes_per_s == 450e9
    assert load_gpu("a100").nvlink_bw_bytes_per_s == 300e9
    assert load_gpu("t4").nvlink_bw_bytes_per_s is None


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("v100", "v100-sxm2-32gb"),
        ("a100", "a100-sxm4-80gb"),
        ("a100-40gb", "a100-sxm4-40gb"),
        ("a100-80gb", "a100-sxm4-80gb"),
        ("h100", "h100-sxm5-80gb"),
        ("h200", "h200-sxm-141gb"),
        ("p100", "p100-pcie-16gb"),
        ("H100", "h100-sxm5-80gb"),
        ("A100_80GB", "a100-sxm4-80gb"),
        (" t4 ", "t4"),
    ],
)
def test_aliases_resolve(alias, name):
    assert load_gpu(alias) is load_gpu(name)  # cached: one frozen object


def test_unsupported_dtype_message():
    with pytest.raises(UnsupportedError) as err:
        load_gpu("t4").peak("bf16")
    assert str(err.value) == "t4 has no bf16 tensor cores (supported: fp32, fp16)"


def test_k80_has_only_fp32():
    with pytest.raises(UnsupportedError, match=r"k80 has no fp16 tensor cores \(supported: fp32\)"):
        load_gpu("k80").peak("fp16")


def test_peak_accepts_torch_dtype_names():
    h100 = load_gpu("h100")
    assert h100.peak("bfloat16") == h100.peak("bf16")
    assert h100.peak("torch.float16") == h100.peak("fp16")
    assert h100.peak("float32") == 66.9e12


def test_unknown_dtype_lists_known():
    with pytest.raises(UnknownNameError) as err:
        load_gpu("h100").peak("int4")
    assert str(err.value) == "unknown dtype 'int4' (known: bf16, fp16, fp32, fp8, tf32)"


def test_unknown_gpu_lists_known_and_closest():
    with pytest.raises(UnknownNameError) as err:
        load_gpu("h300")
    message = str(err.value)
    assert message.startswith("unknown GPU 'h300'; did you mean 'h200'? (known: a100, ")
    assert all(name in message for name in CATALOG_GPUS)


def test_gpu_is_frozen_hashable_and_picklable():
    gpu = load_gpu("h100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu.mem_bytes = 1
    with pytest.raises(TypeError):
        gpu.peak_flops["bf16"] = 1.0
    assert pickle.loads(pickle.dumps(gpu)) == gpu
    assert len({gpu, load_gpu("h100-sxm5-80gb"), load_gpu("h200")}) == 2


def test_gpu_built_in_python_is_validated():
    gpu = GPU(
        name="toy",
        peak_flops={"bfloat16": 1e15},
        mem_bw_bytes_per_s=1e12,
        mem_bytes=GiB,
        sm_count=10,
    )
    assert gpu.peak("bf16") == 1e15 and gpu.dtypes == ("bf16",)
    with pytest.raises(
        InvalidInputError, match=r"GPU 'toy': 'mem_bytes' must be a number > 0: got -1"
    ):
        GPU(
            name="toy",
            peak_flops={"fp32": 1e12},
            mem_bw_bytes_per_s=1e12,
            mem_bytes=-1,
            sm_count=10,
        )
    with pytest.raises(InvalidInputError, match="'peak_flops' must map at least one of"):
        GPU(name="toy", peak_flops={}, mem_bw_bytes_per_s=1e12, mem_bytes=GiB, sm_count=10)


# ---------------------------------------------------------------- links


def test_links():
    names = list_links()
    for expected in (
        "nvlink2",
        "nvlink3",
        "nvlink4",
        "nvlink3-nvswitch",
        "nvlink4-nvswitch",
        "pcie3",
        "pcie4",
        "pcie5",
        "ib-edr",
        "ib-hdr",
        "ib-ndr",
        "eth10",
        "eth25",
        "eth100",
        "eth200",
        "eth400",
    ):
        assert expected in names
    for name in names:
        link = load_link(name)
        assert link.kind in LINK_KINDS and link.source and link.latency_s > 0
        assert link.source_of("latency")  # every latency says where it comes from


def test_link_figures():
    assert load_link("nvlink2").bw_bytes_per_s == 150e9
    assert load_link("nvlink3").bw_bytes_per_s == 300e9
    assert load_link("nvlink4").bw_bytes_per_s == 450e9
    assert load_link("nvlink4-nvswitch").kind == "nvswitch"
    assert load_link("nvlink4-nvswitch").nccl_busbw_bytes_per_s == 370e9
    assert load_link("nvlink4-nvswitch").nccl_allreduce_busbw_bytes_per_s == 480e9
    assert load_link("nvlink3-nvswitch").nccl_busbw_bytes_per_s == 230e9
    assert load_link("nvlink5").bw_bytes_per_s == 2 * load_link("nvlink4").bw_bytes_per_s  # 18 links x 50 GB/s
    assert load_link("nvlink5-nvswitch").nccl_busbw_bytes_per_s == 740e9  # NVLink 4's ring share, carried
    assert load_link("nvlink5-nvswitch").nccl_allreduce_busbw_bytes_per_s == 680e9  # Azure ND GB200 v6, 8 GB
    # PCIe 3.0 x16: 8 GT/s x 16 lanes x 128/130 / 8 bits = 15.75 GB/s
    assert load_link("pcie3").bw_bytes_per_s == pytest.approx(8e9 * 16 * 128 / 130 / 8, rel=1e-4)
    assert load_link("pcie5").bw_bytes_per_s == pytest.approx(
        4 * load_link("pcie3").bw_bytes_per_s, rel=1e-4
    )
    assert load_link("hdr").bw_bytes_per_s == 25e9  # 200 Gb/s
    assert load_link("ib-hdr").nccl_busbw_bytes_per_s == 24e9
    assert load_link("ib-ndr").nccl_busbw_bytes_per_s == 47e9
    assert load_link("ib-edr").nccl_busbw_bytes_per_s == 12.2e9
    assert load_link("25gbe").bw_bytes_per_s == 3.125e9
    assert load_link("nvlink4").latency_s == 0.6e-6


def test_unknown_link():
    with pytest.raises(UnknownNameError, match=r"unknown link 'ib-hdrr'; did you mean 'ib-hdr'"):
        load_link("ib-hdrr")


def test_link_kind_is_checked():
    with pytest.raises(InvalidInputError) as err:
        Link(name="x", kind="carrier-pigeon", bw_bytes_per_s=1.0, latency_s=1.0)
    assert str(err.value) == (
        "link 'x': 'kind' must be one of nvlink, nvswitch, pcie, infiniband, ethernet: "
        "got 'carrier-pigeon'"
    )


# ---------------------------------------------------------------- nodes


def test_node_presets():
    assert list_nodes() == ["dgx-1-v100", "dgx-a100-40gb", "dgx-a100-80gb", "dgx-b200", "dgx-h100", "gb200-nvl72",
                            "grand-teton-h100", "hgx-h200", "hgx-h200-4gpu"]
    sizes = {"hgx-h200-4gpu": 4, "gb200-nvl72": 72}  # the NVL72's node is its NVLink domain
    for name in list_nodes():
        node = load_node(name)
        assert node.name == name and node.gpus_per_node == sizes.get(name, 8) and node.source


@pytest.mark.parametrize(
    ("name", "gpu", "intra", "nic", "inter_bw"),
    [
        ("dgx-a100-80gb", "a100-sxm4-80gb", "nvlink3-nvswitch", "ib-hdr", 8 * 25e9),
        ("dgx-a100-40gb", "a100-sxm4-40gb", "nvlink3-nvswitch", "ib-hdr", 8 * 25e9),
        ("dgx-h100", "h100-sxm5-80gb", "nvlink4-nvswitch", "ib-ndr", 8 * 50e9),
        ("grand-teton-h100", "h100-sxm5-96gb-hbm2e-500w", "nvlink4-nvswitch", "eth400", 8 * 50e9),
        ("hgx-h200", "h200-sxm-141gb", "nvlink4-nvswitch", "ib-ndr", 8 * 50e9),
        ("dgx-b200", "b200-sxm-180gb", "nvlink5-nvswitch", "ib-ndr", 8 * 50e9),
        ("gb200-nvl72", "gb200-186gb", "nvlink5-nvswitch", "ib-ndr", 72 * 50e9),
        ("dgx-1-v100", "v100-sxm2-32gb", "nvlink2", "ib-edr", 4 * 12.5e9),
    ],
)
def test_node_preset_contents(name, gpu, intra, nic, inter_bw):
    node = load_node(name)
    assert (node.gpu.name, node.intra.name, node.nic.name) == (gpu, intra, nic)
    assert node.inter_bw_bytes_per_s == inter_bw


def test_node_rejects_a_nic_as_intra_link():
    gpu, nic = load_gpu("h100"), load_link("ib-ndr")
    with pytest.raises(InvalidInputError, match="'intra' must be a link of kind nvlink, nvswitch"):
        Node(name="n", gpu=gpu, gpus_per_node=8, intra=nic, nic=nic)


# ---------------------------------------------------------------- clusters


def test_bare_gpu_is_one_gpu_node():
    c = cluster("h200")
    assert (c.n_gpus, c.nodes, c.gpus_per_node) == (1, 1, 1)
    assert c.gpu is load_gpu("h200")
    assert c.node.intra.name == "pcie5" and c.node.nic.name == "eth25"
    assert cluster() == c  # the default cluster is one H200


def test_cluster_gpu_counts():
    assert cluster("dgx-a100-80gb", nodes=16).n_gpus == 128
    assert cluster("dgx-h100", nodes=4).n_nodes == 4
    assert cluster("t4", nodes=3).n_gpus == 3
    big = cluster("hgx-h200", nodes=32)
    assert big.n_gpus == 256 and big.groups == ((big.node, 32),)
    assert big.name == "32x hgx-h200"


def test_generic_multi_gpu_node_uses_nvswitch_when_the_gpu_has_nvlink():
    assert cluster("h100", gpus_per_node=8).node.intra.name == "nvlink4-nvswitch"
    assert cluster("a100", gpus_per_node=4).node.intra.name == "nvlink3-nvswitch"
    assert cluster("t4", gpus_per_node=4).node.intra.name == "pcie3"
    assert cluster("l4", gpus_per_node=8, nodes=2).n_gpus == 16


def test_a_prediction_over_several_generic_nodes_says_what_network_it_assumed():
    s = pm.Strategy(micro_batch=1)
    over_eth = pm.predict("gpt2-small", cluster("h100", nodes=2), s).caveats
    assert len(over_eth) == 1 and "2 generic nodes of 1 x h100-sxm5-80gb, joined by one eth25 NIC" in over_eth[0]
    # one generic node, a node preset: nothing assumed between nodes
    assert pm.predict("gpt2-small", cluster("h100", gpus_per_node=2), s).caveats == ()
    assert pm.predict("gpt2-small", cluster("dgx-h100", nodes=2), s).caveats == ()


def test_part_of_a_preset_keeps_nics_per_gpu():
    node = cluster("dgx-h100", gpus_per_node=4).node
    assert (node.gpus_per_node, node.nics_per_node) == (4, 4)
    assert cluster("dgx-1-v100", gpus_per_node=1).node.nics_per_node == 1


def test_more_gpus_than_the_preset_has():
    with pytest.raises(InvalidInputError) as err:
        cluster("dgx-h100", gpus_per_node=16)
    assert str(err.value) == "'gpus_per_node' must be at most 8 for node 'dgx-h100': got 16"


def test_bad_node_count():
    with pytest.raises(InvalidInputError, match=r"'nodes' must be an integer >= 1: got 0"):
        cluster("dgx-h100", nodes=0)


def test_unknown_cluster_name_lists_nodes_and_gpus():
    with pytest.raises(UnknownNameError) as err:
        cluster("dgx-h300")
    message = str(err.value)
    assert message.startswith("unknown node or GPU 'dgx-h300'; did you mean ")
    assert "dgx-a100-80gb" in message and "h200" in message


def test_cluster_is_frozen():
    c = cluster("dgx-h100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.nodes = 2
    assert isinstance(c, Cluster) and hash(c) == hash(cluster("dgx-h100"))


# ---------------------------------------------------------------- user files

MY_GPU = """
name = "mi300x"
description = "a GPU not in the catalog"
peak_flops = { bf16 = "1307.4TFLOPS", fp32 = "163.4 TFLOP/s" }
memory_bandwidth = "5.3TB/s"
memory = "192GB"
sm_count = 304
tdp_w = 750
source = "vendor datasheet"
"""


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_user_gpu_file(tmp_path):
    gpu = load_gpu(write(tmp_path / "my_gpu.toml", MY_GPU))
    assert gpu.name == "mi300x" and gpu.peak("bf16") == 1307.4e12
    assert gpu.mem_bytes == 192e9 and gpu.mem_bw_bytes_per_s == 5.3e12
    assert load_gpu(str(tmp_path / "my_gpu.toml")) == gpu


def test_a_peak_or_bandwidth_off_by_a_unit_prefix_is_refused(tmp_path):
    with pytest.raises(pm.InvalidInputError, match="'peak_flops.bf16' must be between 1e[+]09 and 1e[+]18 FLOP/s"):
        load_gpu(write(tmp_path / "g.toml", MY_GPU.replace('"1307.4TFLOPS"', '"1307.4FLOPS"')))
    with pytest.raises(pm.InvalidInputError, match="'memory_bandwidth' must be between"):
        load_gpu(write(tmp_path / "g.toml", MY_GPU.replace('"5.3TB/s"', '"5.3B/s"')))


def test_a_users_gpu_is_priced_by_its_datasheet(tmp_path):
    """No bundled profile: the reference profile scaled by the GPU's datasheet, and the prediction says so."""
    cl = pm.cluster(str(write(tmp_path / "my_gpu.toml", MY_GPU)))
    p = pm.predict("gpt2-small", cl, pm.Strategy())
    h200 = pm.predict("gpt2-small", "h200", pm.Strategy())
    assert p.profile == "mi300x (datasheet)" and 0 < p.step_time < h200.step_time  # 1.32x its FLOP/s


def test_user_gpu_name_defaults_to_file_name(tmp_path):
    text = MY_GPU.replace('name = "mi300x"', "")
    assert load_gpu(write(tmp_path / "Big_GPU.toml", text)).name == "big-gpu"


def test_user_file_edits_are_seen(tmp_path):
    path = write(tmp_path / "g.toml", MY_GPU)
    assert load_gpu(path).sm_count == 304
    write(path, MY_GPU.replace("sm_count = 304", "sm_count = 3040"))
    assert load_gpu(path).sm_count == 3040


def test_user_cluster_file_with_inline_node_and_gpu_path(tmp_path):
    write(tmp_path / "my_gpu.toml", MY_GPU)
    path = write(
        tmp_path / "my_cluster.toml",
        """
name = "lab"
nodes = 4
[node]
gpu = "my_gpu.toml"
gpus_per_node = 8
intra = { kind = "nvswitch", bandwidth = "448GB/s", latency = "1us" }
nic = "ndr"
nics_per_node = 8
""",
    )
    c = cluster(str(path))
    assert (c.name, c.n_gpus, c.gpu.name) == ("lab", 32, "mi300x")
    assert c.node.intra.bw_bytes_per_s == 448e9 and c.node.intra.latency_s == 1e-6
    assert c.node.inter_bw_bytes_per_s == 8 * 50e9
    assert cluster(path, nodes=2).n_gpus == 16  # an explicit count wins


def test_user_cluster_file_with_inline_gpu_table(tmp_path):
    path = write(
        tmp_path / "c.toml",
        """
gpu = "a100"
gpus_per_node = 4
nodes = 2
""",
    )
    c = cluster(path)
    assert c.n_gpus == 8 and c.node.intra.name == "nvlink3-nvswitch"
    assert c.node.nic.name == "eth25" and c.node.nics_per_node == 1
    inline = write(tmp_path / "d.toml", "nodes = 2\ngpus_per_node = 2\n[gpu]\n" + MY_GPU)
    assert cluster(inline).gpu.name == "mi300x" and cluster(inline).node.intra.name == "pcie4"


def test_user_cluster_file_naming_a_preset(tmp_path):
    path = write(tmp_path / "c.toml", 'node = "dgx-h100"\nnodes = 3\n')
    c = cluster(path)
    assert c.n_gpus == 24 and c.node is load_node("dgx-h100")


def test_user_node_file(tmp_path):
    path = write(
        tmp_path / "node.toml",
        """
name = "my-node"
gpu = "h100"
gpus_per_node = 8
intra = "nvlink4-nvswitch"
nic = "eth400"
nics_per_node = 8
source = "our procurement sheet"
""",
    )
    node = load_node(path)
    assert node.name == "my-node" and node.inter_bw_bytes_per_s == 8 * 50e9


@pytest.mark.parametrize(("old", "new", "message"), [
    ('memory = "192GB"', "", "missing field 'memory' (required: peak_flops, memory_bandwidth, memory, sm_count)"),
    ('"192GB"', '"eighty"', "'memory' must be a size like '80GiB' or '141GB': got 'eighty'"),
])
def test_bad_gpu_file_names_field_and_file(tmp_path, old, new, message):
    path = write(tmp_path / "bad.toml", MY_GPU.replace(old, new))
    with pytest.raises(InvalidInputError) as err:
        load_gpu(path)
    assert str(err.value) == f"{path}: {message}"


def test_misspelt_field_suggests_the_right_one(tmp_path):
    path = write(tmp_path / "bad.toml", MY_GPU.replace("sm_count", "sm_cuont"))
    with pytest.raises(
        InvalidInputError, match=r"unknown field 'sm_cuont'; did you mean 'sm_count'"
    ):
        load_gpu(path)


def test_unknown_gpu_inside_a_node_file_names_the_file(tmp_path):
    path = write(tmp_path / "n.toml", 'gpu = "h300"\ngpus_per_node = 8\n')
    with pytest.raises(UnknownNameError, match=r"n.toml: unknown GPU 'h300'; did you mean 'h200'"):
        load_node(path)


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(InvalidInputError, match=r"GPU file '.*nope.toml' does not exist"):
        load_gpu(tmp_path / "nope.toml")
    path = write(tmp_path / "broken.toml", "name = [")
    with pytest.raises(InvalidInputError, match="broken.toml: not valid TOML"):
        load_gpu(path)


# ---------------------------------------------------------------- import cost


def test_import_reads_no_data_and_no_torch():
    code = (
        "import sys, perfmodel.hardware as hw\n"
        "from perfmodel.hardware import catalog\n"
        "assert catalog._bundled_gpus.cache_info().currsize == 0\n"
        "assert catalog._bundled_nodes.cache_info().currsize == 0\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gpu_file_names_a_real_pcie_link(tmp_path):
    path = write(tmp_path / "g.toml", MY_GPU + 'pcie = "pcie9"\n')
    with pytest.raises(UnknownNameError) as err:
        load_gpu(path)
    message = str(err.value)
    assert message.startswith(f"{path}: unknown 'pcie' link 'pcie9'; did you mean 'pcie")
    assert message.endswith("(known: pcie3, pcie4, pcie5)")
    assert load_gpu(write(tmp_path / "h.toml", MY_GPU + 'pcie = "pcie-gen5"\n')).pcie == "pcie5"
