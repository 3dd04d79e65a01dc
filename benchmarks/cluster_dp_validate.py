"""Data-parallel step time, out of sample: predicted from a one-process profile and the machine
calibration, frozen, then measured on real 2-process DDP / P3 runs on shaped links.

    python benchmarks/cluster_dp_validate.py                  # the full set + 6 drawn, 3 passes (~20-30 min)
    python benchmarks/cluster_dp_validate.py --quick          # 2 fixed + 2 drawn, 3 passes (< 3 min)
    python benchmarks/cluster_dp_validate.py --seed 7         # repeat a draw
    python benchmarks/cluster_dp_validate.py --result R.json  # record a finished `trainsim validate dp --out R.json`

Runs ``trainsim validate dp`` (``trainsim.validate.dp``, the protocol of ``trainsim.validate.protocol``)
and writes its result, stamped with this command, the machine, the date and the git revision, to
docs/benchmarks/cluster_dp.json (``--quick``: cluster_dp_quick.json), and the headline record docs/benchmarks/cluster.dp_validate.json (``--quick``: cluster.dp_validate_quick.json).
Targets (issue 47): mean |error| <= 5 %; every configuration within 10 % or within its own run-to-run
spread, at most one in ten outside both; the drawn configurations count.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from validate_common import run_validation_cli, write_result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--result", default=None, help="record this finished result file instead of running")
    args = ap.parse_args()
    cli = ["dp", *(["--quick"] if args.quick else []), "--passes", str(args.passes)]
    cli += ["--seed", str(args.seed)] if args.seed is not None else []
    doc = run_validation_cli(cli, args.result)
    quick = bool(doc.get("quick"))
    write_result(doc, "cluster_dp" + ("_quick" if quick else "") + ".json", area="cluster", name="dp_validate" + ("_quick" if quick else ""),
                 title="Data-parallel step time, out of sample: frozen predictions vs real 2-process runs")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
