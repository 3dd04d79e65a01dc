"""Waits between CPU threads (graph/cpuwaits.py) on hand-made traces whose what-if answers are worked out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.tracefactory import BWD, TraceMaker
from trainsim.graph.build import load_trace
from trainsim.graph.ir import EdgeKind, TaskGraph, TaskKind
from trainsim.simulate.engine import simulate
from trainsim.transform.network import scale_network
from trainsim.transform.primitives import scale, select

W1, W2, PIN = 102, 103, 104  # gloo's two worker threads, a pin-memory thread
BUCKET: dict[str, Any] = {"Input Dims": [[1000]], "Input type": ["float"]}  # 4000 bytes
ENQUEUE: dict[str, Any] = {"Input Dims": [[[1000]], [], []]}


def _step_us(g: TaskGraph) -> float:
    return float(simulate(g).step_ms[0] * 1000)


def _scaled(g: TaskGraph, name: str, factor: float) -> TaskGraph:
    return scale(g, select(g, name=name), factor)


def _ddp_one_bucket(t: TraceMaker, gloo_end: float) -> None:
    """One step of DDP over gloo with one bucket: the reducer waits, untraced, for the all-reduce."""
    t.step(1, 0, 1000)
    t.cpu("aten::addmm", 10, 100)  # backward compute: the last gradient
    t.cpu("c10d::allreduce_", 120, 100, **ENQUEUE)  # enqueue on gloo's queue
    t.cpu("gloo:all_reduce", 150, gloo_end - 150, tid=W1, cat="user_annotation", **BUCKET)  # starts in the enqueue
    t.cpu("torch.distributed.ddp.reducer::copy_bucket_to_grad", 900, 20)  # the main thread resumes at 900
    t.cpu("Optimizer.step#SGD.step", 930, 60, cat="user_annotation")


def test_reducer_waits_for_the_gloo_allreduce(tmp_path: Path) -> None:
    t = TraceMaker()
    _ddp_one_bucket(t, gloo_end=850)  # the main thread wakes 50 us after the all-reduce ends
    g = load_trace(t.write(tmp_path / "t.json"))
    gloo = int(np.flatnonzero(select(g, name="^gloo:all_reduce$"))[0])
    assert g.kind[gloo] == TaskKind.COMM and g.size_bytes[gloo] == 4000
    woken = [int(d) for s, d, k in zip(g.edge_src, g.edge_dst, g.edge_kind, strict=True)
             if s == gloo and k == EdgeKind.SYNC]  # fmt: skip
    assert len(woken) == 1 and g.kind[woken[0]] == TaskKind.SYNC and g.dur_us[woken[0]] == pytest.approx(50)
    assert _step_us(g) == pytest.approx(1000)
    # the all-reduce (700 us) twice as fast: the step is 350 us shorter; twice as slow: 700 us longer
    assert _step_us(_scaled(g, "^gloo:all_reduce$", 0.5)) == pytest.approx(650)
    assert _step_us(_scaled(g, "^gloo:all_reduce$", 2.0)) == pytest.approx(1700)
    assert _step_us(scale_network(g, bw_factor=2.0)) == pytest.approx(650)
    # the collective cannot start before its enqueue: backward 100 us longer moves it, and the step, by 100
    assert _step_us(_scaled(g, "^aten::addmm$", 2.0)) == pytest.approx(1100)


def test_late_gloo_range_end_is_cut_where_the_reducer_woke(tmp_path: Path) -> None:
    """gloo marks the work done before it closes its range: here the range ends 5 us after the main
    thread resumed. The collective ends, in the graph, where the wait ended (at 900)."""
    t = TraceMaker()
    _ddp_one_bucket(t, gloo_end=905)
    g = load_trace(t.write(tmp_path / "t.json"))
    gloo = int(np.flatnonzero(select(g, name="^gloo:all_reduce$"))[0])
    assert g.dur_us[gloo] == pytest.approx(750)
    assert _step_us(g) == pytest.approx(1000)
    assert _step_us(_scaled(g, "^gloo:all_reduce$", 0.5)) == pytest.approx(1000 - 375)


def test_overlapping_buckets_share_the_link_in_order(tmp_path: Path) -> None:
    """Two buckets on gloo's two workers overlap (they share the link); the reducer waits for each."""
    t = TraceMaker()
    t.step(1, 0, 1000)
    t.cpu("aten::mm", 10, 90)
    t.cpu("c10d::allreduce_", 100, 60)
    t.cpu("gloo:all_reduce", 150, 550, tid=W1, cat="user_annotation", **BUCKET)  # [150, 700]
    t.cpu("aten::mm", 160, 40)
    t.cpu("c10d::allreduce_", 200, 60)
    t.cpu("gloo:all_reduce", 250, 650, tid=W2, cat="user_annotation", **BUCKET)  # [250, 900]
    t.cpu("torch.distributed.ddp.reducer::copy_bucket_to_grad", 720, 10)  # woke 20 us after bucket 0
    t.cpu("torch.distributed.ddp.reducer::copy_bucket_to_grad", 920, 10)  # woke 20 us after bucket 1
    t.cpu("Optimizer.step#SGD.step", 930, 60, cat="user_annotation")
    g = load_trace(t.write(tmp_path / "t.json"))
    comm = np.flatnonzero(g.kind == TaskKind.COMM)
    b0, b1 = sorted(comm.tolist(), key=lambda i: g.ts_us[i])
    # the second bucket runs on the link after the first: it starts, in the graph, where that one ended
    assert g.ts_us[b1] == pytest.approx(700) and g.dur_us[b1] == pytest.approx(200)
    assert any(s == b0 and d == b1 for s, d in zip(g.edge_src, g.edge_dst, strict=True))
    assert _step_us(g) == pytest.approx(1000)
    # a link twice as fast: the link is busy 750 us (150..900), now 375: bucket 0 ends at 425, bucket 1
    # at 525, the main thread wakes at 545 and finishes 80 us later (1000 - 920)
    assert _step_us(scale_network(g, bw_factor=2.0)) == pytest.approx(625)


