"""Waits between CPU threads: untraced stretches that end when work on another thread ends.

    >>> from trainsim.graph import cpuwaits
    >>> cpuwaits.clip_late_ends(plans, anchor_key, inside)                        # doctest: +SKIP
    >>> edges = cpuwaits.chain_collectives(plans, anchor_key)                     # doctest: +SKIP
    >>> waits = cpuwaits.find_waits(plans, anchor_key, spawns, inside)            # doctest: +SKIP
    >>> starts = cpuwaits.inside_starts(plans, inside)                            # doctest: +SKIP

The builder (``graph/build.py``, step 4) calls these on its thread plans, after ``_plan_threads``:

1. **Collectives run in order.** The CPU collectives (gloo) of one process group run on gloo's worker
   threads, which may overlap: two buckets then share the link. ``chain_collectives`` orders them by
   start and makes each one wait for the one that ended last before it ends (a ``COMM`` edge); a
   collective that started while that one still ran starts, in the graph, where it ended (its traced
   start is moved there), so the link is busy with one collective at a time and a replay of the
   traced graph keeps every traced end. A faster or slower link then moves the whole chain.
2. **Waits are dependencies.** An untraced stretch on the anchor thread (a ``gap``, the own time of a
   range that is not an operator, such as ``ProfilerStep#N`` or ``enumerate(DataLoader)#...``, or of
   an operator that waits by name: ``wait``, ``barrier``, ``backward``, ``__next__`` ...) that ends
   shortly (``WAIT_TAIL_US``) after a task on another thread ends is a wait for that task: DDP's reducer in
   ``work.wait()`` for a gloo all-reduce, the main thread for autograd's backward thread, a data loader
   for its pin-memory thread. ``find_waits`` returns, per such stretch, the part kept as work (until
   the waited-for burst started) and the tail after the task ended (the wake-up and finalisation), which
   the builder turns into a ``SYNC`` task that depends on the task. The time between is derived from
   the edges. Stretches already split by a burst that runs entirely inside them (``inside``) are left
   to the builder's own rule.
3. **Late ends.** gloo wakes the waiting thread before it closes its range; a descheduled worker
   closes it after the waiter resumed. ``clip_late_ends`` ends such a collective where the stretch
   that waited for it ended (before step 1, so that the chain sees the real ends).
4. **Inside bursts that continue a run.** ``inside_starts`` tells the builder where the anchor began
   waiting in a segment that a burst runs inside of: at the start of the other thread's busy run,
   which may have begun before the segment (autograd's thread starting while the main thread's last
   forward op ran, then continuing inside the main thread's wait).
"""

from __future__ import annotations

import bisect
import functools
import operator
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainsim.graph.ir import TaskKind

WAIT_TAIL_US = 2000.0
"""A stretch waits for a task on another thread when it ends at most this long after that task (or
``WAIT_TAIL_FRAC`` of the time it waited, if more, up to ``WAIT_LATE_US``): the wake-up and the work
after it. On the 2-core host of the gloo traces the tails were 0.09-0.42 ms (mlp DDP over 2 ranks,
torch 2.13, issue 46), and 4.8 ms after an 883 ms wait while other jobs loaded the host."""

WAIT_TAIL_FRAC = 0.05

WAIT_MIN_US = 50.0
"""...and only when it waited at least this long, and longer than its tail: a short gap between two
operators in which another thread's task happens to end is no wait."""

WAIT_LATE_US = 10_000.0
"""A gloo worker marks the work done (the waiting thread wakes) before it closes its
``gloo:all_reduce`` range, and on a busy host it may be descheduled in between: up to 5.3 ms in the
traces of issue 46. A stretch that waited for a collective which ends at most this long after the
stretch ends, and no other task's end explains, waited for it: the collective ends, in the graph,
where the stretch ends (``clip_late_ends``)."""

WAIT_OP_RX = re.compile(r"(^|[:._ ])(wait|wait_tensor|barrier|synchronize|backward|join|get|__next__)$", re.I)
"""Operators whose own time is waiting (their name says so: ``c10d::barrier``, ``aten::backward``,
``_c10d_functional::wait_tensor``; not ``AddmmBackward0``)."""

GAP = "gap"

Key = tuple[Any, Any]

_CPU, _COMM = int(TaskKind.CPU), int(TaskKind.COMM)  # plain ints: an enum member lookup costs ~0.1 us per task
_first = operator.itemgetter(0)


