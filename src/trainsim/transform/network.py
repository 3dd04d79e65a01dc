"""Network what-ifs: re-time the collectives of a graph for another network, size or topology.

    >>> from trainsim.cluster.spec import cluster
    >>> from trainsim.transform.network import retime_collectives
    >>> old = cluster(nodes=2, devices_per_node=1, inter="eth-10g")
    >>> new = cluster(nodes=4, devices_per_node=1, inter="eth-100g", topology="tree")
    >>> g2 = retime_collectives(g, old=old, new=new)                # doctest: +SKIP

Works on any graph whose ``COMM`` tasks carry ``size_bytes`` (gloo ops of a multi-process trace, or the
all-reduces ``data_parallel`` inserts); for tasks without a size (NCCL kernels), give ``old``. A task's collective is read from its
name (``all_reduce``/``allreduce``, ``reduce_scatter``, ``all_gather``/``allgather``, ``broadcast``,
``all_to_all``/``alltoall``; anything else is treated as an all-reduce). With ``old`` given, the traced
duration keeps its measured overhead: ``new_dur = max(0, dur + model_new(size) - model_old(size))``;
without it, ``new_dur = model_new(size)``.

A collective's traced time is not all transfer: a rank that arrives first waits for its peers.
``split_collectives`` splits each sized ``COMM`` task into ``(wait_us, transfer_us)``: the link is busy
in periods (collectives of one process group that overlap or follow each other without a pause); the
transfer of a period is its bytes over the link (the alpha-beta model of the traced network when given,
else the median rate of the trace's periods: the fit), the rest of it, if any, is waiting for the
peers (the skew), kept as measured by ``scale_network(..., split=)`` and ``retime_collectives(..., split=)``.

    >>> sp = split_collectives(g)                                  # doctest: +SKIP
    >>> sp.note                                                    # doctest: +SKIP
    'transfer fitted on the trace: 10.7 MB/s of link bytes, the median of 3 busy periods; ...'
    >>> g5 = scale_network(g, bw_factor=5, split=sp)               # doctest: +SKIP
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from trainsim.cluster.catalog import Link
from trainsim.cluster.collectives import CollectiveCost, cluster_us, collective_us
from trainsim.cluster.spec import ClusterSpec
from trainsim.errors import UserError
from trainsim.graph.ir import F64, I64, TaskGraph, TaskKind

_KIND_RX = (
    ("reduce_scatter", re.compile(r"reduce_?scatter|ReduceScatter", re.I)),
    ("allgather", re.compile(r"all_?gather|AllGather", re.I)),
    ("broadcast", re.compile(r"broadcast|Broadcast", re.I)),
    ("alltoall", re.compile(r"all_?to_?all|AllToAll", re.I)),
    ("allreduce", re.compile(r"all_?reduce|AllReduce", re.I)),
)


Network = ClusterSpec | CollectiveCost
"""A network to price collectives on: a cluster file's ``ClusterSpec`` (its topology's all-reduce, the
bottleneck link for the rest) or any ``CollectiveCost`` (e.g. the test host's calibrated links,
``testbed.machine.MachineCalibration.cost``)."""


def network_us(kind: str, size_bytes: float, net: Network, ranks: int | None = None) -> float:
    """Time (µs) of one collective on ``net`` among ``ranks`` (default: a cluster's world, else 2)."""
    if isinstance(net, ClusterSpec):
        return cluster_us(kind, size_bytes, net, ranks)
    return net.time_us(kind, size_bytes, ranks if ranks is not None else 2)


def _describe(net: Network) -> str:
    return net.source if isinstance(net, ClusterSpec) else getattr(net, "name", type(net).__name__)


def collective_kind(name: str) -> str:
    """The collective a task name denotes (``allreduce`` when it names none)."""
    for kind, rx in _KIND_RX:
        if rx.search(name):
            return kind
    return "allreduce"


@dataclass(frozen=True, slots=True)
class CommSplit:
    """Each sized ``COMM`` task's time as waiting for the peers plus transferring (module docstring)."""

    tasks: I64  # the COMM tasks split (those with a known size)
    wait_us: F64  # waiting for the peers (the skew): kept by network what-ifs
    transfer_us: F64  # moving the bytes: scales with the link; wait_us + transfer_us = dur_us
    rate_bytes_per_us: float  # link bytes per µs of the busy periods' transfers (fitted, or the model's)
    method: str  # "fit": the median busy period's rate; "model": the alpha-beta model of ``old``
    note: str  # one line for people: how the split was made and what it found

    def wait_of(self, task: int) -> float:
        """Waiting time of ``task`` (0 for a task that was not split)."""
        i = np.flatnonzero(self.tasks == task)
        return float(self.wait_us[i[0]]) if i.size else 0.0


FIT_MIN_SHARE = 0.1
"""Busy periods that move less than this share of the largest one's bytes are not used for the fit:
their time is mostly latency, not bandwidth."""

# Why the median period's rate and not the fastest one's: waiting only adds time, but the transfers
# themselves vary. On the 100 Mbit/s links of issue 46 (mlp, 2 gloo ranks) one rank's all-reduces
# took 879, 909 and 909 ms while the other rank had arrived 13 ms *later*, 3 ms and 17 ms earlier: the
# spread is the transfer's, not waiting. The fastest period would take that noise for skew.


def split_collectives(g: TaskGraph, *, old: Network | None = None, ranks: int | None = None) -> CommSplit:
    """Split the sized ``COMM`` tasks of ``g`` into waiting and transfer (module docstring).

    1. Replay ``g``; the collectives of each process group that overlap or touch form busy periods.
    2. A period's transfer time: with ``old`` (the network of the trace), the sum of its collectives'
       alpha-beta times; else its link bytes (the model's volume: ``2(p-1)/p * size`` for a ring
       all-reduce over ``ranks``, default 2) over the median rate of the periods that move at least
       ``FIT_MIN_SHARE`` of the largest one's bytes.
    3. Each collective of a period gets the period's transfer share of its duration (all of it when
       the period was faster than its transfer); the rest waits.
    """
    from trainsim.simulate.engine import simulate

    tasks = np.flatnonzero((g.kind == TaskKind.COMM) & (g.size_bytes >= 0)).astype(np.int64)
    if tasks.size == 0:
        raise UserError(f"{g.source}: no communication task with a known size to split into waiting and transfer")
    res = simulate(g)
    start, end = res.start_us[tasks], res.end_us[tasks]
    p = ranks if ranks is not None else (old.world_size if isinstance(old, ClusterSpec) else 2)
    unit = Link(name="unit", bw_gbyte_s=1e-3, latency_us=0.0)  # 1 byte per µs: the model's time is its volume
    kinds = [collective_kind(g.task_name(int(t))) for t in tasks]
    size = g.size_bytes[tasks].astype(np.float64)
    vol = np.array([collective_us(k, float(s), max(p, 2), unit) for k, s in zip(kinds, size, strict=True)])
    # ---- 1. busy periods, per process group
    period = np.full(tasks.size, -1, np.int64)
    n_periods = 0
    for grp in np.unique(g.group[tasks]):
        members = np.flatnonzero(g.group[tasks] == grp)
        members = members[np.lexsort((end[members], start[members]))]
        busy_until = -np.inf
        for m in members:
            if start[m] > busy_until + 1e-3:
                n_periods += 1
            period[m] = n_periods - 1
            busy_until = max(busy_until, end[m])
    p_t0 = np.full(n_periods, np.inf)
    p_t1 = np.full(n_periods, -np.inf)
    np.minimum.at(p_t0, period, start)
    np.maximum.at(p_t1, period, end)
    p_len = p_t1 - p_t0
    p_vol = np.bincount(period, weights=vol, minlength=n_periods)
    # ---- 2. the transfer time of each period
    if old is not None:
        model = np.array([network_us(k, float(s), old, ranks) for k, s in zip(kinds, size, strict=True)])
        p_xfer = np.bincount(period, weights=model, minlength=n_periods).astype(np.float64)
        rate = float(p_vol.sum() / p_xfer.sum()) if p_xfer.sum() > 0 else float("inf")
        method = "model"
    else:
        ok = (p_vol >= FIT_MIN_SHARE * p_vol.max()) & (p_len > 0)
        rate = float(np.median(p_vol[ok] / p_len[ok])) if ok.any() and p_vol.max() > 0 else float("inf")
        p_xfer = np.asarray(p_vol / rate if np.isfinite(rate) else np.zeros(n_periods), np.float64)
        method = "fit"
    # ---- 3. each collective's share
    share = np.where(p_len > 0, np.minimum(1.0, p_xfer / np.where(p_len > 0, p_len, 1.0)), 1.0)
    dur = g.dur_us[tasks]
    transfer = dur * share[period]
    wait = dur - transfer
    # 1 byte/µs = 1 MB/s
    how = (f"transfer fitted on the trace: {rate:.4g} MB/s of link bytes, the median of {n_periods} busy periods"
           if old is None else f"transfer from the model of the traced network ({_describe(old)})")  # fmt: skip
    steps = max(1, len(np.unique(g.step[tasks][g.step[tasks] >= 0])))
    note = (f"{how}; kept as measured skew (waiting for the peers): {wait.sum() / steps / 1e3:.3f} ms per step "
            f"of {dur.sum() / steps / 1e3:.3f} ms in collectives")  # fmt: skip
    return CommSplit(tasks=tasks, wait_us=wait, transfer_us=transfer, rate_bytes_per_us=rate, method=method, note=note)


def retime_collectives(
    g: TaskGraph,
    *,
    new: Network,
    old: Network | None = None,
    ranks: int | None = None,
    split: CommSplit | None = None,
) -> TaskGraph:
    """Re-time every ``COMM`` task of ``g`` for cluster ``new`` (see the module docstring).

    A task without a recorded size (``size_bytes = -1``, e.g. NCCL kernels whose launch carried no
    message size) gets one only when ``old`` is given: the size for which the ``old`` model predicts
    the traced duration (every model is linear in the size), so ``new_dur = model_new(that size)``.

    With ``split`` (and ``old``), a split task keeps its waiting and its transfer scales with the model:
    ``new_dur = wait + transfer * model_new(size) / model_old(size)`` (the traced transfer's efficiency
    on the old network is kept on the new one).
    """
    if split is not None and old is None:
        raise UserError("retime_collectives: a split needs old= (the network the trace was recorded on)")
    sized = (g.kind == TaskKind.COMM) & (g.size_bytes >= 0)
    comm = np.flatnonzero((g.kind == TaskKind.COMM) if old is not None else sized)
    if comm.size == 0:
        raise UserError(
            f"{g.source}: no communication task with a known size to re-time"
            "; give the network it was traced on (old=...) to infer sizes"
        )
    dur = g.dur_us.copy()
    for t in comm:
        kind = collective_kind(g.task_name(int(t)))
        size = float(g.size_bytes[t])
        if size < 0:
            assert old is not None
            base = network_us(kind, 0.0, old, ranks)
            per_byte = (network_us(kind, 1e6, old, ranks) - base) / 1e6
            size = max(0.0, (float(dur[t]) - base) / per_byte) if per_byte > 0 else 0.0
            dur[t] = network_us(kind, size, new, ranks)
            continue
        t_new = network_us(kind, size, new, ranks)
        dur[t] = max(0.0, dur[t] + t_new - network_us(kind, size, old, ranks)) if old is not None else t_new
    if split is not None:
        assert old is not None
        for t, w, x in zip(split.tasks.tolist(), split.wait_us.tolist(), split.transfer_us.tolist(), strict=True):
            kind, size = collective_kind(g.task_name(t)), float(g.size_bytes[t])
            t_old = network_us(kind, size, old, ranks)
            dur[t] = w + (x * network_us(kind, size, new, ranks) / t_old if t_old > 0 else x)
    return g.with_columns(dur_us=dur)


def scale_network(
    g: TaskGraph, *, bw_factor: float = 1.0, latency_add_us: float = 0.0, split: CommSplit | None = None
) -> TaskGraph:
    """What-if without a cluster model: divide the comm tasks' time by ``bw_factor`` and add
    ``latency_add_us`` to each (``bw_factor=2``: a twice faster network). With ``split``, only the
    transfer part of a split task is divided; its waiting for the peers is kept."""
    if not bw_factor > 0:
        raise UserError(f"scale_network: bw_factor={bw_factor!r}; expected > 0")
    comm = g.kind == TaskKind.COMM
    if not comm.any():  # the what-if would change nothing without a word
        raise UserError(f"{g.source}: no communication tasks to re-time (a single-process trace: see scaleout)")
    dur = g.dur_us.copy()
    dur[comm] = np.maximum(0.0, dur[comm] / bw_factor + latency_add_us)
    if split is not None:
        dur[split.tasks] = np.maximum(0.0, split.wait_us + split.transfer_us / bw_factor + latency_add_us)
    return g.with_columns(dur_us=dur)
