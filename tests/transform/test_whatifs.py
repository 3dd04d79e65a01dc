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


def test_fused_optimizer_without_shapes_keeps_the_sum(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from trainsim.capture.kineto import read_trace
    from trainsim.graph.build import build_graph

    path, ops, _ = _adam_loop_trace(tmp_path)
    g = build_graph(read_trace(path)).with_columns(source="<memory>")  # no trace to read shapes from
    fused = whatifs.fused_optimizer(g)
    opt = select(fused, kind="cpu", op="^aten::")
    assert opt.sum() == 1 and fused.dur_us[opt][0] == pytest.approx(sum(d for _, _, d in ops))
