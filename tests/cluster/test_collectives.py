"""Cost models against hand-computed values (1 GB/s = 1000 bytes/us, alpha 10 us)."""

from __future__ import annotations

import pytest

from trainsim.cluster.catalog import Link
from trainsim.cluster.collectives import (
    AlphaBeta,
    allgather_us,
    allreduce_us,
    alltoall_us,
    broadcast_us,
    collective_us,
    fair_share_us,
    hierarchical_allreduce_us,
    p2p_us,
    ps_pushpull_us,
    reduce_scatter_us,
    ring_allreduce_us,
    ring_share,
    tree_allreduce_us,
)
from trainsim.cluster.spec import cluster
from trainsim.errors import UserError

L = Link(name="t", bw_gbyte_s=1.0, latency_us=10.0)
FAST = Link(name="f", bw_gbyte_s=10.0, latency_us=1.0)
MB = 1_000_000


def test_ring_family() -> None:
    # ring all-reduce, p=4: 2*3 steps * 10 us + 2*3/4 * 1e6 B / 1000 B/us = 60 + 1500
    assert ring_allreduce_us(MB, 4, L) == pytest.approx(1560.0)
    assert ring_allreduce_us(MB, 1, L) == 0.0
    # reduce-scatter / all-gather / all-to-all, p=4: 3 * (10 + 250)
    for fn in (reduce_scatter_us, allgather_us, alltoall_us):
        assert fn(MB, 4, L) == pytest.approx(780.0)


def test_tree_family() -> None:
    # p=8: log2 = 3 levels; all-reduce 2*3*(10 + 1000); broadcast 3*(10 + 1000)
    assert tree_allreduce_us(MB, 8, L) == pytest.approx(6060.0)
    assert broadcast_us(MB, 8, L) == pytest.approx(3030.0)
    assert broadcast_us(MB, 5, L) == pytest.approx(3030.0)  # ceil(log2 5) = 3


def test_hierarchical() -> None:
    # 2 nodes x 4: RS intra 3*(1 + 25) = 78; AR inter of 250 kB over 2: 2*10 + 250 = 270; AG 78
    assert hierarchical_allreduce_us(MB, 2, 4, FAST, L) == pytest.approx(78 + 270 + 78)


def test_parameter_server() -> None:
    # separate servers: 4 workers, 2 servers: worker sends 1 MB, server receives 4*1/2 = 2 MB -> 2000 us
    assert ps_pushpull_us(MB, 4, 2, L, colocated=False) == pytest.approx(2 * (10 + 2000))
    # co-located 4 on 4: sends 0.75 MB, receives 3 * 0.25 MB -> 750 us per phase
    assert ps_pushpull_us(MB, 4, 4, L) == pytest.approx(2 * (10 + 750))
    with pytest.raises(UserError):
        ps_pushpull_us(MB, 2, 3, L)


def test_spec_dispatch() -> None:
    c = cluster(nodes=4, devices_per_node=1, intra=FAST, inter=L)
    assert allreduce_us(MB, c) == pytest.approx(1560.0)
    assert allreduce_us(MB, c, ranks=1) == 0.0
    with pytest.raises(UserError, match="5 ranks"):
        allreduce_us(MB, c, ranks=5)
    h = cluster(nodes=2, devices_per_node=4, intra=FAST, inter=L, topology="hierarchical")
    assert allreduce_us(MB, h) == pytest.approx(426.0)
    assert collective_us("broadcast", MB, 2, L) == pytest.approx(1010.0)
    with pytest.raises(UserError, match="unknown collective"):
        collective_us("gossip", MB, 2, L)


def test_fair_share() -> None:
    k = Link(name="s", bw_gbyte_s=1.0, latency_us=0.0)
    # two 1 MB transfers at t=0 share the link: both end at 2000 us
    assert fair_share_us([0, 0], [MB, MB], k).tolist() == pytest.approx([2000.0, 2000.0])
    # second starts at 500: first sends 0.5 MB alone, then both at 500 B/us: first ends at 1500;
    # the second has 0.5 MB left then and finishes it alone in 500 us
    end = fair_share_us([0, 500], [MB, MB], k)
    assert end[0] == pytest.approx(1500.0) and end[1] == pytest.approx(2000.0)
    # disjoint transfers do not interact; latency is added
    lat = Link(name="l", bw_gbyte_s=1.0, latency_us=5.0)
    assert fair_share_us([0, 5000], [MB, MB], lat).tolist() == pytest.approx([1005.0, 6005.0])


