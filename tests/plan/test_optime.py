"""Operator-time models: the roofline's shape and the learned regression's fit on synthetic data."""

from __future__ import annotations

import numpy as np
import pytest

from trainsim.plan.devices import gpu
from trainsim.plan.optime import (
    DEFAULT_EFFICIENCY,
    Efficiency,
    LearnedOpModel,
    fit_roofline,
    op_time_s,
    synthetic_ops,
)
from trainsim.plan.workload import Op, OpKind


def _gemm(n: int) -> Op:
    return Op("g", OpKind.GEMM, 2.0 * n**3, 6.0 * n * n, n, n, n)


def test_bigger_gemms_are_more_efficient() -> None:
    a100 = gpu("a100-80gb")
    eff = [2 * n**3 / op_time_s(_gemm(n), a100, DEFAULT_EFFICIENCY) / 312e12 for n in (256, 1024, 8192)]
    assert eff[0] < eff[1] < eff[2] < DEFAULT_EFFICIENCY.gemm_max


def test_memory_bound_ops_use_bandwidth() -> None:
    op = Op("add", OpKind.MEM, 0.0, 2e9)
    t = op_time_s(op, gpu("h100"), DEFAULT_EFFICIENCY)
    assert t == pytest.approx(2e9 / (3350e9 * DEFAULT_EFFICIENCY.mem) + 4e-6)


def test_efficiency_validates() -> None:
    with pytest.raises(ValueError, match="gemm_max"):
        Efficiency(gemm_max=1.5)


def test_learned_and_roofline_recover_a_synthetic_device() -> None:
    ops = synthetic_ops(seed=3, n=150)
    peak, bw, half = 5e11, 4e10, 2e7
    y = np.array(
        [o.bytes / bw if o.kind == OpKind.MEM else max((o.flops + half) / peak, o.bytes / bw) for o in ops]
    ) * np.exp(np.random.default_rng(0).normal(0, 0.03, len(ops)))
    tr, te = slice(0, 100), slice(100, None)
    rf = fit_roofline(ops[tr], y[tr])
    assert rf.peak_flops == pytest.approx(peak, rel=0.2)
    lm = LearnedOpModel.fit(ops[tr], y[tr])
    for model in (rf, lm):
        ape = np.abs(model.predict_s(ops[te]) / y[te] - 1)
        assert np.median(ape) < 0.25
