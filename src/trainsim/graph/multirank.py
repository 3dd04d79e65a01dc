"""Every rank of one job in one task graph: load the traces, align their clocks, join their collectives.

    >>> from trainsim.graph.multirank import load_job, job_summary
    >>> from trainsim.simulate.engine import simulate
    >>> job = load_job(["out/run/rank0.json.gz", "out/run/rank1.json.gz"])   # doctest: +SKIP
    >>> job_summary(job, simulate(job.graph))["simulated_ms"]                 # doctest: +SKIP

A collective finishes only after its last rank arrives, so a slow rank (a straggler) makes every
other rank wait. One rank's trace shows that wait as a long collective; the job's traces together
show who waited for whom. ``load_job`` builds the job's graph in five steps:

1. **Load.** Each trace becomes its graph (``graph.build``). The rank comes from the trace's
   ``distributedInfo``, else its sidecar (``*.trainsim.json``), else a ``rank<N>`` in its file name.
   Traces that say they belong to different jobs (the same rank twice, another world size, sidecars
   that name another model or batch size) are refused; a rank the world size promises but no trace
   brings is a warning, and the others are simulated.
2. **Match collectives.** The collectives are what ``graph.build`` made ``COMM`` tasks: gloo/mpi/ucc
   ranges on a CPU thread, NCCL kernels on a GPU stream. The same collective on every rank has the
   same key: (process group, ``Seq``) where the trace gives sequence numbers for the whole group,
   else (process group, step, position among that step's collectives of the group); its name and
   size must then agree on every rank.
3. **Align clocks.** Profilers on different hosts use different clocks. A collective ends at nearly
   the same time on every rank, so each rank's offset to the first rank is the median, over the
   matched collectives, of the difference of their end times (the median ignores the odd range that
   closed late because its thread was descheduled), kept within the bounds causality sets (no rank's
   collective ends before every rank has arrived). Ranks recorded on the same host as the first share
   its clock: their offset stays 0 where causality allows it. If the ends still disagree by more than
   ``max(ALIGN_TOL_US, ALIGN_TOL_FRAC x the median collective)`` (median over collectives), the
   clocks cannot be aligned: an error naming the ranks.
4. **Merge.** Resources are renamed ``r<rank>/<name>``; times move to the job's clock; a ``start``
   task on ``r<rank>/start`` holds each rank back by the lead its profiler started with.
5. **Join collectives.** Each rank's collective task is split into an *arrival* (``SYNC``, 0 us, at
   the traced start) and its *transfer* (``COMM``, from the last rank's arrival to its traced end,
   aligned clocks). A zero-length barrier task on ``job/collective:<group>`` waits for every rank's
   arrival, and every rank's transfer waits for the barrier. Waiting for peers is then no longer a
   fixed duration but whatever the replay makes it, so what-ifs see stragglers.

``task_ranks``, ``rank_anchors``, ``barriers`` and ``compute_mask`` read the rank structure back from
any graph built this way (the resource names carry it), so transformations of the graph keep it.

Why one module: the five steps of ``load_job`` pass private intermediates to one another (``_Coll``,
the matched keys, the clock offsets), and the helpers that read a job's graph back (``task_ranks``,
``rank_anchors``) parse the ``r<rank>/`` resource names that ``merge_ranks`` writes; split by step, those
would become cross-module internals.
"""

from __future__ import annotations

import re
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.capture.kineto import CPU_CATS, Trace, read_trace
from trainsim.errors import UserError
from trainsim.graph import ir
from trainsim.graph.build import COMM_CPU_RX, GAP, STEP_RX, build_graph
from trainsim.graph.ir import (
    F64,
    I32,
    I64,
    EdgeKind,
    Mask,
    Resource,
    ResourceKind,
    Steps,
    TaskGraph,
    TaskKind,
    concat_symbols,
)

ALIGN_TOL_US = 1000.0
"""Floor of the clock-alignment tolerance (µs). Ends of one gloo all-reduce on two loopback ranks
differed by 28-97 µs once aligned (a 2-rank MLP run, 9.5 MB all-reduce of ~8 ms); 1 ms leaves room
for a real network's last-chunk skew."""
ALIGN_TOL_FRAC = 0.25
"""The tolerance grows with the collectives: a ring's last chunk reaches ranks up to a fraction of the
collective's duration apart."""
SAME_HOST_MAX_OFFSET_US = 500_000.0
"""Ranks profiled on one host share its clock; collectives 0.5 s or more apart there mean two runs."""
BARRIER_PREFIX = "job/collective:"
_RANK_RX = re.compile(r"^r(\d+)/")
_FILE_RANK_RX = re.compile(r"rank(\d+)")
_COMPUTE_KINDS = np.array([int(k) for k in (TaskKind.CPU, TaskKind.RUNTIME, TaskKind.KERNEL, TaskKind.MEMCPY,
                                            TaskKind.MEMSET)])  # fmt: skip
_SIDECAR_JOB_KEYS = ("model", "batch_size", "world", "optimizer", "width", "depth")


