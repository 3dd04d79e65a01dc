"""How an operator's time changes with its shape on this machine: a one-off calibration and its interpolation.

    >>> from trainsim.transform import opcost
    >>> table = opcost.load_or_calibrate()                     # doctest: +SKIP  (~15 s the first time)
    >>> opcost.shape_ratio(table, "aten::mm", [[32, 1024], [1024, 1024]], [[64, 1024], [1024, 1024]])  # doctest: +SKIP
    1.62

The batch what-if (``whatifs.batch_scale``) predicts an operator's time at a new shape as its *traced*
time times ``model(new shape) / model(old shape)``: the trace keeps its own level (the machine's load,
the profiler's overhead), the model supplies only the shape dependence. The model is a table of
times measured once on this machine over a fixed grid of generic sizes (powers of two, never the
workload being predicted), interpolated in log space:

- ``matmul_nn/nt/tn/tt`` (``aten::mm``, ``aten::addmm``, ``aten::bmm``; the layout from the trace's
  ``Input Strides``): ``torch.mm`` at ``(m, k, n)``, each of 1, 4, 16 .. 4096;
- ``conv_fwd`` / ``conv_bwd`` (``aten::mkldnn_convolution`` and the other convolution kernels,
  ``aten::convolution_backward``): a 3x3, stride-1, padding-1 convolution with ``C`` channels in and
  out on an ``H x H`` image, at ``(N, C, H)``; a traced convolution queries ``(N, sqrt(C_in C_out),
  sqrt(H W))`` (its kernel size and stride only change the level, which cancels in the ratio);
- ``elementwise`` (memory-bound operators, ``ELEMENTWISE_OPS``): out-of-place ``torch.add`` (two reads,
  one newly allocated write) by bytes moved; a traced op moves the bytes of its tensor inputs plus
  one output as large as its largest input. A traced op slower than that (pooling, batch norm) scales
  the excess with its bytes (``shape_ratio``'s ``traced_us``).

Outside the grid, time is constant below the smallest size (a call there costs its dispatch) and
linear in each size above the largest one (throughput-bound); each timed call reads fresh copies of its operands
(``ROTATE_BYTES``), as a training step's operators do; grid points beyond ``MAX_MACS``
multiply-accumulates are not measured but extrapolated linearly along their first axis (GEMM and
convolution time is linear in the rows / the batch at that size). The table is saved as JSON in
``default_path()`` with the machine's identity; a different machine, torch or thread count
recalibrates. Calibration runs with one intra-op thread, as ``trainsim profile`` and
``trainsim.run.traced`` record traces.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainsim.errors import UserError

CALIBRATION_VERSION = 2
MAX_MACS = 2**27
"""grid points with more multiply-accumulates are extrapolated, not measured (keeps calibration < 30 s:
2^27 MACs is ~2-5 ms for one CPU core)"""
MIN_REPEAT_S = 2e-3
"""each grid point repeats until this much time has passed (at least 3 times); the minimum is kept,
timeit's convention: higher values are interference from other processes, not the operator"""

_MM_AXES = (tuple(4**i for i in range(7)),) * 3  # m, k, n: 1, 4, 16 .. 4096
AXES: dict[str, tuple[tuple[int, ...], ...]] = {
    "matmul_nn": _MM_AXES,
    "matmul_nt": _MM_AXES,
    "matmul_tn": _MM_AXES,
    "matmul_tt": _MM_AXES,
    "conv_fwd": (
        tuple(2**i for i in range(10)),
        tuple(2**i for i in range(2, 8)),
        tuple(2**i for i in range(2, 6)),
    ),
    "conv_bwd": (
        tuple(2**i for i in range(10)),
        tuple(2**i for i in range(2, 8)),
        tuple(2**i for i in range(2, 6)),
    ),
    "elementwise": (
        tuple(12 * 2**i for i in range(4, 24)),
    ),  # bytes of c = a + b (float32): 192 B .. 192 MiB
}
"""the calibration grid of every kind: conv axes are (batch N, channels C, image side H); the matmul kinds
are the operands' layouts (``t``: a transposed view, column-major; BLAS runs different code for each)"""
ROTATE_BYTES = 2 * 2**20
"""each timed call reads its operands from a fresh copy, the copies together at least twice the core's
private (L2) cache (read from sysfs, else this): in a training step an operator's inputs were last
touched several operators ago, so they come from the shared cache or memory, not from L2. Timing a hot
operand 100 times instead makes a 4 MB weight look free and GEMM time linear in the batch.
Memory-bound operators (``elementwise``) rotate over twice the *last-level* cache instead: they do
little work per byte, and in a step their activations were written by the forward pass long before
(a CNN at batch 32 holds tens of MB of them), so they stream from memory. Rotated over L2 only, a 12 MB
add stays in a 32 MB L3 and the next size up does not, and the table makes doubling the batch cost a
relu 5x (measured 2.2-2.7x on this project's CNN pair, ``trainsim validate whatif``)."""
MAX_COPIES = 64

