"""The test machine's calibration: measured once with generic workloads, saved, reused by every validation.

    $ trainsim validate calibrate                 # writes ~/.cache/trainsim/machine.json
    >>> cal = load_machine()                      # doctest: +SKIP
    >>> cal.allreduce_us(4 << 20, world=2, rate_mbit=100)   # doctest: +SKIP

This is the model of *the host that runs the validations*, not of a GPU cluster: what-ifs for a
cluster never read it. It holds four generic measurements, none of them a validated configuration:

1. **link**: gloo all-reduce, all-gather and one-way send of two ranks over loopback at a fixed grid
   of sizes (``GRID``): the host's per-message and per-byte cost of each; and all-reduces on a veth
   link shaped to each rate of ``CAL_RATES_MBIT`` at the sizes of ``EFF_SIZES`` (when network
   namespaces work): the fraction of the nominal rate the shaped link delivers (``efficiency``, by
   rate and bytes on the wire: TCP through tbf delivers ~96 % of a 240 Mbit/s link for a 1 MB
   message, ~89 % of a 60 Mbit/s one for 16 MB; the rates reach 1500 Mbit/s so that the validations'
   rates up to 1000 Mbit/s are read between measured rates, not held from 240); the same on links with added delay
   (``DELAYED_RATES_MBIT`` at ``DELAYED_CAL_MS``), which this testbed builds differently where the
   kernel has no ``netem`` (jumbo frames through a user-space delay line, ``testbed.netns``), so they
   deliver another fraction (``delayed_efficiency_grid``). ``allreduce_us``, ``allgather_us`` and
   ``p2p_us`` combine them for any size, world, rate and delay, with gloo's rendezvous
   (``RENDEZVOUS_LATENCIES``);
2. **host speed**: the time of a standard compute kernel (``kernel``: a single-thread float32 matmul)
   on one process;
3. **co-run slowdown**: the same kernel's time when ``k`` processes run it at once, over running it
   alone, for ``k`` in ``CORUN_PROCS``: what co-located ranks cost each other on this host;
4. **wire cost**: one-way sends of ``wirecost.WIRE_SIZES`` on veth links shaped to each rate of
   ``WIRE_RATES_MBIT`` while both ranks run the standard kernel (``testbed.wirecost``): the computation
   the two ranks lose per byte sent (``wire_us_per_byte``; ``wire_cpu_us`` charges it per byte a
   rank sends, on top of the loopback line ``host_us``). On this host it is 5-40 times the loopback
   line's per-byte cost and depends on the shaped rate (how the link cuts packets), not on how long
   the transfer lasts.

The file records the machine's identity (processor, cores, memory) and trainsim's version; another
machine's or version's file is refused with a one-line error naming it (``--recalibrate`` replaces it).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainsim.errors import UserError

FORMAT = 6
"""version of the file layout (4: ``wire_rates_mbit``, ``wire_lost_us``, ``wire_us_per_byte``; 5:
``delayed_rates_mbit``, ``delayed_us``, ``delayed_efficiency_grid``; 6: ``efficiency_grid`` rows up to
1500 Mbit/s, ``CAL_RATES_MBIT``, each the mean of ``SHAPED_LAUNCHES`` launches)"""
GRID = [4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20]
"""all-reduce sizes (bytes) of the link calibration: x8 apart, none of them a validated model's gradient"""
CAL_RATES_MBIT = (60.0, 240.0, 600.0, 1500.0)
"""the shaped links' rates for ``efficiency``: generic rates around those validated, none of them a
fixed validation's rate (interpolated in log rate between them, held beyond them); 600 and 1500 keep
the fixed rates of 400-1000 Mbit/s between measured rows"""
SHAPED_LAUNCHES = 2
"""launches of each rate of ``CAL_RATES_MBIT``, in turns over the rates; a row is the mean of its
launches' times (one launch at 600 Mbit/s read 12 % slower than two others minutes later)"""
EFF_SIZES = [256 << 10, 1 << 20, 4 << 20, 16 << 20]
"""all-reduce sizes (bytes) on the shaped links (interpolated in log size, held beyond them)"""
DELAYED_RATES_MBIT = (60.0, 240.0, 1200.0)
"""the rates of the delayed links for ``delayed_efficiency_grid``: generic, none of them a fixed
validation's rate (interpolated in log rate, held beyond them)"""
DELAYED_CAL_MS = 3.0
"""one-way delay of those links: inside the validations' range (0.5-10 ms), none of their fixed delays"""
RENDEZVOUS_LATENCIES = 2
"""one-way latencies per step of a gloo ring collective. gloo's TCP transport sends an unbound buffer
only once the receiver's ``NOTIFY_RECV_READY`` has arrived (gloo/transport/tcp/pair.cc, ``Pair::send``
and ``Pair::recv``), and the ring algorithms (gloo/allreduce.cc, gloo/allgather.cc) post a step's
receive at the moment its neighbour posts the matching send, so each step is the notice's latency and
then the data's. Probe of 2026-11-29 (docs/log/validate.md): 64 KiB all-reduces on links with 4-10 ms
added took 3.7-4.4 latencies beyond the bytes and the host's work, all-gathers 2.0-2.1."""
CORUN_PROCS = (2, 4)
WIRE_RATES_MBIT = (60.0, 240.0, 500.0, 1200.0)
"""the shaped links' rates of the wire pass: both sides of ``netns.gso_bytes``' switch to small GSO
packets (~250 Mbit/s), none of them a fixed validation's rate (interpolated in log rate, held beyond)"""
KERNEL_N = 256
"""the standard kernel: ``KERNEL_N`` x ``KERNEL_N`` float32 matmul on one thread"""


