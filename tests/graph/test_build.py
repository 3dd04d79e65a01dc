"""The graph builder on small hand-made traces whose right answer is known."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.tracefactory import BWD, TraceMaker
from trainsim.graph.build import load_trace
from trainsim.graph.ir import EdgeKind, ResourceKind, TaskKind
from trainsim.simulate.engine import simulate
from trainsim.transform.primitives import scale, select


def _edges(g, kind):  # type: ignore[no-untyped-def]
    m = g.edge_kind == kind
    return {(g.task_name(int(s)), g.task_name(int(d))) for s, d in zip(g.edge_src[m], g.edge_dst[m], strict=True)}


def test_cpu_thread_is_tiled_by_nested_ops_and_gaps(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 100)
    t.cpu("aten::linear", 10, 50)  # [10, 60] with a child [20, 30]
    t.cpu("aten::addmm", 20, 10)
    t.write(tmp_path / "t.json")
    g = load_trace(tmp_path / "t.json")
    cpu = np.flatnonzero(g.resource == g.resource_id("cpu:100/100"))
    cpu = cpu[np.argsort(g.order[cpu])]
    names = [g.task_name(int(i)) for i in cpu]
    durs = g.dur_us[cpu].tolist()
    # step annotation's own time, the op's own time around its child, then the step's tail
    assert names == ["ProfilerStep#1", "aten::linear", "aten::addmm", "aten::linear", "ProfilerStep#1"]
    assert durs == [10, 10, 10, 30, 40]
    assert sum(durs) == 100  # the thread's timeline is kept whole
    ops = {g.task_name(int(i)): g.symbols[int(g.op[i])] for i in cpu if g.op[i] >= 0}
    assert ops["aten::addmm"] == "aten::linear"  # outermost op is recorded
    assert simulate(g).step_ms.tolist() == [pytest.approx(0.1)]


def test_launch_edges_and_stream_order(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 100)
    t.launch(10, 5, 20, 30, kernel="k1")
    t.launch(16, 5, 50, 10, kernel="k2")  # queued behind k1 on the same stream
    t.launch(22, 5, 30, 5, kernel="k3", stream=9)  # another stream runs concurrently
    g = load_trace(t.write(tmp_path / "t.json"))
    assert _edges(g, EdgeKind.LAUNCH) == {("cudaLaunchKernel", "k1"), ("cudaLaunchKernel", "k2"),
                                          ("cudaLaunchKernel", "k3")}  # fmt: skip
    streams = {r.name for r in g.resources if r.kind == ResourceKind.GPU_STREAM}
    assert streams == {"gpu0:s7", "gpu0:s9"}
    res = simulate(g)
    k2 = int(np.flatnonzero(select(g, name="^k2$"))[0])
    k1 = int(np.flatnonzero(select(g, name="^k1$"))[0])
    assert res.start_us[k2] == pytest.approx(res.end_us[k1])  # stream order, not launch time, decides
    # make k1 twice as long: k2 moves with it (stream order edge), k3 does not
    res2 = simulate(scale(g, select(g, name="^k1$"), 2.0))
    k3 = int(np.flatnonzero(select(g, name="^k3$"))[0])
    assert res2.start_us[k2] == pytest.approx(res.start_us[k2] + 30)
    assert res2.start_us[k3] == pytest.approx(res.start_us[k3])


def test_device_synchronize_waits_for_the_gpu(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 200)
    t.launch(10, 5, 15, 100, kernel="long_kernel")
    t.runtime("cudaDeviceSynchronize", 20, 100)  # returns 5 us after the kernel ends at 115
    t.cpu("aten::item", 130, 10)
    g = load_trace(t.write(tmp_path / "t.json"))
    assert ("long_kernel", "cudaDeviceSynchronize") in _edges(g, EdgeKind.SYNC)
    sync = select(g, kind="sync")
    assert sync.sum() == 1 and g.dur_us[sync][0] == pytest.approx(5.0)
    assert simulate(g).step_ms[0] == pytest.approx(0.2)
    # a kernel half as long lets the CPU continue 50 us earlier
    faster = simulate(scale(g, select(g, name="long_kernel"), 0.5))
    item = int(np.flatnonzero(select(g, name="aten::item"))[0])
    assert faster.start_us[item] == pytest.approx(simulate(g).start_us[item] - 50)


def test_synchronous_copy_is_split_into_launch_and_wait(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 100)
    t.launch(10, 40, 15, 30, name="cudaMemcpyAsync", kernel="Memcpy DtoH (Device -> Pageable)", cat="gpu_memcpy",
             bytes=4096)  # fmt: skip
    g = load_trace(t.write(tmp_path / "t.json"))
    copy = int(np.flatnonzero(select(g, kind="memcpy"))[0])
    assert g.size_bytes[copy] == 4096
    assert ("Memcpy DtoH (Device -> Pageable)", "cudaMemcpyAsync") in _edges(g, EdgeKind.SYNC)
    res = simulate(g)
    assert res.step_ms[0] == pytest.approx(0.1)


def test_stream_wait_event_links_streams(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 300)
    t.launch(10, 5, 20, 100, kernel="grad_kernel", stream=7)
    t.runtime("cudaEventRecord", 16, 2)
    t.runtime("cudaStreamWaitEvent", 19, 2)
    t.launch(22, 5, 120, 50, kernel="ncclDevKernel_AllReduce", stream=40)
    g = load_trace(t.write(tmp_path / "t.json"))
    assert ("grad_kernel", "ncclDevKernel_AllReduce") in _edges(g, EdgeKind.SYNC)
    nccl = int(np.flatnonzero(select(g, name="nccl"))[0])
    assert g.kind[nccl] == TaskKind.COMM
    slower = simulate(scale(g, select(g, name="grad_kernel"), 2.0))
    # launch ends at 15, the kernel starts 5 us later (the launch latency the trace shows) and takes 200
    assert slower.start_us[nccl] == pytest.approx(15 + 5 + 200)


def test_backward_thread_bursts_block_the_main_thread(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 300)
    t.cpu("layer:fc", 5, 20, cat="user_annotation")
    t.cpu("aten::linear", 6, 18, **{"Sequence number": 7})
    t.cpu("aten::backward", 30, 200)  # main thread blocked while autograd's thread works
    t.cpu("autograd::engine::evaluate_function: AddmmBackward0", 40, 150, tid=BWD,
          **{"Sequence number": 7, "Fwd thread id": 1})  # fmt: skip
    t.cpu("optimizer", 240, 40)
    g = load_trace(t.write(tmp_path / "t.json"))
    bwd = int(np.flatnonzero(select(g, name="AddmmBackward0"))[0])
    assert g.symbols[int(g.layer[bwd])] == "layer:fc"  # backward op attributed to its forward layer
    res = simulate(g)
    assert res.step_ms[0] == pytest.approx(0.3)
    # backward twice as fast: the main thread resumes 75 us earlier
    fast = simulate(scale(g, select(g, name="AddmmBackward0"), 0.5))
    opt = int(np.flatnonzero(select(g, name="^optimizer$"))[0])
    assert fast.start_us[opt] == pytest.approx(res.start_us[opt] - 75)


def test_cpu_collectives_are_comm_tasks_with_sizes(tmp_path: Path) -> None:
    t = TraceMaker()
    t.step(1, 0, 100)
    t.cpu("gloo:all_reduce", 10, 50, cat="user_annotation", **{"Input Dims": [[1000]], "Input type": ["float"],
                                                                 "Process Group Name": "0"})  # fmt: skip
    t.cpu("record_param_comms", 70, 5, **{"In msg nelems": 256, "dtype": "BFloat16", "Process Group Name": "tp"})
    t.launch(71, 2, 73, 20, kernel="ncclDevKernel_AllGather")
    g = load_trace(t.write(tmp_path / "t.json"))
    comm = np.flatnonzero(select(g, kind="comm"))
    assert comm.size == 2
    gloo, nccl = sorted(comm, key=lambda i: g.ts_us[i])
    assert g.size_bytes[gloo] == 4000 and g.symbols[g.group[gloo]] == "0"
    assert g.size_bytes[nccl] == 512 and g.symbols[g.group[nccl]] == "tp"


def test_no_step_annotations_warns_and_uses_whole_trace(tmp_path: Path) -> None:
    t = TraceMaker()
    t.cpu("aten::mm", 0, 10)
    t.cpu("aten::mm", 15, 10)
    with pytest.warns(UserWarning, match="no ProfilerStep"):
        g = load_trace(t.write(tmp_path / "t.json.gz", gz=True))
    assert simulate(g).step_ms[0] == pytest.approx(0.025)


@pytest.mark.parametrize(
    "name", ["a100_nccl_2ranks_rank0.json.gz", "v100_single_rank0.json.gz", "cpu_gloo_rank34.json.gz"]
)
def test_real_traces_replay_within_two_percent(name: str) -> None:
    path = Path(__file__).resolve().parents[3] / "shared" / "traces" / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = load_trace(path)
    res = simulate(g)
    err = np.abs(res.step_ms - g.steps.measured_us / 1e3) / (g.steps.measured_us / 1e3)
    assert np.median(err) < 0.02 and err.max() < 0.05
