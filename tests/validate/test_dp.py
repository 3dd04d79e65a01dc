"""validate dp: predictions frozen before the runs and blind to them, the seeded draw, bad input, and
(marked) the real 2-process runs and their clean-up."""

from __future__ import annotations

import json
import os
import random
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from trainsim.cli.main import main
from trainsim.errors import UserError
from trainsim.testbed.machine import MachineCalibration, identity, version
from trainsim.testbed.netns import list_namespaces, netns_unavailable
from trainsim.validate import dp
from trainsim.validate.dp import RunConfig, draw_configs, run_validation


def fake_machine(**kw: Any) -> MachineCalibration:
    """A machine calibration with made-up, plausible figures (2 cores, a shaped link at 95 %)."""
    base: dict[str, Any] = dict(
        machine=identity(), version=version(), created_at="2026-01-01T00:00:00+00:00",
        sizes_bytes=[4096, 1 << 20], loopback_us=[300.0, 3000.0], host_a_us=300.0, host_b_us_per_byte=2.6e-3,
        shaped_rates_mbit=[], shaped_sizes_bytes=[], efficiency_grid=[], shaped_us=[], link_efficiency=0.95,
        allgather_loopback_us=[200.0, 2000.0],
        allgather_line=(200.0, 1.8e-3), p2p_loopback_us=[100.0, 1000.0], p2p_line=(100.0, 0.9e-3),
        kernel_ms=1.3, corun_slowdown={"2": 1.3, "4": 2.4}, load_avg=0.1,
    )  # fmt: skip
    base.update(kw)
    return MachineCalibration(**base)


def fake_profile(_key: tuple[str, int, int], _wd: Path) -> dp.Profile:
    """The two-layer synthetic profile of the data-parallel tests (2 MiB of gradients per layer)."""
    from tests.transform.test_dataparallel import _profile_like

    g, params, layers = _profile_like()
    return dp.Profile(g, params, layers, 0, [0.1, 0.11, 0.1, 0.12], 0.12, 0.02, 0.03, 0.005)


def _wild_runner(seed: int, seen: list[dict[str, Any]], out: Path) -> dp.Runner:
    """A runner whose every in-run reading is random: the measured step, the host speed, the co-run
    step, the stragglers. It also reads the result file as it stands when it is first called."""
    rng = random.Random(seed)

    def run(c: RunConfig, row: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        if not seen:
            seen.append(json.loads(out.read_text()))
        return rng.uniform(1.0, 5000.0), {
            "host_speed": rng.uniform(0.1, 10.0), "corun_ms": rng.uniform(1.0, 900.0),
            "straggler_ms": rng.uniform(0.0, 500.0), "agree_round_us": rng.uniform(1.0, 1e5), "params_in_sync": True,
        }  # fmt: skip

    return run


def test_predictions_frozen_before_the_first_run_and_blind_to_it(tmp_path: Path) -> None:
    """Two validations of the same configurations with runners whose readings differ wildly: the same
    predictions, all on disk with their time before the first run started; every reading lands in
    ``diagnostics`` only."""
    configs = [RunConfig(model="mlp", rate_mbit=100.0), RunConfig(model="mlp", rate_mbit=30.0, delay_ms=4.0, mode="p3"),
               RunConfig(model="cnn", rate_mbit=500.0, mode="bytescheduler")]  # fmt: skip
    docs, seen = [], []
    for k in range(2):
        out = tmp_path / f"dp{k}.json"
        first: list[dict[str, Any]] = []
        docs.append(run_validation(configs, out, seed=1, mcal=fake_machine(), n_fixed=2, profiler=fake_profile,
                                   runner=_wild_runner(k, first, out), passes=3))  # fmt: skip
        seen.append(first[0])
    a, b = docs
    assert [r["predicted_ms"] for r in a["runs"]] == [r["predicted_ms"] for r in b["runs"]]
    assert [r["measured_ms"] for r in a["runs"]] != [r["measured_ms"] for r in b["runs"]]
    for doc, before in zip(docs, seen, strict=True):
        assert before["predictions_frozen_at"] is not None
        assert before["predictions_frozen_at"] <= before["runs_started_at"]
        assert [r["predicted_ms"] for r in before["runs"]] == [r["predicted_ms"] for r in doc["runs"]]
        assert all(r["measured_ms"] is None for r in before["runs"])
        assert doc["predictions_frozen_at"] <= doc["runs_started_at"]
        for r in doc["runs"]:
            assert len(r["measured_passes_ms"]) == 3 and len(r["diagnostics"]) == 3
            assert r["within"] in ("10%", "spread", False) and r["spread_pct"] >= 0
        assert [r["held_out"] for r in doc["runs"]] == [False, False, True]
        assert {"mean_abs_error_pct", "max_abs_error_pct", "within_10pct", "seed"} <= set(doc)


def test_prediction_uses_the_machine_model_not_a_measured_link() -> None:
    """A slower calibrated link or a larger co-run slowdown moves the prediction; nothing else can."""
    prof = fake_profile(("mlp", 1024, 4), Path("."))
    c = RunConfig(model="mlp", rate_mbit=100.0)
    base = dp.predict_ms(prof, c, fake_machine())["predicted_ms"]
    assert dp.predict_ms(prof, c, fake_machine(link_efficiency=0.5))["predicted_ms"] > base
    assert dp.predict_ms(prof, RunConfig(model="mlp", rate_mbit=50.0), fake_machine())["predicted_ms"] > base
    assert dp.predict_ms(prof, c, fake_machine())["predicted_ms"] == base  # deterministic


def test_draw_is_seed_reproducible_and_in_range() -> None:
    a, b = draw_configs(7, 12), draw_configs(7, 12)
    assert a == b and draw_configs(8, 12) != a
    for c in a:
        lo, hi = dp.RATE_RANGE_MBIT[c.model]
        assert c.rate_mbit is not None and lo <= c.rate_mbit <= hi
        assert c.delay_ms == 0.0 or dp.DELAY_RANGE_MS[0] <= c.delay_ms <= dp.DELAY_RANGE_MS[1]
        assert c.mode in ("ddp", "p3") and (c.model == "mlp" or (c.width, c.depth) == dp.MLP_DEFAULT)
        assert dp.BUCKET_RANGE_MB[0] <= c.bucket_cap_mb <= dp.BUCKET_RANGE_MB[1]
    fixed, n = dp.select_configs(True, 7)
    assert n == len(dp.QUICK) and fixed[n:] == draw_configs(7, 2)


def test_cli_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "dp", "--model", "resnet9000", "--json"]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["validate", "dp", "--rate", "0"]) == 2
    assert main(["validate", "dp", "--rate", "-5"]) == 2
    assert main(["validate", "dp", "--latency-us", "-1"]) == 2
    assert main(["validate", "dp", "--passes", "0"]) == 2
    assert "--passes 0" in capsys.readouterr().err
    assert main(["validate", "dp", "--seed", "-3"]) == 2
    assert "--seed -3" in capsys.readouterr().err
    with pytest.raises(UserError, match="only the mlp"):
        RunConfig(model="cnn", rate_mbit=10.0, width=64)
    for bad in ({"mode": "zero"}, {"credit": 0}, {"partition_bytes": 0}, {"bucket_cap_mb": 0.0}):
        with pytest.raises(UserError, match="validate dp"):
            RunConfig(model="mlp", rate_mbit=100.0, **bad)  # type: ignore[arg-type]


