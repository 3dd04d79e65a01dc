"""The emulated link itself: throughput, host CPU and message times, with TCP's packet size as set
by ``trainsim.testbed.netns`` against the kernel's default 64 KiB packets, side by side.

    python benchmarks/cluster_link.py                      # 1000, 500 and 100 Mbit/s, ~3 min
    python benchmarks/cluster_link.py --rate 1000 --rounds 1

Two namespaces joined by a shaped link (``Netns``). Per rate, in alternating rounds, each packet
setting: one TCP connection sends ``--seconds`` worth of the line rate from node 0 to node 1 (received
rate from the first byte to the last; process CPU of sender and receiver per MB), then messages of
16 KiB, 64 KiB and 256 KiB are sent one at a time, 10 ms apart, each answered by one byte (median
time from the send to the answer, beside the message's time at the line rate). A shaper that cuts
64 KiB packets into frames does that on the host's CPU, which a NIC does in hardware: the gap between
the two settings is the emulation's own cost. Writes the ``link`` section of a record docs/benchmarks/cluster.<name>.json.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainsim.testbed.netns import Netns

sys.path.insert(0, str(Path(__file__).resolve().parent))

PORT = 5611
SIZES = (16 << 10, 64 << 10, 256 << 10)
PINGS = 40

RECEIVER = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1)
c, _ = s.accept(); buf = bytearray(1 << 20); mv = memoryview(buf); n = 0; t0 = t1 = None
while True:
    k = c.recv_into(mv)
    if not k:
        break
    t1 = time.perf_counter(); t0 = t0 or t1; n += k
print(n, t1 - t0, time.process_time())
"""
SENDER = r"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); block = b"x" * (1 << 20)
for _ in range(int(sys.argv[3])):
    c.sendall(block)
c.close(); print(time.process_time())
"""
ECHO = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(1)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
n = int(sys.argv[2]); buf = bytearray(n); mv = memoryview(buf)
while True:
    got = 0
    while got < n:
        k = c.recv_into(mv[got:])
        if not k:
            sys.exit(0)
        got += k
    c.sendall(b"a")
"""
PINGER = r"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
n, reps = int(sys.argv[3]), int(sys.argv[4]); msg = b"x" * n; out = []
for _ in range(reps):
    time.sleep(0.01)
    t = time.perf_counter(); c.sendall(msg); c.recv(1); out.append(time.perf_counter() - t)
print(" ".join(f"{x:.6f}" for x in out))
"""


@dataclass(frozen=True, slots=True)
class LinkRun:
    mbit_s: float
    send_cpu_ms_per_mb: float
    recv_cpu_ms_per_mb: float
    message_ms: dict[int, float]


def measure(net: Netns, rate: float, seconds: float) -> LinkRun:
    """Throughput, CPU per MB and message times on the open network ``net``."""
    mb = max(8, int(rate * seconds / 8))
    recv = net.popen(1, [sys.executable, "-c", RECEIVER, str(PORT)], stdout=subprocess.PIPE, text=True)
    time.sleep(0.4)
    send = net.popen(0, [sys.executable, "-c", SENDER, net.addr(1), str(PORT), str(mb)],
                     stdout=subprocess.PIPE, text=True)  # fmt: skip
    send_cpu = float(send.communicate(timeout=600)[0].split()[0])
    n, secs, recv_cpu = (float(x) for x in recv.communicate(timeout=60)[0].split())
    times = {}
    for i, size in enumerate(SIZES):
        port = PORT + 1 + i
        echo = net.popen(1, [sys.executable, "-c", ECHO, str(port), str(size)])
        time.sleep(0.4)
        ping = net.popen(0, [sys.executable, "-c", PINGER, net.addr(1), str(port), str(size), str(PINGS)],
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
        times[size] = statistics.median(float(x) for x in ping.communicate(timeout=120)[0].split()) * 1e3
        echo.wait(timeout=10)
    return LinkRun(n * 8 / secs / 1e6, send_cpu * 1e3 / mb, recv_cpu * 1e3 / mb, times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, action="append", help="link rate, Mbit/s (repeatable; default 1000, 500, 100)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds of the two settings per rate")
    ap.add_argument("--seconds", type=float, default=2.5, help="seconds of line rate sent per throughput run")
    args = ap.parse_args()
    from results import record_report, stamp
    from trainsim.testbed import netns

    if args.rounds < 1 or args.seconds <= 0:
        print(f"error: --rounds {args.rounds} / --seconds {args.seconds}; expected >= 1 and > 0", file=sys.stderr)
        return 2
    reason = netns.netns_unavailable()
    if reason is not None:
        print(f"cannot shape links here ({reason}); nothing to measure", file=sys.stderr)
        return 1
    head = stamp()
    rates = args.rate or [1000.0, 500.0, 100.0]
    ours = netns.gso_bytes
    settings = {"kernel default (64 KiB)": lambda r, m: netns.GSO_DEFAULT, "trainsim (gso_bytes)": ours}
    results: dict[tuple[float, str], list[LinkRun]] = {}
    t0 = time.monotonic()
    for rate in rates:
        for rnd in range(args.rounds):
            for name, rule in settings.items():
                netns.gso_bytes = rule  # type: ignore[assignment]
                try:
                    with netns.Netns(2, rate_mbit=rate) as net:
                        res = measure(net, rate, args.seconds)
                finally:
                    netns.gso_bytes = ours
                results.setdefault((rate, name), []).append(res)
                print(f"{time.monotonic() - t0:6.1f}s {rate:g} Mbit/s, {name}, round {rnd + 1}: "
                      f"{res.mbit_s:.0f} Mbit/s", file=sys.stderr, flush=True)  # fmt: skip
    lines = [
        "## The emulated link: TCP packet size vs the shaper (2 namespaces, one TCP connection)",
        "",
        head,
        "",
        f"Per rate and setting, {args.rounds} alternating rounds (medians shown): throughput of one connection "
        f"sending {args.seconds:g} s of the line rate; process CPU per MB of sender and receiver; median of "
        f"{PINGS} messages sent one at a time, each answered by one byte (line: the message at the line rate).",
        "",
        "| rate | packets (gso_max_size) | Mbit/s received | sender CPU ms/MB | receiver CPU ms/MB | "
        + " | ".join(f"{s >> 10} KiB message ms (line)" for s in SIZES)
        + " |",
        "|---|---|---:|---:|---:|" + "---:|" * len(SIZES),
    ]
    for (rate, name), rs in results.items():
        gso = settings[name](rate, netns.ETH_MTU)
        msgs = [statistics.median(r.message_ms[s] for r in rs) for s in SIZES]
        lines.append(
            f"| {rate:g} Mbit/s | {name}: {gso:,} B | {statistics.median(r.mbit_s for r in rs):.0f} | "
            f"{statistics.median(r.send_cpu_ms_per_mb for r in rs):.2f} | "
            f"{statistics.median(r.recv_cpu_ms_per_mb for r in rs):.2f} | "
            + " | ".join(f"{m:.2f} ({s * 8 / (rate * 1e3):.2f})" for m, s in zip(msgs, SIZES, strict=True))
            + " |"
        )
    text = "\n".join(lines)
    print(text)
    record_report("cluster", "link", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
