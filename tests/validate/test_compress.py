"""validate compress: predictions frozen before the runs and blind to them, the seeded draw, bad input,
and (marked) the worker's real 2-process runs."""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from tests.validate.test_dp import fake_machine, fake_profile
from trainsim.cli.main import main
from trainsim.errors import UserError
from trainsim.run.ranks import run_queue_ms
from trainsim.transform.compression import CodecCost
from trainsim.validate import compress as vc
from trainsim.validate.compress import (
    FULL,
    MEASURE_S,
    QUICK,
    RunConfig,
    draw_configs,
    measured_steps,
    run_validation,
)


def fake_codec(c: RunConfig) -> CodecCost:
    """Codec costs from made-up samples (what ``CodecCost.calibrate`` would time in one process)."""
    from trainsim.compress.secopa import CAL_SIZES

    sizes = list(CAL_SIZES)
    samples = {"enc_ms": [1e-5 * n for n in sizes], "dec_ms": [5e-6 * n for n in sizes],
               "acc_ms": [6e-6 * n for n in sizes], "add_ms": [2e-6 * n for n in sizes]}  # fmt: skip
    return CodecCost.from_samples(c.algorithm, sizes, [samples], dict(c.options))


def _runner(seed: int, seen: list[dict[str, Any]], out: Path) -> vc.Runner:
    rng = random.Random(seed)

    def run(c: RunConfig, row: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        if not seen:
            seen.append(json.loads(out.read_text()))
        return rng.uniform(1.0, 5000.0), {"run_queue_ms": rng.uniform(0, 300), "host_speed": rng.uniform(0.1, 10),
                                          "hook_ms": rng.uniform(0, 100), "params_in_sync": True}  # fmt: skip

    return run


def test_predictions_frozen_before_the_first_run_and_blind_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two validations with runners whose readings differ wildly: the same predictions, on disk before
    the first run; the readings only in ``diagnostics``."""
    # the synthetic profile's two 2 MiB gradients (``fake_profile``), as matrices the codec compresses
    monkeypatch.setattr(vc, "model_shapes", lambda key: ({"a.w": (1024, 512), "b.w": (1024, 512)},
                                                         [("a.w", 1 << 19), ("b.w", 1 << 19)]))  # fmt: skip
    configs = [RunConfig(rate_mbit=100.0), RunConfig(rate_mbit=100.0, algorithm="onebit"),
               RunConfig(rate_mbit=20.0, algorithm="topk", options={"ratio": 0.01}, delay_ms=3.0),
               RunConfig(rate_mbit=50.0, algorithm="onebit", scheme="ps")]  # fmt: skip
    docs, seen = [], []
    for k in range(2):
        out = tmp_path / f"c{k}.json"
        first: list[dict[str, Any]] = []
        docs.append(run_validation(configs, out, seed=2, mcal=fake_machine(), n_fixed=2, profiler=fake_profile,
                                   codec_timer=fake_codec, runner=_runner(k, first, out), passes=3))  # fmt: skip
        seen.append(first[0])
    a, b = docs
    assert [r["predicted_ms"] for r in a["runs"]] == [r["predicted_ms"] for r in b["runs"]]
    assert [r["measured_ms"] for r in a["runs"]] != [r["measured_ms"] for r in b["runs"]]
    for doc, before in zip(docs, seen, strict=True):
        assert before["predictions_frozen_at"] <= before["runs_started_at"]
        assert [r["predicted_ms"] for r in before["runs"]] == [r["predicted_ms"] for r in doc["runs"]]
        assert all(r["measured_ms"] is None for r in before["runs"])
        assert [r["held_out"] for r in doc["runs"]] == [False, False, True, True]
        assert all(len(r["measured_passes_ms"]) == 3 and len(r["diagnostics"]) == 3 for r in doc["runs"])
    # compression on a slow link beats plain DDP in the prediction (the codec is cheap here)
    assert a["runs"][1]["predicted_ms"] < a["runs"][0]["predicted_ms"]


def test_codec_cost_scales_with_the_corun_slowdown() -> None:
    cost = fake_codec(RunConfig(algorithm="onebit"))
    slow = vc.at_speed(cost, 2.0)
    assert slow.enc_us(1 << 20) == pytest.approx(2 * cost.enc_us(1 << 20))
    assert slow.dec_add_us(1 << 20) == pytest.approx(2 * cost.dec_add_us(1 << 20))
    assert slow.wire_bytes(1000) == cost.wire_bytes(1000)


def test_draw_is_seed_reproducible_and_in_range() -> None:
    a = draw_configs(11, 20)
    assert a == draw_configs(11, 20) and a != draw_configs(12, 20)
    for c in a:
        lo, hi = vc.PLAIN_RATE_RANGE_MBIT if c.algorithm == "none" else vc.RATE_RANGE_MBIT
        assert c.rate_mbit is not None and lo <= c.rate_mbit <= hi
        if c.algorithm == "topk":
            assert vc.TOPK_RATIO_RANGE[0] <= c.options["ratio"] <= vc.TOPK_RATIO_RANGE[1]
        assert c.scheme == "allgather" or c.algorithm == "onebit"


def test_run_sets() -> None:
    assert {c.rate_mbit for c in FULL} == {20.0, 100.0, 1000.0}
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


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--model", "nope"], "unknown model 'nope'"), (["--algorithm", "nope"], "unknown compression algorithm"),
     (["--steps", "0"], "steps=0"), (["--passes", "0"], "--passes 0"), (["--seed", "-1"], "--seed -1"),
     (["--rate", "0"], "Invalid value for '--rate'")],
)  # fmt: skip
def test_bad_input(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "compress", *argv]) == 2
    assert message in capsys.readouterr().err
    with pytest.raises(UserError, match="only the mlp"):
        RunConfig(model="cnn", depth=2)


def test_cli_refuses_an_existing_result_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.json"
    out.write_text("{}")
    assert main(["validate", "compress", "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--force" in err and len(err.strip().splitlines()) == 1 and out.read_text() == "{}"


def test_cli_refuses_another_machines_calibration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cal = tmp_path / "machine.json"
    cal.write_text(json.dumps(asdict(fake_machine(version="0.0.1/1"))))
    assert main(["validate", "compress", "--quick", "--calibration", str(cal), "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert "--recalibrate" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()


@pytest.mark.multiproc
def test_worker_runs_compressed_ddp() -> None:
    """Two ranks of the worker on loopback, a drawn MLP shape: compressed steps measured, the ranks in
    sync, each rank's threads' CPU and run-queue waits reported (diagnostics only)."""
    from trainsim.testbed.launch import run_json

    cfg = {"model": "mlp", "width": 512, "depth": 3, "algorithm": "onebit", "options": {}, "scheme": "allgather",
           "steps": 2, "warmup": 1}  # fmt: skip
    data = run_json(2, "trainsim.validate.compress", cfg, net=None)[0]
    assert len(data["step_ms"]) == 2 and min(data["step_ms"]) > 0 and data["params_in_sync"]
    assert len(data["threads"]) == 2
    if data["threads"][0]:  # empty where the kernel keeps no schedstat
        assert all(t["main"]["run_ms"] > 0 and t["main"]["wait_ms"] >= 0 for t in data["threads"])
        assert run_queue_ms(tuple(data["threads"])) is not None
