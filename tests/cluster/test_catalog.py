from __future__ import annotations

import pytest

from trainsim.cluster.catalog import DEVICES, LINKS, Device, Link, device, link
from trainsim.errors import UserError


def test_every_entry_cites_a_source() -> None:
    for d in DEVICES.values():
        assert d.source.strip(), d.name
    for k in LINKS.values():
        assert k.source.strip(), k.name


def test_required_devices_present() -> None:
    for name in ("v100", "a100-40gb", "a100-80gb", "h100-sxm", "h200", "rtx2080ti", "this-cpu"):
        assert device(name).tflops("fp32") > 0


def test_datasheet_values() -> None:
    assert device("A100-80GB").tflops("bf16") == 312.0
    assert device("v100").tflops("bf16") == 15.7  # no BF16 path: falls back to FP32
    assert device("h200").mem_gib == 141.0
    assert link("pcie4-x16").bw_gbyte_s == 31.5
    assert link("ib-ndr").bw_gbyte_s == 50.0


def test_custom_link() -> None:
    k = link("custom:0.1:500")
    assert k.bw_gbyte_s == pytest.approx(0.0125) and k.latency_us == 500


def test_planner_gpu_names_work_here_too() -> None:
    """One name in a cluster file and on ``trainsim estimate --gpu``: the planner's catalog calls them h100,
    v100-32gb ...; each names the same device in both catalogs."""
    from trainsim.cluster.catalog import DEVICE_ALIASES, DEVICES
    from trainsim.plan.devices import gpu, names

    assert device("H100") is DEVICES["h100-sxm"] and device("v100-32gb") is DEVICES["v100"]
    for alias, target in DEVICE_ALIASES.items():
        assert device(alias) is DEVICES[target]
    for name in names():  # every planner name but the 16 GB V100 (not in this catalog) is known here
        if name == "v100-16gb":
            continue
        assert device(name).mem_gib == pytest.approx(gpu(name).mem_gib, rel=0.05)
    for name in DEVICES:  # and every GPU of this catalog there
        if name != "this-cpu":
            assert gpu(name).mem_gib == pytest.approx(device(name).mem_gib, rel=0.05)


@pytest.mark.parametrize("name", ["b200", "tpu"])
def test_unknown_device(name: str) -> None:
    with pytest.raises(UserError, match=r"unknown device .* expected one of"):
        device(name)


@pytest.mark.parametrize("name", ["eth-3g", "custom:x", "custom:1:2:3"])
def test_bad_link(name: str) -> None:
    with pytest.raises(UserError):
        link(name)


def test_impossible_values() -> None:
    with pytest.raises(UserError, match="bandwidth"):
        Link(name="x", bw_gbyte_s=0, latency_us=1)
    with pytest.raises(UserError, match="latency"):
        Link(name="x", bw_gbyte_s=1, latency_us=-1)
    with pytest.raises(UserError):
        Device(name="x", peak_tflops={"fp32": -1}, mem_bw_gbps=1, mem_gib=1, source="t")
    with pytest.raises(UserError):
        link("custom:-5")
