"""A link calibration's record: the measured times, the fitted model, and its predictions.

    >>> import json
    >>> from trainsim.cluster.calibration import Calibration
    >>> cal = Calibration.from_json(json.load(open("net.json")))   # doctest: +SKIP
    >>> cal.predict_us(4 << 20), cal.link.bw_gbyte_s                # doctest: +SKIP
    >>> cal.time_us("allreduce", 4 << 20, cal.world)                # doctest: +SKIP

Made by ``testbed.calibrate`` (``trainsim calibrate --out net.json``); read by the what-ifs, ``scaleout
--calibration`` and the validations, which need none of the machinery that measured it. It is a
``collectives.CollectiveCost`` (``time_us``). The link's predictions (``predict_us``, ``p2p_line``, ``ps_lines``, ``duplex_factor``, ``allgather_us``) describe the
emulated network; ``cpu_us``, ``slowdown``, ``lost_us`` and ``busy_post_us`` describe the test host
(``testbed.calibrate_host``).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

import numpy as np

from trainsim.cluster.calibrate_fit import knee_us, nonneg_line
from trainsim.cluster.catalog import Link
from trainsim.cluster.collectives import allgather_us, collective_us


def _log_interp(size_bytes: float, sizes: list[int], ys: list[float]) -> float:
    """``ys`` at ``size_bytes``, interpolated in log size between ``sizes``, the end values held beyond them."""
    x = np.log(np.maximum(np.asarray(sizes, float), 1.0))
    return float(np.interp(np.log(max(float(size_bytes), 1.0)), x, np.asarray(ys, float)))


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
    ``p2p_sizes_bytes`` (``testbed.calibrate_host.post_pass``)"""
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
        return _log_interp(size_bytes, self.cpu_sizes_bytes, self.busy_slowdown) if self.busy_slowdown else 1.0

    def cpu_line(self, *, p2p: bool = False) -> tuple[float, float]:
        """``(c0 µs, c1 µs/byte)``: host CPU a rank spends on one all-reduce (or, ``p2p``, on one send
        or one receive) of S bytes is ``c0 + c1 S``, a linear fit of the CPU pass. Other work on that
        rank's cores loses this time while the transfer runs. ``(0, 0)`` when nothing was measured."""
        ys = self.cpu_p2p_us if p2p else self.cpu_allreduce_us
        half = 2.0 if p2p else 1.0  # the p2p pass timed a send and a receive together
        if len(ys) < 2:
            return (float(ys[0]) / half if ys else 0.0), 0.0
        c0, c1 = nonneg_line(np.asarray(self.cpu_sizes_bytes, float), np.asarray(ys, float))
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
        return _log_interp(size_bytes, self.residual_sizes_bytes, self.residual_ratio) if self.residual_ratio else 1.0

    def p2p_line(self) -> tuple[float, float]:
        """``(latency_us, us_per_byte)`` of one point-to-point transfer, a relative least-squares line
        through the one-way times; from the all-reduce's ring model when not measured."""
        if len(self.p2p_oneway_us) >= 2:
            return nonneg_line(np.asarray(self.p2p_sizes_bytes, float), np.asarray(self.p2p_oneway_us, float))
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
            return nonneg_line(sizes, np.asarray(ys, float)) if ok else self.p2p_line()

        return line(self.gather_us), line(self.broadcast_us)

    def duplex_factor(self) -> float:
        """How much longer a transfer takes when the link carries one the other way at the same time:
        exchange / one-way time, averaged over the sizes of at least 256 KiB (in [1, 2]; 1 if not
        measured). 1 is a full-duplex link, 2 one whose directions share one capacity. gloo on a shaped
        full-duplex link lands in between: in a share of the exchanges its "ready" message for the
        peer's send queues behind the rank's own payload (docs/cluster.md); at least
        ``testbed.calibrate_worker.P2P_MIN_REPS`` of each, since single exchanges take either about 1x or 2x."""
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
        return allgather_us(self.world * float(size_bytes), self.world, self.link)

    def time_us(self, kind: str, size_bytes: float, group: int) -> float:
        """``collectives.CollectiveCost``: among the calibrated ``world`` ranks an all-reduce is
        ``predict_us`` and an all-gather (``size_bytes`` its output) ``allgather_us``; a send is
        ``p2p_line``; anything else, or another group, the ring model of the calibrated ``link``."""
        if kind == "p2p":
            a, b = self.p2p_line()
            return a + b * float(size_bytes)
        if group == self.world and kind == "allreduce":
            return self.predict_us(size_bytes)
        if group == self.world and kind == "allgather":
            return self.allgather_us(float(size_bytes) / group)
        return collective_us(kind, size_bytes, group, self.link)

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
