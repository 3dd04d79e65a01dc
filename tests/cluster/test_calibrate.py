from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from trainsim.cluster.calibrate_fit import (
    KNEE_WINDOW,
    RESIDUAL_MIN_US,
    default_sizes,
    fit_alpha_beta,
    fit_knee,
    fit_knee_kept,
    fit_model,
    knee_sizes,
    knee_us,
    measured_knee,
    residual_ratios,
    round_mean,
    sizes_around,
    step_sizes,
)
from trainsim.cluster.calibration import Calibration
from trainsim.errors import UserError


def test_fit_recovers_constants() -> None:
    sizes = np.array(default_sizes(16 << 20))
    a, b = 300.0, 0.08  # us, us per byte (~100 Mbit/s ring on 2 ranks)
    a2, b2, link = fit_alpha_beta(sizes, a + b * sizes, world=2)
    assert (a2, b2) == pytest.approx((a, b))
    # ring on 2 ranks: a = 2 alpha, b = 1 / bandwidth
    assert link.latency_us == pytest.approx(150.0)
    assert link.bw_gbyte_s * 1e3 == pytest.approx(1 / b)
    with pytest.raises(UserError):
        fit_alpha_beta(np.array([1024]), np.array([5.0]), world=2)


def test_round_mean_keeps_the_tail_within_rounds_and_drops_a_slowed_round() -> None:
    # one round in three slowed as a whole by outside load: the median of the rounds' means ignores it
    steady = [250.0] * 9 + [4000.0]  # 1 in 10 all-reduces waits for a scheduler tick: the mean keeps it
    assert round_mean([steady, steady, [x * 1.3 for x in steady]]) == pytest.approx(625.0)
    assert round_mean([steady, [x * 1.3 for x in steady], steady]) == pytest.approx(625.0)
    # one round (sizes too slow to repeat): its mean
    assert round_mean([[36000.0, 38000.0]]) == pytest.approx(37000.0)
    # two rounds: the median is their mean
    assert round_mean([[100.0], [120.0]]) == pytest.approx(110.0)


def test_fit_keeps_the_smallest_and_largest_sizes() -> None:
    # measured at 1 Gbit/s (2026-11-24): the small sizes are noisy and not monotonic; the fit may not
    # leave the smallest ones out as outliers and fall far below them
    s = np.array(default_sizes(256 << 20))
    t = np.array([221, 200, 234, 548, 2222, 9038, 36964, 142501, 571060, 2305277.0])
    fit = fit_knee(s, t)
    assert abs(knee_us(1024, *fit) / 221 - 1) < 0.1
    assert np.abs(knee_us(s[3:], *fit) / t[3:] - 1).max() < 0.03


def test_fit_with_latency_floor() -> None:
    # measured on 100 Mbit/s + 5 ms (gloo, 2 processes): handshakes dominate small messages only
    s = np.array([1024, 4096, 16384, 65536, 262144, 1 << 20, 4 << 20])
    t = np.array([22438, 22129, 22506, 22157, 23784, 90779, 343934.0])
    a, b, floor = fit_model(s, t)
    err = (a + np.maximum(floor, b * s)) / t - 1
    assert np.abs(err).max() < 0.05 and floor > 15_000
    a0, b0, f0 = fit_model(s, t, with_floor=False)
    assert f0 == 0.0 and np.abs((a0 + b0 * s) / t - 1).max() > 0.10  # a line cannot do it
    # on a line the floor stays out of the way
    line = 300.0 + 0.08 * s
    a2, b2, f2 = fit_model(s, line)
    assert np.abs((a2 + np.maximum(f2, b2 * s)) / line - 1).max() < 0.01


