"""Turn a Kineto trace into a task graph (Daydream's dependency model on PyTorch profiler output).

    >>> from trainsim.graph.build import load_trace
    >>> g = load_trace("../shared/traces/v100_single_rank0.json.gz")   # doctest: +SKIP

How the trace becomes tasks:

1. **CPU threads.** Each thread's timeline is cut at every event boundary. A CUDA runtime/driver call
   is one task; every other piece becomes a CPU task named after the innermost operator covering it
   (or ``gap`` where nothing is traced), so that the tasks tile the thread's timeline and untraced
   time stays on the thread (Daydream §4.2).
2. **GPU streams.** Each kernel, copy and memset is a task on ``gpu<device>:s<stream>``; NCCL kernels
   are ``COMM`` tasks. Its launch call precedes it (``LAUNCH`` edge, by correlation id).
3. **GPU waits** (``gpusync.py``). A call that waits for the GPU keeps only its cost (the median of
   the calls of its name that did not block) and depends on what released it: synchronize calls on
   the last task of their device / stream / event (whether or not they blocked), blocking copies on
   their copy (a ``SYNC`` task after the call), every launch on the task launched ``Q`` launches
   earlier (CUDA's launch queue, ``Q`` read from the trace), allocator calls that blocked on the
   device. ``cudaStreamWaitEvent`` becomes a GPU->GPU edge. A GPU task starts no earlier than its
   launch's end plus the launch latency measured in the trace (the ``LAUNCH`` edge's lag).
4. **Other threads** (autograd's backward thread, gloo workers) run in bursts started by the thread
   that carries the ``ProfilerStep`` annotations (the anchor). A burst that runs entirely inside one
   anchor task splits that task: the anchor resumes only when the burst ends (``SYNC``). An untraced
   stretch of the anchor that ends just after a task on another thread ends waits for it (DDP's reducer
   for a gloo all-reduce, a data loader for its thread), and the CPU collectives of a process group
   run one after another (``graph/cpuwaits.py``).
5. **Attributes.** Step from the ``ProfilerStep#N`` ranges; layer from the innermost
   ``record_function`` range, ``nn.Module`` python frame, or, for autograd backward ops, the forward
   op with the same sequence number; collective sizes from ``Input Dims`` / ``In msg nelems``.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
import re
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.capture.kineto import (
    CPU_CATS,
    GPU_CATS,
    RUNTIME_CATS,
    STEP_RX,
    Event,
    Trace,
    paused_gc,
    read_trace,
)
from trainsim.graph import cpuwaits
from trainsim.graph.gpusync import add_syncs
from trainsim.graph.ir import (
    GAP,
    EdgeKind,
    GraphBuilder,
    ResourceKind,
    Steps,
    TaskGraph,
    TaskKind,
)

COMM_CPU_RX = re.compile(r"^(gloo|mpi|ucc):")
COMM_ANNOT_RX = re.compile(r"^(nccl|gloo|mpi|ucc):|^record_param_comms$|^c10d::")
LAYER_SKIP_RX = re.compile(r"^ProfilerStep#|^## .* ##$|^\[param\|")
_DTYPE_BYTES = {
    "float": 4, "float32": 4, "c10::Float": 4, "Float": 4, "double": 8, "c10::Double": 8, "half": 2,
    "c10::Half": 2, "Half": 2, "c10::BFloat16": 2, "BFloat16": 2, "bfloat16": 2, "float16": 2,
    "long int": 8, "int": 4, "c10::Long": 8, "Long": 8, "Int": 4, "c10::Int": 4, "unsigned char": 1, "Byte": 1,
}  # fmt: skip


def load_trace(path: str | Path) -> TaskGraph:
    """Read a Kineto trace and build its task graph (``UserError`` on bad input)."""
    return build_graph(read_trace(path))


class _Seg:
    """A piece of a CPU thread's timeline that becomes one task (a plain class: made ~10^5 times)."""

    __slots__ = ("event", "group", "kind", "layer", "name", "op", "size", "t0", "t1")

    def __init__(
        self, t0: float, t1: float, kind: int, name: str, op: str | None, layer: str | None, event: Event | None,
        coll: tuple[int, str | None] | None = None,
    ) -> None:  # fmt: skip
        self.t0, self.t1, self.kind, self.name, self.op, self.layer, self.event = t0, t1, kind, name, op, layer, event
        self.size, self.group = coll if coll is not None else (-1, None)


