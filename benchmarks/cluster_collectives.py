"""Calibrated all-reduce model vs measured gloo all-reduce on shaped links, 1 KiB .. 256 MiB.

    python benchmarks/cluster_collectives.py           # 3 links, ~5 min
    python benchmarks/cluster_collectives.py --quick   # 1 link, up to 4 MiB, < 1 min

For each link: open the 2-namespace network, run ``trainsim.cluster.calibrate`` once to *fit* the
alpha-beta constants, then measure again (a separate run, new processes) and report the fitted model's
error against the second measurement, so the figure is out-of-sample. Writes the ``collectives``
section of docs/benchmarks/cluster.md. Target (issue 3): within 5 % from 1 KB to 256 MB.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_common import DOC, command_line, stamp, write_section

# (rate Mbit/s, one-way delay ms, largest message): 256 MiB where a message takes seconds, not minutes
LINKS = ((1000.0, 0.0, 256 << 20), (100.0, 0.0, 64 << 20), (100.0, 5.0, 64 << 20))
QUICK_LINKS = ((200.0, 0.0, 4 << 20),)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    from trainsim.cluster.calibrate import calibrate, default_sizes
    from trainsim.validate.netns import Netns, netns_unavailable

    reason = netns_unavailable()
    if reason is not None:
        print(f"cannot shape links here ({reason}); nothing to measure", file=sys.stderr)
        return 1
    head = stamp(command_line())
    t0 = time.monotonic()
    lines = [
        "## Calibrated gloo all-reduce model vs measurement (2 processes, shaped links)",
        "",
        head,
        "Fit: `t = a + max(floor, b * size)` (`trainsim.cluster.calibrate.fit_model`) on one calibration run",
        "(mean of the repetitions per size, at least 0.3 s of all-reduces each, relative least squares); check: a second, independent run with",
        "new processes. Error = (model - measured) / measured.",
        "",
    ]
    worst_all = 0.0
    for rate, delay, max_bytes in QUICK_LINKS if args.quick else LINKS:
        sizes = default_sizes(max_bytes)
        reps = 3 if args.quick else args.reps
        with Netns(2, rate_mbit=rate, delay_ms=delay) as net:
            print(f"{time.monotonic() - t0:7.1f}s fit on {rate:g} Mbit/s +{delay:g} ms", flush=True)
            fit = calibrate(world=2, rate_mbit=rate, delay_ms=delay, sizes=sizes, reps=reps, net=net)
            print(f"{time.monotonic() - t0:7.1f}s check run", flush=True)
            check = calibrate(world=2, rate_mbit=rate, delay_ms=delay, sizes=sizes, reps=reps, net=net)
        lines += [
            f"### {rate:g} Mbit/s, +{delay:g} ms one-way",
            "",
            f"Fit: a = {fit.a_us:.1f} us, floor = {fit.floor_us:.1f} us, b = {fit.b_us_per_byte * 1e3:.4f} us/KB "
            f"(ring model: alpha {fit.link.latency_us:.1f} us/step, bandwidth {fit.link.bw_gbps * 8e3:.1f} Mbit/s).",
            "",
            "| size | fit-run measured us | check-run measured us | model us | error vs check |",
            "|---:|---:|---:|---:|---:|",
        ]
        worst = 0.0
        for s, m_fit, m in zip(sizes, fit.measured_us, check.measured_us, strict=True):
            p = fit.predict_us(s)
            err = 100 * (p - m) / m
            worst = max(worst, abs(err))
            lines.append(f"| {_size(s)} | {m_fit:,.0f} | {m:,.0f} | {p:,.0f} | {err:+.1f}% |")
        worst_all = max(worst_all, worst)
        lines += ["", f"Worst |error| on this link: {worst:.1f}%.", ""]
    lines += [f"**Worst |error| over all links and sizes: {worst_all:.1f}%** (target: 5 %).",
              f"Wall time {time.monotonic() - t0:.0f} s."]  # fmt: skip
    write_section("collectives" + ("_quick" if args.quick else ""), "\n".join(lines))
    print(f"worst |error| {worst_all:.1f}% -> {DOC}")
    return 0


def _size(n: int) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:g} {unit}"
    return f"{n} B"


if __name__ == "__main__":
    sys.exit(main())
