"""Out-of-order backprop what-ifs: data-parallel reverse first-k, and weight gradients on a second stream.

    >>> from trainsim.capture.layerprofile import profile_layers
    >>> from trainsim.cluster.catalog import link
    >>> from trainsim.cluster.collectives import AlphaBeta
    >>> from trainsim.transform.ooo import predict_dp, search_k
    >>> prof = profile_layers("mlp", batch_sizes=(32,))                            # doctest: +SKIP
    >>> net = AlphaBeta(link("custom:1:200"))                 # 1 Gbit/s, 200 us    # doctest: +SKIP
    >>> predict_dp(prof, 32, k=0, net=net), predict_dp(prof, 32, k=2, net=net)     # doctest: +SKIP
    >>> search_k(prof, 32, net)                                                    # doctest: +SKIP

Both build a ``TaskGraph`` of one rank from a single-process per-layer profile
(``trainsim.capture.layerprofile``) with ``GraphBuilder`` and replay it with
``trainsim.simulate.engine.simulate``; the task order on each resource is the order in which
``trainsim.run.ooo_dp.OooDataParallel`` issues the work, so what is simulated is what runs.

Data parallel (one rank; the ranks are symmetric): a CPU thread runs F, B, W and optimizer updates;
layers ``i >= k`` cost their fused backward, the reordered ones their split B and W; a FIFO
communication channel runs the per-layer gradient all-reduces in issue order (gloo runs a
process group's collectives one after another). The deferred update of layer ``i < k`` waits for its
all-reduce just before ``F(i)`` of the next step; the others wait at the end of the step.

Single device, multi-stream (OOO BackProp §4): the main stream runs F and B; every W goes to a
second stream. ``schedule_map[i]`` is ``("BWD", j)`` to start W(i) once B(min(i, j)) is done in the
same step (B runs last layer first, and W(i) needs B(i)'s captured gradients), or ``("FWD", j)`` to defer it to the next step, issued with F(j) (before F(i) needs the
updated weights). Streams are modelled as independent resources, i.e. perfect overlap: the result is
an upper bound on what concurrent kernels on one GPU can give (no GPU was available to calibrate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from trainsim.errors import UserError
from trainsim.graph.ir import GraphBuilder, ResourceKind, TaskGraph, TaskKind

if TYPE_CHECKING:
    from trainsim.capture.layerprofile import LayerProfile
    from trainsim.cluster.collectives import CollectiveCost
    from trainsim.simulate.engine import Replay


def dp_graph(
    prof: LayerProfile, batch_size: int, k: int, net: CollectiveCost, *, world: int = 2, steps: int = 4,
    host: HostTerms | None = None,
) -> TaskGraph:
    """One rank of ``OooDataParallel(k)`` among ``world`` for ``steps`` steps (k = 0 is DDP with a bucket per
    layer); ``net`` prices the all-reduces. ``host``: the rank's host as measured beside the run
    (``HostTerms``): its CPU tasks run ``host.factor`` times slower, and each step's CPU tasks share
    ``host.extra_us`` more, in proportion to their length."""
    rows = prof.table(batch_size)
    n = len(rows)
    if not 0 <= k <= n:
        raise UserError(f"--k {k}: model {prof.model!r} has {n} layers; expected 0 <= k <= {n}")
    b = GraphBuilder(f"ooo-dp:k={k}")
    cpu = b.resource("rank0:cpu", ResourceKind.CPU_THREAD)
    chan = b.resource("allreduce", ResourceKind.COMM_CHANNEL)
    pending: dict[int, int] = {}  # layer -> all-reduce task of the previous step
    loss_us = prof.loss_us(batch_size)

    def on_cpu(what: str, i: int, dur: float, step: int, deps: Sequence[int] = ()) -> int:
        name = rows[i]["name"]
        return b.task(f"{what}:{name}", TaskKind.CPU, cpu, dur, step=step, layer=name, deps=deps)

    def allreduce(i: int, step: int) -> None:
        size = int(rows[i]["param_bytes"])
        if size > 0:
            pack = on_cpu("pack", i, rows[i]["pack_us"], step)
            pending[i] = b.task(f"allreduce:{rows[i]['name']}", TaskKind.COMM, chan, net.time_us("allreduce", size, world),
                                step=step, layer=rows[i]["name"], deps=[pack], size_bytes=size, group="dp")  # fmt: skip

    def update(i: int, step: int) -> None:
        if i in pending:
            on_cpu("update", i, rows[i]["unpack_us"] + rows[i]["opt_us"], step, [pending.pop(i)])

    for step in range(steps):
        for i, r in enumerate(rows):
            update(i, step)  # deferred (i < k) updates from the previous step
            on_cpu("F", i, r["fwd_us"], step)
        b.task("loss", TaskKind.CPU, cpu, loss_us, step=step)
        for i in range(n - 1, -1, -1):
            if i >= k:  # fused B+W, as plain backprop
                on_cpu("BW", i, rows[i]["bwd_us"], step)
                allreduce(i, step)
            else:
                on_cpu("B", i, rows[i]["bwd_input_us"], step)
        for i in range(k):
            on_cpu("W", i, rows[i]["bwd_weight_us"], step)
            allreduce(i, step)
        for i in range(k, n):
            update(i, step)
    g = b.build()
    if host is None or (host.factor == 1.0 and host.extra_us == 0.0):
        return g
    from trainsim.transform.primitives import scale

    # the extra work is the runtime's own between the layers' calls and the wait for the slowest rank:
    # spread over the step's CPU tasks, it delays every all-reduce's issue, as it does in the real run
    # (as one task after the last issue it hid behind the all-reduces still in flight: the transformer
    # at 1 Gbit/s was predicted 11-13 % low in three runs, its last two all-reduces ending 18 ms after
    # backward where a traced run took 31-36 ms). Per step: the CPU of a step with every update in it.
    cpu_tasks = g.kind == TaskKind.CPU
    per_step_us = float(g.dur_us[cpu_tasks & (g.step == min(1, steps - 1))].sum())
    stretch = host.factor + (host.extra_us / per_step_us if per_step_us > 0 else 0.0)
    return scale(g, cpu_tasks, stretch)


@dataclass(frozen=True, kw_only=True, slots=True)
class HostTerms:
    """What a rank's host adds to the per-layer profile when the ranks share it (measured by
    ``trainsim.validate.ooo`` with the real runtime in one-rank groups)."""

    factor: float = 1.0
    """compute slowdown with every rank's process running at once (co-run / alone)"""
    extra_us: float = 0.0
    """per step: the runtime's own host work beyond the profile, plus the expected wait for the
    slowest rank"""

    def __post_init__(self) -> None:
        if not self.factor > 0 or not self.extra_us >= 0:
            raise ValueError(f"HostTerms: factor={self.factor}, extra_us={self.extra_us}; expected > 0 and >= 0")


