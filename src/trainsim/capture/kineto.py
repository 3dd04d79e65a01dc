"""Read a Kineto / Chrome-trace JSON file (``.json`` or ``.json.gz``) written by ``torch.profiler``.

    >>> from trainsim.capture.kineto import read_trace
    >>> tr = read_trace("rank0.json.gz")      # doctest: +SKIP
    >>> len(tr.events), tr.base_us             # doctest: +SKIP

Only complete events (``ph == "X"``) matter for the graph; flow events (``ac2g``) are used to recover
a CUDA correlation id when an event lacks the ``correlation`` argument. Every problem with the input
raises ``UserError`` naming the file and, for a bad event, its index and field.
"""

from __future__ import annotations

import gzip
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsim.errors import UserError

# Categories as torch.profiler writes them (torch/csrc/profiler/kineto_shim and libkineto's ActivityType).
CPU_CATS = frozenset({"cpu_op", "user_annotation", "python_function", "cpu_instant_event"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver", "mtia_runtime"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "mtia_ccp_events"})
MAX_DUR_US = 7 * 24 * 3600 * 1e6  # a week: anything longer in one event is not a real duration


@dataclass(frozen=True, slots=True)
class Event:
    """One complete event, times in µs relative to the trace's first event."""

    index: int  # position in traceEvents, for error messages
    cat: str
    name: str
    pid: int | str
    tid: int | str
    ts: float
    dur: float
    args: dict[str, Any]

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass(frozen=True, slots=True)
class Trace:
    path: str
    events: list[Event]
    base_us: float  # absolute timestamp of the first event
    meta: dict[str, Any]


def _load_json(path: Path) -> Any:
    import orjson

    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; expected a Kineto trace (.json or .json.gz)") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory; expected a Kineto trace file") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise UserError(f"{path}: corrupt or truncated gzip data ({exc})") from None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc})") from None


def read_trace(path: str | Path) -> Trace:
    """Parse ``path`` and check every complete event; raise ``UserError`` on bad input."""
    p = Path(path)
    doc = _load_json(p)
    if isinstance(doc, list):  # the bare-array form of the Chrome trace format
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or "traceEvents" not in doc:
        raise UserError(f"{p}: no 'traceEvents' key; expected a Kineto/Chrome trace object")
    raw_events = doc["traceEvents"]
    if not isinstance(raw_events, list):
        raise UserError(f"{p}: 'traceEvents' is {type(raw_events).__name__}; expected a list of events")
    flows: dict[tuple[Any, Any, float], int] = {}
    complete: list[tuple[int, dict[str, Any]]] = []
    for i, e in enumerate(raw_events):
        if not isinstance(e, dict):
            raise UserError(f"{p}: traceEvents[{i}] is {type(e).__name__}; expected an object")
        ph = e.get("ph")
        if ph == "X":
            complete.append((i, e))
        elif ph in ("s", "f") and e.get("cat") == "ac2g":
            fid, ts = e.get("id"), e.get("ts")
            if isinstance(fid, int) and isinstance(ts, int | float):
                flows[(e.get("pid"), e.get("tid"), float(ts))] = fid
    if not complete:
        raise UserError(f"{p}: the trace has no complete ('ph': 'X') events; nothing to replay")
    base = math.inf
    for _, e in complete:
        ts = e.get("ts")
        if isinstance(ts, int | float) and not isinstance(ts, bool) and ts < base:
            base = float(ts)
    events: list[Event] = []
    for i, e in complete:
        ts, dur, name = e.get("ts"), e.get("dur", 0.0), e.get("name")
        if not isinstance(ts, int | float) or isinstance(ts, bool) or not math.isfinite(ts):
            raise UserError(f"{p}: traceEvents[{i}] has ts={ts!r}; expected a number of microseconds")
        if not isinstance(dur, int | float) or isinstance(dur, bool) or not math.isfinite(dur):
            raise UserError(f"{p}: traceEvents[{i}] has dur={dur!r}; expected a number of microseconds")
        if dur < 0 or dur > MAX_DUR_US:
            raise UserError(f"{p}: traceEvents[{i}] ({name!r}) has dur={dur}; expected 0 to {MAX_DUR_US:.0f} us")
        if not isinstance(name, str):
            raise UserError(f"{p}: traceEvents[{i}] has name={name!r}; expected a string")
        args = e.get("args")
        if args is None:
            args = {}
        elif not isinstance(args, dict):
            raise UserError(f"{p}: traceEvents[{i}] has args of type {type(args).__name__}; expected an object")
        cat = e.get("cat", "")
        if not isinstance(cat, str):
            raise UserError(f"{p}: traceEvents[{i}] has cat={cat!r}; expected a string")
        pid, tid = e.get("pid", 0), e.get("tid", 0)
        if (cat in RUNTIME_CATS or cat in GPU_CATS) and "correlation" not in args:
            fid = flows.get((pid, tid, float(ts)))
            if fid is not None:
                args = {**args, "correlation": fid}
        events.append(Event(i, cat, name, pid, tid, float(ts) - base, float(dur), args))
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    return Trace(str(p), events, base, meta)
