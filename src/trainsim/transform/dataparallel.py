"""Data-parallel scale-out of a single-process trace: DDP gradient buckets all-reduced beside backward.

    >>> from trainsim.graph.build import load_trace
    >>> from trainsim.transform.dataparallel import DPConfig, data_parallel, read_params
    >>> g = load_trace("out/mlp.json.gz")                                          # doctest: +SKIP
    >>> params, layers = read_params("out/mlp.trainsim.json")                      # doctest: +SKIP
    >>> dp = data_parallel(g, params, layers, DPConfig(world=2), comm_us=lambda b: 50 + b / 12.5)  # doctest: +SKIP

What it builds, per training step of the trace (PyTorch DDP, ``torch/nn/parallel/distributed.py`` and
``reducer.cpp``, checked against ``DistributedDataParallel._get_ddp_logging_data()`` in the tests):

1. **Buckets** (``ddp_buckets``): gradients in the order they become ready (default: reverse
   parameter order, which is what DDP assumes before its first-iteration rebuild), packed greedily;
   a bucket closes once it holds >= its cap: 1 MiB for the first (``dist._DEFAULT_FIRST_BUCKET_BYTES``),
   25 MiB for the others (``bucket_cap_mb``).
2. **Gradient ready points**: the trace's ``AccumulateGrad`` evaluations, attributed to the layer
   whose backward op ran just before them (the last backward task of the layer if there are none).
3. **All-reduce per bucket** on a communication channel (``COMM_CHANNEL`` resource), after the ready
   point of every layer in the bucket, in bucket order; its duration is ``comm_us(bucket bytes)``, or,
   where the process group runs collectives concurrently (``DPConfig.lanes`` > 1, gloo), the share of
   its chain of overlapping buckets (``chained_bucket_us``).
4. **Optimizer step after the last bucket**: the first ``Optimizer.step`` task waits for every bucket.
5. Optional **buffer broadcast** before each forward (DDP's ``broadcast_buffers``, BatchNorm stats).

Priority variants (``DPConfig.mode``; see ``trainsim.transform.scheduling``): ``"p3"`` slices every
layer's gradients into ``slice_bytes`` pieces with priority = the layer's forward index (input side
first) on a ``PRIORITY`` channel, and the next step's forward of each layer waits only for that layer's
slices (per-layer update, P3 §3); ``"bytescheduler"`` does the same with ``partition_bytes`` pieces and
``credit`` pieces in flight, which hides the per-message latency of ``credit - 1`` of them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.errors import UserError
from trainsim.graph.ir import EdgeKind, Policy, ResourceKind, TaskGraph, TaskKind
from trainsim.transform.primitives import add_edges, insert, schedule

FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
BUCKET_CAP_MB = 25  # DistributedDataParallel(bucket_cap_mb=25) default
BACKWARD_RX = re.compile(r"Backward\d*$")
ACCUMULATE_RX = re.compile(r"AccumulateGrad")
OPTIMIZER_RX = re.compile(r"^Optimizer\.step")
MODES = ("ddp", "p3", "bytescheduler")


@dataclass(frozen=True, kw_only=True, slots=True)
class ParamInfo:
    """One parameter as the profile sidecar records it."""

    name: str
    layer: str
    """top-level layer (child module) it belongs to"""
    numel: int
    size_bytes: int


BACKEND_LANES = {"nccl": 1, "gloo": 2}
"""collectives a process group of each backend runs at once (``DPConfig.lanes``): NCCL one stream per
group; gloo two worker threads, so DDP's buckets that become ready while the one before is in flight
share the link with it"""


@dataclass(frozen=True, kw_only=True, slots=True)
class DPConfig:
    """How the data-parallel job is run."""

    world: int = 2
    """data-parallel ranks"""
    bucket_cap_mb: float = BUCKET_CAP_MB
    """DDP bucket cap, MiB"""
    first_bucket_bytes: int = FIRST_BUCKET_BYTES
    """cap of the first bucket (bytes)"""
    mode: str = "ddp"
    """ddp | p3 | bytescheduler"""
    slice_bytes: int = 256 * 1024
    """P3 slice size (bytes)"""
    partition_bytes: int = 4_000_000
    """ByteScheduler partition size (bytes); its default is 1M parameters = 4 MB of fp32"""
    credit: int = 4
    """ByteScheduler partitions in flight"""
    round_us: float = 0.0
    """ByteScheduler: the runtime's agreement on the next partition (one tiny all-reduce before each,
    as in ``trainsim.validate.dp_worker``), added to each partition's time: credit does not hide it,
    for its messages queue on the link behind the bytes of the partitions in flight (one FIFO: a
    shaper's queue, a NIC's). 0: no rounds, the partitions go as soon as they are ready"""
    broadcast_bytes: int = 0
    """buffer bytes DDP broadcasts before each forward (0: none)"""
    channel: str = "comm:dp"
    """name of the communication resource"""
    lanes: int = 1
    """collectives the process group runs at once: 1 as on NCCL (one stream per group, buckets one after
    another); gloo's process group runs 2 (two worker threads). With more than one, DDP buckets that
    become ready while the one before is still in flight share the link with it, and such a chain
    takes as long as one all-reduce of its bytes together (``chained_bucket_us``)"""
    host_overhead_us: float = 0.0
    """the data-parallel runtime's own host work per step (DDP: autograd hooks, copies into and out of
    the buckets; P3: slicing, the communication thread, per-layer updates; measured by
    ``trainsim.validate.dp_worker.runtime_overhead``), run on the backward thread just before the
    input-most layer's gradient is ready, except ``finalize_us`` of it"""
    finalize_us: float = 0.0
    """the part of ``host_overhead_us`` that DDP runs after its last bucket's collective: the copy of
    the reduced buckets back into the gradients (``Reducer::finalize_backward``), on the backward thread
    once every collective of the step is done, before the optimizer (``with_host_overhead``)"""

    def __post_init__(self) -> None:
        if not isinstance(self.world, int) or self.world < 1:
            raise UserError(f"data parallel: world={self.world!r}; expected a positive number of ranks")
        if not self.bucket_cap_mb > 0 or self.first_bucket_bytes <= 0:
            raise UserError(f"data parallel: bucket_cap_mb={self.bucket_cap_mb!r}; expected > 0")
        if self.mode not in MODES:
            raise UserError(f"data parallel: mode={self.mode!r}; expected one of {', '.join(MODES)}")
        if self.slice_bytes <= 0 or self.partition_bytes <= 0 or self.credit < 1:
            raise UserError("data parallel: slice_bytes, partition_bytes and credit must be positive")
        if not self.round_us >= 0:
            raise UserError(f"data parallel: round_us={self.round_us!r}; expected >= 0")
        if not isinstance(self.lanes, int) or self.lanes < 1:
            raise UserError(f"data parallel: lanes={self.lanes!r}; expected a positive number of collectives at once")
        if not self.host_overhead_us >= 0:
            raise UserError(f"data parallel: host_overhead_us={self.host_overhead_us!r}; expected >= 0")
        if not 0 <= self.finalize_us <= self.host_overhead_us:
            raise UserError(
                f"data parallel: finalize_us={self.finalize_us!r}; expected 0 to host_overhead_us "
                f"({self.host_overhead_us!r}), of which it is a part"
            )


