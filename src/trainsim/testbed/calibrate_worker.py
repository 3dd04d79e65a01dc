"""One rank of a calibration (started by ``testbed.calibrate``, one process per rank): times the
collectives of the link model, then the host passes of ``testbed.calibrate_host``, and prints what it
measured as one JSON line on rank 0.

    $ RANK=0 WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python -m trainsim.testbed.calibrate_worker \\
      --config '{"sizes": [1024, 4096], "reps": 5, "budget_s": 0.3}'

(``rank_main``'s protocol; optional keys ``allgather_sizes``, ``p2p_sizes``, ``realtime``, ``pin``, ``rounds``.)

Link passes, each size timed after a barrier, the slowest rank's time counting: all-reduces in
``ROUNDS`` interleaved rounds (``round_plan``, ``_measure``), the all-gather that the compression hook
uses, one-way sends and exchanges between pairs of ranks, gather and broadcast.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from trainsim.run.ranks import rank_main, write_result
from trainsim.testbed.calibrate_host import cpu_pass, post_pass
from trainsim.testbed.calibrate_host import pin as pin_rank
from trainsim.testbed.calibrate_host import realtime as realtime_class

ROUNDS = 5  # the all-reduce sizes are measured in this many interleaved rounds (``_worker``)
MAX_REPS = 2000  # sub-millisecond sizes: enough repetitions to fill the budget (0.3 s)
ROUND_MAX_S = 0.05  # sizes whose all-reduce takes longer: ``reps`` in all, spread over the rounds
CPU_PASS_MAX_S = 2.0  # sizes whose all-reduce takes longer get no CPU pass (the fit extrapolates)
P2P_MIN_REPS = 10
"""repetitions of the one-way send and of the exchange both ways at once, at least (``duplex_factor``).
On a shaped link the exchange is bimodal (gloo's "ready" message for the peer's send queues behind
the rank's own payload in a share of the calls, docs/cluster.md): at 20 Mbit/s ten exchanges of
256 KiB took 218 ms six times, twice the one-way 109 ms (all ten one-way sends within 1 ms of it),
and 118-180 ms four times (2026-11-26). With the 3-5 that the time budget gave at 20 Mbit/s, the
factor read 1.59-2.00 in six calibrations of one morning, and the SeCoPa plan, whose two owners
exchange at once, was predicted -6.7 % with 1.66 and +13.4 % with 2.00."""


def _timed(op: Callable[[], Any], n: int) -> list[float]:
    """``n`` runs of the collective ``op``, each after a barrier; their times in µs."""
    import torch.distributed as dist

    times = []
    for _ in range(n):
        dist.barrier()
        t0 = time.perf_counter()
        op()
        times.append((time.perf_counter() - t0) * 1e6)
    return times


def round_plan(warm_us: Sequence[float], reps: int, n_rounds: int) -> list[list[int | None]]:
    """Per round, per size: how the worker measures it; None: ``reps`` and more up to the round's
    share of the time budget (``_measure``), for sizes whose warm-up all-reduce took under
    ``ROUND_MAX_S``; a count: that many repetitions, the slower sizes' ``reps`` spread over the rounds
    (0: none left for this round)."""
    per_round = -(-reps // n_rounds)
    return [[None if w < ROUND_MAX_S * 1e6 else max(0, min(per_round, reps - k * per_round)) for w in warm_us]
            for k in range(n_rounds)]  # fmt: skip


def _slowest(times: list[float]) -> list[float]:
    """Per repetition, the slowest rank's time (every rank passes its own, in the same order)."""
    import torch
    import torch.distributed as dist

    tt = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    return list(tt.tolist())


def _measure(op: Callable[[], Any], reps: int, budget_s: float) -> list[float]:
    """Times (µs) of ``op`` after a warm-up: ``reps`` runs, then more up to ``budget_s`` of them (at
    most ``MAX_REPS``, from the slowest rank's mean), and the slowest rank's time counts for each."""
    import torch
    import torch.distributed as dist

    op()  # warm-up: connections, buffers
    times = _timed(op, reps)
    # every rank must run the same number of collectives: the slowest rank's mean decides (a broadcast's
    # root, or a sender, returns as soon as its data is handed to the socket)
    mean = torch.tensor([statistics.fmean(times)], dtype=torch.float64)
    dist.all_reduce(mean, op=dist.ReduceOp.MAX)
    more = torch.tensor([min(MAX_REPS - reps, int(budget_s * 1e6 / max(float(mean.item()), 1.0)))])
    dist.broadcast(more, 0)
    times += _timed(op, max(0, int(more.item())))
    return _slowest(times)


def _peer() -> int:
    """This rank's partner in the pairs (0,1), (2,3) ... of the point-to-point passes."""
    import torch.distributed as dist

    rank = dist.get_rank()
    return rank + 1 if rank % 2 == 0 else rank - 1


def _gather_wait(gather: Callable[..., Any], out: Any, x: Any) -> None:
    gather(out, x, None).wait()


def _p2p_ops(x: Any, y: Any, *, exchange: bool) -> None:
    """One transfer of ``x`` between each pair (0,1), (2,3) ...: from the even rank to the odd one, or,
    with ``exchange``, both ways at once (batched isend + irecv, as torch's pipeline runtime posts them)."""
    import torch.distributed as dist

    rank, peer = dist.get_rank(), _peer()
    if exchange:
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, y, peer)]):
            work.wait()
    elif rank % 2 == 0:
        dist.send(x, peer)
    else:
        dist.recv(y, peer)