MATMUL_OPS = re.compile(r"^aten::(mm|addmm|bmm|baddbmm)$")
CONV_FWD_OPS = re.compile(r"^aten::(mkldnn_convolution|_slow_conv2d_forward|thnn_conv2d|_nnpack_spatial_convolution"
                          r"|cudnn_convolution|miopen_convolution)$")  # fmt: skip
CONV_BWD_OPS = re.compile(r"^aten::(convolution_backward|_slow_conv2d_backward|mkldnn_convolution_backward)$")
ELEMENTWISE_OPS = re.compile(
    r"^aten::(add|sub|mul|div|neg|relu|relu_|clamp_min|clamp_min_|threshold_backward|gelu|gelu_backward|silu"
    r"|silu_backward|sigmoid|sigmoid_backward|tanh|tanh_backward|exp|log|sqrt|rsqrt|pow|copy_|fill_|zero_|normal_"
    r"|uniform_|bernoulli_|native_dropout|native_dropout_backward|masked_fill_?|where|clone|sum|mean|"
    r"_log_softmax|_log_softmax_backward_data|_softmax|_softmax_backward_data|native_batch_norm"
    r"|native_batch_norm_backward|native_layer_norm|native_layer_norm_backward|max_pool2d_with_indices"
    r"|max_pool2d_with_indices_backward|avg_pool2d|avg_pool2d_backward|adaptive_avg_pool2d|_adaptive_avg_pool2d"
    r"|_adaptive_avg_pool2d_backward)_?$"
)
"""memory-bound operators: their time follows the bytes they move (pointwise ops, reductions, norms, pooling)"""

DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "half": 2, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8,
}  # fmt: skip
"""bytes per element of the dtype names torch.profiler writes in ``Input type`` (4 when unknown)"""

Dims = Sequence[Any]


@dataclass(frozen=True, slots=True)
class OpCostTable:
    """Measured times (µs) of every kind on its grid (``AXES``), and the machine they were measured on."""

    axes: dict[str, tuple[tuple[int, ...], ...]]
    us: dict[str, np.ndarray]  # kind -> array of shape (len(axis) for axis in axes[kind])
    machine: dict[str, Any]
    created: str = ""

    def __post_init__(self) -> None:
        for kind, arr in self.us.items():
            shape = tuple(len(a) for a in self.axes[kind])
            if arr.shape != shape or not (np.isfinite(arr) & (arr > 0)).all():
                raise UserError(f"op cost table: {kind} has times of shape {arr.shape} (expected {shape}) "
                                "or times that are not positive; recalibrate")  # fmt: skip

    def time_us(self, kind: str, point: Sequence[float]) -> float:
        """The model's time of ``kind`` at ``point`` (one size per axis): multilinear interpolation of
        log time over log size; constant below the grid, linear in each size above it."""
        axes, arr = self.axes[kind], self.us[kind]
        if len(point) != len(axes):
            raise UserError(
                f"op cost {kind}: point {tuple(point)} has {len(point)} sizes; expected {len(axes)}"
            )
        lo_idx, weights, extra = [], [], 1.0
        for x, axis in zip(point, axes, strict=True):
            x = max(float(x), 1e-12)
            lx, la = math.log2(x), np.log2(np.asarray(axis, np.float64))
            if lx >= la[-1]:
                extra *= x / axis[-1]
                lo_idx.append(len(axis) - 2)
                weights.append(1.0)
            elif lx <= la[0]:
                lo_idx.append(0)
                weights.append(0.0)
            else:
                i = int(np.searchsorted(la, lx, side="right")) - 1
                lo_idx.append(i)
                weights.append((lx - la[i]) / (la[i + 1] - la[i]))
        log_t = np.log(arr)
        acc = 0.0
        for corner in range(2 ** len(axes)):
            w, idx = 1.0, []
            for d in range(len(axes)):
                hi = (corner >> d) & 1
                w *= weights[d] if hi else 1.0 - weights[d]
                idx.append(lo_idx[d] + hi)
            if w:
                acc += w * float(log_t[tuple(idx)])
        return math.exp(acc) * extra

    def to_json(self) -> dict[str, Any]:
        return {"version": CALIBRATION_VERSION, "machine": self.machine, "created": self.created,
                "axes": {k: [list(a) for a in v] for k, v in self.axes.items()},
                "us": {k: np.round(v, 3).tolist() for k, v in self.us.items()}}  # fmt: skip

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> OpCostTable:
        axes = {k: tuple(tuple(int(x) for x in a) for a in v) for k, v in doc["axes"].items()}
        return cls(axes=axes, us={k: np.asarray(v, np.float64) for k, v in doc["us"].items()},
                   machine=dict(doc["machine"]), created=str(doc.get("created", "")))  # fmt: skip


