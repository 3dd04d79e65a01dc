"""Gradient synchronisation without an all-reduce: a rolling ring of parameter servers, and gossip averaging.

    >>> from trainsim.cluster.catalog import Link
    >>> from trainsim.cluster.topologies import Topology, sync_us
    >>> link = Link(name="x", bw_gbyte_s=1.0, latency_us=10.0)            # 1000 bytes per µs
    >>> sync_us(1_000_000, 4, link, Topology(kind="rolling_ps"))      # 6 rounds of 10 + 250
    1560.0
    >>> sync_us(1_000_000, 4, link, Topology(kind="gossip_ring", degree=2))  # 10 + 2 x 1000
    2010.0

Same conventions as ``trainsim.cluster.collectives``: ``size_bytes`` is the gradient each of the ``p``
workers holds, a ``Link`` gives alpha (``latency_us``) and the per-direction bandwidth of each worker's
NIC (full duplex, a non-blocking switch between the NICs), times are microseconds.

**Rolling parameter servers** (``rolling_ps``): worker ``i`` owns shard ``i`` (``size / p`` bytes).
In round ``k = 1..p-1`` of the push, worker ``i`` sends its copy of shard ``(i + k) mod p`` to that
shard's owner and receives shard ``i`` from worker ``(i - k) mod p``; the owner adds what it gets; the
pull mirrors the push with the reduced shards. Every round sends and receives ``size / p`` bytes per
NIC, so ``2(p-1)`` rounds cost ``2(p-1) * (alpha + size/p / bw)``: the ring all-reduce's time, reached
without relaying through neighbours (the owner's load is its ``p-1`` incoming shards, one per round).
``schedule="burst"`` posts every push at once (then every pull): one alpha per phase and the owner's
NIC drains ``(p-1) * size/p`` bytes, ``2 * (alpha + (p-1)/p * size / bw)``. ``imbalance`` (the largest
shard over the mean one, >= 1) scales the bytes where parameters do not split evenly, since each round
waits for its largest shard; ``reduce_gbps`` charges the owner's additions (``(p-1) * size/p`` bytes read).

**Gossip averaging** (``gossip_ring``, ``gossip_random``): each step a worker sends its whole model to
``degree`` peers and averages what it receives (Boyd et al., "Randomized gossip algorithms", IEEE
Trans. Inf. Theory 2006; Lian et al., "Can decentralized algorithms outperform centralized algorithms?",
NeurIPS 2017, D-PSGD on a ring). All sends and receives are posted at once, so a step costs one alpha
plus the busiest NIC's bytes: on a ring (peers ``i +- 1, i +- 2, ...``, at most ``p - 1`` distinct
ones) every worker sends and receives ``degree * size``. With random peers each worker pushes to
``degree`` others drawn uniformly; a worker's in-degree is random, and the step (all workers) waits for
the busiest receiver: ``max(degree, E[max in-degree]) * size / bw`` (``expected_max_indegree``, a
seeded Monte Carlo over peer draws). ``gossip_graph_us`` times one given peer graph exactly.
A ring gossip step moves ``degree * size`` per NIC against the ring all-reduce's ``2(p-1)/p * size``, in
one alpha instead of ``2(p-1)``, and gives only an approximate average: how many steps consensus takes is
a property of the mixing matrix, not modelled here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from trainsim.cluster.catalog import Link
from trainsim.cluster.collectives import bottleneck_link
from trainsim.cluster.spec import ClusterSpec
from trainsim.errors import UserError

KINDS = ("rolling_ps", "gossip_ring", "gossip_random")
SCHEDULES = ("rolling", "burst")
MC_SAMPLES = 4096
"""peer draws of ``expected_max_indegree``: a max in-degree spreads by ~0.6, so its mean is within ~0.01"""


@dataclass(frozen=True, kw_only=True, slots=True)
class Topology:
    """How the workers synchronise one gradient (module docstring)."""

    kind: str = "rolling_ps"
    """one of ``KINDS``"""
    degree: int = 2
    """gossip: peers each worker sends its model to per step (capped at ``p - 1``)"""
    schedule: str = "rolling"
    """rolling_ps: ``rolling`` (p-1 rounds per phase) or ``burst`` (every shard at once)"""
    imbalance: float = 1.0
    """rolling_ps: largest shard / mean shard (1: parameters split evenly)"""
    reduce_gbps: float | None = None
    """rolling_ps: the owner's rate of adding shards, GB/s of bytes read (None: free)"""
    seed: int = 0
    """gossip_random: seed of the Monte Carlo over peer draws"""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"topology kind={self.kind!r}; expected one of {', '.join(KINDS)}")
        if self.schedule not in SCHEDULES:
            raise UserError(f"topology schedule={self.schedule!r}; expected one of {', '.join(SCHEDULES)}")
        if not isinstance(self.degree, int) or isinstance(self.degree, bool) or self.degree < 1:
            raise UserError(f"gossip degree={self.degree!r}; expected a positive number of peers")
        if not 1.0 <= self.imbalance < float("inf"):
            raise UserError(f"shard imbalance={self.imbalance!r}; expected >= 1 (largest shard / mean shard)")
        if self.reduce_gbps is not None and not 0 < self.reduce_gbps < float("inf"):
            raise UserError(f"reduce_gbps={self.reduce_gbps!r}; expected a positive rate or None")

    def label(self) -> str:
        """Short text form: ``rolling_ps``, ``rolling_ps/burst``, ``gossip_ring:d2``."""
        if self.kind == "rolling_ps":
            return self.kind if self.schedule == "rolling" else f"{self.kind}/{self.schedule}"
        return f"{self.kind}:d{self.degree}"


