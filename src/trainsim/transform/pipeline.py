"""Pipeline-parallel what-ifs built from PyTorch's own schedule objects and a single-process profile.

    >>> from trainsim.capture.layerprofile import profile_layers
    >>> from trainsim.transform.pipeline import PipeSpec, predict_pipeline
    >>> prof = profile_layers("transformer", batch_sizes=(8,))                         # doctest: +SKIP
    >>> spec = PipeSpec(schedule="ZBVZeroBubble", stages_per_rank=2, microbatches=4)   # doctest: +SKIP
    >>> wire = link("custom:1:50")                          # cluster.catalog: 1 Gbit/s, 50 us   # doctest: +SKIP
    >>> predict_pipeline(prof, spec, batch_size=32, link=P2PLink(wire=wire)).step_ms    # doctest: +SKIP

One IR, one source of truth (STYLE item 1): the per-rank action lists are torch's ``_Action`` objects
(printed ``2F0``, ``1SEND_B3`` ..., parsed back by ``_Action.from_str``). ``lowered_order`` asks
torch's schedule class for its compute order and lowers it with torch's ``_PipelineScheduleRuntime``
(adding SEND/RECV, REDUCE_GRAD ...): that lowered list is exactly what ``trainsim.run.pipeline``
executes (it hands the same compute order to the same runtime) and what ``pipeline_graph`` turns
into tasks, one per action, in the same order on each rank's queue.

Schedules (``SCHEDULES``): GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble, ZBVZeroBubble,
DualPipeV. 1F1B's order comes from ``ScheduleInterleaved1F1B`` with one stage per rank because
``Schedule1F1B.pipeline_order`` in torch 2.13 is not what its executor runs (its last rank starts at
``F1`` and ends with ``F{M}``, which ``_validate_schedule`` rejects); ``test_pipeline.py`` pins this.

Why one module: the schedule's action lists, the stage split and the graph built from them are one flow
of data (torch's ``_Action`` in, a ``TaskGraph`` out), which ``predict_pipeline`` runs end to end; it is
just over the size where a split would pay.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from trainsim.cluster.catalog import Link
from trainsim.cluster.collectives import p2p_us
from trainsim.errors import UserError
from trainsim.graph.ir import GraphBuilder, ResourceKind, TaskGraph, TaskKind

if TYPE_CHECKING:
    from trainsim.capture.layerprofile import LayerProfile
    from trainsim.simulate.engine import Replay


@dataclass(frozen=True, slots=True)
class _Sched:
    torch_name: str  # get_schedule_class name the order comes from
    min_spr: int  # stages per rank
    max_spr: int
    style: str  # stage -> rank mapping: "loop" or "v"


SCHEDULES: dict[str, _Sched] = {
    "GPipe": _Sched("GPipe", 1, 1, "loop"),
    "1F1B": _Sched("Interleaved1F1B", 1, 1, "loop"),
    "Interleaved1F1B": _Sched("Interleaved1F1B", 2, 8, "loop"),
    "InterleavedZeroBubble": _Sched("InterleavedZeroBubble", 1, 8, "loop"),
    "ZBVZeroBubble": _Sched("ZBVZeroBubble", 2, 2, "v"),
    "DualPipeV": _Sched("DualPipeV", 2, 2, "v"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class PipeSpec:
    """A pipeline schedule on ``n_ranks`` processes."""

    schedule: str
    """a name in ``SCHEDULES``"""
    n_ranks: int = 2
    stages_per_rank: int = 1
    """virtual stages per rank (2 for interleaved and V schedules)"""
    microbatches: int = 4

    def __post_init__(self) -> None:
        s = SCHEDULES.get(self.schedule)
        if s is None:
            raise UserError(
                f"unknown pipeline schedule {self.schedule!r}; expected one of {', '.join(SCHEDULES)}"
            )
        if self.n_ranks < 2:
            raise UserError(f"n_ranks={self.n_ranks}; a pipeline needs at least 2 ranks")
        if not s.min_spr <= self.stages_per_rank <= s.max_spr:
            need = str(s.min_spr) if s.min_spr == s.max_spr else f"{s.min_spr}..{s.max_spr}"
            raise UserError(
                f"schedule {self.schedule} needs {need} stage(s) per rank; got {self.stages_per_rank} "
                "(--stages-per-rank; in trainsim whatif, --stages)"
            )
        if self.microbatches < 1:
            raise UserError(f"microbatches={self.microbatches}; expected a positive integer")
        if self.schedule == "DualPipeV" and self.microbatches < self.n_stages:
            raise UserError(
                f"DualPipeV needs at least {self.n_stages} microbatches (the number of stages); "
                f"got {self.microbatches}"
            )

    @property
    def n_stages(self) -> int:
        return self.n_ranks * self.stages_per_rank

    def stage_to_rank(self) -> dict[int, int]:
        from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

        return dict(
            generate_stage_to_rank_mapping(self.n_ranks, self.n_stages, style=SCHEDULES[self.schedule].style)
        )


class _MockStage:
    """What torch's schedule constructors read from a stage, without a process group."""

    def __init__(self, index: int, n_stages: int, n_ranks: int, rank: int) -> None:
        self.stage_index = index
        self.num_stages = n_stages
        self.group_size = n_ranks
        self.group_rank = rank
        self.is_first = index == 0
        self.is_last = index == n_stages - 1
        self.submod = None
        self.stage_index_to_group_rank: dict[int, int] = {}


