"""Goodput Monte Carlo: speed (10,000 simulated job-months) and agreement with Young/Daly.

    python benchmarks/goodput_bench.py            # ~1 min on 2 shared cores
    python benchmarks/goodput_bench.py --quick    # fewer configurations and seeds

Writes docs/benchmarks/goodput.speed.json and goodput.young_daly.json (``results.record``).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from trainsim.plan.goodput import (
    GoodputConfig,
    best_interval_s,
    daly_interval_s,
    exact_interval_s,
    expected_time_s,
    goodput,
    simulate,
    young_interval_s,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
# Llama 3 (Dubey et al. 2024, arXiv:2407.21783, §3.3.4): 419 unexpected interruptions in 54 days on 16,384 GPUs.
LLAMA3_JOB_MTBF_H = 54 * 24 / 419  # 3.09 h
LLAMA3 = GoodputConfig(step_s=10.0, gpus=16384, mtbf_gpu_hours=LLAMA3_JOB_MTBF_H * 16384, checkpoint_s=60.0,
                       restart_s=600.0)  # fmt: skip


def speed(samples: int, repeats: int) -> list[str]:
    rows = [f"| case | failures per trace | wall s (best of {repeats}) |", "|---|---|---|"]
    spares = replace(LLAMA3, spare_nodes=8, replace_s=300.0, repair_s=4 * 3600.0)
    for name, cfg in (("one interval, no spares", LLAMA3), ("one interval, 8 spares, 4 h repair", spares)):
        tau = exact_interval_s(cfg.checkpoint_s, cfg.job_mtbf_s)
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            _, f = simulate(cfg, [tau], samples=samples, seed=0)
            best = min(best, time.perf_counter() - t0)
        rows.append(f"| {name} | {f.mean():.0f} | {best:.2f} |")
    t0 = time.perf_counter()
    r = goodput(LLAMA3, samples=samples, seed=0)
    rows.append(f"| full search ({len(r.evaluated)} intervals) + final estimate at 2 intervals | "
                f"{r.failures_mean:.0f} | {time.perf_counter() - t0:.2f} (once) |")  # fmt: skip
    return rows


def agreement(samples: int, seeds: int, quick: bool) -> list[str]:
    # (checkpoint_s, job MTBF h, steps of 10 s): C/M from 0.07 % to 17 %
    cases = [(10.0, 3.0, 100_000), (30.0, LLAMA3_JOB_MTBF_H, 259_200), (60.0, 24.0, 259_200),
             (120.0, 8.0, 259_200), (300.0, 2.0, 50_000), (600.0, 1.0, 20_000)]  # fmt: skip
    if quick:
        cases = cases[:3]
    rows = ["| C s | job MTBF h | C/M | Young s | Daly s | closed-form s | MC optimum s (seeds) | MC vs Young | "
            "MC vs closed form | MC E[T] vs closed form (z) | goodput MC opt / Young | search s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for c, m_h, steps in cases:
        gpus = 8192
        cfg = GoodputConfig(step_s=10.0, gpus=gpus, mtbf_gpu_hours=m_h * gpus, checkpoint_s=c, restart_s=600.0,
                            steps=steps)  # fmt: skip
        m = cfg.job_mtbf_s
        yd, dl, ex = young_interval_s(c, m), daly_interval_s(c, m), exact_interval_s(c, m)
        taus, secs = [], []
        for s in range(seeds):
            t0 = time.perf_counter()
            tau, _ = best_interval_s(cfg, samples=samples, seed=s)
            secs.append(time.perf_counter() - t0)
            taus.append(tau)
        tau = statistics.mean(taus)
        spread = statistics.stdev(taus) / tau if len(taus) > 1 else 0.0
        r = goodput(replace(cfg, interval_s=taus[0]), samples=samples, seed=99)
        tt, _ = simulate(cfg, [taus[0]], samples=samples, seed=[99, 1])
        closed = expected_time_s(cfg, taus[0])
        assert closed is not None
        z = (tt[0].mean() - closed) / (tt[0].std(ddof=1) / math.sqrt(samples))
        rows.append(
            f"| {c:g} | {m / 3600:.2f} | {100 * c / m:.3f}% | {yd:.0f} | {dl:.0f} | {ex:.0f} | "
            f"{tau:.0f} (±{100 * spread:.2f}%) | {100 * (tau / yd - 1):+.1f}% | {100 * (tau / ex - 1):+.2f}% | "
            f"{z:+.2f} | {100 * r.goodput:.2f}% / {100 * r.young_daly_goodput:.2f}% | {statistics.mean(secs):.2f} |"
        )
        print(rows[-1], file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--samples", type=int, default=10_000)
    a = ap.parse_args()
    cmd = " ".join(["python", "benchmarks/goodput_bench.py", *sys.argv[1:]])
    sp = speed(a.samples, 2 if a.quick else 3)
    print("\n".join(sp), file=sys.stderr)
    ag = agreement(4000, 2 if a.quick else 5, a.quick)
    from results import markdown_table, record

    machine = f"2-core shared VM, no GPU ({os.cpu_count()} logical CPUs, {platform.machine()}), Python {platform.python_version()}"
    record("goodput", "speed", command=cmd, machine_text=machine, headline=markdown_table("\n".join(sp)),
           title=f"Speed: {a.samples:,} simulated job-months of a Llama-3-scale job",
           summary=[f"16,384 GPUs, one interruption every {LLAMA3_JOB_MTBF_H:.2f} h (Dubey et al. 2024, §3.3.4), "
                    "30 days of 10 s steps, checkpoint 60 s, restart 600 s. Target: < 10 s."],
           data={"samples": a.samples, "table": sp})  # fmt: skip
    record("goodput", "young_daly", command=cmd, machine_text=machine, headline=markdown_table("\n".join(ag)),
           title="Monte Carlo optimum vs Young/Daly and the closed form (8,192 GPUs, 4,000 traces)",
           summary=["Target: within 5 % of Young where C << M. Goodput is flat near the optimum: Young's interval "
                    "costs < 0.1 point while C/M < 5 %."],
           data={"table": ag})  # fmt: skip


if __name__ == "__main__":
    main()