@dataclass(frozen=True, slots=True)
class Wait:
    """An anchor segment that waits for a task on another thread (see the module docstring, step 2)."""

    pre_us: float  # work kept at the start of the stretch (until the waited-for burst began), µs
    tail_us: float  # from the waited-for task's end to the stretch's end (the SYNC task), µs
    thread: Key  # thread of the waited-for task
    task: int  # its index in that thread's plan


def chain_collectives(plans: dict[Key, list[Any]], anchor_key: Key | None) -> list[tuple[Key, int, Key, int]]:
    """``(thread, index, thread, index)`` edges that run each process group's CPU collectives in order.

    Only the collectives on threads other than the anchor (gloo's workers) are chained; a collective
    that started before its predecessor ended has its start (``t0``) moved to that end (module doc,
    step 1). Returns the edges; the plans are changed in place.
    """
    by_group: dict[str | None, list[tuple[Key, int]]] = {}
    for k, plan in plans.items():
        if k == anchor_key:
            continue
        for i, s in enumerate(plan):
            if s.kind == _COMM:
                by_group.setdefault(s.group, []).append((k, i))
    edges: list[tuple[Key, int, Key, int]] = []
    for members in by_group.values():
        members.sort(key=lambda m: (plans[m[0]][m[1]].t0, plans[m[0]][m[1]].t1))
        done_t: list[float] = []  # ends of the collectives before, sorted
        done: list[tuple[Key, int]] = []  # (thread, index) of each, in the same order
        for k, i in members:
            s = plans[k][i]
            j = bisect.bisect_right(done_t, s.t1) - 1  # the one that ended last before s ends
            if j >= 0:
                pk, pi = done[j]
                if pk != k:  # on the same thread, program order already says so
                    edges.append((pk, pi, k, i))
                s.t0 = min(max(s.t0, done_t[j]), s.t1)
            at = bisect.bisect_right(done_t, s.t1)
            done_t.insert(at, s.t1)
            done.insert(at, (k, i))
    return edges


def clip_late_ends(plans: dict[Key, list[Any]], anchor_key: Key | None, inside: dict[int, Any]) -> int:
    """End collectives whose range closed late where the stretch that waited for them ended.

    For each anchor stretch that may wait (``find_waits``) and in which no other thread's task ends
    within ``WAIT_TAIL_US`` of its end, a ``COMM`` task on another thread that runs through most of
    the stretch and ends at most ``WAIT_LATE_US`` (and the stretch's length) after it is cut at the
    stretch's end; the late part joins the worker's next gap if that began at the late end (else the
    worker's timeline keeps a hole there). Call before ``chain_collectives``.
    Returns how many were cut.
    """
    if anchor_key is None:
        return 0
    # the collectives among the tasks _ends lists, by end (most traces have none: then nothing to do)
    comm = sorted(((s.t1, k, i) for k, plan in plans.items() if k != anchor_key
                   for i, s in enumerate(plan) if s.kind == _COMM and s.name != GAP and s.t1 > s.t0),
                  key=_first)  # fmt: skip
    if not comm:
        return 0
    _, end_t = _ends(plans, anchor_key)
    comm_t = [e[0] for e in comm]
    cut = 0
    for idx, w in enumerate(plans[anchor_key]):
        if w.t1 - w.t0 < WAIT_MIN_US or idx in inside or w.kind != _CPU or not _may_wait(w):
            continue
        j = bisect.bisect_right(end_t, w.t1) - 1
        if j >= 0 and end_t[j] > w.t0 and _short_tail(w.t1 - end_t[j], end_t[j] - w.t0):
            continue  # a task that ended inside explains the end of the stretch
        late = min(WAIT_LATE_US, w.t1 - w.t0)
        c = bisect.bisect_right(comm_t, w.t1)
        if c >= len(comm) or comm_t[c] > w.t1 + late:
            continue
        _, k, i = comm[c]
        s = plans[k][i]
        if s.t0 - w.t0 > (w.t1 - w.t0) / 2 or s.t1 <= w.t1:
            continue  # it did not run through most of the stretch, or was cut at an earlier one
        old_end, s.t1 = s.t1, w.t1
        nxt = plans[k][i + 1] if i + 1 < len(plans[k]) else None
        if nxt is not None and nxt.name == GAP and abs(nxt.t0 - old_end) < 1e-3:
            nxt.t0 = s.t1  # the gap that began at the late end begins where the collective now ends
        cut += 1
    return cut


