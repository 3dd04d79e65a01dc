"""Priority scheduling of gradient communication: P3 and ByteScheduler as policies on comm resources.

    >>> from trainsim.transform.scheduling import p3, bytescheduler
    >>> g_p3 = p3(g, params, layers, world=2, comm_us=model, slice_bytes=256 << 10)          # doctest: +SKIP
    >>> g_bs = bytescheduler(g, params, layers, world=2, comm_us=model, credit=4)            # doctest: +SKIP

- **P3** (Jayarajan et al., "Priority-based Parameter Propagation", SysML'19): gradients are sliced
  (finer than layers) and every slice carries the priority of its layer's position in the forward
  pass, input side first, because the next forward needs those parameters first. The communication
  resource runs ``Policy.PRIORITY``: whenever it is free it sends the ready slice of smallest priority.
- **ByteScheduler** (Peng et al., SOSP'19; ``bytedance/byteps`` ``bytescheduler/common/bytecore.py``):
  tensors are partitioned (default 1M parameters), partitions are priority-queued the same way, and up
  to ``credit`` partitions are in flight, which overlaps the per-message latency of all but one.

Both are built by ``trainsim.transform.dataparallel.data_parallel`` (modes ``p3`` and ``bytescheduler``);
``input_first`` re-prioritises the communication tasks of any graph whose comm tasks carry a layer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from trainsim.errors import UserError
from trainsim.graph.ir import Policy, TaskGraph, TaskKind
from trainsim.transform.dataparallel import DPConfig, ParamInfo, data_parallel
from trainsim.transform.primitives import schedule

P3_SLICE_BYTES = 256 * 1024
"""Our default slice (bytes). P3's own slice size could not be verified from its sources
(shared/research/compression_ooo.md §6), so this is a choice, not P3's figure."""
BYTESCHEDULER_PARTITION_BYTES = 1_000_000 * 4
"""``BYTESCHEDULER_PARTITION`` default: 1,000,000 parameters (bytecore.py), fp32."""
BYTESCHEDULER_CREDIT = 4
"""``BYTESCHEDULER_CREDIT`` default 4,000,000 parameters in flight = 4 default partitions (bytecore.py)."""


def p3(
    g: TaskGraph,
    params: Sequence[ParamInfo],
    layers: Sequence[str],
    *,
    world: int,
    comm_us: Callable[[int], float],
    slice_bytes: int = P3_SLICE_BYTES,
    broadcast_bytes: int = 0,
) -> TaskGraph:
    """Data-parallel ``g`` with P3: sliced gradients, input-side layers first, per-layer updates."""
    cfg = DPConfig(world=world, mode="p3", slice_bytes=slice_bytes, broadcast_bytes=broadcast_bytes)
    return data_parallel(g, params, layers, cfg, comm_us)


def bytescheduler(
    g: TaskGraph,
    params: Sequence[ParamInfo],
    layers: Sequence[str],
    *,
    world: int,
    comm_us: Callable[[int], float],
    partition_bytes: int = BYTESCHEDULER_PARTITION_BYTES,
    credit: int = BYTESCHEDULER_CREDIT,
    broadcast_bytes: int = 0,
) -> TaskGraph:
    """Data-parallel ``g`` with ByteScheduler: partitions of ``partition_bytes``, ``credit`` in flight."""
    cfg = DPConfig(
        world=world, mode="bytescheduler", partition_bytes=partition_bytes, credit=credit,
        broadcast_bytes=broadcast_bytes,
    )  # fmt: skip
    return data_parallel(g, params, layers, cfg, comm_us)


def input_first(g: TaskGraph, layers: Sequence[str], resource: str = r"^comm") -> TaskGraph:
    """Give every communication task the forward index of its layer as priority (input side = 0)
    and switch the matching communication resources to ``Policy.PRIORITY``."""
    rank = {name: i for i, name in enumerate(layers)}
    rank.update({f"layer:{name}": i for i, name in enumerate(layers)})
    by_symbol = np.array([rank.get(s, len(layers)) for s in g.symbols] or [0], np.float64)
    prio = g.priority.copy()
    comm = (g.kind == TaskKind.COMM) & (g.layer >= 0)
    if not comm.any():
        raise UserError(f"{g.source}: no communication task names a layer; build it with data_parallel(mode='p3')")
    prio[comm] = by_symbol[g.layer[comm]]
    return schedule(g, resource if resource else re.escape("comm"), Policy.PRIORITY, prio)