# --------------------------------------------------------------------------- shapes -> model points
def _tensors(dims: Dims, types: Sequence[Any] | None) -> list[tuple[list[float], int]]:
    """``(shape, bytes per element)`` of each tensor input (a non-empty list of ints)."""
    out = []
    for i, d in enumerate(dims):
        if isinstance(d, list) and d and all(isinstance(x, int | float) for x in d):
            t = types[i] if types is not None and i < len(types) else "float"
            out.append((d, DTYPE_BYTES.get(str(t), 4)))
    return out


def tensor_bytes(dims: Dims, types: Sequence[Any] | None = None) -> tuple[int, int]:
    """``(bytes read, largest tensor's bytes)`` of an operator's tensor inputs (``Input Dims``/``Input type``)."""
    sizes = [int(math.prod(s) * b) for s, b in _tensors(dims, types)]
    return sum(sizes), max(sizes, default=0)


def op_kind(name: str) -> str | None:
    """The family that models operator ``name`` (matmul, conv_fwd, conv_bwd, elementwise), None when none does."""
    if MATMUL_OPS.search(name):
        return "matmul"
    if CONV_FWD_OPS.search(name):
        return "conv_fwd"
    if CONV_BWD_OPS.search(name):
        return "conv_bwd"
    if ELEMENTWISE_OPS.search(name):
        return "elementwise"
    return None


def model_point(
    name: str, dims: Dims, types: Sequence[Any] | None = None, strides: Sequence[Any] | None = None
) -> tuple[str, list[float], float] | None:
    """``(kind, point, multiplier)``: the op's modelled time is ``multiplier * table.time_us(kind, point)``;
    None when the op has no model or its shapes do not fit one. ``strides`` (``Input Strides``) tell a
    matmul's layout (NN without them)."""
    kind = op_kind(name)
    if kind == "matmul":
        mats = [i for i, d in enumerate(dims) if isinstance(d, list) and len(d) >= 2][-2:]
        if len(mats) != 2:
            return None
        a, b = dims[mats[0]], dims[mats[1]]
        if a[-1] != b[-2]:
            return None
        layout = "".join("t" if _transposed(dims[i], strides, i) else "n" for i in mats)
        return (
            f"matmul_{layout}",
            [a[-2], a[-1], b[-1]],
            float(math.prod(a[:-2]) or 1),
        )  # bmm: a batch of GEMMs
    ts = [s for s, _ in _tensors(dims, types)]
    if kind in ("conv_fwd", "conv_bwd"):
        four = [s for s in ts if len(s) == 4]
        if kind == "conv_fwd" and len(four) >= 2:
            x, w = four[0], four[1]
        elif kind == "conv_bwd" and len(four) >= 3:
            x, w = four[1], four[2]  # (grad_output, input, weight, ...)
        else:
            return None
        return kind, [x[0], math.sqrt(x[1] * w[0]), math.sqrt(x[2] * x[3])], 1.0
    if kind == "elementwise":
        read, largest = tensor_bytes(dims, types)
        return (kind, [read + largest], 1.0) if read else None
    return None


def _transposed(shape: list[int], strides: Sequence[Any] | None, i: int) -> bool:
    """A 2-d (or batched) operand stored column-major: its last dimension is not the contiguous one."""
    if (
        strides is None
        or i >= len(strides)
        or not isinstance(strides[i], list)
        or len(strides[i]) != len(shape)
    ):
        return False
    return shape[-1] > 1 and strides[i][-1] != 1


