"""What a robust-aggregation hook adds to a data-parallel step, predicted from generic calibrations.

    >>> from trainsim.testbed.calibrate import calibrate
    >>> from trainsim.run.robust_cost import predict_overhead, time_rules
    >>> cal = calibrate(world=4, allgather_sizes=[16 << 10, 256 << 10, 1 << 20])   # doctest: +SKIP
    >>> rules = time_rules(4)                                                       # doctest: +SKIP
    >>> predict_overhead("median", 85_002, cal, rules).total_us                    # doctest: +SKIP

The hook replaces one all-reduce of the bucket (S bytes) by an all-gather of S bytes per rank and then
combines the rows on every rank. Its extra time per step, for one bucket that nothing overlaps, is

    overhead = [allgather(S) - allreduce(S)] + contention * compute(rule, world, numel)

1. ``allgather(S)`` and ``allreduce(S)``: ``Calibration.allgather_us`` and ``Calibration.predict_us`` of a
   ``trainsim.testbed.calibrate`` run on the same link and world size, at its own generic sizes;
2. ``compute``: ``time_rules`` times each rule (``robust.aggregate``) on random rows at a generic grid of
   sizes (powers of 4 elements, never the model's) on this CPU with one thread, interpolated in log-log;
   Zeno's rule is priced instead from ``world + 1`` forward passes of the model on the validation batch
   (``zeno_us``: its GEMMs from ``trainsim.transform.opcost``'s table, a generic per-module and
   per-swapped-tensor cost from ``time_calls``, elementwise work from the table's ``elementwise`` line);
3. ``contention``: every rank computes the same rule at the same moment, so with more ranks than cores
   (4 ranks on this 2-vCPU host) each gets ``cores / world`` of a core: ``max(1, world / cores)``.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

RULE_SIZES = tuple(4**k for k in range(5, 11))
"""numel grid of ``time_rules``: 1,024 .. 1,048,576 elements per rank"""
TIMED_RULES = ("mean", "median", "trimmed_mean", "krum")


@dataclass(frozen=True, kw_only=True, slots=True)
class RuleTimes:
    """Per rule, the median time (µs) of combining ``world`` rows at each size of ``sizes``."""

    world: int
    sizes: tuple[int, ...]
    us: dict[str, list[float]]
    threads: int = 1

    def at(self, rule: str, numel: int) -> float:
        """Interpolated in log size and log time; the end slopes held beyond the grid."""
        ys = self.us[rule]
        lx = [math.log(s) for s in self.sizes]
        x = math.log(max(1, numel))
        i = 0 if x <= lx[1] else len(lx) - 2 if x >= lx[-2] else max(j for j in range(len(lx) - 1) if lx[j] <= x)
        w = (x - lx[i]) / (lx[i + 1] - lx[i])
        return math.exp((1 - w) * math.log(ys[i]) + w * math.log(ys[i + 1]))


def _median_us(fn: Callable[[], object], reps: int) -> float:
    fn()  # warm-up: allocations
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def time_rules(world: int, sizes: Sequence[int] = RULE_SIZES, *, reps: int = 15, seed: int = 0) -> RuleTimes:
    """Time ``robust.aggregate`` of each rule in ``TIMED_RULES`` on ``world`` random rows of each size
    (one intra-op thread, as the ranks run). The median of ``reps``: a step pays a typical call, and
    the host's other tenants make the mean of a few calls jump."""
    import torch

    from trainsim.run.robust import RobustState, aggregate

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(seed)
        us: dict[str, list[float]] = {r: [] for r in TIMED_RULES}
        for n in sizes:
            rows = torch.randn(world, n, generator=g)
            for rule in TIMED_RULES:
                state = RobustState(rule, world_size=world, rank=0, f=0, trim=0.25)
                us[rule].append(_median_us(partial(aggregate, state, rows), reps))
    finally:
        torch.set_num_threads(threads)
    return RuleTimes(world=world, sizes=tuple(sizes), us=us)


