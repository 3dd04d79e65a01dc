"""Probe: CNN batch pairs at several factors, up and down, through ``trainsim validate whatif``'s machinery.

    realrun .venv/bin/python benchmarks/probe_batch_pairs.py --passes 2 --out out/batch_pairs.json

Each pair's first run is traced and predicts the second (``validate.whatif.predict_pair``; frozen before
any second run, ``run_pairs``). Beside each prediction, on the same trace: ``added_ms``, the first step
plus the simulated change (the ``add`` anchor) instead of times the ratio, and ``traced_minus_timed_ms``,
the first trace's replayed step less the first run's timed step (what the profiler added to the first
configuration, as far as one run's noise lets it be read); all read against the same measured runs.
Pairs: cnn's batch sizes ``old:new``, ``MODEL:old:new``, or ``fused:MODEL`` (Adam's loop -> fused).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

PAIRS = ((32, 96), (32, 64), (32, 48), (16, 24), (48, 144), (32, 16), (32, 8), (16, 4))


def main() -> None:
    from trainsim.validate import whatif as vw

    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--out", default="out/batch_pairs.json")
    ap.add_argument("--pairs", default=",".join(f"{a}:{b}" for a, b in PAIRS),
                    help="cnn's old:new batch sizes, or MODEL:old:new, or fused:MODEL")  # fmt: skip
    a = ap.parse_args()
    s = vw._steps(False)
    pairs = [vw._fused(x[1], False, **s) if x[0] == "fused" else
             vw._batch(x[0], int(x[1]), int(x[2]), False, **s) if len(x) == 3 else
             vw._batch("cnn", int(x[0]), int(x[1]), False, **s)
             for x in (p.split(":") for p in a.pairs.split(","))]  # fmt: skip
    fused: dict[str, Any] = {}
    if any(p.kind == "fused-adam" for p in pairs):
        from trainsim.testbed.machine import load_machine, with_fused_kernel

        cal, cal_path = load_machine(log=print)
        fused = {"fused_gbps": with_fused_kernel(cal, cal_path, log=print).fused_kernel_gbps}

    def predictor(pair: vw.Pair, first: dict[str, Any]) -> dict[str, Any]:
        r = vw.predict_pair(pair, first, **fused)
        replayed = r["simulated_ms"] / r["simulated_ratio"][0]
        return {**r, "added_ms": round(r["first_measured_ms"] + r["simulated_change_ms"][0], 3),
                "traced_minus_timed_ms": round(replayed - r["first_measured_ms"], 3)}  # fmt: skip

    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = vw.run_pairs(pairs, out, seed=0, predictor=predictor, passes=a.passes,
                       log=lambda m: print(time.strftime("%H:%M:%S", time.gmtime()), m, flush=True),
                       meta={"command": "benchmarks/probe_batch_pairs.py"})  # fmt: skip
    print(f"{'pair':52s} {'first':>7s} {'tr-tm':>6s} {'ratio':>7s} {'meas':>7s} {'err %':>6s} {'added':>7s} {'err %':>6s} "
          "passes")  # fmt: skip
    for r in doc["runs"]:
        m = r["measured_ms"]
        print(f"{r['label'][:52]:52s} {r['first_measured_ms']:7.2f} {r['traced_minus_timed_ms']:+6.2f} "
              f"{r['predicted_ms']:7.2f} {m:7.2f} {r['error_pct']:+6.1f} {r['added_ms']:7.2f} "
              f"{100 * (r['added_ms'] - m) / m:+6.1f} {', '.join(f'{x:.1f}' for x in r['measured_passes_ms'])}")  # fmt: skip


if __name__ == "__main__":
    main()