def test_fit_knee_slope_below_the_knee() -> None:
    # a shaper's burst: bytes below the knee (here 16 KiB) cost a third of those above it
    s = np.array(default_sizes(64 << 20), dtype=float)
    a, b, b0, knee = 150.0, 0.085, 0.085 / 3, 16384.0
    t = a + np.maximum(b * knee + b0 * (s - knee), b * s)
    a2, b2, floor2, b02 = fit_knee(s, t)
    model = a2 + np.maximum(floor2 + b02 * (s - floor2 / b2), b2 * s)
    assert np.abs(model / t - 1).max() < 0.02
    assert b2 == pytest.approx(b, rel=0.02) and floor2 / b2 == pytest.approx(knee, rel=0.1)
    # the calibration predicts with the same formula
    cal = Calibration(world=2, rate_mbit=100, delay_ms=0, sizes_bytes=list(map(int, s)), measured_us=list(t),
                      a_us=a2, b_us_per_byte=b2, floor_us=floor2, b0_us_per_byte=b02,
                      link=fit_alpha_beta(s, t, world=2)[2])  # fmt: skip
    assert [cal.predict_us(x) for x in s] == pytest.approx(list(model))
    assert Calibration.from_json(cal.to_json()).predict_us(2048) == pytest.approx(cal.predict_us(2048))
    # without the slope below the knee (fit_model) the small sizes miss
    a3, b3, f3 = fit_model(s, t)
    assert np.abs((a3 + np.maximum(f3, b3 * s)) / t - 1).max() > 0.03


def test_fit_knee_leaves_out_one_noisy_size() -> None:
    # 20 Mbit/s-like line; the 1 MiB mean pushed 16 % up by a burst of host load
    s = np.array([*default_sizes(8 << 20), 9 << 20], dtype=float)
    t = 2000.0 + 0.46 * s
    noisy = t.copy()
    noisy[list(s).index(1 << 20)] *= 1.16
    model = knee_us(s, *fit_knee(s, noisy))
    assert abs(model[-1] / t[-1] - 1) < 0.01  # the largest size, what a training step pays, is untouched
    assert np.abs(model / t - 1).max() < 0.02
    # clean data: nothing left out, the line itself
    assert np.abs(knee_us(s, *fit_knee(s, t)) / t - 1).max() < 0.005


def test_residual_ratios_correct_the_form_above_the_knee_only() -> None:
    # 100 Mbit/s-like: a floor of 2 ms of handshakes for small sizes, then a byte costs 0.088 us up to
    # 4 MiB and 0.094 us beyond (two slopes above the knee, which the fitted form cannot follow); the
    # 1 KiB time 8 % above the floor (noise)
    def truth(x: float) -> float:
        return max(2000.0, 300.0 + (0.088 * x if x <= 4 << 20 else 0.088 * (4 << 20) + 0.094 * (x - (4 << 20))))

    s = np.array(default_sizes(64 << 20), dtype=float)
    t = np.array([truth(x) for x in s])
    t[0] *= 1.08
    fit, kept = fit_knee_kept(s, t)
    alone = knee_us(s, *fit)
    assert np.abs(alone / t - 1)[s >= 1 << 20].max() > 0.01  # the form alone misses the large sizes
    sizes, ratio = residual_ratios(s, t, fit, kept)
    link = fit_alpha_beta(s, t, world=2)[2]
    cal = Calibration(world=2, rate_mbit=100, delay_ms=0, sizes_bytes=list(map(int, s)), measured_us=list(t),
                      a_us=fit[0], b_us_per_byte=fit[1], floor_us=fit[2], b0_us_per_byte=fit[3], link=link,
                      residual_sizes_bytes=sizes, residual_ratio=ratio)  # fmt: skip
    c = fit[2] / fit[1]
    for x, m, f in zip(s, t, alone, strict=True):
        if x >= 2 * c and f >= RESIDUAL_MIN_US:  # the bandwidth regime: the measurement itself
            assert cal.predict_us(x) == pytest.approx(m, rel=1e-9)
        else:  # below it the form as fitted (the 1 KiB noise stays averaged out)
            assert cal.predict_us(x) == pytest.approx(f, rel=1e-9)
    # between calibrated sizes (one of them across the kink at 4 MiB) and beyond them: the true curve
    # within 1 % (the form alone: > 1 % off)
    for x in (2 << 20, 8 << 20, 32 << 20, 128 << 20):
        assert cal.predict_us(x) == pytest.approx(truth(x), rel=0.01)
    assert abs(cal.fit_us(32 << 20) / truth(32 << 20) - 1) > 0.01
    # kept through JSON; a calibration without ratios predicts with the form alone
    assert Calibration.from_json(cal.to_json()).predict_us(8 << 20) == pytest.approx(cal.predict_us(8 << 20))
    plain = Calibration.from_json({**cal.to_json(), "residual_sizes_bytes": [], "residual_ratio": []})
    assert plain.predict_us(8 << 20) == pytest.approx(cal.fit_us(8 << 20)) and plain.residual(8 << 20) == 1.0