def test_cli_refuses_an_existing_result_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "dp.json"
    out.write_text("{}")
    assert main(["validate", "dp", "--quick", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--force" in err and len(err.strip().splitlines()) == 1
    assert out.read_text() == "{}"


def test_cli_refuses_another_machines_calibration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cal = tmp_path / "machine.json"
    cal.write_text(json.dumps(asdict(fake_machine(machine={"cpu": "another CPU", "cores": 96, "mem_gib": 512}))))
    assert main(["validate", "dp", "--quick", "--calibration", str(cal), "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert "another machine" in err and "--recalibrate" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r.json").exists()


def test_interrupt_keeps_the_measured_runs_marked_partial(tmp_path: Path) -> None:
    out = tmp_path / "dp.json"
    calls = []

    def runner(c: RunConfig, row: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        calls.append(c)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return 50.0, {}

    configs = [RunConfig(model="mlp", rate_mbit=100.0), RunConfig(model="cnn", rate_mbit=100.0)]
    with pytest.raises(KeyboardInterrupt):
        run_validation(configs, out, seed=3, mcal=fake_machine(), profiler=fake_profile, runner=runner, passes=3)
    doc = json.loads(out.read_text())
    assert doc["partial"] and "Ctrl-C" in doc["partial_reason"]
    assert [len(r["measured_passes_ms"]) for r in doc["runs"]] == [1, 1]


def test_straggler_wait_by_hand() -> None:
    assert dp.straggler_ms([[10.0] * 5, [10.0] * 5]) == 0.0
    assert dp.straggler_ms([[10.0, 20.0]]) == 0.0  # one rank waits for nobody
    # two ranks, each step 10 or 20 ms with equal odds: E[max] = 17.5, median 15
    assert dp.straggler_ms([[10.0, 20.0], [10.0, 20.0]], draws=20000) == pytest.approx(2.5, abs=0.15)


# --------------------------------------------------------------------------- real processes (marked)
def _our_processes() -> list[str]:
    """Live (non-zombie) children of this test process: any new one left after the harness is a leak."""
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
@pytest.mark.slow
@pytest.mark.skipif(netns_unavailable() is not None, reason=f"no netns: {netns_unavailable()}")
def test_validation_two_processes_shaped_link(tmp_path: Path) -> None:
    before = set(list_namespaces(f"trainsim-{os.getpid()}-"))
    qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    already = set(_our_processes())
    doc = run_validation([RunConfig(model="cnn", rate_mbit=50)], tmp_path / "dp.json", seed=0, mcal=fake_machine(),
                         passes=1, steps=2, warmup=2)  # fmt: skip
    (r,) = doc["runs"]
    assert r["diagnostics"][0]["where"] == "netns" and r["diagnostics"][0]["params_in_sync"]
    # 0.52 MB of gradients over 50 Mbit/s: at least ~83 ms per step on the wire alone
    assert 80 < r["measured_ms"] < 5000 and 80 < r["predicted_ms"] < 5000
    assert set(list_namespaces(f"trainsim-{os.getpid()}-")) == before
    assert subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout == qdiscs
    assert set(_our_processes()) <= already


@pytest.mark.multiproc
def test_profile_model_one_process(tmp_path: Path) -> None:
    """The profile: a one-rank traced run of a drawn MLP shape and the runtimes' own work alone."""
    prof = dp.profile_model(("mlp", 512, 3), tmp_path, steps=3)
    assert len(prof.plain_steps_ms) == 3 and prof.plain_ms > 0 and prof.traced_ms > 0
    assert len(prof.layers) == 3 and sum(p.numel for p in prof.params) == 256 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    assert 0.0 <= prof.ddp_finalize_ms <= prof.ddp_overhead_ms


@pytest.mark.multiproc
def test_runtime_overhead_one_process() -> None:
    """DDP's and the P3 runtime's own work per step, timed in a process group of one rank."""
    from trainsim.testbed.launch import run_json

    cfg = {"model": "mlp", "mode": "overhead", "steps": 3, "warmup": 2, "slice_bytes": 1 << 20}
    data = run_json(1, "trainsim.validate.dp_worker", cfg, net=None)[0]
    assert data["plain_ms"] > 0 and data["ddp_ms"] > 0 and data["p3_ms"] > 0
    assert data["overhead_ms"] >= 0.0  # the paired difference of their steps (``alternating_ms``)
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


@pytest.mark.multiproc
@pytest.mark.parametrize("rounds", [True, False])
def test_p3_runtime_told_its_mode_keeps_ranks_in_sync(rounds: bool) -> None:
    """The harness tells the runtime whether to agree by rounds or piggyback (from its prediction);
    either keeps the weights equal."""
    from trainsim.testbed.launch import run_json

    cfg = {"model": "cnn", "mode": "p3", "steps": 3, "warmup": 1, "slice_bytes": 65536, "agree_rounds": rounds}
    data = run_json(2, "trainsim.validate.dp_worker", cfg, net=None)[0]
    assert data["p3_agreement_rounds"] is rounds
    assert data["params_in_sync"] and len(data["step_ms"]) == 3


@pytest.mark.multiproc
def test_priority_runtimes_train_like_ddp() -> None:
    """P3 (rounds or piggyback) and ByteScheduler end with torch DDP's weights after the same steps on
    the same data: the same averaged gradient, the same SGD; DDP with small buckets too."""
    from trainsim.testbed.launch import run_json

    def final(mode: str, **extra: object) -> float:
        cfg = {"model": "cnn", "mode": mode, "steps": 3, "warmup": 1, **extra}
        data = run_json(2, "trainsim.validate.dp_worker", cfg, net=None)[0]
        assert data["params_in_sync"]
        return float(data["param_sum"])

    ddp = final("ddp")
    assert final("ddp", bucket_cap_mb=0.05) == pytest.approx(ddp, rel=1e-9)
    assert final("p3", slice_bytes=65536, agree_rounds=True) == pytest.approx(ddp, rel=1e-9)
    assert final("p3", slice_bytes=65536, agree_rounds=False) == pytest.approx(ddp, rel=1e-9)
    assert final("bytescheduler", partition_bytes=16384, credit=3) == pytest.approx(ddp, rel=1e-9)


@pytest.mark.multiproc
def test_p3_trace_from_every_rank_on_one_clock() -> None:
    """Traced, every rank prints its timeline with its reference time: the same slice all-reduce (a
    collective) overlaps in time on both ranks."""
    from trainsim.testbed.launch import run_json

    cfg = {"model": "cnn", "mode": "p3", "steps": 2, "warmup": 1, "slice_bytes": 65536, "agree_rounds": True,
           "trace": True}  # fmt: skip
    outs = run_json(2, "trainsim.validate.dp_worker", cfg, net=None)
    slices = []
    for d in outs:
        assert len(d["step_starts_ms"]) == 3 and d["p3_log"]
        slices.append([(d["t_ref_s"] * 1e3 + a, d["t_ref_s"] * 1e3 + b) for k, _, a, b in d["p3_log"] if k == "slice"])
    start = max(s[0][0] for s in slices)
    common = [(a, b) for a, b in slices[0] if a >= start]
    assert common
    for a0, b0 in common:  # both ranks inside the same collective at once
        assert any(max(a0, a1) <= min(b0, b1) + 0.5 for a1, b1 in slices[1])
