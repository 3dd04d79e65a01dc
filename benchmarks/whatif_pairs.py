"""What-if pairs on this CPU: predict a real run from another real run's trace, then measure it.

    python benchmarks/whatif_pairs.py              # fixed + drawn pairs (~10-15 min on 2 cores)
    python benchmarks/whatif_pairs.py --seed 7     # repeat a draw
    python benchmarks/whatif_pairs.py --runs 3     # three validations in a row (fresh seeds)
    python benchmarks/whatif_pairs.py --quick --runs 3

Runs ``trainsim validate whatif`` (not quick) and writes its JSON to docs/benchmarks/whatif_pairs.json
(with ``--runs N``: the list of the N documents) and its tables as the record docs/benchmarks/whatif.pairs.json.
Targets (issue 46): every pair within 10 %, the mean within 5 %, the drawn pairs included, three runs in
a row.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks"


def table(doc: dict[str, Any]) -> list[str]:
    """One validation as markdown: each pair, then the summary."""
    lines = [
        f"`{doc['command']}` (seed {doc['seed']}), predictions frozen {doc['predictions_frozen_at']}, real runs "
        f"from {doc['runs_started_at']}, finished {doc.get('finished_at', '-')}",
        "",
        "| pair (* drawn) | first ms | predicted ms | measured ms (passes) | spread % | error % | within | trace-only "
        "sim error % |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in doc["runs"]:
        passes = ", ".join(f"{x:.1f}" for x in r["measured_passes_ms"])
        lines.append(
            f"| {r['label']} | {r['first_measured_ms']:.2f} | {r['predicted_ms']:.2f} | {_f(r['measured_ms'])} "
            f"({passes}) | {_f(r['spread_pct'], '.1f')} | {_f(r['error_pct'], '+.1f')} | {r['within'] or 'no'} "
            f"| {_f(r.get('sim_error_pct'), '+.1f')} |"
        )
    lines += [
        "",
        f"mean |error| **{doc['mean_abs_error_pct']} %**, max **{doc['max_abs_error_pct']} %** (drawn pairs: mean "
        f"{doc['held_out_mean_abs_error_pct']} %; trace-only simulation: mean {doc['sim_only_mean_abs_error_pct']} %); "
        f"within 10 %: {doc['within_10pct']}, within their own spread: {doc['within_spread']}, outside both: "
        f"{doc['outside']}.",
    ]
    return lines


def _f(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=None, help="seed of the first run's draw (later runs: seed + i)")
    ap.add_argument("--runs", type=int, default=1, help="validations in a row")
    ap.add_argument("--quick", action="store_true", help="validate whatif --quick")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results import record_report
    from validate_common import run_validations

    docs = run_validations("whatif", ["--quick"] * args.quick, args.runs, args.seed)
    (DOCS / "whatif_pairs.json").write_text(json.dumps(docs[0] if len(docs) == 1 else docs, indent=1) + "\n")
    m = docs[0]["machine"]
    lines = [
        "# What-if pairs: a real run predicted from another real run's trace",
        "",
        f"`python benchmarks/whatif_pairs.py{' --quick' if args.quick else ''}"
        f"{' --runs ' + str(args.runs) if args.runs > 1 else ''}` on {m['cpu']} "
        f"({m['cores']} cores, torch {m['torch']}, {platform.system()}), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "Each pair: the first configuration runs (traced); the second one's step is predicted from that trace",
        "(what-if + simulator: first run's median step + simulated change) and written to the result file with its",
        "time; only then do the second configurations run, three passes interleaved. *measured*: the slowest rank's",
        "median timed step (no profiler), the median of the passes. Targets: every pair within 10 %, mean within 5 %.",
        "",
    ]
    for i, doc in enumerate(docs):
        lines += [f"## Run {i + 1} ({doc['wall_s']:.0f} s)", "", *table(doc), ""]
    record_report("whatif", "pairs", "\n".join(lines), raw=["whatif_pairs.json"])  # then: python3 dev.py results
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
