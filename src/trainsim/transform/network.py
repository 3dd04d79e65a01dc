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
"""

from __future__ import annotations

import re

import numpy as np

from trainsim.cluster.catalog import Link
from trainsim.cluster.collectives import allreduce_us, collective_us
from trainsim.cluster.spec import ClusterSpec
from trainsim.errors import UserError
from trainsim.graph.ir import TaskGraph, TaskKind

_KIND_RX = (
    ("reduce_scatter", re.compile(r"reduce_?scatter|ReduceScatter", re.I)),
    ("allgather", re.compile(r"all_?gather|AllGather", re.I)),
    ("broadcast", re.compile(r"broadcast|Broadcast", re.I)),
    ("alltoall", re.compile(r"all_?to_?all|AllToAll", re.I)),
    ("allreduce", re.compile(r"all_?reduce|AllReduce", re.I)),
)


def collective_kind(name: str) -> str:
    """The collective a task name denotes (``allreduce`` when it names none)."""
    for kind, rx in _KIND_RX:
        if rx.search(name):
            return kind
    return "allreduce"


def model_us(kind: str, size_bytes: float, spec: ClusterSpec, ranks: int | None = None) -> float:
    """Time of one collective on ``spec`` (all-reduce follows the spec's topology)."""
    p = spec.world_size if ranks is None else ranks
    spec.check_ranks(p)
    if kind == "allreduce":
        return allreduce_us(size_bytes, spec, p)
    link: Link = spec.inter if p > spec.devices_per_node else spec.intra
    return collective_us(kind, size_bytes, p, link)


def retime_collectives(
    g: TaskGraph,
    *,
    new: ClusterSpec,
    old: ClusterSpec | None = None,
    ranks: int | None = None,
) -> TaskGraph:
    """Re-time every ``COMM`` task of ``g`` for cluster ``new`` (see the module docstring).

    A task without a recorded size (``size_bytes = -1``, e.g. NCCL kernels whose launch carried no
    message size) gets one only when ``old`` is given: the size for which the ``old`` model predicts
    the traced duration (every model is linear in the size), so ``new_dur = model_new(that size)``.
    """
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
            base = model_us(kind, 0.0, old, ranks)
            per_byte = (model_us(kind, 1e6, old, ranks) - base) / 1e6
            size = max(0.0, (float(dur[t]) - base) / per_byte) if per_byte > 0 else 0.0
            dur[t] = model_us(kind, size, new, ranks)
            continue
        t_new = model_us(kind, size, new, ranks)
        dur[t] = max(0.0, dur[t] + t_new - model_us(kind, size, old, ranks)) if old is not None else t_new
    return g.with_columns(dur_us=dur)


def scale_network(g: TaskGraph, *, bw_factor: float = 1.0, latency_add_us: float = 0.0) -> TaskGraph:
    """Crude what-if without a cluster model: divide the comm tasks' time by ``bw_factor`` and add
    ``latency_add_us`` to each (``bw_factor=2``: a twice faster network)."""
    if not bw_factor > 0:
        raise UserError(f"scale_network: bw_factor={bw_factor!r}; expected > 0")
    comm = g.kind == TaskKind.COMM
    if not comm.any():  # the what-if would change nothing without a word
        raise UserError(f"{g.source}: no communication tasks to re-time (a single-process trace: see scaleout)")
    dur = g.dur_us.copy()
    dur[comm] = np.maximum(0.0, dur[comm] / bw_factor + latency_add_us)
    return g.with_columns(dur_us=dur)
