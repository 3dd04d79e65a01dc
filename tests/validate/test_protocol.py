"""The validation protocol: predictions frozen before any run, interleaved passes, partial results kept."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.errors import UserError
from trainsim.testbed import machine as mc
from trainsim.validate import protocol as pr


def _rows(n: int) -> list[dict[str, Any]]:
    return [{"config": {"i": i}, "label": f"c{i}", "predicted_ms": 10.0 + i, "held_out": i == n - 1} for i in range(n)]


def test_runs_are_interleaved_and_predictions_frozen_first(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = pr.ResultFile(out, command="x", seed=3)
    res.freeze(_rows(3))
    order: list[int] = []

    def run_one(i: int, p: int) -> tuple[float, dict[str, Any]]:
        doc = json.loads(out.read_text())
        assert doc["predictions_frozen_at"] and doc["runs_started_at"] >= doc["predictions_frozen_at"]
        assert [r["predicted_ms"] for r in doc["runs"]] == [10.0, 11.0, 12.0]
        order.append(i)
        return 10.0 + i + p, {"host_speed": 1e9 * (p + 1)}  # an in-run reading, wildly off

    doc = pr.interleave(res, run_one, passes=3)
    assert order == [0, 1, 2] * 3
    r0 = doc["runs"][0]
    assert r0["measured_passes_ms"] == [10.0, 11.0, 12.0] and r0["measured_ms"] == 11.0
    assert r0["predicted_ms"] == 10.0 and r0["error_pct"] == pytest.approx(-9.09, abs=0.01)
    assert r0["spread_pct"] == pytest.approx(100 * 2 / 11, abs=0.01) and r0["within"] == "10%"
    assert len(r0["diagnostics"]) == 3 and r0["diagnostics"][2]["host_speed"] == 3e9
    assert doc["mean_abs_error_pct"] is not None and not doc["partial"] and doc["finished_at"]
    assert json.loads(out.read_text()) == json.loads(json.dumps(doc))


def test_in_run_readings_never_reach_a_prediction(tmp_path: Path) -> None:
    """Two runs of the same frozen predictions, one with every in-run reading perturbed: the
    predictions on disk are identical."""
    docs = []
    for k in (1.0, 1e6):
        res = pr.ResultFile(tmp_path / f"r{k}.json", command="x", seed=0)
        res.freeze(_rows(2))
        docs.append(pr.interleave(res, lambda i, p, k=k: (20.0 * k, {"corun": k, "speed": 1 / k}), passes=2))
    assert [r["predicted_ms"] for r in docs[0]["runs"]] == [r["predicted_ms"] for r in docs[1]["runs"]]


def test_a_prediction_changed_after_freezing_is_caught(tmp_path: Path) -> None:
    res = pr.ResultFile(tmp_path / "r.json", command="x", seed=0)
    with pytest.raises(RuntimeError):
        res.record(0, 1.0)
    res.freeze(_rows(2))
    res.doc["runs"][1]["predicted_ms"] = 99.0
    with pytest.raises(AssertionError, match="frozen prediction changed"):
        res.record(0, 1.0)


@pytest.mark.parametrize("bad", [{"config": {}, "held_out": False}, {"config": {}, "predicted_ms": 0.0, "held_out": True}])
def test_freeze_refuses_rows_without_a_prediction(tmp_path: Path, bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        pr.ResultFile(tmp_path / "r.json", command="x", seed=0).freeze([bad])


def test_interrupt_keeps_partial_results(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = pr.ResultFile(out, command="x", seed=0)
    res.freeze(_rows(3))

    def run_one(i: int, p: int) -> float:
        if i == 2:
            raise KeyboardInterrupt
        return 11.0

    with pytest.raises(KeyboardInterrupt):
        pr.interleave(res, run_one, passes=3)
    doc = json.loads(out.read_text())
    assert doc["partial"] and "interrupted" in doc["partial_reason"]
    assert doc["runs"][0]["measured_ms"] == 11.0 and doc["runs"][2]["measured_ms"] is None
    assert not list(tmp_path.glob("*.partial"))


def test_within_uses_the_wider_of_10pct_and_the_spread() -> None:
    assert pr.within(-9.9, 0.0) == "10%"
    assert pr.within(14.0, 20.0) == "spread"
    assert pr.within(14.0, 5.0) is False


def test_ranking_only_judges_gaps_wider_than_the_spreads() -> None:
    runs = [
        {"config": 0, "predicted_ms": 10.0, "measured_ms": 10.0, "spread_pct": 2.0},
        {"config": 1, "predicted_ms": 9.0, "measured_ms": 10.5, "spread_pct": 8.0},  # gap 5 % < spread: not judged
        {"config": 2, "predicted_ms": 9.5, "measured_ms": 15.0, "spread_pct": 2.0},  # misranked against 0
    ]
    rk = pr.ranking(runs)
    assert rk["pairs_checked"] == 2 and rk["misranked"] == [["0", "2"]] and not rk["right"]


@settings(deadline=None, max_examples=30)
@given(st.lists(st.floats(1.0, 1e4), min_size=1, max_size=9))
def test_bootstrap_interval_lies_within_the_samples_and_repeats(xs: list[float]) -> None:
    lo, hi = pr.bootstrap_ci(xs)
    assert min(xs) <= lo <= hi <= max(xs)
    assert pr.bootstrap_ci(xs) == (lo, hi)


def test_seed_and_result_path(tmp_path: Path) -> None:
    assert pr.draw_seed(7) == 7 and 0 <= pr.draw_seed(None) < 2**31
    with pytest.raises(UserError, match="--seed -1"):
        pr.draw_seed(-1)
    f = tmp_path / "r.json"
    f.write_text("mine")
    with pytest.raises(UserError, match="exists; pass --force"):
        pr.check_result_path(str(f), False, "x.json")
    assert pr.check_result_path(str(f), True, "x.json") == f and f.read_text() == "mine"
    with pytest.raises(UserError, match="does not exist"):
        pr.check_result_path(str(tmp_path / "no" / "r.json"), False, "x.json")


# --------------------------------------------------------------------------- machine calibration
def _cal() -> mc.MachineCalibration:
    return mc.MachineCalibration(
        machine=mc.identity(), version=mc.version(), created_at="2026-11-29T00:00:00+00:00", sizes_bytes=[1, 2],
        loopback_us=[100.0, 100.0], host_a_us=100.0, host_b_us_per_byte=0.001,
        shaped_rates_mbit=[], shaped_sizes_bytes=[], efficiency_grid=[], shaped_us=[], link_efficiency=0.9, allgather_loopback_us=[], allgather_line=(80.0, 0.002), p2p_loopback_us=[],
        p2p_line=(50.0, 0.0005), kernel_ms=0.4, corun_slowdown={"2": 1.05, "4": 2.1}, load_avg=0.1,
    )  # fmt: skip


def test_allreduce_model_by_hand() -> None:
    cal = _cal()
    # 2 ranks, 1 MB on 100 Mbit/s at 90 %: host 100 + 0.001 * 1e6 = 1,100 us; wire 8e6 / 90 = 88,889 us
    assert cal.allreduce_us(1e6, rate_mbit=100) == pytest.approx(1100 + 8e6 / 90)
    # 4 ranks: 6 steps (host a x3), each rank sends 1.5 x the bytes; per step gloo's rendezvous, the
    # receiver's ready notice and then the data: 2 x 2 ms
    assert cal.allreduce_us(1e6, world=4, rate_mbit=100, delay_ms=2) == pytest.approx(
        300 + 1500 + 6 * 4_000 + 1.5 * 8e6 / 90
    )
    # a send whose receive is already posted: one delay
    assert cal.p2p_us(1e6, rate_mbit=100, delay_ms=1) == pytest.approx(50 + 500 + 1000 + 8e6 / 90)
    assert cal.allgather_us(1e6, world=3) == pytest.approx(2 * (80 + 2000))
    assert cal.allgather_us(1e6, world=3, delay_ms=1) == pytest.approx(2 * (80 + 2000 + 2 * 1000))
    assert cal.slowdown(1) == 1.0 and cal.slowdown(3) == 2.1 and cal.slowdown(8) == pytest.approx(4.2)


def _graded() -> mc.MachineCalibration:
    """A link that delivers more of a faster rate and less to longer transfers, as tbf and TCP do here."""
    return replace(_cal(), shaped_rates_mbit=[60.0, 240.0], shaped_sizes_bytes=[1 << 20, 16 << 20],
                   efficiency_grid=[[0.92, 0.88], [0.98, 0.94]])  # fmt: skip


def test_link_efficiency_by_rate_and_size_by_hand() -> None:
    cal = _graded()
    assert cal.efficiency(60, 1 << 20) == pytest.approx(0.92) and cal.efficiency(240, 16 << 20) == pytest.approx(0.94)
    assert cal.efficiency(120, 1 << 20) == pytest.approx(0.95)  # half-way in log rate
    assert cal.efficiency(60, 4 << 20) == pytest.approx(0.90)  # half-way in log size
    assert cal.efficiency(10, 1 << 10) == pytest.approx(0.92) and cal.efficiency(1e4, 1 << 30) == pytest.approx(0.94)
    # 16 MB all-reduce of 2 ranks at 60 Mbit/s: each rank puts the size on the wire once, at 88 %
    assert cal.allreduce_us(16 << 20, rate_mbit=60) == pytest.approx(100 + 0.001 * (16 << 20) + (16 << 20) * 8 / 52.8)
    assert _cal().efficiency(60, 1 << 20) == 0.9  # no grid: the one number


def test_delayed_links_read_their_own_grid() -> None:
    # the delay line's jumbo frames deliver more of a slow link and, across a long round trip, less of
    # a fast one; without a delayed grid (an older calibration) the undelayed one serves
    cal = replace(_graded(), delayed_rates_mbit=[60.0, 1200.0], delayed_efficiency_grid=[[0.99, 0.98], [0.85, 0.8]])
    assert cal.efficiency(60, 1 << 20, delay_ms=2) == pytest.approx(0.99)
    assert cal.efficiency(60, 1 << 20) == pytest.approx(0.92)
    assert cal.efficiency(1200, 16 << 20, delay_ms=0.5) == pytest.approx(0.8)
    assert _graded().efficiency(60, 1 << 20, delay_ms=2) == pytest.approx(0.92)
    # 2 ranks, 1 MiB at 60 Mbit/s + 2 ms: two ring steps of two latencies, the bytes at 99 %
    assert cal.allreduce_us(1 << 20, rate_mbit=60, delay_ms=2) == pytest.approx(
        100 + 0.001 * (1 << 20) + 2 * 2 * 2000 + (1 << 20) * 8 / (60 * 0.99)
    )


@settings(deadline=None)
@given(st.floats(1, 1e8), st.floats(1, 1e8), st.floats(1, 1e4), st.integers(2, 64), st.booleans())
def test_allreduce_grows_with_size_and_shrinks_with_rate(s1: float, s2: float, rate: float, world: int,
                                                         graded: bool) -> None:  # fmt: skip
    cal = _graded() if graded else _cal()
    lo, hi = sorted((s1, s2))
    assert cal.allreduce_us(lo, world=world, rate_mbit=rate) <= cal.allreduce_us(hi, world=world, rate_mbit=rate)
    assert cal.allreduce_us(hi, world=world, rate_mbit=2 * rate) <= cal.allreduce_us(hi, world=world, rate_mbit=rate)


def test_calibration_of_another_machine_or_version_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "machine.json"
    f.write_text(json.dumps(asdict(_cal())))
    cal, path = mc.load_machine(f)
    assert cal == _cal() and path == f
    f.write_text(json.dumps(asdict(replace(_cal(), machine={"cpu": "other", "cores": 64, "mem_gib": 512}))))
    with pytest.raises(UserError, match=r"another machine.*--recalibrate"):
        mc.load_machine(f)
    f.write_text(json.dumps(asdict(replace(_cal(), version="0.0.1/1"))))
    with pytest.raises(UserError, match=r"trainsim 0\.0\.1/1.*--recalibrate"):
        mc.load_machine(f)
    f.write_text("{not json")
    with pytest.raises(UserError, match="not a machine calibration"):
        mc.load_machine(f)


def test_validate_calibrate_cli_loads_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainsim.cli.main import main

    f = tmp_path / "machine.json"
    f.write_text(json.dumps(asdict(_cal())))
    assert main(["validate", "calibrate", "--file", str(f), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measured_now"] is False and out["link_efficiency"] == 0.9
    f.write_text(json.dumps(asdict(replace(_cal(), machine={"cpu": "other", "cores": 1, "mem_gib": 1}))))
    assert main(["validate", "calibrate", "--file", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another machine" in err and "Traceback" not in err


def test_fused_kernel_rate_by_size_by_hand() -> None:
    cal = replace(_cal(), fused_adam_sizes_bytes=[1 << 20, 4 << 20, 16 << 20], fused_adam_gbps=[20.0, 40.0, 30.0])
    assert cal.fused_kernel_gbps(1 << 20) == pytest.approx(20.0)
    assert cal.fused_kernel_gbps(2 << 20) == pytest.approx(30.0)  # half-way in log size between 20 and 40
    assert cal.fused_kernel_gbps(8 << 20) == pytest.approx(35.0)
    assert cal.fused_kernel_gbps(1 << 10) == 20.0 and cal.fused_kernel_gbps(1 << 30) == 30.0  # held beyond
    with pytest.raises(UserError, match=r"no fused-kernel pass.*--recalibrate"):
        _cal().fused_kernel_gbps(1 << 20)


def test_a_calibration_without_the_fused_pass_loads_and_gets_it_added(tmp_path: Path) -> None:
    # a format-5 file written before the pass: the same version, no fused fields; it loads, and
    # with_fused_kernel measures the pass (a real child process) and saves it, the rest unchanged
    f = tmp_path / "machine.json"
    raw = asdict(_cal())
    del raw["fused_adam_sizes_bytes"], raw["fused_adam_gbps"]
    f.write_text(json.dumps(raw))
    cal, _ = mc.load_machine(f)
    assert cal == _cal() and not cal.fused_adam_gbps
    done = mc.with_fused_kernel(cal, f)
    from trainsim.testbed.calibrate_host import FUSED_SIZES

    assert done.fused_adam_sizes_bytes == FUSED_SIZES and len(done.fused_adam_gbps) == len(FUSED_SIZES)
    assert all(g > 0.1 for g in done.fused_adam_gbps)  # any host moves more than 100 MB/s
    again, _ = mc.load_machine(f)
    assert again == done and replace(again, fused_adam_sizes_bytes=[], fused_adam_gbps=[]) == _cal()
    assert mc.with_fused_kernel(again, f) is again  # measured once
