"""What-if pairs: seeded draws, predictions frozen before the second run, the batch what-if, the CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.tracefactory import TraceMaker
from trainsim.capture.kineto import read_trace
from trainsim.cli.main import main
from trainsim.errors import UserError
from trainsim.graph.build import build_graph
from trainsim.run.traced import TracedRunConfig
from trainsim.transform import whatifs
from trainsim.transform.primitives import select
from trainsim.validate import whatif as wi

B = 8  # the batch of the hand-made trace


def _dims(shapes: list[list[int]]) -> dict[str, Any]:
    return {"Input Dims": shapes}


def _batch_trace(tmp_path: Path) -> Path:
    """One step: input batch, a linear layer (addmm on the batch, a view of the weight), the
    optimizer's per-parameter add_ (parameter shapes only), and a collective."""
    t = TraceMaker()
    t.step(1, 0, 1000)
    t.cpu("aten::normal_", 10, 40, **_dims([[B, 16]]))
    t.cpu("layer:fc", 100, 400, cat="user_annotation")
    t.cpu("aten::linear", 110, 380, **_dims([[B, 16], [4, 16], [4]]))
    t.cpu("aten::t", 120, 10, **_dims([[4, 16]]))
    t.cpu("aten::addmm", 140, 300, **_dims([[4], [B, 16], [16, 4]]))
    t.cpu("Optimizer.step#SGD.step", 600, 200, cat="user_annotation")
    t.cpu("aten::add_", 620, 50, **_dims([[4, 16], [4, 16], []]))
    t.cpu("aten::add_", 700, 20, **_dims([[4], [4], []]))
    t.cpu("gloo:all_reduce", 850, 100, **_dims([[B * 10]]))
    path = t.write(tmp_path / "batch.json")
    side = {"model": "fake", "batch_size": B, "layers": ["fc"],
            "params": [{"name": "fc.weight", "shape": [4, 16]}, {"name": "fc.bias", "shape": [4]}]}  # fmt: skip
    (tmp_path / "batch.trainsim.json").write_text(json.dumps(side))
    return path


def test_batch_work_is_what_takes_the_batch(tmp_path: Path) -> None:
    tr = read_trace(_batch_trace(tmp_path))
    g = build_graph(tr)
    work = whatifs.batch_work(g, tr, B, [[4, 16], [4]])
    names = sorted({g.task_name(int(t)) for t in np.flatnonzero(work)})
    # the input batch, the GEMM and the pieces of linear's own time; not the view, the optimizer or comm
    assert names == ["aten::addmm", "aten::linear", "aten::normal_"]


def test_batch_scale_follows_the_op_cost_model(tmp_path: Path) -> None:
    from tests.transform.test_opcost import fake_table

    tr, batch, shapes = whatifs.batch_context(_batch_trace(tmp_path))
    assert batch == B and shapes == [[4, 16], [4]]
    g = build_graph(tr)
    g2 = whatifs.batch_scale(g, 2.0, trace=tr, batch_size=batch, param_shapes=shapes, cost=fake_table())
    mm, lin, opt = select(g, name="addmm"), select(g, name="aten::linear"), select(g, name="add_")
    # the fake GEMM time grows as sqrt(rows): twice the batch is sqrt(2) times the traced addmm
    assert g2.dur_us[mm].sum() == pytest.approx(np.sqrt(2) * g.dur_us[mm].sum())
    assert g2.dur_us[lin].sum() == pytest.approx(2 * g.dur_us[lin].sum())  # no model: linear
    assert g2.dur_us[opt].sum() == pytest.approx(g.dur_us[opt].sum())  # per-parameter work: unchanged
    with pytest.raises(UserError, match="no task does batch work"):  # wrong batch size: nothing matches
        whatifs.batch_scale(g, 2.0, trace=tr, batch_size=B + 1, param_shapes=shapes, cost=fake_table())
    with pytest.raises(UserError, match="factor"):
        whatifs.batch_scale(g, 0.0, trace=tr, batch_size=batch, param_shapes=shapes, cost=fake_table())