# --------------------------------------------------------------------------- inputs
def read_params(sidecar: str | Path | dict[str, Any]) -> tuple[list[ParamInfo], list[str]]:
    """Parameters and forward layer order from a profile sidecar (``<trace>.trainsim.json``)."""
    data: Any
    if isinstance(sidecar, dict):
        data, where = sidecar, "<sidecar>"
    else:
        p = Path(sidecar)
        if not p.is_file():
            raise UserError(f"{p}: no profile sidecar; `trainsim profile` writes <trace>.trainsim.json")
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise UserError(f"{p}: not JSON ({exc.msg} at line {exc.lineno})") from None
        where = str(p)
    raw = data.get("params") if isinstance(data, dict) else None
    if not raw:
        raise UserError(f"{where}: the trace records no parameters; a data-parallel what-if needs their sizes")
    try:
        params = [
            ParamInfo(name=str(r["name"]), layer=str(r["layer"]), numel=int(r["numel"]), size_bytes=int(r["bytes"]))
            for r in raw
        ]
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{where}: params need name, layer, numel and bytes") from None
    for i, q in enumerate(params):
        if q.numel < 0 or q.size_bytes < 0:
            raise UserError(f"{where}: params[{i}] ({q.name}): numel={q.numel}, bytes={q.size_bytes}; expected >= 0")
    layers = [str(x) for x in data.get("layers", [])]
    for q in params:
        if q.layer not in layers:
            layers.append(q.layer)
    return params, layers