@dataclass(frozen=True, slots=True)
class RankInfo:
    """One rank of a job: where it came from, its clock, and its traced steps (job clock)."""

    rank: int
    path: str
    offset_us: float  # this rank's clock minus the reference (first) rank's clock, estimated
    shift_us: float  # added to the trace's own times (µs since its first event) to get job times
    step_ids: I32
    step_start_us: F64
    step_end_us: F64

    @property
    def measured_ms(self) -> F64:
        return np.asarray((self.step_end_us - self.step_start_us) / 1e3, np.float64)


@dataclass(frozen=True, slots=True)
class Job:
    """The job's graph and what was learnt while building it (``load_job``)."""

    graph: TaskGraph
    ranks: tuple[RankInfo, ...]
    world: int | None  # the world size the traces state, None when they do not
    missing: tuple[int, ...]  # ranks of the world with no trace
    collectives: int  # collectives matched on every rank (each got a barrier)
    residual_us: float  # median |end-time disagreement| left after aligning the clocks

    def with_graph(self, g: TaskGraph) -> Job:
        """The same job with a transformed graph (transformations keep resources, so ranks stay valid)."""
        return replace(self, graph=g)


class _Coll:
    """One rank's view of one collective (a few hundred per trace: a plain class is fine)."""

    __slots__ = ("group", "key", "name", "size", "step", "t0", "t1", "tasks")

    def __init__(self, name: str, group: str, size: int, step: int, seq: int | None, t0: float, t1: float,
                 tasks: I64) -> None:  # fmt: skip
        self.name, self.group, self.size, self.step, self.t0, self.t1 = name, group, size, step, t0, t1
        self.tasks = tasks  # COMM task ids in the rank's graph, in time order
        self.key: tuple[Any, ...] = ("seq", group, seq) if seq is not None else ()


# --------------------------------------------------------------------------- public entry points
def expand_paths(paths: Sequence[str | Path]) -> list[Path]:
    """The trace files behind ``paths``: files as given; for a folder, its rank traces.

    In a folder, ``*.json.gz`` and ``*.json`` files except sidecars (``*.trainsim.json``); when some
    are named ``rank<N>``, only those (a timeline written next to them is not a rank)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            out.append(p)
            continue
        found = sorted(
            f for f in p.iterdir()
            if f.is_file() and f.name.endswith((".json", ".json.gz")) and not f.name.endswith(".trainsim.json")
        )  # fmt: skip
        ranked = [f for f in found if _FILE_RANK_RX.search(f.name)]
        found = ranked or found
        if not found:
            raise UserError(f"{p}: no traces (*.json.gz, *.json) in this folder; expected one per rank")
        out.extend(found)
    if len(set(out)) != len(out):
        dup = next(x for x in out if out.count(x) > 1)
        raise UserError(f"{dup}: given twice; expected each rank's trace once")
    return out


def load_job(paths: Sequence[str | Path]) -> Job:
    """Load the traces of one job (files, or a folder of them) into one graph (module doc, steps 1-5)."""
    files = expand_paths(paths)
    if not files:
        raise UserError("no traces given; expected a folder of rank traces or several trace files")
    traces = [read_trace(f) for f in files]
    ranks, world, missing = _ranks_of(traces, files)
    order = sorted(range(len(files)), key=lambda i: ranks[i])
    traces, files, ranks = [traces[i] for i in order], [files[i] for i in order], [ranks[i] for i in order]
    graphs = [build_graph(tr) for tr in traces]
    colls = [_collectives(tr, g) for tr, g in zip(traces, graphs, strict=True)]
    keys = _match(colls, files)
    offsets, residual = _align(traces, colls, keys, files, ranks)
    origin = min(tr.base_us - d for tr, d in zip(traces, offsets, strict=True))
    shifts = [tr.base_us - d - origin for tr, d in zip(traces, offsets, strict=True)]
    g = merge_ranks(graphs, ranks, shifts)
    g = _join(g, graphs, colls, keys, ranks, shifts)
    infos = tuple(
        RankInfo(rank=r, path=str(f), offset_us=float(d), shift_us=float(s), step_ids=gr.steps.ids.copy(),
                 step_start_us=gr.steps.start_us + s, step_end_us=gr.steps.end_us + s)
        for r, f, d, s, gr in zip(ranks, files, offsets, shifts, graphs, strict=True)
    )  # fmt: skip
    return Job(
        graph=g, ranks=infos, world=world, missing=missing, collectives=len(keys), residual_us=residual
    )


def merge_ranks(graphs: Sequence[TaskGraph], ranks: Sequence[int] | None = None,
                shift_us: Sequence[float] | None = None) -> TaskGraph:  # fmt: skip
    """One graph holding every rank's tasks, unconnected: resources renamed ``r<rank>/<name>``, times
    shifted by ``shift_us[i]`` onto the job's clock, and a ``start`` task per rank (on ``r<rank>/start``)
    that holds the rank back by the lead its first task has on the job's clock."""
    ranks = list(range(len(graphs))) if ranks is None else list(ranks)
    shifts = [0.0] * len(graphs) if shift_us is None else [float(s) for s in shift_us]
    if not (len(ranks) == len(shifts) == len(graphs)) or len(set(ranks)) != len(ranks):
        raise UserError(f"merge_ranks: {len(graphs)} graphs, ranks {ranks}, {len(shifts)} shifts; "
                        "expected one distinct rank and one shift per graph")  # fmt: skip
    symbols: tuple[str, ...] = ()
    resources: list[Resource] = []
    cols: dict[str, list[np.ndarray]] = defaultdict(list)
    edges: list[dict[str, np.ndarray]] = []
    firsts = [float(np.nanmin(g.ts_us)) + s if g.n_tasks and np.isfinite(g.ts_us).any() else s
              for g, s in zip(graphs, shifts, strict=True)]  # fmt: skip
    t_job = min(firsts, default=0.0)
    base = 0
    for g, r, s, first in zip(graphs, ranks, shifts, firsts, strict=True):
        symbols, index = concat_symbols(symbols, (*g.symbols, "start"))
        remap = np.array([index[x] for x in g.symbols] + [-1], np.int32)
        r0 = len(resources)
        resources.extend(Resource(f"r{r}/{x.name}", x.kind, x.policy) for x in g.resources)
        for c in ("kind", "order", "dur_us", "step", "size_bytes", "priority"):
            cols[c].append(getattr(g, c))
        for c in ("name", "op", "layer", "group"):
            cols[c].append(remap[getattr(g, c)])
        cols["resource"].append(g.resource + r0)
        cols["order"][-1] = g.order + s
        cols["ts_us"].append(g.ts_us + s)
        edges.append(
            {c: getattr(g, c) + (base if c in ("edge_src", "edge_dst") else 0) for c in _EDGE_COLUMNS}
        )
        # the rank's start task: first on every resource of the rank waits for it
        start = base + g.n_tasks
        resources.append(Resource(f"r{r}/start", ResourceKind.CPU_THREAD))
        _append_row(cols, kind=TaskKind.SYNC, name=index["start"], resource=len(resources) - 1, order=t_job,
                    dur_us=first - t_job, ts_us=t_job)  # fmt: skip
        q = g.queue_order()
        head_tasks = q[np.flatnonzero(np.r_[True, np.diff(g.resource[q]) != 0])] + base if g.n_tasks else q
        edges.append(
            _new_edges([start] * len(head_tasks), list(head_tasks), [int(EdgeKind.DATA)] * len(head_tasks))
        )
        base = start + 1
    out = TaskGraph(
        symbols=symbols,
        resources=tuple(resources),
        **_concat_edges(edges),
        steps=_job_steps(graphs, shifts),
        source=" + ".join(g.source for g in graphs),
        **_columns(cols),
    )
    out.validate()
    return out


