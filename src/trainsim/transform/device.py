"""Device what-if: a faster or slower accelerator, by a roofline split of the compute tasks.

    >>> from trainsim.transform.device import change_device
    >>> g_h100 = change_device(g, src="a100-80gb", dst="h100-sxm", dtype="bf16")   # doctest: +SKIP

Each compute task is classed compute-bound (matrix multiplies and convolutions, by name) or
memory-bound (everything else: element-wise, reductions, copies), as Daydream does for its AMP what-if
(§5). A compute-bound task is scaled by ``src peak / dst peak`` for ``dtype``, a memory-bound one by
``src memory bandwidth / dst memory bandwidth``. Compute tasks are the GPU tasks (kernel, memcpy,
memset) of a GPU trace, or the CPU operator tasks of a CPU-only trace (not the untraced ``gap`` time);
runtime calls, synchronisation and
communication are left alone (communication: ``trainsim.transform.network``).
"""

from __future__ import annotations

import re

import numpy as np

from trainsim.cluster.catalog import Device, device
from trainsim.graph.ir import TaskGraph, TaskKind

COMPUTE_BOUND_RX = re.compile(r"gemm|conv|matmul|addmm|\bmm\b|aten::mm|bmm|linear|cutlass|cudnn|wgrad|dgrad", re.I)


def compute_bound_mask(g: TaskGraph) -> np.ndarray:
    """True for tasks whose name (or outermost op) looks like a matrix multiply / convolution."""
    hit = np.array([COMPUTE_BOUND_RX.search(s) is not None for s in g.symbols] or [False])
    by_name = hit[g.name]
    by_op = (g.op >= 0) & hit[np.maximum(g.op, 0)]
    return np.asarray(by_name | by_op)


def change_device(g: TaskGraph, *, src: str | Device, dst: str | Device, dtype: str = "fp32") -> TaskGraph:
    """``g`` as if its compute ran on ``dst`` instead of ``src`` (see the module docstring)."""
    a = src if isinstance(src, Device) else device(src)
    b = dst if isinstance(dst, Device) else device(dst)
    gpu = np.isin(g.kind, [TaskKind.KERNEL, TaskKind.MEMCPY, TaskKind.MEMSET])
    gap = g.symbol_id("gap")  # untraced host time (python, framework): not device work
    target = gpu if gpu.any() else (g.kind == TaskKind.CPU) & (g.name != gap)
    compute = compute_bound_mask(g) & target
    memory = target & ~compute
    dur = g.dur_us.copy()
    dur[compute] *= a.tflops(dtype) / b.tflops(dtype)
    dur[memory] *= a.mem_bw_gbps / b.mem_bw_gbps
    return g.with_columns(dur_us=dur)
