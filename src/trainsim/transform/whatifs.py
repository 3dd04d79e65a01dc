"""Built-in what-ifs written only with the primitives; each is also a recipe for writing your own.

    >>> from trainsim.graph.build import load_trace
    >>> from trainsim.simulate.engine import simulate
    >>> from trainsim.transform import whatifs
    >>> g = load_trace("trace.json.gz")                                 # doctest: +SKIP
    >>> simulate(whatifs.amp(g)).mean_step_ms                          # doctest: +SKIP

Writing your own: select tasks, change them, return the new graph. For example "what if every
attention kernel were twice as fast" is ``scale(g, select(g, kind="kernel", name="attn|softmax"), 0.5)``.

Why one module: it is the catalogue a user reads for recipes, and its two trace-reading models (the
fused optimizer's and the batch size's) share the helpers that map trace calls to graph tasks
(``_top_calls``, ``_inside``, ``_step_at``).
"""

from __future__ import annotations

import bisect
import math
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from trainsim.capture.kineto import Event, Trace
from trainsim.errors import UserError
from trainsim.graph.ir import EdgeKind, Mask, TaskGraph, TaskKind
from trainsim.transform.primitives import remove, scale, select, set_duration

if TYPE_CHECKING:
    from trainsim.cluster.catalog import Device
    from trainsim.transform.opcost import OpCostTable

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


FUSED_PASSES = {"Adam": 7, "AdamW": 7, "SGD": 5, "Adagrad": 5}
"""tensor-passes over the parameters' bytes that torch's fused kernel of each optimizer makes per step
(reads + writes of parameter-sized tensors, from the update rule): Adam/AdamW read p, g, m, v and write
p, m, v (torch ``_fused_adam_``, Kingma & Ba 2015 Alg. 1); SGD with momentum reads p, g, buf and writes
p, buf (``_fused_sgd_``); Adagrad reads p, g, sum and writes p, sum (``_fused_adagrad_``)"""
SMALL_OP_BYTES = 16 * 1024
"""optimizer ops moving at most this much are dispatch cost: at the >= 5 GB/s of any current CPU core
the bytes take <= 3 µs"""


FUSED_KERNEL_EFFICIENCY = 0.88
"""fraction of a GPU's datasheet memory bandwidth that torch's multi-tensor fused Adam kernel moves its
bytes at. pytorch/pytorch#119842 (multi_tensor_apply_for_fused_optimizer, 2024-02): fused Adam over one
128-way shard of Llama 2 70B (68.98e9 / 128 parameters, bf16) took 3.578 ms on an H100 with HBM2e at
500 W, whose datasheet bandwidth is 2.4 TB/s (catalog ``h100-96gb``): 7 passes x 2 bytes x 5.39e8 in
3.578 ms = 2.11 TB/s, 0.88 of it"""

KernelRate = float | Callable[[float], float]
"""the fused kernel's rate in GB/s (bytes it moves per second / 1e9): a number, or a function of the
parameters' bytes (a calibration measured at several sizes, e.g. ``MachineCalibration.fused_kernel_gbps``)"""


