"""``validate ooo-dp`` / ``validate pipeline``: the protocol (predictions frozen before the first run,
untouched by anything a run reads), seed-reproducible draws, bad input stopping before any process."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest

from trainsim.capture.layerprofile import LayerProfile
from trainsim.cli.main import main
from trainsim.testbed import machine as mcal
from trainsim.validate import ooo, pipeline
from trainsim.validate.pipeline import CaseProfile, post_us_per_op


def _cal() -> mcal.MachineCalibration:
    return mcal.MachineCalibration(
        machine=mcal.identity(), version=mcal.version(), created_at="2026-11-29T00:00:00+00:00", sizes_bytes=[1, 2],
        loopback_us=[100.0, 100.0], host_a_us=150.0, host_b_us_per_byte=0.002,
        shaped_rates_mbit=[], shaped_sizes_bytes=[], efficiency_grid=[], shaped_us=[], link_efficiency=0.9, allgather_loopback_us=[], allgather_line=(80.0, 0.002), p2p_loopback_us=[],
        p2p_line=(120.0, 0.001), kernel_ms=0.4, corun_slowdown={"2": 1.1, "4": 2.1}, load_avg=0.1,
    )  # fmt: skip


def _profile(model: str, n_layers: int, batch_sizes: tuple[int, ...]) -> LayerProfile:
    """A synthetic per-layer profile: every layer 1 ms forward, 2 ms backward, 1 MB of parameters."""
    def rows(bs: int) -> list[dict[str, Any]]:
        s = bs / 32
        return [{"name": f"l{i}", "fwd_us": 1000.0 * s, "bwd_us": 2000.0 * s, "bwd_input_us": 1000.0 * s,
                 "bwd_weight_us": 1100.0 * s, "opt_us": 200.0, "pack_us": 50.0, "unpack_us": 50.0,
                 "param_bytes": 1 << 20, "out_bytes": 4096 * bs} for i in range(n_layers)]  # fmt: skip

    return LayerProfile(model, 1, 3, "test", {bs: {"loss_us": 100.0, "layers": rows(bs)} for bs in batch_sizes})


class WildRunner:
    """A stand-in for the real runs: every call returns a different step and wildly perturbed in-run
    readings; records the result file's state at its first call."""

    def __init__(self, out: Path) -> None:
        self.out, self.calls, self.first_doc = out, 0, None

    def __call__(self, cfg: dict[str, Any], p: int) -> tuple[float, dict[str, Any]]:
        if self.first_doc is None:
            self.first_doc = json.loads(self.out.read_text())
        self.calls += 1
        wild = 10.0 ** ((self.calls % 5) - 2)  # 0.01 ... 100
        return 20.0 * (1 + 0.05 * (self.calls % 3)), {"host_speed": wild, "corun_factor": 1 / wild,
                                                       "step_median_ms": 1e6 * wild, "run_queue_ms": wild}  # fmt: skip


def _frozen(doc: dict[str, Any]) -> list[tuple[str, float]]:
    return [(r["label"], r["predicted_ms"]) for r in doc["runs"]]


def test_the_machine_calibration_is_a_collective_cost() -> None:
    """``MachineCalibration.cost`` answers ``time_us`` with its own models (what ``validate ooo-dp`` prices
    the all-reduces with), an all-gather's size being its output, and refuses a kind it has no model of."""
    from trainsim.errors import UserError

    cal = _cal()
    net = cal.cost(rate_mbit=100.0, delay_ms=2.0)
    assert net.time_us("allreduce", 1e6, 4) == cal.allreduce_us(1e6, world=4, rate_mbit=100.0, delay_ms=2.0)
    assert net.time_us("allgather", 3e6, 3) == pytest.approx(cal.allgather_us(1e6, world=3, rate_mbit=100.0, delay_ms=2.0))
    assert net.time_us("p2p", 1e6, 2) == cal.p2p_us(1e6, rate_mbit=100.0, delay_ms=2.0)
    with pytest.raises(UserError, match="no model of 'broadcast'"):
        net.time_us("broadcast", 1e6, 2)


