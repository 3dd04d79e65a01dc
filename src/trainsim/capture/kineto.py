"""Read a Kineto / Chrome-trace JSON file (``.json`` or ``.json.gz``) written by ``torch.profiler``.

    >>> from trainsim.capture.kineto import read_trace
    >>> tr = read_trace("rank0.json.gz")      # doctest: +SKIP
    >>> len(tr.events), tr.base_us             # doctest: +SKIP

Only complete events (``ph == "X"``) matter for the graph; flow events (``ac2g``) are used to recover
a CUDA correlation id when an event lacks the ``correlation`` argument. Every problem with the input
raises ``UserError`` naming the file and, for a bad event, its index and field.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import math
import re
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import compress, repeat
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from trainsim.errors import UserError

# Categories as torch.profiler writes them (torch/csrc/profiler/kineto_shim and libkineto's ActivityType).
CPU_CATS = frozenset({"cpu_op", "user_annotation", "python_function", "cpu_instant_event"})
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime", "driver", "mtia_runtime"})
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "mtia_ccp_events"})
_ID_TYPES = (int, str, float, type(None))
STEP_RX = re.compile(r"^ProfilerStep#(\d+)$")
"""the annotation ``torch.profiler`` puts around each step; group 1 is the step number"""
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


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many acyclic containers.

    Parsing a 200k-event trace allocates millions of dicts, lists and tuples and none of them form
    cycles; the collector's repeated full passes over them took about half the load time (measured in
    docs/benchmarks.md; dPRO's notes report the same, ~20% at 1M tasks).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def read_trace(path: str | Path) -> Trace:
    """Parse ``path`` and check every complete event; raise ``UserError`` on bad input."""
    with paused_gc():
        return _read_trace(Path(path))


def _read_trace(p: Path) -> Trace:
    doc = _load_json(p)
    if isinstance(doc, list):  # the bare-array form of the Chrome trace format
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or "traceEvents" not in doc:
        raise UserError(f"{p}: no 'traceEvents' key; expected a Kineto/Chrome trace object")
    raw_events = doc["traceEvents"]
    if not isinstance(raw_events, list):
        raise UserError(f"{p}: 'traceEvents' is {type(raw_events).__name__}; expected a list of events")
    if not set(map(type, raw_events)) <= {dict}:
        i = next(i for i, e in enumerate(raw_events) if type(e) is not dict)
        raise UserError(f"{p}: traceEvents[{i}] is {type(raw_events[i]).__name__}; expected an object")
    empty: dict[str, Any] = {}  # the args of every event that has none
    (pos, ts, dur, names, cats, args, pids, tids), field_types = _complete_columns(raw_events, empty)
    if not pos:
        raise UserError(f"{p}: the trace has no complete ('ph': 'X') events; nothing to replay")
    # Columns first, checked as wholes; an event-by-event pass runs only to word an error.
    numbers, ids, arg_types = {int, float}, set(_ID_TYPES), {dict, type(None)}
    ok = all(
        t_ts in numbers and t_dur in numbers and t_name is str and t_cat is str and t_args in arg_types
        and t_pid in ids and t_tid in ids
        for t_ts, t_dur, t_name, t_cat, t_args, t_pid, t_tid in field_types
    )  # fmt: skip
    ts_a = np.asarray(ts, np.float64) if ok else None
    dur_a = np.asarray(dur, np.float64) if ok else None
    if not ok or ts_a is None or dur_a is None or not (
        np.isfinite(ts_a).all() and np.isfinite(dur_a).all() and (dur_a >= 0).all() and (dur_a <= MAX_DUR_US).all()
    ):
        _explain(p, pos, [raw_events[i] for i in pos])
        raise AssertionError("a column check failed but no event was found at fault")  # pragma: no cover
    base = float(ts_a.min())
    rel_a = ts_a - base
    rel = rel_a.tolist()
    end = (rel_a + dur_a).tolist()
    durf = dur_a.tolist()
    if any(k[4] is type(None) for k in field_types):  # "args": null
        args = [a if a is not None else empty for a in args]
    # tuple.__new__ fills each Event from its row in C; Event(...) would run a Python frame per event
    rows = zip(pos, cats, names, pids, tids, rel, durf, args, end, strict=True)
    events: list[Event] = list(map(tuple.__new__, repeat(Event), rows))
    need_corr = RUNTIME_CATS | GPU_CATS
    corr_args = compress(args, map(need_corr.__contains__, cats))
    if not all(map(dict.__contains__, corr_args, repeat("correlation"))):
        flow_events = [e for e in raw_events if e.get("ph") in ("s", "f")]
        if flow_events:
            events = _correlate_by_flows(events, flow_events, base)
    meta = {k: v for k, v in doc.items() if k != "traceEvents"}
    return Trace(str(p), events, base, meta)


def _complete_columns(
    raw_events: list[dict[str, Any]], empty: dict[str, Any]
) -> tuple[tuple[list[Any], ...], set[tuple[type, ...]]]:
    """``(pos, ts, dur, name, cat, args, pid, tid)`` of the complete events, unchecked, with the defaults
    of a missing field (``args``: ``empty``), and the distinct rows of those fields' types (ts to tid).

    One pass that reads an event's fields together: the event dicts lie all over memory, and a
    ``map(dict.get, ...)`` pass per field, then one ``set(map(type, ...))`` per column, took twice as
    long on a 200k-event trace (cache misses). Names and categories come out as one string object per
    distinct text (categories: the interned literals of this module), so that every later lookup of a
    name compares pointers rather than characters, and the parsed copies are freed with the JSON.
    """
    cols: tuple[list[Any], ...] = tuple([] for _ in range(8))
    add_pos, add_ts, add_dur, add_name, add_cat, add_args, add_pid, add_tid = (c.append for c in cols)
    field_types: set[tuple[type, ...]] = set()
    add_field_types = field_types.add
    canonical: dict[str, str] = {}
    same_name = canonical.setdefault
    intern = sys.intern
    for i, e in enumerate(raw_events):
        get = e.get
        if get("ph") == "X":
            ts, dur, name, cat = get("ts"), get("dur", 0.0), get("name"), get("cat", "")
            args, pid, tid = get("args", empty), get("pid", 0), get("tid", 0)
            add_field_types((type(ts), type(dur), type(name), type(cat), type(args), type(pid), type(tid)))
            add_pos(i)
            add_ts(ts)
            add_dur(dur)
            add_name(same_name(name, name) if type(name) is str else name)
            add_cat(intern(cat) if type(cat) is str else cat)
            add_args(args)
            add_pid(pid)
            add_tid(tid)
    return cols, field_types


def _explain(p: Path, pos: list[int], complete: list[dict[str, Any]]) -> None:
    """Raise the ``UserError`` for the first bad complete event."""
    for i, e in zip(pos, complete, strict=True):
        ts: Any = e.get("ts")
        dur: Any = e.get("dur", 0.0)
        name = e.get("name")
        if type(ts) not in (int, float) or not math.isfinite(ts):
            raise UserError(f"{p}: traceEvents[{i}] has ts={ts!r}; expected a number of microseconds")
        if type(dur) not in (int, float) or not math.isfinite(dur):
            raise UserError(f"{p}: traceEvents[{i}] has dur={dur!r}; expected a number of microseconds")
        if dur < 0 or dur > MAX_DUR_US:
            raise UserError(f"{p}: traceEvents[{i}] ({name!r}) has dur={dur}; expected 0 to {MAX_DUR_US:.0f} us")
        if type(name) is not str:
            raise UserError(f"{p}: traceEvents[{i}] has name={name!r}; expected a string")
        args = e.get("args")
        if args is not None and type(args) is not dict:
            raise UserError(f"{p}: traceEvents[{i}] has args of type {type(args).__name__}; expected an object")
        cat = e.get("cat", "")
        if type(cat) is not str:
            raise UserError(f"{p}: traceEvents[{i}] has cat={cat!r}; expected a string")
        pid, tid = e.get("pid", 0), e.get("tid", 0)
        if type(pid) not in _ID_TYPES or type(tid) not in _ID_TYPES:
            raise UserError(f"{p}: traceEvents[{i}] has pid={pid!r}, tid={tid!r}; expected numbers or strings")


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