# --------------------------------------------------------------------------- reading the structure back
def task_ranks(g: TaskGraph) -> I32:
    """The rank of every task (from its resource's ``r<rank>/`` prefix); -1 for job-level tasks."""
    res_rank = np.array([int(m.group(1)) if (m := _RANK_RX.match(r.name)) else -1 for r in g.resources] or [-1],
                        np.int32)  # fmt: skip
    return res_rank[g.resource] if g.n_tasks else np.zeros(0, np.int32)


def rank_anchors(g: TaskGraph) -> dict[int, int]:
    """Each rank's step anchor: its resource with the most untraced in-step time (``ProfilerStep#N``
    pieces, which ``graph.build`` puts only on the thread that carries the step annotations)."""
    step_sym = np.array([STEP_RX.match(s) is not None for s in g.symbols] + [False], np.bool_)
    on = step_sym[g.name]
    counts = np.bincount(g.resource[on], minlength=len(g.resources))
    ranks = task_ranks(g)
    res_rank = np.full(len(g.resources), -1, np.int64)
    res_rank[g.resource] = ranks
    out: dict[int, int] = {}
    for r in np.unique(ranks[ranks >= 0]).tolist():
        mine = np.flatnonzero(res_rank == r)
        best = mine[np.argmax(counts[mine])] if mine.size else -1
        if best >= 0 and counts[best] > 0:
            out[int(r)] = int(best)
    return out


def barriers(g: TaskGraph) -> tuple[I64, I64, I64]:
    """``(barrier, arrival, transfer)`` triples, one row per rank and collective, from the edges that
    ``load_job`` added around each barrier task."""
    is_barrier = np.array([r.name.startswith(BARRIER_PREFIX) for r in g.resources] or [False], np.bool_)
    on = is_barrier[g.resource]
    into = on[g.edge_dst] & ~on[g.edge_src]
    out_of = on[g.edge_src] & ~on[g.edge_dst]
    b_in, arr = g.edge_dst[into].astype(np.int64), g.edge_src[into].astype(np.int64)
    b_out, xfer = g.edge_src[out_of].astype(np.int64), g.edge_dst[out_of].astype(np.int64)
    ranks = task_ranks(g)
    # pair each arrival with the transfer of the same rank and barrier
    key_out = {(int(b), int(ranks[t])): int(t) for b, t in zip(b_out, xfer, strict=True)}
    trip = [
        (int(b), int(a), key_out.get((int(b), int(ranks[a])), -1)) for b, a in zip(b_in, arr, strict=True)
    ]
    arr3 = np.array(trip, np.int64).reshape(-1, 3)
    return arr3[:, 0], arr3[:, 1], arr3[:, 2]