@pytest.mark.parametrize(("starts", "sizes"), [([float("nan")], [MB]), ([0.0], [float("nan")]), ([0.0], [float("inf")])])
def test_fair_share_refuses_non_finite_input(starts: list[float], sizes: list[float]) -> None:
    """Its fluid simulation never ended on a NaN or infinite transfer (found 2026-11-26)."""
    with pytest.raises(UserError, match="must be finite"):
        fair_share_us(starts, sizes, Link(name="t", bw_gbyte_s=1.0, latency_us=0.0))


def test_collective_refuses_a_nan_size() -> None:
    with pytest.raises(UserError, match="expected a finite number >= 0"):
        ring_allreduce_us(float("nan"), 4, Link(name="t", bw_gbyte_s=1.0, latency_us=0.0))


def test_one_interface_alpha_beta() -> None:
    """``AlphaBeta.time_us`` is the module's formula of each kind; a send is one latency and its bytes."""
    net = AlphaBeta(L)
    for kind, fn in (("allreduce", ring_allreduce_us), ("reduce_scatter", reduce_scatter_us),
                     ("allgather", allgather_us), ("broadcast", broadcast_us), ("alltoall", alltoall_us)):  # fmt: skip
        assert net.time_us(kind, MB, 4) == fn(MB, 4, L)
    assert net.time_us("p2p", MB, 2) == p2p_us(MB, L) == pytest.approx(10.0 + 1000.0)
    assert ring_share("allreduce", 4) == 1.5 and ring_share("allgather", 4) == 0.75 and ring_share("p2p", 2) == 1.0
    with pytest.raises(UserError, match="unknown collective 'gossip'"):
        net.time_us("gossip", MB, 4)
    with pytest.raises(UserError, match="not a ring collective"):
        ring_share("broadcast", 4)


def test_one_interface_calibration() -> None:
    """A link calibration answers ``time_us`` from its fit among its ranks, from its ring link elsewhere."""
    from trainsim.cluster.calibration import Calibration

    cal = Calibration(world=2, rate_mbit=100, delay_ms=0, sizes_bytes=[1024, MB], measured_us=[500.0, 9000.0],
                      a_us=400.0, b_us_per_byte=0.0085, link=L, p2p_sizes_bytes=[1024, MB],
                      p2p_oneway_us=[300.0, 5300.0])  # fmt: skip
    assert cal.time_us("allreduce", MB, 2) == cal.predict_us(MB)
    assert cal.time_us("allreduce", MB, 4) == ring_allreduce_us(MB, 4, L)
    assert cal.time_us("allgather", MB, 2) == cal.allgather_us(MB / 2)
    a, b = cal.p2p_line()
    assert cal.time_us("p2p", MB, 2) == pytest.approx(a + b * MB) and b > 0


def test_link_bandwidth_is_named_in_gbyte_s_and_takes_its_old_name() -> None:
    assert Link(name="o", bw_gbps=2.0, latency_us=1.0) == Link(name="o", bw_gbyte_s=2.0, latency_us=1.0)
    assert cluster(nodes=2, inter={"bw_gbps": 1.5}).inter.bw_gbyte_s == 1.5
    assert cluster(nodes=2, inter={"bw_gbyte_s": 1.5}).inter.bytes_per_us == 1500.0


def test_the_planner_prices_a_ring_with_the_same_share() -> None:
    """``plan.optime``'s ring all-reduce, all-gather and send move the bytes of ``ring_share``: at full
    efficiency and no latency they equal the alpha-beta model's (the planner adds its own latency terms)."""
    from dataclasses import replace

    from trainsim.plan.optime import DEFAULT_EFFICIENCY, gather_s, p2p_s, ring_allreduce_s

    eff = replace(DEFAULT_EFFICIENCY, network=1.0, comm_latency_us=0.0)
    free = Link(name="z", bw_gbyte_s=1.0, latency_us=0.0)
    assert ring_allreduce_s(MB, 8, 1.0, eff, on_nvlink=False) * 1e6 == pytest.approx(ring_allreduce_us(MB, 8, free))
    assert gather_s(MB, 8, 1.0, eff, on_nvlink=False) * 1e6 == pytest.approx(allgather_us(MB, 8, free))
    assert p2p_s(MB, 1.0, eff, on_nvlink=False) * 1e6 == pytest.approx(p2p_us(MB, free))
