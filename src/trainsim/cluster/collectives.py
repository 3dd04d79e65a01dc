"""The network cost model: one interface, the alpha-beta formulas of collectives with their step counts.

    >>> from trainsim.cluster.catalog import Link
    >>> from trainsim.cluster.collectives import AlphaBeta, ring_allreduce_us
    >>> ring_allreduce_us(1_000_000, 4, Link(name="x", bw_gbyte_s=1.0, latency_us=10.0))
    1560.0
    >>> AlphaBeta(Link(name="x", bw_gbyte_s=1.0, latency_us=10.0)).time_us("allgather", 1_000_000, 4)
    780.0

**One interface**, ``CollectiveCost.time_us(kind, size_bytes, group)``, implemented by ``AlphaBeta`` (these
formulas over one link), ``calibration.Calibration`` (a link calibration) and ``testbed.machine``'s
``MachineCalibration.cost`` (the test host). The planner (``plan.optime``) prices rings with ``ring_share``.

Every model is ``steps * alpha + volume / bandwidth`` (Thakur, Rabenseifner & Gropp, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 2005; NCCL's tuning model uses the same form,
NVIDIA/nccl src/graph/tuning.cc). ``size_bytes`` is the full tensor each rank holds (for all-gather the
gathered output, for all-to-all the data each rank sends in total); ``p`` is the number of ranks; a
``Link`` gives alpha (``latency_us``) and the per-direction bandwidth. Times are microseconds.

``fair_share_us`` models transfers that overlap on one link: each active transfer gets an equal share
of the bandwidth (processor sharing), so two equal transfers started together both end at 2x.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from trainsim.cluster.catalog import Link
from trainsim.cluster.spec import ClusterSpec
from trainsim.errors import UserError

KINDS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "alltoall", "p2p")  # p2p: one send


class CollectiveCost(Protocol):
    """A network cost model (module docstring)."""

    def time_us(self, kind: str, size_bytes: float, group: int) -> float:
        """Time of one collective ``kind`` of ``size_bytes`` among ``group`` ranks, microseconds."""
        ...


@dataclass(frozen=True, slots=True)
class AlphaBeta:
    """The alpha-beta model over one link type (``collective_us``)."""

    link: Link

    def time_us(self, kind: str, size_bytes: float, group: int) -> float:
        return collective_us(kind, size_bytes, group, self.link)


def _check(size_bytes: float, p: int) -> None:
    if not 0 <= size_bytes < float("inf"):  # NaN too
        raise UserError(f"collective size {size_bytes!r} bytes; expected a finite number >= 0")
    if p < 1:
        raise UserError(f"collective over {p!r} ranks; expected >= 1")


def _log2(p: int) -> int:
    return math.ceil(math.log2(p)) if p > 1 else 0


# --------------------------------------------------------------------------- ring family
def ring_share(kind: str, p: int) -> float:
    """Bytes each of ``p`` ranks sends per byte of ``size_bytes`` (NCCL's bus-bandwidth factor): a ring
    all-reduce 2(p-1)/p (reduce-scatter then all-gather), a reduce-scatter, an all-gather or a pairwise
    all-to-all (p-1)/p, a point-to-point send 1."""
    if kind == "allreduce":
        return 2.0 * (p - 1) / p
    if kind == "p2p":
        return 1.0
    if kind not in ("reduce_scatter", "allgather", "alltoall"):
        raise UserError(f"ring_share: {kind!r} is not a ring collective")
    return (p - 1) / p


def ring_allreduce_us(size_bytes: float, p: int, link: Link) -> float:
    """Ring: reduce-scatter then all-gather, 2(p-1) steps each moving size/p bytes."""
    _check(size_bytes, p)
    if p == 1:
        return 0.0
    return 2 * (p - 1) * link.latency_us + ring_share("allreduce", p) * size_bytes / link.bytes_per_us


def reduce_scatter_us(size_bytes: float, p: int, link: Link) -> float:
    """Ring reduce-scatter of a size-byte tensor: p-1 steps of size/p bytes."""
    _check(size_bytes, p)
    if p == 1:
        return 0.0
    return (p - 1) * link.latency_us + ring_share("reduce_scatter", p) * size_bytes / link.bytes_per_us


def allgather_us(size_bytes: float, p: int, link: Link) -> float:
    """Ring all-gather producing a size-byte tensor: p-1 steps of size/p bytes."""
    return reduce_scatter_us(size_bytes, p, link)


def alltoall_us(size_bytes: float, p: int, link: Link) -> float:
    """Pairwise exchange: p-1 steps, each rank sends size/p bytes to one peer per step."""
    return reduce_scatter_us(size_bytes, p, link)


def p2p_us(size_bytes: float, link: Link) -> float:
    """One send of ``size_bytes`` to one peer: one latency, the bytes at the link's bandwidth."""
    _check(size_bytes, 2)
    return link.latency_us + size_bytes / link.bytes_per_us


# --------------------------------------------------------------------------- tree family
def tree_allreduce_us(size_bytes: float, p: int, link: Link) -> float:
    """Binary tree, unpipelined: reduce up then broadcast down, 2*ceil(log2 p) steps of the full size."""
    _check(size_bytes, p)
    steps = 2 * _log2(p)
    return steps * (link.latency_us + size_bytes / link.bytes_per_us)


def broadcast_us(size_bytes: float, p: int, link: Link) -> float:
    """Binomial-tree broadcast: ceil(log2 p) steps of the full size."""
    _check(size_bytes, p)
    return _log2(p) * (link.latency_us + size_bytes / link.bytes_per_us)


# --------------------------------------------------------------------------- hierarchical, PS
def hierarchical_allreduce_us(size_bytes: float, nodes: int, per_node: int, intra: Link, inter: Link) -> float:
    """Intra-node reduce-scatter, inter-node ring all-reduce of the 1/per_node shard, intra-node all-gather."""
    _check(size_bytes, nodes * per_node)
    return (
        reduce_scatter_us(size_bytes, per_node, intra)
        + ring_allreduce_us(size_bytes / per_node, nodes, inter)
        + allgather_us(size_bytes, per_node, intra)
    )


def ps_pushpull_us(size_bytes: float, workers: int, servers: int, link: Link, *, colocated: bool = True) -> float:
    """Parameter-server push then pull, the tensor sharded evenly over ``servers``.

    Each phase takes alpha plus the busiest NIC's bytes / bandwidth. Separate servers: a worker sends
    ``size`` and a server receives ``workers * size / servers``. Co-located (server k on worker k): a
    server machine keeps its own shard local, so it sends ``size * (servers-1)/servers`` and receives
    ``(workers-1) * size / servers``. The pull mirrors the push.
    """
    _check(size_bytes, workers)
    if servers < 1:
        raise UserError(f"parameter servers={servers!r}; expected >= 1")
    if colocated:
        if servers > workers:
            raise UserError(f"{servers} co-located servers but only {workers} workers")
        shard = size_bytes / servers
        out_bytes = size_bytes - shard  # worker hosting a server
        in_bytes = (workers - 1) * shard
        if workers == 1:
            return 0.0
    else:
        out_bytes = size_bytes
        in_bytes = workers * size_bytes / servers
    phase = link.latency_us + max(out_bytes, in_bytes) / link.bytes_per_us
    return 2 * phase


# --------------------------------------------------------------------------- dispatch
def bottleneck_link(spec: ClusterSpec, p: int) -> Link:
    """The link the ``p`` ranks' exchanges cross: between nodes when they span several, else inside one."""
    spec.check_ranks(p)
    return spec.inter if math.ceil(p / spec.devices_per_node) > 1 else spec.intra


def cluster_us(kind: str, size_bytes: float, spec: ClusterSpec, ranks: int | None = None) -> float:
    """Time of one collective among ``ranks`` (default: all) of ``spec``; an all-reduce follows its topology."""
    p = spec.world_size if ranks is None else ranks
    if kind == "allreduce":
        return allreduce_us(size_bytes, spec, p)
    return collective_us(kind, size_bytes, p, bottleneck_link(spec, p))


def allreduce_us(size_bytes: float, spec: ClusterSpec, ranks: int | None = None) -> float:
    """Gradient all-reduce time on ``spec`` with its topology (ring/tree over the bottleneck link)."""
    p = spec.world_size if ranks is None else ranks
    bottleneck = bottleneck_link(spec, p)
    nodes = max(1, math.ceil(p / spec.devices_per_node))
    per_node = min(p, spec.devices_per_node)
    if spec.topology == "ring":
        return ring_allreduce_us(size_bytes, p, bottleneck)
    if spec.topology == "tree":
        return tree_allreduce_us(size_bytes, p, bottleneck)
    if spec.topology == "hierarchical":
        return hierarchical_allreduce_us(size_bytes, nodes, per_node, spec.intra, spec.inter)
    # ps: intra-node reduce to one device, push/pull across nodes, intra broadcast
    t = ps_pushpull_us(size_bytes, nodes, min(spec.n_servers, nodes) if spec.ps_colocated else spec.n_servers,
                       spec.inter, colocated=spec.ps_colocated)  # fmt: skip
    if per_node > 1:
        t += ring_allreduce_us(size_bytes, per_node, spec.intra)
    return t


def collective_us(kind: str, size_bytes: float, p: int, link: Link) -> float:
    """Time of collective ``kind`` (one of ``KINDS``) over one link type."""
    if kind == "p2p":
        return p2p_us(size_bytes, link)
    fn = {
        "allreduce": ring_allreduce_us,
        "reduce_scatter": reduce_scatter_us,
        "allgather": allgather_us,
        "broadcast": broadcast_us,
        "alltoall": alltoall_us,
    }.get(kind)
    if fn is None:
        raise UserError(f"unknown collective {kind!r}; expected one of {', '.join(KINDS)}")
    return fn(size_bytes, p, link)


# --------------------------------------------------------------------------- bandwidth sharing
def fair_share_us(start_us: Sequence[float], size_bytes: Sequence[float], link: Link) -> np.ndarray:
    """End times of transfers that share one link fairly (each active one gets bandwidth / n_active).

    Each transfer first waits ``latency_us`` after its start, then drains its bytes. Exact fluid
    (processor-sharing) simulation, O(n^2) for n transfers.
    """
    starts = np.asarray(start_us, dtype=float) + link.latency_us
    left = np.asarray(size_bytes, dtype=float).copy()
    if starts.shape != left.shape:
        raise UserError("fair_share_us: start_us and size_bytes differ in length")
    if not (np.isfinite(left).all() and np.isfinite(starts).all()):  # the loop below would never end
        raise UserError("fair_share_us: start times and sizes must be finite numbers")
    if (left < 0).any():
        raise UserError("fair_share_us: negative transfer size")
    n = len(left)
    end = np.full(n, np.nan)
    bw = link.bytes_per_us
    t = float(starts.min()) if n else 0.0
    done = left <= 0
    end[done] = starts[done]
    while not done.all():
        active = (~done) & (starts <= t + 1e-12)
        if not active.any():
            t = float(starts[~done].min())
            continue
        rate = bw / active.sum()
        t_finish = t + float(left[active].min()) / rate
        pending = (~done) & (starts > t + 1e-12)
        t_next = min(t_finish, float(starts[pending].min())) if pending.any() else t_finish
        left[active] -= (t_next - t) * rate
        t = t_next
        fin = active & (left <= 1e-9 * max(1.0, bw))
        end[fin] = t
        done |= fin
    return end
