"""Memory model against hand-computed cases."""

from __future__ import annotations

import pytest

from trainsim.plan.devices import homogeneous
from trainsim.plan.estimate import Strategy, estimate, stage_sums, uniform_stages, unit_table
from trainsim.plan.memory import GIB, in_flight, stage_memory, static_bytes
from trainsim.plan.optime import DEFAULT_EFFICIENCY
from trainsim.plan.workload import Recompute, Transformer, preset


def test_static_bytes_zero_stages() -> None:
    p, dp = 1e9, 8
    assert static_bytes(p, zero=0, dp=dp) == (2e9, 2e9, 12e9)  # 16 B/param (ZeRO paper, K=12)
    assert static_bytes(p, zero=1, dp=dp) == (2e9, 2e9, 12e9 / 8)
    assert static_bytes(p, zero=2, dp=dp) == (2e9, 2e9 / 8, 12e9 / 8)
    w, g, o = static_bytes(p, zero=3, dp=dp, largest_layer_params=1e6)
    assert (w, g, o) == (2e9 / 8 + 4e6, 2e9 / 8, 12e9 / 8)


def test_in_flight() -> None:
    assert in_flight("1f1b", stage=0, pp=8, m=32, v=1) == 8
    assert in_flight("1f1b", stage=7, pp=8, m=32, v=1) == 1
    assert in_flight("1f1b", stage=0, pp=8, m=4, v=1) == 4  # fewer micro-batches than stages
    assert in_flight("gpipe", stage=3, pp=8, m=32, v=1) == 32
    assert in_flight("zb", stage=0, pp=8, m=32, v=1) == 8
    # interleaved: first stage holds pp * (1 + (pp-1)/(pp*v)) stage-equivalents (Korthikanti §4.2.3)
    assert in_flight("interleaved", stage=0, pp=8, m=64, v=4) == pytest.approx(8 * (1 + 7 / 32))


def test_hand_computed_gpt_stage() -> None:
    """GPT-3 175B, tp=8 + SP, pp=8, 1F1B, no recomputation, ZeRO-1 over dp=16, stage 1 (12 blocks)."""
    m = preset("gpt3-175b")
    assert isinstance(m, Transformer)
    costs = m.layer_costs(mb=1, tp=8, sp=True, cp=1)
    units = costs[13:25]
    mem = stage_memory(units, recompute=Recompute.NONE, schedule="1f1b", stage=1, pp=8, m=96, v=1, zero=1, dp=16,
                       allowance=False)
    h, s, a, t = 12288, 2048, 96, 8
    params = 12 * (12 * h * h + 13 * h) / t  # biases and norms split approximately
    assert mem.weights == pytest.approx(2 * params, rel=1e-3)
    assert mem.optimizer == pytest.approx(12 * params / 16, rel=1e-3)
    act_layer = s * h / t * (34 + 5 * a * s / h)
    assert mem.activations == pytest.approx(12 * act_layer * 7)  # 8 - 1 micro-batches in flight
    assert mem.transient == 0.0


def test_fast_path_agrees_with_stage_memory() -> None:
    m = preset("llama2-7b")
    cl = homogeneous("a100-80gb", 16)
    for rc in Recompute:
        s = Strategy(dp=2, tp=2, pp=4, micro_batch=1, recompute=rc, sequence_parallel=True, zero=1)
        e = estimate(m, s, cl, global_batch=16)
        st = uniform_stages(m, 4)
        tab = unit_table(m, 1, 2, True, 1, cl.groups[0].gpu, DEFAULT_EFFICIENCY)
        totals = [
            stage_memory(tab.costs[a:b], recompute=rc, schedule="1f1b", stage=i, pp=4, m=8, v=1, zero=1, dp=2).total
            for i, (a, b) in enumerate(zip(st.bounds, st.bounds[1:], strict=False))
        ]
        assert e.memory_gib_per_gpu == pytest.approx(max(totals) / GIB)
        assert stage_sums(tab, st.bounds[0], st.bounds[1]).params > 0


def test_recomputation_orders_memory() -> None:
    m = preset("gpt3-175b")
    cl = homogeneous("a100-80gb", 1024)
    mem = {}
    for rc in Recompute:
        s = Strategy(dp=16, tp=8, pp=8, micro_batch=1, recompute=rc)
        mem[rc] = estimate(m, s, cl, global_batch=1536).memory_gib_per_gpu
    assert mem[Recompute.NONE] > mem[Recompute.SELECTIVE] > mem[Recompute.FULL]


@pytest.mark.parametrize("rc", ["none", "selective", "full"])
def test_matches_torch_reference_within_10_percent(rc: str) -> None:
    """Saved activations and optimizer tensors of a real (tiny) GPT step in torch vs the model."""
    from trainsim.plan.reference import measure

    m = Transformer(arch="gpt", layers=2, hidden=64, heads=4, seq=32, vocab=256)
    got = measure(m, micro_batch=2, recompute=rc)
    pred = stage_memory(m.layer_costs(mb=2, tp=1, sp=False, cp=1), recompute=Recompute[rc.upper()], schedule="1f1b",
                        stage=0, pp=1, m=1, v=1, zero=0, dp=1, allowance=False)
    assert got["params"] == m.total_params()
    assert (pred.weights, pred.grads, pred.optimizer) == (got["weights"], got["grads"], got["optimizer"])
    assert pred.activations == pytest.approx(got["activations"], rel=0.10)
