"""Reading traces: bad input gives one UserError naming the file and the problem; fuzzed input never crashes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainsim.capture.kineto import read_trace
from trainsim.errors import UserError
from trainsim.graph.build import build_graph, load_trace


def _write(tmp_path: Path, data: bytes, name: str = "t.json") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def _ev(**kw: object) -> dict[str, object]:
    e: dict[str, object] = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}
    e.update(kw)
    return e


@pytest.mark.parametrize(
    ("data", "name", "message"),
    [
        (b"{not json", "t.json", "not valid JSON"),
        (gzip.compress(b'{"traceEvents": []}')[:-9], "t.json.gz", "truncated gzip"),
        (b'{"events": []}', "t.json", "no 'traceEvents'"),
        (b'{"traceEvents": {}}', "t.json", "expected a list"),
        (b'{"traceEvents": []}', "t.json", "no complete"),
        (json.dumps({"traceEvents": [_ev(ts=None)]}).encode(), "t.json", "ts=None"),
        (json.dumps({"traceEvents": [_ev(dur=-3)]}).encode(), "t.json", "dur=-3"),
        (json.dumps({"traceEvents": [_ev(dur=1e20)]}).encode(), "t.json", "dur=1e"),
        (json.dumps({"traceEvents": [_ev(name=7)]}).encode(), "t.json", "name=7"),
        (json.dumps({"traceEvents": [_ev(args=[1])]}).encode(), "t.json", "args of type list"),
        (json.dumps({"traceEvents": [3]}).encode(), "t.json", r"traceEvents\[0\] is int"),
    ],
)
def test_bad_input_is_one_line_user_error(tmp_path: Path, data: bytes, name: str, message: str) -> None:
    p = _write(tmp_path, data, name)
    with pytest.raises(UserError, match=message) as info:
        read_trace(p)
    assert str(p) in str(info.value) and "\n" not in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        read_trace(tmp_path / "nope.json")


def test_flow_events_recover_correlation(tmp_path: Path) -> None:
    events = [
        _ev(name="ProfilerStep#1", cat="user_annotation", ts=0, dur=100),
        _ev(name="cudaLaunchKernel", cat="cuda_runtime", ts=10, dur=5, args={}),
        _ev(name="gemm", cat="kernel", pid=0, tid=7, ts=15, dur=20, args={"stream": 7, "device": 0}),
        {"ph": "s", "cat": "ac2g", "id": 9, "pid": 1, "tid": 1, "ts": 10, "name": "ac2g"},
        {"ph": "f", "cat": "ac2g", "id": 9, "pid": 0, "tid": 7, "ts": 15, "name": "ac2g", "bp": "e"},
    ]
    g = load_trace(_write(tmp_path, json.dumps({"traceEvents": events}).encode()))
    assert g.n_edges == 1  # the launch edge, found through the flow


_scalar = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=True),
                    st.text(max_size=5))  # fmt: skip
_event = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.sampled_from(["X", "s", "f", "M", "i", 3]),
        "cat": st.one_of(st.sampled_from(["cpu_op", "kernel", "cuda_runtime", "user_annotation", "gpu_memcpy"]), _scalar),
        "name": st.one_of(st.sampled_from(["ProfilerStep#1", "aten::mm", "cudaDeviceSynchronize", "nccl:x"]), _scalar),
        "pid": st.one_of(_scalar, st.lists(st.integers(), max_size=2)), "tid": _scalar, "ts": _scalar, "dur": _scalar, "id": _scalar,
        "args": st.one_of(_scalar, st.dictionaries(st.sampled_from(["correlation", "stream", "device", "bytes",
                                                                     "Sequence number", "Input Dims"]), _scalar)),
    },
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.lists(_event, max_size=12).map(lambda evs: {"traceEvents": evs}), _scalar, st.lists(_scalar)))
def test_fuzz_reader_only_raises_user_error(tmp_path: Path, doc: object) -> None:
    p = tmp_path / "fuzz.json"
    try:
        p.write_text(json.dumps(doc))
    except ValueError:
        return
    try:
        build_graph(read_trace(p))
    except UserError:
        pass


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200))
def test_fuzz_bytes(tmp_path: Path, data: bytes) -> None:
    p = tmp_path / "fuzz.json.gz"
    p.write_bytes(b"\x1f\x8b" + data)
    with pytest.raises(UserError):
        read_trace(p)
