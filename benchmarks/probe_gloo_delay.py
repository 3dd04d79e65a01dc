"""Probe: gloo collectives on delayed links against the machine calibration's model (docs/log/validate.md).

    realrun python benchmarks/probe_gloo_delay.py --sizes 65536,1048576 --links 240:5,1000:4 --reps 6
    realrun python benchmarks/probe_gloo_delay.py --sizes 1048576 --links 240:5 --slow-start 1,0 --gaps-ms 0,50,200
    realrun python benchmarks/probe_gloo_delay.py --sizes 4096,1048576 --links 240:5,1000:4 --concurrent
    realrun python benchmarks/probe_gloo_delay.py --sizes 65536,262144 --links 60:0,300:0 --concurrent --compute

Two ranks in network namespaces on links ``RATE:DELAY`` (Mbit/s : ms one way). Default mode: all-reduce
and all-gather of each size after a barrier and a 20 ms pause; prints the slowest rank's median, the
model (``MachineCalibration.allreduce_us`` / ``allgather_us``) and the gap in delays. With
``--slow-start``: all-reduces of each size after idle gaps, with ``net.ipv4.tcp_slow_start_after_idle``
set to each value in both namespaces. With ``--concurrent``: the same barrier and pause, then several
operations issued back to back without waiting (``CONCURRENT``) and waited for together: one, two and
three all-reduces, one all-gather by exchange (``run.casync.all_gather_bytes``, the compression hook's),
two all-gathers, an all-reduce and that all-gather, and two of those pairs (the hook's two buckets);
prints each against one operation alone, in delays, and the model's time for the pattern: the transfers
chained with gloo's lanes as the compression what-if chains them (``transform.dataparallel.chained_bucket_us``).
With ``--compute`` as well, every rank runs the standard kernel (one thread) throughout, as ranks that
compute beside their transfers do. Generic sizes and links only: none is a validated configuration.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

CONCURRENT = {"ar": "r", "ar+ar": "rr", "ar+ar+ar": "rrr", "ag": "g", "ag+ag": "gg", "ar+ag": "rg",
              "ar+ag+ar+ag": "rgrg"}
"""``--concurrent``: operations issued back to back (r: an all-reduce; g: an all-gather by exchange)"""


def _timed(run: Callable[[], None], reps: int, pause: float) -> float:
    """The slowest rank's median time (ms) of ``run()`` after a barrier and ``pause`` seconds."""
    import torch
    import torch.distributed as dist

    run()
    run()
    times = []
    for _ in range(reps):
        dist.barrier()
        time.sleep(pause)
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return statistics.median(slowest.tolist())