def interpolated_terms(lo: HostTerms, hi: HostTerms, n: int) -> Callable[[int], HostTerms]:
    """Host terms of every k in 0..n, linear in k between those measured at k = 0 (``lo``) and k = n
    (``hi``): the runtime's own work grows with the layers it reorders (per layer an early all-reduce,
    a wait before its forward and a deferred update; measured 2.9 ms at k = 0 and 8.0 ms at k = 3 of 5
    on the transformer), and a search that gave every k the terms of k = 0 chose k where the chosen
    k's own terms then predicted a slowdown."""

    def at(k: int) -> HostTerms:
        t = min(1.0, max(0.0, k / n)) if n > 0 else 0.0
        return HostTerms(factor=lo.factor + t * (hi.factor - lo.factor), extra_us=lo.extra_us + t * (hi.extra_us - lo.extra_us))

    return at


def steady_step_ms(graph: TaskGraph, replay: Replay | None = None) -> float:
    """Mean step time after the first step: distance between the ends of consecutive steps.
    ``replay``: how to replay ``graph`` (default ``simulate``; a validation passes the test host's
    contended replay, ``trainsim.testbed.contention``)."""
    from trainsim.simulate.engine import simulate

    res = (replay or simulate)(graph)
    return _steady_ms(graph, res.end_us)


def _steady_ms(graph: TaskGraph, end_us: np.ndarray) -> float:
    steps = int(graph.step.max()) + 1
    ends = np.array([end_us[graph.step == s].max() for s in range(steps)])
    if steps == 1:
        return float(ends[0] / 1e3)
    return float((ends[-1] - ends[0]) / (steps - 1) / 1e3)


def predict_dp(
    prof: LayerProfile,
    batch_size: int,
    k: int,
    net: CollectiveCost,
    *,
    world: int = 2,
    steps: int = 4,
    replay: Replay | None = None,
    host: HostTerms | None = None,
) -> float:
    """Predicted step time (ms) of reverse-first-k data parallelism (``replay``: see ``steady_step_ms``;
    ``world``, ``host``: see ``dp_graph``)."""
    return steady_step_ms(dp_graph(prof, batch_size, k, net, world=world, steps=steps, host=host), replay)