@dataclass(frozen=True, kw_only=True, slots=True)
class MachineCalibration:
    """What ``calibrate_machine`` measured (fields documented in the module docstring)."""

    machine: dict[str, Any]
    """identity: processor, cores, memory"""
    version: str
    """``trainsim.__version__`` and ``FORMAT``"""
    created_at: str
    sizes_bytes: list[int]
    loopback_us: list[float]
    """2-rank gloo all-reduce over loopback, per size (mean of each round, median of rounds)"""
    host_a_us: float
    """fitted per-all-reduce host cost (loopback)"""
    host_b_us_per_byte: float
    """fitted per-byte host cost (loopback)"""
    shaped_rates_mbit: list[float]
    """the rates of the shaped links measured (empty when namespaces are unavailable)"""
    shaped_sizes_bytes: list[int]
    shaped_us: list[list[float]]
    """2-rank all-reduce of ``shaped_sizes_bytes`` on a link shaped to each of ``shaped_rates_mbit``"""
    efficiency_grid: list[list[float]]
    """delivered / nominal rate, per shaped rate and size: (measured - loopback host line) vs the bytes
    on the wire at the nominal rate"""
    link_efficiency: float
    """the median of ``efficiency_grid`` (1.0 when not measured): a one-number summary; the models use
    ``efficiency``"""
    allgather_loopback_us: list[float]
    """2-rank gloo all-gather of ``sizes_bytes`` per rank over loopback"""
    allgather_line: tuple[float, float]
    """``(a_us, b_us_per_byte)`` fitted to ``allgather_loopback_us``"""
    p2p_loopback_us: list[float]
    """one send of ``sizes_bytes`` from one rank to the other over loopback"""
    p2p_line: tuple[float, float]
    """``(a_us, b_us_per_byte)`` fitted to ``p2p_loopback_us``"""
    kernel_ms: float
    """one standard kernel on one idle process"""
    corun_slowdown: dict[str, float]
    """``{k: time with k processes at once / time alone}``"""
    load_avg: float
    """the host's 1-minute load average when the calibration started: other work running then is in
    every figure above (``calibrate_machine`` warns when it exceeds half the cores)"""
    wire_rates_mbit: list[float] = field(default_factory=list)
    """the shaped rates of the wire pass (empty when namespaces are unavailable)"""
    wire_lost_us: list[list[float]] = field(default_factory=list)
    """per rate: the computation one send of each of ``wirecost.WIRE_SIZES`` took, mean of the two ranks (µs)"""
    wire_us_per_byte: list[float] = field(default_factory=list)
    """per rate: the computation both ranks together lose per byte sent one way (µs/byte,
    ``wirecost.lost_per_byte``)"""
    delayed_rates_mbit: list[float] = field(default_factory=list)
    """the rates of the delayed links measured (``DELAYED_RATES_MBIT``; empty when not measured)"""
    delayed_us: list[list[float]] = field(default_factory=list)
    """2-rank all-reduce of ``shaped_sizes_bytes`` on a link shaped to each of ``delayed_rates_mbit``
    with ``DELAYED_CAL_MS`` added one way"""
    delayed_efficiency_grid: list[list[float]] = field(default_factory=list)
    """delivered / nominal rate on those links: (measured - loopback host line - the rendezvous
    latencies) vs the bytes on the wire at the nominal rate"""
    fused_adam_sizes_bytes: list[int] = field(default_factory=list)
    """parameter bytes of the fused-kernel pass (``calibrate_host.FUSED_SIZES``; empty: not measured)"""
    fused_adam_gbps: list[float] = field(default_factory=list)
    """torch's fused Adam kernel on one thread over parameters of each size: bytes moved per second, GB/s
    (``calibrate_host.fused_adam_gbps``)"""

    def fused_kernel_gbps(self, param_bytes: float) -> float:
        """The fused Adam kernel's rate (GB/s) over ``param_bytes`` of parameters: ``fused_adam_gbps``
        interpolated in log size, held beyond the grid; a ``UserError`` when it was not measured."""
        import numpy as np

        if not self.fused_adam_gbps:
            raise UserError("this machine calibration has no fused-kernel pass; run trainsim validate calibrate --recalibrate")
        ls = np.log(np.asarray(self.fused_adam_sizes_bytes, dtype=float))
        return float(np.interp(np.log(max(param_bytes, 1.0)), ls, np.asarray(self.fused_adam_gbps, dtype=float)))

    def efficiency(self, rate_mbit: float, wire_bytes: float = 1 << 20, *, delay_ms: float = 0.0) -> float:
        """The fraction of ``rate_mbit`` a shaped link delivers to a transfer that puts ``wire_bytes`` on
        it: ``efficiency_grid`` (``delayed_efficiency_grid`` when ``delay_ms`` > 0 and it was measured)
        interpolated in log rate and log size, held beyond the grid."""
        import numpy as np

        rows, rates = self.efficiency_grid, self.shaped_rates_mbit
        if delay_ms > 0 and self.delayed_efficiency_grid:
            rows, rates = self.delayed_efficiency_grid, self.delayed_rates_mbit
        if not rows:
            return self.link_efficiency
        grid = np.asarray(rows, dtype=float)
        ls = np.log(np.asarray(self.shaped_sizes_bytes, dtype=float))
        per_rate = [float(np.interp(np.log(max(wire_bytes, 1.0)), ls, row)) for row in grid]
        lr = np.log(np.asarray(rates, dtype=float))
        return float(np.interp(np.log(rate_mbit), lr, per_rate))

    def host_us(self, size_bytes: float) -> float:
        """The host's cost of one 2-rank all-reduce of ``size_bytes`` over an unshaped link."""
        return self.host_a_us + self.host_b_us_per_byte * size_bytes

    def allreduce_us(self, size_bytes: float, *, world: int = 2, rate_mbit: float | None = None,
                     delay_ms: float = 0.0) -> float:  # fmt: skip
        """A ring all-reduce of ``size_bytes`` among ``world`` ranks on links of ``rate_mbit`` (None:
        unshaped) with ``delay_ms`` one way: the host's cost (scaled by the ring's 2(p-1)/p share of
        the bytes and its 2(p-1) steps relative to 2 ranks), plus each step's rendezvous
        (``RENDEZVOUS_LATENCIES`` delays), plus the bytes on the wire at the delivered rate."""
        p = max(2, world)
        steps = 2 * (p - 1)
        share = steps / p  # bytes each rank sends, per byte of the tensor
        t = self.host_a_us * steps / 2 + self.host_b_us_per_byte * size_bytes * share
        t += steps * RENDEZVOUS_LATENCIES * delay_ms * 1e3
        if rate_mbit:
            wire = share * size_bytes
            t += wire * 8 / (rate_mbit * self.efficiency(rate_mbit, wire, delay_ms=delay_ms))  # bits / (bits/us)
        return t

    def allgather_us(self, size_bytes: float, *, world: int = 2, rate_mbit: float | None = None,
                     delay_ms: float = 0.0) -> float:  # fmt: skip
        """A ring all-gather of ``size_bytes`` per rank among ``world`` ranks: ``world - 1`` steps, each
        a host cost (the 2-rank line) plus the rendezvous (``RENDEZVOUS_LATENCIES`` delays), plus every
        other rank's bytes on the wire."""
        steps = max(2, world) - 1
        a, b = self.allgather_line
        t = steps * (a + b * size_bytes) + steps * RENDEZVOUS_LATENCIES * delay_ms * 1e3
        if rate_mbit:
            wire = steps * size_bytes
            t += wire * 8 / (rate_mbit * self.efficiency(rate_mbit, wire, delay_ms=delay_ms))
        return t

    def p2p_us(self, size_bytes: float, *, rate_mbit: float | None = None, delay_ms: float = 0.0) -> float:
        """One send of ``size_bytes`` to one peer whose receive is already posted: the host line, the
        delay and the bytes on the wire."""
        a, b = self.p2p_line
        t = a + b * size_bytes + delay_ms * 1e3
        if rate_mbit:
            t += size_bytes * 8 / (rate_mbit * self.efficiency(rate_mbit, size_bytes, delay_ms=delay_ms))
        return t

    def cost(self, *, rate_mbit: float | None = None, delay_ms: float = 0.0) -> MachineCost:
        """This host as a ``CollectiveCost``: links of ``rate_mbit`` (None: unshaped), ``delay_ms`` one way."""
        return MachineCost(self, rate_mbit, delay_ms)

    def wire_cpu_us_per_byte(self, rate_mbit: float | None) -> float:
        """The computation lost per byte sent one way on a link shaped to ``rate_mbit`` (sender and
        receiver together): ``wire_us_per_byte`` interpolated in log rate, held beyond the measured
        rates; 0 unshaped (``rate_mbit`` None: loopback, whose cost is in ``host_us``) or unmeasured."""
        import numpy as np

        if not rate_mbit or not self.wire_us_per_byte:
            return 0.0
        lr = np.log(np.asarray(self.wire_rates_mbit, dtype=float))
        return float(np.interp(np.log(rate_mbit), lr, np.asarray(self.wire_us_per_byte, dtype=float)))

    def wire_cpu_us(self, size_bytes: float, *, rate_mbit: float | None = None, world: int = 2) -> float:
        """The computation a ring all-reduce of ``size_bytes`` among ``world`` ranks on a link shaped to
        ``rate_mbit`` takes from each rank beyond the loopback line ``host_us``:
        ``wire_cpu_us_per_byte`` for each byte the rank sends (``2(p-1)/p`` of the size; it receives as
        many, so the pair's per-byte figure is the rank's: half as sender, half as receiver). Measured
        with every rank computing, so it is what the rank that sets the step loses (an all-reduce
        costs both ranks alike: at 400 Mbit/s the worse rank lost 0.51 of its core, the mean 0.505)."""
        p = max(2, world)
        return self.wire_cpu_us_per_byte(rate_mbit) * size_bytes * 2 * (p - 1) / p

    def slowdown(self, procs: int) -> float:
        """Co-run slowdown of ``procs`` processes computing at once (1 for one; the measured ``k`` at
        or above ``procs``, else the largest measured, scaled by procs / cores beyond it)."""
        if procs <= 1:
            return 1.0
        ks = sorted(int(k) for k in self.corun_slowdown)
        for k in ks:
            if k >= procs:
                return self.corun_slowdown[str(k)]
        top = ks[-1]
        return self.corun_slowdown[str(top)] * procs / top

    def describe(self, path: Path) -> dict[str, Any]:
        """What a result file records about the calibration it used."""
        return {"file": str(path), "created_at": self.created_at, "version": self.version, "load_avg": self.load_avg,
                "link_efficiency": self.link_efficiency, "efficiency_grid": self.efficiency_grid,
                "shaped_rates_mbit": self.shaped_rates_mbit, "kernel_ms": self.kernel_ms,
                "corun_slowdown": self.corun_slowdown, "wire_rates_mbit": self.wire_rates_mbit,
                "wire_us_per_byte": self.wire_us_per_byte, "fused_adam_sizes_bytes": self.fused_adam_sizes_bytes,
                "fused_adam_gbps": self.fused_adam_gbps}  # fmt: skip


