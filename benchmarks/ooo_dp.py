"""Reverse-first-k data parallelism vs the DDP order on emulated links, out of sample: predicted, frozen, measured.

    python benchmarks/ooo_dp.py --quick --runs 3   # three `validate ooo-dp --quick` in a row (< 3 min each)
    python benchmarks/ooo_dp.py                    # one full run: 3 fixed + 3 drawn cases, 3 passes
    python benchmarks/ooo_dp.py --seed 7           # repeat a draw (later runs: seed + i)

Runs ``trainsim validate ooo-dp`` (``trainsim.validate.ooo``): the predictions come from a one-process
profile and the machine calibration only, and are written to the result file before the first real
run. Writes docs/benchmarks/ooo_dp.json (every result document, with the command, machine, date and git
revision) and the record docs/benchmarks/ooo.dp.json. Targets (issue 47): mean |error| <= 7 %; every
configuration within 10 % or within its own run-to-run spread; the drawn configurations count.
Wrap it in the machine's run lock when others time things on the same host (``realrun``).
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
    docs = run_validations("ooo-dp", extra, args.runs, args.seed)
    lines = []
    for d in docs:
        sp = "; ".join(f"{s['label']}: predicted {s['predicted_speedup']}x, measured {s['measured_speedup']}x"
                       for s in d["speedups"])  # fmt: skip
        lines.append(f"seed {d['seed']}: mean |error| **{d['mean_abs_error_pct']} %**, worst **{d['max_abs_error_pct']} %**, "
                     f"within 10 %: {d['within_10pct']}, within own spread: {d['within_spread']}, outside both: "
                     f"{d['outside']} of {d['measured']}; speed-ups: {sp or 'none'}")  # fmt: skip
    record_validations("ooo_dp", "Data parallel: reverse first-k vs DDP order, out of sample (2 processes, shaped links)",
                       docs, lines)  # fmt: skip
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