def test_residual_ratios_skip_a_size_the_fit_left_out() -> None:
    s = np.array([*default_sizes(8 << 20), 9 << 20], dtype=float)
    t = 2000.0 + 0.46 * s
    t[list(s).index(1 << 20)] *= 1.16  # a burst of host load
    fit, kept = fit_knee_kept(s, t)
    assert not kept[list(s).index(1 << 20)]
    sizes, ratio = residual_ratios(s, t, fit, kept)
    assert (1 << 20) not in sizes and max(abs(r - 1) for r in ratio) < 0.01


def test_knee_sizes_fill_the_bend_between_the_grids_sizes() -> None:
    # a knee at 32 KiB: sixteenth octaves from 16 to 80 KiB, half a step off the x2 grid and the sizes
    # halfway between its sizes, so none of those and no gap around them
    ks = knee_sizes((0.0, 8.0, 8.0 * 32768, 0.0), 1024, 256 << 10)
    assert len(ks) == 37 and ks == sorted(ks)
    assert ks[0] >= 16 << 10 and ks[-1] <= 80 << 10
    steps = [b / a for a, b in pairwise(ks)]
    assert all(abs(r - 2 ** (1 / 16)) < 1e-3 for r in steps)
    grid_and_halfway = [1024 * 2 ** (j / 2) for j in range(40)]
    # every grid or halfway size inside the window sits between two knee sizes, half a step from each
    for g in (x for x in grid_and_halfway if ks[0] < x < ks[-1]):
        below = max(k for k in ks if k < g)
        above = min(k for k in ks if k > g)
        assert g / below == pytest.approx(2 ** (1 / 32), rel=1e-3)
        assert above / g == pytest.approx(2 ** (1 / 32), rel=1e-3)
    assert knee_sizes((0.0, 8.0, 8.0 * 32768, 0.0), 1024, 40 << 10) == [k for k in ks if k <= 40 << 10]  # up to hi
    assert knee_sizes((100.0, 8.0, 0.0, 0.0), 1024, 1 << 30) == []  # no floor: no knee


def test_measured_knee_where_the_fit_places_none() -> None:
    # the +5 ms link of 2026-11-27 00:17 (medians of the fit run): the form fits with its knee at 38 KiB,
    # but with 1 % noise per size many fits trade the floor for the slope below the knee
    sizes = [1 << k for k in range(10, 27)]
    times = [22298.0, 22329, 22382, 22510, 22746, 23253, 25953, 31228, 42382, 62227, 107290, 194342, 365500,
             731941, 1492188, 2942034, 5894960]  # fmt: skip
    rng = np.random.default_rng(0)
    lost = 0
    for _ in range(50):
        noisy = np.array(times) * (1 + rng.normal(0, 0.01, len(times)))
        fit, _ = fit_knee_kept(np.array(sizes, dtype=float), noisy)
        lost += not knee_sizes(fit, 1024, 256 << 10)
        c = measured_knee(sizes, list(noisy), fit[1])
        assert c is not None and 24 << 10 < c < 48 << 10
        around = sizes_around(c, 1024, 256 << 10)
        assert min(around) < 32 << 10 and max(around) > 45 << 10  # the check's 45.25 KiB inside
    assert lost > 5
    # a sharp corner at 3.75 KiB under an 80 us/KiB line; no rise, no knee
    line = [max(300.0, 80.0 * x / 1024) for x in (1024, 2048, 4096, 8192)]
    # (the corner through 8 KiB, the first size off the floor, is 3.75 KiB: halfway to 8 KiB in log size)
    assert measured_knee([1024, 2048, 4096, 8192], line, 80.0 / 1024) == pytest.approx((3.75 * 8) ** 0.5 * 1024)
    assert measured_knee([1024, 2048], [100.0, 110.0], 0.01) is None
    assert measured_knee([1024, 2048], [100.0, 110.0], 0.0) is None