def test_batch_scale_keeps_per_element_work_linear(tmp_path: Path) -> None:
    """A pooling op traced 20x slower than the table's cost of its bytes is work per element: at 3x the
    batch it takes 3x its time plus the table's extra on its memory share, not the table's cliff."""
    from tests.transform.test_opcost import cliff_table

    t = TraceMaker()
    t.step(1, 0, 2000)
    t.cpu("aten::max_pool2d_with_indices", 10, 1280, **_dims([[B, 2**10], [], []]))  # 32 KiB in: 64 µs of bytes
    t.cpu("aten::relu", 1400, 64, **_dims([[B, 2**10]]))  # at the table's cost
    path = t.write(tmp_path / "pool.json")
    (tmp_path / "pool.trainsim.json").write_text(json.dumps({"model": "fake", "batch_size": B, "params": []}))
    tr, batch, shapes = whatifs.batch_context(path)
    g = build_graph(tr)
    g2 = whatifs.batch_scale(g, 3.0, trace=tr, batch_size=batch, param_shapes=shapes, cost=cliff_table())
    cost = cliff_table()
    table = cost.time_us("elementwise", [3 * 2**16]) / cost.time_us("elementwise", [2**16])
    pool, relu = select(g, name="max_pool2d"), select(g, name="aten::relu")
    assert g2.dur_us[relu].sum() == pytest.approx(table * g.dur_us[relu].sum())
    assert g2.dur_us[pool].sum() == pytest.approx((0.05 * table + 0.95 * 3) * g.dur_us[pool].sum())
    assert g2.dur_us[pool].sum() < 3.5 * g.dur_us[pool].sum() < table * g.dur_us[pool].sum()


