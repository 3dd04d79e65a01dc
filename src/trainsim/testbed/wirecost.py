"""What moving bytes over a shaped link costs the computation of ranks that share this host's cores.

    $ RANK=0 WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python -m trainsim.testbed.wirecost \\
      --config '{"sizes": [65536, 1048576], "window_s": 1.0}'
    >>> lost_per_byte([65536, 1 << 20], [700.0, 20000.0])   # doctest: +ELLIPSIS
    0.0392...

One rank's process of the machine calibration's *wire pass* (``testbed.machine.calibrate_machine``),
and the arithmetic that turns its output into a per-byte figure. Generic workload, none of the
validated configurations: every rank runs the standard kernel (``machine.KERNEL_N`` float32 matmul, one
thread) without pause, as two ranks that compute at once do; meanwhile the main thread of rank 0 sends
back-to-back messages of each size of ``WIRE_SIZES`` to rank 1, which receives them (``send_pass``).
The kernel's iteration rate during the sends, against its rate in windows of every rank computing
with nothing sent just before and after, gives the computation the transfers took from the ranks:
gloo's loop and worker threads, the kernel's TCP stack and the shaping qdisc, whichever thread they
ran on. ``send_pass`` returns it per message, averaged over the two ranks (µs).

Why a pass of its own: on this 2-vCPU host, one-way sends on a veth link shaped by ``tbf`` cost the
two compute threads together ~38 ns per byte at 60 and at 240 Mbit/s (the link keeps the kernel's
64 KiB GSO packets, which tbf cuts into frames on the CPU), ~8 ns at 1 Gbit/s (smaller GSO packets,
``netns.gso_bytes``) and ~0.8 ns over loopback (``benchmarks/gloo_cpu_cost.py``, 2026-11-29,
docs/log/validate.md), while the loopback all-reduce line that the contention model charged
(``MachineCalibration.host_us``) is 1 ns per byte: a 1 MB all-reduce at 240 Mbit/s took 27 ms of each
rank's computation where 3.7 ms were charged. The cost is per byte (the same per byte at 60 as at 240
Mbit/s, where one lasts four times as long), so the calibration keeps one figure per shaped rate.
"""

from __future__ import annotations

import threading
import time
from typing import Any

WIRE_SIZES = [64 << 10, 1 << 20]
"""one-way message sizes of the wire pass (bytes): the per-byte figure is the slope between them"""
WINDOW_S = 1.0
"""seconds of back-to-back sends per size (at least ``MIN_SENDS`` sends)"""
MIN_SENDS = 3


def lost_per_byte(sizes: list[int], lost_us: list[float]) -> float:
    """Computation lost per byte sent one way, both ranks together (µs/byte): twice the slope of the
    per-rank mean lost per message (``lost_us``) over the message size, by least squares (>= 0).
    The doctest: (20,000 - 700) us over 983,040 bytes, times two ranks."""
    import numpy as np

    if len(sizes) < 2 or len(sizes) != len(lost_us):
        raise ValueError(f"lost_per_byte: {len(sizes)} sizes and {len(lost_us)} figures; expected >= 2 of each")
    slope = float(np.polyfit(np.asarray(sizes, float), np.asarray(lost_us, float), 1)[0])
    return max(0.0, 2.0 * slope)


def send_pass(sizes: list[int], window_s: float = WINDOW_S) -> list[float]:
    """Per size, the computation one message took from the ranks (µs per message, mean of the two
    ranks; module docstring). Runs in a process group of two ranks."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    peer = 1 - rank
    done = [0]
    stop = threading.Event()

    def compute() -> None:
        a, b = torch.randn(256, 256), torch.randn(256, 256)  # machine.KERNEL_N
        while not stop.is_set():
            torch.mm(a, b)
            done[0] += 1

    def quiet() -> float:
        dist.barrier()
        k, t = done[0], time.perf_counter()
        time.sleep(window_s / 2)
        return (done[0] - k) / (time.perf_counter() - t)

    th = threading.Thread(target=compute, daemon=True)
    th.start()
    time.sleep(0.3)
    out = []
    try:
        for size in sizes:
            x = torch.ones(max(1, size // 4))

            def one(x: Any = x) -> None:
                if rank == 0:
                    dist.send(x, peer)
                else:
                    dist.recv(x, peer)

            dist.barrier()
            t = time.perf_counter()
            for _ in range(MIN_SENDS):
                one()
            dist.barrier()
            per = torch.tensor([(time.perf_counter() - t) / MIN_SENDS])
            dist.all_reduce(per, op=dist.ReduceOp.MAX)
            n = max(MIN_SENDS, min(4000, int(window_s / max(float(per.item()), 1e-6))))
            before = quiet()
            dist.barrier()
            k0, t0 = done[0], time.perf_counter()
            for _ in range(n):
                one()
            dist.barrier()
            k1, t1 = done[0], time.perf_counter()
            after = quiet()
            alone = max(0.5 * (before + after), 1e-9)
            lost = (1.0 - (k1 - k0) / (t1 - t0) / alone) * (t1 - t0) / n * 1e6
            tt = torch.tensor([lost], dtype=torch.float64)
            dist.all_reduce(tt)
            out.append(float(tt.item()) / 2)
    finally:
        stop.set()
        th.join()
    return out


def _worker(cfg: dict[str, Any], rank: int, master: str, port: int, out: str) -> None:
    """One rank (``rank_main``'s body): the process group from torchrun's variables."""
    import torch
    import torch.distributed as dist

    from trainsim.run.ranks import write_result

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    sizes = [int(s) for s in cfg["sizes"]]
    lost = send_pass(sizes, float(cfg["window_s"]))
    if dist.get_rank() == 0:
        write_result(out, {"sizes": sizes, "lost_us": lost})
    dist.destroy_process_group()


if __name__ == "__main__":
    from trainsim.run.ranks import rank_main

    rank_main(_worker, "one rank of the machine calibration's wire pass (started by trainsim validate calibrate)")