def ddp_buckets(
    sizes_bytes: Sequence[int],
    order: Sequence[int] | None = None,
    *,
    cap_bytes: int = BUCKET_CAP_MB * 1024 * 1024,
    first_cap_bytes: int = FIRST_BUCKET_BYTES,
) -> list[list[int]]:
    """Parameter indices per bucket, in the order DDP all-reduces them.

    Greedy like ``_compute_bucket_assignment_by_size`` (reducer.cpp): walk the gradients in ready order
    (default reverse parameter order), add each to the open bucket, close it once its size reaches
    its limit; the first bucket's limit is ``first_cap_bytes``, the others' ``cap_bytes``.
    """
    n = len(sizes_bytes)
    walk = list(range(n - 1, -1, -1)) if order is None else [int(i) for i in order]
    if sorted(walk) != list(range(n)):
        raise UserError(f"bucket order must be a permutation of 0..{n - 1}")
    limits = [min(first_cap_bytes, cap_bytes), cap_bytes]
    buckets: list[list[int]] = []
    cur: list[int] = []
    size = 0
    for i in walk:
        cur.append(i)
        size += int(sizes_bytes[i])
        if size >= limits[min(len(buckets), 1)]:
            buckets.append(cur)
            cur, size = [], 0
    if cur:
        buckets.append(cur)
    return buckets


# --------------------------------------------------------------------------- locating tasks in a trace
@dataclass(frozen=True, slots=True)
class StepAnchors:
    """Where a step's gradients become ready, where its forward layers start, where its optimizer starts."""

    step: int
    ready: dict[str, int]  # layer name -> task after which its gradients are accumulated
    fwd_start: dict[str, int]  # layer name -> first forward task of the layer
    opt_start: int  # first optimizer task (-1: none found)
    first: int  # first task of the step on the anchor thread


def _anchor_resource(g: TaskGraph) -> int:
    if g.steps.anchor >= 0:
        return g.steps.anchor
    cpu = [i for i, r in enumerate(g.resources) if r.kind == ResourceKind.CPU_THREAD]
    if not cpu:
        raise UserError(f"{g.source}: no CPU thread in the graph; a data-parallel what-if needs the training loop")
    counts = np.bincount(g.resource, minlength=len(g.resources))
    return max(cpu, key=lambda i: counts[i])


def step_anchors(g: TaskGraph, layers: Sequence[str]) -> list[StepAnchors]:
    """Per step of ``g``: gradient ready points, forward starts and optimizer start (see module doc)."""
    res = _anchor_resource(g)
    rx_sym = np.array([BACKWARD_RX.search(s) is not None for s in g.symbols] or [False])
    acc_sym = np.array([ACCUMULATE_RX.search(s) is not None for s in g.symbols] or [False])
    opt_sym = np.array([OPTIMIZER_RX.search(s) is not None for s in g.symbols] or [False])
    layer_of = {g.symbol_id(f"layer:{name}"): name for name in layers}
    layer_of.update({g.symbol_id(name): name for name in layers if g.symbol_id(name) >= 0})
    layer_of.pop(-1, None)
    q = g.queue_order()
    q = q[g.resource[q] == res]
    out: list[StepAnchors] = []
    for s in np.unique(g.step[q]):
        if s < 0:
            continue
        tasks = q[g.step[q] == s]
        names, ops, lays = g.name[tasks], g.op[tasks], g.layer[tasks]
        is_bwd = rx_sym[names] | (ops >= 0) & rx_sym[np.maximum(ops, 0)]
        is_acc = acc_sym[names] | (ops >= 0) & acc_sym[np.maximum(ops, 0)]
        is_opt = (ops >= 0) & opt_sym[np.maximum(ops, 0)] | opt_sym[names]
        bwd_idx = np.flatnonzero(is_bwd)
        bwd0 = int(bwd_idx[0]) if bwd_idx.size else len(tasks)
        fwd_start: dict[str, int] = {}
        for k in range(bwd0):
            name = layer_of.get(int(lays[k]))
            if name is not None and name not in fwd_start:
                fwd_start[name] = int(tasks[k])
        ready: dict[str, int] = {}
        current: str | None = None
        for k in range(bwd0, len(tasks)):
            if is_opt[k]:
                break
            name = layer_of.get(int(lays[k]))
            if name is not None and is_bwd[k]:
                current = name
                ready.setdefault(name, int(tasks[k]))
                if not acc_sym.any():
                    ready[name] = int(tasks[k])
            elif is_acc[k] and current is not None:
                ready[current] = int(tasks[k])
        opt = np.flatnonzero(is_opt[bwd0:])
        out.append(StepAnchors(int(s), ready, fwd_start, int(tasks[bwd0 + opt[0]]) if opt.size else -1, int(tasks[0])))
    if not out:
        raise UserError(f"{g.source}: no training steps on the main thread; profile with ProfilerStep annotations")
    return out