def _mock_loss(out: Any, target: Any) -> Any:
    return out


def compute_order(spec: PipeSpec) -> dict[int, list[Any]]:
    """Per-rank compute actions (``_Action``) from torch's own schedule class, idle steps dropped."""
    from torch.distributed.pipelining.schedules import get_schedule_class

    cls = get_schedule_class(SCHEDULES[spec.schedule].torch_name)
    s2r = spec.stage_to_rank()
    mine = [s for s in range(spec.n_stages) if s2r[s] == 0]
    stages: Any = [_MockStage(s, spec.n_stages, spec.n_ranks, 0) for s in mine]
    try:
        sched = cls(
            stages[0] if spec.stages_per_rank == 1 and spec.schedule == "GPipe" else stages,
            spec.microbatches,
            loss_fn=_mock_loss,
        )
    except ValueError as exc:
        raise UserError(f"schedule {spec.schedule} with {spec.microbatches} microbatches: {exc}") from exc
    order = sched.pipeline_order
    assert order is not None
    return {
        r: [a for a in acts if a is not None and a.computation_type.value != "REDUCE_GRAD"]
        for r, acts in sorted(order.items())
    }


def make_runtime(stages: Sequence[Any], spec: PipeSpec, loss_fn: Any) -> Any:
    """torch's ``_PipelineScheduleRuntime`` loaded with ``compute_order(spec)``: what really runs."""
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    order = compute_order(spec)
    rt = _PipelineScheduleRuntime(list(stages), spec.microbatches, loss_fn=loss_fn)
    rt.pipeline_order = dict(order)
    rt._prepare_schedule_with_comms(order)
    return rt


def lowered_order(spec: PipeSpec) -> dict[int, list[Any]]:
    """Per-rank actions with communication, exactly as ``_PipelineScheduleRuntime`` executes them."""
    s2r = spec.stage_to_rank()
    stages = [_MockStage(s, spec.n_stages, spec.n_ranks, 0) for s in range(spec.n_stages) if s2r[s] == 0]
    rt = make_runtime(stages, spec, _mock_loss)
    return {r: list(a) for r, a in sorted(rt.pipeline_order_with_comms.items())}


def format_order(order: dict[int, list[Any]]) -> str:
    """One line per rank: ``rank 0: 0F0 0SEND_F0 ...``."""
    return "\n".join(f"rank {r}: " + " ".join(str(a) for a in acts) for r, acts in sorted(order.items()))


