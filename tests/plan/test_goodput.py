"""Goodput Monte Carlo against closed forms, Young/Daly agreement, seeds, bad input, and the CLI."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from trainsim.cli.main import main
from trainsim.errors import UserError
from trainsim.plan.goodput import (
    GoodputConfig,
    best_interval_s,
    closed_form_goodput,
    daly_interval_s,
    exact_interval_s,
    expected_time_s,
    goodput,
    simulate,
    young_interval_s,
)

BASE = dict(step_s=10.0, gpus=16, mtbf_gpu_hours=100.0, checkpoint_s=60.0, restart_s=120.0)


def _z(t: np.ndarray, expected: float) -> float:
    """How many standard errors the Monte Carlo mean is from ``expected``."""
    return float((t.mean() - expected) / (t.std(ddof=1) / math.sqrt(t.size)))


def test_no_failures_goodput_is_interval_over_interval_plus_checkpoint() -> None:
    cfg = GoodputConfig(**{**BASE, "mtbf_gpu_hours": 1e18}, steps=600, interval_s=600.0)
    r = goodput(cfg, samples=100, seed=0)
    assert r.failures_mean == 0
    assert r.goodput == pytest.approx(600 / (600 + 60), rel=1e-12)
    assert r.time_to_train_s == pytest.approx(10 * (600 + 60), rel=1e-12)


def test_one_segment_matches_daly_closed_form_within_ci() -> None:
    # one segment of tau + C; E[T] = (exp(lambda (tau + C)) - 1) (1/lambda + R) (Daly 2006)
    cfg = GoodputConfig(step_s=1.0, gpus=1, mtbf_gpu_hours=1.0, checkpoint_s=60.0, restart_s=30.0, steps=600)
    t, fails = simulate(cfg, [600.0], samples=50_000, seed=3)
    lam = 1 / 3600
    closed = math.expm1(lam * 660) * (1 / lam + 30)
    assert expected_time_s(cfg, 600.0) == pytest.approx(closed, rel=1e-12)
    assert abs(_z(t[0], closed)) < 3
    assert fails.mean() == pytest.approx(math.expm1(lam * 660), rel=0.05)  # geometric number of failed tries


@pytest.mark.parametrize(
    "extra",
    [
        {},  # D = restart
        {"restore_s": 90.0, "repair_s": 1800.0},  # no spares: wait for the node's repair every time
        {"spare_nodes": 1, "replace_s": 300.0},  # spares never run dry (repair_s = 0): D = restart + replace
    ],
)
def test_whole_job_matches_closed_form_within_ci(extra: dict[str, float]) -> None:
    cfg = GoodputConfig(**{**BASE, **extra}, steps=20_000)  # type: ignore[arg-type]
    for tau in (300.0, 1200.0, 5000.0):
        t, _ = simulate(cfg, [tau], samples=3000, seed=7)
        closed = expected_time_s(cfg, tau)
        assert closed is not None
        assert abs(_z(t[0], closed)) < 3.5, (extra, tau)


def test_spares_help_and_enough_spares_reach_the_constant_downtime_bound() -> None:
    cfg = GoodputConfig(**{**BASE, "gpus": 64}, steps=20_000, repair_s=2 * 3600.0, replace_s=300.0, interval_s=900.0)
    assert expected_time_s(replace(cfg, spare_nodes=1), 900.0) is None  # history-dependent: no closed form
    times = [goodput(replace(cfg, spare_nodes=s), samples=2000, seed=1).time_to_train_s for s in (0, 1, 2, 8)]
    assert times[0] > times[1] > times[2] >= times[3]
    never_waits = expected_time_s(replace(cfg, repair_s=0.0, spare_nodes=1), 900.0)
    assert never_waits is not None
    assert times[3] == pytest.approx(never_waits, rel=0.01)


def test_closed_form_optimum_solves_its_equation_and_daly_approximates_it() -> None:
    for c, m in ((60.0, 11_000.0), (10.0, 3600.0), (600.0, 3600.0), (1.0, 1e7)):
        tau = exact_interval_s(c, m)
        assert (1 - tau / m) * math.exp((tau + c) / m) == pytest.approx(1.0, abs=1e-12)
        assert tau < young_interval_s(c, m)  # Young overestimates: -C and higher-order terms
        if c / m < 0.01:
            assert daly_interval_s(c, m) == pytest.approx(tau, rel=2e-3)


@pytest.mark.parametrize(
    ("checkpoint_s", "mtbf_job_h", "steps"),
    [(30.0, 3.0, 20_000), (10.0, 1.0, 10_000), (120.0, 24.0, 100_000)],  # C / M of 0.3 %, 0.3 %, 0.14 %
)
def test_monte_carlo_optimum_agrees_with_young_daly(checkpoint_s: float, mtbf_job_h: float, steps: int) -> None:
    gpus = 1024
    cfg = GoodputConfig(step_s=5.0, gpus=gpus, mtbf_gpu_hours=mtbf_job_h * gpus, checkpoint_s=checkpoint_s,
                        restart_s=300.0, steps=steps)  # fmt: skip
    tau, evaluated = best_interval_s(cfg, samples=2000, seed=0)
    yd = young_interval_s(checkpoint_s, mtbf_job_h * 3600)
    assert abs(tau / yd - 1) < 0.05
    assert abs(tau / exact_interval_s(checkpoint_s, mtbf_job_h * 3600) - 1) < 0.02
    assert len(evaluated) >= 15


def test_same_seed_same_answer_other_seed_other_draws() -> None:
    cfg = GoodputConfig(**BASE, steps=20_000)
    a, b = goodput(cfg, samples=500, seed=4), goodput(cfg, samples=500, seed=4)
    assert a.to_json() | {"seconds": 0} == b.to_json() | {"seconds": 0}
    c = goodput(cfg, samples=500, seed=5)
    assert c.time_to_train_s != a.time_to_train_s
    assert c.goodput_ci95[0] < a.goodput < c.goodput_ci95[1] or abs(c.goodput - a.goodput) < 0.02


def test_failure_rate_sums_components_and_closed_form_goodput() -> None:
    cfg = GoodputConfig(**{**BASE, "gpus": 20}, gpus_per_node=8, mtbf_node_hours=50.0, mtbf_link_hours=400.0)
    assert cfg.nodes == 3
    assert cfg.failure_rate_per_s == pytest.approx((20 / 100 + 3 / 50 + 20 / 400) / 3600)
    assert cfg.n_steps == 30 * 86400 // 10  # default: one month of compute
    g = closed_form_goodput(cfg)
    tau = exact_interval_s(cfg.checkpoint_s, cfg.job_mtbf_s)
    assert g == pytest.approx(cfg.work_s / expected_time_s(cfg, tau))  # type: ignore[operator]
    assert 0 < g < 1


@pytest.mark.parametrize(
    ("field", "value", "msg"),
    [
        ("mtbf_gpu_hours", 0.0, "mtbf_gpu_hours=0.0; expected a positive"),
        ("mtbf_gpu_hours", -5.0, "mtbf_gpu_hours=-5.0"),
        ("mtbf_node_hours", 0.0, "mtbf_node_hours=0.0"),
        ("mtbf_link_hours", float("inf"), "mtbf_link_hours=inf"),
        ("checkpoint_s", 0.0, "checkpoint_s=0.0"),
        ("interval_s", 30.0, "interval_s=30 is shorter than checkpoint_s=60"),
        ("spare_nodes", 3, "spare_nodes=3 exceeds the job's 2 nodes"),
        ("spare_nodes", -1, "spare_nodes=-1; expected an integer >= 0"),
        ("gpus", 0, "gpus=0; expected an integer >= 1"),
        ("restart_s", -1.0, "restart_s=-1.0; expected a non-negative"),
        ("steps", 0, "steps=0"),
    ],
)
def test_bad_config_names_the_field(field: str, value: object, msg: str) -> None:
    with pytest.raises(UserError, match=msg):
        GoodputConfig(**{**BASE, field: value})  # type: ignore[arg-type]


def test_a_job_that_never_finishes_is_refused() -> None:
    cfg = GoodputConfig(**{**BASE, "mtbf_gpu_hours": 1e-4}, interval_s=600.0)
    with pytest.raises(UserError, match="far more often than one checkpoint segment"):
        goodput(cfg, samples=10)


CLI = ["goodput", "--step-s", "10", "--gpus", "64", "--mtbf-gpu-hours", "500", "--checkpoint-s", "60",
       "--restart-s", "300", "--steps", "20000", "--samples", "1000"]  # fmt: skip


def test_cli_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CLI, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d) >= {"goodput", "goodput_ci95", "best_interval_s", "young_daly_interval_s", "time_to_train_s",
                      "time_to_train_ci95_s", "failures_mean", "job_mtbf_s"}  # fmt: skip
    assert 0 < d["goodput_ci95"][0] <= d["goodput"] <= d["goodput_ci95"][1] < 1
    assert abs(d["best_interval_s"] / d["young_daly_interval_s"] - 1) < 0.1


def test_cli_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CLI, "--interval-s", "900", "--spare-nodes", "2", "--repair-s", "3600", "--replace-s", "60"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint interval (given)" in out and "goodput" in out and "Young/Daly" in out


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["--mtbf-gpu-hours", "0"], "--mtbf-gpu-hours 0.0; expected a positive"),
        (["--mtbf-node-hours", "-3"], "--mtbf-node-hours -3.0"),
        (["--interval-s", "30"], "--interval-s 30 is shorter than --checkpoint-s 60"),
        (["--spare-nodes", "9"], "--spare-nodes 9 exceeds the job's 8 nodes"),
        (["--samples", "1"], "--samples 1"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(args: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*CLI, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert msg in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_plan_goodput_ranks_by_effective_throughput(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--model", "gpt3-1.3b", "--gpu", "a100-80gb", "--gpus", "32", "--global-batch", "256",
            "--no-simulate", "--top", "3", "--json"]  # fmt: skip
    assert main([*args, "--goodput", "--mtbf-gpu-hours", "20", "--checkpoint-s", "60", "--restart-s", "300"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    eff = [p["effective_samples_per_s"] for p in plans]
    assert eff == sorted(eff, reverse=True)
    assert all(0 < p["goodput"] < 1 and p["effective_samples_per_s"] < p["samples_per_s"] for p in plans)
    assert main([*args, "--mtbf-gpu-hours", "20"]) == 2
    assert "--goodput, --mtbf-gpu-hours and --checkpoint-s go together" in capsys.readouterr().err


def test_search_does_not_lean_on_its_closed_form_starting_point(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainsim.plan.goodput as gp

    cfg = GoodputConfig(step_s=5.0, gpus=1024, mtbf_gpu_hours=3.0 * 1024, checkpoint_s=30.0, restart_s=300.0,
                        steps=20_000)  # fmt: skip
    exact = exact_interval_s(30.0, cfg.job_mtbf_s)
    for wrong in (0.3, 3.0):  # start the grid 3x off either way
        monkeypatch.setattr(gp, "exact_interval_s", lambda c, m, f=wrong: f * exact)
        tau, _ = gp.best_interval_s(cfg, samples=2000, seed=0)
        assert abs(tau / exact - 1) < 0.02, wrong
