"""The replay loops, compiled with numba (plain Python when numba is missing: same results, slower).

Both loops take flat arrays only (CSR adjacency), so they never touch a Python object per task.

``replay_fifo``: every resource runs its queue strictly in order, so the schedule is a longest-path
computation over the DAG of explicit edges plus queue-neighbour edges, in any topological order
(Kahn's algorithm with a stack): O(tasks + edges). An explicit edge delivers its source's end plus
its lag (``out_lag``, >= 0); queue-neighbour edges have none.

``replay_priority``: some resources pick, whenever they fall idle, the ready task with the smallest
``(priority, queue position)``; this needs real discrete-event simulation in time order. Events are
heap entries ``(time, seq, task)`` with a sequence-number tie break, so runs are deterministic.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

F = TypeVar("F", bound=Callable[..., Any])

try:  # numba is a declared dependency; the fallback keeps the core usable where it cannot install
    from numba import njit as _njit

    HAVE_NUMBA = True

    def jit(fn: F) -> F:
        compiled: F = _njit(cache=True, nogil=True)(fn)  # type: ignore[assignment]
        return compiled

except ImportError:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

    def jit(fn: F) -> F:
        return fn


@jit
def replay_fifo(dur, next_res, out_ptr, out_dst, out_lag, indeg_all, sources, start, end, crit, indeg, stack):
    """Fill ``start``/``end`` of every task and ``crit``, the predecessor that decided its start (-1 none).

    ``indeg_all`` counts explicit edges plus the resource predecessor; ``sources`` are the tasks
    without any. ``start``, ``end``, ``crit``, ``indeg`` and ``stack`` are caller-allocated (numpy's
    allocator reuses memory and asks for huge pages; allocating here cost a page fault per 4 KiB
    on large graphs). Returns the number of tasks done; fewer than ``n`` means a cycle.
    """
    n = dur.shape[0]
    for i in range(n):
        crit[i] = -1
        indeg[i] = indeg_all[i]
    top = 0
    # push in reverse so that, among initially free tasks, low ids come off the stack first
    for s in range(sources.shape[0] - 1, -1, -1):
        i = sources[s]
        start[i] = 0.0
        stack[top] = i
        top += 1
    done = 0
    while top > 0:
        top -= 1
        i = stack[top]
        e = start[i] + dur[i]
        end[i] = e
        done += 1
        j = next_res[i]
        if j >= 0:  # as an explicit edge's arrival below: one jitted helper for both was not inlined, 1.4x slower
            # the first predecessor to arrive sets start; later ones only if strictly later
            if crit[j] < 0 or e > start[j]:
                start[j] = e
                crit[j] = i
            indeg[j] -= 1
            if indeg[j] == 0:
                stack[top] = j
                top += 1
        for k in range(out_ptr[i], out_ptr[i + 1]):
            j = out_dst[k]
            ej = e + out_lag[k]
            if crit[j] < 0 or ej > start[j]:
                start[j] = ej
                crit[j] = i
            indeg[j] -= 1
            if indeg[j] == 0:
                stack[top] = j
                top += 1
    return done


@jit
def replay_priority(
    dur, res, res_ptr, res_queue, res_is_prio, priority, out_ptr, out_dst, out_lag, indeg_explicit
):
    """Discrete-event replay where PRIORITY resources choose among ready tasks.

    ``res_queue[res_ptr[r]:res_ptr[r+1]]`` is resource r's queue in order. FIFO resources run their
    queue head once its explicit predecessors are done; PRIORITY resources run the ready task with the
    smallest (priority, queue position) among those whose lagged inputs have arrived (``ready_at <= now``);
    when the others arrive later, a wake-up event (task ``-1 - r``) calls the resource back then.
    Returns ``(start, end, crit, n_done)``.
    """
    n = dur.shape[0]
    n_res = res_ptr.shape[0] - 1
    start = np.zeros(n)
    end = np.zeros(n)
    ready_at = np.zeros(n)
    crit = np.full(n, -1, np.int64)
    pending = indeg_explicit.copy()
    head = res_ptr[:-1].copy()  # FIFO: next queue slot; PRIORITY: first slot not yet started
    started = np.zeros(n, np.bool_)
    busy = np.zeros(n_res, np.bool_)
    last_on_res = np.full(n_res, -1, np.int64)
    free_at = np.zeros(n_res)
    events = [(0.0, np.int64(0), np.int64(-1))]
    events.pop()
    seq = 0
    done = 0
    now = 0.0
    touched = np.zeros(n_res, np.bool_)
    touched[:] = True
    while True:
        # dispatch every idle touched resource at time `now`
        for r in range(n_res):
            if not touched[r] or busy[r]:
                continue
            touched[r] = False
            pick = -1
            if res_is_prio[r]:
                best_p = np.inf
                wake = np.inf
                # skip started tasks at the front
                while head[r] < res_ptr[r + 1] and started[res_queue[head[r]]]:
                    head[r] += 1
                for q in range(head[r], res_ptr[r + 1]):
                    t = res_queue[q]
                    if not started[t] and pending[t] == 0:
                        if ready_at[t] > now:
                            wake = min(wake, ready_at[t])
                        elif priority[t] < best_p:
                            best_p = priority[t]
                            pick = t
                if pick < 0 and wake < np.inf:
                    seq += 1
                    heapq.heappush(events, (wake, np.int64(seq), np.int64(-1 - r)))
            elif head[r] < res_ptr[r + 1]:
                t = res_queue[head[r]]
                if pending[t] == 0:
                    pick = t
                    head[r] += 1
            if pick >= 0:
                s = now
                if ready_at[pick] > s:
                    s = ready_at[pick]
                start[pick] = s
                if last_on_res[r] >= 0 and free_at[r] >= ready_at[pick]:
                    crit[pick] = last_on_res[r]
                end[pick] = s + dur[pick]
                started[pick] = True
                busy[r] = True
                last_on_res[r] = pick
                seq += 1
                heapq.heappush(events, (end[pick], np.int64(seq), np.int64(pick)))
        if len(events) == 0:
            break
        now, _, t = heapq.heappop(events)
        batch = [t]
        while len(events) > 0 and events[0][0] == now:
            batch.append(heapq.heappop(events)[2])
        for t in batch:
            if t < 0:  # a wake-up: lagged inputs have arrived at a PRIORITY resource
                touched[-1 - t] = True
                continue
            done += 1
            r = res[t]
            busy[r] = False
            free_at[r] = now
            touched[r] = True
            for k in range(out_ptr[t], out_ptr[t + 1]):
                j = out_dst[k]
                pending[j] -= 1
                e = end[t] + out_lag[k]
                if e >= ready_at[j]:
                    ready_at[j] = e
                    crit[j] = t
                if pending[j] == 0:
                    touched[res[j]] = True
    return start, end, crit, done