def test_knee_points_correct_the_corner_of_the_form() -> None:
    # a latency floor of 240 us that bends into the 8 us/KiB line over an octave (smooth maximum):
    # the form, fitted to the x2 grid, cuts the corner; with the quarter-octave sizes around the knee
    # the prediction halfway between the grid's sizes follows the bend
    def truth(x: float) -> float:
        return float((240.0**4 + (8.0 * x / 1024) ** 4) ** 0.25)

    s = np.array(default_sizes(4 << 20, factor=2), dtype=float)
    t = np.array([truth(x) for x in s])
    fit, kept = fit_knee_kept(s, t)
    ks = knee_sizes(fit, 1024, 256 << 10)
    assert len(ks) >= 4
    sizes, ratio = residual_ratios(s, t, fit, kept, (ks, [truth(x) for x in ks]))
    assert set(ks) <= set(sizes)
    link = fit_alpha_beta(s, t, world=2)[2]
    cal = Calibration(world=2, rate_mbit=1000, delay_ms=0, sizes_bytes=list(map(int, s)), measured_us=list(t),
                      a_us=fit[0], b_us_per_byte=fit[1], floor_us=fit[2], b0_us_per_byte=fit[3], link=link,
                      residual_sizes_bytes=sizes, residual_ratio=ratio, knee_sizes_bytes=ks,
                      knee_measured_us=[truth(x) for x in ks])  # fmt: skip
    halfway = s[:-1] * 2**0.5
    form = max(abs(cal.fit_us(x) / truth(x) - 1) for x in halfway)
    refined = max(abs(cal.predict_us(x) / truth(x) - 1) for x in halfway)
    assert form > 0.05 and refined < 0.02
    assert Calibration.from_json(cal.to_json()).predict_us(45 << 10) == pytest.approx(cal.predict_us(45 << 10))
    # without knee points nothing changes below the bandwidth regime
    c = fit[2] / fit[1]
    assert all(r == 1.0 for x, r in zip(*residual_ratios(s, t, fit, kept), strict=True) if x < 2 * c)


def test_floor_ratios_follow_a_step_on_the_latency_floor() -> None:
    # a floor with a 25 us step between 4 and 8 KiB, then the 8 us/KiB line: the form's one floor and
    # one slope miss the step; sizes measured in many launches (``measured_floor``) keep their measured ratios
    def truth(x: float) -> float:
        return max(280.0 + (25.0 if x > 5.3 * 1024 else 0.0), 8.0 * x / 1024)

    s = np.array(default_sizes(4 << 20, factor=2), dtype=float)
    t = np.array([truth(x) for x in s])
    fit, kept = fit_knee_kept(s, t)
    c = fit[2] / fit[1]
    sizes, ratio = residual_ratios(s, t, fit, kept, measured_floor=True)
    below = [x for x in s if x < KNEE_WINDOW[0] * c]
    assert len(below) >= 4 and set(below) <= set(sizes)
    link = fit_alpha_beta(s, t, world=2)[2]
    cal = Calibration(world=2, rate_mbit=1000, delay_ms=0, sizes_bytes=list(map(int, s)), measured_us=list(t),
                      a_us=fit[0], b_us_per_byte=fit[1], floor_us=fit[2], b0_us_per_byte=fit[3], link=link,
                      residual_sizes_bytes=sizes, residual_ratio=ratio, floor_launches=20)  # fmt: skip
    assert all(cal.predict_us(x) == pytest.approx(truth(x)) for x in below)
    # without ``measured_floor`` the sizes below the knee keep the form
    assert all(r == 1.0 for x, r in zip(*residual_ratios(s, t, fit, kept), strict=True) if x in below)
    assert Calibration.from_json(cal.to_json()).floor_launches == 20