def _ends(plans: dict[Key, list[Any]], anchor_key: Key) -> tuple[list[tuple[float, Key, int]], list[float]]:
    """``(end, thread, index)`` of every task on the other threads, by end, and the ends alone."""
    ends = [(s.t1, k, i) for k, plan in plans.items() if k != anchor_key
            for i, s in enumerate(plan) if s.name != GAP and s.t1 > s.t0]  # fmt: skip
    ends.sort(key=_first)
    return ends, list(map(_first, ends))


def find_waits(
    plans: dict[Key, list[Any]],
    anchor_key: Key | None,
    spawns: list[tuple[int, Key, int, bool]],
    inside: dict[int, Any],
    tail_us: float = WAIT_TAIL_US,
) -> dict[int, Wait]:
    """The anchor segments that wait for a task on another thread, by index (module doc, step 2)."""
    if anchor_key is None:
        return {}
    ends, end_t = _ends(plans, anchor_key)
    if not ends:
        return {}
    starts: dict[Key, list[int]] = {}  # first index of each burst, by thread
    for _, k, gap_idx, _ in spawns:
        starts.setdefault(k, []).append(gap_idx + 1)
    for v in starts.values():
        v.sort()
    out: dict[int, Wait] = {}
    for idx, w in enumerate(plans[anchor_key]):
        # a stretch shorter than WAIT_MIN_US cannot have waited that long
        if w.t1 - w.t0 < WAIT_MIN_US or idx in inside or w.kind != _CPU or not _may_wait(w):
            continue
        j = bisect.bisect_right(end_t, w.t1) - 1
        if j < 0 or end_t[j] <= w.t0 or not _short_tail(w.t1 - end_t[j], end_t[j] - w.t0, tail_us):
            continue
        _, k, i = ends[j]
        first = starts.get(k, [])
        b = bisect.bisect_right(first, i) - 1
        burst_t0 = plans[k][first[b]].t0 if b >= 0 else plans[k][i].t0
        pre = min(max(0.0, burst_t0 - w.t0), end_t[j] - w.t0)
        waited, tail = end_t[j] - w.t0 - pre, w.t1 - end_t[j]
        if waited < max(WAIT_MIN_US, tail):
            continue
        out[idx] = Wait(pre_us=pre, tail_us=tail, thread=k, task=i)
    return out


def inside_starts(plans: dict[Key, list[Any]], inside: dict[int, list[tuple[Key, int, int]]]) -> dict[int, float]:
    """Where the anchor began to wait in each segment that bursts run inside of (``inside``).

    The builder keeps the part of such a segment before its first burst as work. But when the thread
    of a burst was busy right up to the burst (its previous task ended at most ``WAIT_MIN_US`` before
    it, and the burst's gap began there, not at the anchor task that started it), the
    burst continues that work, split off only because the anchor's segment began in between: the
    anchor waited from the start of the whole run. Returns, per anchor index, the start of the
    earliest such run (the first burst's start when there was no run before it; a time before the
    segment's start means it kept no work part).
    """
    out: dict[int, float] = {}
    for idx, bursts in inside.items():
        t = np.inf
        for k, gap_idx, _ in bursts:
            plan = plans[k]
            i = gap_idx + 1  # the burst's first task; walk back while the thread was busy
            while i >= 1:
                before = plan[i - 1]
                if before.name != GAP:
                    i -= 1
                elif (before.t1 - before.t0 <= WAIT_MIN_US and i >= 2 and plan[i - 2].name != GAP
                      and plan[i - 2].t1 >= before.t0):  # fmt: skip
                    i -= 2  # a short pause right after the thread's previous task
                else:
                    break
            t = min(t, plan[i].t0)
        out[idx] = float(t)
    return out


def _short_tail(tail: float, waited: float, tail_us: float = WAIT_TAIL_US) -> bool:
    """Whether a stretch that ends ``tail`` after another thread's task, ``waited`` into it, woke for it."""
    return tail <= max(tail_us, min(WAIT_TAIL_FRAC * waited, WAIT_LATE_US))


def _may_wait(s: Any) -> bool:
    """Untraced time, a range that is no operator, or an operator that waits by name."""
    return s.name == GAP or s.op is None or _waits_by_name(s.name)


@functools.lru_cache(maxsize=65536)
def _waits_by_name(name: str) -> bool:
    return WAIT_OP_RX.search(name) is not None
