"""A user-space delay line: hold every packet routed into a TUN device for a fixed time, then send it on.

    # inside the hub namespace that ``trainsim.testbed.netns`` builds (it starts this for you):
    $ python -m trainsim.testbed.delayline tsabc123d 5.0

Used when the kernel has no ``netem`` qdisc. The hub routes packets arriving from the nodes into the
TUN device (policy rule ``iif <veth> lookup 100``); this process reads each one, waits ``delay_ms``
and writes it back, and the kernel then forwards it by the main table to the destination node. The
delay is constant, so a FIFO keeps packets in order; the link rate is shaped by ``tbf`` after it.
"""

from __future__ import annotations

import collections
import fcntl
import os
import select
import struct
import sys
import time

TUNSETIFF = 0x400454CA  # linux/if_tun.h: _IOW('T', 202, int)
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


def serve(dev: str, delay_ms: float) -> None:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", dev.encode(), IFF_TUN | IFF_NO_PI))
    os.set_blocking(fd, False)
    delay_s = delay_ms / 1e3
    queue: collections.deque[tuple[float, bytes]] = collections.deque()
    while True:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            os.write(fd, queue.popleft()[1])
        timeout_s = None if not queue else max(0.0, queue[0][0] - now)
        # select, not poll: poll's timeout is whole milliseconds rounded up, which held packets due
        # within the next millisecond up to 1 ms late (0.2 ms asked: 1.10 ms waited; select: 0.28 ms)
        if select.select([fd], [], [], timeout_s)[0]:
            now = time.monotonic()
            for _ in range(64):  # drain what is there, stamping arrival times
                try:
                    pkt = os.read(fd, 65536)
                except BlockingIOError:
                    break
                queue.append((now + delay_s, pkt))


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m trainsim.testbed.delayline TUN_DEVICE DELAY_MS", file=sys.stderr)
        return 2
    try:
        serve(argv[0], float(argv[1]))
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
