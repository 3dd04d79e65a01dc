from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainsim.cluster.catalog import Link
from trainsim.cluster.spec import cluster
from trainsim.errors import UserError
from trainsim.graph.ir import GraphBuilder, ResourceKind, TaskGraph, TaskKind
from trainsim.transform.network import collective_kind, retime_collectives, scale_network

SLOW = Link(name="slow", bw_gbps=1.0, latency_us=10.0)
FAST = Link(name="fast", bw_gbps=10.0, latency_us=10.0)


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
