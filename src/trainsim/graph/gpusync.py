"""GPU waits: which CPU calls wait for which GPU tasks, and when a GPU task may start (build step 3).

    >>> from trainsim.graph.build import load_trace
    >>> from trainsim.graph.gpusync import fixed_wait_ms_per_step
    >>> g = load_trace("../shared/traces/v100_single_rank0.json.gz")   # doctest: +SKIP
    >>> fixed_wait_ms_per_step(g)                                      # doctest: +SKIP
    {'untraced time on the step thread': 0.29, 'runtime call, blocking not attributed': 0.0, ...}

A call that waits for the GPU must not keep the length of its wait, or a what-if that changes the GPU
cannot move the CPU. So every waiting call keeps only its own *cost* and gets a dependency on the GPU
task that released it:

1. **Call cost.** The median duration of the trace's calls of the same name that did not block (a
   blocked call's duration is mostly waiting). Launch-type calls without such a sample use the median
   over all launch calls that did not block; synchronize calls without one cost 0.
2. **Launch queue.** CUDA queues at most about a thousand launches per device; launch ``i`` (in launch
   order on its device) then returns only after the GPU task launched ``Q`` launches earlier has
   finished. ``Q`` is read from the trace (the number of launches outstanding when the long launch
   calls started, where they cluster), else CUDA's default of 1024. Every launch gets the edge; one
   that blocked keeps only its cost.
3. **Blocking copies** (``cudaMemcpy``, ``cudaMemcpyAsync`` to or from pageable memory): the call keeps
   its cost, then a ``SYNC`` task waits for its copy; the ``SYNC`` task's own duration is the return
   latency after the copy ended. The copy waits for its stream and its launch.
4. **Synchronize calls**, whether or not they blocked in the trace: ``cudaDeviceSynchronize`` waits for
   the last task launched on every stream of the device; ``cudaStreamSynchronize`` for the last one on
   its stream (the stream from Kineto's ``cuda_sync`` event of the same correlation id, else the stream
   it demonstrably waited for, else every stream of the device); ``cudaEventSynchronize`` and the last
   call of a ``cudaEventQuery`` spin for the task recorded by the thread's latest ``cudaEventRecord`` (the
   last task that thread launched before it). A call that blocked is split into its cost and a ``SYNC``
   task, as in 3; one that did not simply starts after its dependencies.
5. **Allocator** (``cudaMalloc``, ``cudaFree`` ...): treated as a device synchronize where the trace shows
   that it blocked (the last task on a stream of the device ended inside the call).
6. **Stream waits.** ``cudaStreamWaitEvent`` becomes a GPU->GPU edge from the last task launched
   before the matching ``cudaEventRecord`` to the next task launched after the wait.
7. **Launch latency.** A GPU task starts no earlier than its launch call's end plus the device's launch
   latency: the median, over tasks that started on an idle stream, of (task start - launch end). The
   ``LAUNCH`` edge carries it as its lag (never more than the task's traced start minus the modelled
   launch end, so an untransformed replay is not delayed by it). Likewise a task queued behind another
   on its stream starts no earlier than the device's median gap between back-to-back tasks after it
   (an explicit ``STREAM`` edge with that lag; on the V100 trace ~0.8 us, 1 % of a GPU-bound step).

What the builder cannot split into work and wait stays a fixed duration; ``fixed_wait_ms_per_step``
says how much of each step that is.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from trainsim.capture.kineto import STEP_RX, Event
from trainsim.graph.ir import GAP, EdgeKind, GraphBuilder, ResourceKind, TaskGraph, TaskKind

DEVICE_SYNC_RX = re.compile(r"^(cuda|hip)DeviceSynchronize$|^cuCtxSynchronize$")
STREAM_SYNC_RX = re.compile(r"^(cuda|hip)StreamSynchronize$|^cuStreamSynchronize$")
EVENT_SYNC_RX = re.compile(r"^(cuda|hip)EventSynchronize$|^cuEventSynchronize$")
EVENT_QUERY_RX = re.compile(r"^(cuda|hip)EventQuery$|^cuEventQuery$")
EVENT_RECORD_RX = re.compile(r"^(cuda|hip)EventRecord(WithFlags)?$|^cuEventRecord")
STREAM_WAIT_RX = re.compile(r"^(cuda|hip)StreamWaitEvent$|^cuStreamWaitEvent$")
SYNC_COPY_RX = re.compile(r"^(cuda|hip)Memcpy(2D|3D)?$|^cuMemcpy(DtoH|HtoD|DtoD)?(_v2)?$")
COPY_RX = re.compile(r"^(cuda|hip|cu)Memcpy")
ALLOC_RX = re.compile(
    r"^(cuda|hip)(Malloc|Free|MallocHost|FreeHost|HostAlloc|MallocManaged)$|^cuMem(Alloc|Free)"
)
DEFAULT_QUEUE_DEPTH = 1024  # CUDA's launch queue; the V100 trace in ../shared/traces shows 1022
MIN_QUEUE_DEPTH = 64  # fewer outstanding launches at a long call is not a full queue (it is something else)
SPIN_GAP_US = 20.0  # consecutive cudaEventQuery calls closer than this are one polling loop
SPIN_MIN_CALLS = 3
RELEASE_SLACK_US = 0.5  # Kineto's CPU and GPU clocks agree to about this
FIXED_MIN_US = 50.0  # a fixed duration shorter than this is not reported as a possible wait


class _CallSeg(Protocol):
    """A runtime call's piece of its thread (``build._Seg``)."""

    t0: float
    t1: float
    event: Event | None


