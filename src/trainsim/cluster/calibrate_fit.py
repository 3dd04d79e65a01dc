"""Fit the all-reduce times that ``testbed.calibrate`` measured: the form with a latency floor and a
knee, the residual ratios that correct it, and the sizes to measure around the knee and its steps.

    >>> import numpy as np
    >>> from trainsim.cluster.calibrate_fit import fit_knee, knee_us
    >>> s = np.array([1e3, 4e3, 16e3, 64e3, 256e3, 1e6])
    >>> a, b, floor, b0 = fit_knee(s, knee_us(s, 50.0, 0.01, 300.0, 0.0))
    >>> round(b, 4)
    0.01

Pure numpy, no processes: ``tests/cluster/test_calibrate.py`` checks these on made-up times.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from trainsim.cluster.catalog import Link
from trainsim.errors import UserError


def round_mean(rounds: list[list[float]]) -> float:
    """One size's all-reduce time from its rounds of repetitions: the median of the rounds' means
    (the mean of the one round where only one was measured). Within a round the mean keeps the
    scheduling tail that a training step pays; across rounds the median drops a round that a burst
    of load from outside (another tenant of the host) slowed as a whole, which the mean of all
    repetitions would spread onto that size alone (2026-11-24: one 4 MiB check at +15 % of the fit
    run, with its neighbours within 1 %)."""
    return float(statistics.median(statistics.fmean(r) for r in rounds))


def knee_us(size_bytes: Any, a: float, b: float, floor: float, b0: float) -> Any:
    """``a + max(floor + b0 (S - c), b S)`` with the knee ``c = floor / b`` (``fit_knee``'s model), for
    one size or an array of them."""
    c = floor / b if b > 0 else 0.0
    x = np.asarray(size_bytes, dtype=float)
    return a + np.maximum(floor + b0 * (x - c), b * x)


def nonneg_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``y ~ c0 + c1 x`` by relative least squares, both coefficients clipped at 0."""
    w = 1.0 / np.maximum(y, 1e-9)
    (c0, c1), *_ = np.linalg.lstsq(np.stack([w, x * w], axis=1), np.ones_like(y), rcond=None)
    return max(float(c0), 0.0), max(float(c1), 0.0)


def fit_alpha_beta(sizes: np.ndarray, times_us: np.ndarray, world: int) -> tuple[float, float, Link]:
    """Least squares on relative error of ``t = a + b S``; also the equivalent ring ``Link``."""
    a, b, floor = fit_model(sizes, times_us, with_floor=False)
    return a, b, ring_link(a + floor, b, world)


def fit_model(sizes: np.ndarray, times_us: np.ndarray, *, with_floor: bool = True) -> tuple[float, float, float]:
    """Fit ``t = a + max(floor, b S)`` (relative least squares); returns ``(a, b, floor)``.

    ``floor = 0`` is the plain alpha-beta line. A floor models protocols whose small messages pay
    handshakes that large, pipelined transfers hide (gloo's ring on a high-latency link pays about two
    round trips per step for a 1 KiB message but overlaps them with data for 1 MiB). ``fit_knee`` with
    the slope below the knee held at 0.
    """
    a, b, floor, _ = fit_knee(sizes, times_us, below_slope=False, knee=with_floor)
    return a, b, floor


def fit_knee(
    sizes: np.ndarray, times_us: np.ndarray, *, below_slope: bool = True, knee: bool = True
) -> tuple[float, float, float, float]:
    """Fit ``t = a + max(floor + b0 (S - c), b S)`` with ``c = floor / b`` and ``0 <= b0 <= b``
    (relative least squares); returns ``(a, b, floor, b0)``.

    Above the knee ``c`` every byte costs ``b`` (the link, or the host for fast links); below it a byte
    costs only ``b0``: a token-bucket shaper lets its burst through at the host's speed, and a
    handshake-bound protocol hides small payloads in its round trips (``b0 = 0`` is ``fit_model``'s
    floor). ``a`` may be negative, so that the line above the knee starts below the origin (the burst
    passed free), while the time at 0 bytes, ``a + floor - b0 c``, stays >= 0. ``knee=False``: the
    plain line ``a + b S``. The slope ``b`` and the knee are searched on a grid around the linear fit,
    then on a finer grid around the best point; ``a`` and ``b0`` are solved in closed form for each pair.

    Robust to one noisy size: a size between the smallest and the largest whose relative residual
    exceeds 3 robust standard deviations of the residuals (and 3 %) is left out and the fit repeated,
    so that a mean pushed up by a burst of host load (a 1 MiB all-reduce 16 % above its neighbours'
    line at 20 Mbit/s) does not tilt the slope that the large sizes, the ones a training step pays
    for, depend on.
    """
    return fit_knee_kept(sizes, times_us, below_slope=below_slope, knee=knee)[0]


def fit_knee_kept(
    sizes: np.ndarray, times_us: np.ndarray, *, below_slope: bool = True, knee: bool = True
) -> tuple[tuple[float, float, float, float], np.ndarray]:
    """``fit_knee`` and the mask of the sizes the fit kept (a noisy size left out is false)."""
    s = np.asarray(sizes, dtype=float)
    t = np.asarray(times_us, dtype=float)
    if len(s) < 2 or (t <= 0).any() or len(s) != len(t):
        raise UserError("calibration needs at least two sizes with positive times")
    keep = np.ones(len(s), dtype=bool)
    fit = _fit_knee_once(s, t, keep, below_slope=below_slope, knee=knee)
    if len(s) >= 6:
        r = np.abs(knee_us(s, *fit) / t - 1)
        limit = max(3 * 1.4826 * float(np.median(r)), 0.03)
        # the smallest and the largest size are never left out: nothing else pins the two ends of the
        # model (2026-11-24, 1 Gbit/s: 1 and 4 KiB dropped, the fit read 136 us where both measured 200-220)
        ends = (s == s.min()) | (s == s.max())
        out = (r > limit) & ~ends
        if 0 < int(out.sum()) <= len(s) // 4:
            keep = ~out
            fit = _fit_knee_once(s, t, keep, below_slope=below_slope, knee=knee)
    return fit, keep


RESIDUAL_FROM_KNEE = 2.0
"""``residual_ratios`` corrects sizes from this many times the fitted knee up (the bandwidth regime)"""
RESIDUAL_MIN_US = 20_000.0
"""... and whose all-reduce takes at least this long (the fitted time), so that a scheduler tick of 4 ms
that some of its repetitions wait for is a small share of it"""


KNEE_WINDOW = (0.5, 2.5)
"""``knee_sizes`` and their ratios (``residual_ratios``) span this range of multiples of the knee"""


def knee_sizes(
    fit: tuple[float, float, float, float], lo: int, hi: int, unit: int = 1024
) -> list[int]:
    """Sizes a sixteenth of an octave apart around the knee ``c = floor / b`` of ``fit`` (within
    ``KNEE_WINDOW`` times ``c``, and ``lo < size <= hi``): ``unit * 2 ** ((j + 1/2) / 16)``, half a step
    off the x2 and x4 grids of ``default_sizes`` and the sizes halfway between theirs in log size, so
    never one of them, and with no gap at them either.

    Between the latency floor and the bandwidth line the real curve bends over an octave or two
    (on a link shaped with ``tbf``, as the all-reduce outgrows the bucket), where the form's sharp
    corner cuts it: at 1 Gbit/s 45 KiB measured 394 us, the form fitted on x2 sizes said 360 (32 KiB
    239 us on the floor, 64 KiB 530 on the line; 2026-11-25). The form stays fitted to the grid; the
    measured times at these sizes correct it through ``residual_ratios``. The bend is a staircase, not
    a curve: at 1 Gbit/s every 3 KiB from 30 to 63 KiB (2026-11-26, two calibrations taking turns, 5
    launches each) read 309 305 321 362 396 429 487 489 515 530 553 576 us and 306 308 314 364 394 427
    486 489 500 522 555 574, steps of 40-60 us at 36-39 and 45-48 KiB (the shaper's bucket and TCP's
    packets of ~12 KB). Eighth octaves that left out the sizes on and halfway between the grid's
    (2026-11-26 19:47) bracketed 45.25 KiB by 41.5 (385 us) and 49.35 KiB (491): a quarter octave
    that holds a whole step, and 45.25 KiB checked 10 % above the interpolation. Two calibrations
    taking turns that evening read 38 40 42 44 45.25 46.5 48 50 KiB at 335 363 395 408 443 476 489 490
    us and 336 366 396 409 446 491 494 490 (medians of 6 launches): a step's 30-40 us falls within
    1-2 KiB, which a sixteenth of an octave (4.4 %, 2 KiB at 45 KiB) resolves."""
    _, b, floor, _ = fit
    if b <= 0 or floor <= 0:
        return []
    return sizes_around(floor / b, lo, hi, unit)


def sizes_around(c: float, lo: int, hi: int, unit: int = 1024) -> list[int]:
    """``knee_sizes`` for a knee at ``c`` bytes."""
    j_lo = int(np.ceil(16 * np.log2(max(KNEE_WINDOW[0] * c, 1.0) / unit) - 0.5))
    j_hi = int(np.floor(16 * np.log2(KNEE_WINDOW[1] * c / unit) - 0.5))
    out = [round(unit * 2 ** ((j + 0.5) / 16)) for j in range(j_lo, j_hi + 1)]
    return [x for x in out if lo < x <= hi]


KNEE_MIN_RISE = 0.1
"""``measured_knee``: a rise smaller than this share of the smallest size's time is noise"""


def measured_knee(sizes: Sequence[int], times_us: Sequence[float], b: float) -> float | None:
    """Where the measured times leave the latency floor, from the bandwidth line's slope ``b`` (µs
    per byte) alone: at the first size S whose rise over the smallest size's time is at least half
    of ``b S`` and at least ``KNEE_MIN_RISE`` of that time (above the noise of a median), halfway in
    log size between S and the knee of a sharp corner through that point, ``S - rise / b``, which
    lies too low where the floor itself slopes (at +5 ms 17-22 KiB, where the fit put 38); None if
    no size rises that far or the corner falls below zero. The further launches' sizes go around it
    where the first launch's fit places none: with a floor of 22 ms (+5 ms one way) the fit can trade
    its floor for its slope below the knee (``b0`` close to ``b``), which puts the knee anywhere. On
    the medians of the 2026-11-27 00:17 run at +5 ms (fitted knee 38 KiB), 73 of 200 copies with 1 %
    noise per size put it beyond 512 KiB, and the run's first launch measured no size around it."""
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    s = [float(sizes[i]) for i in order]
    t = [float(times_us[i]) for i in order]
    if b <= 0 or len(s) < 2:
        return None
    for x, y in zip(s[1:], t[1:], strict=True):
        rise = y - t[0]
        if rise >= 0.5 * b * x and rise >= KNEE_MIN_RISE * t[0]:
            c = x - rise / b
            return float(np.sqrt(c * x)) if c > 0 else None
    return None


STEP_MIN_RISE = 0.04
"""``step_sizes``: a rise between neighbouring sizes beyond the bandwidth line's, as a share of the
lower size's time, that marks a step of the measured curve (above a median's noise at these sizes)"""
STEP_MAX = 2
"""``step_sizes``: the steepest steps split, at most"""
STEP_LEVELS = 2
"""turns of the floor launches, each after splitting the steepest steps found so far again (``step_sizes``)"""


def step_sizes(sizes: Sequence[int], times_us: Sequence[float], b: float, lo: float, hi: float) -> list[int]:
    """Sizes a third and two thirds of the way (in log size) across the ``STEP_MAX`` gaps between
    neighbouring measured sizes within ``[lo, hi]`` bytes whose time rises the most beyond the line's
    ``b`` (µs per byte) times the gap, where that excess is at least ``STEP_MIN_RISE`` of the lower
    size's time.

    Around the knee of an emulated link the curve climbs in steps (a message outgrows the shaper's
    bucket; TCP's packets), and a step inside a gap leaves every size in it at the interpolation's
    mercy: at 1 Gbit/s the knee sizes 44.29 and 46.25 KiB read 406 and 449 us (2026-11-27 00:17, the
    median of 10 launches), 6.5 % more than the line between them, and a check at 45.25 KiB read 457
    us where interpolation said 428 (-6.5 %). Measuring a gap's thirds places its step within a
    third of it. The thirds of a sixteenth-octave gap between ``knee_sizes`` lie at
    ``(j + 5/6) / 16`` and ``(j + 7/6) / 16`` octaves, never on the x2 grid or halfway between its
    sizes.

    The floor launches call it again before each of their ``STEP_LEVELS`` turns, with the sizes
    measured so far: a third can still hold the step. In two runs of 2026-11-27 (02:44, 04:04) the
    thirds 44.93 and 45.58 KiB read 421 / 464 and 410 / 450 us, the check's 45.25 KiB between them
    465 and 459 us, and the interpolation across that third missed it by -4.8 and -6.3 %; single
    launches of sizes across it (05:25, ad hoc) put the step between 46,008 and 46,200 bytes (405-411
    against 428-439 us), below the third 45.15 KiB that the next turn measures."""
    pts = sorted((float(x), float(t)) for x, t in zip(sizes, times_us, strict=True) if lo <= x <= hi)
    rises = []
    for (s0, t0), (s1, t1) in itertools.pairwise(pts):
        excess = (t1 - t0 - b * (s1 - s0)) / t0 if t0 > 0 else 0.0
        if excess >= STEP_MIN_RISE and s1 > s0:
            rises.append((excess, s0, s1))
    out: set[int] = set()
    for _, s0, s1 in sorted(rises, reverse=True)[:STEP_MAX]:
        out |= {round(s0 * (s1 / s0) ** f) for f in (1 / 3, 2 / 3)}
    have = {int(x) for x in sizes}
    return sorted(x for x in out if x not in have)


def residual_ratios(
    sizes: np.ndarray,
    times_us: np.ndarray,
    fit: tuple[float, float, float, float],
    keep: np.ndarray,
    knee_pts: tuple[Sequence[int], Sequence[float]] = ((), ()),
    measured_floor: bool = False,
) -> tuple[list[int], list[float]]:
    """Where the fitted form misses the measured times by a few percent, the measurement itself:
    ``(sizes, measured / fitted)`` at the sizes the fit kept, with ratio 1 below ``RESIDUAL_FROM_KNEE``
    times the knee ``c = floor / b`` and where the fitted time is below ``RESIDUAL_MIN_US``.

    Above the knee a byte's cost is not quite one constant: on the 100 Mbit/s link gloo's all-reduce
    cost 90.6-90.9 us/KB from 256 KiB to 4 MiB and 93.8-95.1 us/KB from 4 to 64 MiB (2026-11-24), so
    the one slope that fits them best missed 16 and 64 MiB by -2.9 and -2.7 % and 1 MiB by +1.1 %, on
    the run it was fitted to. Those times repeat within about 1 % from run to run, so the measurement
    is the better predictor there. Below the knee the times are a few hundred microseconds of
    wake-ups and round trips that move by 10-15 % from second to second on this host
    (docs/benchmarks/cluster.md, "How steady is a small all-reduce"), and with the kernel's default
    scheduler a share of the all-reduces of up to tens of milliseconds waits for a 4 ms tick (64 KiB
    at 1 Gbit/s: 1.5 ms in one run, 2.0 ms in the next): there the form, fitted across several sizes,
    averages that noise and is kept as it is. A size the fit left out as noisy gets no ratio
    of its own (its neighbours' are interpolated).

    ``knee_pts``: ``(sizes, times)`` measured around the knee (``knee_sizes``). Where there are
    any, every size within ``KNEE_WINDOW`` times the knee, theirs and the fit's own (kept or not),
    gets its measured ratio: there the form's corner, not noise, is what misses.

    ``measured_floor``: the sizes below the knee window were measured in many launches (``floor_launches``);
    each of them gets its measured ratio too. The floor is not flat: at 1 Gbit/s it steps by 20-30 us
    between 5 and 5.66 KiB (2026-11-26, two calibrations taking turns), which one floor and one slope
    cannot follow; with 10 launches the noise of the medians (a launch's level moves by up to +-7 %)
    was as large as that miss, so the form alone was the better choice there."""
    s = np.asarray(sizes, dtype=float)
    t = np.asarray(times_us, dtype=float)
    a, b, floor, b0 = fit
    c = floor / b if b > 0 else 0.0
    fitted = knee_us(s, a, b, floor, b0)
    ratio = np.where((s >= RESIDUAL_FROM_KNEE * c) & (fitted >= RESIDUAL_MIN_US), t / fitted, 1.0)
    if measured_floor:
        below = s < KNEE_WINDOW[0] * c
        ratio = np.where(below, t / fitted, ratio)
        keep = keep | below
    ks, kt = np.asarray(knee_pts[0], dtype=float), np.asarray(knee_pts[1], dtype=float)
    if ks.size:
        near = (s >= KNEE_WINDOW[0] * c) & (s <= KNEE_WINDOW[1] * c)
        ratio = np.where(near, t / fitted, ratio)
        keep = keep | near
        s = np.concatenate([s, ks])
        ratio = np.concatenate([ratio, kt / knee_us(ks, a, b, floor, b0)])
        keep = np.concatenate([keep, np.ones(ks.size, dtype=bool)])
    order = np.argsort(s[keep], kind="stable")
    return [int(x) for x in s[keep][order]], [float(x) for x in ratio[keep][order]]


def _fit_knee_once(
    s: np.ndarray, t: np.ndarray, keep: np.ndarray, *, below_slope: bool, knee: bool
) -> tuple[float, float, float, float]:
    """``fit_knee`` on the sizes where ``keep`` is true."""
    w = keep / t
    (a0, b_lin), *_ = np.linalg.lstsq(np.stack([w, s * w], axis=1), keep.astype(float), rcond=None)
    b_lin = max(float(b_lin), 1e-12)
    best = (float(np.sum(keep * ((max(float(a0), 0.0) + b_lin * s) / t - 1) ** 2)), max(float(a0), 0.0), b_lin,
            0.0, 0.0)  # fmt: skip
    if not knee:
        return best[1], best[2], best[3], best[4]

    def solve(b: float, c: float) -> tuple[float, float, float]:
        """Best ``(error, a, b0)`` for slope ``b`` and knee ``c``."""
        y = t - b * np.maximum(s, c)  # what a + b0 * min(S - c, 0) must explain
        x = np.minimum(s - c, 0.0)
        if below_slope and (x[keep] < 0).any():
            (a, b0), *_ = np.linalg.lstsq(np.stack([w, x * w], axis=1), y * w, rcond=None)
            b0 = min(max(float(b0), 0.0), b)
        else:
            b0 = 0.0
        r = y - b0 * x
        # a < 0 lets the line above the knee start below the origin (a shaper's burst passes free),
        # as long as the time at 0 bytes stays >= 0
        a = max(-c * (b - b0), float(np.sum(w * w * r) / np.sum(w * w)))
        m = a + b * np.maximum(s, c) + b0 * x
        return float(np.sum(keep * (m / t - 1) ** 2)), a, b0

    bs, cs = b_lin * np.geomspace(0.5, 2.0, 61), np.geomspace(float(s.min()) / 8, float(s.max()), 81)
    for _ in range(2):  # coarse grid, then a finer one around the best point
        for b in bs:
            for c in cs:
                err, a, b0 = solve(float(b), float(c))
                if err < best[0]:
                    best = (err, a, float(b), float(b * c), b0)
        b_best, c_best = best[2], best[3] / best[2]
        bs = b_best * np.geomspace(0.97, 1.03, 31)
        cs = max(c_best, 1.0) * np.geomspace(0.7, 1.4, 41)
    return best[1], best[2], best[3], best[4]


def ring_link(small_us: float, b: float, world: int) -> Link:
    steps = 2 * (world - 1)
    alpha = small_us / steps if steps else 0.0
    bytes_per_us = steps / world / b if steps else 1e12
    return Link(name="calibrated", bw_gbyte_s=bytes_per_us / 1e3, latency_us=alpha, source="trainsim calibrate")


def default_sizes(max_bytes: int, min_bytes: int = 1024, factor: int = 4) -> list[int]:
    """Sizes from ``min_bytes`` up to ``max_bytes``, ``factor`` apart."""
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes
