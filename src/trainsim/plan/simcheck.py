"""Re-check a plan by building its pipeline task graph and simulating it.

    >>> from trainsim.plan.devices import homogeneous
    >>> from trainsim.plan.estimate import Strategy, estimate
    >>> from trainsim.plan.simcheck import simulate_plan
    >>> from trainsim.plan.workload import preset
    >>> e = estimate(preset("gpt3-1.3b"), Strategy(dp=2, pp=4, micro_batch=1), homogeneous("a100-80gb", 8),
    ...              global_batch=16)
    >>> chk = simulate_plan(preset("gpt3-1.3b"), homogeneous("a100-80gb", 8), e, global_batch=16)
    >>> abs(chk.step_s / e.step_s - 1) < 0.1
    True

The analytic estimate uses the closed form ``m * max_i t_i + bubble``; here the schedule is executed
task by task instead. One GPU stream per pipeline rank runs that rank's forward (F), backward (B) and,
for zero-bubble, weight-gradient (W) tasks in the schedule's order; every hop between consecutive
(virtual) stages is a transfer task on its own channel per direction, so p2p overlaps with compute
here (the estimate charges it as blocking); data-parallel gradient sync runs on a per-rank channel in
four buckets behind the last backward, then the optimizer. Task durations come from the estimate's
per-stage terms (``Estimate.stage_terms``), so differences come from the schedule alone: uneven
stages, interleaving, zero-bubble's deferred W, and overlap. One data-parallel replica is simulated
(replicas are identical).

Schedules: the planner's names map to PyTorch's schedule classes (``TORCH_SCHEDULE``), and each rank's
compute order is the one ``trainsim.transform.pipeline.compute_order`` takes from torch's own schedule
object, the order ``torch.distributed.pipelining`` runs and ``trainsim validate pipeline`` measures:
gpipe -> GPipe, 1f1b -> 1F1B, interleaved -> Interleaved1F1B (``v`` stages per rank, looped), zb ->
InterleavedZeroBubble with one stage per rank (ZB-H1: backward split into input gradient ``I`` and
weight gradient ``W``, the W placed by torch where they fill the bubbles).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# torch's schedules: without torch this module does not import and ``trainsim plan`` skips the check
from torch.distributed.pipelining.schedules import _Action, _ComputationType

from trainsim.errors import UserError
from trainsim.plan.devices import Cluster
from trainsim.plan.estimate import Estimate
from trainsim.plan.workload import Model
from trainsim.transform.pipeline import PipeSpec, compute_order

TORCH_SCHEDULE = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zb": "InterleavedZeroBubble"}
"""the planner's schedule name -> the ``torch.distributed.pipelining`` schedule the simulation runs"""


def schedule_actions(schedule: str, pp: int, m: int, v: int = 1) -> dict[int, list[Any]]:
    """Each rank's compute actions (torch's ``_Action``: stage, F/B/I/W, micro-batch) in run order.
    One stage (``pp`` 1) runs each micro-batch's forward and then its backward, whatever the schedule."""
    if pp == 1:
        fwd, bwd = _ComputationType.FORWARD, _ComputationType.FULL_BACKWARD
        return {0: [_Action(0, t, j) for j in range(m) for t in (fwd, bwd)]}
    spec = PipeSpec(schedule=TORCH_SCHEDULE[schedule], n_ranks=pp, stages_per_rank=v, microbatches=m)
    return compute_order(spec)


def _kind(a: Any) -> str:
    """F, B or W: a split backward's input-gradient half (I) plays B's part in the dependencies."""
    k = str(a.computation_type.value)
    return "B" if k == "I" else k


@dataclass(frozen=True, slots=True)
class SimCheck:
    step_s: float  # simulated step time
    analytic_s: float  # the estimate's step time
    n_tasks: int

    @property
    def rel_diff(self) -> float:
        return self.step_s / self.analytic_s - 1.0


