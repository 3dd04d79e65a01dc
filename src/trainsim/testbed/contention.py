"""Ranks that share this host's cores: a replay in which communication takes host CPU from the compute
it overlaps, and co-located ranks slow each other down.

    >>> from trainsim.testbed.contention import simulate_with_host_cpu
    >>> res = simulate_with_host_cpu(graph, comm_cpu_us)     # doctest: +SKIP

The validations hand such a replay to the prediction functions that take one (``replay=`` of
``transform.ooo.predict_dp`` and ``transform.pipeline.predict_pipeline``); a what-if for a GPU cluster
replays with plain ``simulate``.

On a GPU cluster a collective runs on the NIC and the GPU's copy engines, and the host threads that
issue work barely notice it. On a CPU cluster (gloo over TCP) every transfer is also host CPU work:
gloo's socket and worker threads, the kernel's TCP stack. On this project's 2-vCPU test machine a
2-rank all-reduce of 4 MiB costs each rank about 23 ms of CPU time against 47 ms of wall time, and even
a 1 KiB one about 0.6 ms (``trainsim.testbed.calibrate_host.cpu_pass``). Where that work overlaps
computation, the computation runs slower.

Model, both ways:

* *communication slows computation*: a transfer k that lasts ``d_k`` and needs ``c_k`` of host CPU
  uses a share ``u_k = min(1, c_k / d_k)`` of one core while it runs; the load
  ``L(t) = min(1/2, sum of u_k over the transfers running at t)`` is taken away from the compute
  threads (at most half a core: the fair scheduler splits a contended core evenly): a CPU task that
  needs ``b`` of CPU and starts at ``s`` lasts ``x = b + integral of L over [s, s + x]``;
* *bytes on a shaped link slow computation* (``wire_cpu_us``): gloo's threads, TCP and the shaping
  qdisc take ``w_k`` more of host CPU per transfer, measured by the machine calibration as the
  computation each rank loses while both compute (``MachineCalibration.wire_cpu_us``: ~38 ns per
  byte sent below ~250 Mbit/s on this host, ~8 ns at 1 Gbit/s, against the loopback line's 1 ns). It
  loads the compute threads like ``c_k`` (``min(1, w_k / d_k)``, at most half a core), but once: it
  is already what the rank that sets the step loses, so ``concentration`` does not scale it;
* *computation slows communication*: gloo's threads wait for the scheduler when every core computes,
  so a transfer progresses ``sigma_k`` times slower (measured by the calibration with a compute thread
  on every rank) while the compute threads are busy: one that needs ``b`` and overlaps ``B`` of
  computation lasts ``b + B (1 - 1/sigma_k)``.

* *ranks slow each other's computation* (graphs of several ranks on one host): a compute task runs
  ``f`` times slower while another rank's CPU thread computes, ``f`` being the measured co-run factor
  (copies of the training loop at once / alone): ``simulate.overlap.corun_extra_us``.
* *the slowest rank absorbs the others' threads* (a graph of one rank standing for ranks that share
  a host's cores): a rank's extra threads (gloo's, a hook's callback thread) and the kernel's network
  work do not stay beside their own rank's compute thread; they run on whichever core is free of the
  moment's other helpers, and a synchronous step waits for the rank whose compute thread they
  landed beside. ``concentration`` ``c`` scales the time the compute tasks lose to them: ``c = 1``
  charges each rank its own; ``c = world`` is every rank's helper work beside one compute thread.

Stretching moves the schedule, so the replay is repeated with the new durations, each time from the
original ones plus what the previous schedule implies (a fixed-point iteration, ``rounds`` times).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trainsim.graph.ir import F64, ResourceKind, TaskGraph, TaskKind
from trainsim.simulate.engine import SimResult, simulate
from trainsim.simulate.overlap import corun_extra_us, load_integral, overlap_us

MAX_STOLEN_SHARE = 0.5
"""A CPU-bound compute thread keeps at least half of its core against the transfers' threads (the
kernel's fair scheduler splits a contended core evenly)."""


