"""Real gloo runs of the synchronisation patterns of ``trainsim.cluster.topologies``, timed per size.

    >>> from trainsim.run.topo_worker import TopoRunConfig, run_topologies
    >>> out = run_topologies(TopoRunConfig(world_size=2, sizes_bytes=[1 << 20], reps=3))   # doctest: +SKIP
    >>> out["times_ms"]["rolling_ps"]["1048576"]                                           # doctest: +SKIP

One launch of ``world_size`` processes (``ranks.run_workers``). Each rank holds a float32 gradient of
``size`` bytes filled with ``rank + 1`` and, per size and repetition, runs every pattern (the order
rotated each repetition, so a slow stretch of the host touches every pattern): a barrier, then

- ``allreduce``: gloo's own ``all_reduce`` (the reference the other patterns replace);
- ``rolling_ps``: ``p - 1`` push rounds (round ``k``: ``isend`` shard ``(i+k) mod p`` to its owner,
  ``irecv`` own shard from ``(i-k) mod p``, add it), then ``p - 1`` pull rounds of the reduced shards;
- ``gossip_ring`` / ``gossip_random``: ``isend`` the whole gradient to each peer (``ring_peers`` with
  ``ring_degree``, or ``random_peers`` with ``random_degree`` drawn from ``seed`` and the repetition:
  every rank draws the same graph), ``irecv`` from each worker that sends to it, average.

A repetition's time is the slowest rank's time from the barrier to the end of the pattern. The first
repetition of each size also checks the result (the reduced sum; each worker's gossip average).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainsim.cluster.catalog import Link
from trainsim.cluster.collectives import ring_allreduce_us
from trainsim.cluster.topologies import Topology, gossip_graph_us, random_peers, ring_peers, sync_us
from trainsim.errors import UserError
from trainsim.run.ranks import Popen, init_gloo, local_popen, rank_main, run_workers

PATTERNS = ("allreduce", "rolling_ps", "gossip_ring", "gossip_random")


@dataclass(frozen=True, kw_only=True, slots=True)
class TopoRunConfig:
    """One launch: the ranks, the gradient sizes, the patterns and the repetitions."""

    world_size: int = 2
    sizes_bytes: list[int] = field(default_factory=lambda: [256 << 10, 1 << 20])
    """gradient per rank, bytes (a multiple of 4: float32)"""
    patterns: list[str] = field(default_factory=lambda: list(PATTERNS))
    ring_degree: int = 2
    random_degree: int = 1
    reps: int = 5
    warmup: int = 1
    """untimed repetitions per size before the timed ones (connections, allocator)"""
    seed: int = 0
    timeout_s: float = 120.0
    """gloo's timeout on every operation"""

    def __post_init__(self) -> None:
        if not isinstance(self.world_size, int) or self.world_size < 2:
            raise UserError(f"topology run: world_size={self.world_size!r}; expected >= 2 ranks")
        bad = [s for s in self.sizes_bytes if s <= 0 or s % 4]
        if bad:
            raise UserError(f"topology run: sizes {bad}; expected positive multiples of 4 bytes (float32)")
        unknown = sorted(set(self.patterns) - set(PATTERNS))
        if unknown:
            raise UserError(
                f"topology run: unknown patterns {unknown}; expected some of {', '.join(PATTERNS)}"
            )
        if self.reps < 1 or self.warmup < 0:
            raise UserError("topology run: reps >= 1 and warmup >= 0 expected")


def peers_of(cfg: TopoRunConfig, pattern: str, rep: int) -> list[list[int]]:
    """Whom each rank sends to in a gossip repetition (the same on every rank: seeded by ``rep``)."""
    import numpy as np

    if pattern == "gossip_ring":
        return ring_peers(cfg.world_size, cfg.ring_degree)
    return random_peers(cfg.world_size, cfg.random_degree, np.random.default_rng([cfg.seed, rep]))


def topology_of(cfg: TopoRunConfig, pattern: str) -> Topology:
    degree = cfg.random_degree if pattern == "gossip_random" else cfg.ring_degree
    return Topology(kind=pattern, degree=degree, seed=cfg.seed)


def predict_ms(cfg: TopoRunConfig, pattern: str, size_bytes: int, link: Link) -> dict[str, float]:
    """The model's time of one repetition (ms): ``model`` from ``sync_us`` (for ``gossip_random`` the
    expectation over peer draws), and for ``gossip_random`` also ``graphs``: the mean of
    ``gossip_graph_us`` over the graphs the run's repetitions will draw."""
    p = cfg.world_size
    if pattern == "allreduce":
        return {"model": ring_allreduce_us(size_bytes, p, link) / 1e3}
    out = {"model": sync_us(size_bytes, p, link, topology_of(cfg, pattern)) / 1e3}
    if pattern == "gossip_random":
        reps = range(cfg.warmup, cfg.warmup + cfg.reps)
        out["graphs"] = (
            statistics.fmean(gossip_graph_us(size_bytes, peers_of(cfg, pattern, r), link) for r in reps) / 1e3
        )
    return out


# --------------------------------------------------------------------------- the patterns, in one rank
def _wait(reqs: list[Any]) -> None:
    for r in reqs:
        r.wait()