def _check(size_bytes: float, p: int) -> None:
    if not 0 <= size_bytes < float("inf"):  # NaN too
        raise UserError(f"gradient size {size_bytes!r} bytes; expected a finite number >= 0")
    if not isinstance(p, int) or p < 1:
        raise UserError(f"synchronisation over {p!r} workers; expected >= 1")


# --------------------------------------------------------------------------- rolling parameter servers
def rolling_ps_us(
    size_bytes: float, p: int, link: Link, *, schedule: str = "rolling", imbalance: float = 1.0,
    reduce_gbps: float | None = None,
) -> float:  # fmt: skip
    """Push shards to their owners, owners reduce, pull back (module docstring)."""
    topo = Topology(kind="rolling_ps", schedule=schedule, imbalance=imbalance, reduce_gbps=reduce_gbps)
    return sync_us(size_bytes, p, link, topo)


def _rolling_ps(size_bytes: float, p: int, link: Link, t: Topology) -> float:
    if p == 1:
        return 0.0
    shard = t.imbalance * size_bytes / p  # the round waits for its largest shard
    if t.schedule == "rolling":
        comm = 2 * (p - 1) * (link.latency_us + shard / link.bytes_per_us)
    else:
        comm = 2 * (link.latency_us + (p - 1) * shard / link.bytes_per_us)
    reduce = (p - 1) * shard / (t.reduce_gbps * 1e3) if t.reduce_gbps else 0.0  # GB/s = 1e3 bytes per µs
    return comm + reduce


# --------------------------------------------------------------------------- gossip
def ring_peers(p: int, degree: int) -> list[list[int]]:
    """Each worker's ring neighbours: ``i+1, i-1, i+2, i-2, ...``, the first ``min(degree, p-1)`` distinct ones."""
    _check(0, p)
    out = []
    for i in range(p):
        peers: list[int] = []
        for k in range(1, p):
            for j in ((i + k) % p, (i - k) % p):
                if j != i and j not in peers and len(peers) < min(degree, p - 1):
                    peers.append(j)
        out.append(peers)
    return out


def random_peers(p: int, degree: int, rng: np.random.Generator) -> list[list[int]]:
    """Each worker pushes to ``min(degree, p-1)`` others drawn uniformly without replacement."""
    d = min(degree, p - 1)
    out: list[list[int]] = []
    for i in range(p):
        others = np.array([j for j in range(p) if j != i], dtype=np.int64)
        out.append(sorted(int(j) for j in rng.choice(others, size=d, replace=False)) if d > 0 else [])
    return out


MC_MAX_P = 16
"""above this many workers ``expected_max_indegree`` treats the in-degrees as independent binomials
(they are not: their sum is fixed); the binomial form is 2-4 % below the Monte Carlo at p = 16 and 64, d = 1, 2"""


