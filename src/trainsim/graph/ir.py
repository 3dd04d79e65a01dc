"""The task graph: trainsim's one intermediate representation, stored as columns.

    >>> from trainsim.graph.ir import GraphBuilder, TaskKind, ResourceKind
    >>> b = GraphBuilder()
    >>> cpu = b.resource("cpu:main", ResourceKind.CPU_THREAD)
    >>> gpu = b.resource("gpu0:stream7", ResourceKind.GPU_STREAM)
    >>> launch = b.task("cudaLaunchKernel", TaskKind.RUNTIME, cpu, dur_us=5.0, step=0)
    >>> k = b.task("sgemm", TaskKind.KERNEL, gpu, dur_us=100.0, step=0, deps=[launch])
    >>> g = b.build()
    >>> g.n_tasks, g.task_name(k)
    (2, 'sgemm')

Daydream's model (ATC'20, §4.2): every task runs on one *resource* (a CPU thread, a GPU stream or a
communication channel). Tasks on a resource form a queue ordered by ``order`` (the traced start time
for traced tasks); the implicit edges between neighbours in that queue are the program-order (CPU),
stream-order (GPU) and channel-order (communication) dependencies. All other dependencies are explicit
edges: CPU launch -> GPU task, GPU -> CPU synchronisation, compute -> communication, and any a
transformation adds. Strings are interned in ``symbols``; columns hold indices into it. An edge may
carry a lag (``edge_lag_us``): its destination starts no earlier than the source's end plus the lag
(e.g. the GPU's kernel launch latency after a ``cudaLaunchKernel`` returns).

Conventions: times are microseconds (``*_us``) as floats; sizes are bytes; ``-1`` means "none" in
integer columns and NaN means "not traced" in float ones.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from trainsim.errors import UserError

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]
F64 = npt.NDArray[np.float64]
Mask = npt.NDArray[np.bool_]


GAP = "gap"
"""the name of a CPU task that covers a thread's untraced time between operators"""


class TaskKind(enum.IntEnum):
    """What a task is. The value is what the ``kind`` column stores."""

    CPU = 0  # host work: a CPU operator's own time, or untraced time (a "gap") on a thread
    RUNTIME = 1  # a CUDA runtime / driver call (launch, memcpy call, event record ...)
    KERNEL = 2  # a GPU compute kernel
    MEMCPY = 3  # a GPU copy
    MEMSET = 4  # a GPU memset
    COMM = 5  # communication: a collective or transfer (NCCL kernel, gloo op, inserted all-reduce)
    SYNC = 6  # the waiting part of a call that blocks the CPU until GPU work is done


class EdgeKind(enum.IntEnum):
    """Why one task waits for another (Daydream §4.2); the value is what ``edge_kind`` stores."""

    PROGRAM = 0  # order on a CPU thread (implicit in the resource queue, listed by ``implicit_edges``)
    STREAM = 1  # order on a GPU stream (implicit)
    LAUNCH = 2  # CPU runtime call -> the GPU task it launched (CUDA correlation id)
    SYNC = 3  # GPU task -> the CPU task that waits for it (device/stream/event synchronisation)
    COMM = 4  # computation -> communication that needs its result (e.g. gradient -> all-reduce)
    CHANNEL = 5  # order on a communication channel (implicit)
    DATA = 6  # any other dependency a user or a transformation adds


class ResourceKind(enum.IntEnum):
    CPU_THREAD = 0
    GPU_STREAM = 1
    COMM_CHANNEL = 2


class Policy(enum.IntEnum):
    """How a resource picks its next task among the ready ones."""

    FIFO = 0  # strictly in queue order (``order`` column): the traced order
    PRIORITY = 1  # the ready task with the smallest ``priority``; ties by queue order (P3, ByteScheduler)


_IMPLICIT_EDGE = {
    ResourceKind.CPU_THREAD: EdgeKind.PROGRAM,
    ResourceKind.GPU_STREAM: EdgeKind.STREAM,
    ResourceKind.COMM_CHANNEL: EdgeKind.CHANNEL,
}


@dataclass(frozen=True, slots=True)
class Resource:
    """One execution resource. ``name`` is unique in a graph, e.g. ``"cpu:1234/5678"``, ``"gpu0:s7"``."""

    name: str
    kind: ResourceKind
    policy: Policy = Policy.FIFO


