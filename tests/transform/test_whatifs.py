"""The built-in what-ifs (AMP, fused optimizer, --scale selectors)."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.errors import UserError
from trainsim.graph.ir import GraphBuilder, ResourceKind, TaskKind
from trainsim.simulate.engine import simulate
from trainsim.transform import whatifs
from trainsim.transform.primitives import select


def _gpu_step():  # type: ignore[no-untyped-def]
    b = GraphBuilder()
    cpu = b.resource("cpu", ResourceKind.CPU_THREAD)
    gpu = b.resource("gpu", ResourceKind.GPU_STREAM)
    for name, dur in (("volta_sgemm_128x64_nn", 3), ("elementwise_relu", 2)):
        la = b.task("cudaLaunchKernel", TaskKind.RUNTIME, cpu, 5, step=0)
        b.task(name, TaskKind.KERNEL, gpu, dur, step=0, deps=[la])
    for i in range(4):  # per-parameter optimizer kernels
        la = b.task("cudaLaunchKernel", TaskKind.RUNTIME, cpu, 5, step=0, layer="Optimizer.step#SGD.step")
        b.task(f"sgd_update_{i}", TaskKind.KERNEL, gpu, 2, step=0, layer="Optimizer.step#SGD.step", deps=[la])
    return b.build()


def test_amp_divides_gemm_by_three_and_others_by_two() -> None:
    g = whatifs.amp(_gpu_step())
    assert g.dur_us[select(g, name="sgemm")][0] == pytest.approx(1)
    assert g.dur_us[select(g, name="relu")][0] == pytest.approx(1)
    assert (g.dur_us[select(g, name="sgd_update")] == 1).all()


def test_amp_needs_kernels() -> None:
    b = GraphBuilder()
    b.task("aten::mm", TaskKind.CPU, b.resource("cpu", ResourceKind.CPU_THREAD), 10)
    with pytest.raises(UserError, match="no"):
        whatifs.amp(b.build())


def test_fused_optimizer_replaces_per_parameter_kernels_and_launches() -> None:
    g = _gpu_step()
    fused = whatifs.fused_optimizer(g)
    opt = select(fused, layer="Optimizer") & select(fused, kind="kernel")
    assert opt.sum() == 1 and fused.dur_us[opt][0] == pytest.approx(8)
    assert select(fused, kind="runtime").sum() == 3  # 2 model launches + 1 fused launch
    # launch-bound optimizer: 4 launches of 5 us + the last 2 us kernel become 1 launch + an 8 us kernel
    assert simulate(g).makespan_us - simulate(fused).makespan_us == pytest.approx(9)


def test_scale_selector_parsing() -> None:
    assert whatifs.parse_selector("kind:kernel,name:gemm=0.5") == ({"kind": "kernel", "name": "gemm"}, 0.5)
    for bad in ("kind:kernel", "kernel=0.5", "kind:kernel=fast", "=2", "color:red=2"):
        with pytest.raises(UserError):
            whatifs.parse_selector(bad)
    g = _gpu_step()
    g2 = whatifs.scale_selected(g, "name:sgemm=2")
    assert np.isclose(g2.dur_us[select(g2, name="sgemm")][0], 6)
    with pytest.raises(UserError, match="selects no task"):
        whatifs.scale_selected(g, "name:nothing_like_this=2")


# --------------------------------------------------------------------------- fused optimizer: the byte model
N = 2**20  # elements of the weight: 4 MiB of float32
MiB4 = 4 * N
BIAS = 16  # elements of the bias: 64 B, a dispatch-bound op
US_PER_4MIB = 100.0  # the hand-made ops move 4 MiB per 100 µs
DISPATCH_US = 5.0


def _adam_loop_trace(tmp_path):  # type: ignore[no-untyped-def]
    """One step of a per-parameter Adam loop over a weight and a bias: per parameter the step counter
    (0-dim), lerp_ (3 tensor-passes), mul_ (2) and addcdiv_ (4); each op takes dispatch + bytes / bw."""
    from tests.tracefactory import TraceMaker

    t = TraceMaker()
    ops = []
    for n in (N, BIAS):
        ops.append(("aten::add_", [[], [], []], 10.0))
        for name, tensors in (("aten::lerp_", 2), ("aten::mul_", 1), ("aten::addcdiv_", 3)):
            dims = [[n]] * tensors + [[]]
            moved = (tensors + 1) * 4 * n
            dur = DISPATCH_US + (US_PER_4MIB * moved / MiB4 if moved > 16 * 1024 else 0.0)
            ops.append((name, dims, dur))
    gap = 20.0
    ts = 100.0 + gap
    for name, dims, dur in ops:
        t.cpu(name, ts, dur, **{"Input Dims": dims, "Input type": ["float"] * len(dims)})
        ts += dur + gap
    t.cpu("Optimizer.step#Adam.step", 100, ts - 100, cat="user_annotation")
    t.step(1, 0, ts + 50)
    return t.write(tmp_path / "adam.json"), ops, (ts - 100) - sum(d for _, _, d in ops)


def test_fused_optimizer_moves_the_parameters_once_at_the_traced_bandwidth(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from trainsim.capture.kineto import read_trace
    from trainsim.graph.build import build_graph

    path, ops, range_own_us = _adam_loop_trace(tmp_path)
    g = build_graph(read_trace(path))
    fused = whatifs.fused_optimizer(g)  # reads the trace back from g.source
    # Adam: 7 passes (p, g, m, v read; p, m, v written) over the parameters' bytes at 4 MiB / 100 µs,
    # plus one dispatch for the one (cpu, float32) group
    param_bytes = 4 * (N + BIAS)
    expected = DISPATCH_US + 7 * param_bytes * US_PER_4MIB / MiB4
    upd = select(fused, name=r"lerp_|mul_|addcdiv_")
    assert upd.sum() == 1 and fused.dur_us[upd][0] == pytest.approx(expected)
    # the step counters stay; the Python between the calls shrinks to the calls still made: 2 + 1 of 8
    assert fused.dur_us[select(fused, name="add_")].sum() == pytest.approx(20.0)
    own = select(fused, name="^Optimizer")
    assert fused.dur_us[own].sum() == pytest.approx(range_own_us * 3 / 8)
    # the old rule kept the ops' summed time (9 passes and 8 dispatches here: 930 µs)
    assert sum(d for n, _, d in ops if n != "aten::add_") - fused.dur_us[upd][0] > 200


def test_fused_optimizer_prices_the_kernel_at_the_given_rate(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from trainsim.capture.kineto import read_trace
    from trainsim.graph.build import build_graph

    path, _, _ = _adam_loop_trace(tmp_path)
    tr = read_trace(path)
    g = build_graph(tr)
    param_bytes = 4 * (N + BIAS)
    upd = r"lerp_|mul_|addcdiv_"
    # 10 GB/s = 1e4 bytes per µs: 7 passes over 4,194,368 bytes take 2,936.06 µs, plus one dispatch of 5 µs
    # (the loop's own rate, 4 MiB per 100 µs, would give 705.0 µs)
    fused = whatifs.fused_optimizer(g, tr, kernel_gbps=10.0)
    assert fused.dur_us[select(fused, name=upd)][0] == pytest.approx(5.0 + 7 * param_bytes / 1e4)
    assert fused.dur_us[select(fused, name=upd)][0] == pytest.approx(2941.0576)
    # a rate by size (a calibration's curve) is asked at the parameters' bytes
    asked: list[float] = []

    def curve(b: float) -> float:
        asked.append(b)
        return 20.0

    fused = whatifs.fused_optimizer(g, tr, kernel_gbps=curve)
    assert asked == [param_bytes] and fused.dur_us[select(fused, name=upd)][0] == pytest.approx(5.0 + 7 * param_bytes / 2e4)


@pytest.mark.parametrize("bad", [0.0, -3.0, float("nan"), float("inf"), "fast", True])
def test_fused_optimizer_refuses_a_bad_rate_in_one_line(tmp_path, bad) -> None:  # type: ignore[no-untyped-def]
    from trainsim.capture.kineto import read_trace
    from trainsim.graph.build import build_graph

    path, _, _ = _adam_loop_trace(tmp_path)
    tr = read_trace(path)
    g = build_graph(tr)
    with pytest.raises(UserError, match=r"kernel_gbps=.*expected .* > 0") as e:
        whatifs.fused_optimizer(g, tr, kernel_gbps=bad)
    assert len(str(e.value).splitlines()) == 1
    with pytest.raises(UserError, match=r"kernel_gbps\(4194368\)=0\.0"):
        whatifs.fused_optimizer(g, tr, kernel_gbps=lambda b: 0.0)


def _adam_gpu_trace(tmp_path, gpu: dict | None):  # type: ignore[no-untyped-def,type-arg]
    """One Adam loop step on a GPU: per parameter (a 4 MiB weight and a 64 B bias) one update operator
    launching one kernel; the kernels move their bytes at 4 MiB per 10 µs (the traced rate)."""
    import json

    from tests.tracefactory import TraceMaker

    t = TraceMaker()
    ts = 110.0
    for n in (N, BIAS):
        for name, tensors in (("aten::lerp_", 2), ("aten::mul_", 1), ("aten::addcdiv_", 3)):
            dims = [[n]] * tensors + [[]]
            t.cpu(name, ts, 20, **{"Input Dims": dims, "Input type": ["float"] * len(dims)})
            t.launch(ts + 2, 10, ts + 15, 10.0 * (tensors + 1) * 4 * n / MiB4, kernel=f"adam_{name[6:]}")
            ts += 40
    t.cpu("Optimizer.step#Adam.step", 100, ts - 100, cat="user_annotation")
    t.step(1, 0, ts + 200)
    path = t.write(tmp_path / "gpu.json")
    if gpu is not None:
        doc = json.loads(path.read_text())
        doc["deviceProperties"] = [gpu]
        path.write_text(json.dumps(doc))
    return path


def test_fused_optimizer_on_a_gpu_runs_at_the_catalog_bandwidth(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from trainsim.capture.kineto import read_trace
    from trainsim.cluster.catalog import device
    from trainsim.graph.build import build_graph

    v100 = {"name": "Tesla V100-SXM2-32GB", "totalGlobalMem": 34079637504}
    tr = read_trace(_adam_gpu_trace(tmp_path, v100))
    assert whatifs.trace_gpu(tr) == device("v100")
    g = build_graph(tr)
    fused = whatifs.fused_optimizer(g, tr)
    k = select(fused, kind="kernel")
    # V100: 900 GB/s x 0.88 = 792 GB/s = 792,000 bytes per µs; 7 passes over 4,194,368 bytes: 37.07 µs
    # (the traced kernels' rate, 4 MiB per 10 µs, would give 70.5 µs)
    assert k.sum() == 1 and fused.dur_us[k][0] == pytest.approx(7 * 4 * (N + BIAS) / 792e3)
    assert fused.dur_us[k][0] == pytest.approx(37.0722, abs=1e-3)
    # an A100 80GB named by the trace: 2,039 x 0.88 GB/s; a given rate wins over the catalog
    tr = read_trace(_adam_gpu_trace(tmp_path, {"name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85e9}))
    fused = whatifs.fused_optimizer(build_graph(tr), tr)
    assert fused.dur_us[select(fused, kind="kernel")][0] == pytest.approx(7 * 4 * (N + BIAS) / (2039e3 * 0.88))
    fused = whatifs.fused_optimizer(build_graph(tr), tr, kernel_gbps=100.0)
    assert fused.dur_us[select(fused, kind="kernel")][0] == pytest.approx(7 * 4 * (N + BIAS) / 100e3)
    # a GPU the catalog does not describe (a PCIe board): the traced kernels' rate, 4 MiB per 10 µs
    tr = read_trace(_adam_gpu_trace(tmp_path, {"name": "NVIDIA H100 PCIe", "totalGlobalMem": 85e9}))
    assert whatifs.trace_gpu(tr) is None
    fused = whatifs.fused_optimizer(build_graph(tr), tr)
    assert fused.dur_us[select(fused, kind="kernel")][0] == pytest.approx(7 * 4 * (N + BIAS) * 10.0 / MiB4)


def test_fused_optimizer_without_shapes_keeps_the_sum(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from trainsim.capture.kineto import read_trace
    from trainsim.graph.build import build_graph

    path, ops, _ = _adam_loop_trace(tmp_path)
    g = build_graph(read_trace(path)).with_columns(source="<memory>")  # no trace to read shapes from
    fused = whatifs.fused_optimizer(g)
    opt = select(fused, kind="cpu", op="^aten::")
    assert opt.sum() == 1 and fused.dur_us[opt][0] == pytest.approx(sum(d for _, _, d in ops))
