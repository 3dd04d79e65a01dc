"""What calibration measures about the test host rather than the link: the host CPU per operation,
computation lost while every rank computes beside the transfers, the cost of posting a send or a
receive on a busy host, and the scheduling settings (real-time class, pinned cores) that decide
whether gloo's threads wait in a run queue.

These run inside the calibration's rank processes (``testbed.calibrate_worker``), each after the link
passes of the same sizes; their figures land in ``Calibration`` (``cpu_us``, ``slowdown``,
``lost_us``, ``busy_post_us``). They describe the machine that emulates a cluster (several ranks on one
host's cores), not the cluster: a what-if for a GPU cluster needs none of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

ALONE_S = 0.2  # windows of computation alone around the all-reduces of the CPU pass




def cpu_pass(x: Any, n: int, exchange: Callable[[Any, Any], None]) -> list[float]:
    """Per operation, averaged over the ranks, in µs: ``[host CPU per all-reduce, host CPU per send +
    receive, wall time per all-reduce, wall time per all-reduce while every rank computes, computation
    lost per all-reduce]``.

    Back-to-back operations with no barrier; ``time.process_time`` counts every thread of the process
    (gloo's too; waiting for the peer costs nothing). The last figure runs the same all-reduces while a
    second thread on every rank multiplies matrices without pause, as a training step's computation
    would: on a host whose cores are all busy, gloo's threads wait for the scheduler and transfers
    slow down. The compute thread counts its iterations: their rate during the all-reduces against the
    rate in windows of ``ALONE_S`` before and after them (every rank computing, nothing sent) gives the
    computation the transfers took away, however the host spent it (gloo's threads, the kernel's
    network stack, interrupts). Empty when the all-reduce is too slow for a pass. ``exchange(x, y)``:
    one transfer both ways at once between each pair of ranks (``calibrate_worker._p2p_ops``).
    """
    import threading

    import torch
    import torch.distributed as dist

    n = max(0, min(100, n))
    flag = torch.tensor([n], dtype=torch.int64)
    dist.broadcast(flag, 0)
    n = int(flag.item())
    if n < 2:
        return []
    world = dist.get_world_size()
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        dist.all_reduce(x)
    w1, c1 = time.perf_counter(), time.process_time()
    if world % 2 == 0:  # pairs (0,1), (2,3) ...: each rank sends n and receives n messages
        y = torch.empty_like(x)
        for _ in range(n):
            exchange(x, y)
    c2 = time.process_time()
    stop = threading.Event()
    done = [0]  # iterations of the compute thread

    def compute() -> None:
        a = torch.randn(256, 256)
        while not stop.is_set():
            a = torch.mm(a, a).clamp_(-1.0, 1.0)
            done[0] += 1

    def alone_rate() -> float:
        dist.barrier()
        k, t = done[0], time.perf_counter()
        time.sleep(ALONE_S)
        return (done[0] - k) / (time.perf_counter() - t)

    th = threading.Thread(target=compute, daemon=True)
    th.start()
    before = alone_rate()
    dist.barrier()
    k2, w2 = done[0], time.perf_counter()
    for _ in range(n):
        dist.all_reduce(x)
    k3, w3 = done[0], time.perf_counter()
    after = alone_rate()
    stop.set()
    th.join()
    busy_rate = (k3 - k2) / (w3 - w2)
    lost = max(0.0, 1.0 - busy_rate / max(0.5 * (before + after), 1e-9)) * (w3 - w2) / n * 1e6
    per = torch.tensor([(c1 - c0) / n * 1e6, (c2 - c1) / n * 1e6, (w1 - w0) / n * 1e6, (w3 - w2) / n * 1e6,
                        lost], dtype=torch.float64)  # fmt: skip
    dist.all_reduce(per)
    return (per / world).tolist()


POST_REPS = 40  # posts of each kind per pass of ``post_pass``
POST_GAP_S = 0.002  # the pause or computation before each post


def post_pass(x: Any, y: Any, peer: int, *, compute: bool) -> float:
    """Mean wall time (µs, averaged over the ranks) of posting one send or one receive as torch's
    pipeline runtime posts them (``batch_isend_irecv`` with one operation), each post after
    ``POST_GAP_S`` in which every rank either sleeps or, with ``compute``, multiplies matrices on the
    same thread, as a pipeline stage computes between its transfers. Every rank sends ``x`` to its pair
    ``peer`` and then receives ``y`` from it, so the receive is posted after the peer's send."""
    import torch
    import torch.distributed as dist

    a = torch.randn(192, 192)

    def gap() -> None:
        nonlocal a
        if not compute:
            time.sleep(POST_GAP_S)
            return
        t = time.perf_counter()
        while time.perf_counter() - t < POST_GAP_S:
            a = torch.mm(a, a).clamp_(-1.0, 1.0)

    dist.barrier()
    took, sends = 0.0, []
    for _ in range(POST_REPS):
        gap()
        t0 = time.perf_counter()
        sends += dist.batch_isend_irecv([dist.P2POp(dist.isend, x, peer)])
        took += time.perf_counter() - t0
        gap()
        t0 = time.perf_counter()
        recvs = dist.batch_isend_irecv([dist.P2POp(dist.irecv, y, peer)])
        took += time.perf_counter() - t0
        for work in recvs:
            work.wait()
    for work in sends:
        work.wait()
    mean = torch.tensor([took / (2 * POST_REPS) * 1e6], dtype=torch.float64)
    dist.all_reduce(mean)
    return float(mean.item()) / dist.get_world_size()


def realtime() -> str | None:
    """Put this process's thread in the real-time FIFO class (priority 1) before gloo starts its threads,
    which inherit it; ``None`` on success, else why not (it needs CAP_SYS_NICE).

    Why: emulated ranks share this machine's cores. Under the default scheduler a gloo thread woken by
    an arriving message may queue behind another rank's thread until the next scheduler tick (4 ms at
    250 Hz), so 10-40 % of sub-millisecond all-reduces take ~4 ms (docs/cluster.md). Real ranks on
    separate machines do not queue behind each other; FIFO threads are placed on an idle core at
    once. Only for runs that do nothing but communicate: a FIFO thread that computes would hold its
    core against the transfers."""
    import os

    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    except (OSError, AttributeError) as exc:
        return str(exc)
    return None


def pin() -> str | None:
    """Keep this process (and the threads gloo starts later, which inherit it) on one core of its own
    (``trainsim.run.ranks.pin_to_core`` for this rank). ``None`` on success, else why not.

    Why here too: with two emulated ranks on this 2-vCPU machine, where each rank's threads land decides the
    small all-reduces' latency: six launches of the same calibration at 1 Gbit/s gave 1 KiB all-reduces
    of 174-187 us in four and 224 us in two (real-time class). Pinned, six launches gave 183-194 us."""
    import os

    from trainsim.run.ranks import pin_to_core

    return pin_to_core(int(os.environ.get("RANK", "0")))


FUSED_SIZES = [256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
"""parameter bytes (float32) of the fused-optimizer pass: x4 apart, from inside the L2 cache to well
beyond the last level; generic sizes, none of them a validated model's"""
FUSED_TENSORS = 16
"""each size is split into this many equal tensors (a generic parameter count)"""
FUSED_REPEAT_S = 0.1
"""each size repeats until this much time has passed (at least 5 calls after 2 warm-up calls)"""
FUSED_ADAM_PASSES = 7
"""bytes the kernel moves per parameter byte: it reads p, g, m, v and writes p, m, v (as
``transform.whatifs.FUSED_PASSES["Adam"]``)"""


def fused_adam_gbps(sizes: list[int] | None = None, tensors: int = FUSED_TENSORS) -> list[float]:
    """torch's CPU fused Adam kernel (``torch._fused_adam_``, as ``torch.optim.Adam(fused=True)`` calls
    it) in this process, per size of ``sizes`` (default ``FUSED_SIZES``): ``FUSED_ADAM_PASSES`` x the
    parameter bytes over the median time of a call, in GB/s.

    Each timed call takes the next of several copies of the tensors (parameters, gradients, both
    moments), enough to span twice the last-level cache, so that every call reads its operands from
    memory as the step's optimizer does after the forward and backward passes evicted them. The caller
    sets the intra-op threads (``_fused_child``: one, as the validations' ranks run)."""
    import itertools
    import statistics

    import torch

    from trainsim.transform.opcost import _cache_bytes

    llc = _cache_bytes() or 32 << 20
    out = []
    for size in sizes or FUSED_SIZES:
        n = max(1, size // 4 // tensors)
        copies = max(1, -(-2 * llc // (4 * 4 * n * tensors)))
        sets = [[[torch.rand(n) for _ in range(tensors)] for _ in range(4)] for _ in range(copies)]
        steps = [torch.tensor(1.0) for _ in range(tensors)]
        took: list[float] = []
        for i in itertools.count():
            p, g, m, v = sets[i % copies]
            t0 = time.perf_counter()
            torch._fused_adam_(p, g, m, v, [], steps, lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8,
                               amsgrad=False, maximize=False)  # fmt: skip
            if i >= 2:  # after two warm-up calls
                took.append(time.perf_counter() - t0)
            if len(took) >= 5 and sum(took) >= FUSED_REPEAT_S:
                break
        out.append(round(FUSED_ADAM_PASSES * 4 * n * tensors / statistics.median(took) / 1e9, 3))
        del sets
    return out


def fused_adam_pass() -> list[float]:
    """``fused_adam_gbps`` in a fresh process with one intra-op thread (about two seconds)."""
    import json
    import os
    import subprocess
    import sys

    code = "from trainsim.testbed.calibrate_host import _fused_child; _fused_child()"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise RuntimeError(f"the fused Adam kernel pass failed in a child process: {tail}")
    return [float(x) for x in json.loads(proc.stdout.strip().splitlines()[-1])]


def _fused_child() -> None:
    import json

    import torch

    torch.set_num_threads(1)
    print(json.dumps(fused_adam_gbps()), flush=True)