def add_syncs(
    b: GraphBuilder,
    sync_events: Sequence[Event],
    runtime_tasks: Sequence[tuple[_CallSeg, int, tuple[Any, Any]]],
    launch_src: list[int],
    launch_dst: list[int],
    gpu_by_corr: dict[int, int],
    gpu_info: list[tuple[int, str, float, float]],
) -> None:
    """Add the ``LAUNCH`` edges (with their latency) and every GPU wait of the module docstring.

    ``sync_events``: the trace's ``cuda_sync`` events; ``runtime_tasks``: (segment, task, thread) of
    every runtime call; ``launch_src/dst``: call -> GPU task pairs; ``gpu_info``: (task, stream resource
    name, start, end) of every GPU task.
    """
    info = {t: (rn, ts, end) for t, rn, ts, end in gpu_info}
    dur_col, name_col = b.cols["dur_us"], b.cols["name"]
    calls = sorted(runtime_tasks, key=lambda x: (x[0].t0, x[1]))
    n = len(calls)
    # the calls' columns, in one pass (each segment and event is read once), and each thread's calls
    t0: list[float] = []
    t1: list[float] = []
    names: list[str] = []
    tids: list[int] = []
    corr: list[Any] = []
    own: list[int] = []  # the GPU task a call launched, -1 none
    by_thread: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    for i, (s, tid, k) in enumerate(calls):
        t0.append(s.t0)
        t1.append(s.t1)
        tids.append(tid)
        by_thread[k].append(i)
        e = s.event
        if e is None:
            names.append("")
            corr.append(None)
            own.append(-1)
            continue
        c = e.args.get("correlation")
        names.append(e.name)
        corr.append(c)
        own.append(gpu_by_corr.get(c, -1) if type(c) is int else -1)

    # ---------------------------------------------------------------- 2. the launch queue
    queue_rel = [-1] * n  # the GPU task whose end frees this launch's queue slot
    for idx in _by_device(own, info).values():
        q = _queue_depth(idx, t0, t1, names, own, info)
        for a, i in zip(idx, idx[q:], strict=False):
            queue_rel[i] = own[a]

    # ---------------------------------------------------------------- 3-6. per thread, in call order
    # last task launched on each stream before a time (a snapshot per launch, in CPU time order)
    launch_order = [i for i in range(n) if own[i] >= 0]
    launch_t = [t0[i] for i in launch_order]
    snapshots: list[dict[str, int]] = []
    last_on: dict[str, int] = {}
    for i in launch_order:
        last_on = {**last_on, info[own[i]][0]: own[i]}
        snapshots.append(last_on)

    def last_before(t: float) -> dict[str, int]:
        k = bisect.bisect_left(launch_t, t) - 1
        return snapshots[k] if k >= 0 else {}

    sync_stream = _sync_streams(sync_events)
    role = {nm: _role(nm) for nm in set(names)}
    deps: list[list[int] | None] = [None] * n  # GPU tasks a waiting call waits for
    is_copy = [False] * n
    must = [True] * n  # False: depend only where the trace shows the call blocked (allocator)
    gpu_waits: set[int] = set()  # GPU tasks that wait for another stream (cudaStreamWaitEvent)
    for idx in by_thread.values():
        recorded: int | None = None  # the task the thread's latest cudaEventRecord marks
        pending_record: dict[str, int] | None = None
        wait_from: dict[str, int] | None = None
        last_launch: int | None = None
        spin = _spins(idx, t0, t1, [role[names[i]] == _QUERY for i in idx])
        for i in idx:
            name, o = names[i], own[i]
            if wait_from is not None and o >= 0:
                rn = info[o][0]
                for t in (t for r2, t in wait_from.items() if r2 != rn):
                    if info[t][2] <= info[o][1] + RELEASE_SLACK_US:
                        b.edge(t, o, EdgeKind.SYNC)
                        gpu_waits.add(o)
                wait_from = None
            if o >= 0:
                last_launch = o
                if _sync_copy(name) or (_copy(name) and _host_waits(b.symbol_of(int(name_col[o])) or "")):
                    deps[i], is_copy[i] = [o], True
                continue
            rl = role[name]
            if rl == _RECORD:
                pending_record = last_before(t0[i])
                recorded = last_launch
                continue
            if rl == _WAIT:
                if pending_record:
                    latest = max(pending_record.values(), key=lambda t: info[t][2])
                    wait_from = {info[latest][0]: latest}
                continue
            if rl == _OTHER or (rl == _QUERY and i not in spin):
                continue
            device = _device(info[last_launch][0]) if last_launch is not None else None
            every = {rn: t for rn, t in last_before(t0[i]).items() if device is None or _device(rn) == device}
            if rl == _DEVICE:
                deps[i] = list(every.values())
            elif rl == _STREAM:
                c = corr[i]
                stream = sync_stream.get(c) if type(c) is int else None
                if stream is not None:
                    deps[i] = [every[stream]] if stream in every else []
                else:
                    waited = [t for t in every.values() if t0[i] < info[t][2] <= t1[i] + RELEASE_SLACK_US]
                    deps[i] = [max(waited, key=lambda t: info[t][2])] if waited else list(every.values())
            elif rl in (_EVENT, _QUERY):
                mine = [recorded] if recorded is not None else []
                if mine and info[mine[0]][2] <= t0[i]:  # the trace shows it waited for another task
                    waited = [t for t in every.values() if t0[i] < info[t][2] <= t1[i] + RELEASE_SLACK_US]
                    mine = [max(waited, key=lambda t: info[t][2])] if waited else mine
                deps[i] = mine
            elif rl == _ALLOC:
                deps[i], must[i] = list(every.values()), False

    # ---------------------------------------------------------------- 1. which calls blocked; call costs
    release = [-np.inf] * n  # end of the latest dependency that ended inside the call
    blocked = [False] * n
    cand = [i for i in range(n) if deps[i] is not None or queue_rel[i] >= 0]
    for i in cand:
        lim = t1[i] + RELEASE_SLACK_US
        if deps[i] is not None:
            # a dependency that ended after the call returned was not one
            deps[i] = [t for t in deps[i] if info[t][2] <= lim]  # type: ignore[union-attr]
            ends = [info[t][2] for t in deps[i]]  # type: ignore[union-attr]
            if ends and max(ends) > t0[i]:
                release[i], blocked[i] = max(ends), True
            elif not must[i]:
                deps[i] = None
            if is_copy[i] and not deps[i]:
                is_copy[i] = False  # its copy ended after the call returned: it did not wait for it
        q = queue_rel[i]
        if q >= 0 and t0[i] < info[q][2] <= lim:
            release[i], blocked[i] = max(release[i], info[q][2]), True
    code = {nm: k for k, nm in enumerate(role)}
    codes = np.array([code[nm] for nm in names], np.int64)
    dur = np.subtract(t1, t0)
    unblocked = ~(np.array(blocked, np.bool_) | np.array(is_copy, np.bool_))
    cost = {nm: float(np.median(dur[unblocked & (codes == k)])) for nm, k in code.items()
            if (unblocked & (codes == k)).any()}  # fmt: skip
    free_launch = dur[unblocked & (np.array(own) >= 0)]
    launch_cost = float(np.median(free_launch)) if free_launch.size else None

    # ---------------------------------------------------------------- emit
    q_src = [queue_rel[i] for i in cand if queue_rel[i] >= 0]
    b.edges_bulk(q_src, [tids[i] for i in cand if queue_rel[i] >= 0], EdgeKind.SYNC)
    for i in cand:
        tid, d = tids[i], t1[i] - t0[i]
        if unblocked[i]:
            for t in deps[i] or ():
                b.edge(t, tid, EdgeKind.SYNC)
            continue
        c = cost.get(names[i])
        if (
            c is None and own[i] >= 0
        ):  # no unblocked call of this name: any launch's, else up to its task's start
            c = launch_cost if launch_cost is not None else max(0.0, info[own[i]][1] - t0[i])
        part = min(d, c if c is not None else 0.0)
        dur_col[tid] = part
        if not deps[i]:
            continue  # blocked on the launch queue only
        r = max(info[t][2] for t in deps[i])  # type: ignore[union-attr]
        wait = b.task(
            names[i], TaskKind.SYNC, int(b.cols["resource"][tid]),
            dur_us=max(0.0, t1[i] - max(r, t0[i] + part)),
            step=int(b.cols["step"][tid]), layer=b.symbol_of(int(b.cols["layer"][tid])),
            op=b.symbol_of(int(b.cols["op"][tid])), order=t0[i] + 1e-6, ts_us=t0[i],
        )  # fmt: skip
        for t in deps[i]:  # type: ignore[union-attr]
            b.edge(t, wait, EdgeKind.SYNC)

    # ---------------------------------------------------------------- 7. launch latency on LAUNCH edges
    call_of = {tids[i]: i for i in range(n)}
    launch_of = {d: call_of[s] for s, d in zip(launch_src, launch_dst, strict=True) if d not in gpu_waits}
    latency, gap = _gpu_latencies(gpu_info, launch_of, t1, unblocked.tolist())
    lags = [
        min(
            latency.get(_device(info[dst][0]), 0.0),
            max(0.0, info[dst][1] - (t0[call_of[src]] + dur_col[src])),
        )
        for src, dst in zip(launch_src, launch_dst, strict=True)
    ]
    b.edges_bulk(launch_src, launch_dst, EdgeKind.LAUNCH, lag_us=lags)
    # the GPU's own gap between back-to-back tasks on a stream: an explicit stream-order edge with a lag
    s_src, s_dst, s_lag = [], [], []
    last: dict[str, tuple[int, float]] = {}
    for t, rn, ts, end in gpu_info:
        prev = last.get(rn)
        if prev is not None and (lag := min(gap.get(_device(rn), 0.0), ts - prev[1])) > 0:
            s_src.append(prev[0])
            s_dst.append(t)
            s_lag.append(lag)
        last[rn] = (t, end)
    b.edges_bulk(s_src, s_dst, EdgeKind.STREAM, lag_us=s_lag)


