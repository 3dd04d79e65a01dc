"""Rolling parameter servers and gossip: hand-worked costs, monotonic properties, the DP what-if, one real run."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.transform.test_dataparallel import _profile_like
from trainsim.cluster.catalog import Link
from trainsim.cluster.collectives import ring_allreduce_us
from trainsim.cluster.spec import ClusterSpec, cluster
from trainsim.cluster.topologies import (
    KINDS,
    Topology,
    calibrated_link,
    expected_max_indegree,
    gossip_graph_us,
    gossip_us,
    random_peers,
    ring_peers,
    rolling_ps_us,
    sync_us,
    topology_sync_us,
)
from trainsim.errors import UserError
from trainsim.graph.ir import TaskGraph, TaskKind
from trainsim.simulate.engine import simulate
from trainsim.transform.dataparallel import DPConfig, data_parallel
from trainsim.transform.topology import allreduce_tasks, retime_topology, topology_comm_us

LINK = Link(name="x", bw_gbyte_s=1.0, latency_us=10.0)  # 1000 bytes per µs
MB = 1_000_000


# --------------------------------------------------------------------------- hand-worked costs
def test_rolling_ps_by_hand() -> None:
    # p=4: 2(p-1) = 6 rounds of alpha + 1e6/4 bytes at 1000 B/µs = 10 + 250
    assert rolling_ps_us(MB, 4, LINK) == pytest.approx(6 * 260)
    # burst: 2 phases of alpha + the owner's 3 shards = 10 + 750
    assert rolling_ps_us(MB, 4, LINK, schedule="burst") == pytest.approx(2 * 760)
    # the largest shard 1.2x the mean: every round waits for it, 10 + 300
    assert rolling_ps_us(MB, 4, LINK, imbalance=1.2) == pytest.approx(6 * 310)
    # the owner adds 3 shards of 250 kB at 1 GB/s = 1000 B/µs: 750 µs more
    assert rolling_ps_us(MB, 4, LINK, reduce_gbps=1.0) == pytest.approx(1560 + 750)
    assert rolling_ps_us(MB, 1, LINK) == 0.0


def test_rolling_ps_is_a_ring_allreduce_without_relays() -> None:
    for p in (2, 3, 4, 7, 64):
        assert rolling_ps_us(3 * MB, p, LINK) == pytest.approx(ring_allreduce_us(3 * MB, p, LINK))


def test_gossip_by_hand() -> None:
    assert gossip_us(MB, 4, LINK, degree=2) == pytest.approx(10 + 2 * 1000)  # both neighbours, one alpha
    assert gossip_us(MB, 2, LINK, degree=2) == pytest.approx(10 + 1000)  # two ranks: one distinct peer
    assert gossip_us(MB, 1, LINK) == 0.0
    assert ring_peers(4, 2) == [[1, 3], [2, 0], [3, 1], [0, 2]]
    # a star of pushes into worker 0: its down-link drains 2 models
    assert gossip_graph_us(MB, [[1], [0], [0]], LINK) == pytest.approx(10 + 2 * 1000)
    with pytest.raises(UserError, match="out of range"):
        gossip_graph_us(MB, [[5], [0]], LINK)


def test_random_gossip_waits_for_the_busiest_receiver() -> None:
    # p=3, d=1: of the 8 draws, the 2 cycles give max in-degree 1, the other 6 give 2 -> 1.75
    assert expected_max_indegree(3, 1) == pytest.approx(1.75, abs=0.05)
    assert expected_max_indegree(4, 3) == 3.0  # everyone to everyone
    assert gossip_us(MB, 3, LINK, degree=1, peers="random") == pytest.approx(10 + 1.75 * 1000, rel=0.03)
    peers = random_peers(5, 2, np.random.default_rng(0))
    assert all(len(q) == 2 and i not in q for i, q in enumerate(peers))
    assert expected_max_indegree(100, 2) > 2  # the binomial form above MC_MAX_P


def test_calibrated_link() -> None:
    link = calibrated_link(p2p_line=(100.0, 0.001), rate_mbit=80.0, efficiency=1.0, delay_ms=1.0)
    assert link.latency_us == pytest.approx(1100.0)
    assert 1 / link.bytes_per_us == pytest.approx(0.001 + 0.1)  # host + 8 bits / 80 bits per µs
    assert calibrated_link(p2p_line=(0.0, 0.5), rate_mbit=None).bytes_per_us == pytest.approx(2.0)


def test_cluster_spec_picks_the_link_between_nodes() -> None:
    spec = cluster(nodes=4, devices_per_node=1, inter={"bw_gbyte_s": 1.0, "latency_us": 10.0})
    assert topology_sync_us(MB, spec, Topology(kind="gossip_ring")) == pytest.approx(2010.0)
    with pytest.raises(UserError, match="ranks requested"):
        topology_sync_us(MB, spec, Topology(), ranks=8)


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"kind": "allreduce"}, "rolling_ps, gossip_ring"), ({"degree": 0}, "positive number"),
     ({"imbalance": 0.5}, ">= 1"), ({"schedule": "x"}, "rolling, burst"), ({"reduce_gbps": 0.0}, "positive")],
)  # fmt: skip
def test_bad_topology(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(UserError, match=match):
        Topology(**kw)


def test_bad_sizes() -> None:
    with pytest.raises(UserError, match="finite"):
        sync_us(float("nan"), 4, LINK, Topology())
    with pytest.raises(UserError, match=">= 1"):
        sync_us(MB, 0, LINK, Topology())


# --------------------------------------------------------------------------- properties
TOPOS = st.builds(
    Topology, kind=st.sampled_from(KINDS), degree=st.integers(1, 4), schedule=st.sampled_from(["rolling", "burst"]),
    imbalance=st.floats(1.0, 3.0),
)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(topo=TOPOS, p=st.integers(1, 16), size=st.floats(0, 1e9), bw=st.floats(1e-3, 1e3), more=st.floats(1.0, 100.0),
       alpha=st.floats(0, 1e3))  # fmt: skip
def test_more_bandwidth_never_slower(
    topo: Topology, p: int, size: float, bw: float, more: float, alpha: float
) -> None:
    slow = Link(name="slow", bw_gbyte_s=bw, latency_us=alpha)
    fast = Link(name="fast", bw_gbyte_s=bw * more, latency_us=alpha)
    assert sync_us(size, p, fast, topo) <= sync_us(size, p, slow, topo) * (1 + 1e-12)
    worse = Link(name="worse", bw_gbyte_s=bw, latency_us=alpha + 1.0)
    assert sync_us(size, p, worse, topo) >= sync_us(size, p, slow, topo)
    assert sync_us(size * 2, p, slow, topo) >= sync_us(size, p, slow, topo)


# --------------------------------------------------------------------------- the what-if on a DP graph
def _dp(world: int = 4) -> tuple[TaskGraph, ClusterSpec]:
    spec = cluster(nodes=world, devices_per_node=1, inter={"bw_gbyte_s": 0.1, "latency_us": 20.0})
    g, params, layers = _profile_like()
    ring = topology_comm_us(spec, Topology(kind="rolling_ps"))  # the ring all-reduce's time, shard by shard
    return data_parallel(g, params, layers, DPConfig(world=world), comm_us=ring), spec


@settings(max_examples=25, deadline=None)
@given(topo=TOPOS, world=st.integers(2, 8))
def test_whatif_changes_only_allreduce_tasks(topo: Topology, world: int) -> None:
    dp, spec = _dp(world)
    g2 = retime_topology(dp, topo=topo, new=spec)
    changed = np.flatnonzero(g2.dur_us != dp.dur_us)
    assert set(changed.tolist()) <= set(allreduce_tasks(dp).tolist())
    assert (dp.kind[changed] == TaskKind.COMM).all()
    assert g2.n_tasks == dp.n_tasks and g2.size_bytes.tolist() == dp.size_bytes.tolist()


def test_whatif_step_by_hand() -> None:
    dp, spec = _dp(4)
    tasks = allreduce_tasks(dp)
    assert tasks.size > 0
    gossip = retime_topology(dp, topo=Topology(kind="gossip_ring", degree=2), new=spec)
    for t in tasks.tolist():  # 20 µs + 2 models at 100 bytes per µs
        assert gossip.dur_us[t] == pytest.approx(20 + 2 * dp.size_bytes[t] / 100)
    # gossip's 2 models per NIC against the ring's 1.5: the step grows
    assert simulate(gossip).makespan_us > simulate(dp).makespan_us
    # with old = the ring cluster, the ring-equivalent rolling PS keeps every duration
    same = retime_topology(dp, topo=Topology(kind="rolling_ps"), new=spec, old=spec)
    np.testing.assert_allclose(same.dur_us, dp.dur_us)


def test_whatif_needs_allreduces() -> None:
    g, _params, _layers = _profile_like()
    with pytest.raises(UserError, match="no all-reduce"):
        retime_topology(g, topo=Topology(), new=cluster(nodes=2))


# --------------------------------------------------------------------------- real gloo ranks
@pytest.mark.multiproc
def test_patterns_on_two_gloo_ranks() -> None:
    from trainsim.run.topo_worker import PATTERNS, TopoRunConfig, run_topologies

    cfg = TopoRunConfig(world_size=2, sizes_bytes=[64 << 10], reps=2)
    out = run_topologies(cfg, timeout_s=120)
    assert out["max_error"] == {pat: 0.0 for pat in PATTERNS}  # sums of small integers are exact
    assert all(out["median_ms"][pat][str(64 << 10)] > 0 for pat in PATTERNS)