def test_json_round_trip() -> None:
    sizes = [1024, 4096]
    a, b, link = fit_alpha_beta(np.array(sizes), np.array([110.0, 140.0]), world=2)
    cal = Calibration(world=2, rate_mbit=100, delay_ms=0, sizes_bytes=sizes, measured_us=[110.0, 140.0],
                      a_us=a, b_us_per_byte=b, link=link)  # fmt: skip
    back = Calibration.from_json(cal.to_json())
    assert back.predict_us(2048) == pytest.approx(cal.predict_us(2048))


def test_host_cpu_line() -> None:
    sizes = [1024, 65536, 1 << 20]
    a, b, link = fit_alpha_beta(np.array(sizes), np.array([500.0, 900.0, 9000.0]), world=2)
    cal = Calibration(world=2, rate_mbit=100, delay_ms=0, sizes_bytes=sizes, measured_us=[500.0, 900.0, 9000.0],
                      a_us=a, b_us_per_byte=b, link=link, cpu_sizes_bytes=sizes,
                      cpu_allreduce_us=[600 + 0.01 * s for s in sizes],
                      cpu_p2p_us=[200 + 0.004 * s for s in sizes])  # fmt: skip
    assert cal.cpu_line() == pytest.approx((600.0, 0.01))
    assert cal.cpu_line(p2p=True) == pytest.approx((100.0, 0.002))  # the pass timed send + receive
    assert cal.cpu_us(1 << 20) == pytest.approx(600 + 0.01 * (1 << 20))
    back = Calibration.from_json(cal.to_json())
    assert back.cpu_us(4096, p2p=True) == pytest.approx(cal.cpu_us(4096, p2p=True))
    none = Calibration(world=2, rate_mbit=100, delay_ms=0, sizes_bytes=sizes, measured_us=[1.0, 2.0, 3.0],
                       a_us=a, b_us_per_byte=b, link=link)  # fmt: skip
    assert none.cpu_us(1 << 20) == 0.0


def test_lost_computation_per_size() -> None:
    sizes = [1024, 65536, 1 << 20]
    a, b, link = fit_alpha_beta(np.array(sizes), np.array([500.0, 900.0, 9000.0]), world=2)
    cal = Calibration(world=2, rate_mbit=100, delay_ms=0, sizes_bytes=sizes, measured_us=[500.0, 900.0, 9000.0],
                      a_us=a, b_us_per_byte=b, link=link, cpu_sizes_bytes=sizes,
                      cpu_allreduce_us=[600 + 0.01 * s for s in sizes], cpu_p2p_us=[200.0, 300.0, 400.0],
                      stolen_us=[400.0, 2000.0, 30000.0])  # fmt: skip
    assert cal.lost_us(1024) == pytest.approx(400.0)
    assert cal.lost_us(65536) == pytest.approx(2000.0)
    assert cal.lost_us((65536 + (1 << 20)) / 2) == pytest.approx(16000.0)  # linear between measured sizes
    assert cal.lost_us(4 << 20) == pytest.approx(120000.0)  # proportional to the size beyond the largest
    assert cal.lost_us(512) == pytest.approx(400.0)  # the smallest measured below it
    assert cal.cpu_us(1 << 20) == pytest.approx(600 + 0.01 * (1 << 20))  # the predictions keep the process CPU
    assert Calibration.from_json(cal.to_json()).lost_us(65536) == pytest.approx(2000.0)