def shape_ratio(
    table: OpCostTable,
    name: str,
    old: Dims,
    new: Dims,
    types: Sequence[Any] | None = None,
    strides: Sequence[Any] | None = None,
    traced_us: float | None = None,
) -> float | None:
    """``model(new) / model(old)`` for operator ``name``, None when it has no model. ``new`` keeps the
    layout (``strides``) of ``old``.

    ``traced_us``: the operator's traced time. A memory-bound kind's table (``elementwise``: an add) says
    what moving the op's bytes costs; a traced op slower than that does per-element work besides (max
    pooling's comparisons and indices, batch norm's statistics: on this project's CNN 8-20x the add's
    time for their bytes), and that work grows with the elements, not along the table's cache and memory
    curve. So the share ``f = min(1, model(old) / traced_us)`` takes the table's ratio and the rest the
    ratio of the bytes: ``f * model(new) / model(old) + (1 - f) * bytes(new) / bytes(old)``."""
    a, b = model_point(name, old, types, strides), model_point(name, new, types, strides)
    if a is None or b is None or a[0] != b[0] or a[0] not in table.us:
        return None
    t_old, t_new = a[2] * table.time_us(a[0], a[1]), b[2] * table.time_us(b[0], b[1])
    ratio = t_new / t_old
    if a[0] == "elementwise" and traced_us is not None and traced_us > t_old:
        share = t_old / traced_us
        ratio = share * ratio + (1.0 - share) * (b[1][0] / a[1][0])
    return ratio


# --------------------------------------------------------------------------- calibration
def default_path() -> Path:
    """``$XDG_CACHE_HOME/trainsim/opcost.json`` (``~/.cache/trainsim/opcost.json``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trainsim" / "opcost.json"


def cpu_model() -> str:
    """The processor's model name (Linux's /proc/cpuinfo), else what ``platform`` knows."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine_identity(threads: int = 1) -> dict[str, Any]:
    """What makes a calibration valid: the CPU, its core count, torch, and the intra-op threads used."""
    import torch

    return {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__, "threads": threads,
            "host": platform.node(), "version": CALIBRATION_VERSION}  # fmt: skip


