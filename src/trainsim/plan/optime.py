"""Operator time: a roofline with size-dependent efficiency, and a learned regression.

    >>> from trainsim.plan.devices import gpu
    >>> from trainsim.plan.optime import DEFAULT_EFFICIENCY, op_time_s
    >>> from trainsim.plan.workload import Op, OpKind
    >>> gemm = Op("fc1", OpKind.GEMM, 2.0 * 4096 * 4096 * 4096, 3 * 2 * 4096 * 4096, 4096, 4096, 4096)
    >>> round(op_time_s(gemm, gpu("a100-80gb"), DEFAULT_EFFICIENCY) * 1e3, 3)  # ms
    0.696

**Roofline.** ``t = max(flops / (peak * e(kind, size)), bytes / (hbm * e_mem))`` where the compute
efficiency of a matmul saturates with its size, ``e(x) = e_max * x / (x + x_half)`` with ``x`` the FLOPs
of one kernel launch (a small GEMM cannot fill the GPU; a large one approaches ``e_max``). Attention
matmuls (short inner dimension, batched) use the same curve scaled by ``attn_scale``. A fused attention
kernel reaches its own published peak utilisation (``ATTN_KERNEL_UTIL``: FlashAttention-2 or a Hopper
kernel, FlashAttention-3 / cuDNN) times ``flash_scale``, on the same size curve. Memory-bound
operators run at ``e_mem`` of datasheet bandwidth. ``e_max`` and ``x_half`` are calibrated against the
published Megatron-LM measurements (``calibrate.py``, leave-one-out error reported in
docs/benchmarks/plan.md); the rest are fixed and cited below.

**Learned.** ``LearnedOpModel`` is ridge regression of log time on operator features (log FLOPs, log
bytes, log GEMM dims, their squares, operator kind). It is fitted on operator times profiled on the
machine at hand (``profile_ops``) and replaces per-configuration profiling the way pipeDejavu proposed
(research/planner_groundtruth.md §1a); ``fit_roofline`` fits the roofline's constants to the same data
so the two can be compared on operators neither was fitted on (``benchmarks/plan_optime.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from trainsim.cluster.collectives import ring_share
from trainsim.errors import UserError
from trainsim.plan.devices import Gpu
from trainsim.plan.workload import LayerCost, Op, OpKind


@dataclass(frozen=True, kw_only=True, slots=True)
class Efficiency:
    """Achieved fractions of datasheet peaks."""

    gemm_max: float = 0.6549
    """asymptotic fraction of peak tensor FLOP/s for large GEMMs (calibrated, calibrate.py)"""
    gemm_half_gflop: float = 4.0
    """GEMM size (GFLOP per launch) at which half of gemm_max is reached (calibrated)"""
    attn_scale: float = 0.75
    """attention matmuls reach this fraction of an equal-sized GEMM (short k=head_dim, batched): assumption"""
    flash_scale: float = 0.60
    """a fused attention kernel in training (forward and backward, causal masking, the shapes of real
    models) reaches this fraction of the kernel's published peak utilisation (``ATTN_KERNEL_UTIL``); fitted
    on the development set (benchmarks/plan_devset.py, all 51 rows: 0.603; 0.56-0.63 with one source left out),
    which Table 1 (unfused attention) cannot constrain"""
    mem: float = 0.80
    """fraction of HBM bandwidth for elementwise kernels; A100 STREAM-like copies reach ~0.8-0.9 (assumption)"""
    nvlink: float = 0.65
    """NCCL bus bandwidth / NVLink datasheet; calculon systems/a100_80g.json uses 0.65 for 8 GPUs"""
    network: float = 0.90
    """NCCL bus bandwidth / NIC line rate; calculon systems/a100_80g.json uses 0.9 for InfiniBand"""
    hopper_scale: float = 0.78
    """Hopper GPUs (those with FP8 tensor cores) reach this fraction of the A100-calibrated matmul
    efficiency: sustained clocks under training load sit below the boost clock the datasheet peak assumes,
    and HBM feeds fewer bytes per FLOP. Fitted in-sample on the development set (benchmarks/plan_devset.py,
    all 51 rows: 0.776; 0.77-0.79 with one source left out); Table 1 (A100) cannot constrain it"""
    fp8_scale: float = 1.0
    """FP8 GEMMs reach this fraction of the 16-bit efficiency at twice the peak; fitted in-sample on the
    development set (all rows and every leave-one-source-out fit: 1.0, the top of its range)"""
    overlap: float = 1.0
    """fraction of a layer's compute that can hide a concurrent collective (FSDP prefetch, ring-attention
    steps, --comm-overlap): NCCL kernels take SMs and memory bandwidth from the GEMMs they overlap. Fitted
    in-sample on the development set (all rows: 1.0, the top of its range; 0.94-1.0 with one source left out)"""
    launch_us: float = 4.0
    """fixed cost per kernel (launch + tail), microseconds (assumption)"""
    comm_latency_us: float = 10.0
    """fixed cost per collective or point-to-point transfer, microseconds (assumption)"""
    ring_hop_us: float = 1.0
    """latency of one step of a ring all-gather / reduce-scatter (n - 1 steps over n ranks); NCCL runs
    these as rings, so their latency grows linearly with the group (assumption, order of NVLink/IB hops)"""

    def __post_init__(self) -> None:
        for f in ("gemm_max", "attn_scale", "flash_scale", "mem", "nvlink", "network", "overlap", "fp8_scale", "hopper_scale"):
            v = getattr(self, f)
            if not 0 < v <= 1.0:
                raise ValueError(f"Efficiency.{f}={v}; expected a fraction in (0, 1]")
        if self.gemm_half_gflop < 0:
            raise ValueError("Efficiency.gemm_half_gflop must be >= 0")


# Peak utilisation of fused attention kernels (fraction of dense 16-bit peak, forward, head_dim 128), by
# kernel and GPU generation. Hopper: tritonbench on an H100 with torch 2.6.0.dev20241204 (pytorch/pytorch
# issue #142132): SDPA's FlashAttention-2 329 TFLOP/s, cuDNN 631, FlashAttention-3 632 at (1, 24, 4608, 128),
# of 989 dense; the FlashAttention-3 paper (Shah et al., 2024) gives 35 % for FlashAttention-2 on H100.
# Ampere: the FlashAttention-2 paper (Dao, 2023) reaches 50-73 % of A100 peak; the middle is taken.
# Backward (ATTN_KERNEL_BWD_UTIL): the FlashAttention-3 paper's H100 benchmark, head_dim 128, sequence 16k:
# FlashAttention-2 322, cuDNN 516, FlashAttention-3 561 TFLOP/s (fa3 takes the mean of the last two, 538);
# on Ampere FlashAttention-2's backward keeps the forward's ratio measured on Hopper (322 / 329).
ATTN_KERNELS = ("auto", "fa2", "fa3")
"""auto: the best kernel the GPU has (fa3 on Hopper, else fa2); fa3 also stands for cuDNN's fused attention"""
ATTN_KERNEL_UTIL = {("fa2", False): 0.62, ("fa2", True): 0.333, ("fa3", True): 0.638}
ATTN_KERNEL_BWD_UTIL = {("fa2", False): 0.62 * 322 / 329, ("fa2", True): 322 / 989, ("fa3", True): 538 / 989}
FP8_CAST_BYTES = 4.0
"""bytes per element to cast a 16-bit GEMM operand to FP8 and keep its transpose for the backward pass
(read 2, write 1 + 1: Transformer Engine's fused cast-transpose)"""


