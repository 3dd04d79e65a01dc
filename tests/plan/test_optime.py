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


def _flash(seq: int) -> Op:
    # one causal flash-attention forward: batch 1, 32 heads, head_dim 128
    return Op("flash_attn", OpKind.FLASH, 4.0 * 32 * seq * seq * 128 * 0.5, 2 * 32 * seq * 128 * 4, seq, seq, 128, 32, 2.5, True)


def test_attention_kernel_sets_flash_time() -> None:
    """A fused attention kernel runs at its published peak utilisation x flash_scale x the size curve."""
    from trainsim.errors import UserError
    from trainsim.plan.optime import ATTN_KERNEL_UTIL

    h100, a100, eff = gpu("h100"), gpu("a100-80gb"), DEFAULT_EFFICIENCY
    op = _flash(65536)
    x = op.flops / 1e9
    e = ATTN_KERNEL_UTIL[("fa2", True)] * eff.flash_scale * x / (x + eff.gemm_half_gflop)
    assert op_time_s(op, h100, eff, attn="fa2") == pytest.approx(op.flops / (989e12 * e) + 4e-6, rel=1e-12)
    # fa3 (FlashAttention-3 / cuDNN) is the Hopper default; FA2 on H100 is 0.638 / 0.333 = 1.92x slower
    t2, t3 = (op_time_s(op, h100, eff, attn=k) - 4e-6 for k in ("fa2", "fa3"))
    assert op_time_s(op, h100, eff) - 4e-6 == pytest.approx(t3)
    assert t2 / t3 == pytest.approx(0.638 / 0.333, rel=1e-9)
    # on Ampere, auto is FlashAttention-2 and fa3 does not exist
    assert op_time_s(op, a100, eff) == op_time_s(op, a100, eff, attn="fa2")
    with pytest.raises(UserError, match="--attn-kernel fa3: needs a Hopper GPU"):
        op_time_s(op, a100, eff, attn="fa3")


def test_fp8_gemm_pays_the_input_cast() -> None:
    """FP8: the GEMM at the FP8 peak, plus casting its 16-bit input (4 B/element, a memory-bound kernel);
    weights are cast once per step, not per micro-batch."""
    h100, eff = gpu("h100"), DEFAULT_EFFICIENCY
    m, n, k = 8192, 4096, 4096
    op = Op("fc", OpKind.GEMM, 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), m, n, k)
    x = op.flops / 1e9
    e = eff.gemm_max * x / (x + eff.gemm_half_gflop) * eff.hopper_scale * eff.fp8_scale
    cast = 4.0 * m * k / (3350e9 * eff.mem)
    assert op_time_s(op, h100, eff, fp8=True) == pytest.approx(op.flops / (1979e12 * e) + cast + 4e-6, rel=1e-12)


def test_fp8_gains_more_on_wider_layers() -> None:
    """The cast is O(m k) against the GEMM's O(m k n): FP8's speed-up grows with the layer width n."""
    h100, eff = gpu("h100"), DEFAULT_EFFICIENCY
    gains = []
    for n in (1024, 4096, 16384):
        op = Op("fc", OpKind.GEMM, 2.0 * 8192 * n * 4096, 2.0 * (8192 * 4096 + 4096 * n + 8192 * n), 8192, n, 4096)
        gains.append(op_time_s(op, h100, eff) / op_time_s(op, h100, eff, fp8=True))
    assert gains[0] < gains[1] < gains[2] < 2.0 * eff.fp8_scale
