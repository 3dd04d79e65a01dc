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
LAUNCHES = 5  # realtime runs: sizes up to 256 KiB measured in this many launches, the median kept


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--sched", choices=("default", "realtime", "both"), default="both",
                    help="scheduling class of the ranks' threads (see `trainsim calibrate --realtime`)")
    args = ap.parse_args()
    from trainsim.cluster.calibrate import ROUNDS, calibrate, default_sizes
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
        "Fit: `t = a + max(floor + b0 (size - floor / b), b * size)` (`trainsim.cluster.calibrate.fit_knee`)",
        f"on one calibration run (per size the median of {ROUNDS} interleaved rounds' means, at least 0.3 s of",
        "all-reduces in all, relative least squares); check: a second, independent run with new processes,",
        "read the same way. Error = (model - measured) / measured.",
        "",
        "Two ways to run the ranks' threads: *default* (the kernel's fair scheduler, anywhere) and *realtime*",
        "(`trainsim calibrate --realtime --pin`: FIFO class, so a gloo thread woken by a message runs at once",
        "instead of queueing behind the other rank's thread until the next 4 ms tick, and each rank's threads",
        "on a core of their own, so that where they land does not change the small all-reduces' latency from",
        "one launch to the next; the two emulated machines share this VM's 2 cores, real machines do not).",
        f"Each has its own fit and check run; in the realtime runs the sizes up to 256 KiB are measured in {LAUNCHES}",
        "launches of new processes each and the median launch kept (`--launches`).",
        "",
    ]
    scheds = ("default", "realtime") if args.sched == "both" else (args.sched,)
    worst_all = dict.fromkeys(scheds, 0.0)
    for rate, delay, max_bytes in QUICK_LINKS if args.quick else LINKS:
        sizes = default_sizes(max_bytes)
        reps = 3 if args.quick else args.reps
        runs = {}
        with Netns(2, rate_mbit=rate, delay_ms=delay) as net:
            for sched in scheds:
                rt = sched == "realtime"
                print(f"{time.monotonic() - t0:7.1f}s {sched}: fit on {rate:g} Mbit/s +{delay:g} ms", flush=True)
                fit = calibrate(world=2, rate_mbit=rate, delay_ms=delay, sizes=sizes, reps=reps, net=net, realtime=rt,
                                pin=rt, launches=LAUNCHES if rt else 1)  # fmt: skip
                print(f"{time.monotonic() - t0:7.1f}s {sched}: check run", flush=True)
                check = calibrate(world=2, rate_mbit=rate, delay_ms=delay, sizes=sizes, reps=reps, net=net,
                                  realtime=rt, pin=rt, launches=LAUNCHES if rt else 1)  # fmt: skip
                for note in fit.notes + check.notes:
                    print(f"note: {note}", file=sys.stderr)
                runs[sched] = (fit, check)
        lines += [f"#### {rate:g} Mbit/s, +{delay:g} ms one-way", ""]
        for sched, (fit, _) in runs.items():
            lines.append(
                f"Fit ({sched}): a = {fit.a_us:.1f} us, floor = {fit.floor_us:.1f} us, b = "
                f"{fit.b_us_per_byte * 1e3:.4f} us/KB, b0 = {fit.b0_us_per_byte * 1e3:.4f} us/KB (ring model: alpha {fit.link.latency_us:.1f} us/step, "
                f"bandwidth {fit.link.bw_gbps * 8e3:.1f} Mbit/s).  "
            )
        head_cols = " | ".join(f"{s}: fit run us | {s}: check run us | {s}: model us | {s}: error" for s in runs)
        lines += ["", f"| size | {head_cols} |", "|---:|" + "---:|" * (4 * len(runs))]
        worst = dict.fromkeys(runs, 0.0)
        for i, s in enumerate(sizes):
            cells = []
            for sched, (fit, check) in runs.items():
                m_fit, m, p = fit.measured_us[i], check.measured_us[i], fit.predict_us(s)
                err = 100 * (p - m) / m
                worst[sched] = max(worst[sched], abs(err))
                cells.append(f"{m_fit:,.0f} | {m:,.0f} | {p:,.0f} | {err:+.1f}%")
            lines.append(f"| {_size(s)} | " + " | ".join(cells) + " |")
        for sched in runs:
            worst_all[sched] = max(worst_all[sched], worst[sched])
        lines += ["", "Worst |error| on this link: " + ", ".join(f"{k} {v:.1f}%" for k, v in worst.items()) + ".", ""]
    lines += ["**Worst |error| over all links and sizes: "
              + ", ".join(f"{k} {v:.1f}%" for k, v in worst_all.items()) + "** (target: 5 %).",
              f"Wall time {time.monotonic() - t0:.0f} s."]  # fmt: skip
    write_section("collectives" + ("_quick" if args.quick else ""), "\n".join(lines))
    print(f"worst |error| {worst_all} -> {DOC}")
    return 0


def _size(n: int) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:g} {unit}"
    return f"{n} B"


if __name__ == "__main__":
    sys.exit(main())
