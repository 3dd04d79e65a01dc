"""Measure real gloo all-reduce times with torch.distributed and fit the alpha-beta constants.

    >>> from trainsim.cluster.calibrate import calibrate
    >>> cal = calibrate(world=2, rate_mbit=100, delay_ms=2, max_bytes=4 << 20)   # doctest: +SKIP
    >>> cal.link.bw_gbps, cal.link.latency_us                                     # doctest: +SKIP

Algorithm:
1. start ``world`` gloo processes (``trainsim.validate.launch``), each in its own network namespace
   joined by links shaped to ``rate_mbit``/``delay_ms`` (``trainsim.validate.netns``), or on loopback
   when no shaping is asked for or namespaces cannot be made;
2. for sizes from 1 KiB up to ``max_bytes`` (x4 apart) time all-reduces (each after a barrier,
   warm-up discarded): ``reps`` of them, then more until about ``budget_s`` of all-reduce time per
   size (at most ``MAX_REPS``), in ``ROUNDS`` interleaved rounds over the sizes (a load burst on the
   host then hits part of every size instead of all of a few), and keep the **mean** of each round
   and the median of the rounds' means (``round_mean``). A training step pays the sum of its
   collectives, so the mean is the statistic it sees. The median of the repetitions would hide the
   tail: on a 2-vCPU machine running 2 ranks, gloo's hand-off between its socket thread and its
   worker thread waits for a scheduler time slice in 10-40 % of small all-reduces (about 4 ms instead
   of 0.3-0.5 ms), and the median of a few repetitions landed on either mode. The median over the
   rounds drops a round that a burst of outside load slowed as a whole;
3. fit ``t(S) = a + max(floor + b0 (S - c), b S)``, ``c = floor / b``, minimising the *relative*
   squared error (``fit_knee``: a slope ``b`` above the knee ``c``, a smaller one ``b0`` below it), and
   turn it into the ring model's constants: the time at 0 bytes is ``2(p-1) alpha`` and
   ``b = 2(p-1)/p / bandwidth`` (``collectives.ring_allreduce_us``);
4. above the knee, for sizes of 20 ms or more, where the times repeat within 1-2 % from run to run,
   keep what the form misses as a ratio per calibrated size (``residual_ratios``), interpolated
   between sizes by ``Calibration.predict_us``; with several launches, also around the knee, where
   the launches after the first measure sizes a sixteenth of an octave apart (``knee_sizes``); with
   ``floor_launches``, further launches of the sizes on the latency floor (under ``FLOOR_MAX_US``)
   make their medians steady enough to keep as measured too; they also measure sizes inside the
   steepest steps among the knee sizes, in turns that narrow each step's gap (``step_sizes``,
   ``STEP_LEVELS``); with ``big_launches``, further launches of the sizes above ``LAUNCH_MAX_BYTES``,
   spread among the others, so that the large sizes' ratios are medians over launches minutes
   apart too (a shaped link's rate drifts by ~5 % with the host's load from one minute to the next).

With ``p2p_sizes`` it also times point-to-point sends (one way and both ways at once), the
parameter-server primitives, and the wall time of *posting* a send or a receive between pauses and
between computations (``_post_pass``, ``Calibration.busy_post_us``): on a host whose cores all
compute, a post now and then waits for gloo's network thread, itself waiting for a core.

The returned ``Calibration`` holds the measured points, the fit and a catalog-style ``Link`` whose
predictions are what the what-ifs and ``validate dp`` use.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np

from trainsim.cluster.catalog import Link
from trainsim.errors import UserError

Launched = tuple[list[int], list[str]]  # a launch of some sizes: those sizes, and its ranks' outputs


@dataclass(frozen=True, kw_only=True, slots=True)
class Calibration:
    """Measured all-reduce times and the fitted ring model."""

    world: int
    """ranks"""
    rate_mbit: float | None
    """shaped link rate (None: unshaped loopback / namespace link)"""
    delay_ms: float
    """added one-way latency"""
    sizes_bytes: list[int]
    measured_us: list[float]
    """all-reduce time per size: the median of its rounds' means (``round_mean``)"""
    a_us: float
    """fitted fixed cost per all-reduce"""
    b_us_per_byte: float
    """fitted cost per byte of the tensor"""
    floor_us: float = 0.0
    """fitted latency floor that large transfers hide: t = a + max(floor + b0 (size - c), b * size),
    ``c = floor / b`` (``fit_knee``)"""
    b0_us_per_byte: float = 0.0
    """cost per byte below the knee ``c`` (0: a flat floor)"""
    link: Link
    """the equivalent ring-model link (alpha, bandwidth)"""
    where: str = "netns"
    """'netns' or 'loopback'"""
    notes: list[str] = field(default_factory=list)
    cpu_allreduce_us: list[float] = field(default_factory=list)
    """host CPU time per all-reduce per rank, per size measured (sizes too slow for a pass left out)"""
    cpu_p2p_us: list[float] = field(default_factory=list)
    """host CPU time per rank for one send plus one receive of each size"""
    cpu_sizes_bytes: list[int] = field(default_factory=list)
    """the sizes of the two lists above"""
    busy_slowdown: list[float] = field(default_factory=list)
    """all-reduce time while every rank computes / time on idle ranks, per size of ``cpu_sizes_bytes``"""
    stolen_us: list[float] = field(default_factory=list)
    """computation lost per all-reduce per rank while every rank computes, per size of
    ``cpu_sizes_bytes`` (empty: not measured): see ``cpu_us``"""
    allgather_sizes_bytes: list[int] = field(default_factory=list)
    """per-rank input sizes at which the all-gather was timed (none: not measured)"""
    allgather_measured_us: list[float] = field(default_factory=list)
    """mean all-gather time per size of ``allgather_sizes_bytes``"""
    allgather_fit: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """``(a_us, b_us_per_byte, floor_us)`` of ``t = a + max(floor, b * S)`` for the all-gather, S per rank"""
    p2p_sizes_bytes: list[int] = field(default_factory=list)
    """sizes at which point-to-point transfers were timed (none: not measured)"""
    p2p_oneway_us: list[float] = field(default_factory=list)
    """mean time of one send from rank 0 to rank 1 (the other ranks idle), per size"""
    p2p_exchange_us: list[float] = field(default_factory=list)
    """mean time of a simultaneous exchange (every rank sends S to and receives S from its pair), per size"""
    gather_us: list[float] = field(default_factory=list)
    """mean time of ``dist.gather`` of S bytes per rank to rank 0, per size of ``p2p_sizes_bytes``"""
    broadcast_us: list[float] = field(default_factory=list)
    """mean time of ``dist.broadcast`` of S bytes from rank 0, per size of ``p2p_sizes_bytes``"""
    post_idle_us: list[float] = field(default_factory=list)
    """mean wall time of posting one send or one receive between pauses of every rank, per size of
    ``p2p_sizes_bytes`` (``_post_pass``)"""
    post_busy_us: list[float] = field(default_factory=list)
    """the same with every rank computing between its posts, as in a pipeline's steps"""
    residual_sizes_bytes: list[int] = field(default_factory=list)
    """sizes at which ``residual_ratio`` corrects the fitted form (``residual_ratios``; none: the fit alone)"""
    residual_ratio: list[float] = field(default_factory=list)
    """measured / fitted time at each of ``residual_sizes_bytes`` (1 below the bandwidth regime)"""
    knee_sizes_bytes: list[int] = field(default_factory=list)
    """sizes added around the knee of the first launch's fit and measured in the further launches
    (``knee_sizes``); not in the fit, only in ``residual_ratios``"""
    knee_measured_us: list[float] = field(default_factory=list)
    """all-reduce time at each of ``knee_sizes_bytes``: the median of the further launches"""
    floor_launches: int = 0
    """launches, beyond ``launches``, that measured only the sizes on the latency floor (``FLOOR_MAX_US``);
    with any, those sizes' medians are over every launch and each gets its measured ratio"""
    step_sizes_bytes: list[int] = field(default_factory=list)
    """sizes that split the steepest steps among the knee sizes (``step_sizes``), measured in the
    floor launches (also in ``knee_sizes_bytes``, with their medians in ``knee_measured_us``)"""
    big_launches: int = 0
    """launches, beyond ``launches``, that measured only the sizes above ``LAUNCH_MAX_BYTES``; with
    any, those sizes' times are medians over the first launch and these"""

    def slowdown(self, size_bytes: float) -> float:
        """How much longer an all-reduce of ``size_bytes`` takes while the ranks compute (>= 1):
        interpolated in log size between the measured sizes, constant beyond them; 1 if unmeasured."""
        if not self.busy_slowdown:
            return 1.0
        x = np.log(np.maximum(np.asarray(self.cpu_sizes_bytes, float), 1.0))
        return float(np.interp(np.log(max(float(size_bytes), 1.0)), x, np.asarray(self.busy_slowdown, float)))

    def cpu_line(self, *, p2p: bool = False) -> tuple[float, float]:
        """``(c0 µs, c1 µs/byte)``: host CPU a rank spends on one all-reduce (or, ``p2p``, on one send
        or one receive) of S bytes is ``c0 + c1 S``, a linear fit of the CPU pass. Other work on that
        rank's cores loses this time while the transfer runs. ``(0, 0)`` when nothing was measured."""
        ys = self.cpu_p2p_us if p2p else self.cpu_allreduce_us
        half = 2.0 if p2p else 1.0  # the p2p pass timed a send and a receive together
        if len(ys) < 2:
            return (float(ys[0]) / half if ys else 0.0), 0.0
        c0, c1 = _nonneg_line(np.asarray(self.cpu_sizes_bytes, float), np.asarray(ys, float))
        return c0 / half, c1 / half

    def cpu_us(self, size_bytes: float, *, p2p: bool = False) -> float:
        """Host CPU of one all-reduce (or, ``p2p``, one send or receive) of ``size_bytes``: the
        process-CPU line (``cpu_line``), what the contention model takes from overlapping computation."""
        c0, c1 = self.cpu_line(p2p=p2p)
        return c0 + c1 * float(size_bytes)

    def lost_us(self, size_bytes: float) -> float:
        """Computation one all-reduce of ``size_bytes`` took away from ranks that computed meanwhile
        (``stolen_us``): linear between the measured sizes, proportional to the size beyond the largest;
        ``cpu_us`` when not measured. Shown by ``trainsim calibrate``; not used by the predictions (see
        docs/cluster.md: with it in place of ``cpu_us`` the data-parallel validation was no better)."""
        if len(self.stolen_us) < 2 or len(self.stolen_us) != len(self.cpu_sizes_bytes):
            return self.cpu_us(size_bytes)
        x = np.asarray(self.cpu_sizes_bytes, float)
        y = np.asarray(self.stolen_us, float)
        s = float(size_bytes)
        return float(y[-1] * s / x[-1]) if s > x[-1] else float(np.interp(s, x, y))

    def predict_us(self, size_bytes: float) -> float:
        """All-reduce time of ``size_bytes``: the fitted form (``knee_us``) times the measured residual
        ratio at that size (``residual_ratios``: interpolated in log size between the calibrated
        sizes, the end ratios held beyond them; 1 where not calibrated)."""
        return self.fit_us(size_bytes) * self.residual(size_bytes)

    def fit_us(self, size_bytes: float) -> float:
        """The fitted form alone (``knee_us`` with this calibration's constants)."""
        return float(knee_us(size_bytes, self.a_us, self.b_us_per_byte, self.floor_us, self.b0_us_per_byte))

    def residual(self, size_bytes: float) -> float:
        """The residual ratio ``predict_us / fit_us`` at ``size_bytes`` (see ``residual_ratios``)."""
        if not self.residual_ratio:
            return 1.0
        x = np.log(np.asarray(self.residual_sizes_bytes, float))
        return float(np.interp(np.log(max(float(size_bytes), 1.0)), x, np.asarray(self.residual_ratio, float)))

    def p2p_line(self) -> tuple[float, float]:
        """``(latency_us, us_per_byte)`` of one point-to-point transfer, a relative least-squares line
        through the one-way times; from the all-reduce's ring model when not measured."""
        if len(self.p2p_oneway_us) >= 2:
            return _nonneg_line(np.asarray(self.p2p_sizes_bytes, float), np.asarray(self.p2p_oneway_us, float))
        return self.link.latency_us, 1.0 / self.link.bytes_per_us

    def busy_post_us(self) -> float:
        """Wall time that posting one send or receive costs a rank whose host is busy beyond what it
        costs on an idle one (µs, >= 0; 0 when not measured): the mean over the sizes of
        ``post_busy_us - post_idle_us``. The rank's thread is stuck in the call for that time, neither
        computing nor letting its own work go on. On a host whose cores all compute, a post now and
        then waits for gloo's network thread, itself waiting for a core: on the 2-vCPU VM a receive
        posted while the peer's send was pending took 0.06-0.07 ms with both ranks pausing between
        posts, and on average 0.3-0.7 ms (median 0.1, at most 6) with both computing (2026-11-24)."""
        pairs = list(zip(self.post_busy_us, self.post_idle_us, strict=False))
        if not pairs:
            return 0.0
        return max(0.0, statistics.fmean(b - i for b, i in pairs))

    def ps_lines(self) -> tuple[tuple[float, float], tuple[float, float]]:
        """``((latency_us, us_per_byte) of a gather, (...) of a broadcast)`` of S bytes per rank: the
        parameter-server primitives, fitted like ``p2p_line`` (each falls back to it when not measured).
        On gloo they cost more than one send: at 100 Mbit/s a 128 KiB gather or broadcast measured ~20 %
        above a one-way send of the same bytes."""
        sizes = np.asarray(self.p2p_sizes_bytes, float)

        def line(ys: list[float]) -> tuple[float, float]:
            ok = len(ys) >= 2 and len(ys) == sizes.size
            return _nonneg_line(sizes, np.asarray(ys, float)) if ok else self.p2p_line()

        return line(self.gather_us), line(self.broadcast_us)

    def duplex_factor(self) -> float:
        """How much longer a transfer takes when the link carries one the other way at the same time:
        exchange / one-way time, averaged over the sizes of at least 256 KiB (in [1, 2]; 1 if not
        measured). 1 is a full-duplex link, 2 one whose directions share one capacity. gloo on a shaped
        full-duplex link lands in between: in a share of the exchanges its "ready" message for the
        peer's send queues behind the rank's own payload (docs/cluster.md); at least
        ``P2P_MIN_REPS`` of each, since single exchanges take either about 1x or 2x."""
        pairs = [(e, o) for s, e, o in zip(self.p2p_sizes_bytes, self.p2p_exchange_us, self.p2p_oneway_us, strict=False)
                 if s >= 256 << 10 and o > 0]  # fmt: skip
        if not pairs:
            return 1.0
        return float(min(2.0, max(1.0, statistics.fmean(e / o for e, o in pairs))))

    def allgather_us(self, size_bytes: float) -> float:
        """Time of an all-gather of ``size_bytes`` per rank (``casync.all_gather_bytes``): where it was
        measured, linear between the measured sizes (beyond the largest, on the last two points'
        slope; below the smallest, the fitted line), else the ring model of the calibrated link. Not
        one line through all sizes: gloo's own all-gather, timed here until 2026-11-24, cost more per
        byte the larger it was, and a line fitted from 1 KiB to 256 KiB at 20 Mbit/s was 12 % low at
        256 KiB (docs/cluster.md)."""
        a, b, floor = self.allgather_fit
        if self.allgather_measured_us:
            x = np.asarray(self.allgather_sizes_bytes, float)
            y = np.asarray(self.allgather_measured_us, float)
            s = float(size_bytes)
            if s < x[0] or x.size < 2:
                return a + max(floor, b * s)
            if s > x[-1]:
                return float(y[-1] + (s - x[-1]) * max(0.0, (y[-1] - y[-2]) / (x[-1] - x[-2])))
            return float(np.interp(s, x, y))
        from trainsim.cluster.collectives import allgather_us

        return allgather_us(self.world * float(size_bytes), self.world, self.link)

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["link"] = asdict(self.link)
        d["predicted_us"] = [self.predict_us(s) for s in self.sizes_bytes]
        return d

    @staticmethod
    def from_json(d: dict[str, object]) -> Calibration:
        link_d = dict(d["link"])  # type: ignore[call-overload]
        kw = {k: v for k, v in d.items() if k not in ("link", "predicted_us")}
        if "allgather_fit" in kw:
            kw["allgather_fit"] = tuple(kw["allgather_fit"])  # type: ignore[arg-type]
        return Calibration(link=Link(**link_d), **kw)  # type: ignore[arg-type]


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


