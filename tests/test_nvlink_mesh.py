"""A switchless NVLink mesh (HGX H200 4-GPU): a pair of GPUs talks over a third of each GPU's links."""

import pytest

import perfmodel as pm
from perfmodel.core.errors import InvalidInputError
from perfmodel.costs.comm import collective_time, hierarchical_time, mesh_bytes
from perfmodel.hardware import load_link
from perfmodel.hardware.link import Link
from perfmodel.predict import _collectives, default_profile


def _coll(node):
    c = pm.cluster(node)
    return _collectives(c, default_profile(c))


def test_mesh_bytes_by_hand():
    assert mesh_bytes(3, 1e9, 2) == pytest.approx(3e9)    # 1 of 3 peer shares: 3x the bytes at the full rate
    assert mesh_bytes(3, 1e9, 3) == pytest.approx(1.5e9)  # 2 of 3
    assert mesh_bytes(3, 1e9, 4) == pytest.approx(1e9)    # the whole node's ring
    link = load_link("nvlink4-mesh")
    assert (link.kind, link.mesh_peers, link.bw_bytes_per_s, link.nccl_busbw_bytes_per_s) == \
        ("nvlink", 3, 450e9, 370e9)
    with pytest.raises(InvalidInputError, match="'mesh_peers' must be a whole number of peers, at least 1: got 0"):
        Link(name="x", kind="nvlink", bw_bytes_per_s=1.0, latency_s=1.0, mesh_peers=0)


def test_a_pair_on_the_mesh_moves_its_bytes_on_a_third_of_the_links():
    mesh, switch = _coll("hgx-h200-4gpu"), _coll("hgx-h200")
    entry = mesh["intra"]["all_gather"]
    assert entry["mesh_peers"] == 3
    plain = {k: v for k, v in entry.items() if k != "mesh_peers"}
    big = 2 * 4096 * 4096 * 2.0  # a Llama 3 8B activation
    pair = float(hierarchical_time(mesh, "all_gather", big, 2, 1, algorithm="ring"))
    assert pair == pytest.approx(float(collective_time(plain, "all_gather", 3 * big, 2)), rel=1e-12)
    four = float(hierarchical_time(mesh, "all_gather", big, 4, 1, algorithm="ring"))
    assert four == pytest.approx(float(collective_time(plain, "all_gather", big, 4)), rel=1e-12)
    # all four GPUs: the switch node's ring curve, within 5%; a pair 2.3-3x slower than through the switch
    assert four == pytest.approx(float(hierarchical_time(switch, "all_gather", big, 4, 1, algorithm="ring")), rel=0.05)
    assert 2.3 < pair / float(hierarchical_time(switch, "all_gather", big, 2, 1, algorithm="ring")) < 3.1
    # no NVLink SHARP without a switch: the all-reduce runs at the ring's rate
    assert float(hierarchical_time(mesh, "all_reduce", big, 4, 1)) > 1.2 * float(
        hierarchical_time(switch, "all_reduce", big, 4, 1))
