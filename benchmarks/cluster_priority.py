"""Effect of priority scheduling (P3, ByteScheduler) on communication-bound data parallelism.

    python benchmarks/cluster_priority.py          # ~3 min
    python benchmarks/cluster_priority.py --quick  # 1 configuration

For each configuration: predicted step time with plain DDP buckets, with P3 (input-first slices,
per-layer updates) and with ByteScheduler (4 MB partitions, credit 4), and the measured step time of
real DDP and of the real P3-style runtime. Writes the ``priority`` section of docs/benchmarks/cluster.md.
ByteScheduler has no runtime here, so it is predicted only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_common import DOC, command_line, stamp, write_section

CASES = (("cnn", 100.0, 0.0), ("cnn", 20.0, 10.0), ("mlp", 200.0, 0.0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    from trainsim.cluster.calibrate import calibrate, default_sizes
    from trainsim.validate.dp import RunConfig, _profile, predict_ms, run_harness

    head = stamp(command_line())
    t0 = time.monotonic()
    cases = CASES[:1] if args.quick else CASES
    lines = [
        "## Priority scheduling on communication-bound configurations (2 processes)",
        "",
        head,
        "| model | link | DDP predicted | DDP measured | P3 predicted | P3 measured | ByteScheduler predicted |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    import tempfile

    from trainsim.validate.netns import Netns

    for model, rate, delay in cases:
        configs = [RunConfig(model=model, rate_mbit=rate, delay_ms=delay, mode=m) for m in ("ddp", "p3")]
        results, _ = run_harness(configs, steps=4 if args.quick else 6, warmup=3, reps=3,
                                 log=lambda s: print(f"{time.monotonic() - t0:7.1f}s {s}", flush=True))  # fmt: skip
        ddp, p3 = results
        with tempfile.TemporaryDirectory() as tmp, Netns(2, rate_mbit=rate, delay_ms=delay) as net:
            prof = _profile(model, Path(tmp), steps=6)
            sizes = sorted({*default_sizes(4_000_000), 4_000_000})
            cal = calibrate(world=2, rate_mbit=rate, delay_ms=delay, sizes=sizes, reps=3, net=net)
        bs = predict_ms(prof, RunConfig(model=model, rate_mbit=rate, delay_ms=delay, mode="ddp"), cal.predict_us,
                        mode="bytescheduler")  # fmt: skip
        link = f"{rate:g} Mbit/s" + (f" +{delay:g} ms" if delay else "")
        lines.append(
            f"| {model} | {link} | {ddp.predicted_ms:.1f} | {ddp.measured_ms:.1f} | {p3.predicted_ms:.1f} | "
            f"{p3.measured_ms:.1f} | {bs:.1f} |"
        )
    lines += [
        "",
        "P3 here: 1 MiB slices, the input-most ready slice first, each layer's update just before its next",
        "forward (so communication of the input layers overlaps the next forward). Speed-up = DDP / P3.",
        f"Wall time {time.monotonic() - t0:.0f} s.",
    ]
    write_section("priority" + ("_quick" if args.quick else ""), "\n".join(lines))
    print(f"-> {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