@dataclass(frozen=True, slots=True)
class Steps:
    """Training steps as the trace marked them (``ProfilerStep#N``).

    ``anchor`` is the resource that carries the step annotations (the main CPU thread), or -1 when
    step times are measured as the span of each step's tasks.
    """

    ids: I32 = field(default_factory=lambda: np.zeros(0, np.int32))
    start_us: F64 = field(default_factory=lambda: np.zeros(0))  # traced start of each step
    end_us: F64 = field(default_factory=lambda: np.zeros(0))  # traced end of each step
    anchor: int = -1

    @property
    def measured_us(self) -> F64:
        return self.end_us - self.start_us


@dataclass(frozen=True, slots=True)
class TaskGraph:
    """Columns of tasks and edges; immutable (transformations return new graphs)."""

    symbols: tuple[str, ...]
    resources: tuple[Resource, ...]
    # --- one row per task
    kind: I8
    name: I32  # -> symbols: the task's own name (innermost operator, kernel name ...)
    op: I32  # -> symbols: outermost CPU operator it belongs to (for GPU tasks: of its launch), -1 none
    layer: I32  # -> symbols: layer / module / record_function range it belongs to, -1 none
    resource: I32  # -> resources
    order: F64  # position key in its resource's queue (µs; the traced start for traced tasks)
    dur_us: F64
    ts_us: F64  # traced start (µs since the trace's first event), NaN when not traced
    step: I32  # training step, -1 none
    size_bytes: I64  # bytes moved, for copies and communication; -1 unknown
    group: I32  # -> symbols: process group of a collective, -1 none
    priority: F64  # smaller runs first on PRIORITY resources
    # --- one row per explicit edge (src must finish before dst starts)
    edge_src: I32
    edge_dst: I32
    edge_kind: I8
    edge_lag_us: F64  # the destination starts >= the source's end + this (>= 0; 0 for most edges)
    steps: Steps = field(default_factory=Steps)
    source: str = "<memory>"

    # ---------------------------------------------------------------- basic facts
    @property
    def n_tasks(self) -> int:
        return int(self.kind.shape[0])

    @property
    def n_edges(self) -> int:
        return int(self.edge_src.shape[0])

    def symbol_id(self, text: str) -> int:
        """Index of ``text`` in the symbol table, -1 when absent."""
        try:
            return self.symbols.index(text)
        except ValueError:
            return -1

    def task_name(self, task: int) -> str:
        return self.symbols[int(self.name[task])]

    def describe(self, task: int) -> str:
        """A one-line description of a task, used in error messages."""
        r = self.resources[int(self.resource[task])]
        layer = int(self.layer[task])
        where = f" in {self.symbols[layer]}" if layer >= 0 else ""
        return (
            f"task {task} {TaskKind(int(self.kind[task])).name.lower()} '{self.task_name(task)}'{where}"
            f" on {r.name} (step {int(self.step[task])}, {float(self.dur_us[task]):.1f} us)"
        )

    def resource_id(self, name: str) -> int:
        for i, r in enumerate(self.resources):
            if r.name == name:
                return i
        return -1

    def queue_order(self) -> I64:
        """Task ids sorted by (resource, order, id): each resource's queue, contiguous."""
        return np.lexsort((np.arange(self.n_tasks), self.order, self.resource)).astype(np.int64)

    def implicit_edges(self) -> tuple[I32, I32, I8]:
        """The program / stream / channel order edges implied by the resource queues."""
        q = self.queue_order()
        res = self.resource[q]
        same = res[1:] == res[:-1]
        src, dst = q[:-1][same].astype(np.int32), q[1:][same].astype(np.int32)
        kinds = np.array([int(_IMPLICIT_EDGE[r.kind]) for r in self.resources] or [0], np.int8)
        return src, dst, kinds[self.resource[dst]] if len(dst) else np.zeros(0, np.int8)

    def validate(self) -> None:
        """Raise ``UserError`` if the graph is malformed (cycles are found by the simulator)."""
        n = self.n_tasks
        cols = ("kind", "name", "op", "layer", "resource", "order", "dur_us", "ts_us", "step")
        for col in (*cols, "size_bytes", "group", "priority"):
            if getattr(self, col).shape != (n,):
                raise UserError(f"{self.source}: column {col} has shape {getattr(self, col).shape}, expected ({n},)")
        bad = ~np.isfinite(self.dur_us) | (self.dur_us < 0)
        if bad.any():
            t = int(np.flatnonzero(bad)[0])
            raise UserError(
                f"{self.source}: {self.describe(t)} has duration {self.dur_us[t]!r}; "
                "expected a finite number of microseconds >= 0"
            )
        if n and (self.resource.min() < 0 or self.resource.max() >= len(self.resources)):
            raise UserError(f"{self.source}: a task names a resource outside 0..{len(self.resources) - 1}")
        for col in EDGE_COLUMNS:
            if getattr(self, col).shape != (self.n_edges,):
                shape = getattr(self, col).shape
                raise UserError(f"{self.source}: column {col} has shape {shape}, expected ({self.n_edges},)")
        lag = self.edge_lag_us
        if lag.size and not (np.isfinite(lag) & (lag >= 0)).all():
            k = int(np.flatnonzero(~(np.isfinite(lag) & (lag >= 0)))[0])
            raise UserError(
                f"{self.source}: the edge {self.describe(int(self.edge_src[k]))} -> "
                f"{self.describe(int(self.edge_dst[k]))} has lag {lag[k]!r}; expected a finite number of "
                "microseconds >= 0"
            )
        for col in ("edge_src", "edge_dst"):
            arr = getattr(self, col)
            if arr.size and (arr.min() < 0 or arr.max() >= n):
                raise UserError(f"{self.source}: an edge ({col}) names a task outside 0..{n - 1}")
        if self.n_edges and (self.edge_src == self.edge_dst).any():
            t = int(self.edge_src[self.edge_src == self.edge_dst][0])
            raise UserError(f"{self.source}: {self.describe(t)} depends on itself (a cycle)")

    def permuted(self, perm: np.ndarray) -> TaskGraph:
        """The same graph with task ``perm[k]`` renumbered ``k`` (edges follow)."""
        new_id = np.empty(self.n_tasks, np.int32)
        new_id[perm] = np.arange(self.n_tasks, dtype=np.int32)
        cols = {c: getattr(self, c)[perm] for c in _TASK_COLUMNS}
        return replace(self, edge_src=new_id[self.edge_src], edge_dst=new_id[self.edge_dst], **cols)

    def in_time_order(self) -> TaskGraph:
        """Tasks renumbered by ``order`` (stable, so each queue keeps its order).

        The replay visits tasks roughly in time order; numbering them the same way keeps its memory
        accesses near each other. On a million-task graph this halves the time per task.
        """
        perm = np.argsort(self.order, kind="stable")
        if perm.size and (np.diff(perm) > 0).all():
            return self
        return self.permuted(perm)

    def with_columns(self, **changes: object) -> TaskGraph:
        """A copy with some columns replaced (no validation; transformations validate)."""
        return replace(self, **changes)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- building graphs