# --------------------------------------------------------------------------- the transformation
def _pieces(nbytes: int, piece: int) -> list[int]:
    k = max(1, math.ceil(nbytes / piece))
    base = nbytes // k
    return [base + (1 if i < nbytes - base * k else 0) for i in range(k)]


def chained_bucket_us(
    ready_us: Sequence[float],
    sizes_bytes: Sequence[int],
    comm_us: Callable[[int], float] | Sequence[Callable[[int], float]],
    *,
    lanes: int | None = None,
    collective: Sequence[bool] | None = None,
) -> list[float]:
    """Durations of the DDP buckets of one step where the process group runs collectives concurrently
    (gloo): a bucket that becomes ready (``ready_us``, in the profile's time) while the one before is
    still in flight joins its chain and takes ``comm_us(chain bytes with it) - comm_us(chain bytes
    before it)``, so that the chain ends as one all-reduce of all its bytes would; a bucket ready
    after the one before ended starts a new chain at ``comm_us(its bytes)``. Queued on one FIFO
    channel with these durations, the last bucket of a chain ends when the link has drained the
    chain's bytes; each bucket's own start-up and tail overlap the other's transfer.

    ``comm_us`` may be one cost per transfer (their sizes then in one unit for all, e.g. the bytes a
    rank puts on the wire): transfers of several kinds chain alike, each charged by its own cost.
    ``lanes``: the collectives the process group runs at once (``BACKEND_LANES``). With it, a transfer
    marked ``collective`` (default: all) waits for the end of the collective ``lanes`` before it (a
    worker thread), one not marked (gloo's point-to-point sends and receives, which run on no worker
    thread) never waits, and every transfer ends no sooner than its own time alone after it was
    issued (its rendezvous and start-up are its own). None: the first rule alone, as ``data_parallel``
    uses it.

    Why: gloo's two worker threads run DDP's buckets at once. On the mlp (buckets of 4.24 and 5.25 MB,
    2 processes, 20 Mbit/s, 2026-11-26) a hook's timestamps showed both all-reduces start within 6 ms
    and end together; the two alone took 2037-2282 and 2546-2597 ms (medians of 4), one after the
    other 4464-4617, both at once 4236-4267, one all-reduce of their 9.49 MB 4396-4436. On delayed
    links (``benchmarks/probe_gloo_delay.py --concurrent``, 2026-11-29, docs/log/validate.md) two
    all-reduces of 4 KiB issued together took as long as one, three twice as long, and all-gathers by
    point-to-point exchange beside them added nothing."""
    costs = list(comm_us) if isinstance(comm_us, Sequence) else [comm_us] * len(sizes_bytes)
    marks = [True] * len(sizes_bytes) if collective is None else list(collective)
    if lanes is not None and lanes < 1:
        raise UserError(f"chained transfers: lanes={lanes!r}; expected a positive number of collectives at once")
    out: list[float] = []
    end, chain = -math.inf, 0
    ends: list[float] = []  # where each collective ends
    for ready, n, cost, coll in zip(ready_us, sizes_bytes, costs, marks, strict=True):
        start = max(ready, end)  # where it starts on the FIFO channel
        issued = ready
        if lanes is not None and coll and len(ends) >= lanes:
            issued = max(ready, ends[-lanes])  # every worker thread busy: it waits for one
        if issued < end:  # in flight together with the chain before it
            done = end + cost(chain + n) - cost(chain)
            if lanes is not None:
                done = max(done, issued + cost(n))
            chain += n
        else:
            done, chain = max(issued, end) + cost(n), n
        t = max(done - start, 0.0)
        end = start + t
        if coll:
            ends.append(end)
        out.append(t)
    return out