def test_allgather_line_or_ring_fallback() -> None:
    sizes = [1024, 1 << 20]
    a, b, link = fit_alpha_beta(np.array(sizes), np.array([500.0, 9000.0]), world=2)
    base = dict(world=2, rate_mbit=100, delay_ms=0, sizes_bytes=sizes, measured_us=[500.0, 9000.0],
                a_us=a, b_us_per_byte=b, link=link)  # fmt: skip
    measured = Calibration(**base, allgather_sizes_bytes=sizes, allgather_measured_us=[700.0, 12000.0],  # type: ignore[arg-type]
                           allgather_fit=(600.0, 0.011, 0.0))  # fmt: skip
    # between measured sizes: linear between the measured points; beyond: the last segment's slope;
    # below the smallest: the fitted line
    assert measured.allgather_us(1 << 20) == pytest.approx(12000.0)
    mid = 1024 + ((1 << 20) - 1024) / 2
    assert measured.allgather_us(mid) == pytest.approx((700.0 + 12000.0) / 2)
    slope = (12000.0 - 700.0) / ((1 << 20) - 1024)
    assert measured.allgather_us(2 << 20) == pytest.approx(12000.0 + slope * (1 << 20))
    assert measured.allgather_us(512) == pytest.approx(600.0 + 0.011 * 512)
    back = Calibration.from_json(measured.to_json())
    assert back.allgather_us(4096) == pytest.approx(measured.allgather_us(4096))
    # not measured: the ring model of the calibrated link (2 ranks: one step of S bytes)
    ring = Calibration(**base)  # type: ignore[arg-type]
    assert ring.allgather_us(1 << 20) == pytest.approx(link.latency_us + (1 << 20) / link.bytes_per_us)


@pytest.mark.multiproc
def test_step_sizes_split_the_steepest_steps() -> None:
    # the knee sizes of the 1 Gbit/s fit run of 2026-11-27 00:17 (medians of 10 launches), 17 to 62.6 KiB
    j = range(65, 95)
    sizes = [round(1024 * 2 ** ((k + 0.5) / 16)) for k in j]
    times = [285.8, 288.4, 290.1, 287.5, 286.5, 284.8, 289.8, 290.6, 291.0, 290.9, 291.1, 292.5, 290.4, 291.9,
             290.4, 288.0, 291.7, 303.1, 319.1, 336.6, 368.2, 386.1, 405.7, 449.5, 473.6, 480.9, 478.1, 492.0,
             512.2, 535.7]  # fmt: skip
    b = 0.008648
    out = step_sizes(sizes, times, b, 17e3, 90e3)
    # the two steepest steps (44.29 -> 46.25 KiB: 6.5 % beyond the line; 38.89 -> 40.61: 4.9 %), in thirds
    assert len(out) == 4
    assert sum(44.29 * 1024 < x < 46.25 * 1024 for x in out) == 2
    assert sum(38.89 * 1024 < x < 40.61 * 1024 for x in out) == 2
    # never a size of the x2 grid or halfway between its sizes (the check run's), nor one measured
    grid = {round(1024 * 2 ** (k / 2)) for k in range(40)}
    assert all(abs(x - g) > 64 for x in out for g in grid) and not set(out) & set(sizes)
    # a step in the gap's first third, with the check's 45.25 KiB in its second: once the thirds are
    # measured the check size sits above the step with its neighbours
    def truth(x: float) -> float:
        return 400.0 + 0.0086 * x + (90.0 if x > 44.6 * 1024 else 0.0)

    pts = sorted([*sizes, *out])
    cal = Calibration(world=2, rate_mbit=1000, delay_ms=0, sizes_bytes=pts, measured_us=[truth(x) for x in pts],
                      a_us=0.0, b_us_per_byte=0.0086, floor_us=0.0, b0_us_per_byte=0.0, link=fit_alpha_beta(
                          np.array(pts, float), np.array([truth(x) for x in pts]), world=2)[2],
                      residual_sizes_bytes=pts, residual_ratio=[truth(x) / (0.0086 * x) for x in pts],
                      step_sizes_bytes=out)  # fmt: skip
    check = 45.25 * 1024
    without = float(np.interp(np.log(check), np.log(sizes), [truth(x) for x in sizes]))
    assert abs(without / truth(check) - 1) > 0.04 and abs(cal.predict_us(check) / truth(check) - 1) < 0.02
    assert Calibration.from_json(cal.to_json()).step_sizes_bytes == out
    # the next turn of the floor launches: with the thirds measured (the 04:04 run's 44.93 and 45.58
    # KiB: 410 and 450 us), the steepest gap is now the third that holds the step, and it is split again
    meas = dict(zip(sizes, times, strict=True)) | {46008: 410.0, 46674: 450.0}
    again = step_sizes(sorted(meas), [meas[x] for x in sorted(meas)], b, 17e3, 90e3)
    assert sum(46008 < x < 46674 for x in again) == 2 and not set(again) & set(meas)
    # no rise beyond the line's, no step; the window bounds the search
    flat = [300.0 + b * x for x in sizes]
    assert step_sizes(sizes, flat, b, 17e3, 90e3) == [] and step_sizes(sizes, times, b, 60e3, 90e3) == []


