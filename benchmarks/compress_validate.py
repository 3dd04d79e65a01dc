"""Compressed vs plain DDP on emulated links: measured step time and the what-if's prediction.

    .venv/bin/python benchmarks/compress_validate.py            # mlp at 20, 100, 1000 Mbit/s, 3 passes; ~20 min
    .venv/bin/python benchmarks/compress_validate.py --quick    # 2 runs at 100 Mbit/s

Runs ``trainsim.validate.compress.run_harness`` (the code behind ``trainsim validate compress``): 2
network namespaces (or loopback without the rights), the link calibrated with gloo all-reduces, each
algorithm's encode/decode calibrated on this machine with one thread, predictions from the what-if
(``trainsim.transform.compression``) and the simulator, measurements from real 2-process DDP with
``trainsim.run.hooks.compress_hook``. Also checks the SeCoPa plan against "compress everything" (same
PS scheme) and "compress nothing" (plain DDP) per link. Writes docs/benchmarks/compress.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compress_convergence import OUT_MD, write_section
from trainsim.validate.compress import FULL, MAX_STEP_FACTOR, MEASURE_S, QUICK, run_harness, summary

STEPS, WARMUP = 20, 2
"""measured and warm-up steps per run (``run_harness``)"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--passes", type=int, default=3, help="runs per configuration (median); 1 with --quick")
    ap.add_argument("--pin", action="store_true", help="each rank of the measured runs on a core of its own")
    args = ap.parse_args()
    passes = 1 if args.quick else args.passes
    t0 = time.perf_counter()
    configs = list(QUICK if args.quick else FULL)
    results, notes = run_harness(
        configs, steps=STEPS, warmup=WARMUP, reps=3, log=lambda s: print(s, file=sys.stderr, flush=True), passes=passes,
        pin=args.pin,
    )
    out = summary(results)
    lines = [
        "## Speed on emulated links: predicted vs measured step time (validate compress)",
        "",
        f"Command: `.venv/bin/python benchmarks/compress_validate.py{' --quick' if args.quick else ''}{' --pin' if args.pin else ''}` "
        "(same as `trainsim validate compress --json`)  ",
        f"Machine: {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}; "
        f"date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; total {time.perf_counter() - t0:.0f} s.  ",
        f"Model mlp (zoo, ~2.4M parameters), 2 gloo processes with one thread each, batch 32, median of {STEPS} steps "
        f"(a third of them where a step takes over a second; more where {STEPS} would take under "
        f"{MEASURE_S:g} s, as many as fill it, at most {MAX_STEP_FACTOR * STEPS}: "
        f"`validate.compress.measured_steps`) after {WARMUP} warm-up steps. Prediction: one-process profile + calibrated link + calibrated codec -> what-if "
        f"-> simulator. Each configuration is predicted and run once per pass ({passes} passes, every "
        "configuration of a link once per pass, the co-run factor read during each run, its measured steps "
        "interleaved with the plain loop); the table "
        "gives the medians over the passes, *passes* each pass's predicted / measured ms, *waiting for a core* "
        "the ranks' training threads' run-queue wait per measured step (the larger rank's; "
        "`run.ranks.ThreadClock`): time the emulation's shared host, not the modelled cluster, put in. "
        + ("Each rank of the measured runs on a core of its own (`--pin`, `trainsim.run.ranks.pin_to_core`; the "
           "calibrations unpinned)." if args.pin else "Ranks not pinned to cores."),
        "",
        "| run | predicted ms | measured ms | error % | waiting for a core ms/step | ranks in sync | passes (predicted / measured ms) |",
        "|---|---:|---:|---:|---:|:-:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.config.label()} | {r.predicted_ms:.1f} | {r.measured_ms:.1f} | {r.error_pct:+.1f} | "
            f"{'-' if r.run_queue_ms is None else f'{r.run_queue_ms:.1f}'} | {'yes' if r.params_in_sync else 'NO'} | "
            + ", ".join(f"{a:.1f} / {b:.1f}" for a, b in r.passes) + " |"
        )
    lines.append(f"\nmean |error| {out['mean_abs_error_pct']}%, max |error| {out['max_abs_error_pct']}%.")
    by_rate: dict[float | None, dict[str, float]] = {}
    for r in results:
        c = r.config
        kind = (
            "plan" if c.plan else ("all" if c.scheme == "ps" else ("none" if c.algorithm == "none" else ""))
        )
        if kind:
            by_rate.setdefault(c.rate_mbit, {})[kind] = r.measured_ms
    checks = []
    for rate, m in by_rate.items():
        if {"plan", "all", "none"} <= set(m):
            ok = m["plan"] <= max(m["all"], m["none"])
            checks.append(
                f"- {rate:g} Mbit/s: SeCoPa plan {m['plan']:.1f} ms, compress everything (PS) {m['all']:.1f} ms, "
                f"compress nothing {m['none']:.1f} ms: plan {'not slower than both' if ok else 'SLOWER THAN BOTH'}"
            )
    if checks:
        lines += ["", "SeCoPa plan vs compress everything / nothing (measured):", *checks]
    if notes:
        lines += ["", *[f"Note: {n}" for n in notes]]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(OUT_MD, "validate", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
