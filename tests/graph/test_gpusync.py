"""GPU waits (graph/gpusync.py) on hand-made traces: each kind of wait, and the what-if answer it implies."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.tracefactory import TraceMaker
from trainsim.graph.build import load_trace
from trainsim.graph.gpusync import fixed_wait_ms_per_step
from trainsim.graph.ir import EdgeKind, TaskGraph
from trainsim.simulate.engine import simulate
from trainsim.transform.primitives import scale, select


def _one(g: TaskGraph, name: str) -> int:
    ids = np.flatnonzero(select(g, name=name))
    assert ids.size == 1, (name, ids)
    return int(ids[0])


def _step_us(g: TaskGraph, name: str | None = None, factor: float = 1.0) -> float:
    if name is not None:
        g = scale(g, select(g, name=name), factor)
    return float(simulate(g).step_ms[0] * 1e3)


def _start(g: TaskGraph, task: str, name: str | None = None, factor: float = 1.0) -> float:
    t = _one(g, task)
    if name is not None:
        g = scale(g, select(g, name=name), factor)
    return float(simulate(g).start_us[t])


def _sync_event(t: TraceMaker, stream: int) -> None:
    """Kineto's ``cuda_sync`` record of the latest runtime call (it names the stream waited for)."""
    call = t.events[-1]
    t.events.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": stream, "ts": call["ts"],
                     "dur": call["dur"], "args": {"correlation": call["args"]["correlation"], "stream": stream,
                                                  "device": 0, "cuda_sync_kind": "Stream Sync"}})  # fmt: skip


def test_blocking_copy_waits_for_its_copy_behind_a_long_kernel(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 300)
    t.launch(2, 4, 8, 1, name="cudaMemcpyAsync", kernel="Memcpy HtoD (Pinned -> Device)", cat="gpu_memcpy")
    t.launch(10, 5, 17, 200, kernel="long_kernel")
    # the DtoH call waits 197 us for the stream to drain, then for its copy; returns 3 us after it
    t.launch(
        20, 202, 217, 2, name="cudaMemcpyAsync", kernel="Memcpy DtoH (Device -> Pageable)", cat="gpu_memcpy"
    )
    t.cpu("aten::item", 225, 10)
    g = load_trace(t.write(tmp_path / "t.json"))
    calls = np.flatnonzero(select(g, kind="runtime", name="cudaMemcpyAsync"))
    assert sorted(g.dur_us[calls].tolist()) == [4.0, 4.0]  # the blocking call keeps the cost of the short one
    wait = int(np.flatnonzero(select(g, kind="sync"))[0])
    assert g.dur_us[wait] == pytest.approx(3.0)  # the return latency after the copy
    assert _step_us(g) == pytest.approx(300)
    # halving the kernel lets the copy, and the CPU after it, go 100 us earlier
    assert _step_us(g, "long_kernel", 0.5) == pytest.approx(200)
    assert _start(g, "aten::item", "long_kernel", 0.5) == pytest.approx(125)


def test_device_synchronize_that_did_not_block_still_waits(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 200)
    t.launch(10, 5, 17, 100, kernel="k")
    t.cpu("aten::foo", 15, 135)  # the CPU is busy past the kernel's end: the sync does not block
    t.runtime("cudaDeviceSynchronize", 150, 5)
    t.cpu("aten::item", 155, 10)
    g = load_trace(t.write(tmp_path / "t.json"))
    sync = _one(g, "cudaDeviceSynchronize")
    assert sync in g.edge_dst[(g.edge_kind == EdgeKind.SYNC) & (g.edge_src == _one(g, "^k$"))]
    assert _step_us(g) == pytest.approx(200)
    # the kernel twice as long ends at 217: the sync runs 217..222 and everything after moves by 67 us
    assert _start(g, "aten::item", "^k$", 2.0) == pytest.approx(222)
    assert _step_us(g, "^k$", 2.0) == pytest.approx(267)


def _two_streams(t: TraceMaker) -> None:
    t.launch(10, 5, 17, 300, kernel="k7", stream=7)
    t.launch(20, 5, 27, 100, kernel="k9", stream=9)