def compute_mask(g: TaskGraph) -> Mask:
    """Tasks that are a rank's own work: CPU, runtime, kernel and copy tasks, less idle gaps of
    non-anchor threads and less untraced anchor time spent inside one of the rank's collectives
    (the main thread blocked on the result, not computing)."""
    m = np.isin(g.kind, _COMPUTE_KINDS)
    anchors = set(rank_anchors(g).values())
    on_anchor = np.isin(g.resource, np.fromiter(anchors, np.int64, len(anchors)))
    gap = g.symbol_id(GAP)
    untraced_sym = np.array([STEP_RX.match(s) is not None or s == GAP for s in g.symbols] + [False], np.bool_)
    if gap >= 0:
        m &= ~((g.name == gap) & ~on_anchor)
    cand = np.flatnonzero(m & on_anchor & untraced_sym[g.name])
    _, arr, xfer = barriers(g)
    ok = xfer >= 0
    if cand.size and ok.any():
        ranks = task_ranks(g)
        w0, w1 = g.ts_us[arr[ok]], g.ts_us[xfer[ok]] + g.dur_us[xfer[ok]]
        wr = ranks[arr[ok]]
        for t in cand.tolist():
            a, d = g.ts_us[t], g.dur_us[t]
            if d <= 0:
                continue
            same = wr == ranks[t]
            overlap = np.clip(np.minimum(w1[same], a + d) - np.maximum(w0[same], a), 0, None)
            if overlap.size and overlap.max() > 0.5 * d:
                m[t] = False
    return m


# --------------------------------------------------------------------------- the job's steps, simulated
def rank_step_bounds(g: TaskGraph, start_us: F64, end_us: F64, ids: np.ndarray) -> dict[int, tuple[F64, F64]]:
    """Per rank, simulated ``(start, end)`` of each step in ``ids``: its anchor's tasks of the step
    (as ``SimResult.step_bounds_us`` does for one rank)."""
    out: dict[int, tuple[F64, F64]] = {}
    ids = np.asarray(ids, np.int64)
    for r, a in rank_anchors(g).items():
        on = np.flatnonzero((g.resource == a) & np.isin(g.step, ids))
        pos = np.searchsorted(ids, g.step[on])
        t0, t1 = np.full(ids.size, np.inf), np.full(ids.size, -np.inf)
        np.minimum.at(t0, pos, start_us[on])
        np.maximum.at(t1, pos, end_us[on])
        out[r] = (t0, t1)
    return out


def job_summary(job: Job, res: Any) -> dict[str, Any]:
    """Per step and per rank, measured and simulated (ms), with the slowest rank of each step and
    what it did (``res`` is ``simulate(job.graph)`` or of a transformed graph of the same job).

    A job's step is its slowest rank's step (each rank's from its anchor, as for one trace); the
    slowest rank of a step is the one the others waited for: the least time waiting for peers."""
    g = res.graph
    ids = np.asarray(g.steps.ids, np.int64)
    bounds = rank_step_bounds(g, res.start_us, res.end_us, ids)
    cats = _categories(g, res, bounds, ids)
    per_rank = []
    sim = np.full((len(job.ranks), ids.size), np.nan)
    meas = np.full((len(job.ranks), ids.size), np.nan)
    for i, info in enumerate(job.ranks):
        if info.rank in bounds:
            t0, t1 = bounds[info.rank]
            sim[i] = np.where(np.isfinite(t1 - t0), (t1 - t0) / 1e3, np.nan)
        pos = {int(s): k for k, s in enumerate(info.step_ids.tolist())}
        for k, s in enumerate(ids.tolist()):
            if s in pos:
                meas[i, k] = float(info.measured_ms[pos[s]])
        c = cats.get(info.rank, {})
        per_rank.append({
            "rank": info.rank, "trace": info.path, "clock_offset_us": info.offset_us,
            "measured_ms": _nanmean(meas[i]), "simulated_ms": _nanmean(sim[i]),
            **{f"{k}_ms": _nanmean(np.asarray(v)) for k, v in c.items()},
        })  # fmt: skip
    steps = []
    for k, s in enumerate(ids.tolist()):
        waits = [(cats[r.rank]["waiting"][k], -sim[i, k], r.rank) for i, r in enumerate(job.ranks)
                 if r.rank in cats and np.isfinite(sim[i, k])]  # fmt: skip
        slow = min(waits)[2] if waits else None
        doing = {f"{c}_ms": float(v[k]) for c, v in cats[slow].items()} if slow is not None else {}
        steps.append({
            "step": int(s), "measured_ms": _nanmax(meas[:, k]), "simulated_ms": _nanmax(sim[:, k]),
            "slowest_rank": slow, "slowest": doing,
        })  # fmt: skip
    meas_steps = [float(m) for k in range(ids.size) if (m := _nanmax(meas[:, k])) is not None]
    sim_steps = [float(m) for k in range(ids.size) if (m := _nanmax(sim[:, k])) is not None]
    return {
        "ranks": [r.rank for r in job.ranks],
        "world": job.world,
        "missing_ranks": list(job.missing),
        "collectives": job.collectives,
        "alignment_residual_us": job.residual_us,
        "steps": steps,
        "measured_ms": float(np.mean(meas_steps)) if meas_steps else None,
        "simulated_ms": float(np.mean(sim_steps)) if sim_steps else None,
        "per_rank": per_rank,
    }