def fused_optimizer(
    g: TaskGraph,
    trace: Trace | None = None,
    *,
    param_bytes: int | None = None,
    kernel_gbps: KernelRate | None = None,
    device: Device | None = None,
) -> TaskGraph:
    """Replace each step's per-parameter optimizer operators by one fused call per parameter group.

    The fused kernel makes one pass over the parameters: its time is the bytes it must move over the
    fused kernel's rate on the device, plus one dispatch per group (torch groups the tensors by device
    and dtype). The rate, in this order: ``kernel_gbps`` (GB/s, or a function of the parameter bytes:
    on a CPU host, the machine calibration's measurement of torch's fused Adam kernel); on a GPU trace,
    the catalog device's memory bandwidth (``device``, else the GPU named in the trace's
    ``deviceProperties``) times ``FUSED_KERNEL_EFFICIENCY``; else the rate the trace's own optimizer
    operators reached (``bw`` of step 2), which is the per-tensor loop's, not the fused kernel's.
    Steps:

    1. Each optimizer task (inside ``Optimizer.step#<Class>.step``) is matched to the top-level
       operator call covering it (``trace``, read from ``g.source`` when not given; shapes need
       ``record_shapes=True``). Calls on tensors (``Input Dims`` of rank >= 1) are the per-parameter
       update; calls on 0-dim tensors only (the step counters, ``item``) stay: a fused step runs them too.
    2. Bytes per call: its tensor inputs plus one output as large as its largest input (an in-place op
       writes its first input back). ``dispatch_us``: the median time of the calls moving at most
       ``SMALL_OP_BYTES``; ``bw``: the bytes-weighted median over the calls of ``bytes / (time -
       dispatch_us)``, the bandwidth at which the bulk of the optimizer's bytes moved.
    3. Fused time per step = ``groups * dispatch_us + FUSED_PASSES[Class] * param_bytes / rate``, with
       ``param_bytes`` from the trace's sidecar (``trainsim profile``), else the smallest per-step sum,
       over operator names, of the calls' first-input bytes (each update op visits every parameter).
       The fused kernel streams each tensor once (Adam: 4 reads + 3 writes of each parameter's
       elements, torch's ``_fused_adam_``).
    4. The first update call of the step becomes the fused call; the other update calls (and their
       children) go; the range's own time (Python between the calls) is kept in proportion to the calls
       the fused step still makes (the kept calls + one per group).

    GPU traces: the kernels launched inside the range become one kernel, and their launch calls go. Its
    time follows the same byte model (bytes from the launching operator's shapes); where a kernel's
    operator has no shapes it is the kernels' summed time. CPU traces without shapes, or of an optimizer
    not in ``FUSED_PASSES``, also keep the summed time (the range's own time goes, as a fused step does
    not loop in Python). A rate that is not a positive number is a ``UserError``.
    """
    if kernel_gbps is not None and not callable(kernel_gbps):
        _check_rate(kernel_gbps, "kernel_gbps")
    in_opt = select(g, layer=OPTIMIZER_RANGE)
    gpu = in_opt & select(g, kind=("kernel", "memset", "memcpy"))
    per_param = gpu if gpu.any() else in_opt & select(g, kind="cpu", op=r"^aten::")
    if not per_param.any():
        raise UserError(
            f"{g.source}: no optimizer work found (tasks inside an 'Optimizer.step#...' range); "
            "profile with a torch.optim optimizer, or select the tasks yourself"
        )
    if trace is None and Path(g.source).is_file():
        from trainsim.capture.kineto import read_trace

        trace = read_trace(g.source)
    rate = kernel_gbps
    if rate is None and gpu.any():
        dev = device if device is not None else trace_gpu(trace) if trace is not None else None
        rate = dev.mem_bw_gbps * FUSED_KERNEL_EFFICIENCY if dev is not None else None
    model = _fused_model(g, trace, per_param, bool(gpu.any()), param_bytes, rate) if trace is not None else None
    ids = np.flatnonzero(per_param)
    keep, drop, range_factor = [], [], {}
    for step in np.unique(g.step[ids]):
        mine = ids[g.step[ids] == step]
        mine = mine[np.argsort(g.order[mine], kind="stable")]
        if model is None:
            keep.append((int(mine[0]), float(g.dur_us[mine].sum())))
            drop.extend(mine[1:].tolist())
            continue
        update = mine[model.update[mine]]
        if not update.size:
            continue
        keep.append((int(update[0]), model.fused_us))
        drop.extend(update[1:].tolist())
        n_top = len(model.calls.get(int(step), ()))
        range_factor[int(step)] = (model.kept_calls.get(int(step), 0) + model.groups) / max(n_top, 1)
    g = set_duration(g, [k for k, _ in keep], np.array([d for _, d in keep]))
    # the launch calls of the removed kernels go too: a fused optimizer makes one launch
    dropped = np.zeros(g.n_tasks, np.bool_)
    dropped[drop] = True
    if not gpu.any():
        own = in_opt & select(g, kind="cpu", name=OPTIMIZER_RANGE)
        if model is None:
            dropped |= own
        else:
            factor = np.array([range_factor.get(int(s), 0.0) for s in g.step[own]])
            g = set_duration(g, own, g.dur_us[own] * np.minimum(factor, 1.0))
    launch = (g.edge_kind == EdgeKind.LAUNCH) & dropped[g.edge_dst]
    launches = np.zeros(g.n_tasks, np.bool_)
    launches[g.edge_src[launch]] = True
    launches &= g.kind == TaskKind.RUNTIME
    return remove(g, dropped | launches)


