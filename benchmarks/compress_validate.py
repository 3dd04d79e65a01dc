"""Compressed-DDP step time, out of sample: predicted from a one-process profile, the codec timed in
one process and the machine calibration, frozen, then measured on real 2-process runs on shaped links.

    python benchmarks/compress_validate.py                  # mlp at 20, 100, 1000 Mbit/s + 5 drawn, 3 passes
    python benchmarks/compress_validate.py --quick          # 2 fixed + 2 drawn, 3 passes (< 3 min)
    python benchmarks/compress_validate.py --seed 7         # repeat a draw
    python benchmarks/compress_validate.py --result R.json  # record a finished `trainsim validate compress --out R.json`

Runs ``trainsim validate compress`` and writes its result, stamped with this command, the machine, the
date and the git revision, to docs/benchmarks/compress_validate.json (``--quick``: compress_validate_quick.json), and the headline record
docs/benchmarks/compress.validate.json (``--quick``: compress.validate_quick.json). Targets (issue 47): as ``cluster_dp_validate.py``.
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
    cli = ["compress", *(["--quick"] if args.quick else []), "--passes", str(args.passes)]
    cli += ["--seed", str(args.seed)] if args.seed is not None else []
    doc = run_validation_cli(cli, args.result)
    quick = bool(doc.get("quick"))
    write_result(doc, "compress_validate" + ("_quick" if quick else "") + ".json", area="compress", name="validate" + ("_quick" if quick else ""),
                 title="Compressed-DDP step time, out of sample: frozen predictions vs real 2-process runs")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