def _worker(
    sizes: list[int], reps: int, budget_s: float, ag_sizes: list[int], pp_sizes: list[int], realtime: bool = False,
    pin: bool = False, n_rounds: int = ROUNDS, out: str = "-",
) -> None:  # fmt: skip
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    pin_error = pin_rank() if pin else "not asked for"
    sched_error = realtime_class() if realtime else "not asked for"
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cpu: list[list[float]] = []
    # every size in each of n_rounds rounds: a burst of load on the host that lasts a second or two
    # then touches a share of each size's repetitions rather than all of two or three neighbouring
    # sizes. A size slower than ROUND_MAX_S (its warm-up all-reduce says) has its ``reps`` spread over
    # the rounds, a few per round: its repetitions one after the other lasted seconds, long enough for
    # one burst to slow them all (1 Gbit/s, 2026-11-27 05:11: the 90.51 MiB check read 9.53 ms/MiB,
    # its neighbours 9.05-9.14; three launches right after, 8.91-8.98)
    xs = [torch.ones(max(1, size // 4), dtype=torch.float32) for size in sizes]
    warm = [_slowest(_timed(partial(dist.all_reduce, x), 1))[0] for x in xs]
    rounds: list[list[list[float]]] = [[] for _ in xs]
    for plan in round_plan(warm, reps, n_rounds):
        for i, (x, n) in enumerate(zip(xs, plan, strict=True)):
            if n is None:
                rounds[i].append(_measure(partial(dist.all_reduce, x), reps, budget_s / n_rounds))
            elif n:
                rounds[i].append(_slowest(_timed(partial(dist.all_reduce, x), n)))
    per_size = [[t for r in rs for t in r] for rs in rounds]
    for x, times in zip(xs, per_size, strict=True):
        slow = statistics.fmean(times) > CPU_PASS_MAX_S * 1e6
        n_cpu = 0 if slow or realtime else int(budget_s * 1e6 / max(statistics.fmean(times), 1.0))
        cpu.append(cpu_pass(x, n_cpu, partial(_p2p_ops, exchange=True)))
    del xs
    from trainsim.run.casync import all_gather_bytes

    gathered: list[list[float]] = []
    for size in ag_sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32)
        buf = torch.empty(world * x.numel(), dtype=torch.float32)
        # the primitive the compression hook gathers with (gloo: receives posted before sends)
        gathered.append(_measure(partial(_gather_wait, all_gather_bytes, buf, x), reps, budget_s))
    p2p: list[list[list[float]]] = []
    for size in pp_sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32)
        y = torch.empty_like(x)
        p2p.append([_measure(partial(_p2p_ops, x, y, exchange=ex), max(reps, P2P_MIN_REPS), budget_s / 2)
                    for ex in (False, True)])  # fmt: skip
    ps: list[list[list[float]]] = []  # the parameter-server primitives at the same sizes: gather, broadcast
    for size in pp_sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32)
        parts = [torch.empty_like(x) for _ in range(world)] if rank == 0 else None
        ps.append([_measure(partial(dist.gather, x, parts, dst=0), reps, budget_s / 2),
                   _measure(partial(dist.broadcast, x, 0), reps, budget_s / 2)])  # fmt: skip
    posts: list[list[float]] = []  # per size: [idle, busy] mean wall time of one post
    for size in pp_sizes:
        x = torch.ones(max(1, size // 4), dtype=torch.float32)
        y = torch.empty_like(x)
        peer = _peer()
        posts.append([post_pass(x, y, peer, compute=False), post_pass(x, y, peer, compute=True)])
    if rank == 0:
        write_result(out, {"sizes": sizes, "rounds_us": rounds, "cpu_us": cpu, "post_us": posts, "allgather_us": gathered,
                           "p2p_us": p2p, "ps_us": ps, "realtime": sched_error is None, "sched_error": sched_error,
                           "pinned": pin_error is None, "pin_error": pin_error})  # fmt: skip
    dist.destroy_process_group()


def _rank(cfg: dict[str, Any], rank: int, master: str, port: int, out: str) -> None:
    """``rank_main``'s body: the process group from torchrun's variables (``testbed.launch``)."""
    _worker([int(x) for x in cfg["sizes"]], int(cfg["reps"]), float(cfg["budget_s"]),
            [int(x) for x in cfg.get("allgather_sizes", [])], [int(x) for x in cfg.get("p2p_sizes", [])],
            bool(cfg.get("realtime")), bool(cfg.get("pin")), int(cfg.get("rounds", ROUNDS)), out)  # fmt: skip


if __name__ == "__main__":
    rank_main(_rank, "one rank of a link calibration (started by trainsim calibrate)")