def _nonneg_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """``y ~ c0 + c1 x`` by relative least squares, both coefficients clipped at 0."""
    w = 1.0 / np.maximum(y, 1e-9)
    (c0, c1), *_ = np.linalg.lstsq(np.stack([w, x * w], axis=1), np.ones_like(y), rcond=None)
    return max(float(c0), 0.0), max(float(c1), 0.0)


def fit_alpha_beta(sizes: np.ndarray, times_us: np.ndarray, world: int) -> tuple[float, float, Link]:
    """Least squares on relative error of ``t = a + b S``; also the equivalent ring ``Link``."""
    a, b, floor = fit_model(sizes, times_us, with_floor=False)
    return a, b, _ring_link(a + floor, b, world)


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
    return _fit_knee_kept(sizes, times_us, below_slope=below_slope, knee=knee)[0]


def _fit_knee_kept(
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


def _ring_link(small_us: float, b: float, world: int) -> Link:
    steps = 2 * (world - 1)
    alpha = small_us / steps if steps else 0.0
    bytes_per_us = steps / world / b if steps else 1e12
    return Link(name="calibrated", bw_gbps=bytes_per_us / 1e3, latency_us=alpha, source="trainsim calibrate")


def default_sizes(max_bytes: int, min_bytes: int = 1024, factor: int = 4) -> list[int]:
    """Sizes from ``min_bytes`` up to ``max_bytes``, ``factor`` apart."""
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s *= factor
    return sizes


ROUNDS = 5  # the all-reduce sizes are measured in this many interleaved rounds (``_worker``)
ROUNDS_PER_S = 20  # launches after the first with a time per size of their own: rounds per second of it


def calibrate(
    *,
    world: int = 2,
    rate_mbit: float | None = None,
    delay_ms: float = 0.0,
    max_bytes: int = 16 << 20,
    min_bytes: int = 1024,
    reps: int = 5,
    budget_s: float = 0.3,
    sizes: list[int] | None = None,
    timeout_s: float = 600.0,
    net: object | None = None,
    allgather_sizes: list[int] | None = None,
    p2p_sizes: list[int] | None = None,
    realtime: bool = False,
    pin: bool = False,
    launches: int = 1,
    small_budget_s: float | None = None,
    small_rounds: int | None = None,
    floor_launches: int = 0,
    big_launches: int = 0,
) -> Calibration:
    """Measure and fit (see the module docstring). ``net``: an open ``Netns`` to reuse;
    ``allgather_sizes``: per-rank sizes at which to time the hook's all-gather too
    (``trainsim.run.casync.all_gather_bytes``; >= 2 sizes);
    ``p2p_sizes``: sizes at which to time one-way sends and simultaneous exchanges (>= 2 sizes, an even
    number of ranks); ``realtime``: run every thread of the ranks in the real-time class (see
    ``_realtime``); the pass that measures interference with computation is skipped then;
    ``pin``: keep each rank's threads on one core of its own (rank modulo the cores; see ``_pin``);
    ``launches``: measure the all-reduces of up to ``LAUNCH_MAX_BYTES`` in this many launches of new
    processes and keep, per size, the median of the launches (where the ranks' threads land changes
    the sub-millisecond times from one launch to the next; the other measurements come from the
    first launch); ``small_budget_s``, ``small_rounds``: all-reduce time per size and rounds in each of
    those further launches (``calibrate_interleaved``); ``floor_launches``: that many launches more of
    the sizes on the latency floor only (their first launch under ``FLOOR_MAX_US``); ``big_launches``:
    that many launches more of the sizes above ``LAUNCH_MAX_BYTES``, spread among the further launches."""
    return calibrate_interleaved(
        [sizes or default_sizes(max_bytes, min_bytes)], world=world, rate_mbit=rate_mbit, delay_ms=delay_ms,
        reps=reps, budget_s=budget_s, timeout_s=timeout_s, net=net, allgather_sizes=allgather_sizes,
        p2p_sizes=p2p_sizes, realtime=realtime, pin=pin, launches=launches, small_budget_s=small_budget_s,
        small_rounds=small_rounds, floor_launches=floor_launches, big_launches=big_launches,
    )[0]  # fmt: skip


def calibrate_interleaved(
    size_sets: list[list[int]],
    *,
    world: int = 2,
    rate_mbit: float | None = None,
    delay_ms: float = 0.0,
    reps: int = 5,
    budget_s: float = 0.3,
    timeout_s: float = 600.0,
    net: object | None = None,
    allgather_sizes: list[int] | None = None,
    p2p_sizes: list[int] | None = None,
    realtime: bool = False,
    pin: bool = False,
    launches: int = 1,
    small_budget_s: float | None = None,
    small_rounds: int | None = None,
    knee: Sequence[bool] | None = None,
    floor_launches: int = 0,
    big_launches: int = 0,
) -> list[Calibration]:
    """Independent calibrations, one per list of ``size_sets`` (each its own processes, its own fit),
    whose launches take turns: each one's first launch, then the further launches of the small sizes
    (``launches``) in rounds of one per calibration. Two calibrations a few minutes apart differ by
    the host's drift as much as by their sampling (a sub-millisecond all-reduce moves by 10-15 %
    within seconds on this host); taking turns spreads both over the same minutes, so that one can
    check the other (``benchmarks/cluster_collectives.py``). ``small_budget_s`` (default ``budget_s``)
    and ``small_rounds`` (default ``ROUNDS``, or ``ROUNDS_PER_S`` per second of ``small_budget_s``, at
    least ``ROUNDS``): all-reduce time per size and rounds in each further launch: the time spent
    there counts more than the number of launches, for a sub-millisecond all-reduce on this host is
    slow or fast for a second or two at a time, within a launch as across launches. ``knee``: per
    size set, whether its further launches also measure ``knee_sizes`` (default: all; a run that only
    checks another's model needs none). ``floor_launches``: after those, this many launches more (taking
    turns the same way) of each calibration's sizes whose first launch read under ``FLOOR_MAX_US``: the
    latency floor, where a launch's level (+-7 %) is most of the noise of a median, and a launch of a
    few such sizes costs seconds. ``big_launches``: this many launches more (taking turns the same way)
    of each calibration's sizes above ``LAUNCH_MAX_BYTES``, spread evenly among the further launches
    (``_spread``), so that the fit's and the check's large sizes are each the median of launches
    minutes apart: one launch of them may catch a slow stretch of the host (1 Gbit/s, 2026-11-27
    05:40: a 181 MiB check read 9.50 ms/MiB, the other large sizes 9.02-9.08). Other arguments as
    ``calibrate``."""
    from trainsim.validate.launch import launch
    from trainsim.validate.netns import Netns, NetnsUnavailable, netns_unavailable

    if world < 2:
        raise UserError(f"calibrate: world={world}; expected at least 2 processes")
    if reps < 1:
        raise UserError(f"calibrate: reps={reps}; expected >= 1")
    if not size_sets or any(not x or min(x) < 1 for x in size_sets):
        raise UserError(f"calibrate: sizes={size_sets}; expected sizes of >= 1 byte")
    if budget_s < 0:
        raise UserError(f"calibrate: budget_s={budget_s}; expected >= 0 seconds")
    if launches < 1:
        raise UserError(f"calibrate: launches={launches}; expected >= 1")
    if floor_launches < 0 or big_launches < 0:
        raise UserError(f"calibrate: floor_launches={floor_launches}, big_launches={big_launches}; expected >= 0")
    if knee is not None and len(knee) != len(size_sets):
        raise UserError(f"calibrate: knee={list(knee)} for {len(size_sets)} size sets; expected one flag per set")
    if (small_rounds is not None and small_rounds < 1) or (small_budget_s is not None and small_budget_s < 0):
        raise UserError(f"calibrate: small_rounds={small_rounds}, small_budget_s={small_budget_s}; expected "
                        ">= 1 round and >= 0 seconds")  # fmt: skip
    ag_sizes = sorted(set(allgather_sizes or []))
    if len(ag_sizes) == 1 or any(x < 4 for x in ag_sizes):
        raise UserError(f"calibrate: allgather_sizes={ag_sizes}; expected at least two sizes of >= 4 bytes")
    pp_sizes = sorted(set(p2p_sizes or []))
    if len(pp_sizes) == 1 or any(x < 4 for x in pp_sizes) or (pp_sizes and world % 2):
        raise UserError(f"calibrate: p2p_sizes={pp_sizes} with {world} ranks; expected at least two sizes of "
                        ">= 4 bytes and an even number of ranks")  # fmt: skip
    mode = ("realtime" if realtime else "default") + ("+pin" if pin else "")
    small_budget = budget_s if small_budget_s is None else small_budget_s
    if small_rounds is None:
        small_rounds = ROUNDS if small_budget_s is None else max(ROUNDS, round(ROUNDS_PER_S * small_budget_s))
    runs = []  # per calibration: (sizes, the first launch's arguments, the small sizes, their arguments)
    for sizes in size_sets:
        args = ["-m", "trainsim.cluster.calibrate", "--worker", ",".join(map(str, sizes)), str(reps), str(budget_s),
                ",".join(map(str, ag_sizes)) or "-", ",".join(map(str, pp_sizes)) or "-", mode]  # fmt: skip
        small = [x for x in sizes if x <= LAUNCH_MAX_BYTES] if launches > 1 else []
        # the further launches: one repetition per round at least (their budget sets the count): at
        # +5 ms a round's five repetitions, each after a barrier, took 8 s per size where 1 s was asked
        runs.append((list(sizes), args, small, [*args[:3], ",".join(map(str, small)), "1", str(small_budget), "-",
                                                 "-", mode, str(small_rounds)]))  # fmt: skip

    def go(n: Any) -> list[tuple[list[str], list[list[str]], list[Launched], list[Launched]]]:
        """Per calibration: its first launch, its further launches, its floor launches (each with
        its sizes: the floor sizes and the step sizes found so far) and its launches of the large sizes."""
        firsts = [launch(world, args, net=n, timeout_s=timeout_s) for _, args, _, _ in runs]
        meds = [_launch_means(f) for f in firsts]
        window: list[tuple[float, float, float] | None] = [None for _ in runs]  # (lo, hi, b) around the knee
        if launches > 1:  # the further launches also measure sizes around the first launch's knee
            for i, ((sizes, args, small, small_args), med) in enumerate(zip(runs, meds, strict=True)):
                if knee is not None and not knee[i]:
                    continue
                fit, _ = _fit_knee_kept(np.array(sizes, dtype=float), np.array(med))
                extra = [x for x in knee_sizes(fit, min(sizes), LAUNCH_MAX_BYTES) if x not in sizes]
                c = None if extra else measured_knee(sizes, med, fit[1])
                if c is not None:  # the fit placed none where the times bend (``measured_knee``)
                    extra = [x for x in sizes_around(c, min(sizes), LAUNCH_MAX_BYTES) if x not in sizes]
                centre = c if c is not None else (fit[2] / fit[1] if fit[1] > 0 else 0.0)
                if extra and centre > 0:
                    window[i] = (KNEE_WINDOW[0] * centre, KNEE_WINDOW[1] * centre, fit[1])
                if extra:
                    small = sorted(small + extra)
                    runs[i] = (sizes, args, small, [*small_args[:3], ",".join(map(str, small)), *small_args[4:]])
        more: list[list[list[str]]] = [[] for _ in runs]
        big_more: list[list[Launched]] = [[] for _ in runs]
        bigs = [[x for x in sizes if x > LAUNCH_MAX_BYTES] for sizes, _, _, _ in runs]
        big_args = [[*args[:3], ",".join(map(str, big)), *args[4:6], "-", "-", mode]
                    for big, (_, args, _, _) in zip(bigs, runs, strict=True)]  # fmt: skip
        big_at = _spread(big_launches, launches - 1)
        for r in range(launches):
            for _ in range(big_at.count(r)):  # the launches of the sizes above LAUNCH_MAX_BYTES due here
                for i, (big, ba) in enumerate(zip(bigs, big_args, strict=True)):
                    if big:
                        big_more[i].append((big, launch(world, ba, net=n, timeout_s=timeout_s)))
            if r == launches - 1:
                break
            for i, (_, _, small, small_args) in enumerate(runs):
                if small:
                    more[i].append(launch(world, small_args, net=n, timeout_s=timeout_s))
        floors = [[x for x, m in zip(sizes, med, strict=True) if x <= LAUNCH_MAX_BYTES and m < FLOOR_MAX_US]
                  if floor_launches else [] for (sizes, _, _, _), med in zip(runs, meds, strict=True)]  # fmt: skip
        # per calibration, each floor launch as (its sizes, its output): the floor launches come in
        # ``STEP_LEVELS`` turns, and before each turn the steepest steps among the knee sizes measured so
        # far are split again (``step_sizes``), so that each turn narrows the gap that holds a step
        floor_more: list[list[Launched]] = [[] for _ in runs]
        for count in _level_counts(floor_launches, STEP_LEVELS):
            for i, ((sizes, _, small, _), med, win) in enumerate(zip(runs, meds, window, strict=True)):
                if win is not None and more[i]:
                    by_size = _launch_times(sizes, med, small, more[i], floor_more[i])
                    pts = [(x, float(statistics.median(t))) for x, t in sorted(by_size.items())]
                    steps = step_sizes([x for x, _ in pts], [t for _, t in pts], win[2], win[0], win[1])
                    floors[i] = sorted(set(floors[i]) | set(steps))
            for _ in range(count):
                for i, ((_, _, _, small_args), fl) in enumerate(zip(runs, floors, strict=True)):
                    if fl:
                        fa = [*small_args[:3], ",".join(map(str, fl)), *small_args[4:]]
                        floor_more[i].append((list(fl), launch(world, fa, net=n, timeout_s=timeout_s)))
        return list(zip(firsts, more, floor_more, big_more, strict=True))

    notes: list[str] = []
    if isinstance(net, Netns):
        outs = go(net)
        where = "netns"
    else:
        reason = netns_unavailable()
        if reason is None:
            try:
                with Netns(world, rate_mbit=rate_mbit, delay_ms=delay_ms) as n:
                    outs = go(n)
                where = "netns"
            except NetnsUnavailable as exc:
                reason = str(exc)
        if reason is not None:
            if rate_mbit is not None or delay_ms > 0:
                notes.append(f"no network namespaces ({reason}): measured on unshaped loopback instead")
            outs = go(None)
            where = "loopback"
    return [
        _built(sizes, small, first, more, world=world, rate_mbit=rate_mbit, delay_ms=delay_ms, where=where,
               notes=list(notes), ag_sizes=ag_sizes, pp_sizes=pp_sizes, realtime=realtime, pin=pin,
               floor_runs=fm, big_runs=bm)
        for (sizes, _, small, _), (first, more, fm, bm) in zip(runs, outs, strict=True)
    ]  # fmt: skip


def _built(
    sizes: list[int], small: list[int], first: list[str], more: list[list[str]], *, world: int,
    rate_mbit: float | None, delay_ms: float, where: str, notes: list[str], ag_sizes: list[int],
    pp_sizes: list[int], realtime: bool, pin: bool, floor_runs: Sequence[Launched] = (),
    big_runs: Sequence[Launched] = (),
) -> Calibration:  # fmt: skip
    """One ``Calibration`` from its workers' outputs: the first launch ``first``, the further
    launches ``more`` of the ``small`` sizes, ``floor_runs``: the floor launches, each as (its sizes,
    its output), whose sizes not among ``sizes`` are the ``step_sizes``, and ``big_runs``: the launches
    of the sizes above ``LAUNCH_MAX_BYTES``, the same way."""
    data = json.loads(first[0].strip().splitlines()[-1])
    if pin and not data.get("pinned"):
        notes.append(f"pinning the ranks to cores refused ({data.get('pin_error')}): threads were not pinned")
    if realtime and not data.get("realtime"):
        notes.append(f"real-time scheduling refused ({data.get('sched_error')}): measured with the default scheduler")
    med = [round_mean(r) for r in data["rounds_us"]]
    knee_s: list[int] = []
    knee_t: list[float] = []
    fl_sizes = sorted({x for fl, _ in floor_runs for x in fl})
    if more or floor_runs or big_runs:  # per size measured again: the median over the launches
        by_size = _launch_times([], [], small, more, [*floor_runs, *big_runs])
        med = [float(statistics.median([m, *by_size[s]])) if s in by_size else m
               for s, m in zip(sizes, med, strict=True)]  # fmt: skip
        # ``knee_sizes``, measured in the further launches only, and ``step_sizes``, in the floor launches only
        knee_s = sorted({s for s in (*small, *fl_sizes) if s not in sizes and by_size.get(s)})
        knee_t = [float(statistics.median(by_size[s])) for s in knee_s]
    (a, b, floor, b0), kept = _fit_knee_kept(np.array(sizes), np.array(med))
    res_sizes, res_ratio = residual_ratios(np.array(sizes), np.array(med), (a, b, floor, b0), kept,
                                           (knee_s, knee_t), measured_floor=bool(floor_runs))  # fmt: skip
    cpu = [(s, c) for s, c in zip(sizes, data.get("cpu_us", []), strict=False) if len(c) >= 4]
    ag = [float(statistics.fmean(x)) for x in data.get("allgather_us", [])]
    ag_fit = fit_model(np.array(ag_sizes), np.array(ag)) if ag else (0.0, 0.0, 0.0)
    p2p = [(float(statistics.fmean(o)), float(statistics.fmean(e))) for o, e in data.get("p2p_us", [])]
    ps = [(float(statistics.fmean(g)), float(statistics.fmean(b))) for g, b in data.get("ps_us", [])]
    posts = [(float(i), float(b)) for i, b in data.get("post_us", [])]
    return Calibration(
        world=world, rate_mbit=rate_mbit, delay_ms=delay_ms, sizes_bytes=list(sizes), measured_us=med,
        a_us=a, b_us_per_byte=b, floor_us=floor, b0_us_per_byte=b0, where=where, notes=notes,
        link=_ring_link(max(float(knee_us(0.0, a, b, floor, b0)), 0.0), b, world),
        cpu_allreduce_us=[c[0] for _, c in cpu], cpu_p2p_us=[c[1] for _, c in cpu],
        cpu_sizes_bytes=[s for s, _ in cpu], busy_slowdown=[max(1.0, c[3] / c[2]) for _, c in cpu],
        stolen_us=[c[4] for _, c in cpu] if all(len(c) >= 5 for _, c in cpu) else [],
        allgather_sizes_bytes=ag_sizes if ag else [], allgather_measured_us=ag, allgather_fit=ag_fit,
        p2p_sizes_bytes=pp_sizes if p2p else [], p2p_oneway_us=[o for o, _ in p2p],
        p2p_exchange_us=[e for _, e in p2p], gather_us=[g for g, _ in ps], broadcast_us=[b for _, b in ps],
        post_idle_us=[i for i, _ in posts], post_busy_us=[b for _, b in posts],
        residual_sizes_bytes=res_sizes, residual_ratio=res_ratio, knee_sizes_bytes=knee_s,
        knee_measured_us=knee_t, floor_launches=len(floor_runs), step_sizes_bytes=sorted(s for s in fl_sizes if s not in sizes),
        big_launches=len(big_runs),
    )  # fmt: skip


def _launch_times(
    sizes: list[int], first_med: list[float], small: list[int], more: list[list[str]],
    floor_runs: Sequence[Launched] = (),
) -> dict[int, list[float]]:  # fmt: skip
    """Per size: the first launch's time (``sizes``, ``first_med``) where it measured it, then each
    further launch's (``more``, of the ``small`` sizes) and each launch of ``floor_runs`` (its sizes and
    its output: the floor launches, and in ``_built`` the big launches too)."""
    by_size: dict[int, list[float]] = {s: [m] for s, m in zip(sizes, first_med, strict=True)}
    for which, o in [*((small, o) for o in more), *floor_runs]:
        for s, m in zip(which, _launch_means(o), strict=True):
            by_size.setdefault(s, []).append(m)
    return by_size


def _spread(n: int, rounds: int) -> list[int]:
    """Before which of ``rounds`` rounds (0 .. ``rounds``; ``rounds``: after the last) each of ``n``
    launches goes, as evenly spaced among them as whole rounds allow."""
    return [round((j + 1) * rounds / (n + 1)) for j in range(n)]


def _level_counts(n: int, levels: int) -> list[int]:
    """``n`` launches in at most ``levels`` turns as even as they go, the larger turns first (none for 0)."""
    k = min(n, levels)
    return [n // k + (1 if j < n % k else 0) for j in range(k)] if k else []


def _launch_means(out: list[str]) -> list[float]:
    """Per size of a launch's output (rank 0's stdout first): its time, ``round_mean`` of its rounds."""
    return [round_mean(r) for r in json.loads(out[0].strip().splitlines()[-1])["rounds_us"]]


# --------------------------------------------------------------------------- worker (one per rank)
LAUNCH_MAX_BYTES = 256 << 10  # sizes measured in every launch when ``calibrate(launches=...)`` > 1
FLOOR_MAX_US = 1000.0  # ``floor_launches`` measure the sizes whose first launch read under this
MAX_REPS = 2000  # sub-millisecond sizes: enough repetitions to fill the budget (0.3 s)
ROUND_MAX_S = 0.05  # sizes whose all-reduce takes longer: ``reps`` in all, spread over the rounds
CPU_PASS_MAX_S = 2.0  # sizes whose all-reduce takes longer get no CPU pass (the fit extrapolates)
P2P_MIN_REPS = 10
"""repetitions of the one-way send and of the exchange both ways at once, at least (``duplex_factor``).
On a shaped link the exchange is bimodal (gloo's "ready" message for the peer's send queues behind
the rank's own payload in a share of the calls, docs/cluster.md): at 20 Mbit/s ten exchanges of
256 KiB took 218 ms six times, twice the one-way 109 ms (all ten one-way sends within 1 ms of it),
and 118-180 ms four times (2026-11-26). With the 3-5 that the time budget gave at 20 Mbit/s, the
factor read 1.59-2.00 in six calibrations of one morning, and the SeCoPa plan, whose two owners
exchange at once, was predicted -6.7 % with 1.66 and +13.4 % with 2.00."""
ALONE_S = 0.2  # windows of computation alone around the all-reduces of the CPU pass


def _cpu_pass(x: Any, n: int) -> list[float]:
    """Per operation, averaged over the ranks, in µs: ``[host CPU per all-reduce, host CPU per send +
    receive, wall time per all-reduce, wall time per all-reduce while every rank computes, computation
    lost per all-reduce]``.

    Back-to-back operations with no barrier; ``time.process_time`` counts every thread of the process
    (gloo's too; waiting for the peer costs nothing). The last figure runs the same all-reduces while a
    second thread on every rank multiplies matrices without pause, as a training step's computation
    would: on a host whose cores are all busy, gloo's threads wait for the scheduler and transfers
    slow down. The compute thread counts its iterations: their rate during the all-reduces against the
    rate in windows of ``ALONE_S`` before and after them (every rank computing, nothing sent) gives the
    computation the transfers took away, however the host spent it (gloo's threads, the kernel's
    network stack, interrupts). Empty when the all-reduce is too slow for a pass.
    """
    import threading

    import torch
    import torch.distributed as dist

    n = max(0, min(100, n))
    flag = torch.tensor([n], dtype=torch.int64)
    dist.broadcast(flag, 0)
    n = int(flag.item())
    if n < 2:
        return []
    world = dist.get_world_size()
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        dist.all_reduce(x)
    w1, c1 = time.perf_counter(), time.process_time()
    if world % 2 == 0:  # pairs (0,1), (2,3) ...: each rank sends n and receives n messages
        y = torch.empty_like(x)
        for _ in range(n):
            _p2p_ops(x, y, exchange=True)
    c2 = time.process_time()
    stop = threading.Event()
    done = [0]  # iterations of the compute thread

    def compute() -> None:
        a = torch.randn(256, 256)
        while not stop.is_set():
            a = torch.mm(a, a).clamp_(-1.0, 1.0)
            done[0] += 1

    def alone_rate() -> float:
        dist.barrier()
        k, t = done[0], time.perf_counter()
        time.sleep(ALONE_S)
        return (done[0] - k) / (time.perf_counter() - t)

    th = threading.Thread(target=compute, daemon=True)
    th.start()
    before = alone_rate()
    dist.barrier()
    k2, w2 = done[0], time.perf_counter()
    for _ in range(n):
        dist.all_reduce(x)
    k3, w3 = done[0], time.perf_counter()
    after = alone_rate()
    stop.set()
    th.join()
    busy_rate = (k3 - k2) / (w3 - w2)
    lost = max(0.0, 1.0 - busy_rate / max(0.5 * (before + after), 1e-9)) * (w3 - w2) / n * 1e6
    per = torch.tensor([(c1 - c0) / n * 1e6, (c2 - c1) / n * 1e6, (w1 - w0) / n * 1e6, (w3 - w2) / n * 1e6,
                        lost], dtype=torch.float64)  # fmt: skip
    dist.all_reduce(per)
    return (per / world).tolist()


def _timed(op: Callable[[], Any], n: int) -> list[float]:
    """``n`` runs of the collective ``op``, each after a barrier; their times in µs."""
    import torch.distributed as dist

    times = []
    for _ in range(n):
        dist.barrier()
        t0 = time.perf_counter()
        op()
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def round_plan(warm_us: Sequence[float], reps: int, n_rounds: int) -> list[list[int | None]]:
    """Per round, per size: how the worker measures it; None: ``reps`` and more up to the round's
    share of the time budget (``_measure``), for sizes whose warm-up all-reduce took under
    ``ROUND_MAX_S``; a count: that many repetitions, the slower sizes' ``reps`` spread over the rounds
    (0: none left for this round)."""
    per_round = -(-reps // n_rounds)
    return [[None if w < ROUND_MAX_S * 1e6 else max(0, min(per_round, reps - k * per_round)) for w in warm_us]
            for k in range(n_rounds)]  # fmt: skip


def _slowest(times: list[float]) -> list[float]:
    """Per repetition, the slowest rank's time (every rank passes its own, in the same order)."""
    import torch
    import torch.distributed as dist

    tt = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    return list(tt.tolist())


def _measure(op: Callable[[], Any], reps: int, budget_s: float) -> list[float]:
    """Times (µs) of ``op`` after a warm-up: ``reps`` runs, then more up to ``budget_s`` of them (at
    most ``MAX_REPS``, from the slowest rank's mean), and the slowest rank's time counts for each."""
    import torch
    import torch.distributed as dist

    op()  # warm-up: connections, buffers
    times = _timed(op, reps)
    # every rank must run the same number of collectives: the slowest rank's mean decides (a broadcast's
    # root, or a sender, returns as soon as its data is handed to the socket)
    mean = torch.tensor([statistics.fmean(times)], dtype=torch.float64)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    more = torch.tensor([min(MAX_REPS - reps, int(budget_s * 1e6 / max(float(mean.item()), 1.0)))])
    dist.broadcast(more, 0)
    times += _timed(op, max(0, int(more.item())))
    return _slowest(times)


POST_REPS = 40  # posts of each kind per pass of ``_post_pass``
POST_GAP_S = 0.002  # the pause or computation before each post


def _post_pass(x: Any, y: Any, *, compute: bool) -> float:
    """Mean wall time (µs, averaged over the ranks) of posting one send or one receive as torch's
    pipeline runtime posts them (``batch_isend_irecv`` with one operation), each post after
    ``POST_GAP_S`` in which every rank either sleeps or, with ``compute``, multiplies matrices on the
    same thread, as a pipeline stage computes between its transfers. Every rank sends ``x`` to its pair
    and then receives ``y`` from it, so the receive is posted after the peer's send."""
    import torch
    import torch.distributed as dist

    peer = _peer()
    a = torch.randn(192, 192)

    def gap() -> None:
        nonlocal a
        if not compute:
            time.sleep(POST_GAP_S)
            return
        t = time.perf_counter()
        while time.perf_counter() - t < POST_GAP_S:
            a = torch.mm(a, a).clamp_(-1.0, 1.0)

    dist.barrier()
    took, sends = 0.0, []
    for _ in range(POST_REPS):
        gap()
        t0 = time.perf_counter()
        sends += dist.batch_isend_irecv([dist.P2POp(dist.isend, x, peer)])
        took += time.perf_counter() - t0
        gap()
        t0 = time.perf_counter()
        recvs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, y, peer)])
        took += time.perf_counter() - t0
        for work in recvs:
            work.wait()
    for work in sends:
        work.wait()
    mean = torch.tensor([took / (2 * POST_REPS) * 1e6], dtype=torch.float64)
    dist.all_reduce(mean)
    return float(mean.item()) / dist.get_world_size()