def attn_kernel_util(kernel: str, gpu: Gpu, backward: bool = False) -> float:
    """Published peak utilisation of fused attention ``kernel`` (``ATTN_KERNELS``) on ``gpu``, forward or
    backward."""
    hopper = gpu.fp8_tflops > 0
    if kernel == "auto":
        kernel = "fa3" if hopper else "fa2"
    if (kernel, hopper) not in ATTN_KERNEL_UTIL:
        raise UserError(f"--attn-kernel {kernel}: needs a Hopper GPU (h100, h800, h200); {gpu.name} runs fa2")
    return (ATTN_KERNEL_BWD_UTIL if backward else ATTN_KERNEL_UTIL)[(kernel, hopper)]


# Calibrated against research/megatron_table1.csv with benchmarks/plan_accuracy.py (all ten rows;
# leave-one-out error is reported there). Re-run it to re-calibrate after changing the model.
DEFAULT_EFFICIENCY = Efficiency()


def gemm_efficiency(flops: float, eff: Efficiency) -> float:
    x = flops / 1e9
    return eff.gemm_max * x / (x + eff.gemm_half_gflop)


def op_time_s(op: Op, gpu: Gpu, eff: Efficiency, fp8: bool = False, attn: str = "auto") -> float:
    """Forward time of one operator on ``gpu`` (seconds).

    ``fp8``: linear layers (GEMM kind) run on the FP8 tensor cores at ``fp8_tflops`` times the 16-bit
    efficiency times ``eff.fp8_scale``, plus one memory pass over the GEMM's input to write its FP8 copy and
    the transpose the weight gradient needs (``FP8_CAST_BYTES`` per element; the backward's gradient casts
    scale with it through ``op.bwd``); attention and elementwise kernels stay 16-bit, as in Transformer
    Engine's FP8 recipes. The pass is charged whether the cast is a kernel of its own (``te.Linear``) or
    fused into the norm before it (LayerNormLinear, torch.compile): the development set does not support
    dropping it for fused stacks (docs/log/plan.md, 2026-11-29).
    ``attn``: the fused attention kernel (``ATTN_KERNELS``). Eager elementwise kernels are priced through
    their operators' bytes (``workload``).
    """
    bw = gpu.hbm_gbps * 1e9 * eff.mem
    t_mem = op.bytes / bw
    if op.kind == OpKind.MEM:
        t = t_mem
    elif op.kind == OpKind.FLASH:
        x = op.flops / 1e9
        e = attn_kernel_util(attn, gpu) * eff.flash_scale * x / (x + eff.gemm_half_gflop)
        t = max(op.flops / (gpu.peak_tflops * 1e12 * e), t_mem)
    else:
        # a batch of GEMMs (grouped expert GEMMs) reaches the efficiency of one of its members
        size = op.flops / op.batch if op.kind == OpKind.GEMM else op.flops
        e = gemm_efficiency(size, eff) * (eff.attn_scale if op.kind == OpKind.ATTN else 1.0)
        if gpu.fp8_tflops:
            e *= eff.hopper_scale
        peak, cast = gpu.peak_tflops, 0.0
        if fp8 and op.kind == OpKind.GEMM:
            peak, e = gpu.fp8_tflops, e * eff.fp8_scale
            # the input's cast is a separate kernel before the GEMM; weights are cast once per step and
            # cached across micro-batches (Transformer Engine's is_first_microbatch), so they are left out
            cast = FP8_CAST_BYTES * op.batch * op.m * op.k / bw
        t = max(op.flops / (peak * 1e12 * e), t_mem) + cast
    return t + eff.launch_us * 1e-6