def _concurrent(sizes: list[int], reps: int, compute: bool) -> dict[str, float]:
    """``CONCURRENT``'s patterns at each size (bytes per operation and rank), each operation on its own
    tensors, all issued before any is waited for; with ``compute``, beside a thread that runs the
    standard kernel without pause."""
    import threading

    import torch
    import torch.distributed as dist

    from trainsim.run.casync import all_gather_bytes

    world = dist.get_world_size()
    out: dict[str, float] = {}
    stop = threading.Event()

    def kernel() -> None:
        a, b = torch.randn(256, 256), torch.randn(256, 256)  # testbed.machine.KERNEL_N
        while not stop.is_set():
            torch.mm(a, b)

    if compute:
        torch.set_num_threads(1)
        threading.Thread(target=kernel, daemon=True).start()
    for size in sizes:
        for name, ops in CONCURRENT.items():
            ins = [torch.ones(size // 4) for _ in ops]
            gathered = [torch.empty(world * (size // 4)) for _ in ops]

            def run(ops: str = ops, ins: list[torch.Tensor] = ins, gathered: list[torch.Tensor] = gathered) -> None:
                works = [dist.all_reduce(t, async_op=True) if op == "r" else all_gather_bytes(o, t, None, "exchange")
                         for op, t, o in zip(ops, ins, gathered, strict=True)]  # fmt: skip
                for w in works:
                    w.wait()

            out[f"{name} {size} 20"] = _timed(run, reps, 0.02)
    stop.set()
    return out


def _worker(cfg: dict[str, Any], rank: int, master: str, port: int, out_to: str) -> None:
    """One rank (``rank_main``'s body): the process group from torchrun's variables."""
    import torch
    import torch.distributed as dist

    from trainsim.run.ranks import write_result

    mode, sizes, reps, gaps = cfg["mode"], [int(s) for s in cfg["sizes"]], int(cfg["reps"]), cfg["gaps_ms"]
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    out: dict[str, float] = {}
    if mode == "concurrent":
        out = _concurrent(sizes, reps, bool(cfg.get("compute")))
        if dist.get_rank() == 0:
            write_result(out_to, out)
        dist.destroy_process_group()
        return
    ops = ("allreduce", "allgather") if mode == "ops" else ("allreduce",)
    pauses = [0.02] if mode == "ops" else [float(g) / 1e3 for g in gaps]
    for op in ops:
        for size in sizes:
            t = torch.ones(size // 4)
            outs = [torch.empty_like(t) for _ in range(world)]

            def run(op: str = op, t: torch.Tensor = t, outs: list[torch.Tensor] = outs) -> None:
                if op == "allreduce":
                    dist.all_reduce(t)
                else:
                    dist.all_gather(outs, t)

            for pause in pauses:
                out[f"{op} {size} {pause * 1e3:g}"] = _timed(run, reps, pause)
    if dist.get_rank() == 0:
        write_result(out_to, out)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--sizes", default="65536,1048576,4194304", help="bytes per rank, comma-separated")
    ap.add_argument("--links", default="240:0,240:5,1000:4", help="RATE:DELAY_MS pairs, comma-separated")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--slow-start", default="", help="tcp_slow_start_after_idle values to compare (e.g. 1,0)")
    ap.add_argument("--gaps-ms", default="0,50,200", help="with --slow-start: idle gaps before each all-reduce")
    ap.add_argument("--concurrent", action="store_true", help="operations issued together against one alone")
    ap.add_argument("--compute", action="store_true", help="with --concurrent: every rank computes meanwhile")
    a = ap.parse_args()

    from trainsim.testbed.launch import run_json
    from trainsim.testbed.machine import load_machine
    from trainsim.testbed.netns import Netns

    cal, _ = load_machine()
    mode = "concurrent" if a.concurrent else "idle" if a.slow_start else "ops"
    for link in a.links.split(","):
        rate, delay = (float(x) for x in link.split(":"))
        with Netns(2, rate_mbit=rate, delay_ms=delay) as net:
            for ssai in a.slow_start.split(",") if a.slow_start else [""]:
                if ssai:
                    for ns in net.names:
                        subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w",
                                        f"net.ipv4.tcp_slow_start_after_idle={ssai}"], check=True)  # fmt: skip
                wcfg = {"mode": mode, "sizes": [int(s) for s in a.sizes.split(",")], "reps": a.reps,
                        "gaps_ms": a.gaps_ms.split(","), "compute": a.compute}  # fmt: skip
                res = run_json(2, __file__, wcfg, net=net, timeout_s=300)[0]
                if mode == "concurrent":
                    _report_concurrent(res, rate, delay, cal)
                    continue
                for key, ms in res.items():
                    op, size, pause = key.split()
                    f = cal.allreduce_us if op == "allreduce" else cal.allgather_us
                    model = f(int(size), world=2, rate_mbit=rate, delay_ms=delay) / 1e3
                    gap = (ms - model) / delay if delay else 0.0
                    extra = f" slow_start_after_idle={ssai} idle {pause} ms" if ssai else ""
                    print(f"{rate:g} Mbit/s +{delay:g} ms{extra} {op} {size} B: measured {ms:.2f} ms, "
                          f"model {model:.2f} ms, gap {ms - model:+.2f} ms = {gap:+.2f} delays", flush=True)  # fmt: skip


def chain_model_ms(ops: str, size: int, rate: float, delay: float, cal: Any) -> float:
    """The model's time (ms) for ``ops`` (``CONCURRENT``'s letters) of ``size`` bytes each, issued at
    once by 2 ranks: the transfers chained with gloo's lanes, each charged by its own cost per byte a
    rank puts on the wire, as ``transform.compression`` charges an all-reduce and an exchange all-gather."""
    from trainsim.transform.dataparallel import BACKEND_LANES, chained_bucket_us

    def ar(w: float) -> float:  # 2 ranks: a rank puts the tensor's bytes on the wire
        return float(cal.allreduce_us(w, world=2, rate_mbit=rate, delay_ms=delay))

    def ag(w: float) -> float:
        return float(cal.allgather_us(w, world=2, rate_mbit=rate, delay_ms=delay))

    durs = chained_bucket_us([0.0] * len(ops), [size] * len(ops), [ar if op == "r" else ag for op in ops],
                             lanes=BACKEND_LANES["gloo"], collective=[op == "r" for op in ops])  # fmt: skip
    return sum(durs) / 1e3  # one FIFO channel: the last transfer ends at the sum


def _report_concurrent(res: dict[str, float], rate: float, delay: float, cal: Any) -> None:
    """Each pattern against the sum of its operations alone and the longest of them (in delays where
    the link has one), and against the chain's model."""
    for key, ms in res.items():
        name, size, _ = key.split()
        alone = {op: res[f"{one} {size} 20"] for op, one in (("r", "ar"), ("g", "ag"))}
        ops = CONCURRENT[name]
        serial, longest = sum(alone[op] for op in ops), max(alone[op] for op in ops)
        chain = chain_model_ms(ops, int(size), rate, delay, cal)
        d = delay or float("nan")
        print(f"{rate:g} Mbit/s +{delay:g} ms {name} {size} B: measured {ms:.2f} ms; one after another "
              f"{serial:.2f} ({(ms - serial) / d:+.2f} delays), longest alone {longest:.2f} "
              f"({(ms - longest) / d:+.2f} delays); chain model {chain:.2f} ({100 * (chain - ms) / ms:+.1f} %)",
              flush=True)  # fmt: skip


if __name__ == "__main__":
    if "--config" in sys.argv:  # one rank, started by run_json
        from trainsim.run.ranks import rank_main

        rank_main(_worker, "one rank of probe_gloo_delay.py")
    main()
