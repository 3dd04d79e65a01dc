"""``validate ooo-dp`` / ``validate pipeline``: bad input stops before any process; ranking logic."""

from __future__ import annotations

import json
import statistics

import pytest

from trainsim.cli.main import main
from trainsim.validate.pipeline import misranked_lines, post_us_per_op, ranking_check


def _row(label: str, m: int, pred: float, meas: float) -> dict[str, object]:
    return {"config": {"label": label, "microbatches": m}, "predicted_ms": pred, "measured_ms": meas}


def test_post_us_per_op_divides_each_kind_s_posting_by_its_operations() -> None:
    ranks = [
        {"p2p_ms_per_step": {"post": 5.0, "post:send": 2.0, "post:recv": 3.0}, "p2p_ops_per_step": {"send": 16.0, "recv": 12.0}},
        {"p2p_ms_per_step": {"post": 1.0, "post:send+recv": 1.0, "wait": 9.0}, "p2p_ops_per_step": {"send+recv": 4.0}},
        {"p2p_ms_per_step": {}, "p2p_ops_per_step": {}},  # a torch without the runtime's helpers: nothing timed
    ]
    assert post_us_per_op(ranks) == [{"send": 125.0, "recv": 250.0}, {"send+recv": 250.0}, {}]


def test_ranking_check_only_counts_clear_gaps() -> None:
    rows = [
        _row("a", 4, 10.0, 100.0),
        _row("b", 4, 12.0, 120.0),
        _row("c", 4, 9.0, 102.0),
        _row("d", 8, 1, 1),
    ]
    out = ranking_check(rows, 5.0)
    assert out["pairs_checked"] == 2  # a-b (20%) and b-c (17.6%); a-c is within 5%
    assert out["ranking_ok"] and not out["pairs_misranked"]
    rows[1]["predicted_ms"] = 8.0
    out = ranking_check(rows, 5.0)
    assert out["pairs_misranked"] == ["M=4: a vs b", "M=4: b vs c"]
    # each misranked pair with its gaps and how many passes measured it in the medians' order
    rows[0]["passes_ms"], rows[1]["passes_ms"] = [90.0, 130.0, 95.0], [120.0, 110.0, 125.0]
    first = ranking_check(rows, 5.0)["misranked_detail"][0]
    assert first == {"pair": "M=4: a vs b", "measured_gap_pct": 20.0, "predicted_gap_pct": 25.0,
                     "passes_in_measured_order": "2/3"}  # fmt: skip
    assert out["misranked_detail"][1]["passes_in_measured_order"] == "0/0"  # no passes recorded
    assert misranked_lines(ranking_check(rows, 5.0))[0] == (
        "M=4: a vs b (measured 20.0 % apart, in that order in 2/3 passes; predicted 25.0 % the other way)")
    assert misranked_lines({"pairs_misranked": ["M=4: a vs b"]}) == ["M=4: a vs b"]  # older JSON: names only


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["validate", "pipeline", "--schedule", "ZBVZeroBubble/1"], "needs 2 stage(s) per rank"),
        (["validate", "pipeline", "--microbatches", "5"], "does not divide the batch size 32"),
        (["validate", "pipeline", "--schedule", "Nope"], "unknown schedule"),
        (["validate", "ooo-dp", "--model", "mlp", "--k", "9"], "has 4 layers"),
        (["validate", "ooo-dp", "--passes", "0"], "--passes 0"),
        (["validate", "pipeline", "--passes", "0"], "--passes 0"),
        # the link's figures are checked before the profile (they were refused only after it, and
        # ``validate ooo-dp --rate 0`` ran the built-in set)
        (["validate", "pipeline", "--rate", "0"], "Invalid value for '--rate'"),
        (["validate", "pipeline", "--delay", "-2"], "Invalid value for '--delay'"),
        (["validate", "ooo-dp", "--rate", "0"], "Invalid value for '--rate'"),
        (["validate", "ooo-dp", "--delay", "-1"], "Invalid value for '--delay'"),
        (["validate", "ooo-dp", "--blocks", "0"], "Invalid value for '--blocks'"),  # was ignored: the built-in set ran
        (["validate", "pipeline", "--batch-size", "0"], "Invalid value for '--batch-size'"),
    ],
)
def test_bad_input_exits_2_before_running(
    argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert msg in capsys.readouterr().err


@pytest.mark.netns
@pytest.mark.multiproc
def test_quick_pipeline_validation_runs(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["validate", "pipeline", "--quick", "--json", "--schedule", "1F1B", "--steps", "2", "--passes", "2"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["runs"]) == 1 and out["runs"][0]["measured_ms"] > 0
    run = out["runs"][0]
    # two passes, each with its own co-run reading and prediction; the row reports their medians
    assert len(run["passes_ms"]) == len(run["passes_predicted_ms"]) == len(run["passes_corun_factor"]) == 2
    assert run["predicted_ms"] == pytest.approx(sum(run["passes_predicted_ms"]) / 2, abs=1e-3)
    # the prediction used the co-run factor measured just before; without it, it is never slower
    assert run["corun_factor"] >= 1.0 and run["predicted_no_corun_ms"] <= run["predicted_ms"] * 1.01
    # the loop's speed at profile time: one step before each of the profile's 40 timed steps
    assert all(len(v) == 40 and min(v) > 0 for v in out["profile_time_loop_ms"].values())
    # posting on a busy host: calibrated, never negative, part of the link's host time per message (the
    # ranks unpinned, the default; the probe's correction never takes the rest below 0; busy_post_us is
    # rounded to 0.1 us)
    assert 0.0 <= out["link"]["busy_post_us"] <= out["link"]["cpu_us"] + 0.05 and run["config"]["pinned"] is False
    # what posting one send and one receive took in the run, per rank (medians of the passes)
    assert len(run["post_us"]) == 2 and all(set(r) <= {"send", "recv", "send+recv"} and r for r in run["post_us"])
    assert all(v > 0 for r in run["post_us"] for v in r.values())


@pytest.mark.netns
@pytest.mark.multiproc
def test_ooo_dp_validation_in_passes(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["validate", "ooo-dp", "--model", "mlp", "--blocks", "2", "--rate", "200", "--k", "1", "--steps", "2",
            "--passes", "2", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["config"]["mode"] for r in out["runs"]] == ["ddp-order", "reverse-first-k"]
    for r in out["runs"]:
        assert len(r["passes_ms"]) == 2 and r["measured_ms"] == pytest.approx(sum(r["passes_ms"]) / 2, abs=1e-3)
        # the prediction: per pass from the host's speed read during its runs; the one from before beside it
        assert len(r["passes_predicted_ms"]) == len(r["passes_host_reading"]) == 2
        assert r["predicted_ms"] == pytest.approx(sum(r["passes_predicted_ms"]) / 2, abs=1e-3)
        assert r["predicted_before_runs_ms"] > 0
        # the loop's speed at profile time: one step before each of the profile's 40 timed steps
        assert len(r["profile_time_loop_steps_ms"]) == 40
        assert r["profile_time_loop_ms"] == pytest.approx(statistics.median(r["profile_time_loop_steps_ms"]), abs=1e-3)
        assert all(h["host_speed"] > 0 and h["corun_factor"] >= 1.0 for h in r["passes_host_reading"])
        assert r["predicted_ms"] > 0
    (s,) = out["speedups"]
    assert s["passes"] == 2 and s["measured_speedup"] > 0 and s["torch_ddp_ms"] > 0


@pytest.mark.multiproc
def test_side_by_side_terms_read_every_order_with_one_co_run_factor() -> None:
    from trainsim.capture.layerprofile import profile_layers
    from trainsim.validate.ooo import OooCase, side_by_side_terms

    case = OooCase(model="mlp", blocks=4, batch_size=8, rate_mbit=None)
    prof = profile_layers("mlp", batch_sizes=(8,), reps=3, zoo=case.zoo())
    terms = side_by_side_terms(case, prof, (0, 2, 2), steps=5, warmup=1)
    assert sorted(terms) == [0, 2]
    assert terms[0].factor == terms[2].factor >= 1.0
    assert all(t.extra_us >= 0 for t in terms.values())


@pytest.mark.multiproc
def test_copies_with_one_start_at_start_their_loops_together() -> None:
    """``start_at`` holds each copy's loop until one moment, so copies launched together (whose
    processes come up a second apart) run their steps at once (``side_by_side_terms``)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from trainsim.run.ooo_dp import DpRunConfig, run_dp
    from trainsim.run.ranks import free_ports
    from trainsim.validate.ooo import CORUN_START_S

    cfg = DpRunConfig(mode="ooo", k=0, world_size=1, model="mlp", batch_size=8, steps=3, warmup=1,
                      start_at=time.time() + CORUN_START_S)  # fmt: skip
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(run_dp, cfg, port=p) for p in free_ports(2)]
        marks = [f.result()["ranks"][0]["marks"] for f in futures]
    assert all(len(m) == cfg.steps + 1 for m in marks)
    assert abs(marks[0][0] - marks[1][0]) < 0.5  # perf_counter: one clock for both processes


def test_host_reading_takes_alone_steps_and_the_overlap_of_the_together_ones() -> None:
    from trainsim.validate.pipeline import host_reading

    # rank 0: alone 10 ms steps; rank 1: alone 20 ms; together: 30 ms steps, rank 1 starting 30 ms late
    r0 = {"host_speed": [{"alone": [0.0, 0.01, 0.02, 0.03], "together": [1.0, 1.03, 1.06, 1.09, 1.12, 1.15]}]}
    r1 = {"host_speed": [{"alone": [0.5, 0.52, 0.54, 0.56], "together": [1.03, 1.06, 1.09, 1.12, 1.15, 1.18]}]}
    alone, together = host_reading([[r0, r1]])
    assert alone == pytest.approx(15.0)  # median of 10, 10, 10, 20, 20, 20
    assert together == pytest.approx(30.0)
    # two runs pool their samples: a second run whose ranks ran 40 ms steps alone
    r2 = {"host_speed": [{"alone": [0.0, 0.04, 0.08, 0.12], "together": r0["host_speed"][0]["together"]}]}
    r3 = {"host_speed": [{"alone": [0.5, 0.54, 0.58, 0.62], "together": r1["host_speed"][0]["together"]}]}
    assert host_reading([[r0, r1], [r2, r3]])[0] == pytest.approx(30.0)  # median of 3x10, 3x20, 6x40
    with pytest.raises(ValueError, match="no host-speed rounds"):
        host_reading([[{"host_speed": []}, {"host_speed": []}]])


def test_co_run_steps_of_every_order_count_inside_every_copy_s_window() -> None:
    from trainsim.validate.ooo import overlapping_alt

    # copy 0 runs its orders from t = 0.0 to 1.0 s, copy 1 from 0.3 to 1.3 s: only 0.3-1.0 s counts
    c0 = {0: [(0.1 * i, 0.1 * i + 0.05) for i in range(0, 10, 2)], 3: [(0.1 * i, 0.1 * i + 0.1) for i in range(1, 10, 2)]}
    c1 = {k: [(a + 0.3, b + 0.3) for a, b in v] for k, v in c0.items()}
    got = overlapping_alt([c0, c1], min_steps=2)
    assert got[0][0] == pytest.approx([50.0, 50.0, 50.0])  # starts 0.4, 0.6, 0.8
    assert got[3][0] == pytest.approx([100.0] * 4)  # starts 0.3, 0.5, 0.7, 0.9 (ends at 1.0: inside)
    assert len(got[0][1]) == 4 and len(got[3][1]) == 3  # copy 1: its steps that end by 1.0 s
    # too few steps of an order inside the window: all of that copy's steps of it
    assert len(overlapping_alt([c0, c1], min_steps=4)[0][0]) == 5
