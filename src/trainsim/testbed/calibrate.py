"""Measure real gloo all-reduce times with torch.distributed and fit the alpha-beta constants.

    >>> from trainsim.testbed.calibrate import calibrate
    >>> cal = calibrate(world=2, rate_mbit=100, delay_ms=2, max_bytes=4 << 20)   # doctest: +SKIP
    >>> cal.link.bw_gbyte_s, cal.link.latency_us                                     # doctest: +SKIP

Algorithm:
1. start ``world`` gloo processes (``trainsim.testbed.launch``), each in its own network namespace
   joined by links shaped to ``rate_mbit``/``delay_ms`` (``trainsim.testbed.netns``), or on loopback
   when no shaping is asked for or namespaces cannot be made;
2. for sizes from 1 KiB up to ``max_bytes`` (x4 apart) time all-reduces (each after a barrier,
   warm-up discarded): ``reps`` of them, then more until about ``budget_s`` of all-reduce time per
   size (at most ``calibrate_worker.MAX_REPS``), in ``ROUNDS`` interleaved rounds over the sizes (a load burst on the
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
between computations (``calibrate_host.post_pass``, ``Calibration.busy_post_us``): on a host whose cores all
compute, a post now and then waits for gloo's network thread, itself waiting for a core.

The returned ``Calibration`` holds the measured points, the fit and a catalog-style ``Link`` whose
predictions are what the what-ifs and ``validate dp`` use.

The modules, by what they do: this one launches the ranks on this host and builds the record,
``cluster.calibration`` (``Calibration``, what its readers need); ``calibrate_worker`` is one rank's
process and times the link's collectives (steps 1-2); ``calibrate_host`` measures the test host (CPU per
operation, co-running computation, posting on a busy host, scheduling settings); ``cluster.calibrate_fit``
fits the times (steps 3-4), without processes. The record and the fit are the cluster model's; what
runs processes here is the test bed's.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from trainsim.cluster.calibrate_fit import (
    KNEE_WINDOW,
    STEP_LEVELS,
    default_sizes,
    fit_knee_kept,
    fit_model,
    knee_sizes,
    knee_us,
    measured_knee,
    residual_ratios,
    ring_link,
    round_mean,
    sizes_around,
    step_sizes,
)
from trainsim.cluster.calibration import Calibration
from trainsim.errors import UserError
from trainsim.testbed.calibrate_worker import ROUNDS

Launched = tuple[list[int], dict[str, Any]]  # a launch of some sizes: those sizes, and rank 0's result


ROUNDS_PER_S = 20  # launches after the first with a time per size of their own: rounds per second of it
LAUNCH_MAX_BYTES = 256 << 10  # sizes measured in every launch when ``calibrate(launches=...)`` > 1
FLOOR_MAX_US = 1000.0  # ``floor_launches`` measure the sizes whose first launch read under this


def calibrate(
    *, max_bytes: int = 16 << 20, min_bytes: int = 1024, sizes: list[int] | None = None, **options: Any
) -> Calibration:
    """Measure and fit one calibration (see the module docstring): the all-reduce at ``sizes`` (default
    ``default_sizes(max_bytes, min_bytes)``), with ``calibrate_interleaved``'s options (``world``,
    ``rate_mbit``, ``delay_ms``, ``reps``, ``budget_s``, ``net``, ``allgather_sizes``, ``p2p_sizes``,
    ``realtime``, ``pin``, ``launches`` ...; documented there)."""
    return calibrate_interleaved([sizes or default_sizes(max_bytes, min_bytes)], **options)[0]


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
    """Independent calibrations, one per list of ``size_sets`` (each its own processes, its own fit).
    ``net``: an open ``Netns`` to reuse; ``allgather_sizes``: per-rank sizes at which to time the hook's
    all-gather too (``trainsim.run.casync.all_gather_bytes``; >= 2 sizes); ``p2p_sizes``: sizes at which
    to time one-way sends and simultaneous exchanges (>= 2 sizes, an even number of ranks);
    ``realtime``: run every thread of the ranks in the real-time class (see ``calibrate_host.realtime``);
    the pass that measures interference with computation is skipped then; ``pin``: keep each rank's
    threads on one core of its own (rank modulo the cores; see ``calibrate_host.pin``); ``launches``:
    measure the all-reduces of up to ``LAUNCH_MAX_BYTES`` in this many launches of new processes and
    keep, per size, the median of the launches (where the ranks' threads land changes the
    sub-millisecond times from one launch to the next; the other measurements come from the first
    launch). The calibrations' launches take turns: each one's first launch, then the further launches of the small sizes
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
    05:40: a 181 MiB check read 9.50 ms/MiB, the other large sizes 9.02-9.08)."""
    from trainsim.testbed.launch import run_json
    from trainsim.testbed.netns import Netns, NetnsUnavailable, netns_unavailable

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
    small_budget = budget_s if small_budget_s is None else small_budget_s
    if small_rounds is None:
        small_rounds = ROUNDS if small_budget_s is None else max(ROUNDS, round(ROUNDS_PER_S * small_budget_s))
    runs = []  # per calibration: (sizes, the first launch's worker config, the small sizes, their config)
    for sizes in size_sets:
        args = {"sizes": list(sizes), "reps": reps, "budget_s": budget_s, "allgather_sizes": ag_sizes,
                "p2p_sizes": pp_sizes, "realtime": realtime, "pin": pin}  # fmt: skip
        small = [x for x in sizes if x <= LAUNCH_MAX_BYTES] if launches > 1 else []
        # the further launches: one repetition per round at least (their budget sets the count): at
        # +5 ms a round's five repetitions, each after a barrier, took 8 s per size where 1 s was asked
        runs.append((list(sizes), args, small, {**args, "sizes": small, "reps": 1, "budget_s": small_budget,
                                                "allgather_sizes": [], "p2p_sizes": [], "rounds": small_rounds}))

    def launch(cfg: dict[str, Any], n: Any) -> dict[str, Any]:
        """One launch of the worker: rank 0's result."""
        return dict(run_json(world, "trainsim.testbed.calibrate_worker", cfg, net=n, timeout_s=timeout_s)[0])

    def go(n: Any) -> list[tuple[dict[str, Any], list[dict[str, Any]], list[Launched], list[Launched]]]:
        """Per calibration: its first launch, its further launches, its floor launches (each with
        its sizes: the floor sizes and the step sizes found so far) and its launches of the large sizes."""
        firsts = [launch(args, n) for _, args, _, _ in runs]
        meds = [_launch_means(f) for f in firsts]
        window: list[tuple[float, float, float] | None] = [None for _ in runs]  # (lo, hi, b) around the knee
        if launches > 1:  # the further launches also measure sizes around the first launch's knee
            for i, ((sizes, args, small, small_args), med) in enumerate(zip(runs, meds, strict=True)):
                if knee is not None and not knee[i]:
                    continue
                fit, _ = fit_knee_kept(np.array(sizes, dtype=float), np.array(med))
                extra = [x for x in knee_sizes(fit, min(sizes), LAUNCH_MAX_BYTES) if x not in sizes]
                c = None if extra else measured_knee(sizes, med, fit[1])
                if c is not None:  # the fit placed none where the times bend (``measured_knee``)
                    extra = [x for x in sizes_around(c, min(sizes), LAUNCH_MAX_BYTES) if x not in sizes]
                centre = c if c is not None else (fit[2] / fit[1] if fit[1] > 0 else 0.0)
                if extra and centre > 0:
                    window[i] = (KNEE_WINDOW[0] * centre, KNEE_WINDOW[1] * centre, fit[1])
                if extra:
                    small = sorted(small + extra)
                    runs[i] = (sizes, args, small, {**small_args, "sizes": small})
        more: list[list[dict[str, Any]]] = [[] for _ in runs]
        big_more: list[list[Launched]] = [[] for _ in runs]
        bigs = [[x for x in sizes if x > LAUNCH_MAX_BYTES] for sizes, _, _, _ in runs]
        big_args = [{**args, "sizes": big, "allgather_sizes": [], "p2p_sizes": []} for big, (_, args, _, _) in
                    zip(bigs, runs, strict=True)]  # fmt: skip
        big_at = _spread(big_launches, launches - 1)
        for r in range(launches):
            for _ in range(big_at.count(r)):  # the launches of the sizes above LAUNCH_MAX_BYTES due here
                for i, (big, ba) in enumerate(zip(bigs, big_args, strict=True)):
                    if big:
                        big_more[i].append((big, launch(ba, n)))
            if r == launches - 1:
                break
            for i, (_, _, small, small_args) in enumerate(runs):
                if small:
                    more[i].append(launch(small_args, n))
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
                        floor_more[i].append((list(fl), launch({**small_args, "sizes": list(fl)}, n)))
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
    sizes: list[int], small: list[int], first: dict[str, Any], more: list[dict[str, Any]], *, world: int,
    rate_mbit: float | None, delay_ms: float, where: str, notes: list[str], ag_sizes: list[int],
    pp_sizes: list[int], realtime: bool, pin: bool, floor_runs: Sequence[Launched] = (),
    big_runs: Sequence[Launched] = (),
) -> Calibration:  # fmt: skip
    """One ``Calibration`` from its workers' results (rank 0's): the first launch ``first``, the further
    launches ``more`` of the ``small`` sizes, ``floor_runs``: the floor launches, each as (its sizes,
    its output), whose sizes not among ``sizes`` are the ``step_sizes``, and ``big_runs``: the launches
    of the sizes above ``LAUNCH_MAX_BYTES``, the same way."""
    data = first
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
    (a, b, floor, b0), kept = fit_knee_kept(np.array(sizes), np.array(med))
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
        link=ring_link(max(float(knee_us(0.0, a, b, floor, b0)), 0.0), b, world),
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
    sizes: list[int], first_med: list[float], small: list[int], more: list[dict[str, Any]],
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


def _launch_means(out: dict[str, Any]) -> list[float]:
    """Per size of a launch's result (rank 0's): its time, ``round_mean`` of its rounds."""
    return [round_mean(r) for r in out["rounds_us"]]