# ---------------------------------------------------------------------- stage split
def check_split(sizes: Sequence[int], n_layers: int, n_stages: int) -> list[list[int]]:
    """Layers of each stage from per-stage layer counts; refuse empty stages and wrong totals."""
    sizes = list(sizes)
    if len(sizes) != n_stages:
        raise UserError(
            f"--split {','.join(map(str, sizes))}: {len(sizes)} stages given, the schedule has {n_stages}"
        )
    if any(s < 1 for s in sizes):
        empty = [i for i, s in enumerate(sizes) if s < 1]
        raise UserError(
            f"--split {','.join(map(str, sizes))}: stage {empty[0]} would be empty; "
            "every stage needs at least one layer"
        )
    if sum(sizes) != n_layers:
        raise UserError(
            f"--split {','.join(map(str, sizes))}: covers {sum(sizes)} layers, the model has {n_layers}"
        )
    out, start = [], 0
    for s in sizes:
        out.append(list(range(start, start + s)))
        start += s
    return out


def plan_split(costs_us: Sequence[float], n_stages: int) -> list[int]:
    """Contiguous split of layers into ``n_stages`` minimising the slowest stage (exact, O(L^2 S))."""
    n = len(costs_us)
    if n_stages > n:
        raise UserError(f"{n_stages} stages but the model has only {n} layers; a stage would be empty")
    pre = np.concatenate(([0.0], np.cumsum(costs_us)))
    best = np.full((n_stages + 1, n + 1), np.inf)
    cut = np.zeros((n_stages + 1, n + 1), np.int64)
    best[0, 0] = 0.0
    for s in range(1, n_stages + 1):
        for j in range(s, n + 1):
            for i in range(s - 1, j):
                v = max(best[s - 1, i], pre[j] - pre[i])
                if v < best[s, j]:
                    best[s, j], cut[s, j] = v, i
    sizes, j = [], n
    for s in range(n_stages, 0, -1):
        i = int(cut[s, j])
        sizes.append(j - i)
        j = i
    return sizes[::-1]


SPLIT_ENUMERATE_MAX = 200
"""``choose_split`` simulates every contiguous split when there are at most this many (9 layers in 4
stages: 56), otherwise it searches locally from the balanced one"""


def choose_split(
    score: Callable[[Sequence[int]], float], n_layers: int, n_stages: int, start: Sequence[int]
) -> list[int]:
    """The contiguous split (layers per stage) with the lowest ``score`` (a simulated step time).

    Balancing the stages (``plan_split``) is not balancing the ranks: a V schedule puts stages 0 and
    ``2p - 1`` on rank 0, so four equal stages of a 6-block transformer gave rank 0 two blocks and
    rank 1 four (ZBVZeroBubble at 16 microbatches: 288 ms simulated, 230 with the best split), and
    each schedule's bubbles weigh the stages differently anyway. So the simulator judges: every split
    when there are at most ``SPLIT_ENUMERATE_MAX``, otherwise a descent from ``start`` that moves one
    stage boundary by one or two layers while that shortens the step. Ties keep ``start``."""
    if n_stages > n_layers:
        raise UserError(f"{n_stages} stages but the model has only {n_layers} layers; a stage would be empty")
    best = list(start)
    best_v = score(best)
    if math.comb(n_layers - 1, n_stages - 1) <= SPLIT_ENUMERATE_MAX:
        for cuts in itertools.combinations(range(1, n_layers), n_stages - 1):
            cand = [b - a for a, b in itertools.pairwise((0, *cuts, n_layers))]
            if cand == list(start):  # scored above
                continue
            v = score(cand)
            if v < best_v - 1e-9:
                best, best_v = cand, v
        return best
    seen = {tuple(best)}
    improved = True
    while improved:
        improved = False
        for i in range(n_stages - 1):
            for d in (-2, -1, 1, 2):
                cand = list(best)
                cand[i] += d
                cand[i + 1] -= d
                if min(cand) < 1 or tuple(cand) in seen:
                    continue
                seen.add(tuple(cand))
                v = score(cand)
                if v < best_v - 1e-9:
                    best, best_v, improved = cand, v, True
    return best