def _peer() -> int:
    """This rank's partner in the pairs (0,1), (2,3) ... of the point-to-point passes."""
    import torch.distributed as dist

    rank = dist.get_rank()
    return rank + 1 if rank % 2 == 0 else rank - 1


def _gather_wait(gather: Callable[..., Any], out: Any, x: Any) -> None:
    gather(out, x, None).wait()


def _p2p_ops(x: Any, y: Any, *, exchange: bool) -> None:
    """One transfer of ``x`` between each pair (0,1), (2,3) ...: from the even rank to the odd one, or,
    with ``exchange``, both ways at once (batched isend + irecv, as torch's pipeline runtime posts them)."""
    import torch.distributed as dist

    rank, peer = dist.get_rank(), _peer()
    if exchange:
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, y, peer)]):
            work.wait()
    elif rank % 2 == 0:
        dist.send(x, peer)
    else:
        dist.recv(y, peer)


def _realtime() -> str | None:
    """Put this process's thread in the real-time FIFO class (priority 1) before gloo starts its threads,
    which inherit it; ``None`` on success, else why not (it needs CAP_SYS_NICE).

    Why: emulated ranks share this machine's cores. Under the default scheduler a gloo thread woken by
    an arriving message may queue behind another rank's thread until the next scheduler tick (4 ms at
    250 Hz), so 10-40 % of sub-millisecond all-reduces take ~4 ms (docs/cluster.md). Real ranks on
    separate machines do not queue behind each other; FIFO threads are placed on an idle core at
    once. Only for runs that do nothing but communicate: a FIFO thread that computes would hold its
    core against the transfers."""
    import os

    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (OSError, AttributeError) as exc:
        return str(exc)
    return None


