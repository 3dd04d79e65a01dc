"""Probe: the profiler's own cost per recorded call on this machine, on generic operators.

    realrun .venv/bin/python benchmarks/probe_batch_profiler.py

Times loops of small operators bare and under ``torch.profiler`` set up as ``capture.profile.record_steps``
sets it up (CPU activity, input shapes recorded; one intra-op thread) and prints, per operator, the extra
time per loop iteration, the events the profiler recorded per iteration, and the cost per event. Generic
operators only (no model of the validation): the question is whether the profiler's per-call cost is
large enough to explain why a traced small-batch step exceeds its timed step (docs/log/whatif.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable


def main() -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=500, help="loop iterations per timing")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    u, v, w = torch.ones(16), torch.ones(16), torch.ones(16)
    img, kern, bias = torch.ones(1, 4, 8, 8), torch.ones(4, 4, 3, 3), torch.ones(4)
    lin, inp = torch.nn.Linear(16, 16), torch.ones(2, 16)

    def fwd_bwd() -> None:
        lin(inp).sum().backward()

    ops: dict[str, Callable[[], object]] = {
        "add": lambda: torch.add(u, v),
        "addcmul_": lambda: u.addcmul_(v, w, value=0.0),
        "conv2d (nested calls)": lambda: torch.nn.functional.conv2d(img, kern, bias, padding=1),
        "linear forward+backward": fwd_bwd,
    }
    print(f"{'operator':26s} {'bare us':>8s} {'+profiler us':>12s} {'events':>7s} {'us/event':>9s}")
    for name, op in ops.items():

        def loop(op: Callable[[], object] = op) -> float:
            t0 = time.perf_counter()
            for _ in range(a.calls):
                op()
            return time.perf_counter() - t0

        loop()
        extra, events, bare_us = [], [], []
        for _ in range(a.repeats):
            bare = min(loop() for _ in range(3))
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                loop()  # the profiler's first calls allocate its buffers
                traced = min(loop() for _ in range(3))
            extra.append((traced - bare) / a.calls * 1e6)
            events.append(len(prof.events()) / (4 * a.calls))
            bare_us.append(bare / a.calls * 1e6)
        d, n = statistics.median(extra), statistics.median(events)
        print(f"{name:26s} {statistics.median(bare_us):8.2f} {d:12.2f} {n:7.1f} {d / n:9.2f}")


if __name__ == "__main__":
    main()
