"""Bad input to the cluster commands: one line on stderr, exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainsim.cli.main import main


def _trace(tmp_path: Path, params: list[dict[str, object]]) -> Path:
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": []}')
    (tmp_path / "t.trainsim.json").write_text(json.dumps({"model": "x", "layers": ["a"], "params": params}))
    return trace


def _cluster(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(body)
    return p


@pytest.mark.parametrize(
    ("body", "extra", "match"),
    [
        ('nodes = 2\ndevice = "gpu9000"\n', [], "unknown device"),
        ('nodes = 2\ninter_link = "eth-3g"\n', [], "unknown link"),
        ("nodes = 2\ninter_link = { bw_gbyte_s = 0 }\n", [], "bandwidth"),
        ("nodes = 2\ninter_link = { bw_gbyte_s = -1 }\n", [], "bandwidth"),
        ("nodes = 2\ndevices_per_node = 2\n", ["--world", "5"], "5 ranks requested"),
    ],
)
def test_scaleout_bad_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], body: str, extra: list[str], match: str
) -> None:
    trace = _trace(tmp_path, [{"name": "a.w", "layer": "a", "numel": 4, "bytes": 16}])
    code = main(["scaleout", str(trace), "--cluster", str(_cluster(tmp_path, body)), *extra])
    err = capsys.readouterr().err
    assert code == 2 and match in err and err.count("\n") == 1


def test_scaleout_trace_without_params(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _trace(tmp_path, [])
    assert main(["scaleout", str(trace), "--cluster", str(_cluster(tmp_path, "nodes = 2\n"))]) == 2
    assert "no parameters" in capsys.readouterr().err


def test_calibrate_bad_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--rate", "0"]) == 2
    assert main(["calibrate", "--latency-us", "-2"]) == 2
    assert main(["calibrate", "--max-bytes", "lots"]) == 2
    assert main(["calibrate", "--launches", "3", "--launch-seconds", "0"]) == 2
    assert main(["calibrate", "--floor-launches", "-1"]) == 2
    assert "expected" in capsys.readouterr().err


def test_scaleout_on_a_real_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainsim.capture.profile import ProfileConfig, profile

    trace = profile(ProfileConfig(model="cnn", steps=3, warmup=1, out=str(tmp_path / "cnn.json.gz")))
    body = 'nodes = 2\ndevice = "this-cpu"\ninter_link = "eth-1g"\n'
    assert main(["scaleout", str(trace), "--cluster", str(_cluster(tmp_path, body)), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # 0.52 MB of gradients over 1 Gbit/s adds at least ~4 ms to a step
    assert out["ranks"] == 2 and out["predicted_ms"] > out["single_ms"] + 3


def test_scaleout_gloo_runs_the_buckets_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainsim.capture.profile import ProfileConfig, profile

    # the mlp has two buckets (4.24 and 5.25 MB); the second is ready long before the first is sent
    trace = profile(ProfileConfig(model="mlp", steps=3, warmup=1, out=str(tmp_path / "mlp.json.gz")))
    body = 'nodes = 2\ndevice = "this-cpu"\ninter_link = "eth-1g"\n'
    got = {}
    for backend in ("nccl", "gloo"):
        assert main(["scaleout", str(trace), "--cluster", str(_cluster(tmp_path, body)), "--backend", backend, "--json"]) == 0
        got[backend] = json.loads(capsys.readouterr().out)
    assert got["gloo"]["backend"] == "gloo"
    # the chain ends as one all-reduce of both: one ring's latency less than two in a row
    assert got["gloo"]["predicted_ms"] < got["nccl"]["predicted_ms"]
    assert main(["scaleout", str(trace), "--cluster", str(_cluster(tmp_path, body)), "--backend", "mpi"]) == 2


def test_scaleout_bytescheduler_partitions_and_credit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--partition-mb`` and ``--credit`` reach the model: more partitions in flight hide more of each
    one's start-up latency; a credit of 0 is refused."""
    from trainsim.capture.profile import ProfileConfig, profile

    trace = profile(ProfileConfig(model="mlp", steps=3, warmup=1, out=str(tmp_path / "mlp.json.gz")))
    body = 'nodes = 2\ndevice = "this-cpu"\ninter_link = "eth-1g"\n'
    cl = str(_cluster(tmp_path, body))

    def step(*extra: str) -> float:
        assert main(["scaleout", str(trace), "--cluster", cl, "--mode", "bytescheduler", "--partition-mb", "0.25",
                     *extra, "--json"]) == 0  # fmt: skip
        return float(json.loads(capsys.readouterr().out)["predicted_ms"])

    assert step("--credit", "1") > step("--credit", "4")
    assert main(["scaleout", str(trace), "--cluster", cl, "--mode", "bytescheduler", "--credit", "0"]) == 2
    assert "--credit" in capsys.readouterr().err