def test_whatif_batch_scale_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.transform.test_opcost import fake_table
    from trainsim.transform import opcost

    monkeypatch.setattr(opcost, "load_or_calibrate", lambda *a, **k: fake_table())  # no 20 s calibration here
    trace = _batch_trace(tmp_path)
    assert main(["whatif", str(trace), "--batch-scale", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["whatif"][0].startswith("batch x3") and out["whatif_ms"] > out["baseline_ms"]
    (tmp_path / "batch.trainsim.json").unlink()
    assert main(["whatif", str(trace), "--batch-scale", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "sidecar" in err and len(err.splitlines()) == 1
    assert main(["whatif", str(trace), "--batch-scale", "0"]) == 2


def test_draws_repeat_with_the_seed_and_stay_in_range() -> None:
    a, b = wi.draw_pairs(123, quick=False), wi.draw_pairs(123, quick=False)
    assert a == b and all(p.drawn for p in a)
    assert wi.draw_pairs(124, quick=False) != a
    for seed in range(40):
        for p in wi.draw_pairs(seed, quick=True):
            if p.kind == "network":
                assert p.first.rate_mbit is not None and p.second.rate_mbit is not None
                ratio = p.second.rate_mbit / p.first.rate_mbit
                assert wi.RATE_RANGE[0] * 0.99 <= ratio <= wi.RATE_RANGE[1] * 1.01
            assert list(p.change()) == {"network": ["rate_mbit"], "fused-adam": ["optimizer"],
                                        "batch": ["batch_size"]}[p.kind]  # fmt: skip


def test_predictions_are_on_disk_before_any_second_run(tmp_path: Path) -> None:
    pairs = wi.draw_pairs(5, quick=True)
    out = tmp_path / "res.json"
    calls: list[str] = []
    seconds = {id(p.second): i for i, p in enumerate(pairs)}

    def runner(cfg: TracedRunConfig, folder: Path) -> dict[str, Any]:
        i = next((j for s, j in seconds.items() if s == id(cfg)), None)
        if i is not None:  # a second run: its prediction, and every other one, must already be written
            doc = json.loads(out.read_text())
            assert all(r["predicted_ms"] is not None and r["predicted_at"] for r in doc["runs"])
            assert doc["predictions_frozen_at"] <= doc["runs_started_at"]
            assert len(doc["runs"]) == len(pairs)
            calls.append("second")
            return {"rank_step_ms": [[12.0, 10.0, 11.0]], "traces": []}
        calls.append("first")
        return {"rank_step_ms": [[9.0, 10.0, 11.0], [10.0, 10.0, 10.5]], "traces": []}

    def predictor(pair: wi.Pair, first: dict[str, Any]) -> dict[str, Any]:
        assert not out.exists() or len(json.loads(out.read_text())["runs"]) == 0
        return {"predicted_ms": 12.1, "simulated_ms": 14.0, "first_measured_ms": max(wi.rank_median_ms(first))}

    doc = wi.run_pairs(pairs, out, seed=5, runner=runner, predictor=predictor, passes=2, workdir=tmp_path / "w")
    n = len(pairs)
    assert calls[:n] == ["first"] * n and calls.count("second") == 2 * n and calls.count("first") == n
    on_disk = json.loads(out.read_text())
    assert on_disk == json.loads(json.dumps(doc)) and on_disk["seed"] == 5
    r = on_disk["runs"][0]
    assert r["measured_ms"] == 11.0 and r["error_pct"] == pytest.approx(10.0) and r["measured_passes_ms"] == [11.0, 11.0]
    assert r["predicted_at"] <= r["measured_at"]
    assert on_disk["mean_abs_error_pct"] == pytest.approx(10.0) and on_disk["max_abs_error_pct"] == pytest.approx(10.0)
    assert r["held_out"] is pairs[0].drawn and r["within"] == "10%" and r["spread_pct"] == 0.0
    assert not on_disk["partial"] and on_disk["seed"] == 5


@pytest.mark.parametrize(
    ("kind", "replayed", "whatif", "expected"),
    [
        # the traced steps replay 20 ms for a timed 15 ms: the profiler's overhead; the what-if halves them
        ("fused-adam", [20.0, 21.0, 19.0], [10.0, 10.5, 9.5], 7.5),  # its work is traced work: 15 x 0.5
        ("batch", [20.0, 20.0, 20.0], [50.0, 50.0, 50.0], 37.5),  # 15 x 2.5
        ("network", [200.0, 210.0], [100.0, 108.0], 79.0),  # link time is not lengthened: 180 - 101
    ],
)
def test_the_simulated_change_is_anchored_on_the_timed_step(
    kind: str, replayed: list[float], whatif: list[float], expected: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    import trainsim.simulate.engine as engine

    monkeypatch.setattr(wi, "whatif_graph", lambda pair, trace, **kw: ("replay", "whatif"))
    steps = {"replay": np.array(replayed), "whatif": np.array(whatif)}
    monkeypatch.setattr(engine, "simulate", lambda g: SimpleNamespace(step_ms=steps[g]))
    pair = next(p for p in wi.fixed_pairs(quick=True) if p.kind == kind)
    base = 180.0 if kind == "network" else 15.0
    pred = wi.predict_pair(pair, {"rank_step_ms": [[base - 1, base, base + 1]], "traces": ["rank0.json.gz"]})
    assert pred["predicted_ms"] == pytest.approx(expected) and pred["anchor"] == wi.ANCHOR[kind]
    assert pred["simulated_ms"] == pytest.approx(float(np.median(whatif)))


def _machine() -> Any:
    """A machine calibration by hand: host line 100 us + 0.001 us/B per 2-rank all-reduce, links that
    deliver 90 % of their rate at every size, sends 50 us + 0.0005 us/B."""
    from trainsim.testbed import machine as mc

    return mc.MachineCalibration(
        machine=mc.identity(), version=mc.version(), created_at="2026-11-29T00:00:00+00:00", sizes_bytes=[1, 2],
        loopback_us=[100.0, 100.0], host_a_us=100.0, host_b_us_per_byte=0.001,
        shaped_rates_mbit=[], shaped_sizes_bytes=[], efficiency_grid=[], shaped_us=[], link_efficiency=0.9,
        allgather_loopback_us=[], allgather_line=(80.0, 0.002), p2p_loopback_us=[], p2p_line=(50.0, 0.0005),
        kernel_ms=0.4, corun_slowdown={"2": 1.05, "4": 2.1}, load_avg=0.1,
    )  # fmt: skip


def _ar_steps(durs: list[float], size: int) -> Any:
    """One rank's steps: 20 ms of computation, then an all-reduce of ``size`` bytes lasting ``durs[i]``."""
    from trainsim.graph.ir import GraphBuilder, ResourceKind, TaskKind

    b = GraphBuilder()
    cpu, ch = b.resource("cpu", ResourceKind.CPU_THREAD), b.resource("comm", ResourceKind.COMM_CHANNEL)
    prev = None
    for i, d in enumerate(durs):
        x = b.task("forward_backward", TaskKind.CPU, cpu, 20_000.0, step=i, deps=[prev] if prev is not None else [])
        prev = b.task("gloo:all_reduce", TaskKind.COMM, ch, d, step=i, deps=[x], size_bytes=size)
    return b.build()


def test_network_pair_prices_the_transfer_with_the_machine_calibration() -> None:
    """4 ranks, 1 MB, 400 -> 800 Mbit/s. The calibrated model: host 3 x 100 + 0.001 x 1.5e6 = 1,800 us (the
    ring's 6 steps and 1.5 MB per rank), wire 1.5e6 x 8 / (400 x 0.9) = 33,333 us, 35,133 in all; at 800
    Mbit/s 1,800 + 16,667 = 18,467 us. An all-reduce traced at the model's time becomes 18,467; one
    traced 10 ms longer (the host busy, a slow peer) keeps those 10 ms; a faster one scales by the
    model's ratio. The old rule fitted the median all-reduce's rate on the trace and halved it all."""
    from trainsim.graph.ir import TaskKind

    model, ratio = 35_133.333, 18_466.667 / 35_133.333
    g = _ar_steps([model, model + 10_000.0, 30_000.0], 1_000_000)
    first = TracedRunConfig(model="mlp", world=4, rate_mbit=400.0)
    pair = wi.Pair(kind="network", first=first, second=TracedRunConfig(model="mlp", world=4, rate_mbit=800.0))
    comm = g.kind == TaskKind.COMM
    g2 = wi.network_change(g, pair, _machine())
    assert g2.dur_us[comm].tolist() == pytest.approx([18_466.667, 28_466.667, 30_000.0 * ratio], rel=1e-5)
    assert g2.dur_us[~comm].tolist() == g.dur_us[~comm].tolist()
    # without a calibration, the trace's own fit: every all-reduce over its period's median rate, halved
    g3 = wi.network_change(g, pair)
    assert g3.dur_us[comm].tolist() == pytest.approx([model / 2, model / 2 + 10_000.0, 15_000.0], rel=1e-5)


def test_host_links_price_ddp_buffer_broadcasts() -> None:
    """A broadcast (DDP's buffers) is ceil(log2 p) sends: 2 ranks one (50 + 0.0005 x 1000 us on loopback), 4
    ranks two; an all-reduce is the calibration's."""
    cal = _machine()
    links = wi.HostLinks(cal.cost())
    assert links.time_us("broadcast", 1000, 2) == pytest.approx(50.5)
    assert links.time_us("broadcast", 1000, 4) == pytest.approx(101.0)
    assert links.time_us("allreduce", 1000, 4) == pytest.approx(cal.allreduce_us(1000, world=4))


@pytest.mark.parametrize(
    "argv",
    [["--seed", "-1"], ["--pair", "nope"], ["--passes", "0"], ["--seed", "x"]],
)
def test_bad_input_is_one_line_exit_2(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "whatif", "--out", str(tmp_path / "r.json"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error" in err
    assert not (tmp_path / "r.json").exists()


def test_existing_out_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "r.json").write_text("{}")
    assert main(["validate", "whatif", "--out", str(tmp_path / "r.json")]) == 2
    assert "--force" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.multiproc
def test_real_fused_adam_pair(tmp_path: Path) -> None:
    first = TracedRunConfig(model="mlp", world=1, width=256, optimizer="adam-loop", warmup=2, steps=5, profiled=3)
    pair = wi.Pair(kind="fused-adam", first=first, second=TracedRunConfig(**{**_asdict(first), "optimizer": "adam-fused"}))
    doc = wi.run_pairs([pair], tmp_path / "r.json", seed=0, passes=1, workdir=tmp_path / "w")
    r = doc["runs"][0]
    assert r["predicted_ms"] > 0 and r["measured_ms"] > 0 and r["predicted_at"] <= r["measured_at"]
    assert r["predicted_ms"] < r["first_measured_ms"]  # fusing removes work


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.netns
def test_real_network_pair(tmp_path: Path) -> None:
    from trainsim.testbed.netns import netns_unavailable

    if netns_unavailable():
        pytest.skip(str(netns_unavailable()))
    first = TracedRunConfig(model="mlp", world=2, width=512, rate_mbit=200.0, warmup=2, steps=4, profiled=2)
    pair = wi.Pair(kind="network", first=first, second=TracedRunConfig(**{**_asdict(first), "rate_mbit": 400.0}))
    doc = wi.run_pairs([pair], tmp_path / "r.json", seed=0, passes=1, workdir=tmp_path / "w")
    r = doc["runs"][0]
    assert r["measured_ms"] < r["first_measured_ms"]  # the real run got faster on the faster link
    assert abs(r["error_pct"]) < 50


def _asdict(cfg: TracedRunConfig) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(cfg)


def _gpu_bench() -> Any:
    import importlib.util

    path = Path(__file__).parents[2] / "benchmarks" / "gpu_whatif.py"
    spec = importlib.util.spec_from_file_location("gpu_whatif", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_gpu_benchmark_skips_without_a_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    bench = _gpu_bench()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "gpu.json"
    assert bench.main(["--out", str(out)]) == 0
    assert "skipped: no CUDA device" in capsys.readouterr().out and not out.exists()
    assert [w for w, _, _ in bench.pairs(quick=False)] == ["amp", "fused_optimizer"] * 2


def test_gpu_benchmark_result_writer(tmp_path: Path) -> None:
    """The writer with a made-up result (nothing measured): errors and summary from the rows."""
    bench = _gpu_bench()
    doc = {"gpu": "fake", "runs": [{"predicted_ms": 9.0, "measured_ms": 10.0}, {"predicted_ms": 5.0, "measured_ms": None}]}
    bench.write_result(tmp_path / "g.json", doc)
    back = json.loads((tmp_path / "g.json").read_text())
    assert back["runs"][0]["error_pct"] == -10.0 and "error_pct" not in back["runs"][1]
    assert back["mean_abs_error_pct"] == 10.0 and back["max_abs_error_pct"] == 10.0
