"""Daydream's transformation primitives: select, scale, set_duration, insert, remove, add_edges, schedule.

    >>> from trainsim.transform.primitives import select, scale
    >>> gemms = select(g, kind="kernel", name=r"gemm|conv")        # doctest: +SKIP
    >>> faster = scale(g, gemms, 1 / 3)                            # doctest: +SKIP

Every function takes a ``TaskGraph`` and returns a new one (graphs are immutable), so what-ifs compose
by nesting calls. A selection is a boolean mask over tasks (``numpy`` array of length ``n_tasks``);
masks combine with ``&``, ``|`` and ``~``. Name filters are regular expressions searched in the
interned symbol table once, then looked up per task, so selecting over a million tasks is a few
vectorised operations.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from trainsim.errors import UserError
from trainsim.graph.ir import (
    EdgeKind,
    Mask,
    Policy,
    Resource,
    ResourceKind,
    TaskGraph,
    TaskKind,
    concat_symbols,
)

KindLike = TaskKind | str | int | Iterable[TaskKind | str | int]


def _kinds(kind: KindLike) -> list[int]:
    items = [kind] if isinstance(kind, TaskKind | str | int) else list(kind)
    out = []
    for k in items:
        if isinstance(k, str):
            try:
                out.append(int(TaskKind[k.upper()]))
            except KeyError:
                valid = ", ".join(m.name.lower() for m in TaskKind)
                raise UserError(f"unknown task kind {k!r}; expected one of {valid}") from None
        else:
            out.append(int(TaskKind(k)))
    return out


def _symbol_mask(g: TaskGraph, pattern: str) -> np.ndarray:
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise UserError(f"bad regular expression {pattern!r}: {exc}") from None
    m = np.fromiter((rx.search(s) is not None for s in g.symbols), np.bool_, len(g.symbols))
    return np.append(m, False)  # index -1 ("none") never matches


def select(
    g: TaskGraph,
    *,
    kind: KindLike | None = None,
    name: str | None = None,
    op: str | None = None,
    layer: str | None = None,
    step: int | Iterable[int] | None = None,
    resource: str | None = None,
    where: Callable[[TaskGraph], Mask] | None = None,
) -> Mask:
    """Tasks matching every given filter. ``name``/``op``/``layer``/``resource`` are regexes (search)."""
    m = np.ones(g.n_tasks, np.bool_)
    if kind is not None:
        m &= np.isin(g.kind, _kinds(kind))
    for col, pattern in (("name", name), ("op", op), ("layer", layer)):
        if pattern is not None:
            m &= _symbol_mask(g, pattern)[getattr(g, col)]
    if step is not None:
        m &= np.isin(g.step, [step] if isinstance(step, int) else list(step))
    if resource is not None:
        rx = re.compile(resource)
        rm = np.array([rx.search(r.name) is not None for r in g.resources] + [False], np.bool_)
        m &= rm[g.resource]
    if where is not None:
        extra = np.asarray(where(g), np.bool_)
        if extra.shape != (g.n_tasks,):
            raise UserError(f"select(where=...) returned shape {extra.shape}; expected ({g.n_tasks},)")
        m &= extra
    return m


def _mask(g: TaskGraph, sel: Mask | Sequence[int] | np.ndarray) -> Mask:
    arr = np.asarray(sel)
    if arr.dtype == np.bool_:
        if arr.shape != (g.n_tasks,):
            raise UserError(f"selection has shape {arr.shape}; expected ({g.n_tasks},)")
        return arr
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise UserError(f"selection of dtype {arr.dtype}; expected a boolean mask or task indices")
    idx = arr.astype(np.int64).ravel()
    bad = idx[(idx < 0) | (idx >= g.n_tasks)]
    if bad.size:  # a negative index would wrap around to a task at the end: refuse it too
        raise UserError(f"selection names task {int(bad[0])}; expected task indices 0..{g.n_tasks - 1}")
    m = np.zeros(g.n_tasks, np.bool_)
    m[idx] = True
    return m


def scale(g: TaskGraph, sel: Mask | Sequence[int], factor: float) -> TaskGraph:
    """Multiply the durations of the selected tasks by ``factor`` (>= 0)."""
    if not np.isfinite(factor) or factor < 0:
        raise UserError(f"scale factor {factor!r}; expected a finite number >= 0")
    dur = g.dur_us.copy()
    m = _mask(g, sel)
    dur[m] *= factor
    return g.with_columns(dur_us=dur)


def set_duration(g: TaskGraph, sel: Mask | Sequence[int], dur_us: float | np.ndarray) -> TaskGraph:
    """Set the durations of the selected tasks (a scalar, or one value per selected task)."""
    m = _mask(g, sel)
    val = np.broadcast_to(np.asarray(dur_us, np.float64), (int(m.sum()),))
    if not np.isfinite(val).all() or (val < 0).any():
        raise UserError("set_duration: durations must be finite and >= 0 microseconds")
    dur = g.dur_us.copy()
    dur[m] = val
    return g.with_columns(dur_us=dur)


def insert(
    g: TaskGraph,
    *,
    name: str | Sequence[str],
    kind: TaskKind | Sequence[TaskKind],
    resource: str | Sequence[str],
    dur_us: float | Sequence[float] | np.ndarray,
    order: float | Sequence[float] | np.ndarray,
    resource_kind: ResourceKind = ResourceKind.COMM_CHANNEL,
    step: int | Sequence[int] | np.ndarray = -1,
    layer: str | Sequence[str | None] | None = None,
    size_bytes: int | Sequence[int] | np.ndarray = -1,
    group: str | None = None,
    priority: float | Sequence[float] | np.ndarray = 0.0,
) -> tuple[TaskGraph, np.ndarray]:
    """Append tasks (scalars broadcast); return the new graph and the new tasks' ids.

    ``resource`` names a resource; an unknown name creates one of ``resource_kind``. ``order`` places
    each task in its resource's queue (compare with the ``order`` of the tasks already there). Connect
    the new tasks with ``add_edges``.
    """
    names = [name] if isinstance(name, str) else list(name)
    m = len(names)
    kinds = np.broadcast_to(np.asarray(kind if not isinstance(kind, TaskKind) else int(kind), np.int8), (m,))
    res_names = [resource] * m if isinstance(resource, str) else list(resource)
    layers = [layer] * m if layer is None or isinstance(layer, str) else list(layer)
    if len(res_names) != m or len(layers) != m:
        raise UserError(f"insert: {m} names but {len(res_names)} resources and {len(layers)} layers")
    resources = list(g.resources)
    index = {r.name: i for i, r in enumerate(resources)}
    rid = np.empty(m, np.int32)
    for i, rn in enumerate(res_names):
        if rn not in index:
            index[rn] = len(resources)
            resources.append(Resource(rn, resource_kind))
        rid[i] = index[rn]
    for what, v in (("order", order), ("priority", priority)):
        if not np.isfinite(np.asarray(v, np.float64)).all():
            raise UserError(f"insert: {what} must be finite numbers")
    extra = [*names, *(x for x in layers if x is not None)] + ([group] if group else [])
    symbols, sidx = concat_symbols(g.symbols, extra)
    new: dict[str, Any] = {
        "kind": kinds,
        "name": np.array([sidx[x] for x in names], np.int32),
        "op": np.full(m, -1, np.int32),
        "layer": np.array([sidx[x] if x is not None else -1 for x in layers], np.int32),
        "resource": rid,
        "order": np.broadcast_to(np.asarray(order, np.float64), (m,)),
        "dur_us": np.broadcast_to(np.asarray(dur_us, np.float64), (m,)),
        "ts_us": np.full(m, np.nan),
        "step": np.broadcast_to(np.asarray(step, np.int32), (m,)),
        "size_bytes": np.broadcast_to(np.asarray(size_bytes, np.int64), (m,)),
        "group": np.full(m, sidx[group] if group else -1, np.int32),
        "priority": np.broadcast_to(np.asarray(priority, np.float64), (m,)),
    }
    cols: dict[str, Any] = {k: np.concatenate((getattr(g, k), v)) for k, v in new.items()}
    out = g.with_columns(symbols=symbols, resources=tuple(resources), **cols)
    out.validate()
    return out, np.arange(g.n_tasks, g.n_tasks + m)


def add_edges(
    g: TaskGraph,
    src: Sequence[int] | np.ndarray,
    dst: Sequence[int] | np.ndarray,
    kind: EdgeKind | np.ndarray = EdgeKind.DATA,
    lag_us: float | np.ndarray = 0.0,
) -> TaskGraph:
    """Add dependencies ``src[i] -> dst[i]``; ``dst[i]`` starts ``lag_us`` or more after ``src[i]`` ends."""
    s = np.asarray(src, np.int32).ravel()
    d = np.asarray(dst, np.int32).ravel()
    if s.shape != d.shape:
        raise UserError(f"add_edges: {s.size} sources but {d.size} destinations")
    k = np.broadcast_to(np.asarray(kind, np.int8), s.shape)
    lag = np.broadcast_to(np.asarray(lag_us, np.float64), s.shape)
    out = g.with_columns(
        edge_src=np.concatenate((g.edge_src, s)),
        edge_dst=np.concatenate((g.edge_dst, d)),
        edge_kind=np.concatenate((g.edge_kind, k)),
        edge_lag_us=np.concatenate((g.edge_lag_us, lag)),
    )
    out.validate()
    return out


def remove(g: TaskGraph, sel: Mask | Sequence[int]) -> TaskGraph:
    """Delete the selected tasks; every predecessor of a removed task now precedes its successors.

    Queue neighbours on a resource close up by themselves (order is implicit in the queue). A bridging
    edge keeps the lags of the edges it replaces (their sum; the largest where several paths meet).
    """
    rm = _mask(g, sel)
    if not rm.any():
        return g
    src, dst, kind, lag = g.edge_src, g.edge_dst, g.edge_kind, g.edge_lag_us
    touch = rm[src] | rm[dst]
    keep_s, keep_d, keep_k, keep_l = src[~touch], dst[~touch], kind[~touch], lag[~touch]
    preds: dict[int, dict[int, float]] = defaultdict(dict)  # removed task -> {predecessor: lag}
    succs: dict[int, list[tuple[int, int, float]]] = defaultdict(list)
    touched = (src[touch].tolist(), dst[touch].tolist(), kind[touch].tolist(), lag[touch].tolist())
    for s, d, k, lg in zip(*touched, strict=True):
        if rm[d]:
            preds[d][s] = max(lg, preds[d].get(s, 0.0))
        if rm[s]:
            succs[s].append((d, k, lg))
    # bypass removed tasks in dependency order so that chains of removed tasks are bridged
    new_edges: dict[tuple[int, int, int], float] = {}
    for r in _topo(np.flatnonzero(rm).tolist(), preds, rm):
        for d, k, lg in succs.get(r, []):
            for p, lp in preds.get(r, {}).items():
                if rm[d]:
                    preds[d][p] = max(lp + lg, preds[d].get(p, 0.0))
                elif not rm[p]:
                    new_edges[(p, d, k)] = max(lp + lg, new_edges.get((p, d, k), 0.0))
    if new_edges:
        keys = sorted(new_edges)
        e = np.array(keys, np.int64)
        keep_s = np.concatenate((keep_s, e[:, 0].astype(np.int32)))
        keep_d = np.concatenate((keep_d, e[:, 1].astype(np.int32)))
        keep_k = np.concatenate((keep_k, e[:, 2].astype(np.int8)))
        keep_l = np.concatenate((keep_l, np.array([new_edges[x] for x in keys], np.float64)))
    kept = ~rm
    new_id = np.cumsum(kept) - 1
    cols = {c: getattr(g, c)[kept] for c in ("kind", "name", "op", "layer", "resource", "order", "dur_us",
                                             "ts_us", "step", "size_bytes", "group", "priority")}  # fmt: skip
    return g.with_columns(
        edge_src=new_id[keep_s].astype(np.int32),
        edge_dst=new_id[keep_d].astype(np.int32),
        edge_kind=keep_k.astype(np.int8),
        edge_lag_us=keep_l.astype(np.float64),
        **cols,
    )


def _topo(nodes: list[int], preds: dict[int, dict[int, float]], rm: np.ndarray) -> list[int]:
    """Removed nodes ordered so that a removed predecessor comes before its removed successors."""
    inside = {n: {p for p in preds.get(n, ()) if rm[p]} for n in nodes}
    out: list[int] = []
    ready = [n for n in nodes if not inside[n]]
    children: dict[int, list[int]] = defaultdict(list)
    for n, ps in inside.items():
        for p in ps:
            children[p].append(n)
    while ready:
        n = ready.pop()
        out.append(n)
        for c in children.get(n, ()):
            inside[c].discard(n)
            if not inside[c]:
                ready.append(c)
    if len(out) != len(nodes):
        raise UserError("remove: the removed tasks contain a dependency cycle")
    return out


def schedule(
    g: TaskGraph,
    resource: str,
    policy: Policy | str,
    priority: Mask | np.ndarray | Callable[[TaskGraph], np.ndarray] | None = None,
) -> TaskGraph:
    """Set the scheduling policy of the resources whose names match ``resource`` (regex).

    ``priority``: one value per task (smaller runs first), or a function computing it from the graph.
    """
    if isinstance(policy, str):
        try:
            policy = Policy[policy.upper()]
        except KeyError:
            raise UserError(f"unknown policy {policy!r}; expected fifo or priority") from None
    rx = re.compile(resource)
    hit = [rx.search(r.name) is not None for r in g.resources]
    if not any(hit):
        names = ", ".join(r.name for r in g.resources[:8])
        raise UserError(f"schedule: no resource matches {resource!r} (resources: {names}...)")
    res = tuple(Resource(r.name, r.kind, policy if h else r.policy) for r, h in zip(g.resources, hit, strict=True))
    prio = g.priority
    if priority is not None:
        prio = np.asarray(priority(g) if callable(priority) else priority, np.float64)
        if prio.shape != (g.n_tasks,):
            raise UserError(f"schedule: priority has shape {prio.shape}; expected ({g.n_tasks},)")
    return g.with_columns(resources=res, priority=prio)