@lru_cache(maxsize=256)
def expected_max_indegree(p: int, degree: int, *, samples: int = MC_SAMPLES, seed: int = 0) -> float:
    """E[max over workers of the number of pushes it receives] when each pushes to ``degree`` random peers."""
    d = min(degree, p - 1)
    if d <= 0:
        return 0.0
    if d == p - 1:
        return float(d)  # everyone pushes to everyone
    if p > MC_MAX_P:  # E[max] = sum_k P(max > k), with P(max <= k) = F(k)^p, F Binomial(p-1, d/(p-1))
        n, q = p - 1, d / (p - 1)
        log_pmf = [math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(q)
                   + (n - k) * math.log1p(-q) for k in range(n + 1)]  # fmt: skip
        cdf = np.minimum(1.0, np.cumsum(np.exp(log_pmf)))
        return float(np.sum(1.0 - cdf**p))
    rng = np.random.default_rng(seed)
    # a random d-subset of the p-1 others per sender: the d smallest of p uniform keys, oneself's set to inf
    keys = rng.random((samples, p, p))
    keys[:, np.arange(p), np.arange(p)] = np.inf
    chosen = np.argsort(keys, axis=2)[:, :, :d]
    counts = np.zeros((samples, p), np.int64)
    for c in range(d):
        np.add.at(counts, (np.arange(samples)[:, None], chosen[:, :, c]), 1)
    return float(counts.max(axis=1).mean())


def gossip_graph_us(size_bytes: float, peers: Sequence[Sequence[int]], link: Link) -> float:
    """One gossip step on a given graph (``peers[i]``: whom worker ``i`` sends its model to); a symmetric
    graph (ring) means every edge both ways. One alpha plus the busiest NIC's bytes in or out."""
    p = len(peers)
    _check(size_bytes, p)
    out_deg = np.array([len(q) for q in peers])
    in_deg = np.zeros(p, np.int64)
    for q in peers:
        for j in q:
            if not 0 <= j < p:
                raise UserError(f"gossip peer {j} out of range for {p} workers")
            in_deg[j] += 1
    load = int(max(out_deg.max(initial=0), in_deg.max(initial=0)))
    return link.latency_us + load * size_bytes / link.bytes_per_us if load else 0.0


def _gossip(size_bytes: float, p: int, link: Link, t: Topology) -> float:
    d = min(t.degree, p - 1)
    if d == 0:
        return 0.0
    load = float(d) if t.kind == "gossip_ring" else max(float(d), expected_max_indegree(p, d, seed=t.seed))
    return link.latency_us + load * size_bytes / link.bytes_per_us


def gossip_us(
    size_bytes: float, p: int, link: Link, *, degree: int = 2, peers: str = "ring", seed: int = 0
) -> float:
    """One gossip averaging step with ``degree`` peers per worker, ``peers`` = ``ring`` or ``random``."""
    if peers not in ("ring", "random"):
        raise UserError(f"gossip peers={peers!r}; expected 'ring' or 'random'")
    return sync_us(size_bytes, p, link, Topology(kind=f"gossip_{peers}", degree=degree, seed=seed))


# --------------------------------------------------------------------------- dispatch
def sync_us(size_bytes: float, p: int, link: Link, topo: Topology) -> float:
    """Time to synchronise one ``size_bytes`` gradient among ``p`` workers over ``link`` with ``topo``."""
    _check(size_bytes, p)
    if topo.kind == "rolling_ps":
        return _rolling_ps(size_bytes, p, link, topo)
    return _gossip(size_bytes, p, link, topo)


def topology_sync_us(size_bytes: float, spec: ClusterSpec, topo: Topology, ranks: int | None = None) -> float:
    """``sync_us`` on ``spec``'s bottleneck link among ``ranks`` (default: the whole cluster)."""
    p = spec.world_size if ranks is None else ranks
    return sync_us(size_bytes, p, bottleneck_link(spec, p), topo)


def calibrated_link(*, p2p_line: tuple[float, float], rate_mbit: float | None, efficiency: float = 1.0,
                    delay_ms: float = 0.0) -> Link:  # fmt: skip
    """A ``Link`` from a host's measured one-message cost (``p2p_line`` = ``(a_us, b_us_per_byte)``, as
    ``trainsim.testbed.machine.MachineCalibration.p2p_line``) on a link shaped to ``rate_mbit``
    (None: unshaped) that delivers ``efficiency`` of it: alpha = a + delay, 1/bandwidth = b + the wire's
    time per byte."""
    a, b = p2p_line
    us_per_byte = b + (8 / (rate_mbit * efficiency) if rate_mbit else 0.0)  # bits / (bits per µs)
    if not us_per_byte > 0:
        raise UserError(f"calibrated link: {us_per_byte!r} µs per byte; expected > 0")
    return Link(name="calibrated", bw_gbyte_s=1e-3 / us_per_byte, latency_us=max(0.0, a) + delay_ms * 1e3,
                source="p2p calibration")  # fmt: skip
