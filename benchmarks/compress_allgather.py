"""The compression hook's all-gather on gloo: receives posted before sends vs gloo's own all-gather.

    .venv/bin/python benchmarks/compress_allgather.py           # 20, 100, 1000 Mbit/s; ~6 min
    .venv/bin/python benchmarks/compress_allgather.py --quick   # 100 Mbit/s, fewer rounds

Two ranks in shaped network namespaces (``trainsim.testbed.netns``). Per link, side by side in
alternating rounds: (1) the all-gather alone, of the wire sizes of the mlp's two DDP buckets under onebit
(per rank), one call, and the two back to back and both in flight; (2) onebit DDP training of the zoo mlp
(``trainsim.validate.compress``'s worker) with each method, alternating, median step time. Methods:
``exchange`` (``trainsim.run.casync.all_gather_bytes``: every receive posted before any send) and
``collective`` (``torch.distributed.all_gather_into_tensor``). Writes the ``allgather`` section of
a record docs/benchmarks/compress.<name>.json.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

METHODS = ("exchange", "collective")
SIZES = (132_376, 163_864)
"""per-rank bytes of onebit's wire for the mlp's two buckets (weights at 1 bit, a scale and a marker each)"""
PATTERNS = ("one", "back to back", "in flight")


def worker(cfg: dict[str, Any], rank: int, master: str, port: int, out_to: str) -> None:
    """One rank (``rank_main``'s body): the process group from torchrun's variables."""
    import torch
    import torch.distributed as dist

    from trainsim.run.casync import all_gather_bytes
    from trainsim.run.ranks import write_result

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    bufs = [(torch.empty(world * n, dtype=torch.uint8), torch.ones(n, dtype=torch.uint8)) for n in cfg["sizes"]]

    def run(method: str, pattern: str) -> None:
        if pattern == "one":
            all_gather_bytes(*bufs[0], None, method).wait()
        elif pattern == "back to back":
            for out, x in bufs:
                all_gather_bytes(out, x, None, method).wait()
        else:
            handles = [all_gather_bytes(out, x, None, method) for out, x in bufs]
            for h in handles:
                h.wait()

    for m in METHODS:  # warm-up: connections
        run(m, "one")
    times: dict[str, list[float]] = {f"{m}/{p}": [] for m in METHODS for p in PATTERNS}
    for r in range(int(cfg["rounds"])):
        for m in METHODS if r % 2 == 0 else METHODS[::-1]:
            for p in PATTERNS:
                dist.barrier()
                t = time.perf_counter()
                run(m, p)
                times[f"{m}/{p}"].append((time.perf_counter() - t) * 1e3)
    keys = sorted(times)
    tt = torch.tensor([times[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)  # the slower rank's time per call
    if dist.get_rank() == 0:
        write_result(out_to, {k: tt[i].tolist() for i, k in enumerate(keys)})
    dist.barrier()


def training_ms(net: Any, method: str, steps: int) -> float:
    from trainsim.testbed.launch import run_json

    wcfg = {"model": "mlp", "algorithm": "onebit", "options": {}, "scheme": "allgather", "steps": steps,
            "warmup": 2, "gather": method}  # fmt: skip
    return float(statistics.median(run_json(2, "trainsim.validate.compress", wcfg, net=net, timeout_s=600)[0]["step_ms"]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import torch

    from compress_convergence import OUT_MD, write_section
    from trainsim.testbed.launch import run_json
    from trainsim.testbed.netns import Netns, netns_unavailable

    reason = netns_unavailable()
    if reason is not None:
        print(f"compress_allgather: needs network namespaces ({reason})", file=sys.stderr)
        return 2
    rates = (100.0,) if args.quick else (20.0, 100.0, 1000.0)
    rounds, passes, steps = (4, 1, 8) if args.quick else (12, 3, 12)
    started = datetime.datetime.now(datetime.timezone.utc)
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    rows, train_rows = [], []
    for rate in rates:
        with Netns(2, rate_mbit=rate) as net:
            print(f"{time.monotonic() - t0:6.1f}s {rate:g} Mbit/s: {rounds} rounds of all-gathers", file=sys.stderr)
            cfg = {"sizes": list(SIZES), "rounds": rounds}
            times = run_json(2, __file__, cfg, net=net, timeout_s=600)[0]
            wire_ms = {p: 1e3 * n / (rate * 1e6 / 8) for p, n in
                       (("one", SIZES[0]), ("back to back", sum(SIZES)), ("in flight", sum(SIZES)))}  # fmt: skip
            for p in PATTERNS:
                ex, co = times[f"exchange/{p}"], times[f"collective/{p}"]
                rows.append((rate, p, wire_ms[p], ex, co))
            got: dict[str, list[float]] = {m: [] for m in METHODS}
            for k in range(passes):
                for m in METHODS if k % 2 == 0 else METHODS[::-1]:
                    print(f"{time.monotonic() - t0:6.1f}s   onebit mlp training, {m} (pass {k + 1}/{passes})",
                          file=sys.stderr)  # fmt: skip
                    got[m].append(training_ms(net, m, steps))
            train_rows.append((rate, got))
    lines = [
        "## The hook's all-gather: receives posted first vs gloo's all-gather",
        "",
        f"Command: `.venv/bin/python benchmarks/compress_allgather.py{' --quick' if args.quick else ''}`  ",
        f"Machine: {platform.machine()} {os.cpu_count()} CPUs, Linux {platform.release()}, torch "
        f"{torch.__version__}, no GPU; load average {load:.2f} at start  ",
        f"Date: {started:%Y-%m-%d %H:%M} UTC",
        "",
        "Two gloo ranks in network namespaces joined by links shaped with tc. *exchange*: "
        "`trainsim.run.casync.all_gather_bytes` (each rank posts its receives, then its sends); *collective*: "
        "`all_gather_into_tensor`. Per-rank sizes of the mlp's two onebit buckets "
        f"({SIZES[0]:,} and {SIZES[1]:,} bytes); each call timed on the slower rank after a barrier, "
        f"{rounds} rounds, the methods alternating. *Wire* is the per-rank bytes at the link's rate.",
        "",
        "| link | calls | wire ms | exchange median (max) ms | collective median (max) ms | collective / exchange |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for rate, p, wire, ex, co in rows:
        lines.append(
            f"| {rate:g} Mbit/s | {p} | {wire:.1f} | {statistics.median(ex):.1f} ({max(ex):.1f}) | "
            f"{statistics.median(co):.1f} ({max(co):.1f}) | {statistics.median(co) / statistics.median(ex):.2f}x |"
        )
    lines += [
        "",
        f"Onebit DDP training of the zoo mlp (2 ranks, batch 32, median step of {steps} after 2 warm-up "
        f"steps; {passes} passes, the methods alternating):",
        "",
        "| link | exchange ms (passes) | collective ms (passes) | speed-up of exchange |",
        "|---|---:|---:|---:|",
    ]
    for rate, got in train_rows:
        ex, co = statistics.median(got["exchange"]), statistics.median(got["collective"])
        lines.append(
            f"| {rate:g} Mbit/s | {ex:.1f} ({' / '.join(f'{v:.1f}' for v in got['exchange'])}) | "
            f"{co:.1f} ({' / '.join(f'{v:.1f}' for v in got['collective'])}) | {co / ex:.2f}x |"
        )
    write_section(OUT_MD, "allgather", "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    if "--config" in sys.argv:  # one rank, started by run_json
        from trainsim.run.ranks import rank_main

        rank_main(worker, "one rank of compress_allgather.py")
    sys.exit(main())
