"""The analytic estimate: accuracy on the Megatron rows, schedules, errors, simulation check."""

from __future__ import annotations

import pytest

from trainsim.errors import UserError
from trainsim.plan.calibrate import MEGATRON_TABLE1, load_csv, predict_row
from trainsim.plan.devices import gpu, homogeneous, parse_groups
from trainsim.plan.estimate import Strategy, estimate, resolve_world
from trainsim.plan.simcheck import schedule_actions, simulate_plan
from trainsim.plan.workload import Recompute, preset


@pytest.mark.parametrize("row", MEGATRON_TABLE1[::3], ids=lambda r: f"{r.params_billion}B")
def test_megatron_rows_within_10_percent(row) -> None:  # type: ignore[no-untyped-def]
    e = predict_row(row)
    assert e.fits
    assert e.hardware_tflops_per_gpu == pytest.approx(row.tflops_per_gpu, rel=0.10)


def test_embedded_rows_match_shared_csv() -> None:
    import pathlib

    p = pathlib.Path(__file__).parents[3] / "shared" / "groundtruth" / "megatron_table1.csv"
    if not p.exists():
        pytest.skip("shared ground truth not present")
    assert load_csv(str(p)) == MEGATRON_TABLE1


def test_bubble_shrinks_with_interleaving_and_zero_bubble() -> None:
    m, cl = preset("gpt3-175b"), homogeneous("a100-80gb", 1024)
    steps = {}
    for sch, v in (("1f1b", 1), ("interleaved", 3), ("zb", 1)):
        s = Strategy(dp=16, tp=8, pp=8, micro_batch=1, schedule=sch, virtual_stages=v, recompute=Recompute.FULL)
        steps[sch] = estimate(m, s, cl, global_batch=1536).breakdown["pipeline_bubble"]
    assert steps["1f1b"] > steps["zb"] > 0 and steps["1f1b"] > steps["interleaved"] > 0


def test_breakdown_sums_to_step() -> None:
    e = estimate(preset("llama2-7b"), Strategy(dp=4, tp=2, pp=2, micro_batch=1, zero=1), homogeneous("h100", 16),
                 global_batch=64)
    assert sum(e.breakdown.values()) == pytest.approx(e.step_s)
    assert e.model_tflops_per_gpu <= e.hardware_tflops_per_gpu
    assert 0 < e.mfu < 1


@pytest.mark.parametrize(("sch", "v"), [("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zb", 1)])
def test_simulation_agrees_with_closed_form(sch: str, v: int) -> None:
    m, cl = preset("gpt3-1.3b"), homogeneous("a100-80gb", 8)
    e = estimate(m, Strategy(dp=2, pp=4, micro_batch=1, schedule=sch, virtual_stages=v), cl, global_batch=32)
    chk = simulate_plan(m, cl, e, global_batch=32)
    assert abs(chk.rel_diff) < 0.03


def test_schedule_actions_are_complete() -> None:
    for sch, v in (("1f1b", 1), ("gpipe", 1), ("interleaved", 2), ("zb", 1)):
        for r in range(4):
            acts = schedule_actions(sch, r, 4, 8, v)
            assert sorted((c, j) for k, c, j in acts if k == "F") == sorted((c, j) for c in range(v) for j in range(8))
            assert sum(k == "B" for k, _, _ in acts) == 8 * v


def test_bad_input() -> None:
    with pytest.raises(UserError, match="does not divide --gpus 1000"):
        resolve_world(1000, 8, 8, 1)
    with pytest.raises(UserError, match="unknown GPU 'b300'"):
        gpu("b300")
    with pytest.raises(UserError, match="not divisible by dp"):
        estimate(preset("gpt3-1.3b"), Strategy(dp=3), homogeneous("a100-80gb", 3), global_batch=16)
    with pytest.raises(UserError, match="NAME:COUNT"):
        parse_groups(["a100"])