def stretched_us(
    start: F64, base: F64, comm_start: F64, comm_end: F64, share: F64, victims: np.ndarray,
    cap: float = MAX_STOLEN_SHARE,
) -> F64:  # fmt: skip
    """New durations of the victims: each needs ``base`` of CPU and loses the transfers' load (at most
    ``cap``) while it runs, so it lasts ``x = base + integral of the load over [s, s + x]`` (solved by
    fixed-point iteration: a contraction while the load stays below 1; at 1 the victim waits out the
    load)."""
    out = base.copy()
    if not share.size or not victims.size:
        return out
    t, cum = load_integral(comm_start, comm_end, np.arange(share.size), share, cap)
    s = start[victims]
    fs = np.interp(s, t, cum)
    x = base[victims].copy()
    for _ in range(30):
        x_new = base[victims] + np.interp(s + x, t, cum) - fs
        if np.allclose(x_new, x, rtol=1e-6, atol=1e-3):
            x = x_new
            break
        x = x_new
    out[victims] = x
    return out


def comm_cpu_column(g: TaskGraph, cpu_us: Callable[[float], float]) -> F64:
    """Per-task host CPU of ``g``'s communication: ``cpu_us(size_bytes)`` for each COMM task with a
    known size (a broadcast from a 2-rank group: half, one message instead of two ring steps), 0 else."""
    out = np.zeros(g.n_tasks)
    for t in np.flatnonzero((g.kind == TaskKind.COMM) & (g.size_bytes > 0)):
        c = cpu_us(float(g.size_bytes[t]))
        out[t] = c / 2 if g.task_name(int(t)).startswith("broadcast") else c
    return out


def comm_slowdown_column(g: TaskGraph, slowdown: Callable[[float], float]) -> F64:
    """Per-task ``slowdown(size_bytes)`` (>= 1) for COMM tasks with a known size, 1 for the rest."""
    out = np.ones(g.n_tasks)
    for t in np.flatnonzero((g.kind == TaskKind.COMM) & (g.size_bytes > 0)):
        out[t] = max(1.0, slowdown(float(g.size_bytes[t])))
    return out


def simulate_contended(
    g: TaskGraph, cpu_us: Callable[[float], float], slowdown: Callable[[float], float] | None = None,
    *, helper_threads: tuple[str, ...] = (), concentration: float = 1.0,
    wire_cpu_us: Callable[[float], float] | None = None,
) -> SimResult:  # fmt: skip
    """``simulate_with_host_cpu`` with the columns derived from per-size functions (a calibration's
    ``cpu_us``, ``slowdown`` and ``wire_cpu_us``); ``helper_threads`` and ``concentration``: see
    ``simulate_with_host_cpu``."""
    sigma = None if slowdown is None else comm_slowdown_column(g, slowdown)
    wire = None if wire_cpu_us is None else comm_cpu_column(g, wire_cpu_us)
    return simulate_with_host_cpu(g, comm_cpu_column(g, cpu_us), comm_slowdown=sigma, helper_threads=helper_threads,
                                  concentration=concentration, comm_wire_us=wire)  # fmt: skip


