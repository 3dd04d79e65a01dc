"""The test host's replay: host CPU taken by communication from the compute it overlaps, co-located
ranks slowing each other (testbed.contention)."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.graph.ir import GraphBuilder, ResourceKind, TaskKind
from trainsim.simulate.engine import simulate
from trainsim.testbed.contention import (
    comm_cpu_column,
    comm_slowdown_column,
    simulate_with_host_cpu,
    stretched_us,
)


def test_stretch_solves_the_processor_sharing_fixed_point() -> None:
    # one transfer [0, 1000) taking 40 % of a core; a task needing 100 us from t=0 runs at 60 % speed
    start = np.array([0.0, 0.0, 2000.0])
    base = np.array([1000.0, 100.0, 100.0])
    out = stretched_us(start, base, np.array([0.0]), np.array([1000.0]), np.array([0.4]), np.array([1, 2]))
    assert out[1] == pytest.approx(100.0 / 0.6, rel=1e-4)
    assert out[2] == 100.0  # after the transfer: untouched
    assert out[0] == 1000.0  # not a victim
    # the stolen share is capped at half a core: a transfer asking for all of it halves the speed
    full = stretched_us(start, base, np.array([0.0]), np.array([1000.0]), np.array([1.0]), np.array([1]))
    assert full[1] == pytest.approx(200.0, rel=1e-4)


def _overlap_graph(cpu_after_comm: float) -> tuple[object, int, int]:
    b = GraphBuilder("t")
    main = b.resource("cpu:main", ResourceKind.CPU_THREAD)
    chan = b.resource("comm", ResourceKind.COMM_CHANNEL)
    a = b.task("backward", TaskKind.CPU, main, 100.0)
    c = b.task("allreduce", TaskKind.COMM, chan, 200.0, deps=[a], size_bytes=1 << 20)
    f = b.task("next_forward", TaskKind.CPU, main, 100.0)
    opt = b.task("optimizer", TaskKind.CPU, main, cpu_after_comm, deps=[c])
    return b.build(), f, opt


def test_overlapped_compute_is_stretched_and_the_step_grows() -> None:
    g, fwd, opt = _overlap_graph(10.0)
    plain = simulate(g)
    cpu = np.zeros(g.n_tasks)
    cpu[g.kind == TaskKind.COMM] = 100.0  # half a core for the transfer's 200 us
    res = simulate_with_host_cpu(g, cpu)
    # the forward (100 us of CPU from t=100) overlaps the transfer (t=100..300), which takes half a
    # core: it runs at half speed, so it lasts 200 us
    assert res.end_us[fwd] - res.start_us[fwd] == pytest.approx(200.0, rel=1e-3)
    # the optimizer waits for the transfer either way; it starts at 300 in both replays
    assert res.start_us[opt] == pytest.approx(plain.start_us[opt]) == pytest.approx(300.0)
    assert res.makespan_us >= plain.makespan_us


def test_no_cpu_means_the_plain_replay() -> None:
    g, _, _ = _overlap_graph(10.0)
    res = simulate_with_host_cpu(g, np.zeros(g.n_tasks))
    np.testing.assert_allclose(res.end_us, simulate(g).end_us)
    with pytest.raises(ValueError, match="shape"):
        simulate_with_host_cpu(g, np.zeros(1))


def test_comm_cpu_column_uses_sizes_and_halves_broadcasts() -> None:
    b = GraphBuilder("t")
    chan = b.resource("comm", ResourceKind.COMM_CHANNEL)
    b.task("allreduce:x", TaskKind.COMM, chan, 10.0, size_bytes=1000)
    b.task("broadcast:buffers", TaskKind.COMM, chan, 10.0, size_bytes=1000)
    b.task("unknown size", TaskKind.COMM, chan, 10.0)
    g = b.build()
    col = comm_cpu_column(g, lambda s: 5.0 + s / 100)
    assert col.tolist() == [15.0, 7.5, 0.0]
    assert comm_slowdown_column(g, lambda s: 0.5 if s < 10 else 1.5).tolist() == [1.5, 1.5, 1.0]


def test_busy_compute_slows_the_transfer_it_overlaps() -> None:
    g, _fwd, opt = _overlap_graph(10.0)
    sigma = np.where(g.kind == TaskKind.COMM, 2.0, 1.0)
    res = simulate_with_host_cpu(g, np.zeros(g.n_tasks), comm_slowdown=sigma)
    comm = int(np.flatnonzero(g.kind == TaskKind.COMM)[0])
    # the transfer (200 us of work from t=100) overlaps the 100 us forward, during which it runs at
    # half speed (50 us of progress): it lasts 100 + 150 = 250 us
    assert res.end_us[comm] - res.start_us[comm] == pytest.approx(250.0)
    assert res.start_us[opt] == pytest.approx(350.0)
    with pytest.raises(ValueError, match="comm_slowdown"):
        simulate_with_host_cpu(g, np.zeros(g.n_tasks), comm_slowdown=np.ones(2))


def test_ranks_computing_at_once_slow_each_other_by_the_corun_factor() -> None:
    # rank 0 computes [0, 100) then [100, 200); rank 1 computes one 100 us task from 0 beside the first
    b = GraphBuilder("t")
    r0, r1 = b.resource("rank0:cpu", ResourceKind.CPU_THREAD), b.resource("rank1:cpu", ResourceKind.CPU_THREAD)
    a = b.task("a", TaskKind.CPU, r0, 100.0)
    b.task("a2", TaskKind.CPU, r0, 100.0, deps=[a])
    b.task("c", TaskKind.CPU, r1, 100.0)
    g = b.build()
    assert simulate_with_host_cpu(g, np.zeros(g.n_tasks)).end_us.max() == 200.0  # factor 1: plain replay
    res = simulate_with_host_cpu(g, np.zeros(g.n_tasks), corun_factor=1.5, rounds=30)
    # a and c overlap fully: x = 100 + x (1 - 1/1.5) -> 150; a2 overlaps nothing that computes after 150
    assert res.end_us[0] == pytest.approx(150.0, rel=1e-3) and res.end_us[2] == pytest.approx(150.0, rel=1e-3)
    assert res.end_us[1] - res.start_us[1] == pytest.approx(100.0, rel=1e-3)


def test_helper_thread_work_delays_the_compute_it_overlaps() -> None:
    """A decode on the future's thread (``helper_threads``) is the rank's own CPU work: on a host whose
    cores the ranks fill, it delays the compute it overlaps by all of its time; not named, it runs
    beside the compute for free."""
    b = GraphBuilder("t")
    main = b.resource("cpu:main", ResourceKind.CPU_THREAD)
    cb = b.resource("cpu:hook-callback", ResourceKind.CPU_THREAD)
    a = b.task("backward:a", TaskKind.CPU, main, 100.0)
    b.task("decode", TaskKind.CPU, cb, 40.0, deps=[a])
    nxt = b.task("backward:b", TaskKind.CPU, main, 100.0)
    g = b.build()
    free = simulate_with_host_cpu(g, np.zeros(g.n_tasks))
    assert free.end_us[nxt] == pytest.approx(200.0)
    res = simulate_with_host_cpu(g, np.zeros(g.n_tasks), helper_threads=("cpu:hook-callback",))
    assert res.end_us[nxt] - res.start_us[nxt] == pytest.approx(140.0, rel=1e-3)
    assert res.makespan_us == pytest.approx(240.0, rel=1e-3)


def test_concentration_charges_the_slowest_rank_several_ranks_helper_work() -> None:
    """Ranks sharing a host's cores: their helper threads run beside whichever compute thread shares
    their core, and the step waits for that rank. ``concentration=c`` makes the compute tasks lose c
    times what the rank's own helpers and transfers take; 1 is the default and leaves the replay as it
    was; below 1 is refused."""
    b = GraphBuilder("t")
    main = b.resource("cpu:main", ResourceKind.CPU_THREAD)
    cb = b.resource("cpu:hook-callback", ResourceKind.CPU_THREAD)
    chan = b.resource("comm", ResourceKind.COMM_CHANNEL)
    a = b.task("backward:a", TaskKind.CPU, main, 100.0)
    b.task("decode", TaskKind.CPU, cb, 20.0, deps=[a])
    b.task("allgather", TaskKind.COMM, chan, 200.0, deps=[a], size_bytes=1 << 20)
    nxt = b.task("backward:b", TaskKind.CPU, main, 100.0)
    g = b.build()
    cpu = np.zeros(g.n_tasks)
    cpu[g.kind == TaskKind.COMM] = 20.0  # a tenth of a core over the transfer's 200 us
    helpers = ("cpu:hook-callback",)
    own = simulate_with_host_cpu(g, cpu, helper_threads=helpers)
    lost = own.end_us[nxt] - own.start_us[nxt] - 100.0
    assert lost > 20.0  # the decode's 20 us, and some of the transfer's CPU
    same = simulate_with_host_cpu(g, cpu, helper_threads=helpers, concentration=1.0)
    assert same.end_us[nxt] == pytest.approx(own.end_us[nxt])
    two = simulate_with_host_cpu(g, cpu, helper_threads=helpers, concentration=2.0)
    assert two.end_us[nxt] - two.start_us[nxt] - 100.0 == pytest.approx(2 * lost, rel=0.05)
    assert two.end_us[a] == pytest.approx(own.end_us[a])  # nothing overlaps the first task
    with pytest.raises(ValueError, match="concentration"):
        simulate_with_host_cpu(g, cpu, concentration=0.5)


def test_wire_cost_is_taken_once_whatever_the_concentration() -> None:
    """``comm_wire_us`` loads the overlapping computation like the transfer's host CPU, but is already
    the step-setting rank's loss: ``concentration`` scales the host CPU, not it."""
    g, fwd, _ = _overlap_graph(10.0)
    wire = np.zeros(g.n_tasks)
    wire[g.kind == TaskKind.COMM] = 50.0  # a quarter of a core over the transfer's 200 us (t=100..300)
    none = np.zeros(g.n_tasks)
    one = simulate_with_host_cpu(g, none, comm_wire_us=wire)
    # the forward needs 100 us from t=100 at 3/4 speed: 133.3 us
    assert one.end_us[fwd] - one.start_us[fwd] == pytest.approx(100 / 0.75, rel=1e-3)
    two = simulate_with_host_cpu(g, none, comm_wire_us=wire, concentration=2.0)
    assert two.end_us[fwd] == pytest.approx(one.end_us[fwd])
    # with 25 us of host CPU too (an eighth of a core): the host part doubles, the wire part does not:
    # 100 / (1 - 1/8) = 114.3 us, host loss 14.3 x 2 = 28.6, plus the wire's 33.3: 161.9 us
    cpu = np.where(g.kind == TaskKind.COMM, 25.0, 0.0)
    both = simulate_with_host_cpu(g, cpu, comm_wire_us=wire, concentration=2.0)
    assert both.end_us[fwd] - both.start_us[fwd] == pytest.approx(100 + 2 * (100 / 0.875 - 100) + 100 / 0.75 - 100,
                                                                   rel=1e-3)  # fmt: skip
    with pytest.raises(ValueError, match="comm_wire_us"):
        simulate_with_host_cpu(g, none, comm_wire_us=np.zeros(1))