def test_stream_synchronize_waits_for_its_stream_only(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 400)
    _two_streams(t)
    t.cpu("aten::foo", 25, 125)
    t.runtime("cudaStreamSynchronize", 150, 3)  # did not block; Kineto's cuda_sync event names stream 9
    _sync_event(t, 9)
    t.cpu("aten::item", 153, 10)
    g = load_trace(t.write(tmp_path / "t.json"))
    assert _step_us(g) == pytest.approx(400)
    assert _start(g, "aten::item", "k9", 2.0) == pytest.approx(227 + 3)  # k9 ends at 227, the sync takes 3
    assert _start(g, "aten::item", "k7", 2.0) == pytest.approx(153)  # the other stream is not waited for


def test_stream_synchronize_without_a_stream_uses_the_stream_it_waited_for(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 400)
    _two_streams(t)
    t.runtime("cudaStreamSynchronize", 30, 100)  # blocked until k9 ended (127), returned 3 us later
    t.cpu("aten::item", 130, 10)
    g = load_trace(t.write(tmp_path / "t.json"))
    assert _step_us(g) == pytest.approx(400)
    assert _start(g, "aten::item", "k9", 0.5) == pytest.approx(77 + 3)
    assert _start(g, "aten::item", "k7", 2.0) == pytest.approx(130)


def test_stream_synchronize_without_any_evidence_waits_for_every_stream(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 400)
    _two_streams(t)
    t.cpu("aten::foo", 25, 325)
    t.runtime("cudaStreamSynchronize", 350, 3)  # did not block, no cuda_sync event: it may be either stream
    t.cpu("aten::item", 353, 10)
    g = load_trace(t.write(tmp_path / "t.json"))
    assert _step_us(g) == pytest.approx(400)
    assert _start(g, "aten::item", "k7", 2.0) == pytest.approx(617 + 3)


def test_event_synchronize_waits_for_the_recorded_task(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 400)
    t.launch(10, 5, 17, 200, kernel="recorded")
    t.runtime("cudaEventRecord", 15, 2)
    t.launch(17, 3, 22, 300, kernel="later", stream=9)  # launched after the record: not waited for
    t.cpu("aten::foo", 20, 280)
    t.runtime("cudaEventSynchronize", 300, 2)  # did not block
    t.cpu("aten::item", 302, 8)
    g = load_trace(t.write(tmp_path / "t.json"))
    assert _step_us(g) == pytest.approx(400)
    assert _start(g, "aten::item", "recorded", 2.0) == pytest.approx(417 + 2)
    assert _step_us(g, "recorded", 2.0) == pytest.approx(517)
    assert _start(g, "aten::item", "later", 2.0) == pytest.approx(302)


def test_event_query_spin_waits_for_the_recorded_task(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 200)
    t.launch(10, 5, 17, 100, kernel="k")
    t.runtime("cudaEventRecord", 15, 2)
    for ts in range(20, 121, 10):  # polls until the kernel is done (the last one, at 120, sees it)
        t.runtime("cudaEventQuery", ts, 1)
    t.cpu("aten::item", 121, 10)
    t.runtime("cudaEventQuery", 170, 1)  # a lone query (the caching allocator's): no dependency
    g = load_trace(t.write(tmp_path / "t.json"))
    assert _step_us(g) == pytest.approx(200)
    # the kernel ends at 217: the last poll runs then, the earlier polls keep their time
    assert _start(g, "aten::item", "^k$", 2.0) == pytest.approx(218)
    queries = np.flatnonzero(select(g, name="cudaEventQuery"))
    waiting = set(g.edge_dst[g.edge_kind == EdgeKind.SYNC].tolist()) & set(queries.tolist())
    assert len(waiting) == 1