class GraphBuilder:
    """Builds a ``TaskGraph`` task by task; for small graphs, tests and synthetic workloads.

    Tasks on a resource run in the order they were added unless ``order`` is given.
    """

    def __init__(self, source: str = "<built>") -> None:
        self.source = source
        self._symbols: dict[str, int] = {}
        self._symbol_list: list[str] = []
        self._resources: list[Resource] = []
        self._res_index: dict[str, int] = {}
        self.cols: dict[str, list[float]] = {c: [] for c in _TASK_COLUMNS}
        """the task columns being built; readable and writable by graph constructors"""
        # the explicit edges, one list per column (flat lists convert to arrays several times faster)
        self._edge_src: list[int] = []
        self._edge_dst: list[int] = []
        self._edge_kind: list[int] = []
        self._lags: list[tuple[int, npt.NDArray[np.float64]]] = []  # (first edge, lags of the edges from it)
        self._counter = 0

    def sym(self, text: str | None) -> int:
        """Intern ``text``; ``None`` is -1."""
        if text is None:
            return -1
        i = self._symbols.get(text)
        if i is None:
            i = self._symbols[text] = len(self._symbols)
        return i

    def sym_many(self, texts: Sequence[str | None]) -> list[int]:
        """``[sym(t) for t in texts]``, in C loops (graph builders intern ~10^6 names): new texts are
        numbered in order of first appearance, exactly as one ``sym`` call per text would."""
        table = self._symbols
        for t in dict.fromkeys(texts):
            if t is not None and t not in table:
                table[t] = len(table)
        lookup: dict[str | None, int] = {None: -1}
        lookup.update(table)
        return list(map(lookup.__getitem__, texts))

    def symbol_of(self, index: int) -> str | None:
        """The string behind a symbol index (``None`` for -1)."""
        if index < 0:
            return None
        if len(self._symbol_list) != len(self._symbols):
            self._symbol_list = list(self._symbols)
        return self._symbol_list[index]

    def resource(self, name: str, kind: ResourceKind, policy: Policy = Policy.FIFO) -> int:
        """The id of resource ``name``, created on first use."""
        i = self._res_index.get(name)
        if i is None:
            i = self._res_index[name] = len(self._resources)
            self._resources.append(Resource(name, ResourceKind(kind), Policy(policy)))
        return i

    def task(
        self,
        name: str,
        kind: TaskKind,
        resource: int,
        dur_us: float,
        *,
        step: int = -1,
        layer: str | None = None,
        op: str | None = None,
        deps: Iterable[int] = (),
        dep_kind: EdgeKind | None = None,
        size_bytes: int = -1,
        group: str | None = None,
        priority: float = 0.0,
        order: float | None = None,
        ts_us: float = float("nan"),
    ) -> int:
        """Add a task; ``deps`` are tasks that must finish first. Returns the task id."""
        c = self.cols
        tid = len(c["kind"])
        sym = self.sym
        c["kind"].append(int(kind))
        c["name"].append(sym(name))
        c["op"].append(sym(op))
        c["layer"].append(sym(layer))
        c["resource"].append(resource)
        c["order"].append(float(self._counter if order is None else order))
        c["dur_us"].append(float(dur_us))
        c["ts_us"].append(ts_us)
        c["step"].append(step)
        c["size_bytes"].append(size_bytes)
        c["group"].append(sym(group))
        c["priority"].append(priority)
        self._counter += 1
        if deps:
            if dep_kind is None:
                dep_kind = EdgeKind.LAUNCH if kind in _GPU_KINDS else EdgeKind.DATA
            for d in deps:
                self._edge_src.append(int(d))
                self._edge_dst.append(tid)
                self._edge_kind.append(int(dep_kind))
        return tid

    def edge(self, src: int, dst: int, kind: EdgeKind = EdgeKind.DATA, lag_us: float = 0.0) -> None:
        if lag_us:
            self._lags.append((len(self._edge_src), np.array([lag_us], np.float64)))
        self._edge_src.append(src)
        self._edge_dst.append(dst)
        self._edge_kind.append(int(kind))

    def edges_bulk(
        self, src: list[int], dst: list[int], kind: EdgeKind, lag_us: Sequence[float] | None = None
    ) -> None:
        if len(dst) != len(src):
            raise ValueError(f"edges_bulk: {len(src)} sources but {len(dst)} destinations")
        if lag_us is not None:
            if len(lag_us) != len(src):
                raise ValueError(f"edges_bulk: {len(src)} edges but {len(lag_us)} lags")
            self._lags.append((len(self._edge_src), np.asarray(lag_us, np.float64)))
        self._edge_src.extend(src)
        self._edge_dst.extend(dst)
        self._edge_kind.extend([int(kind)] * len(src))

    def build(self, steps: Steps | None = None) -> TaskGraph:
        cols: dict[str, Any] = {k: np.asarray(v, dtype=_TASK_COLUMNS[k]) for k, v in self.cols.items()}
        lag = np.zeros(len(self._edge_src))
        for first, lags in self._lags:
            lag[first : first + lags.size] = lags
        g = TaskGraph(
            symbols=tuple(self._symbols),
            resources=tuple(self._resources),
            edge_src=np.asarray(self._edge_src, dtype=np.int64).astype(np.int32),
            edge_dst=np.asarray(self._edge_dst, dtype=np.int64).astype(np.int32),
            edge_kind=np.asarray(self._edge_kind, dtype=np.int64).astype(np.int8),
            edge_lag_us=lag,
            steps=steps or Steps(),
            source=self.source,
            **cols,
        )
        g.validate()
        return g


_TASK_COLUMNS: dict[str, type] = {
    "kind": np.int8,
    "name": np.int32,
    "op": np.int32,
    "layer": np.int32,
    "resource": np.int32,
    "order": np.float64,
    "dur_us": np.float64,
    "ts_us": np.float64,
    "step": np.int32,
    "size_bytes": np.int64,
    "group": np.int32,
    "priority": np.float64,
}
TASK_COLUMNS: tuple[str, ...] = tuple(_TASK_COLUMNS)
"""The documented list of per-task columns (every one is required)."""
EDGE_COLUMNS: tuple[str, ...] = ("edge_src", "edge_dst", "edge_kind", "edge_lag_us")
"""The per-edge columns (every one is required, one row per explicit edge)."""

_GPU_KINDS = {TaskKind.KERNEL, TaskKind.MEMCPY, TaskKind.MEMSET}


def concat_symbols(base: Sequence[str], extra: Iterable[str]) -> tuple[tuple[str, ...], dict[str, int]]:
    """Extend a symbol table with new strings; return it and the index of every string."""
    index = {s: i for i, s in enumerate(base)}
    out = list(base)
    for s in extra:
        if s not in index:
            index[s] = len(out)
            out.append(s)
    return tuple(out), index