def data_parallel(
    g: TaskGraph,
    params: Sequence[ParamInfo],
    layers: Sequence[str],
    cfg: DPConfig,
    comm_us: Callable[[int], float],
    *,
    broadcast_us: Callable[[int], float] | None = None,
    grad_order: Sequence[int] | None = None,
) -> TaskGraph:
    """``g`` as one rank of a ``cfg.world``-rank data-parallel job (see the module docstring).

    ``comm_us(bytes)`` is the all-reduce time of one message (e.g. a calibrated ring model);
    ``grad_order`` the parameter indices in gradient-ready order (default: reverse parameter order).
    """
    if not params:
        raise UserError(f"{g.source}: the trace records no parameters; a data-parallel what-if needs their sizes")
    if cfg.world == 1:
        return g
    anchors = step_anchors(g, layers)
    layer_rank = {name: i for i, name in enumerate(layers)}
    names: list[str] = []
    dur: list[float] = []
    order: list[float] = []
    steps: list[int] = []
    lay: list[str | None] = []
    size: list[int] = []
    prio: list[float] = []
    deps: list[list[int]] = []  # tasks that must finish before each new comm task
    waits: list[list[int]] = []  # tasks that must wait for each new comm task
    bcast = broadcast_us or comm_us
    alone_end: np.ndarray | None = None
    for si, a in enumerate(anchors):
        base = float(a.step) * 1e6
        nxt = anchors[si + 1] if si + 1 < len(anchors) else None
        if cfg.broadcast_bytes > 0 and a.fwd_start:
            first_fwd = min(a.fwd_start.values())
            names.append("broadcast:buffers")
            dur.append(bcast(cfg.broadcast_bytes))
            order.append(base)
            steps.append(a.step)
            lay.append(None)
            size.append(cfg.broadcast_bytes)
            prio.append(-1.0)
            deps.append([a.first] if a.first != first_fwd else [])
            waits.append([first_fwd])
        missing = sorted({q.layer for q in params} - set(a.ready))
        if missing:
            raise UserError(
                f"{g.source}: step {a.step} has no backward tasks for layer(s) {missing[:4]}; "
                "expected a trace profiled with `trainsim profile` (layer:<name> ranges)"
            )
        if cfg.mode == "ddp":
            buckets = ddp_buckets(
                [q.size_bytes for q in params], grad_order,
                cap_bytes=int(cfg.bucket_cap_mb * 1024 * 1024), first_cap_bytes=cfg.first_bucket_bytes,
            )  # fmt: skip
            nbytes_of = [sum(params[i].size_bytes for i in idx) for idx in buckets]
            if cfg.lanes > 1:  # when each bucket is ready: the single process's replay
                if alone_end is None:
                    from trainsim.simulate.engine import simulate

                    alone_end = simulate(g).end_us
                ready_at = [max(float(alone_end[a.ready[params[i].layer]]) for i in idx) for idx in buckets]
                bucket_us = chained_bucket_us(ready_at, nbytes_of, comm_us)
            else:
                bucket_us = [comm_us(n) for n in nbytes_of]
            for b, idx in enumerate(buckets):
                nbytes = nbytes_of[b]
                names.append(f"allreduce:bucket{b}")
                dur.append(bucket_us[b])
                order.append(base + 1 + b)
                steps.append(a.step)
                lay.append(None)
                size.append(nbytes)
                prio.append(float(b))
                deps.append(sorted({a.ready[params[i].layer] for i in idx}))
                waits.append([a.opt_start] if a.opt_start >= 0 else [])
            continue
        # priority modes: pieces of each layer's gradients, input-side layers first
        piece = cfg.slice_bytes if cfg.mode == "p3" else cfg.partition_bytes
        by_layer: dict[str, int] = {}
        for q in params:
            by_layer[q.layer] = by_layer.get(q.layer, 0) + q.size_bytes
        k = 0
        for layer in sorted(by_layer, key=lambda x: -layer_rank.get(x, 0)):  # ready order: output side first
            for j, nbytes in enumerate(_pieces(by_layer[layer], piece)):
                t = comm_us(nbytes)
                if cfg.mode == "bytescheduler":
                    t = max(t / cfg.credit, t - comm_us(0) * (1 - 1 / cfg.credit))  # latency hidden by credit
                    t += cfg.round_us  # but not its round (``DPConfig.round_us``)
                names.append(f"allreduce:{layer}.{j}")
                dur.append(t)
                order.append(base + 1 + k)
                steps.append(a.step)
                lay.append(layer)
                size.append(nbytes)
                prio.append(float(layer_rank.get(layer, 0)))
                deps.append([a.ready[layer]])
                w = [nxt.fwd_start[layer]] if nxt is not None and layer in nxt.fwd_start else []
                waits.append(w)
                k += 1
    out, new = insert(
        g, name=names, kind=TaskKind.COMM, resource=cfg.channel, dur_us=np.array(dur), order=np.array(order),
        step=np.array(steps, np.int32), layer=lay, size_bytes=np.array(size, np.int64),
        group=f"dp{cfg.world}", priority=np.array(prio),
    )  # fmt: skip
    src = [d for t, ds in zip(new, deps, strict=True) for d in ds]
    dst = [int(t) for t, ds in zip(new, deps, strict=True) for _ in ds]
    src += [int(t) for t, ws in zip(new, waits, strict=True) for _ in ws]
    dst += [w for ws in waits for w in ws]
    out = add_edges(out, src, dst, EdgeKind.COMM)
    if cfg.mode != "ddp":
        out = schedule(out, re.escape(cfg.channel), Policy.PRIORITY)
    if cfg.host_overhead_us > 0:
        out = with_host_overhead(out, anchors, cfg.host_overhead_us, finalize_us=cfg.finalize_us)
    return out