def describe_rank(doing: dict[str, float], rank: int) -> str:
    """``"rank 1: 22.1 ms compute, 8.0 ms comm, 0.0 ms waiting"``: the largest categories first."""
    parts = sorted(((v, k.removesuffix("_ms")) for k, v in doing.items()), reverse=True)
    return f"rank {rank}: " + ", ".join(f"{v:.1f} ms {k}" for v, k in parts)


# --------------------------------------------------------------------------- step 1: ranks and jobs
def _ranks_of(traces: list[Trace], files: list[Path]) -> tuple[list[int], int | None, tuple[int, ...]]:
    import json

    from trainsim.capture.profile import sidecar_path

    ranks: list[int] = []
    worlds: dict[int, Path] = {}
    sides: list[dict[str, Any]] = []
    for i, (tr, f) in enumerate(zip(traces, files, strict=True)):
        info = tr.meta.get("distributedInfo")
        info = info if isinstance(info, dict) else {}
        side: dict[str, Any] = {}
        sp = sidecar_path(f) if f.name.endswith((".json", ".json.gz")) else None
        if sp is not None and sp.is_file():
            try:
                loaded = json.loads(sp.read_text())
                side = loaded if isinstance(loaded, dict) else {}
            except (OSError, ValueError):
                side = {}
        sides.append(side)
        m = _FILE_RANK_RX.search(f.name)
        for r in (info.get("rank"), side.get("rank"), int(m.group(1)) if m else None, i):
            if isinstance(r, int) and r >= 0:
                ranks.append(r)
                break
        for w in (info.get("world_size"), side.get("world")):
            if isinstance(w, int) and w > 0:
                worlds.setdefault(w, f)
                break
    seen: dict[int, Path] = {}
    for r, f in zip(ranks, files, strict=True):
        if r in seen:
            raise UserError(
                f"{seen[r]} and {f} both are rank {r}; expected the traces of one job, one per rank"
            )
        seen[r] = f
    if len(worlds) > 1:
        (w1, f1), (w2, f2) = list(worlds.items())[:2]
        raise UserError(f"{f1} is from a job of {w1} ranks, {f2} of {w2}; expected the traces of one job")
    for key in _SIDECAR_JOB_KEYS:
        vals = {(repr(s[key]), str(f)) for s, f in zip(sides, files, strict=True) if key in s}
        if len({v for v, _ in vals}) > 1:
            (v1, p1), (v2, p2) = sorted(vals)[0], next(x for x in sorted(vals) if x[0] != sorted(vals)[0][0])
            raise UserError(f"{p1} has {key}={v1} in its sidecar, {p2} has {key}={v2}; "
                            "expected the traces of one job")  # fmt: skip
    world = next(iter(worlds), None)
    if world is not None and max(ranks) >= world:
        f = files[ranks.index(max(ranks))]
        raise UserError(
            f"{f} is rank {max(ranks)} but the job has {world} ranks; expected ranks 0..{world - 1}"
        )
    missing = tuple(sorted(set(range(world)) - set(ranks))) if world is not None else ()
    if missing:
        names = ", ".join(map(str, missing))
        warnings.warn(
            f"job of {world} ranks: no trace of rank{'s' if len(missing) > 1 else ''} {names} among "
            f"{len(files)} traces ({files[0].parent}); simulating ranks {', '.join(map(str, sorted(ranks)))} only",
            stacklevel=3,
        )
    return ranks, world, missing


# --------------------------------------------------------------------------- step 2: collectives
def _collectives(tr: Trace, g: TaskGraph) -> list[_Coll]:
    """The collectives of one rank's trace, mapped onto its graph's COMM tasks, in time order."""
    evs = []
    for e in tr.events:
        if e.cat == "kernel" and e.name.startswith(("nccl", "ncclDev", "Nccl")):
            evs.append((f"gpu{e.args.get('device', e.pid)}:s{e.args.get('stream', e.tid)}", e))
        elif e.cat in CPU_CATS and COMM_CPU_RX.search(e.name):
            evs.append((f"cpu:{e.pid}/{e.tid}", e))
    evs.sort(key=lambda x: (x[0], x[1].ts, -x[1].dur))
    res_id = {r.name: i for i, r in enumerate(g.resources)}
    comm = np.flatnonzero(g.kind == TaskKind.COMM)
    by_res: dict[int, tuple[I64, F64]] = {}
    for r in np.unique(g.resource[comm]).tolist():
        ids = comm[g.resource[comm] == r]
        ids = ids[np.argsort(g.ts_us[ids], kind="stable")]
        by_res[r] = (ids.astype(np.int64), g.ts_us[ids])
    out: list[_Coll] = []
    last_end: dict[str, float] = {}
    for rname, e in evs:
        if e.ts < last_end.get(rname, -np.inf):
            continue  # nested in a collective already taken
        last_end[rname] = e.end
        r = res_id.get(rname, -1)
        if r not in by_res:
            continue
        ids, ts = by_res[r]
        lo, hi = np.searchsorted(ts, e.ts - 1e-3), np.searchsorted(ts, e.end - 1e-6)
        tasks = ids[lo:hi]
        if tasks.size == 0:
            continue
        first = int(tasks[0])
        grp = int(g.group[first])
        group = g.symbols[grp] if grp >= 0 else str(e.args.get("Process Group Name", ""))
        seq = e.args.get("Seq", e.args.get("seq"))
        out.append(_Coll(e.name, group, int(g.size_bytes[first]), int(g.step[first]),
                         seq if isinstance(seq, int) else None, tr.base_us + e.ts, tr.base_us + e.end, tasks))  # fmt: skip
    out.sort(key=lambda c: c.t0)
    return out