class _FusedModel(NamedTuple):
    update: Mask  # tasks of the per-parameter update (replaced)
    fused_us: float  # the fused step's time
    groups: int
    calls: dict[int, list[Event]]  # step -> the top-level operator calls in the optimizer range
    kept_calls: dict[int, int]  # step -> calls the fused step still makes (0-dim tensors only)
    dispatch_us: float
    bw_gbps: float  # the traced operators' bandwidth (step 2)
    kernel_gbps: float  # the rate the fused time used


def _check_rate(x: object, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not (math.isfinite(x) and x > 0):
        raise UserError(f"fused optimizer: {what}={x!r}; expected the fused kernel's rate in GB/s, a number > 0")
    return float(x)


GPU_FAMILIES = ("v100", "a100", "h100", "h200", "h800", "2080 ti")
"""GPU names (as CUDA reports them, e.g. ``NVIDIA A100-SXM4-80GB``) that ``trace_gpu`` maps to the catalog"""


def trace_gpu(trace: Trace) -> Device | None:
    """The catalog device (``cluster.catalog``) of the first GPU in ``trace``'s ``deviceProperties``: its
    family from the name, the entry of that family whose memory is nearest ``totalGlobalMem``. None
    without one, for a family not in ``GPU_FAMILIES``, and for PCIe / NVL boards (other bandwidths than
    the catalog's SXM figures)."""
    from trainsim.cluster.catalog import DEVICES

    props = trace.meta.get("deviceProperties")
    if not (isinstance(props, list) and props and isinstance(props[0], dict)):
        return None
    name = str(props[0].get("name", "")).lower().replace("rtx ", "")
    fam = next((f for f in GPU_FAMILIES if re.search(rf"\b{f}\b", name)), None)
    if fam is None or "pcie" in name or "nvl" in name:
        return None
    cands = [d for d in DEVICES.values() if d.name.replace("rtx", "").startswith(fam.replace(" ", ""))]
    mem = props[0].get("totalGlobalMem")
    if not cands:
        return None
    if not isinstance(mem, (int, float)) or mem <= 0:
        return cands[0] if len(cands) == 1 else None
    return min(cands, key=lambda d: abs(d.mem_gib - mem / 2**30))


def _fused_model(
    g: TaskGraph, trace: Trace, per_param: Mask, on_gpu: bool, param_bytes: int | None, kernel_gbps: KernelRate | None
) -> _FusedModel | None:
    """The byte model of ``fused_optimizer`` (steps 1-3 of its docstring); None without shapes."""
    from trainsim.transform.opcost import DTYPE_BYTES, tensor_bytes

    ranges = [e for e in trace.events if e.cat == "user_annotation" and re.search(OPTIMIZER_RANGE, e.name)]
    if not ranges:
        return None
    passes = FUSED_PASSES.get(ranges[0].name.split("#", 1)[1].split(".", 1)[0])
    if passes is None:
        return None
    top = _top_calls(trace, ranges)
    # the operator call behind each task: its own (CPU) or its launch's (GPU)
    host = per_param.copy()
    if on_gpu:
        launch = (g.edge_kind == EdgeKind.LAUNCH) & per_param[g.edge_dst]
        owner = np.full(g.n_tasks, -1, np.int64)
        owner[g.edge_dst[launch]] = g.edge_src[launch]
        host = np.zeros(g.n_tasks, np.bool_)
        host[owner[owner >= 0]] = True
    call_of: dict[int, Event] = {}
    for t in np.flatnonzero(host):
        e = _covering(top.get(g.resources[int(g.resource[t])].name, ([], [])), float(g.ts_us[t]))
        if e is not None:
            call_of[int(t)] = e
    if on_gpu:
        task_call = {int(k): call_of.get(int(owner[k])) for k in np.flatnonzero(per_param)}
    else:
        task_call = {int(k): call_of.get(int(k)) for k in np.flatnonzero(per_param)}
    if any(e is None or not isinstance(e.args.get("Input Dims"), list) for e in task_call.values()):
        return None

    def is_update(e: Event) -> bool:
        return any(isinstance(d, list) and len(d) >= 1 for d in e.args["Input Dims"])

    update = np.zeros(g.n_tasks, np.bool_)
    for k, e in task_call.items():
        update[k] = e is not None and is_update(e)
    upd_calls = {e.pos: e for e in task_call.values() if e is not None and is_update(e)}
    if not upd_calls:
        return None
    # per call: bytes, and the time that moved them (its own on the CPU, its kernels' on the GPU)
    busy: dict[int, float] = defaultdict(float)
    for k, e in task_call.items():
        if e is not None and e.pos in upd_calls:
            busy[e.pos] += float(g.dur_us[k]) if on_gpu else 0.0
    nbytes = np.array([sum(tensor_bytes(e.args["Input Dims"], e.args.get("Input type"))) for e in upd_calls.values()],
                      np.float64)  # fmt: skip
    dur = np.array([busy[p] if on_gpu else e.dur for p, e in upd_calls.items()], np.float64)
    small = nbytes <= SMALL_OP_BYTES
    dispatch = 0.0 if on_gpu else float(np.median(dur[small])) if small.any() else float(dur.min())
    big = nbytes > SMALL_OP_BYTES
    if not big.any():
        big = np.ones_like(big)
    rate = nbytes[big] / np.maximum(dur[big] - dispatch, 0.1 * dur[big])  # bytes per µs
    bw = _weighted_median(rate, nbytes[big])
    # parameter bytes and groups
    calls: dict[int, list[Event]] = defaultdict(list)
    for r in ranges:
        calls[_step_at(g, r.ts)].extend(top.get(f"cpu:{r.pid}/{r.tid}", ([], []))[1][i] for i in _inside(top, r))
    first_in = [(e, e.args["Input Dims"][0], (e.args.get("Input type") or ["float"])[0]) for e in upd_calls.values()]
    groups = max(1, len({str(t) for _, d, t in first_in if isinstance(d, list) and d}))
    if param_bytes is None:
        param_bytes = _sidecar_param_bytes(g.source)
    if param_bytes is None:
        per_name: dict[tuple[int, str], float] = defaultdict(float)
        for e, d, t in first_in:
            if isinstance(d, list) and d:
                per_name[(_step_at(g, e.ts), e.name)] += math.prod(d) * DTYPE_BYTES.get(str(t), 4)
        param_bytes = int(min(per_name.values()))
    kept = {s: sum(1 for e in cs if not is_update(e)) for s, cs in calls.items()}
    if kernel_gbps is None:
        per_us = bw  # bytes per µs
    else:
        given = kernel_gbps(float(param_bytes)) if callable(kernel_gbps) else kernel_gbps
        per_us = _check_rate(given, f"kernel_gbps({param_bytes})" if callable(kernel_gbps) else "kernel_gbps") * 1e3
    fused = groups * dispatch + passes * param_bytes / per_us
    return _FusedModel(update, fused, groups, dict(calls), kept, dispatch, bw * 1e6 / 1e9, per_us / 1e3)


def _top_calls(trace: Trace, ranges: list[Event]) -> dict[str, tuple[list[float], list[Event]]]:
    """Per thread ``cpu:<pid>/<tid>``: the ``cpu_op`` calls inside an optimizer range that no other call
    contains (the calls Python made), sorted by start, with their starts."""
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in ranges:
        spans[f"cpu:{r.pid}/{r.tid}"].append((r.ts, r.end))
    out: dict[str, tuple[list[float], list[Event]]] = {}
    by_thread: dict[str, list[Event]] = defaultdict(list)
    for e in trace.events:
        key = f"cpu:{e.pid}/{e.tid}"
        if e.cat == "cpu_op" and key in spans and any(a <= e.ts and e.end <= b for a, b in spans[key]):
            by_thread[key].append(e)
    for key, evs in by_thread.items():
        evs.sort(key=lambda e: (e.ts, -e.dur))
        tops: list[Event] = []
        for e in evs:
            if not tops or e.ts >= tops[-1].end:
                tops.append(e)
        out[key] = ([e.ts for e in tops], tops)
    return out


def _covering(top: tuple[list[float], list[Event]], ts: float) -> Event | None:
    starts, evs = top
    k = bisect.bisect_right(starts, ts) - 1
    return evs[k] if k >= 0 and evs[k].end > ts else None


def _inside(top: dict[str, tuple[list[float], list[Event]]], r: Event) -> range:
    starts, _ = top.get(f"cpu:{r.pid}/{r.tid}", ([], []))
    return range(bisect.bisect_left(starts, r.ts), bisect.bisect_right(starts, r.end))


def _step_at(g: TaskGraph, ts: float) -> int:
    """The ``ProfilerStep`` number whose traced span holds ``ts`` (-1 none)."""
    st = g.steps
    k = int(np.searchsorted(st.start_us, ts, side="right")) - 1
    return int(st.ids[k]) if k >= 0 and ts < st.end_us[k] else -1


def _weighted_median(x: np.ndarray, w: np.ndarray) -> float:
    order = np.argsort(x)
    cw = np.cumsum(w[order])
    return float(x[order][int(np.searchsorted(cw, cw[-1] / 2))])


def _sidecar_param_bytes(source: str) -> int | None:
    """Total parameter bytes from the trace's ``trainsim profile`` sidecar, None without one."""
    import json

    from trainsim.capture.profile import sidecar_path

    if not (source.endswith(".json") or source.endswith(".json.gz")):
        return None
    side = sidecar_path(source)
    try:
        params = json.loads(side.read_text())["params"]
        return int(sum(int(p["bytes"]) for p in params)) or None
    except (OSError, ValueError, KeyError, TypeError):
        return None


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


# --------------------------------------------------------------------------- batch size
# Operators that do no per-element work: views, metadata changes and bare allocations. Their time is a
# fixed dispatch cost whatever the batch, so they never scale (the aten schema: they return aliases or
# uninitialised storage).
NO_WORK_OPS = re.compile(
    r"^aten::(t|transpose|view|_unsafe_view|reshape|_reshape_alias|expand|as_strided_?|permute|unsqueeze|squeeze"
    r"|select|slice|narrow|detach|alias|lift_fresh|empty|empty_like|empty_strided|resize_|set_|_to_copy_meta)$"
)
NOT_BATCH_LAYER = r"^Optimizer\.|^Optimizer\.zero_grad|^ProfilerStep#"


def batch_work(g: TaskGraph, trace: Trace, batch_size: int, param_shapes: Iterable[Sequence[int]] = ()) -> Mask:
    """Tasks of ``g`` whose work grows with the batch, decided from the operators' input shapes.

    (Steps below; ``_batch_ops`` also returns the operator event of each CPU task.)
    """
    return _batch_ops(g, trace, batch_size, param_shapes)[0]


def _batch_ops(
    g: TaskGraph, trace: Trace, batch_size: int, param_shapes: Iterable[Sequence[int]] = ()
) -> tuple[Mask, dict[int, Event]]:
    """``(batch_work's mask, {CPU task: the operator event it was cut from})``.

    1. Each CPU operator task and each runtime call is matched to the innermost ``cpu_op`` event of
       ``trace`` covering its start on its thread (the event the task was cut from).
    2. The op does batch work when one of its inputs (``Input Dims``, recorded with
       ``record_shapes=True``) has ``batch_size`` as its leading dimension and is not shaped like a
       parameter (``param_shapes``: a weight, its gradient, the optimizer's state). Forward and
       backward ops, the loss and the input batch qualify; per-parameter work (the optimizer step,
       gradient accumulation, DDP's bucket copies, communication) does not. Views and bare
       allocations (``NO_WORK_OPS``) never do. Where the op has no ``Input Dims``, layer
       attribution decides: inside a model layer's range, and not the optimizer's.
    3. GPU tasks inherit the decision of the runtime call that launched them; the calls themselves
       (launch overhead) and the untraced ``gap`` time stay fixed.
    """
    from trainsim.graph.build import GAP

    if not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch_work: batch_size={batch_size!r}; expected a positive integer")
    params = {tuple(int(d) for d in s) for s in param_shapes}
    threads: dict[str, list[Event]] = defaultdict(list)
    for e in trace.events:
        if e.cat == "cpu_op":
            threads[f"cpu:{e.pid}/{e.tid}"].append(e)
    layer_ok = np.zeros(len(g.symbols) + 1, np.bool_)
    for i, s in enumerate(g.symbols):
        layer_ok[i] = not re.search(NOT_BATCH_LAYER, s)
    in_model_layer = (g.layer >= 0) & layer_ok[g.layer]
    gap = g.symbol_id(GAP)
    host = np.isin(g.kind, [TaskKind.CPU, TaskKind.RUNTIME]) & (g.name != gap) & np.isfinite(g.ts_us)
    work = np.zeros(g.n_tasks, np.bool_)
    launched_by = np.zeros(g.n_tasks, np.bool_)
    op_of: dict[int, Event] = {}
    for r, res in enumerate(g.resources):
        evs = sorted(threads.get(res.name, ()), key=lambda e: (e.ts, -e.dur))
        starts = [e.ts for e in evs]
        for t in np.flatnonzero(host & (g.resource == r)):
            ts = float(g.ts_us[t])
            op = None
            for k in range(bisect.bisect_right(starts, ts) - 1, -1, -1):  # the innermost event covering ts
                if evs[k].end > ts:
                    op = evs[k]
                    break
            if op is None:
                continue
            dims = op.args.get("Input Dims")
            if isinstance(dims, list):
                batched = any(
                    isinstance(d, list) and d and d[0] == batch_size and tuple(d) not in params for d in dims
                )
            else:
                batched = bool(in_model_layer[t])
            batched = batched and NO_WORK_OPS.search(op.name) is None
            if g.kind[t] == TaskKind.RUNTIME:
                launched_by[t] = batched
            else:
                work[t] = batched
                op_of[int(t)] = op
    launch = (g.edge_kind == EdgeKind.LAUNCH) & launched_by[g.edge_src]
    work[g.edge_dst[launch]] = True
    return work & (g.kind != TaskKind.COMM), op_of


def batch_scale(
    g: TaskGraph,
    factor: float,
    *,
    trace: Trace,
    batch_size: int,
    param_shapes: Iterable[Sequence[int]] = (),
    cost: OpCostTable | None = None,
) -> TaskGraph:
    """The step at ``factor`` times the batch; ``trace`` is the parsed trace ``g`` was built from.

    1. ``batch_work`` picks the tasks whose work grows with the batch; everything else (per-parameter
       work, communication, launch and Python overheads) keeps its traced time.
    2. A batch-work CPU operator whose kind the machine's op cost model covers (``transform.opcost``:
       GEMMs, convolutions, memory-bound ops) takes ``traced time * model(new shapes) / model(old
       shapes)`` (a memory-bound op slower than its bytes' cost: that excess in proportion to the
       bytes, ``opcost.shape_ratio``'s ``traced_us``): the trace keeps its own level, the model gives the shape dependence (a GEMM on 32
       rows is far from twice one on 16: the weight is read once either way). New shapes: the batch
       dimension (the outermost in memory, i.e. largest stride) of every input not shaped like a
       parameter, when it equals ``batch_size``, times ``factor``.
    3. Other batch work (operators without a model or without ``Input Dims``, GPU kernels) scales
       linearly by ``factor``.

    ``cost``: the calibration (default ``opcost.load_or_calibrate()``: the cached one for this machine,
    or ~20 s of generic measurements the first time; never the workload being predicted).
    """
    if not (np.isfinite(factor) and factor > 0):
        raise UserError(f"batch_scale: factor={factor!r}; expected a number > 0")
    shapes = [tuple(int(d) for d in s) for s in param_shapes]
    work, op_of = _batch_ops(g, trace, batch_size, shapes)
    if not work.any():
        raise UserError(
            f"{g.source}: no task does batch work (no operator input with leading dimension {batch_size}); "
            "profile with record_shapes=True and give the batch size the trace was recorded with"
        )
    if cost is None:
        from trainsim.transform.opcost import load_or_calibrate

        cost = load_or_calibrate()
    params = set(shapes) | {s[::-1] for s in shapes}
    ratio = np.full(g.n_tasks, float(factor))
    cache: dict[int, float] = {}
    for t, op in op_of.items():
        if not work[t]:
            continue
        if op.pos not in cache:
            cache[op.pos] = _op_ratio(op, batch_size, factor, params, cost)
        ratio[t] = cache[op.pos]
    dur = g.dur_us.copy()
    dur[work] *= ratio[work]
    return g.with_columns(dur_us=dur)


def _op_ratio(op: Event, batch: int, factor: float, params: set[tuple[int, ...]], cost: OpCostTable) -> float:
    """``model(shapes at factor x batch) / model(traced shapes)`` of one operator; ``factor`` without a model."""
    from trainsim.transform.opcost import shape_ratio

    dims, strides = op.args.get("Input Dims"), op.args.get("Input Strides")
    if not isinstance(dims, list):
        return factor
    new: list[object] = []
    for i, d in enumerate(dims):
        if not (isinstance(d, list) and d and all(isinstance(x, int) for x in d)) or tuple(d) in params:
            new.append(d)
            continue
        st = strides[i] if isinstance(strides, list) and i < len(strides) else None
        outer = int(np.argmax(st)) if isinstance(st, list) and len(st) == len(d) and st else 0
        new.append([x * factor if k == outer and x == batch else x for k, x in enumerate(d)])
    r = shape_ratio(cost, op.name, dims, new, op.args.get("Input type"), strides, traced_us=op.dur)
    return factor if r is None or not np.isfinite(r) or r <= 0 else r


def batch_context(path: str | Path, trace: Trace | None = None) -> tuple[Trace, int, list[list[int]]]:
    """``(parsed trace, batch size, parameter shapes)`` of a trace written by ``trainsim profile`` or
    ``trainsim.run.traced`` (the batch size and shapes come from its sidecar ``<trace>.trainsim.json``);
    ``trace``: the trace at ``path`` already parsed (else it is read here)."""
    import json

    from trainsim.capture.kineto import read_trace
    from trainsim.capture.profile import sidecar_path

    side = sidecar_path(path)
    if not side.is_file():
        raise UserError(f"{path}: the batch what-if needs the trace's sidecar {side} (batch size, parameter "
                        "shapes), written by trainsim profile")  # fmt: skip
    try:
        meta = json.loads(side.read_text())
        batch = int(meta["batch_size"])
        shapes = [list(p["shape"]) for p in meta.get("params", [])]
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{side}: not a trainsim sidecar ({exc!r}); expected batch_size and params") from None
    return (trace if trace is not None else read_trace(path)), batch, shapes
