"""``trainsim ooo``: the surface, JSON output, and bad input as exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainsim.capture.layerprofile import LayerProfile
from trainsim.cli.main import main


@pytest.fixture()
def profile(tmp_path: Path) -> Path:
    rows = [
        {
            "name": f"l{i}",
            "fwd_us": 100.0,
            "bwd_us": 180.0,
            "bwd_input_us": 100.0,
            "bwd_weight_us": 100.0,
            "opt_us": 10.0,
            "pack_us": 5.0,
            "unpack_us": 5.0,
            "param_bytes": 400_000,
            "out_bytes": 8000,
        }
        for i in range(5)
    ]
    prof = LayerProfile("synthetic", 1, 1, "test", {b: {"loss_us": 5.0, "layers": rows} for b in (32, 8, 4)})
    return prof.save(tmp_path / "p.json")


def test_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ooo", "--help"]) == 0
    out = capsys.readouterr().out
    for name in ("profile", "dp", "pipeline", "order", "multistream"):
        assert name in out


def test_json_outputs(profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ooo", "dp", str(profile), "--search", "--rate", "100", "--json"]) == 0
    dp = json.loads(capsys.readouterr().out)
    assert set(dp["predicted_ms"]) == {str(k) for k in range(6)} and 0 <= dp["k"] <= 5
    assert (
        main(
            [
                "ooo",
                "pipeline",
                str(profile),
                "--schedule",
                "Interleaved1F1B",
                "--stages-per-rank",
                "2",
                "--microbatches",
                "4",
                "--json",
            ]
        )
        == 0
    )
    pp = json.loads(capsys.readouterr().out)
    assert sum(pp["split"]) == 5 and len(pp["split"]) == 4 and pp["predicted_ms"] > 0
    assert main(["ooo", "order", "--schedule", "GPipe", "--microbatches", "2", "--json"]) == 0
    order = json.loads(capsys.readouterr().out)["order"]
    assert order["0"][:3] == ["0UNSHARD", "0F0", "0SEND_F0"]
    assert main(["ooo", "multistream", str(profile), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["speedup"] >= 1.0


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["dp", "{p}", "--k", "6"], "has 5 layers"),
        (
            ["pipeline", "{p}", "--schedule", "ZBVZeroBubble", "--stages-per-rank", "1"],
            "needs 2 stage(s) per rank",
        ),
        (
            [
                "pipeline",
                "{p}",
                "--schedule",
                "ZBVZeroBubble",
                "--stages-per-rank",
                "2",
                "--split",
                "2,0,2,1",
            ],
            "stage 1 would be empty",
        ),
        (
            ["pipeline", "{p}", "--schedule", "GPipe", "--microbatches", "5"],
            "does not divide the batch size 32",
        ),
        (["order", "--schedule", "Bogus"], "expected one of GPipe"),
        (["profile", "mlp", "--device", "cpu", "--out", "{p}.new"], "--device goes with --streams"),
        (["profile", "transformer", "--streams", "--out", "{p}.new"], "MultiheadAttention has no explicit"),
    ],
)
def test_bad_input(profile: Path, argv: list[str], msg: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ooo", *[a.replace("{p}", str(profile)) for a in argv]]) == 2
    assert msg in capsys.readouterr().err


def test_stream_profile_feeds_multistream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "streams.json"
    argv = ["ooo", "profile", "mlp", "--streams", "--device", "cpu", "--batch-sizes", "8,4", "--reps", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    prof = LayerProfile.load(out)
    assert sorted(prof.by_batch) == [4, 8] and "host_bwd_weight_us" in prof.table(4)[0]
    capsys.readouterr()
    assert main(["ooo", "multistream", str(out), "--batch-size", "4", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["single_stream_ms"] > 0 and len(res["schedule_map"]) == 4
