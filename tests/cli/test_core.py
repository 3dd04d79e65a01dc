"""The CLI's JSON contract and exit codes for replay, whatif and bench-sim."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tracefactory import TraceMaker
from trainsim.cli.main import main


def _trace(tmp_path: Path) -> Path:
    t = TraceMaker()
    for s in range(3):
        base = s * 1000.0
        t.step(s, base, 900)
        t.cpu("aten::linear", base + 10, 100)
        t.launch(base + 20, 5, base + 25, 300, kernel="volta_sgemm_128x64")
        t.launch(base + 40, 5, base + 325, 100, kernel="elementwise_kernel")
        t.cpu("Optimizer.step#SGD.step", base + 200, 100, cat="user_annotation")
        for i in range(3):
            t.launch(base + 210 + 20 * i, 5, base + 430 + 10 * i, 5, kernel=f"sgd_kernel_{i}")
        t.runtime("cudaDeviceSynchronize", base + 400, 490)
    return t.write(tmp_path / "t.json.gz", gz=True)


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_replay_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["replay", str(_trace(tmp_path)), "--json", "--timeline", str(tmp_path / "sim.json")], capsys)
    assert code == 0
    doc = json.loads(out)
    assert {"steps", "measured_ms", "simulated_ms", "tasks"} <= doc.keys()
    assert all(ms >= 0 for ms in doc["kept_fixed_ms_per_step"].values())
    assert [s["step"] for s in doc["steps"]] == [0, 1, 2]
    for s in doc["steps"]:
        assert s["measured_ms"] == pytest.approx(0.9)
        assert s["simulated_ms"] == pytest.approx(0.9, rel=0.02)
    assert json.loads((tmp_path / "sim.json").read_text())["traceEvents"]


def test_whatif_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["whatif", str(_trace(tmp_path)), "--amp", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert {"steps", "measured_ms", "simulated_ms", "tasks", "baseline_ms", "whatif_ms"} <= doc.keys()
    assert doc["whatif_ms"] < doc["baseline_ms"]
    code, out, _ = _run(["whatif", str(_trace(tmp_path)), "--fused-optimizer", "--scale", "name:sgemm=0.5", "--json"],
                        capsys)  # fmt: skip
    assert code == 0 and json.loads(out)["whatif"] == ["fused-optimizer", "scale name:sgemm=0.5"]


def test_whatif_fused_gbps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["whatif", str(_trace(tmp_path)), "--fused-optimizer", "--fused-gbps", "100", "--json"], capsys)
    assert code == 0, err
    code, _, err = _run(["whatif", str(_trace(tmp_path)), "--fused-optimizer", "--fused-gbps", "nan"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--fused-gbps nan" in err


def test_bench_sim_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["bench-sim", "--tasks", "5000", "--json", "--repeats", "1"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["tasks"] >= 5000 and doc["tasks_per_s"] > 0 and {"build_s", "simulate_s"} <= doc.keys()


@pytest.mark.parametrize(
    "args",
    [
        ["replay", "does/not/exist.json"],
        ["whatif", "TRACE"],
        ["whatif", "TRACE", "--scale", "name:gemm"],
        ["whatif", "TRACE", "--scale", "name:nothing=2"],
        ["replay", "TRACE", "--timeline", "out.png"],
        ["bench-sim", "--tasks", "0"],
        ["bench-sim", "--seed", "-1"],  # numpy's ValueError traceback before
        ["no-such-command"],
        # before 2026-11-26 a zero rate was a ZeroDivisionError traceback, a negative one a task error
        ["whatif", "TRACE", "--pipeline", "GPipe", "--rate", "0"],
        ["whatif", "TRACE", "--ooo-dp", "search", "--rate", "-5"],
        ["whatif", "TRACE", "--compress", "onebit", "--rate", "0"],
        ["whatif", "TRACE", "--pipeline", "GPipe", "--stages", "0"],
        ["whatif", "TRACE", "--pipeline", "GPipe", "--microbatches", "0"],
        ["whatif", "TRACE", "--fused-optimizer", "--fused-gbps", "0"],
        ["whatif", "TRACE", "--fused-optimizer", "--fused-gbps", "-2"],
        ["whatif", "TRACE", "--fused-gbps", "5"],  # without --fused-optimizer
    ],
)
def test_bad_input_exit_code_2_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    trace = str(_trace(tmp_path))
    args = [trace if a == "TRACE" else a for a in args]
    code, _, err = _run(args, capsys)
    assert code == 2
    assert "Traceback" not in err and err.strip()


def test_whatif_scaled_to_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every task scaled to 0: the table says the speed-up is unbounded (it was a TypeError on None).

    A CPU trace: on a GPU one the launch latencies (edge lags, not tasks) would remain."""
    t = TraceMaker()
    t.step(0, 0, 100)
    t.cpu("aten::linear", 10, 50)
    code, out, err = _run(["whatif", str(t.write(tmp_path / "cpu.json")), "--scale", "name:=0"], capsys)
    assert code == 0, err
    assert "predicted speed-up: unbounded" in out