def test_p2p_line_and_duplex_factor() -> None:
    sizes = [1024, 1 << 20]
    a, b, link = fit_alpha_beta(np.array(sizes), np.array([500.0, 9000.0]), world=2)
    base = dict(world=2, rate_mbit=100, delay_ms=0, sizes_bytes=sizes, measured_us=[500.0, 9000.0],
                a_us=a, b_us_per_byte=b, link=link)  # fmt: skip
    cal = Calibration(**base, p2p_sizes_bytes=[4096, 65536, 1 << 20],  # type: ignore[arg-type]
                      p2p_oneway_us=[150.0 + 0.008 * s for s in (4096, 65536, 1 << 20)],
                      p2p_exchange_us=[300.0, 1000.0, 1.6 * (150.0 + 0.008 * (1 << 20))])  # fmt: skip
    assert cal.p2p_line() == pytest.approx((150.0, 0.008))
    assert cal.duplex_factor() == pytest.approx(1.6)  # only sizes >= 256 KiB count
    back = Calibration.from_json(cal.to_json())
    assert back.duplex_factor() == pytest.approx(1.6)
    # posting on a busy host: the mean excess over the idle posts, never below 0
    busy = Calibration(**base, p2p_sizes_bytes=[4096, 65536], post_idle_us=[70.0, 80.0],  # type: ignore[arg-type]
                       post_busy_us=[470.0, 280.0])  # fmt: skip
    assert busy.busy_post_us() == pytest.approx(300.0)
    assert Calibration.from_json(busy.to_json()).busy_post_us() == pytest.approx(300.0)
    assert Calibration(**base, post_idle_us=[90.0], post_busy_us=[60.0]).busy_post_us() == 0.0  # type: ignore[arg-type]
    none = Calibration(**base)  # type: ignore[arg-type]
    assert none.duplex_factor() == 1.0
    # gather / broadcast lines: fitted where measured, else the point-to-point line
    assert cal.ps_lines() == (pytest.approx((150.0, 0.008)), pytest.approx((150.0, 0.008)))
    ps = Calibration(**base, p2p_sizes_bytes=[4096, 1 << 20], p2p_oneway_us=[160.0, 8500.0],  # type: ignore[arg-type]
                     p2p_exchange_us=[300.0, 15000.0], gather_us=[200.0 + 0.01 * s for s in (4096, 1 << 20)],
                     broadcast_us=[180.0 + 0.009 * s for s in (4096, 1 << 20)])  # fmt: skip
    assert ps.ps_lines() == (pytest.approx((200.0, 0.01)), pytest.approx((180.0, 0.009)))
    assert Calibration.from_json(ps.to_json()).ps_lines() == ps.ps_lines()
    assert none.p2p_line() == pytest.approx((link.latency_us, 1.0 / link.bytes_per_us))
