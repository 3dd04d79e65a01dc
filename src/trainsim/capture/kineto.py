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
from typing import Any, NamedTuple

from trainsim.errors import UserError

# Categories as torch.profiler writes them (torch/csrc/profiler/kineto_shim and libkineto's ActivityType).
CPU_CATS = frozenset({"cpu_op", "user_annotation", "python_function", "cpu_instant_event"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver", "mtia_runtime"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "mtia_ccp_events"})
_ID_TYPES = (int, str, float, type(None))
MAX_DUR_US = 7 * 24 * 3600 * 1e6  # a week: anything longer in one event is not a real duration


class Event(NamedTuple):
    """One complete event, times in µs relative to the trace's first event."""

    pos: int  # position in traceEvents, for error messages
    cat: str
    name: str
    pid: int | str
    tid: int | str
    ts: float
    dur: float
    args: dict[str, Any]
    end: float  # ts + dur


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
    complete: list[tuple[int, dict[str, Any]]] = []
    flow_events: list[dict[str, Any]] = []
    for i, e in enumerate(raw_events):
        if type(e) is not dict:
            raise UserError(f"{p}: traceEvents[{i}] is {type(e).__name__}; expected an object")
        ph = e.get("ph")
        if ph == "X":
            complete.append((i, e))
        elif ph == "s" or ph == "f":
            flow_events.append(e)
    if not complete:
        raise UserError(f"{p}: the trace has no complete ('ph': 'X') events; nothing to replay")
    base = math.inf
    for _, e in complete:
        ts = e.get("ts")
        if (type(ts) is float or type(ts) is int) and ts < base:
            base = float(ts)
    events: list[Event] = []
    append = events.append
    missing_corr = False
    need_corr = RUNTIME_CATS | GPU_CATS
    for i, e in complete:
        ts, dur, name = e.get("ts"), e.get("dur", 0.0), e.get("name")
        tts, tdur = type(ts), type(dur)
        if not (tts is float or tts is int) or not math.isfinite(ts):  # type: ignore[arg-type]
            raise UserError(f"{p}: traceEvents[{i}] has ts={ts!r}; expected a number of microseconds")
        if not (tdur is float or tdur is int) or not math.isfinite(dur):
            raise UserError(f"{p}: traceEvents[{i}] has dur={dur!r}; expected a number of microseconds")
        if dur < 0 or dur > MAX_DUR_US:
            raise UserError(f"{p}: traceEvents[{i}] ({name!r}) has dur={dur}; expected 0 to {MAX_DUR_US:.0f} us")
        if type(name) is not str:
            raise UserError(f"{p}: traceEvents[{i}] has name={name!r}; expected a string")
        args = e.get("args")
        if args is None:
            args = {}
        elif type(args) is not dict:
            raise UserError(f"{p}: traceEvents[{i}] has args of type {type(args).__name__}; expected an object")
        cat = e.get("cat", "")
        if type(cat) is not str:
            raise UserError(f"{p}: traceEvents[{i}] has cat={cat!r}; expected a string")
        pid, tid = e.get("pid", 0), e.get("tid", 0)
        if type(pid) not in _ID_TYPES or type(tid) not in _ID_TYPES:
            raise UserError(f"{p}: traceEvents[{i}] has pid={pid!r}, tid={tid!r}; expected numbers or strings")
        if cat in need_corr and "correlation" not in args:
            missing_corr = True
        t = ts - base  # type: ignore[operator]
        append(Event(i, cat, name, pid, tid, t, float(dur), args, t + dur))
    if missing_corr and flow_events:
        events = _correlate_by_flows(events, flow_events, base)
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    return Trace(str(p), events, base, meta)


def _correlate_by_flows(events: list[Event], flow_events: list[dict[str, Any]], base: float) -> list[Event]:
    """Give runtime calls and GPU tasks without a ``correlation`` arg the id of their ``ac2g`` flow."""
    flows: dict[tuple[Any, Any, float], int] = {}
    for f in flow_events:
        fid, ts = f.get("id"), f.get("ts")
        if f.get("cat") == "ac2g" and type(fid) is int and (type(ts) is float or type(ts) is int):
            flows[(f.get("pid"), f.get("tid"), float(ts) - base)] = fid
    out = []
    for e in events:
        if (e.cat in RUNTIME_CATS or e.cat in GPU_CATS) and "correlation" not in e.args:
            fid = flows.get((e.pid, e.tid, e.ts))
            if fid is not None:
                e = e._replace(args={**e.args, "correlation": fid})
        out.append(e)
    return out
