"""The compress-bench and secopa commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainsim.cli.main import main
from trainsim.compress.secopa import Plan


def test_compress_bench_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["compress-bench", "--sizes", "4K", "--algorithms", "onebit,topk", "--repeats", "1", "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    algos = [r["algorithm"] for r in data["rows"]]
    assert algos[:2] == ["torch fp16_compress_hook step", "torch powerSGD_hook step (rank 1)"]
    assert algos[2:] == ["onebit", "topk"]
    onebit = data["rows"][2]
    assert onebit["wire_bytes"] == 8 + 4096 // 8 and onebit["gbps"] > 0


def test_compress_bench_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["compress-bench", "--sizes", "1K", "--algorithms", "tbq", "--repeats", "1", "--no-baselines"])
        == 0
    )
    assert "tbq" in capsys.readouterr().out


def test_compress_bench_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compress-bench", "--algorithms", "nope"]) == 2
    assert "unknown compression algorithm 'nope'" in capsys.readouterr().err
    assert main(["compress-bench", "--sizes", "lots"]) == 2
    capsys.readouterr()
    for bad in ("0", "-3"):  # before: PowerSGD's orthogonalisation raised a bare AssertionError on size 0
        assert main(["compress-bench", "--sizes", bad, "--repeats", "1"]) == 2
        assert capsys.readouterr().err.strip().endswith("elements; expected at least 1")
    assert main(["compress-bench", "--sizes", "4K", "--repeats", "0"]) == 2


def test_secopa_writes_a_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grads = tmp_path / "grads.txt"
    grads.write_text("# name,numel\nfc1.weight,4000000\nfc1.bias,1000\n")
    out = tmp_path / "plan.yaml"
    argv = ["secopa", "--algorithm", "onebit", "--input", str(grads), "--nnodes", "4", "--bandwidth-mbps", "100",
            "--quick", "--out", str(out), "--json"]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["gradients"] == 2 and summary["plan"] == str(out)
    plan = Plan.load(out)
    assert (
        plan.decision("fc1.weight") is not None and plan.decision("fc1.weight")[0]
    )  # 16 MB at 100 Mbit/s: yes
    for g in plan.gradients.values():  # every decision follows the written costs
        assert g.compress == (g.orig_ms > g.comp_ms)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--algorithm", "nope", "--model", "mlp", "--nnodes", "2", "--bandwidth-mbps", "10"], "unknown compression"),
        (["--algorithm", "topk", "--option", "ratio=2", "--model", "mlp", "--nnodes", "2", "--bandwidth-mbps", "10"],
         "ratio=2"),
        (["--algorithm", "topk", "--model", "mlp", "--nnodes", "1", "--bandwidth-mbps", "10"], "at least 2"),
        (["--algorithm", "topk", "--nnodes", "2", "--bandwidth-mbps", "10"], "exactly one of --model"),
        (["--algorithm", "topk", "--model", "mlp", "--nnodes", "2"], "exactly one of --bandwidth-mbps"),
        (["--algorithm", "topk", "--option", "ratio", "--model", "mlp", "--nnodes", "2", "--bandwidth-mbps", "1"],
         "key=value"),
    ],
)  # fmt: skip
def test_secopa_bad_input(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["secopa", *argv]) == 2
    assert message in capsys.readouterr().err


def test_secopa_bad_input_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("fc.weight;12\n")
    argv = ["secopa", "--algorithm", "tbq", "--input", str(bad), "--nnodes", "2", "--bandwidth-mbps", "10"]
    assert main(argv) == 2
    assert "bad.txt:1" in capsys.readouterr().err
