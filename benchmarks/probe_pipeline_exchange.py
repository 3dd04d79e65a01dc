"""The runtime's own work per SEND and RECV action on a generic two-rank exchange, by message size.

    realrun .venv/bin/python benchmarks/probe_pipeline_exchange.py --sizes 16000 262144 1048576

What ``validate pipeline``'s profile step measures (``validate.pipeline.runtime_p2p_us``, at the model's
median activation size), printed per size: each action kind's median work outside the posting call
(``book``) and the posting call itself (``post``), per rank and the mean of the two, in µs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[16_000, 262_144, 1 << 20], help="message bytes")
    ap.add_argument("--messages", type=int, default=120)
    ap.add_argument("--no-pin", action="store_true", help="let the ranks migrate between cores")
    a = ap.parse_args()

    from trainsim.run.pipeline import ExchangeConfig, run_exchange

    for size in a.sizes:
        t0 = time.perf_counter()
        got = run_exchange(ExchangeConfig(size_bytes=size, messages=a.messages, pin=not a.no_pin))
        per = " ".join(
            f"rank{r['rank']}: send book {statistics.median(r['send']['book_us']):.1f} post "
            f"{statistics.median(r['send']['post_us']):.1f}, recv book {statistics.median(r['recv']['book_us']):.1f} "
            f"post {statistics.median(r['recv']['post_us']):.1f};"
            for r in got["ranks"]
        )
        print(f"{size} B: send book {got['send_book_us']:.1f} post {got['send_post_us']:.1f} us, recv book "
              f"{got['recv_book_us']:.1f} post {got['recv_post_us']:.1f} us ({per} {time.perf_counter() - t0:.1f} s)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