# ---------------------------------------------------------------------- graph
@dataclass(frozen=True, kw_only=True, slots=True)
class P2PLink:
    """Point-to-point link between two ranks (one direction): the wire and the host's work per message."""

    wire: Link
    """bandwidth and per-message latency (one-way delay plus software)"""
    cpu_us: float = 0.0
    """host CPU per send or receive, µs: on CPU clusters (gloo) the rank's compute loses it"""
    cpu_us_per_byte: float = 0.0

    def transfer_us(self, size_bytes: int) -> float:
        return p2p_us(size_bytes, self.wire)

    def host_cpu_us(self, size_bytes: int) -> float:
        return self.cpu_us + self.cpu_us_per_byte * size_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class StageCosts:
    """Per-stage, per-microbatch durations (µs) and the bytes a stage sends forward."""

    fwd_us: tuple[float, ...]
    bwd_us: tuple[float, ...]
    """fused backward (a full-backward ``B`` action)"""
    bwd_input_us: tuple[float, ...]
    bwd_weight_us: tuple[float, ...]
    opt_us: tuple[float, ...]
    out_bytes: tuple[int, ...]
    action_overhead_us: float = 0.0
    """runtime bookkeeping per compute action (µs), from the profile's calibration"""
    step_overhead_us: float = 0.0
    """the runtime's own work per step and rank beyond its actions (µs; a probe's measure), run with the
    optimizer update"""
    p2p_action_us: float = 0.0
    """the runtime's own work per SEND or RECV action beyond posting it (µs: building the operation
    list, storing the work handles), from the profile step's generic exchange; posting is ``P2PLink``'s"""


def stage_costs(
    prof: LayerProfile, split: list[list[int]], micro_bs: int, overhead_us: float = 0.0
) -> StageCosts:
    """Sum the per-layer profile at the microbatch size over each stage's layers (+ loss on the last).

    As in torch's ``PipelineStage``: the first stage's input needs no gradient, so its I action does
    nothing and its W action runs the whole (fused) backward of the stage.
    """
    rows = prof.table(micro_bs)
    loss = prof.loss_us(micro_bs)
    f, bw, b, w, o, out = [], [], [], [], [], []
    for si, layers in enumerate(split):
        last = si == len(split) - 1
        f.append(sum(rows[i]["fwd_us"] for i in layers) + (loss if last else 0.0))
        bw.append(sum(rows[i]["bwd_us"] for i in layers))
        if si == 0:  # torch skips I on the first stage (its input needs no gradient); W is a full backward
            b.append(0.0)
            w.append(bw[-1])
        else:
            b.append(sum(rows[i]["bwd_input_us"] for i in layers))
            w.append(sum(rows[i]["bwd_weight_us"] for i in layers))
        o.append(sum(rows[i]["opt_us"] for i in layers))
        out.append(int(rows[layers[-1]]["out_bytes"]))
    return StageCosts(fwd_us=tuple(f), bwd_us=tuple(bw), bwd_input_us=tuple(b), bwd_weight_us=tuple(w),
                      opt_us=tuple(o), out_bytes=tuple(out), action_overhead_us=overhead_us)  # fmt: skip


