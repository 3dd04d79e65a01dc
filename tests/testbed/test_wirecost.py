"""The shaped link's cost per byte: the wire pass's arithmetic (testbed.wirecost) and how the machine
calibration charges it (testbed.machine)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from trainsim.errors import UserError
from trainsim.testbed import machine as mc
from trainsim.testbed.wirecost import lost_per_byte


def _cal() -> mc.MachineCalibration:
    return mc.MachineCalibration(
        machine=mc.identity(), version=mc.version(), created_at="2026-11-29T00:00:00+00:00", sizes_bytes=[1, 2],
        loopback_us=[100.0, 100.0], host_a_us=100.0, host_b_us_per_byte=0.001, shaped_rates_mbit=[],
        shaped_sizes_bytes=[], efficiency_grid=[], shaped_us=[], link_efficiency=0.9, allgather_loopback_us=[],
        allgather_line=(80.0, 0.002), p2p_loopback_us=[], p2p_line=(50.0, 0.0005), kernel_ms=0.4,
        corun_slowdown={"2": 1.05}, load_avg=0.1, wire_rates_mbit=[60.0, 240.0, 960.0],
        wire_lost_us=[[1300.0, 19300.0], [1300.0, 19300.0], [300.0, 4100.0]], wire_us_per_byte=[0.04, 0.04, 0.008],
    )  # fmt: skip


def test_lost_per_byte_is_twice_the_per_rank_slope() -> None:
    # per rank 1,300 us for 64 KiB and 19,300 us for 1 MiB: 18,000 us over 983,040 bytes, two ranks
    assert lost_per_byte([65536, 1 << 20], [1300.0, 19300.0]) == pytest.approx(2 * 18000 / 983040)
    assert lost_per_byte([65536, 1 << 20], [500.0, 400.0]) == 0.0  # a falling line is noise: none
    with pytest.raises(ValueError, match="2 sizes and 1"):
        lost_per_byte([1, 2], [1.0])


def test_wire_cost_by_rate_and_bytes_by_hand() -> None:
    cal = _cal()
    assert cal.wire_cpu_us_per_byte(60) == pytest.approx(0.04) and cal.wire_cpu_us_per_byte(240) == pytest.approx(0.04)
    # 480 Mbit/s: half-way from 240 to 960 in log rate, so half-way from 0.04 to 0.008
    assert cal.wire_cpu_us_per_byte(480) == pytest.approx(0.024)
    assert cal.wire_cpu_us_per_byte(10) == pytest.approx(0.04) and cal.wire_cpu_us_per_byte(1e4) == pytest.approx(0.008)
    assert cal.wire_cpu_us_per_byte(None) == 0.0  # loopback: its cost is the host line's
    assert replace(cal, wire_rates_mbit=[], wire_us_per_byte=[]).wire_cpu_us_per_byte(240) == 0.0
    # a 2-rank all-reduce of 1 MB at 480 Mbit/s: each rank sends 1 MB, 0.024 us per byte = 24,000 us
    assert cal.wire_cpu_us(1e6, rate_mbit=480) == pytest.approx(24_000)
    # 4 ranks: each rank sends 2 * 3 / 4 = 1.5 MB
    assert cal.wire_cpu_us(1e6, rate_mbit=480, world=4) == pytest.approx(36_000)
    assert cal.wire_cpu_us(1e6) == 0.0
    assert cal.describe(Path("m.json"))["wire_us_per_byte"] == [0.04, 0.04, 0.008]


def test_a_calibration_without_the_wire_pass_is_refused_with_the_way_out(tmp_path: Path) -> None:
    """A format-3 file (no wire pass) is another version: the error names ``--recalibrate``."""
    f = tmp_path / "machine.json"
    raw = asdict(_cal())
    for k in ("wire_rates_mbit", "wire_lost_us", "wire_us_per_byte"):
        del raw[k]
    raw["version"] = mc.version().rsplit("/", 1)[0] + "/3"
    f.write_text(json.dumps(raw))
    with pytest.raises(UserError, match=rf"/3, this is .*/{mc.FORMAT}; pass --recalibrate"):
        mc.load_machine(f)
    f.write_text(json.dumps(asdict(_cal())))
    assert mc.load_machine(f)[0] == _cal()


@pytest.mark.multiproc
def test_the_wire_pass_runs_on_two_ranks() -> None:
    """The pass itself, on loopback with a short window: one finite figure per size."""
    import math

    from trainsim.testbed.launch import run_json

    doc = run_json(2, "trainsim.testbed.wirecost", {"sizes": [65536, 1 << 20], "window_s": 0.1}, net=None, timeout_s=120)[0]
    assert doc["sizes"] == [65536, 1 << 20] and len(doc["lost_us"]) == 2
    assert all(math.isfinite(x) for x in doc["lost_us"])
