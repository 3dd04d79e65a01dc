"""The calibration's runner on this host: argument checks, how it spreads rounds and launches, and a real
measurement over loopback (``testbed.calibrate``)."""

from __future__ import annotations

import pytest

from trainsim.cluster.calibrate_fit import default_sizes
from trainsim.errors import UserError
from trainsim.testbed.calibrate import calibrate, calibrate_interleaved


def test_calibrate_interleaved_checks_its_input() -> None:
    with pytest.raises(UserError, match="sizes"):
        calibrate_interleaved([])
    with pytest.raises(UserError, match="sizes"):
        calibrate_interleaved([[1024], []])
    with pytest.raises(UserError, match="launches"):
        calibrate_interleaved([[1024]], launches=0)
    with pytest.raises(UserError, match="small_rounds"):
        calibrate_interleaved([[1024]], launches=2, small_rounds=0)
    with pytest.raises(UserError, match="floor_launches=-1"):
        calibrate_interleaved([[1024]], floor_launches=-1)
    with pytest.raises(UserError, match="big_launches=-1"):
        calibrate_interleaved([[1024]], big_launches=-1)
    assert default_sizes(8192, factor=2) == [1024, 2048, 4096, 8192] and default_sizes(8192) == [1024, 4096]


def test_bad_arguments() -> None:
    with pytest.raises(UserError):
        calibrate(world=1)
    with pytest.raises(UserError):
        calibrate(reps=0)
    with pytest.raises(UserError):
        calibrate(budget_s=-1)
    with pytest.raises(UserError, match="launches=0"):
        calibrate(launches=0)
    with pytest.raises(UserError, match="allgather_sizes"):
        calibrate(allgather_sizes=[1024])
    with pytest.raises(UserError, match="p2p_sizes"):
        calibrate(p2p_sizes=[1024])


def test_round_plan_spreads_slow_sizes_over_the_rounds() -> None:
    from trainsim.testbed.calibrate_worker import ROUND_MAX_S, round_plan

    slow = ROUND_MAX_S * 1e6 * 10
    plan = round_plan([300.0, slow, slow * 4], reps=5, n_rounds=5)
    assert len(plan) == 5 and all(r[0] is None for r in plan)  # fast: every round, on the time budget
    assert [r[1] for r in plan] == [1, 1, 1, 1, 1] and [r[2] for r in plan] == [1, 1, 1, 1, 1]
    assert round_plan([slow], reps=7, n_rounds=5) == [[2], [2], [2], [1], [0]]


def test_spread_places_the_launches_evenly_among_the_rounds() -> None:
    from trainsim.testbed.calibrate import _spread

    assert _spread(2, 9) == [3, 6]
    assert _spread(1, 9) == [4] and _spread(3, 3) == [1, 2, 2]
    assert _spread(2, 0) == [0, 0]  # no further launches: right after the first ones
    assert _spread(0, 9) == []


def test_level_counts() -> None:
    from trainsim.testbed.calibrate import _level_counts

    assert _level_counts(20, 2) == [10, 10] and _level_counts(5, 2) == [3, 2]
    assert _level_counts(1, 2) == [1] and _level_counts(0, 2) == []


@pytest.mark.multiproc  # two launches of two gloo ranks
def test_loopback_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainsim.testbed import netns

    monkeypatch.setattr(netns, "netns_unavailable", lambda: "forced for the test")
    cal = calibrate(world=2, max_bytes=64 << 10, reps=2)
    assert cal.where == "loopback" and len(cal.measured_us) == len(default_sizes(64 << 10))
    assert all(t > 0 for t in cal.measured_us)
    # the CPU pass ran for every size (all are fast here) and measured something
    assert cal.cpu_sizes_bytes == cal.sizes_bytes and all(c > 0 for c in cal.cpu_allreduce_us)
    assert len(cal.stolen_us) == len(cal.sizes_bytes) and all(c >= 0 for c in cal.stolen_us)
    assert len(cal.cpu_p2p_us) == len(cal.sizes_bytes)
    ag = calibrate(world=2, sizes=[1024, 4096], reps=2, budget_s=0.05, allgather_sizes=[1024, 8192],
                   p2p_sizes=[1024, 8192])  # fmt: skip
    assert ag.allgather_sizes_bytes == [1024, 8192] and all(t > 0 for t in ag.allgather_measured_us)
    assert ag.allgather_us(4096) > 0
    assert ag.p2p_sizes_bytes == [1024, 8192] and len(ag.p2p_oneway_us) == len(ag.p2p_exchange_us) == 2
    assert all(t > 0 for t in ag.p2p_oneway_us + ag.p2p_exchange_us) and ag.duplex_factor() == 1.0
    # the parameter-server primitives at the same sizes
    assert len(ag.gather_us) == len(ag.broadcast_us) == 2 and all(t > 0 for t in ag.gather_us + ag.broadcast_us)
    # posting a send or receive, between pauses and between computations
    assert len(ag.post_idle_us) == len(ag.post_busy_us) == 2 and all(t > 0 for t in ag.post_idle_us + ag.post_busy_us)
    assert ag.busy_post_us() >= 0.0
    # the ranks' threads in the real-time class (root here): all-reduces only, no CPU pass
    rt = calibrate(world=2, sizes=[1024, 4096], reps=2, budget_s=0.05, realtime=True)
    assert all(t > 0 for t in rt.measured_us) and rt.cpu_sizes_bytes == []
    assert not rt.notes or "real-time scheduling refused" in rt.notes[0]
    # and each rank's threads kept on a core of their own
    pinned = calibrate(world=2, sizes=[4096, 1024, 1 << 20], reps=2, budget_s=0.05, realtime=True, pin=True,
                       launches=3)  # fmt: skip
    assert len(pinned.measured_us) == 3 and all(t > 0 for t in pinned.measured_us)
    assert not any("pinning the ranks to cores refused" in n for n in pinned.notes)
    # two calibrations whose launches take turns, each with its own sizes and fit
    # (real-time class, pinned: on loopback the kilobyte sizes then take 0.1-0.3 ms, under FLOOR_MAX_US)
    fit, check = calibrate_interleaved([[1024, 4096, 1 << 20], [2048, 8192]], world=2, reps=2, budget_s=0.05,
                                       launches=2, floor_launches=2, big_launches=1, realtime=True,
                                       pin=True)  # fmt: skip
    assert fit.sizes_bytes == [1024, 4096, 1 << 20] and check.sizes_bytes == [2048, 8192]
    # a launch more of the size above LAUNCH_MAX_BYTES (the check has none, so no launch)
    assert (fit.big_launches, check.big_launches) == (1, 0)
    # the floor launches of the sizes under FLOOR_MAX_US
    assert fit.floor_launches == check.floor_launches == 2
    assert all(t > 0 for t in fit.measured_us + check.measured_us) and fit.predict_us(2048) > 0
    # sizes around the first launch's knee, measured in the second launch only, never a grid size
    assert len(fit.knee_sizes_bytes) == len(fit.knee_measured_us) and all(t > 0 for t in fit.knee_measured_us)
    assert not set(fit.knee_sizes_bytes) & set(fit.sizes_bytes) and set(fit.knee_sizes_bytes) <= set(fit.residual_sizes_bytes)
    # the sizes that split the steepest steps (if any), measured in the floor launches
    assert all(set(c.step_sizes_bytes) <= set(c.knee_sizes_bytes) - set(c.sizes_bytes) for c in (fit, check))