# --------------------------------------------------------------------------- ooo-dp
def _ooo_profiler(case: ooo.OooCase) -> LayerProfile:
    return _profile(case.model, case.blocks + 2, (case.batch_size,))


def test_ooo_predictions_are_frozen_first_and_untouched_by_in_run_readings(tmp_path: Path) -> None:
    cases = [ooo.OooCase(model="mlp", blocks=4, rate_mbit=200.0, k=2),
             ooo.OooCase(model="transformer", blocks=3, rate_mbit=500.0, delay_ms=1.0, drawn=True)]  # fmt: skip
    docs = []
    for i in range(2):  # the same cases twice, with different in-run readings: the same predictions
        out = tmp_path / f"r{i}.json"
        runner = WildRunner(out)
        if i:
            runner.calls = 17
        doc = ooo.run_ooo_validation(cases, out, seed=5, mc=_cal(), passes=3, runner=runner, profiler=_ooo_profiler,
                                     shaped=True)  # fmt: skip
        assert runner.first_doc is not None and runner.first_doc["predictions_frozen_at"]
        assert runner.first_doc["runs_started_at"] is not None and all(
            r["measured_ms"] is None for r in runner.first_doc["runs"])  # fmt: skip
        assert _frozen(runner.first_doc) == _frozen(doc)  # nothing a run returned reached a prediction
        assert runner.calls - 17 * i == 3 * len(doc["runs"])
        docs.append(doc)
    assert _frozen(docs[0]) == _frozen(docs[1])
    doc = docs[0]
    assert [r["config"]["k"] for r in doc["runs"][:2]] == [0, 2] and doc["runs"][0]["held_out"] is False
    assert any(r["held_out"] for r in doc["runs"])
    for r in doc["runs"]:
        assert len(r["measured_passes_ms"]) == 3 and len(r["diagnostics"]) == 3
        assert r["within"] in ("10%", "spread", False) and r["spread_pct"] >= 0
    assert doc["seed"] == 5 and doc["mean_abs_error_pct"] is not None and doc["speedups"]
    assert json.loads((tmp_path / "r0.json").read_text())["finished_at"]


def test_ooo_prediction_reads_the_machine_calibration() -> None:
    """A slower link or a busier host: a slower predicted step (the calibration is an input, the runs are not)."""
    case = ooo.OooCase(model="mlp", blocks=4, rate_mbit=1000.0, k=0)
    prof = _ooo_profiler(case)
    base = ooo.predict_case(case, prof, _cal())[0]["predicted_ms"]
    slow_link = ooo.predict_case(replace(case, rate_mbit=50.0), prof, _cal())[0]["predicted_ms"]
    busy = ooo.predict_case(case, prof, replace(_cal(), corun_slowdown={"2": 1.5, "4": 3.0}))[0]["predicted_ms"]
    assert slow_link > base and busy > base


def test_ooo_draws_repeat_with_the_seed() -> None:
    a, b, c = ooo.draw_cases(11, False), ooo.draw_cases(11, False), ooo.draw_cases(12, False)
    assert a == b and a != c and len(a) == 3 and len(ooo.draw_cases(11, True)) == 1
    lo, hi = ooo.RATE_RANGE_MBIT
    for case in a + c:
        assert case.drawn and case.k is not None and case.k >= 1 and lo <= (case.rate_mbit or 0) <= hi
        assert case.delay_ms in ooo.DELAYS_MS