def search_k(
    prof: LayerProfile,
    batch_size: int,
    net: CollectiveCost,
    replay: Replay | None = None,
    host: HostTerms | Callable[[int], HostTerms] | None = None,
    *,
    world: int = 2,
) -> tuple[int, dict[int, float]]:
    """The k with the smallest predicted step time (ties: the smaller k), and every k's prediction.
    ``replay``: see ``steady_step_ms``; ``host``: the host's terms, the same for every k or per k (e.g.
    ``interpolated_terms``)."""
    n = len(prof.table(batch_size))
    pred = {
        k: predict_dp(prof, batch_size, k, net, world=world, replay=replay, host=host(k) if callable(host) else host)
        for k in range(n + 1)
    }  # fmt: skip
    best = min(pred, key=lambda k: (round(pred[k], 6), k))
    return best, pred


# ---------------------------------------------------------------------- single device, two streams
ScheduleMap = Sequence[tuple[str, int]]


def check_schedule_map(schedule_map: ScheduleMap, n_layers: int) -> list[tuple[str, int]]:
    """The map as a list, or a ``UserError`` naming the first bad entry."""
    smap = [(str(w), int(j)) for w, j in schedule_map]
    if len(smap) != n_layers:
        raise UserError(f"schedule map has {len(smap)} entries; the model has {n_layers} layers")
    for i, (when, j) in enumerate(smap):
        if when not in ("BWD", "FWD") or not 0 <= j < n_layers:
            raise UserError(
                f"schedule map entry {i}: ({when!r}, {j}); expected ('BWD'|'FWD', 0..{n_layers - 1})"
            )
        if when == "FWD" and j > i:
            raise UserError(f"schedule map entry {i}: ('FWD', {j}) defers W of layer {i} past its own forward")
    return smap


def multistream_graph(
    prof: LayerProfile, batch_size: int, schedule_map: ScheduleMap | None, *, steps: int = 4
) -> TaskGraph:
    """One device; ``schedule_map`` None = plain single-stream backprop (B+W fused per layer, then the
    updates). The task order is ``trainsim.run.multistream.TwoStreamTrainer``'s issue order: W(i) and
    its update right after B of its trigger layer, deferred ones before F of their layer.

    A profile from ``trainsim.run.multistream.profile_streams`` (rows with ``host_*`` fields) adds the
    host: one CPU thread issues the phases in that order, and a phase's device work starts once the
    host has begun issuing it and is not done before the host has finished issuing it (a zero-length
    marker after both). A CPU profile (``trainsim.capture.layerprofile``) has no host part."""
    rows = prof.table(batch_size)
    entry = prof.by_batch[batch_size]
    n = len(rows)
    smap = check_schedule_map(schedule_map, n) if schedule_map is not None else None
    split = smap is not None
    with_host = "host_fwd_us" in rows[0]
    b = GraphBuilder("multistream" if split else "single-stream")
    main = b.resource("dev:main", ResourceKind.GPU_STREAM)
    sub = b.resource("dev:sub", ResourceKind.GPU_STREAM) if split else main
    host = b.resource("host", ResourceKind.CPU_THREAD) if with_host else -1
    last_host: list[int] = []  # the host task issued last (the next phase starts after it)

    def field(i: int, key: str, split_key: str) -> tuple[float, float]:
        row = rows[i] if i >= 0 else entry
        k = split_key if split and split_key in row else key
        return float(row[k]), float(row.get("host_" + k, 0.0))

    def phase(name: str, stream: int, dev_host: tuple[float, float], step: int, layer: int, deps: list[int]) -> int:
        dev, host_us = dev_host
        lname = rows[layer]["name"] if layer >= 0 else None
        if not with_host:
            return b.task(name, TaskKind.KERNEL, stream, dev, step=step, layer=lname, deps=deps)
        issued_after = list(last_host)
        issue = b.task(f"issue:{name}", TaskKind.CPU, host, host_us, step=step, layer=lname)
        last_host[:] = [issue]
        # the kernels may start once the host has begun issuing them ...
        run = b.task(name, TaskKind.KERNEL, stream, dev, step=step, layer=lname, deps=deps + issued_after)
        # ... and the phase is not done before its last launch: a zero-length marker after both
        return b.task(f"done:{name}", TaskKind.KERNEL, stream, 0.0, step=step, layer=lname, deps=[run, issue])

    def weight_and_update(i: int, step: int, after: int) -> int:
        w = phase(f"W:{rows[i]['name']}", sub, field(i, "bwd_weight_us", "bwd_weight_us"), step, i, [after])
        return phase(f"update:{rows[i]['name']}", sub, field(i, "opt_us", "opt_split_us"), step, i, [w])

    carried: dict[int, int] = {}  # layer -> its last update (the layer's next F waits for it)
    held: dict[int, int] = {}  # deferred layer -> its B task of the previous step
    deferred: dict[int, list[int]] = {}  # forward layer j -> deferred layers issued before F(j)
    by_trigger: dict[int, list[int]] = {}
    for i, (when, j) in enumerate(smap or []):
        if when == "BWD":
            by_trigger.setdefault(min(i, j), []).append(i)
        else:
            deferred.setdefault(j, []).append(i)
    for step in range(steps):
        other = float(entry.get("host_other_split_us" if split else "host_other_us", 0.0))
        if split:  # the events and stream bookkeeping of the second stream (``profile_streams`` on a GPU)
            other += float(entry.get("host_two_streams_extra_us", 0.0))
        if with_host and other > 0:
            last_host[:] = [b.task("issue:step", TaskKind.CPU, host, other, step=step, deps=last_host)]
        for i in range(n):
            for d in deferred.get(i, []) if step > 0 else []:
                carried[d] = weight_and_update(d, step, held.pop(d))
            deps = [carried.pop(i)] if i in carried else []
            phase(f"F:{rows[i]['name']}", main, field(i, "fwd_us", "fwd_split_us"), step, i, deps)
        loss = (float(entry["loss_us"]), float(entry.get("host_loss_us", 0.0)))
        phase("loss", main, loss, step, -1, [])
        for i in range(n - 1, -1, -1):
            if not split:
                phase(f"BW:{rows[i]['name']}", main, field(i, "bwd_us", "bwd_us"), step, i, [])
                continue
            bi = phase(f"B:{rows[i]['name']}", main, field(i, "bwd_input_us", "bwd_input_us"), step, i, [])
            for k in by_trigger.get(i, []):
                carried[k] = weight_and_update(k, step, bi)
            if smap is not None and smap[i][0] == "FWD":
                held[i] = bi
        if not split:
            for i in range(n):
                phase(f"update:{rows[i]['name']}", main, field(i, "opt_us", "opt_us"), step, i, [])
    return b.build()


