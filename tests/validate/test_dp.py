"""End to end: the validate-dp harness on 2 processes over a shaped link, and its clean-up."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from trainsim.cli.main import main
from trainsim.errors import UserError
from trainsim.validate.dp import RunConfig, run_harness, summary
from trainsim.validate.netns import list_namespaces, netns_unavailable


def _our_processes() -> list[str]:
    """Live (non-zombie) children of this test process: every rank, calibration worker and delay line
    the harness starts is one, so any new one left after the harness is a leak. (Earlier tests in the
    same pytest process may have started multiprocessing's resource tracker: that one is not ours.)"""
    found = []
    me = str(os.getpid())
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[1] == me and fields[0] != "Z":
            found.append(f"{pid} {cmd}")
    return found


@pytest.mark.netns
@pytest.mark.multiproc
@pytest.mark.skipif(netns_unavailable() is not None, reason=f"no netns: {netns_unavailable()}")
def test_harness_two_processes_shaped_link() -> None:
    before = set(list_namespaces(f"trainsim-{os.getpid()}-"))
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    already = set(_our_processes())
    results, notes = run_harness([RunConfig(model="cnn", rate_mbit=50)], steps=2, warmup=2, reps=2)
    assert not notes
    (r,) = results
    assert r.where == "netns" and r.params_in_sync
    # 0.52 MB of gradients over 50 Mbit/s: at least ~83 ms per step on the wire alone
    assert 80 < r.measured_ms < 5000
    assert 80 < r.predicted_ms < 5000
    assert abs(r.error_pct) < 60  # sanity only; accuracy is the benchmark's job
    out = summary(results)
    assert set(out) == {"runs", "mean_abs_error_pct", "max_abs_error_pct"}
    assert set(out["runs"][0]) >= {"config", "predicted_ms", "measured_ms", "error_pct"}
    assert set(list_namespaces(f"trainsim-{os.getpid()}-")) == before
    assert subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout == qdiscs
    assert set(_our_processes()) <= already


@pytest.mark.multiproc
def test_no_rights_falls_back_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainsim.validate import netns

    monkeypatch.setattr(netns, "netns_unavailable", lambda: "creating network namespaces needs root")
    results, notes = run_harness(
        [RunConfig(model="cnn", rate_mbit=50, mode="p3")], steps=2, warmup=2, reps=2, passes=2
    )
    assert any("needs root" in n for n in notes)
    (r,) = results
    assert r.where == "loopback" and r.params_in_sync and r.measured_ms > 0 and r.predicted_ms > 0
    assert len(r.passes) == 2 and r.measured_ms == pytest.approx(sum(m for _, m in r.passes) / 2)


def test_cli_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "dp", "--model", "resnet9000", "--json"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["validate", "dp", "--rate", "0"]) == 2
    assert main(["validate", "dp", "--rate", "-5"]) == 2
    assert main(["validate", "dp", "--delay", "-1"]) == 2
    assert main(["validate", "dp", "--passes", "0"]) == 2
    assert "--passes 0" in capsys.readouterr().err


def test_json_shape_from_summary() -> None:
    assert json.loads(json.dumps(summary([])))["mean_abs_error_pct"] is None


@pytest.mark.multiproc
def test_runtime_overhead_one_process() -> None:
    """DDP's and the P3 runtime's own work per step, timed in a process group of one rank."""
    from trainsim.validate.launch import launch

    cfg = json.dumps({"model": "mlp", "mode": "overhead", "steps": 3, "warmup": 2, "slice_bytes": 1 << 20})
    data = json.loads(launch(1, ["-m", "trainsim.validate.dp_worker", cfg], net=None)[0].strip().splitlines()[-1])
    assert data["plain_ms"] > 0 and data["ddp_ms"] > 0 and data["p3_ms"] > 0
    assert data["overhead_ms"] >= 0.0  # the paired difference of their steps (``alternating_ms``)
    # the part after the last bucket's collective: copying the buckets back into the gradients
    assert 0.0 <= data["finalize_ms"] <= data["overhead_ms"]
    assert data["p3_overhead_ms"] == pytest.approx(max(0.0, data["p3_ms"] - data["p3_plain_ms"]))