_OTHER, _RECORD, _WAIT, _DEVICE, _STREAM, _EVENT, _QUERY, _ALLOC = range(8)
_ROLES = (
    (EVENT_RECORD_RX, _RECORD), (STREAM_WAIT_RX, _WAIT), (DEVICE_SYNC_RX, _DEVICE), (STREAM_SYNC_RX, _STREAM),
    (EVENT_SYNC_RX, _EVENT), (EVENT_QUERY_RX, _QUERY), (ALLOC_RX, _ALLOC),
)  # fmt: skip


def _role(name: str) -> int:
    """What a runtime call without a GPU task of its own does, for the rules above."""
    for rx, r in _ROLES:
        if rx.search(name):
            return r
    return _OTHER


@functools.lru_cache(maxsize=1024)
def _sync_copy(name: str) -> bool:
    return SYNC_COPY_RX.search(name) is not None


@functools.lru_cache(maxsize=1024)
def _copy(name: str) -> bool:
    return COPY_RX.search(name) is not None


@functools.lru_cache(maxsize=1024)
def _host_waits(copy_name: str) -> bool:
    """Whether the host waits for a copy of this kind (to pageable memory, or device to host not pinned)."""
    return "Pageable" in copy_name or ("DtoH" in copy_name and "Pinned" not in copy_name)


