"""The simulator: replay semantics, policies, cycles, critical path, breakdown, export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.errors import UserError
from trainsim.graph.ir import EdgeKind, GraphBuilder, Policy, ResourceKind, TaskKind
from trainsim.simulate import kernels
from trainsim.simulate.engine import prepare, simulate
from trainsim.simulate.synthetic import synthetic_graph
from trainsim.transform.primitives import schedule


def _launch_graph():  # type: ignore[no-untyped-def]
    b = GraphBuilder()
    cpu = b.resource("cpu", ResourceKind.CPU_THREAD)
    gpu = b.resource("gpu", ResourceKind.GPU_STREAM)
    l1 = b.task("launch", TaskKind.RUNTIME, cpu, 5, step=0)
    k1 = b.task("k1", TaskKind.KERNEL, gpu, 100, step=0, deps=[l1])
    l2 = b.task("launch", TaskKind.RUNTIME, cpu, 5, step=0)
    k2 = b.task("k2", TaskKind.KERNEL, gpu, 50, step=0, deps=[l2])
    s = b.task("sync", TaskKind.SYNC, cpu, 2, step=0, deps=[k2], dep_kind=EdgeKind.SYNC)
    return b.build(), (l1, k1, l2, k2, s)


def test_task_starts_when_resource_free_and_predecessors_done() -> None:
    g, (l1, k1, _l2, k2, s) = _launch_graph()
    r = simulate(g)
    assert r.start_us.tolist() == [0, 5, 5, 105, 155]
    assert r.end_us[s] == 157
    assert r.step_ms.tolist() == [pytest.approx(0.157)]
    assert r.critical_path().tolist() == [l1, k1, k2, s]


def test_breakdown_of_compute_comm_and_idle() -> None:
    b = GraphBuilder()
    gpu = b.resource("gpu", ResourceKind.GPU_STREAM)
    net = b.resource("net", ResourceKind.COMM_CHANNEL)
    k = b.task("k", TaskKind.KERNEL, gpu, 100, step=0)
    b.task("allreduce", TaskKind.COMM, net, 150, step=0, deps=[k], dep_kind=EdgeKind.COMM)
    b.task("k2", TaskKind.KERNEL, gpu, 100, step=0)
    bd = simulate(b.build()).breakdown()
    # compute [0,200); comm [100,250): exposed 50; nothing idle
    assert bd == pytest.approx({"step_ms": 0.25, "compute_ms": 0.2, "comm_ms": 0.15, "exposed_comm_ms": 0.05,
                                "idle_ms": 0.0})  # fmt: skip


def test_priority_policy_picks_smallest_priority_among_ready() -> None:
    b = GraphBuilder()
    gpu = b.resource("gpu", ResourceKind.GPU_STREAM)
    net = b.resource("net", ResourceKind.COMM_CHANNEL)
    grads = [b.task(f"g{i}", TaskKind.KERNEL, gpu, 10) for i in range(3)]
    comms = [b.task(f"c{i}", TaskKind.COMM, net, 100, deps=[grads[i]], dep_kind=EdgeKind.COMM, priority=-i)
             for i in range(3)]  # fmt: skip
    g = b.build()
    fifo = simulate(g)
    assert fifo.start_us[comms].tolist() == [10, 110, 210]
    prio = simulate(schedule(g, "net", Policy.PRIORITY))
    # c0 starts at 10 (only one ready); at 110 both c1 and c2 are ready: c2 (priority -2) goes first
    assert prio.start_us[comms].tolist() == [10, 210, 110]


def test_edge_lag_delays_the_destination_in_both_loops() -> None:
    """A lagged input is not there until its lag has passed: a PRIORITY resource runs what is ready now."""
    b = GraphBuilder()
    cpu = b.resource("cpu", ResourceKind.CPU_THREAD)
    net = b.resource("net", ResourceKind.COMM_CHANNEL)
    a = b.task("a", TaskKind.CPU, cpu, 10)
    late = b.task("late", TaskKind.COMM, net, 5, priority=-1)  # urgent, but its input arrives at 10 + 30
    b.edge(a, late, EdgeKind.DATA, lag_us=30.0)
    early = b.task("early", TaskKind.COMM, net, 50, priority=0, deps=[a])  # ready at 10
    g = b.build()
    fifo = simulate(g)
    assert fifo.start_us[late] == 40 and fifo.start_us[early] == 45  # queue order: late first, at 10 + 30
    prio = simulate(schedule(g, "net", Policy.PRIORITY))
    assert prio.start_us[early] == 10 and prio.start_us[late] == 60  # early was ready first and took the channel


def test_cycle_is_a_user_error_naming_a_task() -> None:
    b = GraphBuilder()
    r = b.resource("cpu", ResourceKind.CPU_THREAD)
    r2 = b.resource("cpu2", ResourceKind.CPU_THREAD)
    a = b.task("a", TaskKind.CPU, r, 1)
    c = b.task("c", TaskKind.CPU, r2, 1, deps=[a])
    b.edge(c, a)
    with pytest.raises(UserError, match="cycle"):
        simulate(b.build())


def test_negative_duration_rejected() -> None:
    b = GraphBuilder()
    r = b.resource("cpu", ResourceKind.CPU_THREAD)
    b.task("a", TaskKind.CPU, r, -1)
    with pytest.raises(UserError, match="duration"):
        b.build()


def test_chrome_trace_export(tmp_path: Path) -> None:
    g, _ = _launch_graph()
    out = simulate(g).to_chrome_trace(tmp_path / "sim.json")
    doc = json.loads(out.read_text())
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == g.n_tasks
    assert {e["name"] for e in xs} >= {"k1", "k2", "sync"}


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(10, 3000), st.booleans())
def test_fifo_and_event_driven_replays_agree(seed: int, n: int, lagged: bool) -> None:
    """The longest-path fast path and the discrete-event loop give the same schedule for FIFO graphs,
    with or without edge lags."""
    g = synthetic_graph(n, seed)
    if lagged:
        rng = np.random.default_rng(seed)
        g = g.with_columns(edge_lag_us=rng.uniform(0.0, 20.0, g.n_edges) * (rng.random(g.n_edges) < 0.5))
    p = prepare(g)
    a = simulate(g, p)
    start, end, _, done = kernels.replay_priority(
        p.dur, g.resource.astype(np.int64), p.res_ptr, p.res_queue, np.zeros(len(g.resources), np.bool_),
        g.priority, p.out_ptr, p.out_dst, p.out_lag, p.indeg,
    )  # fmt: skip
    assert done == g.n_tasks
    np.testing.assert_allclose(start, a.start_us)
    np.testing.assert_allclose(end, a.end_us)


def test_invariants_on_synthetic_graph() -> None:
    g = synthetic_graph(20_000, 3)
    r = simulate(g)
    # every explicit edge and every queue neighbour is respected
    assert (r.start_us[g.edge_dst] >= r.end_us[g.edge_src] - 1e-9).all()
    s, d, _ = g.implicit_edges()
    assert (r.start_us[d] >= r.end_us[s] - 1e-9).all()
    # durations are kept
    np.testing.assert_allclose(r.end_us - r.start_us, g.dur_us)
