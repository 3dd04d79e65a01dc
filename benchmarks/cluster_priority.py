"""Effect of priority scheduling (P3, ByteScheduler) on communication-bound data parallelism.

    python benchmarks/cluster_priority.py          # ~3 min
    python benchmarks/cluster_priority.py --quick  # 1 configuration

For each configuration: predicted and measured step time of real torch DDP, of the P3-style runtime
(input-first 1 MiB slices, per-layer updates) and of the same runtime with ByteScheduler's partitions
and credit (4 MB partitions, 4 in flight; ``trainsim.validate.dp_worker``). Writes the ``priority``
section of a record docs/benchmarks/cluster.<name>.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import DIR, record_report, stamp

CASES = (("cnn", 100.0, 0.0), ("cnn", 20.0, 10.0), ("mlp", 200.0, 0.0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import tempfile

    from trainsim.testbed.machine import load_machine
    from trainsim.validate.dp import RUN_MODES, RunConfig, run_validation

    mcal, cal_path = load_machine()
    head = stamp()
    t0 = time.monotonic()
    cases = CASES[:1] if args.quick else CASES
    lines = [
        "## Priority scheduling on communication-bound configurations (2 processes)",
        "",
        head,
        "Out of sample: every prediction frozen before the runs (``validate.protocol``), three interleaved passes.",
        "",
        "| model | link | DDP predicted | DDP measured | P3 predicted | P3 measured | ByteScheduler predicted |"
        " ByteScheduler measured | speed-up over DDP, predicted / measured: P3, ByteScheduler |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for model, rate, delay in cases:
        configs = [RunConfig(model=model, rate_mbit=rate, delay_ms=delay, mode=m) for m in RUN_MODES]
        with tempfile.TemporaryDirectory() as tmp:
            doc = run_validation(configs, Path(tmp) / "priority.json", seed=0, mcal=mcal,
                                 meta={"calibration": mcal.describe(cal_path)},
                                 log=lambda s: print(f"{time.monotonic() - t0:7.1f}s {s}", flush=True))  # fmt: skip
        ddp, p3, bs = doc["runs"]
        link = f"{rate:g} Mbit/s" + (f" +{delay:g} ms" if delay else "")
        ups = ", ".join(f"{ddp['predicted_ms'] / r['predicted_ms']:.2f}x / {ddp['measured_ms'] / r['measured_ms']:.2f}x"
                        for r in (p3, bs))  # fmt: skip
        lines.append(
            f"| {model} | {link} | {ddp['predicted_ms']:.1f} | {ddp['measured_ms']:.1f} | {p3['predicted_ms']:.1f} | "
            f"{p3['measured_ms']:.1f} | {bs['predicted_ms']:.1f} | {bs['measured_ms']:.1f} | {ups} |"
        )
    lines += [
        "",
        "P3 here: 1 MiB slices, the input-most ready slice first, each layer's update just before its next",
        "forward (so communication of the input layers overlaps the next forward), one slice at a time after a",
        "round that agrees on it. ByteScheduler: the same runtime with 4 MB partitions and up to 4 in flight,",
        "its rounds on a process group of their own. Speed-up = DDP / the mode, from the same run.",
        f"Wall time {time.monotonic() - t0:.0f} s.",
    ]
    record_report("cluster", "priority" + ("_quick" if args.quick else ""), "\n".join(lines))
    print(f"-> {DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
