"""``trainsim validate multistream`` on the CPU: the JSON shape, and bad input refused before any run.

The CPU run is real (profile, prediction, measured steps of the two-stream runner); with no second
stream on a CPU nothing overlaps, so only the shape and the plumbing are asserted here, not the error.
The GPU figures are in docs/benchmarks/ooo.md (``benchmarks/ooo_multistream_gpu.py``).
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from trainsim.cli.main import main


def test_quick_json_on_the_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "multistream", "--quick", "--json", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    # the progress goes to stderr with --json too (the harnesses were silent for minutes), stdout holds the JSON
    assert "measured" in captured.err and "s " in captured.err
    assert out["device"] == "cpu"
    assert [r["config"]["mode"] for r in out["runs"]] == ["one stream", "two streams, BWD i", "two streams, searched"]
    for r in out["runs"]:
        assert r["predicted_ms"] > 0 and r["measured_ms"] > 0
        assert r["error_pct"] == pytest.approx(100 * (r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"], abs=0.1)
    assert out["max_abs_error_pct"] >= out["mean_abs_error_pct"] >= 0
    (case,) = out["cases"]
    assert "profile" not in case and case["host_ms"] > 0


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--batch", "0"], "--batch 0; expected >= 1"),
        (["--rounds", "0"], "--rounds 0; expected >= 1"),
        (["--model", "cnn", "--width", "64"], "with --model mlp"),
    ],
)
def test_bad_input(argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "multistream", *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_cuda_asked_for_without_one(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assert main(["validate", "multistream", "--device", "cuda", "--quick"]) == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err


def test_progress_log_stamps_the_seconds() -> None:
    from io import StringIO

    from rich.console import Console

    from trainsim.validate import progress_log

    buf = StringIO()
    log = progress_log(Console(file=buf, no_color=True, width=200))
    log("profiling mlp")
    line = buf.getvalue().strip()
    assert line.endswith("s profiling mlp") and 0 <= float(line.split("s ", 1)[0]) < 5
