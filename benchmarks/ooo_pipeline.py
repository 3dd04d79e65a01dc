"""Pipeline schedules on 2 processes, out of sample: predicted, frozen, measured, and the ranking.

    python benchmarks/ooo_pipeline.py --quick --runs 3   # three `validate pipeline --quick` in a row
    python benchmarks/ooo_pipeline.py                    # one full run: 6 schedules x M = 4, 8, 16 + 4 drawn
    python benchmarks/ooo_pipeline.py --seed 7           # repeat a draw (later runs: seed + i)

Runs ``trainsim validate pipeline`` (``trainsim.validate.pipeline``): the predictions come from a
one-process profile (per layer, and the runtime's cost per compute action) and the machine calibration
only, and are written to the result file before the first real run. Writes
docs/benchmarks/ooo_pipeline.json (every result document, with the command, machine, date and git
revision) and the record docs/benchmarks/ooo.pipeline.json. Targets (issue 47): mean |error| <= 7 %;
every configuration within 10 % or its own spread; the ranking right wherever the measured gap exceeds
both spreads. Wrap it in the machine's run lock when others time things on the same host (``realrun``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from validate_common import record_validations, run_validations


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=1, help="validations in a row")
    ap.add_argument("--seed", type=int, default=None, help="seed of the first run's draw")
    ap.add_argument("--passes", type=int, default=3)
    args = ap.parse_args()
    extra = ["--passes", str(args.passes), *(["--quick"] if args.quick else [])]
    docs = run_validations("pipeline", extra, args.runs, args.seed)
    lines = []
    for d in docs:
        rk, same = d["ranking"], d["ranking_same_m"]
        lines.append(f"seed {d['seed']}: mean |error| **{d['mean_abs_error_pct']} %**, worst **{d['max_abs_error_pct']} %**, "
                     f"within 10 %: {d['within_10pct']}, within own spread: {d['within_spread']}, outside both: "
                     f"{d['outside']} of {d['measured']}; ranking: {len(rk['misranked'])} of {rk['pairs_checked']} "
                     f"pairs misranked (same model, link and M: {len(same['misranked'])} of {same['pairs_checked']})")  # fmt: skip
    record_validations("ooo_pipeline", "Pipeline schedules, out of sample (2 processes, transformer, shaped links)",
                       docs, lines)  # fmt: skip
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
