"""Make a large real-shaped GPU trace by tiling a real one: ``python benchmarks/core_make_big_trace.py OUT [N]``.

The V100 trace in ../shared/traces (69k events, 5 steps) is repeated N times (default 3, ~206k events)
back to back in time, with step numbers, correlation ids and flow ids renumbered so that every copy
is a distinct, consistent set of steps. Used by ``core_ingest.py``.
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

import orjson

SRC = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "v100_single_rank0.json.gz"


def tile(n: int) -> dict:
    doc = orjson.loads(gzip.decompress(SRC.read_bytes()))
    events = doc["traceEvents"]
    xs = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), int | float)]
    t0 = min(e["ts"] for e in xs)
    span = max(e["ts"] + e.get("dur", 0) for e in xs) - t0 + 1000.0
    out = [e for e in events if e.get("ph") == "M"]
    for k in range(n):
        shift = k * span
        for e in events:
            if e.get("ph") == "M":
                continue
            e2 = dict(e)
            if isinstance(e2.get("ts"), int | float):
                e2["ts"] = e2["ts"] + shift
            if e2.get("name", "").startswith("ProfilerStep#"):
                e2["name"] = f"ProfilerStep#{int(e2['name'].split('#')[1]) + 10 * k}"
            if "id" in e2 and isinstance(e2["id"], int):
                e2["id"] = e2["id"] + k * 10_000_000
            args = e2.get("args")
            if isinstance(args, dict) and isinstance(args.get("correlation"), int):
                e2["args"] = {**args, "correlation": args["correlation"] + k * 10_000_000}
            out.append(e2)
    return {**{k: v for k, v in doc.items() if k != "traceEvents"}, "traceEvents": out}


if __name__ == "__main__":
    dest = Path(sys.argv[1])
    doc = tile(int(sys.argv[2]) if len(sys.argv) > 2 else 3)
    dest.write_bytes(gzip.compress(orjson.dumps(doc), 5))
    print(f"{dest}: {len(doc['traceEvents'])} events")
