"""What gloo communication costs the computation of two ranks that share this host's cores.

    python benchmarks/gloo_cpu_cost.py                   # loopback and a veth link at 240 Mbit/s
    python benchmarks/gloo_cpu_cost.py --rates 0 --window 1.0 --json out.json

Generic workloads only (none of the validated configurations): two gloo ranks, each with one thread
running the standard kernel (a 256 x 256 float32 matmul, ``testbed.machine.KERNEL_N``) without pause,
while the main thread runs back-to-back all-reduces, one-way sends or exchanges of a grid of sizes.
Per point, the kernel's iteration rate during the transfers against its rate in windows of both ranks
computing with nothing sent, just before and after, gives the computation lost per operation; the
threads' ``/proc/self/task/*/schedstat`` give each thread's CPU time and run-queue wait per operation
(the compute thread, the main thread that issues the operations, and the rest: gloo's loop and
worker threads). The kernel's work done in soft interrupts is charged to whichever thread it
interrupts, so it shows in the lost computation, not in a thread of its own.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIZES = [4 << 10, 64 << 10, 1 << 20, 4 << 20]
OPS = ("allreduce", "send", "exchange")


def _schedstat() -> dict[int, tuple[float, float]]:
    """Per thread id of this process: (on-CPU us, run-queue wait us)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                run_ns, wait_ns, _ = f.read().split()
        except OSError:
            continue
        out[int(tid)] = (int(run_ns) / 1e3, int(wait_ns) / 1e3)
    return out


def _worker(cfg: dict[str, Any], _rank: int, master: str, port: int, out_to: str) -> None:
    """One rank (``rank_main``'s body): the process group from torchrun's variables."""
    import torch
    import torch.distributed as dist

    from trainsim.run.ranks import write_result

    sizes, window_s, rounds, ops = [int(s) for s in cfg["sizes"]], float(cfg["window_s"]), int(cfg["rounds"]), list(cfg["ops"])

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    peer = 1 - rank
    done = [0]
    stop = threading.Event()
    ids: dict[str, int] = {"main": threading.get_native_id()}

    def compute() -> None:
        ids["compute"] = threading.get_native_id()
        a = torch.randn(256, 256)
        b = torch.randn(256, 256)
        while not stop.is_set():
            torch.mm(a, b)
            done[0] += 1

    th = threading.Thread(target=compute, daemon=True)
    th.start()
    time.sleep(0.5)

    def quiet() -> float:
        dist.barrier()
        k, t = done[0], time.perf_counter()
        time.sleep(window_s / 2)
        return (done[0] - k) / (time.perf_counter() - t)

    def op_fn(op: str, x: Any, y: Any) -> Any:
        if op == "allreduce":
            return lambda: dist.all_reduce(x)
        if op == "send":
            return (lambda: dist.send(x, peer)) if rank == 0 else (lambda: dist.recv(y, peer))

        def ex() -> None:
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, y, peer)]):
                w.wait()

        return ex

    rows = []
    for _ in range(rounds):
        for op in ops:
            for size in sizes:
                x = torch.ones(size // 4)
                y = torch.empty_like(x)
                f = op_fn(op, x, y)
                dist.barrier()
                t = time.perf_counter()
                for _ in range(3):
                    f()
                dist.barrier()
                per = torch.tensor([(time.perf_counter() - t) / 3])
                dist.all_reduce(per, op=dist.ReduceOp.MAX)
                n = max(3, min(4000, int(window_s / max(float(per.item()), 1e-6))))
                before = quiet()
                dist.barrier()
                s0, k0, t0 = _schedstat(), done[0], time.perf_counter()
                for _ in range(n):
                    f()
                s1, k1, t1 = _schedstat(), done[0], time.perf_counter()
                after = quiet()
                wall = t1 - t0
                alone = 0.5 * (before + after)
                lost_frac = 1.0 - (k1 - k0) / wall / alone
                cpu = {"compute": 0.0, "main": 0.0, "other": 0.0}
                wait = {"compute": 0.0, "main": 0.0, "other": 0.0}
                for tid, (r1, w1) in s1.items():
                    r0, w0 = s0.get(tid, (0.0, 0.0))
                    who = next((k for k, v in ids.items() if v == tid), "other")
                    cpu[who] += r1 - r0
                    wait[who] += w1 - w0
                vals = [wall / n * 1e6, lost_frac, lost_frac * wall / n * 1e6, cpu["compute"] / n, cpu["main"] / n,
                        cpu["other"] / n, wait["compute"] / n, wait["main"] / n, wait["other"] / n,
                        (before - after) / alone]  # fmt: skip
                tt = torch.tensor(vals, dtype=torch.float64)
                dist.all_reduce(tt)
                mx = torch.tensor([lost_frac], dtype=torch.float64)
                dist.all_reduce(mx, op=dist.ReduceOp.MAX)
                rows.append({"op": op, "size": size, "n": n, "vals": [*(tt / 2).tolist(), float(mx.item())]})
    stop.set()
    th.join()
    if rank == 0:
        write_result(out_to, rows)
    dist.destroy_process_group()


COLS = ["wall_us", "lost_frac", "lost_us", "cpu_compute_us", "cpu_main_us", "cpu_gloo_us", "wait_compute_us",
        "wait_main_us", "wait_gloo_us", "alone_drift", "max_rank_lost_frac"]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="0,240", help="link rates in Mbit/s; 0: loopback")
    ap.add_argument("--window", type=float, default=1.2, help="seconds of transfers per point")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--ops", default=",".join(OPS), help="which of allreduce, send, exchange")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from trainsim.testbed.launch import run_json
    from trainsim.testbed.netns import Netns

    wcfg = {"sizes": list(SIZES), "window_s": a.window, "rounds": a.rounds, "ops": a.ops.split(",")}
    me = str(Path(__file__).resolve())
    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "load_avg": os.getloadavg()[0],
                           "links": {}}  # fmt: skip
    for rate in [float(r) for r in a.rates.split(",")]:
        if rate:
            with Netns(2, rate_mbit=rate) as net:
                rows = run_json(2, me, wcfg, net=net, timeout_s=600)[0]
        else:
            rows = run_json(2, me, wcfg, net=None, timeout_s=600)[0]
        name = f"{rate:g} Mbit/s" if rate else "loopback"
        doc["links"][name] = rows
        print(f"\n{name}\n{'op':>9} {'bytes':>8} {'n':>5} " + " ".join(f"{c:>15}" for c in COLS))
        for r in rows:
            print(f"{r['op']:>9} {r['size']:>8} {r['n']:>5} " + " ".join(f"{v:>15.3f}" for v in r["vals"]))
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    if "--config" in sys.argv:  # one rank, started by run_json
        from trainsim.run.ranks import rank_main

        rank_main(_worker, "one rank of gloo_cpu_cost.py")
    main()