def with_host_overhead(
    g: TaskGraph, anchors: Sequence[StepAnchors], dur_us: float, *, finalize_us: float = 0.0
) -> TaskGraph:
    """One ``ddp:host-overhead`` task per step on the backward thread, queued just before the last
    gradient-ready point (the input-most layer's): it delays the last bucket and the optimizer step.
    With ``finalize_us`` (a part of ``dur_us``), that part is a ``ddp:finalize`` task of its own, queued
    just before the step's first optimizer task and after everything that task waits for on other
    resources (the buckets' collectives, a hook's decode): DDP copies the reduced buckets back into the
    gradients once the last one is done. ``anchors``: ``step_anchors`` of ``g``."""
    fin = [a for a in anchors if a.opt_start >= 0] if finalize_us > 0 else []
    # the rest of the work, in the steps that have an optimizer to put the finalize before
    pre = [(max(a.ready.values(), key=lambda t: g.order[t]), dur_us - (finalize_us if a.opt_start >= 0 else 0.0))
           for a in anchors if a.ready]  # fmt: skip
    last = [t for t, d in pre if d > 0]
    out = g
    if last:
        res = [g.resources[int(g.resource[t])] for t in last]
        out, _ = insert(
            g, name=["ddp:host-overhead"] * len(last), kind=TaskKind.CPU, resource=[r.name for r in res],
            dur_us=np.array([d for _, d in pre if d > 0]), order=np.array([g.order[t] for t in last]) - 1e-3,
            resource_kind=res[0].kind, step=np.array([g.step[t] for t in last], np.int32),
        )  # fmt: skip
    if not fin:
        return out
    opt = np.array([a.opt_start for a in fin], np.int64)  # ids survive ``insert`` (it appends)
    res = [out.resources[int(out.resource[t])] for t in opt]
    out, new = insert(
        out, name=["ddp:finalize"] * len(fin), kind=TaskKind.CPU, resource=[r.name for r in res],
        dur_us=finalize_us, order=out.order[opt] - 1e-3, resource_kind=res[0].kind,
        step=out.step[opt].astype(np.int32),
    )  # fmt: skip
    # everything the optimizer waits for on another resource, the finalize waits for too
    hit = np.isin(out.edge_dst, opt) & (out.resource[out.edge_src] != out.resource[out.edge_dst])
    if not hit.any():
        return out
    by = np.argsort(opt)
    to_new = np.asarray(new, np.int64)[by[np.searchsorted(opt[by], out.edge_dst[hit])]]
    return add_edges(out, out.edge_src[hit], to_new, EdgeKind.COMM)


def dp_step_ms(step_ms: np.ndarray, mode: str) -> float:
    """Steady-state step time of a simulated DP graph: median over steps, without the first and last in
    the priority modes (the first waits for no earlier gradients, the last's are waited for by nothing)."""
    s = np.asarray(step_ms, float)
    s = s[np.isfinite(s)]
    if mode != "ddp" and s.size > 2:
        s = s[1:-1]
    return float(np.median(s)) if s.size else 0.0