def simulate_plan(model: Model, cluster: Cluster, e: Estimate, *, global_batch: int, max_tasks: int = 400_000) -> SimCheck:
    """Build the plan's task graph with ``GraphBuilder`` and simulate it with ``simulate``."""
    from trainsim.graph.ir import GraphBuilder, Policy, ResourceKind, TaskKind
    from trainsim.simulate.engine import simulate

    s = e.strategy
    pp, v = s.pp, s.virtual_stages if s.schedule == "interleaved" else 1
    m = global_batch // (s.dp * s.micro_batch)
    if pp * m * v * 3 > max_tasks:
        raise UserError(f"plan {s.text()}: {pp * m * v * 3} tasks exceed the simulation limit {max_tasks}")
    terms = e.stage_terms
    b = GraphBuilder(source=f"plan {s.text()}")
    acts = schedule_actions("1f1b" if s.schedule == "interleaved" and v == 1 else s.schedule, pp, m, v)
    ids: dict[tuple[str, int, int, int], int] = {}  # (kind F|B|W, virtual stage, mb, rank) -> task; I counts as B
    us = 1e6
    for r in range(pp):
        d = terms[r]
        res = b.resource(f"stage{r}:compute", ResourceKind.GPU_STREAM, Policy.FIFO)
        # communication that belongs to the forward pass (the rest, recomputed forward included, to backward)
        fwd_comm = d["tp_comm"] * d["tp_fwd_frac"] + (d["cp_comm"] + d["ep_comm"]) * d["fwd_frac"]
        fwd = (d["f"] + fwd_comm) / v
        bwd = (d["b"] + d["recompute"] + d["tp_comm"] + d["cp_comm"] + d["ep_comm"] + d["fsdp_comm"] - fwd_comm) / v
        # a split backward: the input gradient (I) takes half of it and the recomputation, W the other half
        dur = {"F": fwd, "B": bwd, "I": bwd / 2 + d["recompute"] / v / 2, "W": bwd / 2 - d["recompute"] / v / 2}
        for pos, a in enumerate(acts[r]):
            k = a.computation_type.value
            tid = b.task(str(a), TaskKind.KERNEL, res, dur[k] * us, step=0, order=float(pos))
            ids[(_kind(a), a.stage_index, a.microbatch_index, r)] = tid
    # transfers between consecutive virtual stages, one channel per direction per rank pair
    nvs = pp * v
    for vs in range(nvs - 1):
        r, rn = vs % pp, (vs + 1) % pp
        t = terms[r]["p2p_next"] if r + 1 < pp else terms[r]["p2p_next"] or terms[rn]["p2p_next"]
        if pp == 1:
            continue
        fch = b.resource(f"p2p:{r}->{rn}", ResourceKind.COMM_CHANNEL)
        bch = b.resource(f"p2p:{rn}->{r}", ResourceKind.COMM_CHANNEL)
        pos_f = {(a.stage_index, a.microbatch_index): p for p, a in enumerate(acts[r]) if _kind(a) == "F"}
        pos_b = {(a.stage_index, a.microbatch_index): p for p, a in enumerate(acts[rn]) if _kind(a) == "B"}
        for j in range(m):
            src = ids[("F", vs, j, r)]
            send = b.task(f"send_act{j}", TaskKind.COMM, fch, t * us, step=0, deps=[src], order=float(pos_f[(vs, j)]) + r * 1e-3)
            b.edge(send, ids[("F", vs + 1, j, rn)])
            srcb = ids[("B", vs + 1, j, rn)]
            sendb = b.task(f"send_grad{j}", TaskKind.COMM, bch, t * us, step=0, deps=[srcb], order=float(pos_b[(vs + 1, j)]))
            b.edge(sendb, ids[("B", vs, j, r)])
    # forward before backward of the same micro-batch on the same virtual stage
    for (k, vs, j, r), tid in list(ids.items()):
        if k == "B":
            b.edge(ids[("F", vs, j, r)], tid)
        elif k == "W":
            b.edge(ids[("B", vs, j, r)], tid)
    # data-parallel gradient sync behind the last backward, then the optimizer
    for r in range(pp):
        d = terms[r]
        res = b.resource(f"stage{r}:compute", ResourceKind.GPU_STREAM, Policy.FIFO)
        dpch = b.resource(f"dp:{r}", ResourceKind.COMM_CHANNEL)
        # gradient buckets: the first three become ready while the last backward runs (they wait for every
        # backward but that one), the last bucket when it ends (PyTorch DDP-style bucketing, 4 buckets)
        back = [ids[(_kind(a), a.stage_index, a.microbatch_index, r)] for a in acts[r] if _kind(a) != "F"]
        # gradient traffic behind the last backward: all-reduce (ZeRO-0), reduce-scatter (ZeRO-1), the hybrid
        # all-reduce across replicas (ZeRO-3); ZeRO-2 reduce-scatters per micro-batch (inside fsdp_comm)
        full = {0: d["dp_full"], 1: d["dp_full"] / 2, 2: 0.0, 3: d["dp_full"]}[s.zero]
        if s.dpc == 1:
            full = 0.0
        chunks = [
            b.task(f"grad_sync{q}", TaskKind.COMM, dpch, full / 4 * us, step=0, deps=back[:-1] if q < 3 else back)
            for q in range(4)
        ]
        opt = b.task("optimizer", TaskKind.KERNEL, res, d["opt"] * us, step=0, deps=chunks, order=1e9)
        if s.zero in (1, 2) and s.dpc > 1:
            b.task("param_allgather", TaskKind.COMM, dpch, d["dp_full"] / 2 * us, step=0, deps=[opt])
    g = b.build()
    step = simulate(g).makespan_us / us
    return SimCheck(step_s=step, analytic_s=e.step_s, n_tasks=g.n_tasks)