@pytest.mark.parametrize(
    ("args", "where"),
    [(["nope"], "trainsim"), (["whatif"], "trainsim whatif"), (["bench-sim", "--tasks", "0"], "trainsim bench-sim"),
     (["replay", "x.json", "--bogus"], "trainsim replay")],
)  # fmt: skip
def test_usage_errors_are_one_line(args: list[str], where: str, capsys: pytest.CaptureFixture[str]) -> None:
    """click's usage errors (missing argument, unknown option, value out of range) in one line too."""
    code, _, err = _run(args, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith(f"{where}: error: ")
    assert err.strip().endswith(f"(see {where} --help)")


def test_bad_trace_via_subprocess_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    p = subprocess.run([sys.executable, "-m", "trainsim", "replay", str(bad)], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and str(bad) in p.stderr and "Traceback" not in p.stderr
    assert bad.read_text() == "{oops"  # the user's file is untouched


def test_cli_import_does_not_import_torch() -> None:
    code = "import sys, trainsim.cli.main as m, trainsim.cli.core; m.main(['--help']); print('torch' in sys.modules)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.stdout.strip().endswith("False")


def test_whatif_ooo_and_pipeline_from_a_layer_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = tmp_path / "mlp.layers.json"
    assert main(["ooo", "profile", "mlp", "--batch-sizes", "32,8", "--reps", "1", "--out", str(prof)]) == 0
    capsys.readouterr()
    code, out, _ = _run(["whatif", str(prof), "--ooo-dp", "2", "--rate", "100", "--json"], capsys)
    assert code == 0 and set(json.loads(out)["predicted_ms"]) == {"0", "2"}
    code, out, _ = _run(["whatif", str(prof), "--pipeline", "GPipe", "--microbatches", "4", "--json"], capsys)
    assert code == 0 and json.loads(out)["predicted_ms"] > 0
    code, _, err = _run(["whatif", str(prof), "--ooo-dp", "two"], capsys)
    assert code == 2 and "--ooo-dp" in err


def test_whatif_compress_from_a_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainsim.capture.profile import ProfileConfig, profile

    trace = profile(ProfileConfig(model="mlp", steps=2, warmup=1, batch_size=8, out=str(tmp_path / "m.json.gz")))
    code, out, _ = _run(["whatif", str(trace), "--compress", "onebit", "--rate", "20", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    # 9.5 MB of fp32 gradients over 20 Mbit/s: 1-bit compression must win by a wide margin
    assert doc["compressed_ms"] < doc["plain_ddp_ms"] / 3
    code, _, err = _run(["whatif", str(trace), "--compress", "zip"], capsys)
    assert code == 2 and "unknown compression algorithm" in err
    # a SeCoPa plan sets the algorithm, the topology and the world size, as the hooks take them from it
    grads = tmp_path / "grads.txt"
    params = json.loads((tmp_path / "m.trainsim.json").read_text())["params"]
    grads.write_text("".join(f"{p['name']},{p['numel']}\n" for p in params))
    plan = tmp_path / "plan.yaml"
    assert main(["secopa", "--algorithm", "onebit", "--input", str(grads), "--nnodes", "2", "--bandwidth-mbps", "20",
                 "--quick", "--out", str(plan)]) == 0  # fmt: skip
    capsys.readouterr()
    code, out, _ = _run(["whatif", str(trace), "--compress", "onebit", "--plan", str(plan), "--rate", "20", "--json"],
                        capsys)  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    assert (doc["scheme"], doc["world"]) == ("ps", 2) and doc["compressed_ms"] < doc["plain_ddp_ms"] / 3
    for extra, what in ((["--compress", "topk"], "algorithm 'onebit'"), (["--compress", "onebit", "--world", "4"],
                        "world 2"), (["--compress", "onebit", "--scheme", "ring"], "scheme 'ps'")):  # fmt: skip
        code, _, err = _run(["whatif", str(trace), *extra, "--plan", str(plan)], capsys)
        assert code == 2 and f"the plan is for {what}" in err, err


@pytest.mark.parametrize(
    "args",
    [["replay", "TRACE", "--timeline", "OUT"], ["whatif", "TRACE", "--amp", "--timeline", "OUT"],
     ["calibrate", "--out", "OUT"], ["ooo", "profile", "mlp", "--out", "OUT"],
     ["secopa", "--algorithm", "onebit", "--model", "mlp", "--nnodes", "2", "--bandwidth-mbps", "100", "--out", "OUT"]],
)  # fmt: skip
def test_existing_outputs_are_not_overwritten(tmp_path: Path, args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A file the user has (an edited plan, a calibration, a timeline) is refused before any work, unless --force."""
    out = tmp_path / "mine.json"
    out.write_text("precious")
    argv = [str(_trace(tmp_path)) if a == "TRACE" else str(out) if a == "OUT" else a for a in args]
    t0 = time.perf_counter()
    code, _, err = _run(argv, capsys)
    assert code == 2 and "exists; pass --force" in err and str(out) in err
    assert out.read_text() == "precious" and time.perf_counter() - t0 < 5  # refused before profiling or measuring
    if args[0] in ("replay", "whatif"):  # with --force it is written
        code, _, err = _run([*argv, "--force"], capsys)
        assert code == 0, err
        assert json.loads(out.read_text())["traceEvents"]


def test_whatif_device_and_network(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The device and network what-ifs from the command line: a V100 trace's kernels on an H100 (compute-bound
    ones by the FP16 peak ratio), and a trace's collectives on twice the bandwidth."""
    trace = str(_trace(tmp_path))
    code, out, err = _run(["whatif", trace, "--device", "h100", "--from-device", "v100", "--dtype", "fp16", "--json"],
                          capsys)  # fmt: skip
    assert code == 0, err
    doc = json.loads(out)
    assert doc["whatif"] == ["device v100 -> h100-sxm (fp16)"] and doc["whatif_ms"] < doc["baseline_ms"]
    for args, message in ((["--device", "h100"], "--device and --from-device go together"),
                          (["--device", "tpu", "--from-device", "v100"], "unknown device 'tpu'"),
                          (["--network-bw-factor", "2"], "no communication tasks"),
                          (["--from-cluster", "c.toml"], "--from-cluster goes with --network-cluster"),
                          (["--network-bw-factor", "0"], "Invalid value for '--network-bw-factor'")):  # fmt: skip
        code, _, err = _run(["whatif", trace, *args], capsys)
        assert code == 2 and message in err, err
    t = TraceMaker()  # one rank's step with a gloo all-reduce of 4 MB on the CPU
    t.step(0, 0.0, 1000)
    t.cpu("aten::linear", 10, 100)
    t.cpu("gloo:all_reduce", 120, 800, **{"In msg nelems": 1_000_000, "dtype": "Float"})
    t.cpu("Optimizer.step#SGD.step", 930, 50, cat="user_annotation")
    comm = t.write(tmp_path / "comm.json")
    code, out, err = _run(["whatif", str(comm), "--network-bw", "2", "--network-latency-us", "10", "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["whatif"] == ["network x2 bandwidth, +10 us"] and doc["whatif_ms"] < doc["baseline_ms"]
    assert "--network-bw is now --network-bw-factor" in err  # the old name still works, with a warning
    fast = tmp_path / "fast.toml"
    fast.write_text('nodes = 2\ndevices_per_node = 1\ndevice = "this-cpu"\ninter_link = "eth-100g"\n')
    code, out, err = _run(["whatif", str(comm), "--network-cluster", str(fast), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["whatif"] == [f"network {fast}"]