def pipeline_graph(spec: PipeSpec, costs: StageCosts, link: P2PLink, *, steps: int = 3) -> TaskGraph:
    """One task per action of ``lowered_order(spec)`` on each rank's queue, ``steps`` times.

    Transfers run on a channel per (sender, receiver) pair and start when the SEND has been posted
    and the matching RECV's ready notice has reached the sender, one latency (``link.wire``) after the
    RECV was posted (gloo's point-to-point rendezvous for unbound buffers); a transfer occupies its channel
    for its bytes and arrives one latency later (the latencies of messages in flight overlap);
    a compute action waits for the transfer it consumes. Each step ends with the rank's optimizer update.
    """
    order = lowered_order(spec)
    s2r = spec.stage_to_rank()
    b = GraphBuilder(f"pipeline:{spec.schedule}")
    cpu = {r: b.resource(f"rank{r}:cpu", ResourceKind.CPU_THREAD) for r in order}
    chan: dict[tuple[int, int], int] = {}
    ov, lat = costs.action_overhead_us, link.wire.latency_us
    prev_opt: dict[int, int] = {}
    for step in range(steps):
        done: dict[tuple[int, str, int], int] = {}  # (stage, kind F/B/I/W, mb) -> task
        posted: dict[tuple[str, int, int], int] = {}  # ("F"/"B", receiving stage, mb) -> RECV task
        sends: dict[tuple[str, int, int], int] = {}  # ("F"/"B", receiving stage, mb) -> SEND task
        xfer: dict[tuple[str, int, int], int] = {}  # ("F"/"B", receiving stage, mb) -> transfer task
        # Pass 1: tasks on every rank in action order (deps added in pass 2, once all exist).
        tasks: list[tuple[int, Any, int]] = []  # (rank, action, task)
        for r, acts in order.items():
            for a in acts:
                t = _action_task(b, a, costs, cpu[r], step, ov, link)
                tasks.append((r, a, t))
                kind = a.computation_type.value
                if kind in ("F", "B", "I", "W"):
                    done[(a.stage_index, kind, a.microbatch_index)] = t
                elif kind == "OVERLAP_F_B":
                    for sub in a.sub_actions or ():
                        done[(sub.stage_index, sub.computation_type.value, sub.microbatch_index)] = t
                elif kind in ("SEND_F", "SEND_B"):
                    dst = a.stage_index + (1 if kind == "SEND_F" else -1)
                    sends[(kind[-1], dst, a.microbatch_index)] = t
                elif kind in ("RECV_F", "RECV_B"):
                    posted[(kind[-1], a.stage_index, a.microbatch_index)] = t
            if r in prev_opt and tasks:
                first = next(t for rr, _, t in tasks if rr == r)
                b.edge(prev_opt[r], first)
        for key, s_task in sends.items():
            d, dst, mb = key
            src_stage = dst - 1 if d == "F" else dst + 1
            pair = (s2r[src_stage], s2r[dst])
            if pair not in chan:
                chan[pair] = b.resource(f"link{pair[0]}->{pair[1]}", ResourceKind.COMM_CHANNEL)
            size = costs.out_bytes[src_stage] if d == "F" else costs.out_bytes[dst]
            # the bytes occupy the channel; the latency does not (messages in flight overlap theirs):
            # it is a delay on a resource of its own
            wire = b.task(f"p2p_{d}{mb}", TaskKind.COMM, chan[pair], link.transfer_us(size) - lat, step=step,
                          layer=f"stage{src_stage}", deps=[s_task], size_bytes=size)  # fmt: skip
            if key in posted:
                # gloo sends an unbound buffer only once the receiver's "ready" notice has crossed the
                # link: the bytes leave at max(SEND posted, RECV posted + one latency)
                b.edge(posted[key], wire, lag_us=lat)
            delay = b.resource(f"latency{src_stage}->{dst}:{d}{mb}:step{step}", ResourceKind.COMM_CHANNEL)
            xfer[key] = b.task(f"p2p_{d}{mb}:latency", TaskKind.COMM, delay, lat, step=step, deps=[wire])
        # Pass 2: data dependencies of compute actions.
        for _r, a, t in tasks:
            for sub in a.sub_actions or (a,):
                kind, s, mb = sub.computation_type.value, sub.stage_index, sub.microbatch_index
                if kind == "F" and s > 0:
                    _dep(b, _first(xfer.get(("F", s, mb)), done.get((s - 1, "F", mb))), t)
                elif kind in ("B", "I"):
                    if s == spec.n_stages - 1:
                        _dep(b, done.get((s, "F", mb)), t)
                    else:
                        up = _first(
                            xfer.get(("B", s, mb)), done.get((s + 1, "I", mb)), done.get((s + 1, "B", mb))
                        )
                        _dep(b, up, t)
                elif kind == "W":
                    _dep(b, done.get((s, "I", mb)), t)
                elif kind in ("SEND_F", "SEND_B"):
                    src_kind = ("F",) if kind == "SEND_F" else ("I", "B")
                    for k in src_kind:
                        _dep(b, done.get((s, k, mb)), t)
        for r in order:
            mine = [s for s in range(spec.n_stages) if s2r[s] == r]
            prev_opt[r] = b.task(
                "optimizer", TaskKind.CPU, cpu[r], sum(costs.opt_us[s] for s in mine) + costs.step_overhead_us,
                step=step,
            )  # fmt: skip
    return b.build()


def _first(*vals: int | None) -> int | None:
    return next((v for v in vals if v is not None), None)


def _dep(b: GraphBuilder, src: int | None, dst: int) -> None:
    if src is not None and src != dst:
        b.edge(src, dst)