def test_ooo_interrupt_keeps_what_was_measured_marked_partial(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    n = [0]

    def runner(cfg: dict[str, Any], p: int) -> float:
        n[0] += 1
        if n[0] == 3:
            raise KeyboardInterrupt
        return 10.0

    with pytest.raises(KeyboardInterrupt):
        ooo.run_ooo_validation([ooo.OooCase(model="mlp", blocks=3, k=1)], out, seed=1, mc=_cal(), runner=runner,
                               profiler=_ooo_profiler, shaped=False)  # fmt: skip
    doc = json.loads(out.read_text())
    assert doc["partial"] and "Ctrl-C" in doc["partial_reason"] and doc["measured"] == 2
    assert all(r["config"]["rate_mbit"] is None for r in doc["runs"])  # no namespaces: predicted as unshaped


# --------------------------------------------------------------------------- pipeline
def _pipe_profiler(case: pipeline.PipeCase) -> CaseProfile:
    ms = sorted({m for _, _, m in case.configs()})
    prof = _profile(case.model, case.blocks + 3, tuple(sorted({case.batch_size // m for m in ms})))
    return CaseProfile(prof, {m: 30.0 for m in ms})


def test_pipeline_predictions_are_frozen_first_and_untouched_by_in_run_readings(tmp_path: Path) -> None:
    cases = [pipeline.PipeCase(blocks=4, microbatches=(4,), schedules=(("GPipe", 1), ("1F1B", 1), ("ZBVZeroBubble", 2))),
             pipeline.draw_case(3, True)]  # fmt: skip
    docs = []
    for i in range(2):
        out = tmp_path / f"p{i}.json"
        runner = WildRunner(out)
        runner.calls = 7 * i
        doc = pipeline.run_pipeline_validation(cases, out, seed=3, mc=_cal(), passes=3, runner=runner,
                                               profiler=_pipe_profiler, shaped=True)  # fmt: skip
        assert runner.first_doc is not None and runner.first_doc["predictions_frozen_at"]
        assert _frozen(runner.first_doc) == _frozen(doc)
        docs.append(doc)
    assert _frozen(docs[0]) == _frozen(docs[1])
    doc = docs[0]
    assert len(doc["runs"]) == 5 and sum(r["held_out"] for r in doc["runs"]) == 2
    assert all(sum(r["config"]["split"]) == r["config"]["blocks"] + 3 for r in doc["runs"])
    assert {"pairs_checked", "misranked", "right"} <= set(doc["ranking"]) and "ranking_same_m" in doc
    assert all(len(r["diagnostics"]) == 3 for r in doc["runs"])


def test_pipeline_link_comes_from_the_calibration_alone() -> None:
    cal = _cal()
    link = pipeline.pipe_link(cal, 100.0, 2.0)
    a, b = cal.p2p_line
    assert link.cpu_us == pytest.approx(a / 2) and link.cpu_us_per_byte == pytest.approx(b / 2)
    assert link.wire.latency_us == pytest.approx(2000.0)
    assert link.transfer_us(1_000_000) - link.wire.latency_us == pytest.approx(8e6 / (100 * 0.9))
    # unshaped: the host's work is the whole cost of a message
    assert pipeline.pipe_link(cal, None, 0.0).transfer_us(1_000_000) < 10.0


def test_pipeline_draws_repeat_with_the_seed() -> None:
    a, b, c = pipeline.draw_case(4, False), pipeline.draw_case(4, False), pipeline.draw_case(5, False)
    assert a == b and a != c and a.drawn and len(a.configs()) == 4 and len(pipeline.draw_case(4, True).configs()) == 2
    assert all(m in pipeline.DRAW_MICROBATCHES for _, _, m in a.configs() + c.configs())


def test_ranking_within_one_microbatch_count() -> None:
    def row(name: str, m: int, pred: float, meas: float) -> dict[str, Any]:
        return {"label": name, "config": {"model": "transformer", "blocks": 4, "rate_mbit": 1e3, "delay_ms": 0.0,
                                          "microbatches": m}, "predicted_ms": pred, "measured_ms": meas,
                "spread_pct": 2.0}  # fmt: skip

    rows = [row("a", 4, 10.0, 100.0), row("b", 4, 12.0, 120.0), row("c", 8, 30.0, 50.0)]
    out = pipeline.ranking_same_m(rows)
    assert out == {"pairs_checked": 1, "misranked": [], "right": True}  # c is alone at M = 8
    rows[1]["predicted_ms"] = 8.0
    assert pipeline.ranking_same_m(rows)["misranked"] == [["a", "b"]]


def test_post_us_per_op_divides_each_kind_s_posting_by_its_operations() -> None:
    ranks = [
        {"p2p_ms_per_step": {"post": 5.0, "post:send": 2.0, "post:recv": 3.0}, "p2p_ops_per_step": {"send": 16.0, "recv": 12.0}},
        {"p2p_ms_per_step": {"post": 1.0, "post:send+recv": 1.0, "wait": 9.0}, "p2p_ops_per_step": {"send+recv": 4.0}},
        {"p2p_ms_per_step": {}, "p2p_ops_per_step": {}},  # a torch without the runtime's helpers: nothing timed
    ]
    assert post_us_per_op(ranks) == [{"send": 125.0, "recv": 250.0}, {"send+recv": 250.0}, {}]


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "argv,msg",
    [
        (["validate", "pipeline", "--schedule", "ZBVZeroBubble/1"], "needs 2 stage(s) per rank"),
        (["validate", "pipeline", "--microbatches", "5"], "does not divide the batch size 32"),
        (["validate", "pipeline", "--schedule", "Nope"], "unknown schedule"),
        (["validate", "ooo-dp", "--model", "mlp", "--k", "9"], "has 4 layers"),
        (["validate", "ooo-dp", "--passes", "0"], "--passes 0"),
        (["validate", "pipeline", "--passes", "0"], "--passes 0"),
        (["validate", "ooo-dp", "--seed", "-1"], "--seed -1"),
        (["validate", "pipeline", "--seed", "-3"], "--seed -3"),
        (["validate", "pipeline", "--rate", "0"], "Invalid value for '--rate'"),
        (["validate", "pipeline", "--latency-us", "-2"], "Invalid value for '--latency-us'"),
        (["validate", "ooo-dp", "--rate", "0"], "Invalid value for '--rate'"),
        (["validate", "ooo-dp", "--delay", "-1"], "Invalid value for '--latency-us'"),
        (["validate", "ooo-dp", "--blocks", "0"], "Invalid value for '--blocks'"),
        (["validate", "pipeline", "--batch-size", "0"], "Invalid value for '--batch-size'"),
    ],
)
def test_bad_input_exits_2_before_running(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert msg in capsys.readouterr().err


@pytest.mark.parametrize("command", ["ooo-dp", "pipeline"])
def test_existing_result_file_or_foreign_calibration_is_one_line_and_exit_2(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    out.write_text("{}")
    assert main(["validate", command, "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--force" in err and out.read_text() == "{}"
    cal = tmp_path / "machine.json"
    cal.write_text(json.dumps(asdict(replace(_cal(), machine={"cpu": "other", "cores": 64, "mem_gib": 512}))))
    assert main(["validate", command, "--quick", "--out", str(tmp_path / "new.json"), "--calibration", str(cal)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another machine" in err and "--recalibrate" in err
    assert not (tmp_path / "new.json").exists()


# --------------------------------------------------------------------------- real runs (marked)
@pytest.mark.netns
@pytest.mark.multiproc
def test_quick_pipeline_validation_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cal = tmp_path / "machine.json"
    cal.write_text(json.dumps(asdict(_cal())))
    argv = ["validate", "pipeline", "--quick", "--json", "--schedule", "1F1B", "--steps", "2", "--passes", "2",
            "--seed", "1", "--calibration", str(cal), "--out", str(tmp_path / "p.json")]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["runs"]) == 3 and all(len(r["measured_passes_ms"]) == 2 for r in out["runs"])
    assert out["predictions_frozen_at"] <= out["runs_started_at"] and out["calibration"]["file"] == str(cal)
    assert all(r["diagnostics"][0]["step_min_ms"] > 0 for r in out["runs"])


@pytest.mark.netns
@pytest.mark.multiproc
def test_ooo_dp_validation_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cal = tmp_path / "machine.json"
    cal.write_text(json.dumps(asdict(_cal())))
    argv = ["validate", "ooo-dp", "--model", "mlp", "--blocks", "2", "--rate", "200", "--k", "1", "--steps", "2",
            "--passes", "2", "--seed", "1", "--calibration", str(cal), "--out", str(tmp_path / "o.json"), "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["config"]["k"] for r in out["runs"][:2]] == [0, 1]
    assert all(len(r["measured_passes_ms"]) == 2 and r["measured_ms"] > 0 for r in out["runs"])
    assert out["speedups"] and out["seed"] == 1