def rolling_ps(x: Any, rank: int, p: int) -> Any:
    """Push each shard to its owner in ``p - 1`` rounds, reduce, pull the reduced shards back; the sum."""
    import torch
    import torch.distributed as dist

    shards = x.tensor_split(p)
    acc = shards[rank].clone()
    buf = torch.empty_like(acc)
    for k in range(1, p):
        to, frm = (rank + k) % p, (rank - k) % p
        _wait([dist.irecv(buf, frm), dist.isend(shards[to].contiguous(), to)])
        acc += buf
    out = torch.empty_like(x)
    parts = out.tensor_split(p)
    parts[rank].copy_(acc)
    for k in range(1, p):
        to, frm = (rank + k) % p, (rank - k) % p
        _wait([dist.irecv(parts[frm], frm), dist.isend(acc, to)])
    return out


def gossip(x: Any, rank: int, peers: list[list[int]]) -> Any:
    """Send ``x`` to ``peers[rank]``, receive from every worker whose list holds ``rank``; the average."""
    import torch
    import torch.distributed as dist

    senders = [i for i, q in enumerate(peers) if rank in q]
    bufs = [torch.empty_like(x) for _ in senders]
    # receives posted before the sends: a first version that posted the sends first measured up to 2x
    # the model where a rank sent to and received from the same peers (docs/benchmarks/
    # topologies_sends_first.json); why (gloo reading a payload only into a posted receive?) is not established
    reqs = [dist.irecv(b, i) for b, i in zip(bufs, senders, strict=True)] + [
        dist.isend(x, j) for j in peers[rank]
    ]
    _wait(reqs)
    return (x + sum(bufs, torch.zeros_like(x))) / (1 + len(senders)) if senders else x.clone()


def _expected(pattern: str, rank: int, p: int, peers: list[list[int]] | None) -> float:
    if pattern in ("allreduce", "rolling_ps"):
        return p * (p + 1) / 2  # sum of rank + 1
    assert peers is not None
    senders = [i for i, q in enumerate(peers) if rank in q]
    return (rank + 1 + sum(i + 1 for i in senders)) / (1 + len(senders))


def _worker(cfg: TopoRunConfig, rank: int, master: str, port: int, out: Path) -> None:
    import torch
    import torch.distributed as dist

    init_gloo(rank, cfg.world_size, master, port, cfg.timeout_s)
    p = cfg.world_size
    times: dict[str, dict[str, list[float]]] = {pat: {} for pat in cfg.patterns}
    errors: dict[str, float] = {pat: 0.0 for pat in cfg.patterns}
    for size in cfg.sizes_bytes:
        x = torch.full((size // 4,), float(rank + 1), dtype=torch.float32)
        for rep in range(cfg.warmup + cfg.reps):
            k = rep % len(cfg.patterns)
            for pat in [*cfg.patterns[k:], *cfg.patterns[:k]]:
                peers = peers_of(cfg, pat, rep) if pat.startswith("gossip") else None
                y = x.clone() if pat == "allreduce" else x
                dist.barrier()
                t0 = time.perf_counter()
                if pat == "allreduce":
                    dist.all_reduce(y)
                elif pat == "rolling_ps":
                    y = rolling_ps(x, rank, p)
                else:
                    assert peers is not None
                    y = gossip(x, rank, peers)
                dt = time.perf_counter() - t0
                if rep == 0:
                    err = float((y - _expected(pat, rank, p, peers)).abs().max())
                    errors[pat] = max(errors[pat], err)
                if rep >= cfg.warmup:
                    times[pat].setdefault(str(size), []).append(1e3 * dt)
    out.write_text(json.dumps({"rank": rank, "times_ms": times, "max_error": errors}))
    dist.barrier()


def run_topologies(
    cfg: TopoRunConfig, *, popen: Popen = local_popen, master: str = "127.0.0.1", port: int | None = None,
    timeout_s: float = 600.0,
) -> dict[str, Any]:  # fmt: skip
    """Run ``cfg`` on ``world_size`` processes. Returns, per pattern and size, each repetition's time
    (the slowest rank's, ms) and their median, and the largest error of any rank's result."""
    ranks = run_workers("trainsim.run.topo_worker", cfg, cfg.world_size, popen=popen, master=master, port=port,
                        timeout_s=timeout_s)  # fmt: skip
    times: dict[str, dict[str, list[float]]] = {}
    median: dict[str, dict[str, float]] = {}
    for pat in cfg.patterns:
        times[pat], median[pat] = {}, {}
        for size in cfg.sizes_bytes:
            s = str(size)
            reps = [max(r["times_ms"][pat][s][i] for r in ranks) for i in range(cfg.reps)]
            times[pat][s], median[pat][s] = reps, statistics.median(reps)
    errors = {pat: max(r["max_error"][pat] for r in ranks) for pat in cfg.patterns}
    return {"config": asdict(cfg), "times_ms": times, "median_ms": median, "max_error": errors}


def _rank(cfg: dict[str, Any], rank: int, master: str, port: int, out: str) -> None:
    _worker(TopoRunConfig(**cfg), rank, master, port, Path(out))


if __name__ == "__main__":
    rank_main(_rank, "one rank of a topology run (started by run_topologies)")