def time_calls(reps: int = 200) -> dict[str, float]:
    """Generic Python-side costs (µs) of Zeno's scoring, on a generic stack of four ``Linear(1, 1)``:
    ``module_us``, one module call (its 1x1 GEMM included); ``swap_us``, what ``torch.func.functional_call``
    adds per parameter tensor it swaps in."""
    import torch
    from torch import nn

    model = nn.Sequential(*(nn.Linear(1, 1) for _ in range(4)))
    x = torch.ones(1, 1)
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    with torch.no_grad():
        direct = _median_us(lambda: model(x), reps)
        swapped = _median_us(lambda: torch.func.functional_call(model, params, (x,)), reps)
    modules = len(model) + 1  # the Sequential and its four layers
    return {"module_us": direct / modules, "swap_us": max(0.0, swapped - direct) / len(params)}


def zeno_us(model: Any, batch: int, world: int, table: Any, calls: dict[str, float], classes: int) -> float:
    """Zeno's compute per bucket (the whole model in one bucket), alone on a core: ``world + 1`` forward
    passes on ``batch`` samples (Linear GEMMs from the op-cost ``table``, every module call at
    ``calls["module_us"]``, activations and the loss as elementwise traffic), and per row the swapped
    parameters (``p - lr g``: a multiply and a subtract over every parameter), its norm, and the swap."""
    from torch import nn

    mods = list(model.modules())
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    fwd = calls["module_us"] * len(mods)
    width = 1  # features coming out of the last Linear
    for m in mods:
        if isinstance(m, nn.Linear):
            width = m.out_features
            fwd += table.time_us("matmul_nt", (batch, m.in_features, width))  # x W^T
            fwd += table.time_us("elementwise", (3 * 4 * batch * width,))  # the bias add, fp32
        elif isinstance(m, nn.ReLU | nn.GELU | nn.Tanh | nn.Sigmoid):
            fwd += table.time_us("elementwise", (2 * 4 * batch * width,))
    fwd += 4 * table.time_us("elementwise", (3 * 4 * batch * classes,))  # cross-entropy: ~4 passes over the logits
    per_row = (
        2 * table.time_us("elementwise", (3 * 4 * numel,))  # lr * g, then p - that
        + table.time_us("elementwise", (2 * 4 * numel,))  # |g|^2
        + calls["swap_us"] * len(params)
    )
    return (world + 1) * fwd + world * per_row


@dataclass(frozen=True, kw_only=True, slots=True)
class OverheadPrediction:
    """The predicted extra time per step of one rule over the plain all-reduce (µs)."""

    rule: str
    size_bytes: int
    """the bucket: fp32 gradient bytes per rank"""
    allreduce_us: float
    allgather_us: float
    compute_us: float
    """the rule alone on one core"""
    contention: float
    """``max(1, world / cores)``"""

    @property
    def link_us(self) -> float:
        return self.allgather_us - self.allreduce_us

    @property
    def total_us(self) -> float:
        return self.link_us + self.contention * self.compute_us


def predict_overhead(
    rule: str, numel: int, cal: Any, rules: RuleTimes, *, zeno_compute_us: float | None = None, cores: int | None = None
) -> OverheadPrediction:  # fmt: skip
    """``rule``'s overhead for a one-bucket model of ``numel`` fp32 gradients (module docstring); ``cal``:
    a ``Calibration`` with all-gather sizes, of ``rules.world`` ranks; Zeno needs ``zeno_compute_us``."""
    if cal.world != rules.world:
        raise ValueError(f"robust overhead: link calibrated for {cal.world} ranks, rules timed for {rules.world}")
    if rule == "zeno":
        if zeno_compute_us is None:
            raise ValueError("robust overhead: zeno needs zeno_compute_us (see zeno_us)")
        compute = zeno_compute_us
    elif rule in rules.us:
        compute = rules.at(rule, numel)
    else:
        raise ValueError(f"robust overhead: unknown rule {rule!r}; expected one of {', '.join([*rules.us, 'zeno'])}")
    size = 4 * numel
    cores = cores or len(os.sched_getaffinity(0))
    return OverheadPrediction(
        rule=rule, size_bytes=size, allreduce_us=cal.predict_us(size), allgather_us=cal.allgather_us(size),
        compute_us=compute, contention=max(1.0, rules.world / cores),
    )  # fmt: skip