@dataclass(frozen=True, slots=True)
class LayerTime:
    """Seconds for one layer, one micro-batch, one GPU."""

    fwd: float
    bwd: float
    core_fwd: float  # forward time of the attention core (what selective recomputation repeats)


_LAYER_CACHE: dict[tuple[int, Gpu, Efficiency, bool, str], tuple[LayerCost, LayerTime]] = {}


def layer_time(layer: LayerCost, gpu: Gpu, eff: Efficiency, fp8: bool = False, attn: str = "auto") -> LayerTime:
    key = (id(layer), gpu, eff, fp8, attn)
    hit = _LAYER_CACHE.get(key)
    if hit is not None and hit[0] is layer:
        return hit[1]
    fwd = bwd = core = 0.0
    flash_bwd = 1.0  # a fused attention kernel's backward runs at its own utilisation
    if any(op.kind == OpKind.FLASH for op in layer.ops):
        flash_bwd = attn_kernel_util(attn, gpu) / attn_kernel_util(attn, gpu, backward=True)
    for op in layer.ops:
        t = op_time_s(op, gpu, eff, fp8, attn)
        fwd += t
        bwd += t * op.bwd * (flash_bwd if op.kind == OpKind.FLASH else 1.0)
        if op.core:
            core += t
    lt = LayerTime(fwd, bwd, core)
    if len(_LAYER_CACHE) > 100_000:
        _LAYER_CACHE.clear()
    _LAYER_CACHE[key] = (layer, lt)
    return lt