def _queue_trace(kernel_us: float, q: int = 100, n: int = 300) -> tuple[TraceMaker, float]:
    """Launches into a queue of depth ``q``: the model's own rules, written out as a trace.

    Each launch call takes 2 us, after 3 us of CPU work, but not before the kernel launched ``q``
    launches earlier has finished; a kernel starts 1 us after its launch call, or when the stream is
    free. A device synchronize at the end; the step ends 10 us after it.
    """
    t = TraceMaker()
    cpu, k_end = 10.0, [-np.inf]
    ends: list[float] = []
    for k in range(n):
        t.cpu("aten::op", cpu, 3.0)
        t0 = cpu + 3.0
        t1 = max(t0, ends[k - q] if k >= q else -np.inf) + 2.0
        ks = max(k_end[-1], t1 + 1.0)
        t.launch(t0, t1 - t0, ks, kernel_us)
        ends.append(ks + kernel_us)
        k_end.append(ks + kernel_us)
        cpu = t1
    sync_end = max(cpu, k_end[-1]) + 2.0
    t.runtime("cudaDeviceSynchronize", cpu, sync_end - cpu)
    t.step(1, 0, sync_end + 10.0)
    return t, sync_end + 10.0


def test_full_launch_queue_makes_the_cpu_wait_for_the_gpu(tmp_path: Path) -> None:
    t, step = _queue_trace(100.0)
    g = load_trace(t.write(tmp_path / "t.json"))
    assert _step_us(g) == pytest.approx(step)
    calls = select(g, name="cudaLaunchKernel")
    assert (g.dur_us[calls] == 2.0).all()  # blocked calls keep only their cost
    for factor in (0.5, 2.0):
        _, expected = _queue_trace(100.0 * factor)
        assert _step_us(g, "gemm_kernel", factor) == pytest.approx(expected)
    # the GPU-bound step moves by the change in GPU time (300 kernels x 50 us), give or take the tail
    assert _step_us(g) - _step_us(g, "gemm_kernel", 0.5) > 0.9 * 300 * 50


def test_allocator_call_that_blocked_is_a_device_synchronize(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 300)
    t.runtime("cudaMalloc", 2, 3)  # did not block: no dependency
    t.launch(10, 5, 17, 200, kernel="k")
    t.runtime("cudaFree", 20, 200)  # blocked until k ended (217), returned 3 us later
    t.cpu("aten::item", 220, 10)
    g = load_trace(t.write(tmp_path / "t.json"))
    assert _one(g, "cudaMalloc") not in g.edge_dst
    assert _step_us(g) == pytest.approx(300)
    assert _start(g, "aten::item", "^k$", 0.5) == pytest.approx(120)
    assert _step_us(g, "^k$", 0.5) == pytest.approx(200)


def test_kernel_on_an_idle_gpu_starts_a_launch_latency_after_its_launch(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 200)
    t.launch(10, 5, 20, 10, kernel="k1")  # starts 5 us after its launch returned: the launch latency
    t.cpu("aten::cpu_work", 15, 85)
    t.launch(100, 5, 110, 10, kernel="k2")
    t.cpu("aten::item", 105, 10)
    g = load_trace(t.write(tmp_path / "t.json"))
    assert _step_us(g) == pytest.approx(200)
    assert _start(g, "k2") == pytest.approx(110)
    # the CPU work twice as fast: k2's launch ends at 57.5 + 5 and k2 starts 5 us after, not at once
    assert _start(g, "k2", "aten::cpu_work", 0.5) == pytest.approx(57.5 + 5 + 5)


def test_fixed_waits_report_untraced_time_and_unattributed_calls(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 1000)
    t.cpu("aten::a", 0, 100)  # then 300 us that no operator covers
    for ts in (400, 402, 404):
        t.runtime("cudaGetDevice", ts, 1)
    t.runtime("cudaGetDevice", 406, 201)  # 200 us longer than usual, waiting for nobody knows what
    t.cpu("aten::b", 610, 390)
    g = load_trace(t.write(tmp_path / "t.json"))
    got = fixed_wait_ms_per_step(g)
    assert got["untraced time on the step thread"] == pytest.approx(0.3)
    assert got["runtime call, blocking not attributed"] == pytest.approx(0.2)
    assert got["wait after release"] == 0.0
