"""Measure this machine's CPU peak figures used by the catalog entry ``this-cpu``.

    python benchmarks/cluster_cpu_peak.py

FP32 and BF16 matrix-multiply rate (torch.mm 2048x2048 on all threads, best of 5) and memory bandwidth
(copy of a 256 MiB tensor, read + write bytes, best of 5). Writes the ``cpu_peak`` section of
a record docs/benchmarks/cluster.<name>.json; copy the numbers into ``trainsim/cluster/catalog.py`` by hand.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import DIR, record_report, stamp


def main() -> int:
    import torch

    torch.set_num_threads(torch.get_num_threads())
    n = 2048
    rows = []
    for dt in (torch.float32, torch.bfloat16):
        a, b = torch.randn(n, n).to(dt), torch.randn(n, n).to(dt)
        a @ b
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t)
        rows.append((str(dt).replace("torch.", ""), 2 * n**3 / best / 1e12))
    x = torch.empty(64 << 20)  # 256 MiB of fp32
    y = torch.empty_like(x)
    y.copy_(x)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        y.copy_(x)
        best = min(best, time.perf_counter() - t)
    bw = 2 * x.numel() * 4 / best / 1e9
    lines = [
        "## This machine's CPU (catalog entry `this-cpu`)",
        "",
        stamp(),
        "| figure | value |",
        "|---|---:|",
        *[f"| peak {name} matmul (torch.mm {n}x{n}, {torch.get_num_threads()} threads) | {tf:.3f} TFLOP/s |" for name, tf in rows],
        f"| memory bandwidth (256 MiB copy, read + write) | {bw:.1f} GB/s |",
    ]
    record_report("cluster", "cpu_peak", "\n".join(lines))
    print("\n".join(lines[-4:]), f"\n-> {DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
