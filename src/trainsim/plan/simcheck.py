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

Schedules (action order per rank; ``F3`` = forward of micro-batch 3):

- gpipe: all F, then all B.
- 1f1b: ``pp - rank - 1`` warm-up F, then alternate F/B, then the remaining B (PipeDream-flush).
- interleaved: Megatron's order over ``v`` chunks (micro-batches in groups of ``pp``; warm-up
  ``(pp - rank - 1) * 2 + (v - 1) * pp``).
- zb: ZB-H1 (Qi et al. ICLR'24): 1F1B with B split into input-gradient B and weight-gradient W; F/B
  keep 1F1B's order and W runs whenever the next F/B is not ready (a priority resource), which is how
  ZB-H1 fills the cool-down bubble.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainsim.errors import UserError
from trainsim.plan.devices import Cluster
from trainsim.plan.estimate import Estimate
from trainsim.plan.workload import Model

Action = tuple[str, int, int]  # (kind F|B|W, chunk, micro-batch)


def schedule_actions(schedule: str, rank: int, pp: int, m: int, v: int = 1) -> list[Action]:
    """The compute order of one pipeline rank."""
    if schedule == "gpipe":
        return [("F", 0, j) for j in range(m)] + [("B", 0, j) for j in range(m)]
    if schedule == "interleaved" and v > 1:
        return _interleaved(rank, pp, m, v)
    warm = min(pp - rank - 1, m)
    out: list[Action] = [("F", 0, j) for j in range(warm)]
    nb = 0
    for j in range(warm, m):
        out.append(("F", 0, j))
        out.append(("B", 0, nb))
        nb += 1
    out += [("B", 0, j) for j in range(nb, m)]
    if schedule != "zb":
        return out
    # ZB-H1: B is the input gradient only; each B is followed by its W (weight gradient). The simulation
    # runs W at low priority so that a W fills the bubble while the next F/B waits (``simulate_plan``).
    zb: list[Action] = []
    for k, c, j in out:
        zb.append((k, c, j))
        if k == "B":
            zb.append(("W", c, j))
    return zb


def _interleaved(rank: int, pp: int, m: int, v: int) -> list[Action]:
    total = m * v

    def fwd(k: int) -> Action:
        grp, pos = divmod(k, pp * v)
        chunk = (k % (pp * v)) // pp
        return ("F", chunk, grp * pp + pos % pp)

    def bwd(k: int) -> Action:
        grp, pos = divmod(k, pp * v)
        chunk = v - 1 - (k % (pp * v)) // pp
        return ("B", chunk, grp * pp + pos % pp)

    if m % pp:
        raise UserError(f"interleaved schedule: micro-batches {m} must be a multiple of pp={pp} (Megatron-LM)")
    warm = min((pp - rank - 1) * 2 + (v - 1) * pp, total)
    out = [fwd(k) for k in range(warm)]
    nb = 0
    for k in range(warm, total):
        out.append(fwd(k))
        out.append(bwd(nb))
        nb += 1
    out += [bwd(k) for k in range(nb, total)]
    return out


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
    acts = [schedule_actions(s.schedule, r, pp, m, v) for r in range(pp)]
    ids: dict[tuple[str, int, int, int], int] = {}  # (kind, virtual stage, mb, rank) -> task
    us = 1e6
    zb = s.schedule == "zb"
    for r in range(pp):
        chain = -1
        d = terms[r]
        res = b.resource(f"stage{r}:compute", ResourceKind.GPU_STREAM, Policy.PRIORITY if zb else Policy.FIFO)
        # communication that belongs to the forward pass (the rest, recomputed forward included, to backward)
        fwd_comm = d["tp_comm"] * d["tp_fwd_frac"] + (d["cp_comm"] + d["ep_comm"]) * d["fwd_frac"]
        fwd = (d["f"] + fwd_comm) / v
        bwd = (d["b"] + d["recompute"] + d["tp_comm"] + d["cp_comm"] + d["ep_comm"] + d["fsdp_comm"] - fwd_comm) / v
        for pos, (k, c, j) in enumerate(acts[r]):
            if k == "F":
                dur = fwd
            elif s.schedule == "zb":
                dur = bwd / 2 + (d["recompute"] / v / 2 if k == "B" else -d["recompute"] / v / 2)
            else:
                dur = bwd
            prio = float(pos) if k != "W" else 1e6 + pos
            tid = b.task(f"{k}{j}.c{c}", TaskKind.KERNEL, res, dur * us, step=0, order=float(pos), priority=prio)
            ids[(k, c * pp + r, j, r)] = tid
            if zb and k != "W":
                if chain >= 0:
                    b.edge(chain, tid)  # F/B keep the 1F1B order; only W floats
                chain = tid
    # transfers between consecutive virtual stages, one channel per direction per rank pair
    nvs = pp * v
    for vs in range(nvs - 1):
        r, rn = vs % pp, (vs + 1) % pp
        t = terms[r]["p2p_next"] if r + 1 < pp else terms[r]["p2p_next"] or terms[rn]["p2p_next"]
        if pp == 1:
            continue
        fch = b.resource(f"p2p:{r}->{rn}", ResourceKind.COMM_CHANNEL)
        bch = b.resource(f"p2p:{rn}->{r}", ResourceKind.COMM_CHANNEL)
        pos_f = {(c * pp + r, j): p for p, (k, c, j) in enumerate(acts[r]) if k == "F"}
        pos_b = {(c * pp + rn, j): p for p, (k, c, j) in enumerate(acts[rn]) if k == "B"}
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
        res = b.resource(f"stage{r}:compute", ResourceKind.GPU_STREAM, Policy.PRIORITY if zb else Policy.FIFO)
        dpch = b.resource(f"dp:{r}", ResourceKind.COMM_CHANNEL)
        # gradient buckets: the first three become ready while the last backward runs (they wait for every
        # backward but that one), the last bucket when it ends (PyTorch DDP-style bucketing, 4 buckets)
        back = [ids[(k, c * pp + r, j, r)] for k, c, j in acts[r] if k in ("B", "W")]
        # gradient traffic behind the last backward: all-reduce (ZeRO-0), reduce-scatter (ZeRO-1), the hybrid
        # all-reduce across replicas (ZeRO-3); ZeRO-2 reduce-scatters per micro-batch (inside fsdp_comm)
        full = {0: d["dp_full"], 1: d["dp_full"] / 2, 2: 0.0, 3: d["dp_full"]}[s.zero]
        if s.dpc == 1:
            full = 0.0
        chunks = [
            b.task(f"grad_sync{q}", TaskKind.COMM, dpch, full / 4 * us, step=0, deps=back[:-1] if q < 3 else back)
            for q in range(4)
        ]
        opt = b.task("optimizer", TaskKind.KERNEL, res, d["opt"] * us, step=0, deps=chunks, order=1e9, priority=1e9)
        if s.zero in (1, 2) and s.dpc > 1:
            b.task("param_allgather", TaskKind.COMM, dpch, d["dp_full"] / 2 * us, step=0, deps=[opt])
    g = b.build()
    step = simulate(g).makespan_us / us
    return SimCheck(step_s=step, analytic_s=e.step_s, n_tasks=g.n_tasks)
