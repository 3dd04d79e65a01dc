from __future__ import annotations

import pytest

from trainsim.errors import UserError
from trainsim.graph.ir import GraphBuilder, ResourceKind, TaskKind
from trainsim.transform.device import change_device


def test_roofline_split() -> None:
    b = GraphBuilder()
    cpu = b.resource("cpu", ResourceKind.CPU_THREAD)
    gpu = b.resource("gpu0:s7", ResourceKind.GPU_STREAM)
    launch = b.task("cudaLaunchKernel", TaskKind.RUNTIME, cpu, 5.0)
    b.task("ampere_sgemm_128x64", TaskKind.KERNEL, gpu, 100.0, deps=[launch])
    b.task("vectorized_elementwise_kernel", TaskKind.KERNEL, gpu, 100.0)
    g = change_device(b.build(), src="a100-80gb", dst="h100-sxm", dtype="bf16")
    # gemm: 989.5 / 312 TFLOP/s faster; elementwise: 3350 / 2039 GB/s faster; launch untouched
    assert g.dur_us.tolist() == pytest.approx([5.0, 100 * 312 / 989.5, 100 * 2039 / 3350])


def test_cpu_trace_and_errors() -> None:
    b = GraphBuilder()
    cpu = b.resource("cpu", ResourceKind.CPU_THREAD)
    b.task("aten::addmm", TaskKind.CPU, cpu, 50.0)
    g = change_device(b.build(), src="this-cpu", dst="v100")
    assert g.dur_us[0] == pytest.approx(50 * 0.177 / 15.7)
    with pytest.raises(UserError, match="unknown device"):
        change_device(b.build(), src="this-cpu", dst="gpu9000")
