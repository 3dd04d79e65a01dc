"""Probe: where the time of a gloo all-reduce on shaped links goes, by rank count and rate (docs/log/whatif.md).

    realrun python benchmarks/probe_ring_ranks.py --worlds 2,4 --rates 200,400,800,1000 --sizes 4194304
    realrun python benchmarks/probe_ring_ranks.py --traced --worlds 4 --rates 400,800
    realrun python benchmarks/probe_ring_ranks.py --pairs 4 --worlds 4 --rates 400,800

Default mode: ``world`` ranks in network namespaces on links shaped to each rate (``testbed.netns``), bare
all-reduces of each size, each after a barrier and a pause (``--gap-ms``, as a step's computation leaves
the link idle); per rate: the slowest rank's median time, the time at the nominal rate
(``2(p-1)/p x size`` bytes per rank), the rest, each rank's CPU time per all-reduce (its threads, user and
system) and the host's busy share of its cores meanwhile (``/proc/stat``). ``--traced``: real DDP runs of
the what-if pairs' MLP (``run.traced``) at each rate instead; per rate: the timed step, and per profiled
step the slowest rank's computation before its all-reduce, the all-reduce after the last rank arrived
(``graph.multirank``), and the rest. ``--pairs N``: N launches of each of two rates, taking turns, the
first rate's traces predicting the second (the what-if pairs' network protocol), with the spread of
the launches.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores (``/proc/stat``'s first line; idle and iowait are not busy)."""
    vals = [float(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(vals) - vals[3] - vals[4], sum(vals)


def _worker(cfg: dict[str, Any], rank: int, master: str, port: int, out_to: str) -> None:
    """One rank (``rank_main``'s body): all-reduces of each size after a barrier and a pause."""
    import torch
    import torch.distributed as dist

    from trainsim.run.ranks import write_result

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    res: dict[str, Any] = {}
    for size in cfg["sizes"]:
        t = torch.ones(int(size) // 4)
        for _ in range(2):
            dist.all_reduce(t)
        wall, cpu, busy = [], [], []
        for _ in range(int(cfg["reps"])):
            dist.barrier()
            time.sleep(float(cfg["gap_ms"]) / 1e3)
            b0, c0, p0 = _busy(), time.process_time(), time.perf_counter()
            dist.all_reduce(t)
            p1, c1, b1 = time.perf_counter(), time.process_time(), _busy()
            wall.append((p1 - p0) * 1e3)
            cpu.append((c1 - c0) * 1e3)
            busy.append((b1[0] - b0[0]) / max(b1[1] - b0[1], 1e-9))
        res[str(size)] = {"wall_ms": wall, "cpu_ms": cpu, "busy": busy}
    write_result(out_to, res)
    dist.destroy_process_group()


def bare(worlds: list[int], rates: list[float], sizes: list[int], reps: int, gap_ms: float) -> None:
    from trainsim.testbed.launch import run_json
    from trainsim.testbed.netns import Netns

    cfg = {"sizes": sizes, "reps": reps, "gap_ms": gap_ms}
    for world in worlds:
        for rate in rates:
            with Netns(world, rate_mbit=rate) as net:
                ranks = run_json(world, __file__, cfg, net=net, timeout_s=600)
            for size in sizes:
                per = [r[str(size)] for r in ranks]
                slowest = [max(x) for x in zip(*(p["wall_ms"] for p in per), strict=True)]
                ms = statistics.median(slowest)
                nominal = 2 * (world - 1) / world * size * 8 / rate / 1e3
                cpu = statistics.median(statistics.median(p["cpu_ms"]) for p in per)
                busy = statistics.median(statistics.median(p["busy"]) for p in per)
                print(f"x{world} {rate:g} Mbit/s {size} B: {ms:.1f} ms (reps {min(slowest):.1f}-{max(slowest):.1f}), "
                      f"nominal {nominal:.1f}, rest {ms - nominal:+.1f} ms; CPU {cpu:.1f} ms per rank, "
                      f"host {100 * busy:.0f} % busy", flush=True)  # fmt: skip


def traced(worlds: list[int], rates: list[float], width: int) -> None:
    import numpy as np

    from trainsim.graph.ir import TaskKind
    from trainsim.graph.multirank import load_job, rank_step_bounds
    from trainsim.run.traced import TracedRunConfig, traced_run
    from trainsim.simulate.engine import simulate
    from trainsim.testbed.netns import shaped_ranks

    for world in worlds:
        for rate in rates:
            cfg = TracedRunConfig(model="mlp", width=width, world=world, rate_mbit=rate, steps=10, profiled=4,
                                  min_timed_s=2.0)  # fmt: skip
            with tempfile.TemporaryDirectory(prefix="probe-ring-") as tmp:
                res = traced_run(cfg, tmp, network=shaped_ranks)
                g = load_job(res["traces"]).graph
            s = simulate(g)
            timed = [statistics.median(x) for x in res["rank_step_ms"]]
            comm = np.flatnonzero(g.kind == TaskKind.COMM)
            ids = np.unique(g.step[comm][g.step[comm] >= 0])
            bounds = rank_step_bounds(g, s.start_us, s.end_us, ids)
            t0 = np.min([b[0] for b in bounds.values()], axis=0)
            t1 = np.max([b[1] for b in bounds.values()], axis=0)
            print(f"x{world} {rate:g} Mbit/s: timed step {max(timed):.1f} ms (ranks {', '.join(f'{x:.1f}' for x in timed)}); "
                  f"replayed {', '.join(f'{x:.1f}' for x in s.step_ms)}", flush=True)  # fmt: skip
            for i, step in enumerate(ids):
                c = comm[g.step[comm] == step]
                arrive, end = float(s.start_us[c].min()), float(s.end_us[c].max())  # transfers start at the last arrival
                print(f"    step {step}: {(t1[i] - t0[i]) / 1e3:.1f} ms = before {(arrive - t0[i]) / 1e3:.1f} + all-reduce "
                      f"{(end - arrive) / 1e3:.1f} + after {(t1[i] - end) / 1e3:.1f}", flush=True)  # fmt: skip


def pairs(world: int, rates: list[float], rounds: int, model: str, width: int, keep: str | None = None) -> None:
    """``rounds`` launches of each rate, taking turns; each launch of the first rate predicts the second
    rate (``validate.whatif.predict_pair``, per rank: with the transfer fitted on the trace, and with the
    machine calibration's link model, as ``trainsim validate whatif`` does; and the job's ranks replayed
    together, ``graph.multirank``), against every launch of the second rate. ``keep``: a
    folder that keeps each launch's traces and result (``x<world>-<rate>-<round>/``)."""
    import json

    import numpy as np

    from trainsim.errors import UserError
    from trainsim.graph.ir import TaskKind
    from trainsim.graph.multirank import load_job
    from trainsim.run.traced import TracedRunConfig, traced_run
    from trainsim.simulate.engine import simulate
    from trainsim.testbed.machine import load_machine
    from trainsim.testbed.netns import shaped_ranks
    from trainsim.transform.network import scale_network
    from trainsim.validate.whatif import Pair, predict_pair

    cal, _ = load_machine()
    first_rate, second_rate = rates[0], rates[1]
    cfgs = {r: TracedRunConfig(model=model, width=width, world=world, rate_mbit=r, steps=10, profiled=4, warmup=3,
                               min_timed_s=2.0) for r in (first_rate, second_rate)}  # fmt: skip
    pair = Pair(kind="network", first=cfgs[first_rate], second=cfgs[second_rate])
    timed: dict[float, list[float]] = {first_rate: [], second_rate: []}
    preds: list[tuple[float, float, float]] = []
    for i in range(rounds):
        for rate in (first_rate, second_rate):
            with tempfile.TemporaryDirectory(prefix="probe-ring-") as tmp:
                folder = Path(keep) / f"x{world}-{rate:g}-{i + 1}" if keep else Path(tmp)
                res = traced_run(cfgs[rate], folder, network=shaped_ranks)
                (folder / "result.json").write_text(json.dumps(res))
                step = max(statistics.median(x) for x in res["rank_step_ms"])
                timed[rate].append(step)
                try:
                    g = load_job(res["traces"]).graph
                except UserError as e:  # e.g. a CNN's buffer broadcasts, which differ between ranks
                    print(f"    ranks not replayed together: {e}", flush=True)
                    g = load_job(res["traces"][:1]).graph
                s1 = simulate(g).step_ms
                comm = np.flatnonzero(g.kind == TaskKind.COMM)
                ar = [float(np.max(g.dur_us[comm[g.step[comm] == k]])) / 1e3 for k in np.unique(g.step[comm])]
                line = (f"round {i + 1} x{world} {rate:g} Mbit/s: timed {step:.1f} ms; replayed job "
                        f"{', '.join(f'{x:.1f}' for x in s1)}; all-reduce after the last arrival {', '.join(f'{x:.1f}' for x in ar)}")
                if rate == first_rate:
                    fit = predict_pair(pair, res)["predicted_ms"]
                    machine = predict_pair(pair, res, machine=cal)["predicted_ms"]
                    s2 = simulate(scale_network(g, bw_factor=second_rate / first_rate)).step_ms
                    joint = step + float(np.median(s2 - s1))
                    preds.append((fit, machine, joint))
                    line += (f"; predicted {second_rate:g}: per rank fitted {fit:.1f}, per rank machine model "
                             f"{machine:.1f}, ranks together {joint:.1f}")
            print(line, flush=True)  # fmt: skip
    for rate, xs in timed.items():
        m = statistics.fmean(xs)
        print(f"x{world} {rate:g} Mbit/s launches: {', '.join(f'{x:.1f}' for x in xs)} ms, mean {m:.1f}, "
              f"spread (max - min) / mean {100 * (max(xs) - min(xs)) / m:.1f} %", flush=True)  # fmt: skip
    truth = statistics.fmean(timed[second_rate])
    for name, k in (("per rank, fitted", 0), ("per rank, machine model", 1), ("ranks together", 2)):
        errs = [100 * (p[k] - truth) / truth for p in preds]
        print(f"predicted {second_rate:g} ({name}) against the mean of its launches: "
              f"{', '.join(f'{e:+.1f}' for e in errs)} %, mean {statistics.fmean(errs):+.1f} %", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--worlds", default="2,4", help="rank counts, comma-separated")
    ap.add_argument("--rates", default="200,400,800,1000", help="link rates (Mbit/s), comma-separated")
    ap.add_argument("--sizes", default="4194304", help="all-reduce sizes (bytes), comma-separated")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--gap-ms", type=float, default=30.0, help="pause before each all-reduce")
    ap.add_argument("--traced", action="store_true", help="real DDP runs (run.traced) instead of bare all-reduces")
    ap.add_argument("--width", type=int, default=1024, help="--traced, --pairs: the MLP's width")
    ap.add_argument("--model", default="mlp", help="--pairs: the zoo model (mlp or cnn)")
    ap.add_argument("--pairs", type=int, default=0, help="launches of each of the first two --rates, taking "
                    "turns; the first rate's traces predict the second (one world: the first of --worlds)")
    ap.add_argument("--keep", default=None, help="--pairs: keep every launch's traces and result in this folder")
    a = ap.parse_args()
    worlds = [int(x) for x in a.worlds.split(",")]
    rates = [float(x) for x in a.rates.split(",")]
    if a.pairs:
        pairs(worlds[0], rates, a.pairs, a.model, a.width, a.keep)
    elif a.traced:
        traced(worlds, rates, a.width)
    else:
        bare(worlds, rates, [int(x) for x in a.sizes.split(",")], a.reps, a.gap_ms)


if __name__ == "__main__":
    if "--config" in sys.argv:  # one rank, started by run_json
        from trainsim.run.ranks import rank_main

        rank_main(_worker, "one rank of probe_ring_ranks.py")
    main()
