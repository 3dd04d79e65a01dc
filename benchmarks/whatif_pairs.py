"""What-if pairs on this CPU: predict a real run from another real run's trace, then measure it.

    python benchmarks/whatif_pairs.py              # fixed + drawn pairs (~10-15 min on 2 cores)
    python benchmarks/whatif_pairs.py --seed 7     # repeat a draw
    python benchmarks/whatif_pairs.py --runs 3     # three validations in a row (fresh seeds)

Runs ``trainsim validate whatif`` (not quick) and writes its JSON to docs/benchmarks/whatif_pairs.json
(with ``--runs N``: the list of the N documents) and a table per run to docs/benchmarks/whatif.md.
Targets (issue 46): every pair within 10 %, the mean within 5 %, the drawn pairs included, three runs in
a row.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks"


def table(doc: dict[str, Any]) -> list[str]:
    """One validation as markdown: each pair, then the summary and the host's spread."""
    lines = [
        f"`{doc['command']}` (seed {doc['seed']}), predictions written {doc['runs'][0]['predicted_at']}, "
        f"finished {doc.get('finished_at', '-')}",
        "",
        "| pair (* drawn) | first ms | predicted ms | measured ms | error % | trace-only sim ms | sim error % |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["runs"]:
        lines.append(
            f"| {r['label']} | {r['first_measured_ms']:.2f} | {r['predicted_ms']:.2f} | {_f(r['measured_ms'])} "
            f"| {_f(r['error_pct'], '+.1f')} | {r['simulated_ms']:.2f} | {_f(r.get('sim_error_pct'), '+.1f')} |"
        )
    lines += [
        "",
        f"mean |error| **{doc['mean_abs_error_pct']} %**, max **{doc['max_abs_error_pct']} %** (drawn pairs: mean "
        f"{doc['drawn_mean_abs_error_pct']} %; trace-only simulation: mean {doc['sim_only_mean_abs_error_pct']} %).",
        "",
        "Host spread, the same first configuration run twice (first run, then again between the second runs):",
        "",
    ]
    for s in doc["spread"]:
        lines.append(f"- {s['label']}: {s['first_ms']:.2f} -> {_f(s['repeat_ms'])} ms ({_f(s.get('diff_pct'), '+.1f')} %)")
    return lines


def _f(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=None, help="seed of the first run's draw (later runs: seed + i)")
    ap.add_argument("--runs", type=int, default=1, help="validations in a row")
    args = ap.parse_args()
    docs: list[dict[str, Any]] = []
    tmp = DOCS / "whatif_pairs.partial.json"
    for i in range(args.runs):
        tmp.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "trainsim", "validate", "whatif", "--out", str(tmp)]
        if args.seed is not None:
            cmd += ["--seed", str(args.seed + i)]
        t0 = time.monotonic()
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        doc = json.loads(tmp.read_text())
        doc["wall_s"] = round(time.monotonic() - t0, 1)
        docs.append(doc)
    tmp.unlink(missing_ok=True)
    (DOCS / "whatif_pairs.json").write_text(json.dumps(docs[0] if len(docs) == 1 else docs, indent=1) + "\n")
    m = docs[0]["machine"]
    lines = [
        "# What-if pairs: a real run predicted from another real run's trace",
        "",
        f"`python benchmarks/whatif_pairs.py{' --runs ' + str(args.runs) if args.runs > 1 else ''}` on {m['cpu']} "
        f"({m['cores']} cores, torch {m['torch']}, {platform.system()}), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "Each pair: the first configuration runs (traced); the second one's step is predicted from that trace",
        "(what-if + simulator: first run's median step + simulated change) and written to the result file with its",
        "time; only then do the second configurations run. *measured*: the slowest rank's median timed step (no",
        "profiler). Targets: every pair within 10 %, mean within 5 %.",
        "",
    ]
    for i, doc in enumerate(docs):
        lines += [f"## Run {i + 1} ({doc['wall_s']:.0f} s)", "", *table(doc), ""]
    (DOCS / "whatif.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