@functools.lru_cache(maxsize=1024)
def _device(resource_name: str) -> str:
    return resource_name.split(":", 1)[0]


def _by_device(own: list[int], info: dict[int, tuple[str, float, float]]) -> dict[str, list[int]]:
    """Launch calls (indices into the sorted calls) per device, in launch order."""
    out: dict[str, list[int]] = defaultdict(list)
    for i, o in enumerate(own):
        if o >= 0:
            out[_device(info[o][0])].append(i)
    return out


def _queue_depth(
    idx: list[int], t0: list[float], t1: list[float], names: list[str], own: list[int],
    info: dict[int, tuple[str, float, float]],
) -> int:  # fmt: skip
    """The launch queue depth of one device: outstanding launches where long launch calls cluster.

    Outstanding at launch ``i`` = launches before it whose task had not ended when the call started.
    A launch call is long when it takes over 3x its name's 10th percentile plus 20 us (most launch
    calls may block; the fastest tenth did not). Without a cluster of
    at least 3 long calls at a depth >= ``MIN_QUEUE_DEPTH``, CUDA's default.
    """
    ends = np.array([info[own[i]][2] for i in idx])
    starts = np.array([t0[i] for i in idx])
    dur = np.array([t1[i] - t0[i] for i in idx])
    outstanding = np.arange(len(idx)) - np.searchsorted(np.sort(ends), starts, side="right")
    code_of: dict[str, int] = {}
    code = np.array([code_of.setdefault(names[i], len(code_of)) for i in idx], np.int64)  # name, numbered
    low = np.array([np.percentile(dur[code == k], 10) for k in range(len(code_of))])  # per name
    long = dur > 3 * low[code] + 20.0
    hits = Counter(int(x) for x in outstanding[long] if x >= MIN_QUEUE_DEPTH)
    if not hits:
        return DEFAULT_QUEUE_DEPTH
    q, _ = hits.most_common(1)[0]
    near = sum(c for x, c in hits.items() if q - 8 <= x <= q)
    return q if near >= 3 else DEFAULT_QUEUE_DEPTH