def test_main_thread_waits_for_the_backward_thread(tmp_path: Path) -> None:
    """Autograd's thread starts while the main thread's last forward op still runs; the main thread then
    waits, untraced, until the burst ends (the burst is not inside one main-thread task)."""
    t = TraceMaker()
    t.step(1, 0, 600)
    t.cpu("aten::linear", 10, 70)
    t.cpu("aten::sum", 80, 30)  # [80, 110]
    t.cpu("autograd::engine::evaluate_function: AddmmBackward0", 105, 195, tid=BWD)  # [105, 300]
    t.cpu("autograd::engine::evaluate_function: MmBackward0", 300, 180, tid=BWD)  # [300, 480]
    t.cpu("Optimizer.step#SGD.step", 500, 90, cat="user_annotation")  # resumed 20 us after the burst
    g = load_trace(t.write(tmp_path / "t.json"))
    assert _step_us(g) == pytest.approx(600)
    # backward twice as fast: the burst (105..480) takes 187.5 us instead of 375
    fast = scale(g, select(g, name="Backward0"), 0.5)
    assert _step_us(fast) == pytest.approx(600 - 187.5)


def test_data_loader_waits_for_its_thread(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 600)
    t.cpu("aten::pin_memory", 5, 275, tid=PIN)  # [5, 280] on the pin-memory thread
    t.cpu("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", 10, 290, cat="user_annotation")
    t.cpu("aten::linear", 300, 200)
    g = load_trace(t.write(tmp_path / "t.json"))
    assert _step_us(g) == pytest.approx(600)
    # the batch takes twice as long to pin: the main thread gets it 275 us later
    assert _step_us(_scaled(g, "^aten::pin_memory$", 2.0)) == pytest.approx(875)


def test_a_short_gap_where_another_thread_ends_is_no_wait(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 400)
    t.cpu("aten::mm", 10, 190)  # [10, 200]
    t.cpu("autograd::engine::evaluate_function: MmBackward0", 20, 185, tid=BWD)  # ends at 205, in the gap
    t.cpu("aten::mm", 210, 190)  # [210, 400]
    g = load_trace(t.write(tmp_path / "t.json"))
    assert not (g.kind == TaskKind.SYNC).any()
    assert _step_us(_scaled(g, "Backward0", 3.0)) == pytest.approx(400)  # the main thread never waited


def test_late_range_end_keeps_the_workers_later_bursts_in_place(tmp_path: Path) -> None:
    """Two steps; step 1's range closes 5 us late on worker W1, and step 2's all-reduce runs on W1 again
    much later: cutting step 1's collective must not stretch the gap before step 2's (the replay keeps
    every step)."""
    t = TraceMaker()
    for n, s in enumerate((0.0, 1000.0)):
        t.step(n + 1, s, 1000)
        t.cpu("aten::addmm", s + 10, 100)
        t.cpu("c10d::allreduce_", s + 120, 100, **ENQUEUE)
        t.cpu("gloo:all_reduce", s + 150, 755 if n == 0 else 700, tid=W1, cat="user_annotation", **BUCKET)
        t.cpu("torch.distributed.ddp.reducer::copy_bucket_to_grad", s + 900, 20)
        t.cpu("Optimizer.step#SGD.step", s + 930, 60, cat="user_annotation")
    g = load_trace(t.write(tmp_path / "t.json"))
    assert simulate(g).step_ms.tolist() == pytest.approx([1.0, 1.0])
    fast = simulate(_scaled(g, "^gloo:all_reduce$", 0.5)).step_ms * 1000
    assert fast.tolist() == pytest.approx([1000 - 375, 1000 - 350])


def test_a_long_wait_may_wake_late(tmp_path: Path) -> None:
    """On a loaded host the reducer woke 4 ms after a 200 ms all-reduce (more than WAIT_TAIL_US, less than
    5 % of the wait): still a wait."""
    t = TraceMaker()
    t.step(1, 0, 205_000)
    t.cpu("c10d::allreduce_", 10, 100, **ENQUEUE)
    t.cpu("gloo:all_reduce", 50, 200_000, tid=W1, cat="user_annotation", **BUCKET)  # ends at 200050
    t.cpu("Optimizer.step#SGD.step", 204_050, 900, cat="user_annotation")
    g = load_trace(t.write(tmp_path / "t.json"))
    assert _step_us(_scaled(g, "^gloo:all_reduce$", 0.5)) == pytest.approx(205_000 - 100_000)