# =============================================================================== collectives
# The ring's bytes per rank are ``cluster.collectives.ring_share``'s; the bandwidth reached (``Efficiency``) and
# the latency terms (``comm_latency_us`` on a log2 tree of rings) are the planner's own.
def ring_allreduce_s(size_bytes: float, n: int, bw_gbyte_s: float, eff: Efficiency, *, on_nvlink: bool) -> float:
    """Ring all-reduce time: 2(n-1)/n * size / bus bandwidth + latency (NCCL's bus-bandwidth convention)."""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    e = eff.nvlink if on_nvlink else eff.network
    wire = ring_share("allreduce", n) * size_bytes / (bw_gbyte_s * 1e9 * e)
    return wire + eff.comm_latency_us * 1e-6 * math.log2(2 * n)


def gather_s(size_bytes: float, n: int, bw_gbyte_s: float, eff: Efficiency, *, on_nvlink: bool) -> float:
    """All-gather or reduce-scatter of a ``size_bytes`` full buffer: half an all-reduce."""
    return 0.5 * ring_allreduce_s(size_bytes, n, bw_gbyte_s, eff, on_nvlink=on_nvlink)


def p2p_s(size_bytes: float, bw_gbyte_s: float, eff: Efficiency, *, on_nvlink: bool) -> float:
    """One send of ``size_bytes`` to one peer: the bytes at the bandwidth reached, plus the fixed latency."""
    if size_bytes <= 0:
        return 0.0
    e = eff.nvlink if on_nvlink else eff.network
    return ring_share("p2p", 2) * size_bytes / (bw_gbyte_s * 1e9 * e) + eff.comm_latency_us * 1e-6


# =============================================================================== learned model
def op_features(ops: Sequence[Op]) -> np.ndarray:
    """Feature matrix: [1, lf, lb, lf^2, lb^2, lf*lb, log m, log n, log k, log batch, gemm, attn]."""
    rows = []
    for op in ops:
        lf = math.log10(max(op.flops, 1.0))
        lb = math.log10(max(op.bytes, 1.0))
        lm, ln, lk = (math.log10(max(v, 1)) for v in (op.m, op.n, op.k))
        rows.append(
            [1.0, lf, lb, lf * lf, lb * lb, lf * lb, lm, ln, lk, math.log10(max(op.batch, 1)),
             float(op.kind == OpKind.GEMM), float(op.kind in (OpKind.ATTN, OpKind.FLASH))]
        )
    return np.asarray(rows, np.float64).reshape(-1, 12)


@dataclass(frozen=True, slots=True)
class LearnedOpModel:
    """Ridge regression of log10(seconds) on ``op_features``."""

    coef: np.ndarray

    @staticmethod
    def fit(ops: Sequence[Op], seconds: Sequence[float], ridge: float = 1e-3) -> LearnedOpModel:
        x = op_features(ops)
        y = np.log10(np.asarray(seconds, np.float64))
        mu = x.std(axis=0)
        mu[mu == 0] = 1.0
        xs = x / mu
        a = xs.T @ xs + ridge * np.eye(xs.shape[1])
        coef = np.linalg.solve(a, xs.T @ y) / mu
        return LearnedOpModel(coef)

    def predict_s(self, ops: Sequence[Op]) -> np.ndarray:
        return np.asarray(10.0 ** (op_features(ops) @ self.coef))


@dataclass(frozen=True, slots=True)
class RooflineFit:
    """Roofline constants fitted to measured operator times of one device."""

    peak_flops: float  # FLOP/s
    bw_bytes: float  # bytes/s
    half_flops: float  # FLOPs per launch at half efficiency
    overhead_s: float

    def predict_s(self, ops: Sequence[Op]) -> np.ndarray:
        out = []
        for op in ops:
            t_mem = op.bytes / self.bw_bytes
            if op.kind == OpKind.MEM:
                t = t_mem
            else:
                e = op.flops / (op.flops + self.half_flops)
                t = max(op.flops / (self.peak_flops * e), t_mem)
            out.append(t + self.overhead_s)
        return np.asarray(out)