def _cache_bytes(level: int | None = None, root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """Size of the data cache at ``level`` (None: the last level) of cpu0, from sysfs; 0 when unknown."""
    sizes: dict[int, int] = {}
    with contextlib.suppress(OSError, ValueError):
        for d in sorted(root.glob("index*")):
            if (d / "type").read_text().strip() == "Instruction":
                continue
            text = (d / "size").read_text().strip()
            scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
            sizes[int((d / "level").read_text())] = int(text.rstrip("KMG")) * scale
    if not sizes:
        return 0
    return sizes.get(level, 0) if level is not None else sizes[max(sizes)]


def _l2_bytes() -> int:
    return _cache_bytes(2) or ROTATE_BYTES // 2


def _best_us(fn: Callable[[int], object]) -> float:
    """The fastest of the timed calls ``fn(i)`` (``i`` picks the operand copy)."""
    fn(0)  # warm-up: first-call allocation and dispatch caches
    best, spent, n = math.inf, 0.0, 0
    while n < 3 or spent < MIN_REPEAT_S:
        n += 1
        t0 = time.perf_counter()
        fn(n)
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
    return best * 1e6


def _fill(arr: np.ndarray, axes: tuple[tuple[int, ...], ...]) -> np.ndarray:
    """Unmeasured points (NaN, beyond ``MAX_MACS``): the point below along the first axis that has one,
    times the size ratio (linear in that size), filled in increasing order."""
    out = arr.copy()
    for idx in np.ndindex(*out.shape):
        if np.isnan(out[idx]):
            for d in range(len(axes)):
                if idx[d] > 0:
                    below = list(idx)
                    below[d] -= 1
                    out[idx] = out[tuple(below)] * axes[d][idx[d]] / axes[d][idx[d] - 1]
                    break
    return out


def calibrate(log: Callable[[str], None] = lambda s: None) -> OpCostTable:
    """Measure every kind on its grid (``AXES``) with one intra-op thread; ~15-25 s on one CPU core."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    start = time.perf_counter()
    rotate = {"compute": 2 * _l2_bytes(), "memory": 2 * max(_cache_bytes(), _l2_bytes())}
    us: dict[str, np.ndarray] = {}

    def copies(nbytes: int, span: str = "compute") -> int:
        return max(1, min(MAX_COPIES, -(-rotate[span] // max(nbytes, 1))))

    try:
        with torch.no_grad():
            for kind in AXES:
                us[kind] = _measure(torch, kind, copies)
    finally:
        torch.set_num_threads(threads)
    log(f"op cost calibration: {time.perf_counter() - start:.1f} s")
    return OpCostTable(axes=dict(AXES), us=us, machine=machine_identity(1),
                       created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))  # fmt: skip


def _measure(torch: Any, kind: str, copies: Callable[..., int]) -> np.ndarray:
    """One kind's table (each point with enough operand copies to leave the private cache)."""
    if kind.startswith("matmul_"):
        lay = kind[-2:]
        return _fill(_grid(kind, lambda p: _mm(torch, p, lay, copies(4 * (p[0] + p[2]) * p[1])),
                           lambda p: p[0] * p[1] * p[2]), AXES[kind])  # fmt: skip
    if kind.startswith("conv_"):
        bwd = kind == "conv_bwd"
        return _fill(_grid(kind, lambda p: _conv(torch, p, bwd, copies(4 * p[1] * (p[0] * p[2] ** 2 + 9 * p[1]))),
                           lambda p: p[0] * p[1] * p[1] * p[2] * p[2] * 9), AXES[kind])  # fmt: skip
    return _grid(kind, lambda p: _add(torch, p[0] // 12, copies(p[0] * 2 // 3, "memory")), lambda p: 0)


def _grid(kind: str, make: Callable[[tuple[int, ...]], Callable[[int], object]],
          macs: Callable[[tuple[int, ...]], int]) -> np.ndarray:  # fmt: skip
    axes = AXES[kind]
    arr = np.full([len(a) for a in axes], np.nan)
    for idx in np.ndindex(*arr.shape):
        p = tuple(a[i] for a, i in zip(axes, idx, strict=True))
        if macs(p) <= MAX_MACS:
            arr[idx] = _best_us(make(p))
    return arr


def _mm(torch: Any, p: tuple[int, ...], layout: str, r: int) -> Callable[[int], object]:
    m, k, n = p
    a = [torch.randn(k, m).t() if layout[0] == "t" else torch.randn(m, k) for _ in range(r)]
    b = [torch.randn(n, k).t() if layout[1] == "t" else torch.randn(k, n) for _ in range(r)]
    return lambda i: torch.mm(a[i % r], b[i % r])


def _conv(torch: Any, p: tuple[int, ...], backward: bool, r: int) -> Callable[[int], object]:
    n, c, h = p
    x = [torch.randn(n, c, h, h) for _ in range(r)]
    w = [torch.randn(c, c, 3, 3) for _ in range(r)]
    bias = torch.randn(c)
    conv = torch.ops.aten.convolution
    if not backward:
        return lambda i: conv(x[i % r], w[i % r], bias, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    gy = [torch.randn(n, c, h, h) for _ in range(r)]
    bwd = torch.ops.aten.convolution_backward
    return lambda i: bwd(gy[i % r], x[i % r], w[i % r], [c], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                         [True, True, True])  # fmt: skip


def _add(torch: Any, numel: int, r: int) -> Callable[[int], object]:
    a = [torch.randn(numel) for _ in range(r)]
    b = [torch.randn(numel) for _ in range(r)]
    return lambda i: torch.add(a[i % r], b[i % r])


def load_or_calibrate(
    path: str | Path | None = None, *, recalibrate: bool = False, log: Callable[[str], None] = lambda s: None
) -> OpCostTable:
    """The calibration saved at ``path`` (``default_path()``) when it was made on this machine with this
    torch, else a fresh one (saved there; ``recalibrate`` forces it)."""
    p = Path(path) if path is not None else default_path()
    if not recalibrate and p.is_file():
        try:
            doc = json.loads(p.read_text())
            table = OpCostTable.from_json(doc)
            if doc.get("version") == CALIBRATION_VERSION and _same_machine(
                table.machine, machine_identity(1)
            ):
                return table
            log(f"{p}: calibrated on another machine or torch; recalibrating")
        except (ValueError, KeyError, TypeError, UserError) as exc:
            log(f"{p}: unreadable op cost calibration ({exc!r}); recalibrating")
    table = calibrate(log)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + f".{os.getpid()}.partial")
    tmp.write_text(json.dumps(table.to_json()) + "\n")
    tmp.replace(p)
    return table


def _same_machine(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(k) == b.get(k) for k in ("cpu", "cores", "torch", "threads", "host"))
