"""Synthetic task graphs of realistic shape, for benchmarking the simulator at any size.

    >>> from trainsim.simulate.synthetic import synthetic_graph
    >>> g = synthetic_graph(10_000, seed=0)
    >>> g.n_tasks >= 10_000
    True

The shape imitates a data-parallel training step as a trace shows it: two CPU threads (forward on
the main thread, backward on autograd's) alternate CPU work and kernel launches; kernels land on
four GPU streams; every 64th launch is followed by a blocking synchronisation; every 32nd backward
kernel produces a gradient bucket whose all-reduce runs on a communication channel. Columns are built
with numpy, so building a million tasks takes well under a second.
"""

from __future__ import annotations

import numpy as np

from trainsim.graph.ir import EdgeKind, Resource, ResourceKind, Steps, TaskGraph, TaskKind

N_STREAMS = 4
SYNC_EVERY = 64
BUCKET_EVERY = 32


def synthetic_graph(n_tasks: int, seed: int = 0) -> TaskGraph:
    """A graph of at least ``n_tasks`` tasks (a few more, to finish the last unit)."""
    # one "unit" = CPU op + launch + kernel (3 tasks); plus 1 sync per SYNC_EVERY, 1 comm per BUCKET_EVERY
    u = max(1, int(n_tasks / (3 + 1 / SYNC_EVERY + 0.5 / BUCKET_EVERY)))
    while True:
        g = _build(u, seed)
        if g.n_tasks >= n_tasks:
            return g
        u += (n_tasks - g.n_tasks) // 3 + 1


def _build(u: int, seed: int) -> TaskGraph:
    rng = np.random.default_rng(seed)
    units = np.arange(u)
    thread = (units // 256) % 2  # alternate blocks of 256 units between the two CPU threads
    stream = 2 + (units // 16) % N_STREAMS  # resources 0,1 CPU; 2..5 GPU streams; 6 comm
    cpu_dur = rng.gamma(2.0, 6.0, u)  # µs of host work per op
    launch_dur = rng.gamma(4.0, 1.5, u)  # µs per cudaLaunchKernel
    kern_dur = rng.lognormal(3.0, 1.0, u)  # µs per kernel (median ~20)
    sync_units = units[SYNC_EVERY - 1 :: SYNC_EVERY]
    bucket_units = units[(thread == 1) & (units % BUCKET_EVERY == BUCKET_EVERY - 1)]
    n_sync, n_comm = sync_units.size, bucket_units.size
    cpu_ids = 3 * units
    launch_ids = cpu_ids + 1
    kern_ids = cpu_ids + 2
    sync_ids = 3 * u + np.arange(n_sync)
    comm_ids = 3 * u + n_sync + np.arange(n_comm)
    n = 3 * u + n_sync + n_comm
    kind = np.empty(n, np.int8)
    kind[cpu_ids], kind[launch_ids], kind[kern_ids] = TaskKind.CPU, TaskKind.RUNTIME, TaskKind.KERNEL
    kind[sync_ids], kind[comm_ids] = TaskKind.SYNC, TaskKind.COMM
    resource = np.empty(n, np.int32)
    resource[cpu_ids] = thread
    resource[launch_ids] = thread
    resource[kern_ids] = stream
    resource[sync_ids] = thread[sync_units]
    resource[comm_ids] = 6
    order = np.empty(n)
    order[cpu_ids], order[launch_ids], order[kern_ids] = 3.0 * units, 3.0 * units + 1, 3.0 * units + 2
    order[sync_ids] = 3.0 * sync_units + 1.5  # right after the launch it waits for
    order[comm_ids] = 3.0 * bucket_units + 2.5
    dur = np.empty(n)
    dur[cpu_ids], dur[launch_ids], dur[kern_ids] = cpu_dur, launch_dur, kern_dur
    dur[sync_ids] = 3.0
    dur[comm_ids] = rng.lognormal(5.0, 0.5, n_comm)
    name = np.zeros(n, np.int32)
    name[launch_ids], name[kern_ids], name[sync_ids], name[comm_ids] = 1, 2, 3, 4
    src = np.concatenate((launch_ids, kern_ids[sync_units], kern_ids[bucket_units]))
    dst = np.concatenate((kern_ids, sync_ids, comm_ids))
    ek = np.concatenate((
        np.full(u, EdgeKind.LAUNCH), np.full(n_sync, EdgeKind.SYNC), np.full(n_comm, EdgeKind.COMM)
    )).astype(np.int8)  # fmt: skip
    # the main thread waits for backward (the autograd thread) at each block switch
    switch = units[1:][thread[1:] != thread[:-1]]
    src = np.concatenate((src, launch_ids[switch - 1]))
    dst = np.concatenate((dst, cpu_ids[switch]))
    ek = np.concatenate((ek, np.full(switch.size, EdgeKind.DATA, np.int8)))
    step = (units * 10 // u).astype(np.int32)
    step_col = np.empty(n, np.int32)
    step_col[cpu_ids] = step_col[launch_ids] = step_col[kern_ids] = step
    step_col[sync_ids] = step[sync_units]
    step_col[comm_ids] = step[bucket_units]
    resources = (
        Resource("cpu:main", ResourceKind.CPU_THREAD),
        Resource("cpu:autograd", ResourceKind.CPU_THREAD),
        *(Resource(f"gpu0:s{i}", ResourceKind.GPU_STREAM) for i in range(N_STREAMS)),
        Resource("comm:allreduce", ResourceKind.COMM_CHANNEL),
    )
    g = TaskGraph(
        symbols=("cpu_op", "cudaLaunchKernel", "kernel", "cudaStreamSynchronize", "allreduce"),
        resources=resources,
        kind=kind,
        name=name,
        op=np.full(n, -1, np.int32),
        layer=np.full(n, -1, np.int32),
        resource=resource,
        order=order,
        dur_us=dur,
        ts_us=np.full(n, np.nan),
        step=step_col,
        size_bytes=np.where(kind == TaskKind.COMM, 25 << 20, -1).astype(np.int64),
        group=np.full(n, -1, np.int32),
        priority=np.zeros(n),
        edge_src=src.astype(np.int32),
        edge_dst=dst.astype(np.int32),
        edge_kind=ek,
        edge_lag_us=np.zeros(ek.size),
        steps=Steps(),
        source=f"<synthetic {n} tasks>",
    )
    return g.in_time_order()  # numbered like a built trace graph
