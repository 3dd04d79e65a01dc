"""Probe: one process of a CPU pair's program with glibc's default allocator and with
``run.traced.keep_freed_memory`` (docs/log/whatif.md), interleaved.

    realrun python benchmarks/probe_allocator.py --configs "mlp 1024 32 adam-loop 80" --repeats 5
    realrun python benchmarks/probe_allocator.py --profiled --configs "mlp 1024 32 adam-loop 140" --repeats 8

``--profiled``: every process keeps freed memory; after the timed steps it runs 5 steps under
``torch.profiler`` (as ``run.traced``: 1 warm-up + 4 recorded, ``record_shapes``), without and with
``run.traced.prefault_heap`` first (``pad`` 0/1), and prints the optimizer's median ms and faults per
step in the timed and in the profiled steps.

Each configuration is ``MODEL WIDTH BATCH OPTIMIZER STEPS``; each repeat runs it in a fresh process once
with each allocator setting (one intra-op thread, 3 warm-up steps, then ``STEPS`` timed). Prints one JSON
line per process: median step, medians of the first and second half (drift), minor page faults and
kernel time per step.
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import subprocess
import sys


def _child(model_name: str, width: int, batch_size: int, optimizer: str, keep: bool, steps: int) -> None:
    from trainsim.run.traced import keep_freed_memory

    alloc = keep_freed_memory() if keep else "default"
    import torch

    from trainsim.capture.profile import make_optimizer
    from trainsim.models import zoo
    from trainsim.run.ranks import step_starts

    torch.set_num_threads(1)
    model, batch = zoo.build_with_batches(model_name, seed=0, spec=zoo.ZooSpec(batch_size=batch_size, width=width, depth=4))
    opt = make_optimizer(optimizer, model.parameters(), 0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    step_starts(model, opt, batch, loss_fn, range(3))  # warm-up
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    marks = step_starts(model, opt, batch, loss_fn, range(3, 4 + steps))  # steps + 1 starts: steps durations
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    t = [(b - a) * 1e3 for a, b in itertools.pairwise(marks)]
    steps += 1  # the faults and kernel time were counted over steps + 1 steps
    h = len(t) // 2
    print(json.dumps({
        "config": f"{model_name} {width} {batch_size} {optimizer}", "alloc": alloc, "median_ms": statistics.median(t),
        "first_half_ms": statistics.median(t[:h]), "second_half_ms": statistics.median(t[h:]),
        "minor_faults_per_step": (r1.ru_minflt - r0.ru_minflt) / steps,
        "sys_ms_per_step": (r1.ru_stime - r0.ru_stime) * 1e3 / steps,
    }), flush=True)  # fmt: skip


def _profiled_child(model_name: str, width: int, batch_size: int, optimizer: str, pad: bool, steps: int) -> None:
    from trainsim.run.traced import keep_freed_memory, prefault_heap

    keep_freed_memory()
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from trainsim.capture.profile import _annotate_layers, make_optimizer
    from trainsim.models import zoo

    torch.set_num_threads(1)
    model, batch = zoo.build_with_batches(model_name, seed=0, spec=zoo.ZooSpec(batch_size=batch_size, width=width, depth=4))
    _annotate_layers(model)
    opt = make_optimizer(optimizer, model.parameters(), 0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    rec: list[tuple[float, int]] = []

    def step(i: int) -> None:
        x, y = batch(i)
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        f0, t0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        opt.step()
        rec.append(((time.perf_counter() - t0) * 1e3, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0))

    for i in range(3 + steps):
        step(i)
    timed = rec[3:]
    rec.clear()
    if pad:
        prefault_heap()
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=4, repeat=1),
                 on_trace_ready=lambda p: None, record_shapes=True) as prof:  # fmt: skip
        for i in range(5):
            step(3 + steps + i)
            prof.step()
    print(json.dumps({
        "config": f"{model_name} {width} {batch_size} {optimizer}", "prefault_heap": pad,
        "timed_opt_ms": round(statistics.median(t for t, _ in timed), 2),
        "timed_faults": statistics.median(f for _, f in timed),
        "profiled_opt_ms": [round(t, 2) for t, _ in rec], "profiled_faults": [f for _, f in rec],
    }), flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--configs", nargs="+", default=["mlp 1024 32 adam-loop 80", "mlp 1536 32 adam-loop 50",
                                                      "mlp 1024 4 adam-loop 120"])  # fmt: skip
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profiled", action="store_true", help="profiled steps without and with prefault_heap")
    a = ap.parse_args()
    mode = "--profiled-child" if a.profiled else "--child"
    for _ in range(a.repeats):
        for cfg in a.configs:
            for keep in ("0", "1"):
                subprocess.run([sys.executable, __file__, mode, *cfg.split()[:4], keep, cfg.split()[4]], check=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("--child", "--profiled-child"):
        m, w, b, o, k, n = sys.argv[2:8]
        (_child if sys.argv[1] == "--child" else _profiled_child)(m, int(w), int(b), o, k == "1", int(n))
    else:
        main()
