from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainsim.cluster.catalog import Link
from trainsim.cluster.spec import cluster
from trainsim.errors import UserError
from trainsim.graph.ir import GraphBuilder, ResourceKind, TaskGraph, TaskKind
from trainsim.transform.network import collective_kind, retime_collectives, scale_network, split_collectives

SLOW = Link(name="slow", bw_gbyte_s=1.0, latency_us=10.0)
FAST = Link(name="fast", bw_gbyte_s=10.0, latency_us=10.0)


def _graph() -> TaskGraph:
    b = GraphBuilder()
    cpu = b.resource("cpu", ResourceKind.CPU_THREAD)
    ch = b.resource("comm", ResourceKind.COMM_CHANNEL)
    x = b.task("compute", TaskKind.CPU, cpu, 100.0)
    b.task("gloo:all_reduce", TaskKind.COMM, ch, 1100.0, deps=[x], size_bytes=1_000_000)
    b.task("nccl:all_gather", TaskKind.COMM, ch, 600.0, size_bytes=1_000_000)
    return b.build()


def test_kind_from_name() -> None:
    assert collective_kind("ncclDevKernel_AllGather_RING_LL") == "allgather"
    assert collective_kind("gloo:reduce_scatter") == "reduce_scatter"
    assert collective_kind("allreduce:bucket0") == "allreduce"
    assert collective_kind("something") == "allreduce"


def test_retime_absolute_and_relative() -> None:
    g = _graph()
    new = cluster(nodes=2, inter=FAST)
    g2 = retime_collectives(g, new=new)
    # ring all-reduce over 2 ranks: 2*10 + 1e6/10000 = 120; all-gather: 10 + 0.5e6/10000 = 60
    assert g2.dur_us[1:].tolist() == pytest.approx([120.0, 60.0])
    old = cluster(nodes=2, inter=SLOW)  # models 1020 and 510: the traced times keep their overhead (+80, +90)
    g3 = retime_collectives(g, new=new, old=old)
    assert g3.dur_us[1:].tolist() == pytest.approx([200.0, 150.0])
    assert g3.dur_us[0] == 100.0
    with pytest.raises(UserError, match="ranks requested"):
        retime_collectives(g, new=new, ranks=4)


def test_scale_network() -> None:
    g = scale_network(_graph(), bw_factor=2.0, latency_add_us=5.0)
    assert g.dur_us.tolist() == pytest.approx([100.0, 555.0, 305.0])
    with pytest.raises(UserError):
        scale_network(_graph(), bw_factor=0)
    b = GraphBuilder()
    b.task("fwd", TaskKind.CPU, b.resource("cpu", ResourceKind.CPU_THREAD), 10.0)
    with pytest.raises(UserError, match="no communication tasks"):  # it changed nothing, without a word
        scale_network(b.build(), bw_factor=2.0)


NCCL_TRACE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "a100_nccl_2ranks_rank0.json.gz"


@pytest.mark.skipif(not NCCL_TRACE.exists(), reason="shared NCCL trace not present")
def test_retime_real_nccl_trace() -> None:
    """Its NCCL kernels carry no sizes: they are inferred from the network they were traced on."""
    from trainsim.graph.build import load_trace
    from trainsim.simulate.engine import simulate

    g = load_trace(NCCL_TRACE)
    comm = g.kind == TaskKind.COMM
    with pytest.raises(UserError, match="old="):
        retime_collectives(g, new=cluster(nodes=2, inter="eth-10g"))
    old = cluster(nodes=1, devices_per_node=2, device="a100-80gb", intra="pcie4-x16")
    big = comm & (g.dur_us > 1000)
    same = retime_collectives(g, new=old, old=old)  # same network: traced times come back
    assert np.allclose(same.dur_us[big], g.dur_us[big], rtol=1e-6)
    slow = retime_collectives(g, new=cluster(nodes=2, device="a100-80gb", inter="eth-10g"), old=old)
    # 10 GbE is 25x slower per byte than PCIe 4 x16: the big all-reduces grow about that much
    assert (slow.dur_us[big] > 10 * g.dur_us[big]).all()
    assert simulate(slow).makespan_us > simulate(g).makespan_us


# --------------------------------------------------------------------------- waiting vs transfer (issue 46)
def _ddp_graph(durs: tuple[float, ...] = (1000.0, 1200.0, 1500.0), pause: tuple[bool, ...] = (True, True, True),
               size: int = 1_000_000) -> TaskGraph:  # fmt: skip
    """Steps of 100 us compute, each then all-reducing ``size`` bytes; ``pause[i]`` False: step i computes
    while the previous all-reduce runs, so the two all-reduces follow each other on the link."""
    b = GraphBuilder()
    cpu = b.resource("cpu", ResourceKind.CPU_THREAD)
    ch = b.resource("comm", ResourceKind.COMM_CHANNEL)
    prev = None
    for i, d in enumerate(durs):
        x = b.task("compute", TaskKind.CPU, cpu, 100.0, step=i, deps=[prev] if prev is not None and pause[i] else [])
        prev = b.task("gloo:all_reduce", TaskKind.COMM, ch, d, step=i, deps=[x], size_bytes=size)
    return b.build()