def _pin() -> str | None:
    """Keep this process (and the threads gloo starts later, which inherit it) on one core of its own
    (``trainsim.run.ranks.pin_to_core`` for this rank). ``None`` on success, else why not.

    Why here too: with two emulated ranks on this 2-vCPU machine, where each rank's threads land decides the
    small all-reduces' latency: six launches of the same calibration at 1 Gbit/s gave 1 KiB all-reduces
    of 174-187 us in four and 224 us in two (real-time class). Pinned, six launches gave 183-194 us."""
    import os

    from trainsim.run.ranks import pin_to_core

    return pin_to_core(int(os.environ.get("RANK", "0")))


def _worker(
    sizes: list[int], reps: int, budget_s: float, ag_sizes: list[int], pp_sizes: list[int], realtime: bool = False,
    pin: bool = False, n_rounds: int = ROUNDS,
) -> None:  # fmt: skip
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    pin_error = _pin() if pin else "not asked for"
    sched_error = _realtime() if realtime else "not asked for"
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cpu: list[list[float]] = []
    # every size in each of n_rounds rounds: a burst of load on the host that lasts a second or two
    # then touches a share of each size's repetitions rather than all of two or three neighbouring
    # sizes. A size slower than ROUND_MAX_S (its warm-up all-reduce says) has its ``reps`` spread over
    # the rounds, a few per round: its repetitions one after the other lasted seconds, long enough for
    # one burst to slow them all (1 Gbit/s, 2026-11-27 05:11: the 90.51 MiB check read 9.53 ms/MiB,
    # its neighbours 9.05-9.14; three launches right after, 8.91-8.98)
    xs = [torch.ones(max(1, size // 4), dtype=torch.float32) for size in sizes]
    warm = [_slowest(_timed(partial(dist.all_reduce, x), 1))[0] for x in xs]
    rounds: list[list[list[float]]] = [[] for _ in xs]
    for plan in round_plan(warm, reps, n_rounds):
        for i, (x, n) in enumerate(zip(xs, plan, strict=True)):
            if n is None:
                rounds[i].append(_measure(partial(dist.all_reduce, x), reps, budget_s / n_rounds))
            elif n:
                rounds[i].append(_slowest(_timed(partial(dist.all_reduce, x), n)))
    out = [[t for r in rs for t in r] for rs in rounds]
    for x, times in zip(xs, out, strict=True):
        slow = statistics.fmean(times) > CPU_PASS_MAX_S * 1e6
        n_cpu = 0 if slow or realtime else int(budget_s * 1e6 / max(statistics.fmean(times), 1.0))
        cpu.append(_cpu_pass(x, n_cpu))
    del xs
    from trainsim.run.casync import all_gather_bytes

    gathered: list[list[float]] = []
    for size in ag_sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32)
        buf = torch.empty(world * x.numel(), dtype=torch.float32)
        # the primitive the compression hook gathers with (gloo: receives posted before sends)
        gathered.append(_measure(partial(_gather_wait, all_gather_bytes, buf, x), reps, budget_s))
    p2p: list[list[list[float]]] = []
    for size in pp_sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32)
        y = torch.empty_like(x)
        p2p.append([_measure(partial(_p2p_ops, x, y, exchange=ex), max(reps, P2P_MIN_REPS), budget_s / 2)
                    for ex in (False, True)])  # fmt: skip
    ps: list[list[list[float]]] = []  # the parameter-server primitives at the same sizes: gather, broadcast
    for size in pp_sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32)
        parts = [torch.empty_like(x) for _ in range(world)] if rank == 0 else None
        ps.append([_measure(partial(dist.gather, x, parts, dst=0), reps, budget_s / 2),
                   _measure(partial(dist.broadcast, x, 0), reps, budget_s / 2)])  # fmt: skip
    posts: list[list[float]] = []  # per size: [idle, busy] mean wall time of one post
    for size in pp_sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32)
        y = torch.empty_like(x)
        posts.append([_post_pass(x, y, compute=False), _post_pass(x, y, compute=True)])
    if rank == 0:
        print(json.dumps({"sizes": sizes, "rounds_us": rounds, "cpu_us": cpu, "post_us": posts,
                          "allgather_us": gathered, "p2p_us": p2p, "ps_us": ps, "realtime": sched_error is None,
                          "sched_error": sched_error, "pinned": pin_error is None, "pin_error": pin_error}),
              flush=True)  # fmt: skip
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) in (8, 9) and sys.argv[1] == "--worker":
        ag, pp = ([] if a == "-" else [int(s) for s in a.split(",")] for a in sys.argv[5:7])
        _worker([int(s) for s in sys.argv[2].split(",")], int(sys.argv[3]), float(sys.argv[4]), ag, pp,
                sys.argv[7].startswith("realtime"), sys.argv[7].endswith("+pin"),
                int(sys.argv[8]) if len(sys.argv) == 9 else ROUNDS)  # fmt: skip
    else:
        print("usage: python -m trainsim.cluster.calibrate --worker SIZES REPS BUDGET_S AG_SIZES|- P2P_SIZES|- "
              "default|realtime[+pin] [ROUNDS] (started by `trainsim calibrate`)")  # fmt: skip
        sys.exit(2)
