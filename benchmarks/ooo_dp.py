"""Reverse-first-k data parallelism vs the DDP order on emulated links: measured speed-up and prediction error.

    python benchmarks/ooo_dp.py           # 3 cases (transformer 1000/500 Mbit/s, cnn 100 Mbit/s) x 3 passes, ~8 min
    python benchmarks/ooo_dp.py --quick   # 1 case, < 2 min

Runs ``trainsim.validate.ooo.run_ooo_validation``: profile one process, shape 2 namespaces, calibrate
gloo, predict k=0 and the simulator's best k, measure both (and torch DDP as a reference). Writes the
``ooo_dp`` section of docs/benchmarks/ooo.md and the raw JSON beside it. Targets (issue 5): a measured
speed-up over DDP; predicted step time within 10 % for both orders.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ooo_common import DOC, stamp, write_section


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--passes", type=int, default=3, help="runs per order (median); 1 with --quick")
    args = ap.parse_args()
    from trainsim.validate.ooo import FULL, QUICK, link_label, run_ooo_validation

    head = stamp()
    t0 = time.monotonic()
    out = run_ooo_validation(
        QUICK if args.quick else FULL,
        steps=args.steps,
        warmup=3,
        passes=1 if args.quick else args.passes,
        log=lambda s: print(f"{time.monotonic() - t0:6.1f}s {s}", file=sys.stderr),
    )
    DOC.with_name("ooo_dp.json").write_text(json.dumps(out, indent=1))
    lines = [
        "## Data parallel: reverse first-k vs DDP order (2 processes, shaped links)",
        "",
        head,
        "Each order and torch DDP run once per pass, the passes one after the other. *Measured* is the median",
        "over the passes of each pass's time per step over its window; *passes* lists them. A measured",
        "speed-up is the median of the passes' side-by-side ratios. *Predicted* is the median over the",
        "passes of a prediction from the host's speed read during each pass's runs (the plain loop alone",
        "against its speed at profile time: the median of 40 steps timed in step with the profile's, one",
        "before each of its steps; and together against alone) with the runtime's extra work per",
        "order read in one-rank groups before the runs, k = 0 and the chosen k side by side in each process",
        "(`validate.ooo.side_by_side_terms`; the search read k = 0 and every layer). *Before the runs*: the",
        "prediction from the terms read before the runs alone (which chose k); reported, not used.",
        "",
        "| model | link | order | k | predicted ms | measured ms (per step over the window) | error "
        "| before the runs ms (error) | host speed, co-run factor per pass | passes ms (predicted / measured) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in out["runs"]:
        c = r["config"]
        lines.append(
            f"| {c['model']} | {link_label(c['rate_mbit'], c['delay_ms'])} | {c['mode']} | {c['k']} | "
            f"{r['predicted_ms']:.1f} | {r['measured_ms']:.1f} | {r['error_pct']:+.1f}% | "
            f"{r['predicted_before_runs_ms']:.1f} "
            f"({100 * (r['predicted_before_runs_ms'] - r['measured_ms']) / r['measured_ms']:+.1f}%) | "
            + " / ".join(f"{h['host_speed']:.2f}, {h['corun_factor']:.2f}" for h in r["passes_host_reading"]) + " | "
            + ", ".join(f"{p:.1f} / {m:.1f}" for p, m in zip(r["passes_predicted_ms"], r["passes_ms"], strict=True)) + " |"
        )
    lines += [
        "",
        "| model | link | k | predicted speed-up | before the runs | measured speed-up | vs torch DDP (measured) | torch DDP ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in out["speedups"]:
        lines.append(
            f"| {s['model']} | {link_label(s['rate_mbit'], s['delay_ms'])} | {s['k']} | "
            f"{s['predicted_speedup']}x | {s['predicted_speedup_before_runs']}x | {s['measured_speedup']}x | "
            f"{s['measured_speedup_vs_torch_ddp']}x | "
            f"{s['torch_ddp_ms']:.1f} |"
        )
    lines += [
        "",
        f"Mean |error| {out['mean_abs_error_pct']}%, max |error| {out['max_abs_error_pct']}% "
        f"(target: within 10 %); from the terms read before the runs: {_before(out['runs'])}. Raw: `docs/benchmarks/ooo_dp.json`.",
    ]
    lines += [f"Note: {n}" for n in out["notes"]]
    print(write_section("ooo_dp", "\n".join(lines)))
    return 0


def _before(runs: list[dict]) -> str:
    errs = [abs(100 * (r["predicted_before_runs_ms"] - r["measured_ms"]) / r["measured_ms"]) for r in runs]
    return f"mean {sum(errs) / len(errs):.2f}%, max {max(errs):.2f}%"


if __name__ == "__main__":
    sys.exit(main())