def test_split_fits_the_median_busy_period() -> None:
    """Three all-reduces of 1 MB (2 ranks: 1 MB over each link) in 1000, 1200 and 1500 us, apart: the
    median moved 833 B/us; at that rate each transfers for 1200 us (the faster one: its 1000), the rest
    is waiting for the peers."""
    g = _ddp_graph()
    sp = split_collectives(g)
    assert sp.method == "fit" and sp.rate_bytes_per_us == pytest.approx(1e6 / 1200)
    assert sp.transfer_us.tolist() == pytest.approx([1000.0, 1200.0, 1200.0])
    assert sp.wait_us.tolist() == pytest.approx([0.0, 0.0, 300.0])
    assert "fitted on the trace" in sp.note and "skew" in sp.note
    # a link twice as fast halves the transfers only
    assert scale_network(g, bw_factor=2.0, split=sp).dur_us[sp.tasks].tolist() == pytest.approx([500, 600, 900])
    assert scale_network(g, bw_factor=2.0).dur_us[sp.tasks].tolist() == pytest.approx([500, 600, 750])  # no split
    # the same with cluster files: the model's time ratio scales the fitted transfer
    old = cluster(nodes=2, inter=Link(name="old", bw_gbyte_s=1.25, latency_us=0.0))
    new = cluster(nodes=2, inter=Link(name="new", bw_gbyte_s=2.5, latency_us=0.0))
    g2 = retime_collectives(g, new=new, old=old, split=sp)
    assert g2.dur_us[sp.tasks].tolist() == pytest.approx([500, 600, 900])
    with pytest.raises(UserError, match="old="):
        retime_collectives(g, new=new, split=sp)


def test_split_with_the_traced_network_model() -> None:
    """Given the network of the trace (1.25 GB/s: 800 us per all-reduce), the rest of each is the skew."""
    old = cluster(nodes=2, inter=Link(name="old", bw_gbyte_s=1.25, latency_us=0.0))
    sp = split_collectives(_ddp_graph(), old=old)
    assert sp.method == "model"
    assert sp.transfer_us.tolist() == pytest.approx([800.0, 800.0, 800.0])
    assert sp.wait_us.tolist() == pytest.approx([200.0, 400.0, 700.0])
    assert sp.wait_of(int(sp.tasks[2])) == pytest.approx(700.0) and sp.wait_of(0) == 0.0


def test_split_and_retime_with_a_collective_cost_model() -> None:
    """Any ``CollectiveCost`` prices the traced network and the new one, not only a cluster file: a ring
    all-reduce of 1 MB over 2 ranks on 1.25 GB/s moves 1 MB in 800 us, on 2.5 GB/s in 400 us; each
    traced all-reduce keeps its rest (200, 400, 700 us) as waiting."""
    from trainsim.cluster.collectives import AlphaBeta

    old = AlphaBeta(Link(name="old", bw_gbyte_s=1.25, latency_us=0.0))
    new = AlphaBeta(Link(name="new", bw_gbyte_s=2.5, latency_us=0.0))
    g = _ddp_graph()
    sp = split_collectives(g, old=old, ranks=2)
    assert sp.method == "model" and "AlphaBeta" in sp.note
    assert sp.transfer_us.tolist() == pytest.approx([800.0, 800.0, 800.0])
    assert sp.wait_us.tolist() == pytest.approx([200.0, 400.0, 700.0])
    g2 = retime_collectives(g, new=new, old=old, ranks=2, split=sp)
    assert g2.dur_us[sp.tasks].tolist() == pytest.approx([600.0, 800.0, 1100.0])
    # 4 ranks: 2 (p - 1) / p = 1.5 MB each, 1200 us: longer than the first all-reduce, all of it transfer
    sp4 = split_collectives(g, old=old, ranks=4)
    assert sp4.transfer_us.tolist() == pytest.approx([1000.0, 1200.0, 1200.0])


def test_collectives_that_follow_each_other_form_one_busy_period() -> None:
    """The second all-reduce starts where the first ends (its compute overlapped): 2 MB in 1500 us
    (1333 B/us); with the third, alone, 1 MB in 1000 us, and the fourth, 1 MB in 1100 us, the median
    is 1000 B/us: the first period transfers for 2000 us of its 1500 (so all of it), the fourth waits 100."""
    g = _ddp_graph(durs=(1000.0, 500.0, 1000.0, 1100.0), pause=(True, False, True, True))
    sp = split_collectives(g)
    assert sp.rate_bytes_per_us == pytest.approx(1000.0)
    assert sp.wait_us.tolist() == pytest.approx([0.0, 0.0, 0.0, 100.0])
    b = GraphBuilder()
    b.task("gloo:all_reduce", TaskKind.COMM, b.resource("comm", ResourceKind.COMM_CHANNEL), 10.0)
    with pytest.raises(UserError, match="known size"):
        split_collectives(b.build())


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.netns
def test_five_times_faster_link_shortens_a_real_ddp_trace(tmp_path: Path) -> None:
    """A real 2-rank gloo DDP run of the mlp on a 100 Mbit/s link (about 0.9 s per step, nearly all of it
    the all-reduce): on either rank's trace, a 5x faster link makes the step at least 3.5x shorter (a
    real run at 500 Mbit/s: 4.7x, docs/benchmarks/whatif_network.json)."""
    from trainsim.graph.build import load_trace
    from trainsim.run.traced import TracedRunConfig, traced_run
    from trainsim.simulate.engine import simulate
    from trainsim.testbed.netns import netns_unavailable, shaped_ranks

    if (why := netns_unavailable()) is not None:
        pytest.skip(why)
    res = traced_run(TracedRunConfig(model="mlp", world=2, rate_mbit=100), tmp_path / "run", network=shaped_ranks)
    for trace in res["traces"]:
        g = load_trace(trace)
        base = simulate(g).mean_step_ms
        assert base == pytest.approx(float(g.steps.measured_us.mean()) / 1e3, rel=0.02)
        fast = simulate(scale_network(g, bw_factor=5.0, split=split_collectives(g))).mean_step_ms
        assert base / fast > 3.5, (trace, base, fast)