def fit_roofline(ops: Sequence[Op], seconds: Sequence[float]) -> RooflineFit:
    """Least squares in log space over (peak, bandwidth, half size, overhead)."""
    from scipy.optimize import least_squares

    y = np.log(np.asarray(seconds, np.float64))
    fl = np.array([o.flops for o in ops])
    by = np.array([o.bytes for o in ops])
    mem = np.array([o.kind == OpKind.MEM for o in ops])
    peak0 = float(np.max(np.where(mem, 0.0, fl / np.exp(y)))) or 1e9
    bw0 = float(np.max(np.where(mem, by / np.exp(y), 0.0))) or 1e9

    def model(p: np.ndarray) -> np.ndarray:
        peak, bw, half, ovh = np.exp(p)
        t_mem = by / bw
        t_cmp = (fl + half) / peak
        t = np.where(mem, t_mem, np.maximum(t_cmp, t_mem)) + ovh
        return np.asarray(np.log(t) - y)

    p0 = np.log([peak0, bw0, 1e6, 1e-6])
    res = least_squares(model, p0, method="lm" if len(y) > 4 else "trf")
    peak, bw, half, ovh = (float(v) for v in np.exp(res.x))
    return RooflineFit(peak, bw, half, ovh)


# =============================================================================== profiling
def synthetic_ops(seed: int = 0, n: int = 120) -> list[Op]:
    """A spread of GEMMs, attention-shaped batched matmuls and elementwise ops to profile."""
    rng = np.random.default_rng(seed)
    ops: list[Op] = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            m, nn, k = (int(2 ** rng.uniform(5, 10.5)) for _ in range(3))
            ops.append(Op("gemm", OpKind.GEMM, 2.0 * m * nn * k, 4.0 * (m * k + k * nn + m * nn), m, nn, k))
        elif kind == 1:
            b = int(2 ** rng.integers(1, 5))
            s = int(2 ** rng.uniform(5, 9))
            d = int(2 ** rng.integers(4, 7))
            ops.append(Op("bmm", OpKind.ATTN, 2.0 * b * s * s * d, 4.0 * b * (2 * s * d + s * s), s, s, d, b))
        else:
            e = int(2 ** rng.uniform(12, 22))
            name = ("add", "gelu", "softmax")[i % 9 // 3]
            # fp32 bytes per element: add reads 2 writes 1; gelu+add 5 accesses; softmax (max, sum, write) + add 7
            per = {"add": 3, "gelu": 5, "softmax": 7}[name]
            ops.append(Op(name, OpKind.MEM, 0.0, 4.0 * per * e, e, 1, 1))
    return ops


def profile_ops(ops: Sequence[Op], repeats: int = 5) -> list[float]:
    """Seconds of each op run with torch on this machine's CPU (fp32): the fastest of ``repeats`` runs."""
    out = []
    for op in ops:
        fn = _runner(op)
        fn()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        out.append(float(np.min(ts)))  # the minimum: least disturbed by other processes
    return out


def _runner(op: Op) -> Callable[[], object]:
    import torch

    if op.kind == OpKind.GEMM:
        a, b = torch.randn(op.m, op.k), torch.randn(op.k, op.n)
        return lambda: a @ b
    if op.kind == OpKind.ATTN:
        a3, b3 = torch.randn(op.batch, op.m, op.k), torch.randn(op.batch, op.k, op.n)
        return lambda: torch.bmm(a3, b3)
    x, y = torch.randn(op.m), torch.randn(op.m)
    if op.name == "gelu":
        return lambda: torch.nn.functional.gelu(x) + y
    if op.name == "softmax":
        rows = x.view(-1, 64) if x.numel() % 64 == 0 else x.view(1, -1)
        return lambda: torch.softmax(rows, -1).view(-1) + y
    return lambda: x + y


def with_calibration(eff: Efficiency, gemm_max: float, gemm_half_gflop: float) -> Efficiency:
    return replace(eff, gemm_max=gemm_max, gemm_half_gflop=gemm_half_gflop)
