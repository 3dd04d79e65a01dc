"""Replay a task graph on its resources and report step times, breakdowns and the critical path.

    >>> from trainsim.simulate.engine import simulate
    >>> res = simulate(graph)                     # doctest: +SKIP
    >>> res.mean_step_ms, res.breakdown()         # doctest: +SKIP
    >>> res.to_chrome_trace("sim.json")           # doctest: +SKIP

A task starts when its resource is free and all its predecessors have finished (Daydream, Alg. 1),
each plus the lag of its edge (``TaskGraph.edge_lag_us``, e.g. the GPU's launch latency).
Resources with ``Policy.FIFO`` run their queue in order; ``Policy.PRIORITY`` resources pick the ready
task with the smallest ``priority``. The all-FIFO case is a longest-path pass (fast path); any
PRIORITY resource switches to discrete-event replay. Both loops are in ``kernels.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.errors import UserError
from trainsim.graph.ir import F64, I32, I64, Policy, ResourceKind, TaskGraph, TaskKind
from trainsim.simulate import kernels


@dataclass(frozen=True, slots=True)
class Prepared:
    """Flat arrays the replay loops consume; build once, replay many times (e.g. in a search)."""

    dur: F64
    next_res: I64  # the next task on the same resource, -1 for the last
    out_ptr: I64
    out_dst: I64
    out_lag: F64  # lag of each out-edge, aligned with out_dst
    indeg: I64  # explicit in-edges only (the event-driven loop)
    indeg_all: I32  # explicit in-edges plus the resource predecessor (the longest-path loop)
    sources: I64  # tasks with indeg_all == 0
    res_ptr: I64
    res_queue: I64
    res_is_prio: np.ndarray
    any_priority: bool


def prepare(g: TaskGraph) -> Prepared:
    """CSR adjacency and resource queues of ``g`` (vectorised, O(n log n))."""
    n = g.n_tasks
    q = g.queue_order()
    res_sorted = g.resource[q]
    prev_res = np.full(n, -1, np.int64)
    next_res = np.full(n, -1, np.int64)
    if n > 1:
        same = res_sorted[1:] == res_sorted[:-1]
        prev_res[q[1:][same]] = q[:-1][same]
        next_res[q[:-1][same]] = q[1:][same]
    counts = np.bincount(g.resource, minlength=len(g.resources))
    res_ptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    src = g.edge_src.astype(np.int64)
    dst = g.edge_dst.astype(np.int64)
    order = np.argsort(src, kind="stable")
    out_dst = dst[order]
    out_lag = np.ascontiguousarray(g.edge_lag_us[order], np.float64)
    out_ptr = np.concatenate(([0], np.cumsum(np.bincount(src, minlength=n)))).astype(np.int64)
    indeg = np.bincount(dst, minlength=n).astype(np.int64)
    indeg_all = (indeg + (prev_res >= 0)).astype(np.int32)
    prio = np.array([r.policy == Policy.PRIORITY for r in g.resources], np.bool_)
    return Prepared(
        dur=np.ascontiguousarray(g.dur_us, np.float64),
        next_res=next_res,
        out_ptr=out_ptr,
        out_dst=np.ascontiguousarray(out_dst),
        out_lag=out_lag,
        indeg=indeg,
        indeg_all=indeg_all,
        sources=np.flatnonzero(indeg_all == 0).astype(np.int64),
        res_ptr=res_ptr,
        res_queue=q,
        res_is_prio=prio,
        any_priority=bool(prio.any()),
    )


def simulate(g: TaskGraph, prepared: Prepared | None = None) -> SimResult:
    """Replay ``g``; raise ``UserError`` naming a task on a cycle if the graph has one."""
    g.validate()
    p = prepared or prepare(g)
    if p.any_priority:
        start, end, crit, done = kernels.replay_priority(
            p.dur,
            g.resource.astype(np.int64),
            p.res_ptr,
            p.res_queue,
            p.res_is_prio,
            np.ascontiguousarray(g.priority, np.float64),
            p.out_ptr,
            p.out_dst,
            p.out_lag,
            p.indeg,
        )
        if done < g.n_tasks:
            raise UserError(_cycle_message(g, end == 0, done))
    else:
        n = g.n_tasks
        start, end = np.empty(n), np.empty(n)
        crit, indeg, stack = np.empty(n, np.int64), np.empty(n, np.int32), np.empty(n, np.int64)
        done = kernels.replay_fifo(
            p.dur, p.next_res, p.out_ptr, p.out_dst, p.out_lag, p.indeg_all, p.sources,
            start, end, crit, indeg, stack,
        )  # fmt: skip
        if done < n:  # tasks never freed keep a positive in-degree
            raise UserError(_cycle_message(g, indeg > 0, done))
    return SimResult(graph=g, start_us=start, end_us=end, crit=crit)


def _cycle_message(g: TaskGraph, stuck_mask: np.ndarray, done: int) -> str:
    stuck = int(np.flatnonzero(stuck_mask)[0]) if stuck_mask.any() else 0
    return (
        f"{g.source}: the graph has a dependency cycle or a deadlock ({g.n_tasks - done} of {g.n_tasks} tasks "
        f"never became ready); first stuck: {g.describe(stuck)}"
    )


@dataclass(frozen=True, slots=True)
class SimResult:
    """Simulated start/end of every task, with step times, breakdown and critical path."""

    graph: TaskGraph
    start_us: F64
    end_us: F64
    crit: I64  # the predecessor (explicit or on the resource) whose end decided each start; -1 none

    @property
    def makespan_us(self) -> float:
        return float(self.end_us.max() - self.start_us.min()) if self.graph.n_tasks else 0.0

    # ---------------------------------------------------------------- steps
    def step_bounds_us(self) -> tuple[np.ndarray, F64, F64]:
        """``(step ids, simulated start, simulated end)`` of each step.

        With an anchor (the thread that carries ``ProfilerStep#N``), a step runs from the start of
        its first task on the anchor to the end of its last task there: the builder cuts the
        anchor's timeline at the step annotations, so this is what the annotation measures. Without
        an anchor, a step is the span of all its tasks.
        """
        g = self.graph
        ids = g.steps.ids if g.steps.ids.size else np.unique(g.step[g.step >= 0])
        ids = np.asarray(ids, np.int64)
        if ids.size == 0:
            return np.zeros(1, np.int64), np.array([self.start_us.min(initial=0.0)]), np.array([self.end_us.max(initial=0.0)])
        pos = np.searchsorted(ids, g.step)
        ok = (g.step >= 0) & (pos < ids.size)
        ok[ok] &= ids[pos[ok]] == g.step[ok]
        if g.steps.anchor >= 0:
            ok &= g.resource == g.steps.anchor
        t0 = np.full(ids.size, np.inf)
        t1 = np.full(ids.size, -np.inf)
        np.minimum.at(t0, pos[ok], self.start_us[ok])
        np.maximum.at(t1, pos[ok], self.end_us[ok])
        return ids, t0, t1

    @property
    def step_ms(self) -> F64:
        _, t0, t1 = self.step_bounds_us()
        return np.asarray((t1 - t0) / 1000.0, np.float64)

    @property
    def mean_step_ms(self) -> float:
        s = self.step_ms
        s = s[np.isfinite(s)]
        return float(s.mean()) if s.size else 0.0

    # ---------------------------------------------------------------- breakdown
    def breakdown(self) -> dict[str, float]:
        """Mean per step, in ms: step, compute, comm, exposed_comm, idle (device waits on the CPU or
        on nothing), and cpu (busy time of the busiest CPU thread). "Device" is the GPU streams when
        the graph has any, else the CPU threads."""
        g = self.graph
        _, t0, t1 = self.step_bounds_us()
        rkind = np.array([r.kind for r in g.resources], np.int8)[g.resource] if g.resources else g.kind
        has_gpu = bool((rkind == ResourceKind.GPU_STREAM).any())
        comm = g.kind == TaskKind.COMM
        if has_gpu:
            compute = (rkind == ResourceKind.GPU_STREAM) & ~comm
        else:
            compute = (rkind == ResourceKind.CPU_THREAD) & ~comm & (g.kind != TaskKind.SYNC)
        out = {"step_ms": 0.0, "compute_ms": 0.0, "comm_ms": 0.0, "exposed_comm_ms": 0.0, "idle_ms": 0.0}
        valid = np.isfinite(t0) & np.isfinite(t1)
        if not valid.any():
            return out
        for a, b in zip(t0[valid], t1[valid], strict=True):
            c = _union_len(self.start_us[compute], self.end_us[compute], a, b)
            m = _union_len(self.start_us[comm], self.end_us[comm], a, b)
            both = _union_len(
                np.concatenate((self.start_us[compute], self.start_us[comm])),
                np.concatenate((self.end_us[compute], self.end_us[comm])),
                a,
                b,
            )
            out["step_ms"] += (b - a) / 1e3
            out["compute_ms"] += c / 1e3
            out["comm_ms"] += m / 1e3
            out["exposed_comm_ms"] += (both - c) / 1e3
            out["idle_ms"] += (b - a - both) / 1e3
        k = float(valid.sum())
        return {key: v / k for key, v in out.items()}

    # ---------------------------------------------------------------- critical path
    def critical_path(self, step: int | None = None) -> I64:
        """Task ids on the critical path (first to last) ending at the last task to finish (of ``step``)."""
        g = self.graph
        if g.n_tasks == 0:
            return np.zeros(0, np.int64)
        cand = np.arange(g.n_tasks) if step is None else np.flatnonzero(g.step == step)
        if cand.size == 0:
            raise UserError(f"{g.source}: no task belongs to step {step}")
        t = int(cand[np.argmax(self.end_us[cand])])
        path = [t]
        while self.crit[t] >= 0 and len(path) <= g.n_tasks:
            t = int(self.crit[t])
            path.append(t)
        return np.array(path[::-1], np.int64)

    def critical_path_summary(self, step: int | None = None, top: int = 10) -> dict[str, Any]:
        """Time on the critical path by task kind and the names that take most of it."""
        g = self.graph
        path = self.critical_path(step)
        dur = self.end_us[path] - self.start_us[path]
        by_kind = {
            TaskKind(k).name.lower(): float(dur[g.kind[path] == k].sum() / 1e3) for k in np.unique(g.kind[path])
        }
        names = g.name[path]
        totals = np.bincount(names, weights=dur, minlength=len(g.symbols))
        best = np.argsort(totals)[::-1][:top]
        return {
            "tasks": int(path.size),
            "length_ms": float((self.end_us[path[-1]] - self.start_us[path[0]]) / 1e3),
            "by_kind_ms": by_kind,
            "top": [{"name": g.symbols[i], "ms": float(totals[i] / 1e3)} for i in best if totals[i] > 0],
        }

    # ---------------------------------------------------------------- export
    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write the simulated timeline as Chrome-trace JSON (opens in Perfetto / chrome://tracing)."""
        import orjson

        g = self.graph
        pid_of = {ResourceKind.CPU_THREAD: 1, ResourceKind.GPU_STREAM: 2, ResourceKind.COMM_CHANNEL: 3}
        labels = {1: "CPU threads (simulated)", 2: "GPU streams (simulated)", 3: "Comm channels (simulated)"}
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": label}}
            for p, label in labels.items()
        ]
        for i, r in enumerate(g.resources):
            events.append({"ph": "M", "name": "thread_name", "pid": pid_of[r.kind], "tid": i, "args": {"name": r.name}})
        sym = g.symbols
        kinds = [k.name.lower() for k in TaskKind]
        rpid = [pid_of[r.kind] for r in g.resources]
        start, dur = self.start_us.tolist(), (self.end_us - self.start_us).tolist()
        for t, (res, nm, kd, st, lay) in enumerate(
            zip(g.resource.tolist(), g.name.tolist(), g.kind.tolist(), g.step.tolist(), g.layer.tolist(), strict=True)
        ):
            ev: dict[str, Any] = {
                "ph": "X", "name": sym[nm], "cat": kinds[kd], "pid": rpid[res], "tid": res,
                "ts": start[t], "dur": dur[t], "args": {"task": t, "step": st},
            }  # fmt: skip
            if lay >= 0:
                ev["args"]["layer"] = sym[lay]
            events.append(ev)
        out = Path(path)
        out.write_bytes(orjson.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
        return out


def _union_len(s: F64, e: F64, a: float, b: float) -> float:
    """Length of the union of intervals [s, e) clipped to [a, b)."""
    s = np.clip(s, a, b)
    e = np.clip(e, a, b)
    keep = e > s
    if not keep.any():
        return 0.0
    s, e = s[keep], e[keep]
    o = np.argsort(s, kind="stable")
    s, e = s[o], np.maximum.accumulate(e[o])
    # a new merged interval starts where s exceeds the running max end of everything before it
    new = np.ones(s.size, np.bool_)
    new[1:] = s[1:] > e[:-1]
    idx = np.flatnonzero(new)
    ends = np.append(e[idx[1:] - 1], e[-1])
    return float((ends - s[idx]).sum())


Replay = Callable[[TaskGraph], SimResult]
"""``replay(graph) -> SimResult``: ``simulate`` itself, or a fixed-point loop of replays around it for
effects beyond fixed durations (what prediction functions take as ``replay=``)."""