def _match(colls: list[list[_Coll]], files: list[Path]) -> list[tuple[Any, ...]]:
    """Give every collective its key (module doc, step 2); return the keys found on every rank."""
    groups = {c.group for cs in colls for c in cs}
    for grp in groups:
        with_seq = all(c.key for cs in colls for c in cs if c.group == grp)
        for cs in colls:
            count: dict[int, int] = defaultdict(int)
            for c in cs:
                if c.group != grp or with_seq:
                    continue
                c.key = ("step", grp, c.step, count[c.step]) if c.step >= 0 else ()
                count[c.step] += 1
    keysets = [{c.key for c in cs if c.key} for cs in colls]
    common = set.intersection(*keysets) if keysets else set()
    if len(files) > 1 and not common:
        no = [str(f) for f, ks in zip(files, keysets, strict=True) if not ks]
        why = (
            f"{', '.join(no)} {'has' if len(no) == 1 else 'have'} none"
            if no
            else "none appears in every trace"
        )
        raise UserError(f"{', '.join(map(str, files))}: no collectives in common ({why}); expected the traces of "
                        "the ranks of one job")  # fmt: skip
    by_key = [{c.key: c for c in cs if c.key in common} for cs in colls]
    ordered = sorted(common, key=lambda k: by_key[0][k].t0)
    for k in ordered:
        ref = by_key[0][k]
        for f, bk in zip(files[1:], by_key[1:], strict=True):
            c = bk[k]
            if c.name != ref.name or (c.size >= 0 and ref.size >= 0 and c.size != ref.size):
                where = f"step {ref.step}" if ref.step >= 0 else "the trace"
                raise UserError(
                    f"{files[0]} and {f}: a collective of {where} is {ref.name} of {ref.size} bytes in one and "
                    f"{c.name} of {c.size} bytes in the other; expected the traces of one job (the same collectives)"
                )
    return ordered


# --------------------------------------------------------------------------- step 3: clocks
def _align(traces: list[Trace], colls: list[list[_Coll]], keys: list[tuple[Any, ...]], files: list[Path],
           ranks: list[int]) -> tuple[list[float], float]:  # fmt: skip
    """Each rank's clock offset to the first rank's, and the median residual (module doc, step 3)."""
    if len(traces) == 1 or not keys:
        return [0.0] * len(traces), 0.0
    by_key = [{c.key: c for c in cs} for cs in colls]
    ends = np.array([[bk[k].t1 for k in keys] for bk in by_key])  # [rank, collective], own clocks
    durs = np.array([[bk[k].t1 - bk[k].t0 for k in keys] for bk in by_key])
    starts = ends - durs
    offsets = np.median(ends - ends[0], axis=1)
    hosts = [tr.meta.get("host_name") for tr in traces]
    # causality: a collective ends on a rank only after every rank arrived, which bounds each offset;
    # ranks recorded on the reference rank's host share its clock: kept at 0 unless that breaks causality
    same_clock = np.zeros(len(traces), np.bool_)
    for i in range(1, len(traces)):
        lo, hi = float((starts[i] - ends[0]).max()), float((ends[i] - starts[0]).min())
        if hosts[i] and hosts[i] == hosts[0] and lo <= 0.0 <= hi:
            offsets[i], same_clock[i] = 0.0, True
        elif lo <= hi:
            offsets[i] = min(max(float(offsets[i]), lo), hi)
    resid = ends - ends[0] - offsets[:, None]
    tol = max(ALIGN_TOL_US, ALIGN_TOL_FRAC * float(np.median(durs.max(axis=0))))
    worst = float("nan")
    per_rank = np.median(np.abs(resid), axis=1)
    for i in range(1, len(traces)):
        if per_rank[i] > tol and not same_clock[i]:
            raise UserError(
                f"ranks {ranks[0]} and {ranks[i]} ({files[0].name}, {files[i].name}): their {len(keys)} common "
                f"collectives end {per_rank[i] / 1e3:.2f} ms apart (median) at the best clock offset, more than the "
                f"{tol / 1e3:.2f} ms tolerance; the clocks cannot be aligned"
            )
    for i in range(1, len(traces)):
        for j in range(i):
            if hosts[i] and hosts[i] == hosts[j] and abs(offsets[i] - offsets[j]) > SAME_HOST_MAX_OFFSET_US:
                raise UserError(
                    f"{files[j]} and {files[i]} were recorded on host {hosts[i]!r} with collectives "
                    f"{abs(offsets[i] - offsets[j]) / 1e6:.1f} s apart on its one clock; expected the traces of one job"
                )
    worst = float(np.median(np.abs(resid[1:]))) if len(traces) > 1 else 0.0
    return [float(x) for x in offsets], worst