@dataclass(frozen=True, slots=True)
class MachineCost:
    """``MachineCalibration.cost``: all-reduce, all-gather (``size_bytes`` its output) and send times."""

    cal: MachineCalibration
    rate_mbit: float | None
    delay_ms: float

    def time_us(self, kind: str, size_bytes: float, group: int) -> float:
        r, d = self.rate_mbit, self.delay_ms
        if kind == "allreduce":
            return self.cal.allreduce_us(size_bytes, world=group, rate_mbit=r, delay_ms=d)
        if kind == "allgather":
            return self.cal.allgather_us(size_bytes / group, world=group, rate_mbit=r, delay_ms=d)
        if kind == "p2p":
            return self.cal.p2p_us(size_bytes, rate_mbit=r, delay_ms=d)
        raise UserError(f"the machine calibration has no model of {kind!r}; expected allreduce, allgather or p2p")


def identity() -> dict[str, Any]:
    """This machine, as far as a calibration cares: processor, cores and memory."""
    from trainsim.transform.opcost import cpu_model

    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "mem_gib": round(mem / 2**30)}


def version() -> str:
    import trainsim

    return f"{trainsim.__version__}/{FORMAT}"


def default_path() -> Path:
    """``$XDG_CACHE_HOME/trainsim/machine.json`` (``~/.cache/trainsim/machine.json``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainsim" / "machine.json"


def load_machine(path: Path | None = None, *, recalibrate: bool = False, log: Any = None) -> tuple[
        MachineCalibration, Path]:  # fmt: skip
    """The calibration in ``path`` (default ``default_path()``), measured first when the file is
    missing or ``recalibrate``; a file of another machine or version is an error."""
    path = path or default_path()
    if recalibrate or not path.exists():
        cal = calibrate_machine(log=log)
        _save(cal, path)
        return cal, path
    try:
        raw = json.loads(path.read_text())
        raw["allgather_line"], raw["p2p_line"] = tuple(raw["allgather_line"]), tuple(raw["p2p_line"])
        cal = MachineCalibration(**raw)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise UserError(f"{path}: not a machine calibration ({e}); pass --recalibrate to measure a new one") from None
    if cal.version != version():
        raise UserError(f"{path}: calibration of trainsim {cal.version}, this is {version()}; pass --recalibrate")
    here = identity()
    if cal.machine != here:
        raise UserError(f"{path}: calibration of another machine ({cal.machine}, this is {here}); pass --recalibrate")
    return cal, path


def _save(cal: MachineCalibration, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(asdict(cal), indent=1) + "\n")
    tmp.replace(path)


def with_fused_kernel(cal: MachineCalibration, path: Path, *, log: Any = None) -> MachineCalibration:
    """``cal`` with the fused-kernel pass: as it is when it has one, else measured now (a few seconds)
    and saved into ``path``, the rest of the file unchanged (a file written before the pass existed)."""
    from dataclasses import replace

    from trainsim.testbed.calibrate_host import FUSED_SIZES, fused_adam_pass

    if cal.fused_adam_gbps:
        return cal
    (log or (lambda s: None))(f"machine calibration: torch's fused Adam kernel over a fixed grid of sizes (added to {path})")
    cal = replace(cal, fused_adam_sizes_bytes=list(FUSED_SIZES), fused_adam_gbps=fused_adam_pass())
    _save(cal, path)
    return cal


# --------------------------------------------------------------------------- measuring
def calibrate_machine(*, log: Any = None) -> MachineCalibration:
    """Measure the four generic workloads (about three and a half minutes)."""
    import numpy as np

    from trainsim.testbed.calibrate import calibrate
    from trainsim.testbed.netns import netns_unavailable
    from trainsim.testbed.wirecost import WIRE_SIZES, lost_per_byte

    say = log or (lambda s: None)
    load = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    if load > 0.5 * cores:
        say(f"warning: the host is busy (load average {load:.1f} on {cores} cores); the calibration measures "
            "that load too: calibrate on a quiet host (trainsim validate calibrate --recalibrate)")
    say("machine calibration: gloo all-reduce, all-gather and send over loopback, fixed grid of sizes")
    loop = calibrate(world=2, sizes=GRID, reps=3, budget_s=0.15, allgather_sizes=GRID, p2p_sizes=GRID)
    sizes = np.array(GRID, dtype=float)
    host = np.array(loop.measured_us)
    a, b = _line(sizes, host)

    def shaped_pass(rate: float, delay_ms: float) -> list[float]:
        """All-reduces of ``EFF_SIZES`` on a link of ``rate`` with ``delay_ms`` added: the times (us)."""
        sh = calibrate(world=2, rate_mbit=rate, delay_ms=delay_ms, sizes=EFF_SIZES, reps=2, budget_s=0.15)
        return [float(x) for x in sh.measured_us]

    shaped: list[list[float]] = []
    grid: list[list[float]] = []
    rates: list[float] = []
    if netns_unavailable() is None:
        rates = list(CAL_RATES_MBIT)
        launched: list[list[list[float]]] = [[] for _ in rates]
        for k in range(SHAPED_LAUNCHES):  # in turns over the rates: a slow spell hits one launch of several
            for i, rate in enumerate(rates):
                say(f"machine calibration: all-reduces on a veth link shaped to {rate:g} Mbit/s "
                    f"(launch {k + 1} of {SHAPED_LAUNCHES})")  # fmt: skip
                launched[i].append(shaped_pass(rate, 0.0))
        for rate, runs in zip(rates, launched, strict=True):
            times, row = efficiency_row(runs, rate, (a, b))
            shaped.append(times)
            grid.append(row)
    eff = float(np.median(grid)) if grid else 1.0
    delayed: list[list[float]] = []
    delayed_grid: list[list[float]] = []
    delayed_rates = list(DELAYED_RATES_MBIT) if rates else []
    for rate in delayed_rates:
        say(f"machine calibration: all-reduces on a link shaped to {rate:g} Mbit/s with {DELAYED_CAL_MS:g} ms added")
        times, row = efficiency_row([shaped_pass(rate, DELAYED_CAL_MS)], rate, (a, b), DELAYED_CAL_MS)
        delayed.append(times)
        delayed_grid.append(row)
    wire_rates = list(WIRE_RATES_MBIT) if rates else []
    wire_lost: list[list[float]] = []
    for rate in wire_rates:
        say(f"machine calibration: sends while both ranks compute, on a link shaped to {rate:g} Mbit/s")
        wire_lost.append([round(x, 2) for x in _wire_lost_us(rate)])
    ag = np.array(loop.allgather_measured_us, dtype=float)
    pp = np.array(loop.p2p_oneway_us, dtype=float)
    say("machine calibration: standard kernel alone and co-run")
    # rounds of (alone, co-run k ...): a burst of outside load then hits one round's ratios, not all
    rounds = [[_kernel_ms(1)[0], *(statistics.fmean(_kernel_ms(k)) for k in CORUN_PROCS)] for _ in range(3)]
    alone = statistics.median(r[0] for r in rounds)
    corun = {str(k): round(statistics.median(r[j + 1] / r[0] for r in rounds), 3) for j, k in enumerate(CORUN_PROCS)}
    from trainsim.testbed.calibrate_host import FUSED_SIZES, fused_adam_pass

    say("machine calibration: torch's fused Adam kernel over a fixed grid of sizes")
    fused = fused_adam_pass()
    from datetime import datetime, timezone

    return MachineCalibration(
        machine=identity(), version=version(), created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), sizes_bytes=list(GRID),
        loopback_us=[round(float(x), 2) for x in host], host_a_us=round(a, 3), host_b_us_per_byte=b,
        shaped_rates_mbit=rates, shaped_sizes_bytes=list(EFF_SIZES) if rates else [], shaped_us=shaped,
        efficiency_grid=grid, link_efficiency=round(eff, 4),
        allgather_loopback_us=[round(float(x), 2) for x in ag], allgather_line=_line(sizes, ag),
        p2p_loopback_us=[round(float(x), 2) for x in pp], p2p_line=_line(sizes, pp),
        kernel_ms=round(alone, 4), corun_slowdown=corun, load_avg=round(load, 2), wire_rates_mbit=wire_rates,
        wire_lost_us=wire_lost, wire_us_per_byte=[lost_per_byte(WIRE_SIZES, w) for w in wire_lost],
        delayed_rates_mbit=delayed_rates, delayed_us=delayed, delayed_efficiency_grid=delayed_grid,
        fused_adam_sizes_bytes=list(FUSED_SIZES), fused_adam_gbps=fused,
    )  # fmt: skip


def efficiency_row(launches_us: list[list[float]], rate_mbit: float, host: tuple[float, float],
                   delay_ms: float = 0.0) -> tuple[list[float], list[float]]:  # fmt: skip
    """One row of ``efficiency_grid`` from launches of all-reduces of ``EFF_SIZES`` on a link shaped to
    ``rate_mbit`` with ``delay_ms`` added: per size, the mean of the launches' times (us), and the
    delivered / nominal rate: the bytes at the nominal rate over that time less the loopback host line
    ``host`` (``(a_us, b_us_per_byte)``) and the rendezvous latencies, within [0.05, 1]."""
    import numpy as np

    sizes = np.array(EFF_SIZES, dtype=float)
    t = np.mean(np.array(launches_us, dtype=float), axis=0)
    lat = 2 * RENDEZVOUS_LATENCIES * delay_ms * 1e3  # 2 ranks: two ring steps
    wire = t - (host[0] + host[1] * sizes) - lat
    nominal = sizes * 8 / rate_mbit  # us at the nominal rate (2 ranks: each sends the size once)
    eff = np.clip(nominal / np.maximum(wire, 1e-9), 0.05, 1.0)
    return [round(float(x), 2) for x in t], [round(float(x), 4) for x in eff]


def _wire_lost_us(rate_mbit: float) -> list[float]:
    """One launch of the wire pass (``testbed.wirecost``) on two namespaces joined by a link shaped to
    ``rate_mbit``: per size of ``WIRE_SIZES``, the computation one send took (µs, mean of the ranks)."""
    from trainsim.testbed.launch import run_json
    from trainsim.testbed.netns import Netns
    from trainsim.testbed.wirecost import WINDOW_S, WIRE_SIZES

    with Netns(2, rate_mbit=rate_mbit) as net:
        res = run_json(2, "trainsim.testbed.wirecost", {"sizes": list(WIRE_SIZES), "window_s": WINDOW_S}, net=net,
                       timeout_s=300)[0]  # fmt: skip
    return [float(x) for x in res["lost_us"]]


def _line(x: Any, y: Any) -> tuple[float, float]:
    """``(a, b)`` of ``y = a + b x`` by least squares, both clipped at 0."""
    import numpy as np

    b, a = np.polyfit(np.asarray(x, float), np.asarray(y, float), 1)
    return (round(max(float(a), 0.0), 3), max(float(b), 0.0))


_KERNEL = f"""
import os, time, torch
torch.set_num_threads(1)
a = torch.randn({KERNEL_N}, {KERNEL_N}); b = torch.randn({KERNEL_N}, {KERNEL_N})
for _ in range(20): a @ b
time.sleep(max(0.0, float(os.environ["TRAINSIM_START_AT"]) - time.time()))  # every process at once
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < 1.0:
    a @ b; n += 1
print((time.perf_counter() - t0) / n * 1e3)  # wall time per kernel, time spent off the core included
"""


def _kernel_ms(procs: int) -> list[float]:
    """The standard kernel's mean wall time (ms) in each of ``procs`` processes running at once: the
    throughput, so that time waiting for a core counts (a median per call would hide it)."""
    # every process starts timing at the same moment, after all of them have imported torch
    env = dict(os.environ, OMP_NUM_THREADS="1", TRAINSIM_START_AT=str(time.time() + 2.5 + 0.5 * procs))
    ps = [subprocess.Popen([sys.executable, "-c", _KERNEL], stdout=subprocess.PIPE, text=True, env=env)
          for _ in range(procs)]  # fmt: skip
    out = []
    for p in ps:
        so, _ = p.communicate(timeout=120)
        if p.returncode:
            raise RuntimeError(f"the standard kernel failed in a child process (exit {p.returncode})")
        out.append(float(so.strip().splitlines()[-1]))
    time.sleep(0.1)
    return out