def simulate_with_host_cpu(
    g: TaskGraph,
    comm_cpu_us: F64,
    *,
    comm_slowdown: F64 | None = None,
    rounds: int = 3,
    busy_share: float = 1.0,
    corun_factor: float = 1.0,
    helper_threads: tuple[str, ...] = (),
    concentration: float = 1.0,
    comm_wire_us: F64 | None = None,
) -> SimResult:
    """Replay ``g`` with communication tasks taking ``comm_cpu_us`` (per task; 0 for the rest) of host
    CPU from the compute threads they overlap, and running ``comm_slowdown`` times slower (per task,
    >= 1) while those threads compute (see the module docstring). ``busy_share``: how much one busy
    compute thread counts towards "the ranks compute" (capped at 1 in all): 1 for a graph of one rank
    (the others do the same), ``1 / ranks`` for a graph of every rank, where the slowdown measured with
    every rank computing applies in full only while all of them do. ``corun_factor``: for a graph of
    several ranks on one host, how much slower computation runs while another rank's computes
    (``corun_extra_us``). ``helper_threads``: names of CPU-thread resources whose tasks (e.g. a
    communication hook's decode on the thread that completes its future) are all host CPU work of the
    rank beside its compute thread: they take all of their time from the compute tasks they overlap.
    Where every core already computes (a rank per core, as on this 2-vCPU host with 2 ranks), a
    second thread of a rank gets no core of its own: its work delays the rank's computation.
    ``concentration`` (>= 1): how many ranks' worth of that lost time (transfers' CPU and helper threads)
    the compute tasks of the rank that sets the step absorb; 1 where every rank has cores of its own,
    the number of ranks where they share a host's cores (module docstring). ``comm_wire_us`` (per
    task; None: none): more host CPU of the transfers, taken from the overlapping computation like
    ``comm_cpu_us`` but not scaled by ``concentration`` (a shaped link's cost per byte, measured as
    the rank that sets the step loses it)."""
    if not concentration >= 1.0:
        raise ValueError(f"concentration={concentration!r}; expected >= 1")
    cpu = np.asarray(comm_cpu_us, dtype=np.float64)
    if cpu.shape != (g.n_tasks,):
        raise ValueError(f"comm_cpu_us has shape {cpu.shape}, expected ({g.n_tasks},)")
    sigma = np.ones(g.n_tasks) if comm_slowdown is None else np.asarray(comm_slowdown, dtype=np.float64)
    if sigma.shape != (g.n_tasks,):
        raise ValueError(f"comm_slowdown has shape {sigma.shape}, expected ({g.n_tasks},)")
    res = simulate(g)
    on_cpu = np.array([r.kind == ResourceKind.CPU_THREAD for r in g.resources], bool)[g.resource]
    working = (g.kind == TaskKind.CPU) | (g.kind == TaskKind.RUNTIME)  # not SYNC: waiting needs no CPU
    helper_res = np.array([r.name in helper_threads for r in g.resources], bool)[g.resource]
    helpers = np.flatnonzero(on_cpu & working & helper_res & (g.dur_us > 0))
    wire = np.zeros(g.n_tasks) if comm_wire_us is None else np.asarray(comm_wire_us, dtype=np.float64)
    if wire.shape != (g.n_tasks,):
        raise ValueError(f"comm_wire_us has shape {wire.shape}, expected ({g.n_tasks},)")
    comm = np.flatnonzero(((cpu > 0) | (wire > 0) | (sigma > 1)) & (g.kind == TaskKind.COMM) & (g.dur_us > 0))
    if not comm.size and not helpers.size and corun_factor <= 1.0:
        return res
    victims = np.flatnonzero(on_cpu & working & ~helper_res & (g.dur_us > 0))
    base = g.dur_us
    for _ in range(rounds):
        cs, ce = res.start_us[comm], res.end_us[comm]
        d = ce - cs
        share = np.minimum(1.0, cpu[comm] / np.maximum(d, 1e-9))
        dur = stretched_us(res.start_us, base, cs, ce, share, victims)
        if helpers.size:  # a helper thread's task is CPU work for all of its span, and takes all of it
            hs, he = res.start_us[helpers], res.end_us[helpers]
            dur += stretched_us(res.start_us, base, hs, he, np.ones(helpers.size), victims, cap=1.0) - base
        if concentration > 1.0:  # the rank that sets the step loses ``concentration`` ranks' worth
            dur = base + concentration * (dur - base)
        if wire[comm].any():  # the shaped link's cost: already the step-setting rank's, charged once
            wire_share = np.minimum(1.0, wire[comm] / np.maximum(d, 1e-9))
            dur += stretched_us(res.start_us, base, cs, ce, wire_share, victims) - base
        dur += corun_extra_us(res.start_us, res.end_us, g.resource, victims, corun_factor)
        # during the B us of its span in which the compute threads are busy, a transfer progresses at
        # 1/sigma of its speed: it lasts base + B (1 - 1/sigma)
        busy = overlap_us(res.start_us, res.end_us, victims, np.full(victims.size, busy_share), comm)[comm]
        dur[comm] = base[comm] + busy * (1.0 - 1.0 / sigma[comm])
        res = simulate(g.with_columns(dur_us=dur))
    return res
