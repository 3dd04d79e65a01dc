"""validate compress: its result shape and bad input (the harness itself runs in benchmarks/compress_validate.py)."""

from __future__ import annotations

import pytest

from trainsim.cli.main import main
from trainsim.run.ranks import run_queue_ms
from trainsim.validate.compress import FULL, MEASURE_S, QUICK, RunConfig, RunResult, measured_steps, summary


def test_summary_shape_matches_validate_dp() -> None:
    res = [
        RunResult(RunConfig(rate_mbit=100.0), 110.0, 100.0, [100.0], "netns"),
        RunResult(RunConfig(rate_mbit=100.0, algorithm="onebit"), 45.0, 50.0, [50.0], "netns"),
    ]
    out = summary(res)
    assert set(out) == {"runs", "mean_abs_error_pct", "max_abs_error_pct"}
    assert out["mean_abs_error_pct"] == 10.0 and out["max_abs_error_pct"] == 10.0
    run = out["runs"][0]
    assert {"config", "predicted_ms", "measured_ms", "error_pct"} <= set(run)


def test_run_queue_ms_is_the_slowest_ranks_training_thread() -> None:
    threads = ({"main": {"run_ms": 20.0, "wait_ms": 4.5}, "gloo_tcp_loop": {"run_ms": 3.0, "wait_ms": 9.0}},
               {"main": {"run_ms": 21.0, "wait_ms": 6.25}})  # fmt: skip
    assert run_queue_ms(threads) == 6.25  # the helper threads' own waits are not the step's
    assert run_queue_ms(({}, {})) is None and run_queue_ms(()) is None
    r = RunResult(RunConfig(), 10.0, 10.0, [10.0], "netns", run_queue_ms=6.25, threads=threads)
    assert summary([r])["runs"][0]["run_queue_ms"] == 6.25 and summary([r])["runs"][0]["threads"] == list(threads)


def test_median_of_passes_by_hand() -> None:
    from trainsim.validate.dp import median_of_passes

    c = RunConfig(rate_mbit=100.0, algorithm="onebit")
    one = RunResult(c, 40.0, 50.0, [50.0], "netns")
    assert median_of_passes([one]) is one
    runs = [RunResult(c, p, m, [m], "netns", ok) for p, m, ok in
            ((40.0, 50.0, True), (44.0, 80.0, True), (42.0, 52.0, False))]  # fmt: skip
    r = median_of_passes(runs)
    assert (r.predicted_ms, r.measured_ms, r.measured_steps_ms) == (42.0, 52.0, [52.0])
    assert not r.params_in_sync  # one pass out of sync is reported
    assert summary([r])["runs"][0]["passes"] == [{"predicted_ms": p, "measured_ms": m} for p, m in
                                                 ((40.0, 50.0), (44.0, 80.0), (42.0, 52.0))]  # fmt: skip


def test_run_sets() -> None:
    rates = {c.rate_mbit for c in FULL}
    assert rates == {20.0, 100.0, 1000.0}
    assert {c.algorithm for c in FULL} >= {"none", "onebit", "topk"}
    assert any(c.plan for c in FULL) and len(QUICK) == 2
    assert RunConfig(rate_mbit=20.0, algorithm="onebit", scheme="ps", plan=True).label() == (
        "mlp 20 Mbit/s onebit ps SeCoPa plan"
    )


def test_fast_runs_measure_more_steps_and_slow_runs_fewer() -> None:
    assert measured_steps(20, 4300.0) == 6 and measured_steps(6, 4300.0) == 3  # seconds per step: a third
    assert measured_steps(20, 260.0) == 20  # 5.2 s already
    n = measured_steps(20, 50.0)  # 20 steps would take 1 s: as many as fill MEASURE_S
    assert n == 60 and n * 50.0 >= MEASURE_S * 1e3
    assert measured_steps(20, 5.0) == 80  # at most 4x what was asked for
    assert measured_steps(12, 999.0) == 12


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--model", "nope"], "unknown model 'nope'"), (["--algorithm", "nope"], "unknown compression algorithm"),
     (["--steps", "0"], "steps=0"), (["--passes", "0"], "--passes 0"),
     (["--rate", "0"], "Invalid value for '--rate'")],
)  # fmt: skip
def test_bad_input(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "compress", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.multiproc
def test_hook_against_plain_ddp_in_one_process() -> None:
    """The one-rank measurement behind the hook's own overhead: both loops run in every round, the
    hook costs time, each round times the codec beside its steps, and the process says whether it
    could be pinned."""
    import json

    from trainsim.validate.launch import launch

    cfg = {"model": "mlp", "algorithm": "onebit", "options": {}, "scheme": "allgather", "steps": 3,
           "warmup": 1, "overhead": True, "rounds": 2, "pin": True}  # fmt: skip
    data = json.loads(launch(1, ["-m", "trainsim.validate.compress", json.dumps(cfg)], net=None)[0].strip().splitlines()[-1])
    assert data["plain_ms"] > 0 and data["hook_ms"] > data["plain_ms"]
    # pinned to one core, as the harness measures it (``_hook_overhead_ms``), on an OS that can
    import os

    if hasattr(os, "sched_setaffinity"):
        assert data["pin_error"] is None
    from trainsim.compress.secopa import CAL_SIZES

    assert len(data["rounds"]) == 2
    for r in data["rounds"]:
        # the paired difference of the round's steps, and the codec at every calibration size
        assert r["diff_ms"] > 0 and r["hook_ms"] > r["plain_ms"]
        assert len(r["codec_samples"]["enc_ms"]) == len(CAL_SIZES) and min(r["codec_samples"]["enc_ms"]) > 0


@pytest.mark.multiproc
@pytest.mark.parametrize("pin", [False, True])
def test_worker_runs_compressed_ddp_pinned_or_not(pin: bool) -> None:
    """Two ranks of the harness's worker on loopback: compressed steps measured, the ranks in sync, and
    with ``pin`` each rank on one core of its own (rank modulo the cores), else where the OS likes."""
    import json
    import os

    from trainsim.validate.launch import launch

    cfg = {"model": "mlp", "algorithm": "onebit", "options": {}, "scheme": "allgather", "steps": 2, "warmup": 1,
           "pin": pin}  # fmt: skip
    data = json.loads(launch(2, ["-m", "trainsim.validate.compress", json.dumps(cfg)], net=None)[0].strip().splitlines()[-1])
    assert len(data["step_ms"]) == 2 and min(data["step_ms"]) > 0 and data["params_in_sync"]
    cores = sorted(os.sched_getaffinity(0))
    assert data["pin_error"] is None
    assert data["cores"] == ([cores[0]] if pin else cores)  # rank 0 reports
    # every rank's threads over the measured steps: the training thread did the compute
    assert len(data["threads"]) == 2
    if data["threads"][0]:  # empty where the kernel keeps no schedstat
        assert all(t["main"]["run_ms"] > 0 and t["main"]["wait_ms"] >= 0 for t in data["threads"])
        assert run_queue_ms(tuple(data["threads"])) is not None