def predict_multistream(prof: LayerProfile, batch_size: int, schedule_map: ScheduleMap | None) -> float:
    """Predicted step (ms). With a ``stream_corun_factor`` f in the profile (``profile_streams`` on a
    GPU), a kernel runs f times slower while the other stream's kernels run: concurrent kernels share
    the SMs (``trainsim.simulate.overlap.corun_extra_us``, replayed until the schedule settles)."""
    graph = multistream_graph(prof, batch_size, schedule_map)
    factor = float(prof.by_batch[batch_size].get("stream_corun_factor", 1.0))
    if schedule_map is None or factor <= 1.0:
        return steady_step_ms(graph)
    from trainsim.simulate.engine import simulate
    from trainsim.simulate.overlap import corun_extra_us

    on_stream = np.array([r.kind == ResourceKind.GPU_STREAM for r in graph.resources], bool)[graph.resource]
    victims = np.flatnonzero(on_stream & (graph.dur_us > 0))
    res = simulate(graph)
    for _ in range(4):
        extra = corun_extra_us(res.start_us, res.end_us, graph.resource, victims, factor)
        res = simulate(graph.with_columns(dur_us=graph.dur_us + extra))
    return _steady_ms(graph, res.end_us)


def search_schedule_map(prof: LayerProfile, batch_size: int) -> tuple[list[tuple[str, int]], float]:
    """Greedy map: start from all ("BWD", i); try deferring each layer to ("FWD", j), keep what helps."""
    n = len(prof.table(batch_size))
    cur: list[tuple[str, int]] = [("BWD", i) for i in range(n)]
    best = predict_multistream(prof, batch_size, cur)
    for i in range(n):
        for j in range(i + 1):
            cand = list(cur)
            cand[i] = ("FWD", j)
            t = predict_multistream(prof, batch_size, cand)
            if t < best - 1e-9:
                best, cur = t, cand
    return cur, best


def describe(pred: dict[int, float]) -> list[dict[str, Any]]:
    return [{"k": k, "predicted_ms": round(v, 3)} for k, v in sorted(pred.items())]