# --------------------------------------------------------------------------- steps 4-5: merge and join
def _join(g: TaskGraph, graphs: list[TaskGraph], colls: list[list[_Coll]], keys: list[tuple[Any, ...]],
          ranks: list[int], shifts: list[float]) -> TaskGraph:  # fmt: skip
    """Split each matched collective into arrival + transfer and add the barriers (module doc, step 5)."""
    if len(graphs) < 2 or not keys:
        return g
    bases = np.cumsum([0] + [x.n_tasks + 1 for x in graphs])  # +1: each rank's start task
    by_key = [{c.key: c for c in cs} for cs in colls]
    cols: dict[str, list[Any]] = {c: [] for c in ("kind", "name", "op", "layer", "resource", "order", "dur_us",
                                                  "ts_us", "step", "size_bytes", "group", "priority")}  # fmt: skip
    dur, ts, kind = g.dur_us.copy(), g.ts_us.copy(), g.kind.copy()
    src, dst, ekind = [], [], []
    out_edges = defaultdict(list)
    for e, s in enumerate(g.edge_src.tolist()):
        out_edges[s].append(e)
    new_src = g.edge_src.copy()
    resources = list(g.resources)
    barrier_res: dict[str, int] = {}
    n = g.n_tasks
    for k in keys:
        cs = [bk[k] for bk in by_key]
        # each rank's arrival on the job clock: trace-relative start of its first task + the rank's shift
        a = np.array([float(graphs[i].ts_us[c.tasks[0]]) + shifts[i] for i, c in enumerate(cs)])
        last = float(a.max())
        grp = cs[0].group
        if grp not in barrier_res:
            resources.append(Resource(f"{BARRIER_PREFIX}{grp or 'default'}", ResourceKind.COMM_CHANNEL))
            barrier_res[grp] = len(resources) - 1
        b = n + len(cols["kind"])
        first0 = int(cs[0].tasks[0] + bases[0])
        _append_row(cols, kind=TaskKind.SYNC, name=int(g.name[first0]), resource=barrier_res[grp], order=last,
                    dur_us=0.0, ts_us=last, step=int(g.step[first0]), group=int(g.group[first0]))  # fmt: skip
        for i, c in enumerate(cs):
            tasks = c.tasks + bases[i]
            wait = max(0.0, last - a[i])
            transfer_start = max(last, a[i])
            # the first task becomes the arrival (0 us), a new task after it the transfer
            t = int(tasks[0])
            x = n + len(cols["kind"])
            remaining = wait
            new_durs = []
            for tt in tasks.tolist():
                cut = min(remaining, float(dur[tt]))
                new_durs.append(float(dur[tt]) - cut)
                remaining -= cut
            for tt, nd in zip(tasks.tolist()[1:], new_durs[1:], strict=True):
                dur[tt] = nd
            _append_row(cols, kind=TaskKind(int(kind[t])), name=int(g.name[t]), op=int(g.op[t]),
                        layer=int(g.layer[t]), resource=int(g.resource[t]), order=float(g.order[t]),
                        dur_us=new_durs[0], ts_us=transfer_start, step=int(g.step[t]),
                        size_bytes=int(g.size_bytes[t]), group=int(g.group[t]))  # fmt: skip
            for ei in out_edges.get(t, []):
                new_src[ei] = x
            dur[t] = 0.0
            kind[t] = int(TaskKind.SYNC)
            src += [t, b]
            dst += [b, x]
            ekind += [int(EdgeKind.COMM), int(EdgeKind.COMM)]
    extra = _columns({c: [np.asarray(v)] for c, v in cols.items()})
    now: dict[str, np.ndarray] = {c: getattr(g, c) for c in extra}
    now.update(dur_us=dur, ts_us=ts, kind=kind)
    merged: dict[str, Any] = {c: np.concatenate((now[c], extra[c])) for c in extra}
    old = {c: getattr(g, c) for c in _EDGE_COLUMNS}
    old["edge_src"] = new_src
    out = replace(
        g, resources=tuple(resources), **_concat_edges([old, _new_edges(src, dst, ekind)]), **merged
    )
    out.validate()
    return out


def _job_steps(graphs: Sequence[TaskGraph], shifts: Sequence[float]) -> Steps:
    """The steps every rank traced; each spans from its first rank's start to its last rank's end."""
    common = set.intersection(*(set(g.steps.ids.tolist()) for g in graphs)) if graphs else set()
    ids = np.array(sorted(common), np.int32)
    t0, t1 = np.full(ids.size, np.inf), np.full(ids.size, -np.inf)
    for g, s in zip(graphs, shifts, strict=True):
        pos = {int(x): k for k, x in enumerate(g.steps.ids.tolist())}
        for k, x in enumerate(ids.tolist()):
            t0[k] = min(t0[k], g.steps.start_us[pos[x]] + s)
            t1[k] = max(t1[k], g.steps.end_us[pos[x]] + s)
    return Steps(ids=ids, start_us=t0, end_us=t1, anchor=-1)


