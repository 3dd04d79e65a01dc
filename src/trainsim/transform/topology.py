"""Topology what-ifs: a data-parallel graph's all-reduces replaced by rolling parameter servers or gossip.

    >>> from trainsim.cluster.spec import cluster
    >>> from trainsim.cluster.topologies import Topology
    >>> from trainsim.transform.topology import retime_topology
    >>> spec = cluster(nodes=8, devices_per_node=1, inter="eth-10g")
    >>> g2 = retime_topology(dp, topo=Topology(kind="gossip_ring", degree=2), new=spec)   # doctest: +SKIP
    >>> simulate(g2).makespan_us                                                           # doctest: +SKIP

Works on the graphs ``transform.dataparallel.data_parallel`` builds (its ``allreduce:bucket<i>`` tasks)
and on traces whose gloo all-reduces carry ``size_bytes``. Only ``COMM`` tasks that are all-reduces
with a known size change (``network.collective_kind``); broadcasts, all-gathers and every compute task
keep their durations, so the step that ``simulate`` gives differs only by the gradient exchange.
Without ``old`` a task takes ``topologies.topology_sync_us(size)``; with ``old`` (the network the graph
was timed for) it keeps what it had beyond the all-reduce model: ``max(0, dur + sync_new(size) -
allreduce_old(size))``, as ``network.retime_collectives`` does.

Each task is re-timed alone: in a graph built with ``DPConfig.lanes > 1`` (gloo's concurrent buckets,
``dataparallel.chained_bucket_us``) a chained bucket gets its own full synchronisation time, not its
share of the chain's; build such a graph with ``comm_us=topology_comm_us(...)`` instead.

Gossip does not compute the average DDP's all-reduce gives: a what-if with it answers "how long is a
step", not "does it train as well" (module docstring of ``trainsim.cluster.topologies``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from trainsim.cluster.collectives import cluster_us
from trainsim.cluster.spec import ClusterSpec
from trainsim.cluster.topologies import Topology, topology_sync_us
from trainsim.errors import UserError
from trainsim.graph.ir import TaskGraph, TaskKind
from trainsim.transform.network import collective_kind


def topology_comm_us(spec: ClusterSpec, topo: Topology, ranks: int | None = None) -> Callable[[int], float]:
    """``bytes -> µs`` of one gradient synchronisation, for ``data_parallel(..., comm_us=...)``."""
    p = spec.world_size if ranks is None else ranks
    spec.check_ranks(p)
    return lambda nbytes: topology_sync_us(float(nbytes), spec, topo, p)


def allreduce_tasks(g: TaskGraph) -> np.ndarray:
    """The ``COMM`` tasks of ``g`` that are all-reduces with a known size (the ones a topology replaces)."""
    sized = np.flatnonzero((g.kind == TaskKind.COMM) & (g.size_bytes >= 0))
    return np.array(
        [t for t in sized.tolist() if collective_kind(g.task_name(t)) == "allreduce"], dtype=np.int64
    )


def retime_topology(
    g: TaskGraph,
    *,
    topo: Topology,
    new: ClusterSpec,
    old: ClusterSpec | None = None,
    ranks: int | None = None,
) -> TaskGraph:
    """``g`` with each sized all-reduce re-timed for ``topo`` on ``new`` (see the module docstring)."""
    tasks = allreduce_tasks(g)
    if tasks.size == 0:
        raise UserError(
            f"{g.source}: no all-reduce with a known size to re-time for {topo.label()}"
            "; expected a data-parallel graph (data_parallel) or a gloo trace with message sizes"
        )
    p = new.world_size if ranks is None else ranks
    dur = g.dur_us.copy()
    for t in tasks.tolist():
        size = float(g.size_bytes[t])
        t_new = topology_sync_us(size, new, topo, p)
        dur[t] = max(0.0, dur[t] + t_new - cluster_us("allreduce", size, old, p)) if old is not None else t_new
    return g.with_columns(dur_us=dur)