def _sync_streams(sync_events: Sequence[Event]) -> dict[int, str]:
    """Correlation id -> stream resource of Kineto's ``cuda_sync`` events (which name the stream)."""
    out: dict[int, str] = {}
    for e in sync_events:
        if e.cat == "cuda_sync":
            c, s = e.args.get("correlation"), e.args.get("stream")
            if type(c) is int and s is not None and s != -1:
                out[c] = f"gpu{e.args.get('device', e.pid)}:s{s}"
    return out


def _spins(idx: list[int], t0: list[float], t1: list[float], query: list[bool]) -> set[int]:
    """The last call of each ``cudaEventQuery`` polling loop on a thread (>= 3 calls, close together).

    ``idx``: the thread's calls in order; ``query[k]``: whether ``idx[k]`` is a ``cudaEventQuery``.
    """
    out: set[int] = set()
    run: list[int] = []
    for i, q in zip([*idx, -1], [*query, False], strict=True):
        if q and (not run or t0[i] - t1[run[-1]] < SPIN_GAP_US):
            run.append(i)
            continue
        if len(run) >= SPIN_MIN_CALLS:
            out.add(run[-1])
        run = [i] if q else []
    return out


def _gpu_latencies(
    gpu_info: list[tuple[int, str, float, float]], launch_of: dict[int, int], call_end: list[float],
    unblocked: list[bool],
) -> tuple[dict[str, float], dict[str, float]]:  # fmt: skip
    """Per device, medians over the trace: the launch latency and the gap between back-to-back tasks.

    Launch latency: (start - launch call end) of tasks that started on an idle stream, launched by a
    call that did not block. Back-to-back gap: (start - end of the previous task on the stream) of
    tasks whose launch call had ended before that previous task did (they were queued). ``launch_of``
    maps a GPU task to its launch call (an index into ``call_end``), for tasks that wait for no other
    stream.
    """
    last_end: dict[str, float] = {}
    lat: dict[str, list[float]] = defaultdict(list)
    gaps: dict[str, list[float]] = defaultdict(list)
    for t, rn, ts, end in gpu_info:  # in start order
        i = launch_of.get(t)
        prev = last_end.get(rn, -np.inf)
        if i is not None:
            if prev < call_end[i] and unblocked[i]:
                lat[_device(rn)].append(ts - call_end[i])
            elif prev >= call_end[i] and ts >= prev:
                gaps[_device(rn)].append(ts - prev)
        last_end[rn] = max(end, prev)
    med = {d: max(0.0, float(np.median(v))) for d, v in lat.items()}
    return med, {d: float(np.median(v)) for d, v in gaps.items()}


