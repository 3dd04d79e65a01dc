"""Calibrate the roofline efficiency against published end-to-end throughput (Megatron-LM Table 1).

    >>> from trainsim.plan.calibrate import MEGATRON_TABLE1, predict_row
    >>> row = MEGATRON_TABLE1[0]
    >>> row.tflops_per_gpu
    137.0
    >>> 120 < predict_row(row).hardware_tflops_per_gpu < 160
    True

The rows are Table 1 of Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (SC'21), as transcribed in ``shared/groundtruth/megatron_table1.csv``:
80-GB A100s on Selene, vocabulary 51,200, sequence 2,048, interleaved schedule, full activation
recomputation; throughput counts ``F = 96 B s l h^2 (1 + s/6h + V/16lh)`` FLOPs per iteration.

What is *not* published and is therefore chosen by the estimator (the same rule for every row, no
per-row factors): the micro-batch size (1..32, fastest that fits) and the number of virtual stages
(the fastest divisor of layers/pp up to 8). Only two numbers are fitted: ``gemm_max`` and
``gemm_half_gflop`` of ``optime.Efficiency``; ``loo`` refits them with one row held out and predicts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from trainsim.plan.devices import homogeneous
from trainsim.plan.estimate import Estimate, Strategy, best_micro_batch
from trainsim.plan.optime import DEFAULT_EFFICIENCY, Efficiency
from trainsim.plan.workload import Recompute, Transformer


@dataclass(frozen=True, slots=True)
class Row:
    params_billion: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    global_batch: int
    tflops_per_gpu: float

    def model(self) -> Transformer:
        return Transformer(
            arch="gpt", layers=self.layers, hidden=self.hidden, heads=self.heads, seq=2048, vocab=51200,
            name=f"gpt-{self.params_billion:g}b",
        )

    def strategy(self) -> Strategy:
        return Strategy(
            dp=self.gpus // (self.tp * self.pp), tp=self.tp, pp=self.pp,
            schedule="interleaved" if self.pp > 1 else "1f1b", recompute=Recompute.FULL,
        )

    def virtual_choices(self) -> tuple[int, ...]:
        if self.pp == 1:
            return (1,)
        return tuple(v for v in range(1, 9) if self.layers % (self.pp * v) == 0)


# Narayanan et al. SC'21 Table 1 (shared/groundtruth/megatron_table1.csv)
MEGATRON_TABLE1: tuple[Row, ...] = tuple(
    Row(*r)
    for r in (
        (1.7, 24, 2304, 24, 1, 1, 32, 512, 137.0),
        (3.6, 32, 3072, 30, 2, 1, 64, 512, 138.0),
        (7.5, 32, 4096, 36, 4, 1, 128, 512, 142.0),
        (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135.0),
        (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138.0),
        (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140.0),
        (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148.0),
        (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155.0),
        (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163.0),
        (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163.0),
    )
)


def load_csv(path: str) -> tuple[Row, ...]:
    """Rows of a CSV with Table 1's columns (comment lines start with #)."""
    import csv

    with open(path) as fh:
        lines = [ln for ln in fh if not ln.startswith("#")]
    out = []
    for r in csv.DictReader(lines):
        out.append(
            Row(float(r["params_billion"]), int(r["heads"]), int(r["hidden"]), int(r["layers"]), int(r["tp"]),
                int(r["pp"]), int(r["gpus"]), int(r["global_batch"]), float(r["tflops_per_gpu"]))
        )
    return tuple(out)


def predict_row(row: Row, eff: Efficiency = DEFAULT_EFFICIENCY) -> Estimate:
    """The estimate of a row's published configuration (micro-batch and v chosen by the estimator)."""
    return best_micro_batch(
        row.model(), row.strategy(), homogeneous("a100-80gb", row.gpus), global_batch=row.global_batch,
        virtual=row.virtual_choices(), eff=eff,
    )


def errors(rows: Sequence[Row], eff: Efficiency) -> np.ndarray:
    """Relative error of predicted hardware TFLOP/s per GPU against published, per row."""
    return np.array([predict_row(r, eff).hardware_tflops_per_gpu / r.tflops_per_gpu - 1.0 for r in rows])


def fit(rows: Sequence[Row], base: Efficiency = DEFAULT_EFFICIENCY) -> Efficiency:
    """Fit gemm_max and gemm_half_gflop by least squares on log ratios (coarse grid, then refine)."""

    def loss(gm: float, gh: float) -> float:
        e = errors(rows, replace(base, gemm_max=gm, gemm_half_gflop=gh))
        return float(np.sum(np.log1p(e) ** 2))

    best = (np.inf, base.gemm_max, base.gemm_half_gflop)
    for gh in (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0):
        # for fixed gh the loss is nearly quadratic in log gm: bracket then golden-section search
        lo, hi = 0.3, 1.0
        for _ in range(18):
            a, b = lo + 0.382 * (hi - lo), lo + 0.618 * (hi - lo)
            if loss(a, gh) < loss(b, gh):
                hi = b
            else:
                lo = a
        gm = 0.5 * (lo + hi)
        val = loss(gm, gh)
        if val < best[0]:
            best = (val, gm, gh)
    return replace(base, gemm_max=round(best[1], 4), gemm_half_gflop=best[2])


def loo(rows: Sequence[Row], base: Efficiency = DEFAULT_EFFICIENCY) -> list[tuple[Row, float, Efficiency]]:
    """Leave-one-out: for each row, fit on the others and return (row, relative error, fitted eff)."""
    out = []
    for i, r in enumerate(rows):
        eff = fit([x for j, x in enumerate(rows) if j != i], base)
        out.append((r, float(errors([r], eff)[0]), eff))
    return out