def _collective(e: Event) -> tuple[int, str | None]:
    """Bytes and process group of a collective's annotation, (-1, None) where the trace lacks them."""
    g = e.args.get("Process Group Name", e.args.get("pg_name"))
    return _size_of(e), g if isinstance(g, str) else None


def _size_of(e: Event) -> int:
    a = e.args
    n = a.get("In msg nelems")
    if isinstance(n, int):
        return n * _DTYPE_BYTES.get(str(a.get("dtype", "Float")), 4)
    dims, types = a.get("Input Dims"), a.get("Input type")
    if isinstance(dims, list) and dims and isinstance(dims[0], list):
        numel = 1
        for d in dims[0]:
            numel *= int(d) if isinstance(d, int | float) else 1
        t = types[0] if isinstance(types, list) and types else "float"
        return numel * _DTYPE_BYTES.get(str(t), 4)
    return -1


@functools.lru_cache(maxsize=65536)
def _is_collective(name: str) -> bool:
    return COMM_ANNOT_RX.search(name) is not None


@functools.lru_cache(maxsize=65536)
def _is_cpu_collective(name: str) -> bool:
    return COMM_CPU_RX.search(name) is not None


def _layer_name(e: Event) -> str | None:
    if e.cat == "user_annotation" and not LAYER_SKIP_RX.search(e.name):
        return e.name
    if e.cat == "python_function" and e.name.startswith("nn.Module: "):
        return e.name[len("nn.Module: ") :]
    return None


_TS = operator.attrgetter("ts")
_HOST_CATS = CPU_CATS | RUNTIME_CATS
_CPU = int(TaskKind.CPU)  # a plain int: an enum member is looked up by name at every use (~0.1 us)


def _segment_thread(events: list[Event], seq_layer: dict[int, str]) -> list[_Seg]:
    """Cut one thread's events into tiling segments (see the module docstring, step 1)."""
    evs = sorted(events, key=lambda e: (e.ts, -e.dur))
    segs: list[_Seg] = []
    add = segs.append
    cpu, comm_kind, runtime = _CPU, int(TaskKind.COMM), int(TaskKind.RUNTIME)
    # stack entries: (end, name, layer, outermost op, (bytes, group) of the enclosing collective or None,
    # inside a collective that runs on the CPU)
    stack: list[tuple[float, str, str | None, str | None, tuple[int, str | None] | None, bool]] = []
    cursor = evs[0].ts if evs else 0.0
    for e in evs:
        ts = e.ts
        while stack and stack[-1][0] <= ts:
            end, name, layer, op, size, oncpu = stack.pop()
            if end > cursor:
                add(_Seg(cursor, end, comm_kind if oncpu else cpu, name, op, layer, None, size))
                cursor = end
        if e.end <= cursor and ts < cursor:
            continue  # nested inside a runtime call already emitted
        if ts > cursor:
            if stack:
                _, name, layer, op, size, oncpu = stack[-1]
                add(_Seg(cursor, ts, comm_kind if oncpu else cpu, name, op, layer, None, size))
            else:
                add(_Seg(cursor, ts, cpu, GAP, None, None, None))
            cursor = ts
        if stack:
            _, _, layer, op, size, oncpu = stack[-1]
        else:
            layer, op, size, oncpu = None, None, None, False
        cat = e.cat
        if cat in RUNTIME_CATS:
            add(_Seg(ts, e.end, runtime, e.name, op, layer, e, size))
            cursor = e.end
            continue
        own_layer = _layer_name(e) if cat != "cpu_op" else None
        seq = e.args.get("Sequence number")
        if own_layer is None and seq is not None:
            if e.args.get("Fwd thread id") is not None and e.name.startswith("autograd::"):
                own_layer = seq_layer.get(seq)
            elif layer is not None:
                seq_layer.setdefault(seq, layer)
        stack.append((
            e.end, e.name, own_layer or layer, op if op is not None else (e.name if cat == "cpu_op" else None),
            size if size is not None else (_collective(e) if _is_collective(e.name) else None),
            oncpu or _is_cpu_collective(e.name),
        ))  # fmt: skip
    while stack:
        end, name, layer, op, size, oncpu = stack.pop()
        if end > cursor:
            add(_Seg(cursor, end, comm_kind if oncpu else cpu, name, op, layer, None, size))
            cursor = end
    return segs


