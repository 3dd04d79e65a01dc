"""Built-in what-ifs written only with the primitives; each is also a recipe for writing your own.

    >>> from trainsim.graph.build import load_trace
    >>> from trainsim.simulate.engine import simulate
    >>> from trainsim.transform import whatifs
    >>> g = load_trace("trace.json.gz")                                 # doctest: +SKIP
    >>> simulate(whatifs.amp(g)).mean_step_ms                          # doctest: +SKIP

Writing your own: select tasks, change them, return the new graph. For example "what if every
attention kernel were twice as fast" is ``scale(g, select(g, kind="kernel", name="attn|softmax"), 0.5)``.
"""

from __future__ import annotations

import re

import numpy as np

from trainsim.errors import UserError
from trainsim.graph.ir import EdgeKind, TaskGraph, TaskKind
from trainsim.transform.primitives import remove, scale, select, set_duration

# Kernels whose time is dominated by tensor-core-able math (GEMM, convolution). Daydream §5 (AMP):
# these speed up ~3x under mixed precision, memory-bound kernels ~2x (half the bytes).
COMPUTE_BOUND = r"gemm|conv|cutlass|cublas|xmma|implicit_convolve|winograd|wgrad|dgrad|fprop|mma|matmul|scudnn"
OPTIMIZER_RANGE = r"^Optimizer\.step#"


def amp(g: TaskGraph, compute_speedup: float = 3.0, memory_speedup: float = 2.0) -> TaskGraph:
    """Automatic mixed precision: GEMM/conv kernels / 3, every other kernel / 2 (Daydream's rule)."""
    kernels = select(g, kind="kernel")
    if not kernels.any():
        raise UserError(f"{g.source}: the AMP what-if scales GPU kernels, and this trace has none")
    heavy = kernels & select(g, name=f"(?i){COMPUTE_BOUND}")
    g = scale(g, heavy, 1.0 / compute_speedup)
    return scale(g, kernels & ~heavy, 1.0 / memory_speedup)


def fused_optimizer(g: TaskGraph) -> TaskGraph:
    """Replace each step's per-parameter optimizer kernels with one task of their summed duration.

    GPU traces: the kernels launched inside ``Optimizer.step#...`` become one kernel (the first one,
    lengthened); the other kernels and their launch calls go. CPU traces: the operator tasks inside
    the optimizer range become one task the same way, and the range's own time (the Python loop over
    parameters between the operators, which a fused or foreach optimizer does not run) goes.
    """
    in_opt = select(g, layer=OPTIMIZER_RANGE)
    gpu = in_opt & select(g, kind=("kernel", "memset", "memcpy"))
    per_param = gpu if gpu.any() else in_opt & select(g, kind="cpu", op=r"^aten::")
    if not per_param.any():
        raise UserError(
            f"{g.source}: no optimizer work found (tasks inside an 'Optimizer.step#...' range); "
            "profile with a torch.optim optimizer, or select the tasks yourself"
        )
    ids = np.flatnonzero(per_param)
    keep, drop = [], []
    for step in np.unique(g.step[ids]):
        mine = ids[g.step[ids] == step]
        mine = mine[np.argsort(g.order[mine], kind="stable")]
        keep.append((int(mine[0]), float(g.dur_us[mine].sum())))
        drop.extend(mine[1:].tolist())
    g = set_duration(g, [k for k, _ in keep], np.array([d for _, d in keep]))
    # the launch calls of the removed kernels go too: a fused optimizer makes one launch
    dropped = np.zeros(g.n_tasks, np.bool_)
    dropped[drop] = True
    if not gpu.any():
        dropped |= in_opt & select(g, kind="cpu", name=OPTIMIZER_RANGE)
    launch = (g.edge_kind == EdgeKind.LAUNCH) & dropped[g.edge_dst]
    launches = np.zeros(g.n_tasks, np.bool_)
    launches[g.edge_src[launch]] = True
    launches &= g.kind == TaskKind.RUNTIME
    return remove(g, dropped | launches)


def parse_selector(text: str) -> tuple[dict[str, str], float]:
    """``"kind:kernel,name:gemm=0.5"`` -> ({"kind": "kernel", "name": "gemm"}, 0.5) for ``--scale``."""
    sel, sep, factor_s = text.rpartition("=")
    if not sep:
        raise UserError(f"--scale {text!r}: expected SELECTOR=FACTOR, e.g. 'kind:kernel,name:gemm=0.5'")
    try:
        factor = float(factor_s)
    except ValueError:
        raise UserError(f"--scale {text!r}: factor {factor_s!r} is not a number") from None
    filters: dict[str, str] = {}
    for part in filter(None, sel.split(",")):
        key, colon, value = part.partition(":")
        if not colon or key not in {"kind", "name", "op", "layer", "step", "resource"}:
            raise UserError(
                f"--scale {text!r}: filter {part!r} must be KEY:VALUE with KEY one of kind, name, op, layer, step, resource"
            )
        filters[key] = value
    if not filters:
        raise UserError(f"--scale {text!r}: the selector is empty; e.g. 'kind:kernel=0.5'")
    return filters, factor


def scale_selected(g: TaskGraph, text: str) -> TaskGraph:
    """Apply one ``--scale SELECTOR=FACTOR``; it must select at least one task."""
    filters, factor = parse_selector(text)
    step = filters.pop("step", None)
    if step is not None and not re.fullmatch(r"-?\d+", step):
        raise UserError(f"--scale {text!r}: step {step!r} is not an integer")
    mask = select(g, step=int(step) if step is not None else None, **filters)  # type: ignore[arg-type]
    if not mask.any():
        raise UserError(f"--scale {text!r}: selects no task in {g.source}")
    return scale(g, mask, factor)
