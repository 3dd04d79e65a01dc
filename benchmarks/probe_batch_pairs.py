"""Probe: CNN batch pairs at several factors, up and down, through ``trainsim validate whatif``'s machinery.

    realrun .venv/bin/python benchmarks/probe_batch_pairs.py --passes 2 --out out/batch_pairs.json

Each pair's first run is traced and predicts the second (``validate.whatif.predict_pair``; frozen before
any second run, ``run_pairs``). Beside each prediction, ``without_work_split_ms``: the same trace's
prediction when every memory-bound operator takes the op-cost table's ratio whatever its traced time
(``opcost.shape_ratio`` without ``traced_us``, the model before the per-element work split), so both
models are read against the same measured runs.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

PAIRS = ((32, 96), (32, 64), (32, 48), (16, 24), (48, 144), (32, 16), (32, 8), (16, 4))


def main() -> None:
    from trainsim.transform import opcost
    from trainsim.validate import whatif as vw

    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--out", default="out/batch_pairs.json")
    ap.add_argument("--pairs", default=",".join(f"{a}:{b}" for a, b in PAIRS), help="old:new batch sizes")
    a = ap.parse_args()
    s = vw._steps(False)
    pairs = [vw._batch("cnn", int(x), int(y), False, **s)
             for x, y in (p.split(":") for p in a.pairs.split(","))]  # fmt: skip

    def predictor(pair: vw.Pair, first: dict[str, Any]) -> dict[str, Any]:
        new = vw.predict_pair(pair, first)
        orig = opcost.shape_ratio
        opcost.shape_ratio = lambda *args, traced_us=None, **kw: orig(*args, **kw)  # type: ignore[assignment]
        try:
            old = vw.predict_pair(pair, first)
        finally:
            opcost.shape_ratio = orig  # type: ignore[assignment]
        return {**new, "without_work_split_ms": old["predicted_ms"], "without_work_split_ratio": old["simulated_ratio"]}

    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = vw.run_pairs(pairs, out, seed=0, predictor=predictor, passes=a.passes,
                       log=lambda m: print(time.strftime("%H:%M:%S", time.gmtime()), m, flush=True),
                       meta={"command": "benchmarks/probe_batch_pairs.py"})  # fmt: skip
    print(f"{'pair':52s} {'first':>7s} {'pred':>7s} {'meas':>7s} {'err %':>6s} {'old pred':>8s} {'old err':>7s} passes")
    for r in doc["runs"]:
        old = r["without_work_split_ms"]
        print(f"{r['label']:52s} {r['first_measured_ms']:7.2f} {r['predicted_ms']:7.2f} {r['measured_ms']:7.2f} "
              f"{r['error_pct']:+6.1f} {old:8.2f} {100 * (old - r['measured_ms']) / r['measured_ms']:+7.1f} "
              f"{', '.join(f'{x:.1f}' for x in r['measured_passes_ms'])}")  # fmt: skip


if __name__ == "__main__":
    main()
