"""A gloo all-gather in flight while both ranks compute, against the same all-gather waited on idle.

    python benchmarks/cluster_busy_collective.py                    # 100 Mbit/s, 16 KiB-1 MiB, under a minute
    python benchmarks/cluster_busy_collective.py --rate 1000 --delay 0

Two ranks in network namespaces joined by a shaped link (``trainsim.testbed.netns``). Per size, in
alternating rounds: *idle*, both ranks post the all-gather and wait for it; *busy*, both post it and
then run matrix multiplies for 60 ms before waiting. The time is from posting to the moment the
future's callback ran (on gloo's thread), as rank 0 sees it. The difference is what a transfer pays
for being in flight while the ranks compute on a host whose cores they share with gloo's threads.
The calibration's all-gather line is timed the idle way. Writes the ``busy_collective`` section of
a record docs/benchmarks/cluster.<name>.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

BUSY_MS = 60.0
ROUNDS = 4
REPS = 20


def _stamp(into: list[float], _fut: object) -> None:
    into.append(time.perf_counter())


def _worker(cfg: dict[str, Any], rank: int, master: str, port: int, out_to: str) -> None:
    """One rank (``rank_main``'s body): the process group from torchrun's variables."""
    from trainsim.run.ranks import write_result

    sizes = [int(s) for s in cfg["sizes"]]
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def compute(ms: float) -> None:
        t = time.perf_counter()
        while (time.perf_counter() - t) * 1e3 < ms:
            torch.mm(a, b)

    out: dict[str, dict[str, list[float]]] = {str(s): {"idle": [], "busy": []} for s in sizes}
    for _ in range(ROUNDS):
        for size in sizes:
            x = torch.ones(max(1, size // 4))
            buf = torch.empty(2 * x.numel())
            for mode in ("idle", "busy"):
                for _ in range(REPS):
                    dist.barrier()
                    done: list[float] = []
                    t0 = time.perf_counter()
                    work = dist.all_gather_into_tensor(buf, x, async_op=True)
                    fut = work.get_future().then(partial(_stamp, done))
                    if mode == "busy":
                        compute(BUSY_MS)
                    work.wait()
                    fut.wait()
                    out[str(size)][mode].append((done[0] - t0) * 1e3)
    if dist.get_rank() == 0:
        write_result(out_to, out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=100.0, help="link rate, Mbit/s")
    ap.add_argument("--delay", type=float, default=0.0, help="added one-way latency, ms")
    ap.add_argument("--sizes", default="16384,65536,262144,1048576", help="bytes per rank, comma-separated")
    args = ap.parse_args()
    from results import record_report, stamp
    from trainsim.testbed.launch import run_json
    from trainsim.testbed.netns import Netns

    sizes = [int(s) for s in args.sizes.split(",")]
    head = stamp()
    with Netns(2, rate_mbit=args.rate, delay_ms=args.delay) as net:
        data = run_json(2, __file__, {"sizes": sizes}, net=net, timeout_s=900)[0]
    lines = [
        f"## A gloo all-gather while both ranks compute ({args.rate:g} Mbit/s, +{args.delay:g} ms)",
        "",
        head,
        "",
        f"Per size {ROUNDS} rounds x {REPS} all-gathers each way (2 processes, one thread each); time from "
        f"posting to the future's callback on rank 0; *busy*: both ranks multiply matrices for {BUSY_MS:g} ms "
        "right after posting.",
        "",
        "| bytes per rank | idle mean ms | idle median ms | busy mean ms | busy median ms | busy - idle (means) ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for s in sizes:
        idle, busy = data[str(s)]["idle"], data[str(s)]["busy"]
        mi, mb = statistics.fmean(idle), statistics.fmean(busy)
        lines.append(
            f"| {s:,} | {mi:.2f} | {statistics.median(idle):.2f} | {mb:.2f} | {statistics.median(busy):.2f} "
            f"| {mb - mi:+.2f} |"
        )
    text = "\n".join(lines)
    print(text)
    record_report("cluster", "busy_collective", text)
    return 0


if __name__ == "__main__":
    if "--config" in sys.argv:  # one rank, started by run_json
        from trainsim.run.ranks import rank_main

        rank_main(_worker, "one rank of cluster_busy_collective.py")
    sys.exit(main())