def fixed_wait_ms_per_step(g: TaskGraph) -> dict[str, float]:
    """Milliseconds per step (mean over steps) of fixed durations that may contain a wait, by reason.

    - ``untraced time on the step thread``: time on the thread with the step annotations that no
      operator covers (``gap`` tasks and the ``ProfilerStep#N`` range's own time), >= 50 us per piece
      and with no dependency in or out: the thread may have waited there for anything.
    - ``runtime call, blocking not attributed``: runtime calls >= 50 us longer than their name's median
      that wait for no GPU task (the excess over the median).
    - ``wait after release``: ``SYNC`` tasks, the part of a wait after the GPU task that released it,
      when >= 50 us (normally a few us of return latency).
    """

    ids = g.steps.ids if g.steps.ids.size else np.unique(g.step[g.step >= 0])
    n_steps = max(1, int(ids.size))
    in_step = np.isin(g.step, ids) if ids.size else np.ones(g.n_tasks, np.bool_)
    has_in = np.zeros(g.n_tasks, np.bool_)
    has_in[g.edge_dst] = True
    has_out = np.zeros(g.n_tasks, np.bool_)
    has_out[g.edge_src] = True
    from_gpu = np.zeros(g.n_tasks, np.bool_)
    gpu_kinds = [int(k) for k in (TaskKind.KERNEL, TaskKind.MEMCPY, TaskKind.MEMSET, TaskKind.COMM)]
    gpu_res = np.array([r.kind == ResourceKind.GPU_STREAM for r in g.resources] + [False], np.bool_)
    src_gpu = np.isin(g.kind[g.edge_src], gpu_kinds) & gpu_res[g.resource[g.edge_src]]
    from_gpu[g.edge_dst[src_gpu]] = True
    dur = g.dur_us
    untraced = np.array([s == GAP or STEP_RX.match(s) is not None for s in g.symbols] + [False], np.bool_)
    gap = untraced[g.name] & (g.kind == TaskKind.CPU) & (g.resource == g.steps.anchor)
    gap &= ~has_in & ~has_out & (dur >= FIXED_MIN_US)
    runtime = g.kind == TaskKind.RUNTIME
    med = np.zeros(len(g.symbols))
    rt_names = g.name[runtime]
    for k in np.unique(rt_names):
        med[k] = np.median(dur[runtime][rt_names == k])
    excess = np.where(runtime, dur - med[g.name], 0.0)
    unattributed = runtime & ~from_gpu & (excess >= FIXED_MIN_US)
    after = (g.kind == TaskKind.SYNC) & (dur >= FIXED_MIN_US)
    total = {
        "untraced time on the step thread": float(dur[gap & in_step].sum()),
        "runtime call, blocking not attributed": float(excess[unattributed & in_step].sum()),
        "wait after release": float(dur[after & in_step].sum()),
    }
    return {k: v / 1e3 / n_steps for k, v in total.items()}
