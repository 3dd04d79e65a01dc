from __future__ import annotations

from pathlib import Path

import pytest

from trainsim.cluster.spec import cluster, cluster_from_dict, load_cluster
from trainsim.errors import UserError


def test_python_builder() -> None:
    c = cluster(nodes=4, devices_per_node=8, device="a100-80gb", intra="nvlink3", inter="ib-hdr")
    assert c.world_size == 32 and c.inter.bw_gbyte_s == 25.0
    c.check_ranks(32)
    with pytest.raises(UserError, match="33 ranks requested"):
        c.check_ranks(33)


def test_toml_and_yaml(tmp_path: Path) -> None:
    t = tmp_path / "c.toml"
    t.write_text(
        'nodes = 2\ndevices_per_node = 4\ndevice = "h100-sxm"\nintra_link = "nvlink4"\n'
        'inter_link = { bw_gbyte_s = 12.5, latency_us = 15 }\ntopology = "hierarchical"\n'
    )
    c = load_cluster(t)
    assert (c.world_size, c.topology, c.inter.latency_us) == (8, "hierarchical", 15.0)
    y = tmp_path / "c.yaml"
    y.write_text("nodes: 3\ndevice: v100\ninter_link: eth-25g\ntopology: ps\nps_servers: 2\nps_colocated: false\n")
    c = load_cluster(y)
    assert (c.nodes, c.n_servers, c.ps_colocated) == (3, 2, False)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"device": "b300"}, "unknown device"),
        ({"inter_link": "eth-7g"}, "unknown link"),
        ({"inter_link": {"bw_gbyte_s": 0}}, "bandwidth"),
        ({"inter_link": {"bw_gbyte_s": -3, "latency_us": 1}}, "bandwidth"),
        ({"nodes": 0}, "nodes=0"),
        ({"topology": "mesh"}, "topology"),
        ({"gpus": 8}, "unknown key"),
    ],
)
def test_bad_cluster(data: dict[str, object], match: str) -> None:
    with pytest.raises(UserError, match=match) as exc:
        cluster_from_dict(data, "my.toml")
    assert str(exc.value).startswith("my.toml") and "\n" not in str(exc.value)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such cluster file"):
        load_cluster(tmp_path / "nope.toml")
    bad = tmp_path / "c.toml"
    bad.write_text("nodes = [")
    with pytest.raises(UserError, match="cannot parse"):
        load_cluster(bad)
    other = tmp_path / "c.ini"
    other.write_text("x")
    with pytest.raises(UserError, match="file type"):
        load_cluster(other)