def test_alternating_pairs_the_steps() -> None:
    """``alternating_ms`` runs the loops' steps in turn and reads a cost that only one of them has as
    the median paired difference: a module that sleeps 3 ms per forward costs about 3 ms more."""
    import time

    import torch

    from trainsim.validate.dp_worker import alternating_ms

    class Slow(torch.nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            time.sleep(0.003)
            return super().forward(x)

    torch.manual_seed(0)
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    nets = {"fast": torch.nn.Linear(4, 2), "slow": Slow(4, 2)}
    t = alternating_ms(nets, lambda i: (x, y), torch.nn.CrossEntropyLoss(), 0.01, warmup=1, steps=5)
    assert set(t) == {"fast", "slow", "diff_ms"}
    assert 2.9 <= t["diff_ms"] <= 3.0 + 50.0  # the sleep, plus whatever a loaded host adds to it
    assert t["slow"] > t["fast"] > 0


def test_median_of_passes_by_hand() -> None:
    from trainsim.validate.dp import RunResult, median_of_passes

    c = RunConfig(model="cnn", rate_mbit=50)

    def run(pred: float, meas: float) -> RunResult:
        return RunResult(c, pred, meas, [meas], {}, "netns", {"corun": pred}, True, pred + 1)

    assert median_of_passes([run(1.0, 2.0)]).passes == ()
    r = median_of_passes([run(90.0, 100.0), run(95.0, 300.0), run(99.0, 105.0)], "predicted_alone_ms")
    assert (r.predicted_ms, r.measured_ms, r.predicted_alone_ms) == (95.0, 105.0, 96.0)
    assert r.single_ms == {"corun": 99.0}  # the host figures of the median pass
    assert [p["measured_ms"] for p in r.to_json()["passes"]] == [100.0, 300.0, 105.0]


def test_straggler_wait_by_hand() -> None:
    from trainsim.validate.dp import straggler_ms

    assert straggler_ms([[10.0] * 5, [10.0] * 5]) == 0.0
    assert straggler_ms([[10.0, 20.0]]) == 0.0  # one rank waits for nobody
    # two ranks, each step 10 or 20 ms with equal odds: E[max] = 17.5, median 15
    assert straggler_ms([[10.0, 20.0], [10.0, 20.0]], draws=20000) == pytest.approx(2.5, abs=0.15)


@pytest.mark.multiproc
def test_agreement_round_probe_two_processes() -> None:
    """The P3 runtime's agreement round, timed while both ranks train: one mean over the steady rounds."""
    from trainsim.validate.dp_worker import PROBE_PLAIN_STEPS
    from trainsim.validate.launch import launch

    cfg = json.dumps({"model": "cnn", "mode": "agree_probe", "rounds": 20, "slice_bytes": 4096})
    data = json.loads(launch(2, ["-m", "trainsim.validate.dp_worker", cfg], net=None)[0].strip().splitlines()[-1])
    assert len(data["rounds_us"]) == 16  # the first fifth is the ranks' start-up
    assert data["round_us"] == pytest.approx(sum(data["rounds_us"]) / 16)
    assert all(t > 0 for t in data["rounds_us"]) and data["train_steps"] >= 1
    # every rank's training steps meanwhile (the first, warming up, dropped), as many on each
    a, b = data["steps_ms"]
    assert len(a) == len(b) <= data["train_steps"] - 1 and all(t > 0 for t in a + b)
    # and the plain loop without the thread, before and after (the first of each dropped)
    pa, pb = data["plain_steps_ms"]
    assert len(pa) == len(pb) == 2 * (PROBE_PLAIN_STEPS - 1) and all(t > 0 for t in pa + pb)


def test_agree_probe_straggler_needs_steps() -> None:
    from trainsim.validate.dp import AgreeProbe, straggler_ms

    assert AgreeProbe(3000.0, [[50.0] * 4, [60.0] * 4]).straggler_ms is None  # too few steps
    assert AgreeProbe(3000.0, [[50.0] * 9]).straggler_ms is None  # one rank waits for nobody
    steps = [[50.0, 52.0, 70.0, 51.0, 55.0], [60.0, 61.0, 59.0, 75.0, 62.0]]
    assert AgreeProbe(3000.0, steps).straggler_ms == straggler_ms(steps) > 0


def test_agree_probe_stretch_by_hand() -> None:
    """The computation's slowdown while the communication thread works: median step under the rounds
    over the median plain step, at least 1; None without plain steps."""
    from trainsim.validate.dp import AgreeProbe

    steps = [[60.0, 66.0, 63.0], [61.0, 64.0, 65.0]]  # per-rank medians 63, 64 -> 63.5
    assert AgreeProbe(3000.0, steps, [[40.0, 42.0, 41.0], [44.0, 40.0, 42.0]]).stretch == pytest.approx(63.5 / 41.5)
    assert AgreeProbe(3000.0, steps, [[70.0] * 3, [70.0] * 3]).stretch == 1.0  # never below 1
    assert AgreeProbe(3000.0, steps).stretch is None
    assert AgreeProbe(3000.0, steps, [[40.0], []]).stretch is None


@pytest.mark.multiproc
@pytest.mark.parametrize("rounds", [True, False])
def test_p3_runtime_told_its_mode_keeps_ranks_in_sync(rounds: bool) -> None:
    """The harness tells the runtime whether to agree by rounds or piggyback; either keeps the weights equal."""
    from trainsim.validate.launch import launch

    cfg = json.dumps({"model": "cnn", "mode": "p3", "steps": 3, "warmup": 1, "slice_bytes": 65536,
                      "agree_rounds": rounds})  # fmt: skip
    data = json.loads(launch(2, ["-m", "trainsim.validate.dp_worker", cfg], net=None)[0].strip().splitlines()[-1])
    assert data["p3_agreement_rounds"] is rounds
    assert data["params_in_sync"] and len(data["step_ms"]) == 3


@pytest.mark.multiproc
def test_priority_runtimes_train_like_ddp() -> None:
    """P3 (rounds or piggyback) and ByteScheduler (several partitions in flight, completions taken by a
    thread of their own) end with torch DDP's weights after the same steps on the same data: the same
    averaged gradient, the same SGD. (Until 2026-11-26 each step's backward added to the previous
    step's averaged gradient, which the runtime had left in ``.grad``: 2 % off on the weights' sum.)"""
    from trainsim.validate.launch import launch

    def final(mode: str, **extra: object) -> float:
        cfg = json.dumps({"model": "cnn", "mode": mode, "steps": 3, "warmup": 1, **extra})
        data = json.loads(launch(2, ["-m", "trainsim.validate.dp_worker", cfg], net=None)[0].strip().splitlines()[-1])
        assert data["params_in_sync"]
        return float(data["param_sum"])

    ddp = final("ddp")
    assert final("p3", slice_bytes=65536, agree_rounds=True) == pytest.approx(ddp, rel=1e-9)
    assert final("p3", slice_bytes=65536, agree_rounds=False) == pytest.approx(ddp, rel=1e-9)
    assert final("bytescheduler", partition_bytes=16384, credit=3) == pytest.approx(ddp, rel=1e-9)


@pytest.mark.multiproc
def test_p3_trace_from_every_rank_on_one_clock() -> None:
    """Traced, every rank prints its timeline with its reference time, so ranks line up: the same slice
    all-reduce (a collective) overlaps in time on both ranks."""
    from trainsim.validate.launch import launch

    cfg = json.dumps({"model": "cnn", "mode": "p3", "steps": 2, "warmup": 1, "slice_bytes": 65536,
                      "agree_rounds": True, "trace": True})  # fmt: skip
    outs = [json.loads(o.strip().splitlines()[-1]) for o in launch(2, ["-m", "trainsim.validate.dp_worker", cfg], net=None)]
    slices = []
    for d in outs:
        assert len(d["step_starts_ms"]) == 3 and d["p3_log"]
        slices.append([(d["t_ref_s"] * 1e3 + a, d["t_ref_s"] * 1e3 + b) for k, _, a, b in d["p3_log"] if k == "slice"])
    # each rank logs from its own first measured step: compare where both logs run
    start = max(s[0][0] for s in slices)
    common = [(a, b) for a, b in slices[0] if a >= start]
    assert common
    for a0, b0 in common:  # both ranks inside the same collective at once
        assert any(max(a0, a1) <= min(b0, b1) + 0.5 for a1, b1 in slices[1])


def test_overlapping_steps_keep_what_ran_together() -> None:
    from trainsim.validate.dp import overlapping_steps

    # copy a starts 0.25 s before b and finishes before b: its first steps and b's last ran alone
    a = [0.0, 0.1, 0.2, 0.3, 0.45, 0.6, 0.75, 0.9, 1.05, 1.2]
    b = [0.25, 0.4, 0.55, 0.7, 0.85, 1.0, 1.15, 1.3, 1.4, 1.5]
    got = overlapping_steps([a, b], min_steps=3)
    assert got[0] == pytest.approx([150.0] * 6)  # 0.3 .. 1.2
    assert got[1] == pytest.approx([150.0] * 6)  # 0.25 .. 1.15 (1.15 -> 1.3 ends after a did)
    # too few steps inside the window: the copy keeps them all
    assert len(overlapping_steps([a, b], min_steps=7)[1]) == 9


@pytest.mark.multiproc
def test_corun_copies_start_together() -> None:
    from trainsim.validate.dp import _corun_steps

    per_rank = _corun_steps("mlp", 2, 8)
    assert len(per_rank) == 2 and all(len(r) >= 5 and all(t > 0 for t in r) for r in per_rank)


def test_interleaved_corun_per_round_by_hand() -> None:
    """Each round's plain steps are cut to the window where every rank ran (``overlapping_steps``),
    then joined per rank."""
    from trainsim.validate.dp import interleaved_corun

    # round 1: rank 1 starts 0.1 s late and runs one step alone at the end; round 2: together
    r0 = [[0.0, 0.1, 0.2, 0.3], [1.0, 1.1, 1.2]]
    r1 = [[0.1, 0.2, 0.3, 0.45], [1.0, 1.12, 1.24]]
    got = interleaved_corun([r0, r1])
    assert got[0] == pytest.approx([100.0, 100.0, 100.0, 100.0])  # 0.1-0.3, then all of round 2
    assert got[1] == pytest.approx([100.0, 100.0, 120.0, 120.0])  # 0.1-0.3 (0.3-0.45 ran alone)


@pytest.mark.multiproc
@pytest.mark.parametrize("mode", ["ddp", "p3"])
def test_interleaved_run_keeps_ranks_in_sync(mode: str) -> None:
    """With ``interleave`` the measured steps alternate with the plain loop on a copy of the model: as
    many measured steps as asked, every rank's plain steps per round, and the trained weights still
    equal on both ranks (the copy never touches them)."""
    from trainsim.validate.dp import interleaved_corun
    from trainsim.validate.dp_worker import INTERLEAVE_ROUNDS
    from trainsim.validate.launch import launch

    steps = 3 * INTERLEAVE_ROUNDS
    cfg = json.dumps({"model": "cnn", "mode": mode, "steps": steps, "warmup": 2, "slice_bytes": 65536,
                      "interleave": True, "agree_rounds": True})  # fmt: skip
    data = json.loads(launch(2, ["-m", "trainsim.validate.dp_worker", cfg], net=None)[0].strip().splitlines()[-1])
    assert data["params_in_sync"] and len(data["step_ms"]) == steps
    marks = data["corun_marks"]
    assert len(marks) == 2 and all(len(r) == INTERLEAVE_ROUNDS for r in marks)
    per_rank = interleaved_corun(marks)
    assert all(len(r) >= INTERLEAVE_ROUNDS and all(t > 0 for t in r) for r in per_rank)


def test_concentration_charges_the_transfers_cpu_of_every_rank_sharing_the_host() -> None:
    """``predict_ms(concentration=c)``: an all-reduce's host CPU that overlaps backward costs the rank
    that sets the step c ranks' worth; not with ``alone`` and not on top of the P3 runtime's measured
    stretch, which already holds it."""
    from tests.transform.test_dataparallel import _profile_like
    from trainsim.transform.dataparallel import ParamInfo
    from trainsim.validate.dp import _Profiled, predict_ms

    g, _, layers = _profile_like()
    mib = 1 << 20
    # two 20 MiB gradients: two DDP buckets, the first one's all-reduce overlaps layer a's backward
    params = [ParamInfo(name="a.w", layer="a", numel=5 * mib, size_bytes=20 * mib),
              ParamInfo(name="b.w", layer="b", numel=5 * mib, size_bytes=20 * mib)]  # fmt: skip
    prof = _Profiled(g, params, layers, 0, [20 * mib, 20 * mib], 1.0, 1.0, 1.0, g)
    cfg = RunConfig(model="mlp", rate_mbit=100.0)

    def pred(**kw: object) -> float:
        return predict_ms(prof, cfg, lambda b: 40.0, cpu_us=lambda b: 20.0, **kw)  # type: ignore[arg-type]

    one, two = pred(), pred(concentration=2.0)
    assert two > one
    assert pred(concentration=1.0) == one
    p3 = RunConfig(model="mlp", rate_mbit=100.0, mode="p3")
    stretched = [predict_ms(prof, p3, lambda b: 40.0, cpu_us=lambda b: 20.0, comm_thread_stretch=1.5,
                            concentration=c) for c in (1.0, 2.0)]  # fmt: skip
    assert stretched[0] == stretched[1]


def test_bytescheduler_prediction_takes_the_measured_round() -> None:
    """ByteScheduler's runtime agrees on every partition by a round: the prediction charges the round
    measured while training where there is one, else the calibrated tiny all-reduce."""
    from tests.transform.test_dataparallel import _profile_like
    from trainsim.transform.dataparallel import ParamInfo
    from trainsim.validate.dp import RunConfig, _Profiled, predict_ms

    g, _, layers = _profile_like()
    mib = 1 << 20
    params = [ParamInfo(name="a.w", layer="a", numel=mib, size_bytes=4 * mib),
              ParamInfo(name="b.w", layer="b", numel=mib, size_bytes=4 * mib)]  # fmt: skip
    prof = _Profiled(g, params, layers, 0, [8 * mib], 1.0, 1.0, 1.0, g)
    bs = RunConfig(model="mlp", rate_mbit=100.0, mode="bytescheduler")

    def pred(**kw: object) -> float:
        return predict_ms(prof, bs, lambda b: 40.0 + b / 1e4, **kw)  # type: ignore[arg-type]

    base, slow = pred(agree_us=100.0), pred(agree_us=5000.0)
    assert slow > base > 0
    assert pred(agree_us=5000.0, alone=True) == pytest.approx(pred(alone=True))  # alone: the calibrated round
    for bad in ({"mode": "zero"}, {"credit": 0}, {"partition_bytes": 0}):
        with pytest.raises(UserError, match="validate dp"):
            RunConfig(model="mlp", rate_mbit=100.0, **bad)  # type: ignore[arg-type]
