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