def _action_task(
    b: GraphBuilder, a: Any, costs: StageCosts, res: int, step: int, ov: float, link: P2PLink
) -> int:
    subs = a.sub_actions or (a,)
    dur = 0.0
    for sub in subs:
        k, s = sub.computation_type.value, sub.stage_index
        if k in ("SEND_F", "RECV_B"):  # this stage's output activation, or its gradient
            dur += link.host_cpu_us(costs.out_bytes[s]) + costs.p2p_action_us
        elif k in ("SEND_B", "RECV_F"):  # the previous stage's output, or its gradient
            dur += (link.host_cpu_us(costs.out_bytes[s - 1]) + costs.p2p_action_us) if s > 0 else 0.0
        elif k == "F":
            dur += costs.fwd_us[s] + ov
        elif k == "B":
            dur += costs.bwd_us[s] + ov
        elif k == "I":
            dur += costs.bwd_input_us[s] + ov
        elif k == "W":
            dur += costs.bwd_weight_us[s] + ov
    tk = TaskKind.CPU if dur > 0 else TaskKind.RUNTIME
    return b.task(str(a), tk, res, max(dur, 0.0), step=step, layer=f"stage{a.stage_index}" if a.stage_index >= 0 else None)


@dataclass(frozen=True, slots=True)
class PipePrediction:
    spec: PipeSpec
    split: list[list[int]]
    step_ms: float
    graph: TaskGraph


def predict_pipeline(
    prof: LayerProfile,
    spec: PipeSpec,
    *,
    batch_size: int,
    link: P2PLink,
    split: Sequence[int] | None = None,
    overhead_us: float = 0.0,
    steps: int = 4,
    replay: Replay | None = None,
    step_overhead_us: float = 0.0,
    p2p_overhead_us: float = 0.0,
) -> PipePrediction:
    """Predicted step time (ms) of ``spec`` from a single-process per-layer profile; the host CPU of
    sends and receives is in ``link``. ``replay``: how to replay each candidate's graph (default
    ``simulate``; a validation on one host passes the test host's replay, in which ranks sharing its
    cores compute slower beside each other: ``trainsim.testbed.contention``). ``step_overhead_us``: the
    runtime's own work per step and rank (``StageCosts.step_overhead_us``); ``p2p_overhead_us``: per SEND
    or RECV action (``StageCosts.p2p_action_us``). ``split``: layers per stage;
    None: the one with the shortest simulated step (``choose_split``)."""
    from trainsim.simulate.engine import simulate

    if batch_size % spec.microbatches:
        raise UserError(f"--microbatches {spec.microbatches} does not divide the batch size {batch_size}")
    micro = batch_size // spec.microbatches
    n_layers = len(prof.layer_names)
    if step_overhead_us < 0:
        raise UserError(f"step_overhead_us {step_overhead_us}; expected >= 0")
    if p2p_overhead_us < 0:
        raise UserError(f"p2p_overhead_us {p2p_overhead_us}; expected >= 0")
    rows = prof.table(micro)

    def run(sizes: Sequence[int]) -> tuple[list[list[int]], float, TaskGraph]:
        layers = check_split(sizes, n_layers, spec.n_stages)
        costs = replace(stage_costs(prof, layers, micro, overhead_us), step_overhead_us=step_overhead_us,
                        p2p_action_us=p2p_overhead_us)  # fmt: skip
        g = pipeline_graph(spec, costs, link, steps=steps)
        res = (replay or simulate)(g)
        ends = np.array([res.end_us[g.step == s].max() for s in range(steps)])
        step_ms = float((ends[-1] - ends[0]) / (steps - 1) / 1e3) if steps > 1 else float(ends[0] / 1e3)
        return layers, step_ms, g

    if split:
        check_split(split, n_layers, spec.n_stages)
        sizes = list(split)
    else:
        start = plan_split([r["fwd_us"] + r["bwd_us"] for r in rows], spec.n_stages)
        sizes = choose_split(lambda sz: run(sz)[1], n_layers, spec.n_stages, start)
    layers, step_ms, g = run(sizes)
    return PipePrediction(spec, layers, step_ms, g)