_DTYPES: dict[str, Any] = {"kind": np.int8, "name": np.int32, "op": np.int32, "layer": np.int32,
                           "resource": np.int32, "order": np.float64, "dur_us": np.float64, "ts_us": np.float64,
                           "step": np.int32, "size_bytes": np.int64, "group": np.int32, "priority": np.float64}  # fmt: skip


_EDGE_COLUMNS: tuple[str, ...] = getattr(ir, "EDGE_COLUMNS", ("edge_src", "edge_dst", "edge_kind"))
_EDGE_DTYPES: dict[str, Any] = {"edge_src": np.int32, "edge_dst": np.int32, "edge_kind": np.int8}


def _new_edges(src: Sequence[int], dst: Sequence[int], kind: Sequence[int]) -> dict[str, np.ndarray]:
    """Edge columns for new plain edges (any other edge column, e.g. a lag, is 0)."""
    out = {c: np.zeros(len(src), _EDGE_DTYPES.get(c, np.float64)) for c in _EDGE_COLUMNS}
    out["edge_src"], out["edge_dst"] = np.asarray(src, np.int32), np.asarray(dst, np.int32)
    out["edge_kind"] = np.asarray(kind, np.int8)
    return out


def _concat_edges(parts: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    return {c: np.concatenate([p[c] for p in parts]).astype(_EDGE_DTYPES.get(c, np.float64)) if parts
            else np.zeros(0, _EDGE_DTYPES.get(c, np.float64)) for c in _EDGE_COLUMNS}  # fmt: skip


def _append_row(cols: dict[str, list[Any]], *, kind: TaskKind, name: int, resource: int, order: float,
                dur_us: float, ts_us: float, op: int = -1, layer: int = -1, step: int = -1, size_bytes: int = -1,
                group: int = -1) -> None:  # fmt: skip
    row = {"kind": int(kind), "name": name, "op": op, "layer": layer, "resource": resource, "order": order,
           "dur_us": dur_us, "ts_us": ts_us, "step": step, "size_bytes": size_bytes, "group": group,
           "priority": 0.0}  # fmt: skip
    for c, v in row.items():
        cols[c].append(np.array([v], _DTYPES[c]))


def _columns(cols: dict[str, list[Any]]) -> dict[str, Any]:
    return {c: np.concatenate([np.asarray(x, t).ravel() for x in cols.get(c, [])]) if cols.get(c) else np.zeros(0, t)
            for c, t in _DTYPES.items()}  # fmt: skip


# --------------------------------------------------------------------------- what each rank did
def _categories(
    g: TaskGraph, res: Any, bounds: dict[int, tuple[F64, F64]], ids: np.ndarray
) -> dict[int, dict[str, list[float]]]:
    """Per rank and step (simulated, ms): compute (union of ``compute_mask`` tasks), comm (union of
    transfers), waiting (for peers at barriers, plus untraced anchor time blocked on a collective)."""
    ranks = task_ranks(g)
    comp = compute_mask(g)
    comm = g.kind == TaskKind.COMM
    blocked = np.isin(g.kind, _COMPUTE_KINDS) & ~comp & np.isin(g.resource, list(rank_anchors(g).values()))
    bar, arr, _ = barriers(g)
    out: dict[int, dict[str, list[float]]] = {}
    for r, (t0, t1) in bounds.items():
        mine = ranks == r
        c_idx, m_idx, b_idx = (
            np.flatnonzero(mine & comp),
            np.flatnonzero(mine & comm),
            np.flatnonzero(mine & blocked),
        )
        a_mine = ranks[arr] == r
        rows: dict[str, list[float]] = {"compute": [], "comm": [], "waiting": []}
        for a, b in zip(t0.tolist(), t1.tolist(), strict=True):
            if not np.isfinite(a) or not np.isfinite(b):
                for v in rows.values():
                    v.append(float("nan"))
                continue
            rows["compute"].append(_union_ms(res.start_us[c_idx], res.end_us[c_idx], a, b))
            rows["comm"].append(_union_ms(res.start_us[m_idx], res.end_us[m_idx], a, b))
            w0 = res.end_us[arr[a_mine]]
            w1 = res.end_us[bar[a_mine]]
            peers = _union_ms(w0, w1, a, b)
            rows["waiting"].append(peers + _union_ms(res.start_us[b_idx], res.end_us[b_idx], a, b))
        out[r] = rows
    return out


def _union_ms(s: F64, e: F64, a: float, b: float) -> float:
    """Length (ms) of the union of intervals [s, e) clipped to [a, b)."""
    s, e = np.clip(s, a, b), np.clip(e, a, b)
    keep = e > s
    if not keep.any():
        return 0.0
    o = np.argsort(s[keep], kind="stable")
    s, e = s[keep][o], np.maximum.accumulate(e[keep][o])
    new = np.ones(s.size, np.bool_)
    new[1:] = s[1:] > e[:-1]
    idx = np.flatnonzero(new)
    ends = np.append(e[idx[1:] - 1], e[-1])
    return float((ends - s[idx]).sum() / 1e3)


def _nanmean(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else None


def _nanmax(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float(x.max()) if x.size else None