def build_graph(tr: Trace) -> TaskGraph:
    """Build the task graph of a parsed trace."""
    with paused_gc():
        return _build_graph(tr)


def _build_graph(tr: Trace) -> TaskGraph:
    threads: dict[tuple[Any, Any], list[Event]] = defaultdict(list)
    gpu: list[Event] = []
    step_events: list[Event] = []
    sync_events: list[Event] = []  # Kineto's cuda_sync events (they name a synchronized stream)
    for e in tr.events:
        cat = e.cat
        if cat in GPU_CATS:
            gpu.append(e)
        elif cat in _HOST_CATS:
            if cat == "user_annotation" and STEP_RX.match(e.name):
                step_events.append(e)  # also kept on its thread: step boundaries cut the timeline
            threads[(e.pid, e.tid)].append(e)
        elif cat == "cuda_sync":
            sync_events.append(e)
    # ------------------------------------------------------------------ steps and anchor thread
    anchor_key: tuple[Any, Any] | None = None
    if step_events:
        counts: dict[tuple[Any, Any], int] = defaultdict(int)
        for e in step_events:
            counts[(e.pid, e.tid)] += 1
        anchor_key = max(counts, key=lambda k: counts[k])
        step_events = sorted((e for e in step_events if (e.pid, e.tid) == anchor_key), key=lambda e: e.ts)
    else:
        warnings.warn(
            f"{tr.path}: no ProfilerStep#N annotations; the whole trace is treated as one step",
            stacklevel=2,
        )
    step_ids = [int(STEP_RX.match(e.name).group(1)) for e in step_events]  # type: ignore[union-attr]
    step_t0 = [e.ts for e in step_events]
    step_t1 = [e.end for e in step_events]

    b = GraphBuilder(source=tr.path)
    seq_layer: dict[int, str] = {}
    # The anchor first, so that forward ops (which name the layers) come before backward ones.
    if anchor_key is not None and anchor_key not in threads:
        threads[anchor_key] = []
    keys = sorted(threads, key=lambda k: (k != anchor_key, str(k)))
    segments = {k: _segment_thread(threads[k], seq_layer) for k in keys}
    t_origin = min((segs[0].t0 for segs in segments.values() if segs), default=0.0)
    plans, spawns, inside = _plan_threads(keys, anchor_key, segments, t_origin)
    cpuwaits.clip_late_ends(plans, anchor_key, inside)
    chain = cpuwaits.chain_collectives(plans, anchor_key)
    waits = cpuwaits.find_waits(plans, anchor_key, spawns, inside)
    run_start = cpuwaits.inside_starts(plans, inside)
    # ------------------------------------------------------------------ emit CPU tasks (column-wise)
    cols = b.cols
    st0 = np.asarray(step_t0, np.float64)
    st1 = np.asarray(step_t1, np.float64)
    sid = np.asarray(step_ids, np.int64)

    def steps_at(t: np.ndarray) -> list[int]:
        if not step_events:
            return [0] * len(t)
        i = np.searchsorted(st0, t, side="right") - 1
        ok = (i >= 0) & (t < st1[np.maximum(i, 0)])
        return np.where(ok, sid[np.maximum(i, 0)], -1).tolist()

    corr_launch: dict[int, int] = {}  # correlation id -> launching task
    runtime_tasks: list[tuple[_Seg, int, tuple[Any, Any]]] = []

    def extend(plan: list[_Seg], r: int, k: tuple[Any, Any]) -> int:
        """Append thread ``k``'s tasks and note its runtime calls; return its first task's id."""
        base = len(cols["kind"])
        if not plan:
            return base
        # One pass that reads each segment once: they lie all over memory, and transposing them in C
        # (zip(*map(attrgetter(...), plan))) took twice as long on a 200k-event trace.
        t0: list[float] = []
        t1: list[float] = []
        kind: list[int] = []
        name: list[str] = []
        op: list[str | None] = []
        layer: list[str | None] = []
        size: list[int] = []
        group: list[str | None] = []
        add_t0, add_t1, add_kind, add_name = t0.append, t1.append, kind.append, name.append
        add_op, add_layer, add_size, add_group = op.append, layer.append, size.append, group.append
        for idx, x in enumerate(plan):
            add_t0(x.t0)
            add_t1(x.t1)
            add_kind(x.kind)
            add_name(x.name)
            add_op(x.op)
            add_layer(x.layer)
            add_size(x.size)
            add_group(x.group)
            e = x.event
            if e is not None:  # a runtime call
                runtime_tasks.append((x, base + idx, k))
                c = e.args.get("correlation")
                if type(c) is int:
                    corr_launch[c] = base + idx
        a0 = np.asarray(t0, np.float64)
        cols["kind"].extend(kind)
        cols["name"].extend(b.sym_many(name))
        cols["op"].extend(b.sym_many(op))
        cols["layer"].extend(b.sym_many(layer))
        cols["resource"].extend([r] * len(plan))
        cols["order"].extend(t0)
        cols["dur_us"].extend((np.asarray(t1, np.float64) - a0).tolist())
        cols["ts_us"].extend(t0)
        cols["step"].extend(steps_at(a0))
        cols["size_bytes"].extend(size)
        cols["group"].extend(b.sym_many(group))
        cols["priority"].extend([0.0] * len(plan))
        return base

    base_of: dict[tuple[Any, Any], int] = {}
    wait_of: dict[int, int] = {}  # anchor segment index -> its SYNC (waiting) part
    for k in keys:
        r = b.resource(f"cpu:{k[0]}/{k[1]}", ResourceKind.CPU_THREAD)
        plan = plans[k]
        base = base_of[k] = extend(plan, r, k)
        if k != anchor_key:
            continue
        for idx, bursts in inside.items():
            # the anchor is blocked in this task while other threads' bursts run: split it
            x = plan[idx]
            b_start = run_start[idx]
            b_end = max(plans[kk][li].t1 for kk, _, li in bursts)
            cols["dur_us"][base + idx] = max(0.0, min(b_start, x.t1) - x.t0)
            wait_of[idx] = b.task(x.name, TaskKind.SYNC, r, dur_us=max(0.0, x.t1 - max(b_end, x.t0)),
                                  step=int(cols["step"][base + idx]), layer=x.layer, op=x.op,
                                  order=x.t0 + 1e-3, ts_us=x.t0)  # fmt: skip
        for idx, w in waits.items():
            # the anchor waits for a task on another thread: the waiting is derived from the edge
            x = plan[idx]
            cols["dur_us"][base + idx] = w.pre_us
            wait_of[idx] = b.task(x.name, TaskKind.SYNC, r, dur_us=w.tail_us, step=int(cols["step"][base + idx]),
                                  layer=x.layer, op=x.op, order=x.t0 + 1e-3, ts_us=x.t0)  # fmt: skip
    if anchor_key is not None:
        a_base = base_of[anchor_key]
        for a_idx, k, gap_idx, from_pre in spawns:
            src = a_base + a_idx if from_pre else wait_of.get(a_idx, a_base + a_idx)
            b.edge(src, base_of[k] + gap_idx, EdgeKind.DATA)
        for a_idx, bursts in inside.items():
            for k, _, last_idx in bursts:
                b.edge(base_of[k] + last_idx, wait_of[a_idx], EdgeKind.SYNC)
        for a_idx, w in waits.items():
            b.edge(base_of[w.thread] + w.task, wait_of[a_idx], EdgeKind.SYNC)
    for pk, pi, k, i in chain:
        b.edge(base_of[pk] + pi, base_of[k] + i, EdgeKind.COMM)
    # ------------------------------------------------------------------ GPU tasks (column-wise)
    gpu.sort(key=_TS)
    gpu_by_corr: dict[int, int] = {}
    gpu_info: list[tuple[int, str, float, float]] = []  # (task, stream resource, ts, end)
    comm_kind, kernel_kind, memcpy_kind = int(TaskKind.COMM), int(TaskKind.KERNEL), int(TaskKind.MEMCPY)
    kind_of = {"gpu_memset": int(TaskKind.MEMSET), "gpu_memcpy": memcpy_kind}
    res_cache: dict[tuple[Any, Any], tuple[int, str]] = {}
    g_base = len(cols["kind"])
    g_kind, g_op, g_layer, g_res, g_step, g_size, g_group = [], [], [], [], [], [], []
    g_ts, g_dur = [], []
    c_step, c_op, c_layer, c_size, c_group = cols["step"], cols["op"], cols["layer"], cols["size_bytes"], cols["group"]
    launch_src, launch_dst = [], []
    for n, e in enumerate(gpu):
        _, cat, name, pid, tid, ts, dur, args, end = e
        get = args.get
        key = (get("device", pid), get("stream", tid))
        hit = res_cache.get(key)
        if hit is None:
            rname = f"gpu{key[0]}:s{key[1]}"
            hit = res_cache[key] = (b.resource(rname, ResourceKind.GPU_STREAM), rname)
        t = g_base + n
        c = get("correlation")
        launch = corr_launch.get(c) if type(c) is int else None
        if cat == "kernel":
            kind = comm_kind if name.startswith(("nccl", "ncclDev", "Nccl")) else kernel_kind
        else:
            kind = kind_of.get(cat, memcpy_kind)
        size = get("bytes", -1)
        if launch is not None:
            g_step.append(c_step[launch])
            g_op.append(c_op[launch])
            g_layer.append(c_layer[launch])
            launch_src.append(launch)
            launch_dst.append(t)
            if kind == comm_kind:
                size = c_size[launch]
            g_group.append(c_group[launch] if kind == comm_kind else -1)
        else:
            g_step.append(steps_at(np.array([ts]))[0])
            g_group.append(-1)
            g_op.append(-1)
            g_layer.append(-1)
        g_kind.append(kind)
        g_res.append(hit[0])
        g_size.append(size if type(size) is int else -1)
        g_ts.append(ts)
        g_dur.append(dur)
        if type(c) is int:
            gpu_by_corr[c] = t
        gpu_info.append((t, hit[1], ts, end))
    cols["kind"].extend(g_kind)
    cols["name"].extend(b.sym_many([e.name for e in gpu]))  # interned in task order, as one sym() each would
    cols["op"].extend(g_op)
    cols["layer"].extend(g_layer)
    cols["resource"].extend(g_res)
    cols["order"].extend(g_ts)
    cols["dur_us"].extend(g_dur)
    cols["ts_us"].extend(g_ts)
    cols["step"].extend(g_step)
    cols["size_bytes"].extend(g_size)
    cols["group"].extend(g_group)
    cols["priority"].extend([0.0] * len(gpu))
    add_syncs(b, sync_events, runtime_tasks, launch_src, launch_dst, gpu_by_corr, gpu_info)
    steps = Steps(
        ids=np.asarray(step_ids, np.int32),
        start_us=np.asarray(step_t0, np.float64),
        end_us=np.asarray(step_t1, np.float64),
        anchor=b.resource(f"cpu:{anchor_key[0]}/{anchor_key[1]}", ResourceKind.CPU_THREAD) if anchor_key else -1,
    )
    if not step_events:
        all_t0 = min((e.ts for e in tr.events), default=0.0)
        all_t1 = max((e.end for e in tr.events), default=0.0)
        steps = Steps(ids=np.zeros(1, np.int32), start_us=np.array([all_t0]), end_us=np.array([all_t1]), anchor=-1)
    return b.build(steps).in_time_order()


def _plan_threads(
    keys: list[tuple[Any, Any]],
    anchor_key: tuple[Any, Any] | None,
    segments: dict[tuple[Any, Any], list[_Seg]],
    t_origin: float,
) -> tuple[
    dict[tuple[Any, Any], list[_Seg]],
    list[tuple[int, tuple[Any, Any], int, bool]],
    dict[int, list[tuple[tuple[Any, Any], int, int]]],
]:
    """Order every thread's segments into a plan and find the bursts of non-anchor threads.

    Returns ``(plans, spawns, inside)``: ``plans[k]`` is thread k's segment list (gaps included; the
    anchor's starts with a lead gap from the trace origin); ``spawns`` lists ``(anchor index, thread,
    gap index, from the pre part)`` edges that start a burst; ``inside[anchor index]`` lists the
    ``(thread, gap index, last index)`` of bursts that run entirely inside that anchor segment.
    """
    plans: dict[tuple[Any, Any], list[_Seg]] = {}
    spawns: list[tuple[int, tuple[Any, Any], int, bool]] = []
    inside: dict[int, list[tuple[tuple[Any, Any], int, int]]] = defaultdict(list)
    anchor: list[_Seg] = []
    if anchor_key is not None:
        segs = segments[anchor_key]
        lead = [_Seg(t_origin, segs[0].t0, _CPU, GAP, None, None, None)] if segs and segs[0].t0 > t_origin else []
        anchor = plans[anchor_key] = lead + segs
    a_t0 = [s.t0 for s in anchor]
    a_t1 = [s.t1 for s in anchor]
    for k in keys:
        if k == anchor_key:
            continue
        segs = [s for s in segments[k] if s.name != GAP or anchor_key is None]
        if anchor_key is None:
            lead = [_Seg(t_origin, segs[0].t0, _CPU, GAP, None, None, None)] if segs and segs[0].t0 > t_origin else []
            plans[k] = lead + segs
            continue
        out: list[_Seg] = []
        prev_end = t_origin
        i = 0
        while i < len(segs):
            x = bisect.bisect_right(a_t0, segs[i].t0) - 1
            x_end = a_t1[x] if x >= 0 else -np.inf
            j = i
            while j + 1 < len(segs) and segs[j + 1].t0 < x_end:
                j += 1
            burst = segs[i : j + 1]
            blocked = x >= 0 and burst[-1].t1 <= x_end and anchor[x].kind == _CPU and anchor[x].name != GAP
            if blocked:
                src, gap_t0 = x, max(prev_end, anchor[x].t0)
            else:
                src = bisect.bisect_right(a_t1, burst[0].t0) - 1
                gap_t0 = max(prev_end, a_t1[src] if src >= 0 else t_origin)
            out.append(_Seg(min(gap_t0, burst[0].t0), burst[0].t0, _CPU, GAP, None, None, None))
            gap_idx = len(out) - 1
            if src >= 0:
                spawns.append((src, k, gap_idx, blocked))
            for a, c in itertools.pairwise(burst):
                out.append(a)
                if c.t0 > a.t1:
                    out.append(_Seg(a.t1, c.t0, _CPU, GAP, None, None, None))
            out.append(burst[-1])
            if blocked:
                inside[x].append((k, gap_idx, len(out) - 1))
            prev_end = burst[-1].t1
            i = j + 1
        plans[k] = out
    # a blocked anchor segment's pre part must end where its first burst starts: fix the gaps
    for bursts in inside.values():
        first = min(plans[k][g + 1].t0 for k, g, _ in bursts)
        for k, g, _ in bursts:
            gap = plans[k][g]
            gap.t0 = min(max(gap.t0, first), gap.t1)
    return plans, spawns, inside

