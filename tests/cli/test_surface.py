"""Pins the CLI surface: the command names and that each answers --help (torchtitan's frozen-options idea)."""

from __future__ import annotations

import pytest

from trainsim.cli.main import COMMANDS, main

EXPECTED = {
    "bench-sim", "calibrate", "compress-bench", "demo", "estimate", "goodput", "ooo", "plan", "profile", "replay", "scaleout",
    "secopa", "validate", "whatif",
}  # fmt: skip
EXPECTED_VALIDATE = {"calibrate", "compress", "dp", "multistream", "ooo-dp", "pipeline", "whatif"}
EXPECTED_WHATIF_FLAGS = {
    "--amp", "--fused-optimizer", "--batch-scale", "--scale", "--ooo-dp", "--pipeline", "--stages", "--microbatches", "--compress",
    "--plan", "--scheme", "--world", "--rate", "--json", "--timeline", "--force", "--device", "--from-device",
    "--dtype", "--network-cluster", "--from-cluster", "--network-bw-factor", "--network-latency-us",
}  # fmt: skip

EXPECTED_REPLAY_FLAGS = {"--json", "--timeline", "--no-straggler", "--force"}

# planner: model and cluster flags shared by estimate and plan, then each command's own
_PLAN_MODEL_FLAGS = {
    "--arch", "--attn-flops", "--capacity-factor", "--cluster", "--dense-layers", "--experts", "--ffn-hidden",
    "--flash-attention", "--global-batch", "--gpu", "--gpu-group", "--gpus", "--gpus-per-node", "--heads", "--hidden",
    "--json", "--kv-heads", "--layers", "--model", "--moe-ffn-hidden", "--nic-gbps", "--nvlink-gbps", "--seq",
    "--shared-experts", "--top-k", "--vocab", "--explain",
}  # fmt: skip
EXPECTED_ESTIMATE_FLAGS = _PLAN_MODEL_FLAGS | {
    "--comm-overlap", "--cp", "--cp-mode", "--ep", "--micro-batch", "--precision", "--no-reshard-after-forward",
    "--placement", "--pp", "--recompute", "--reshard-after-forward", "--schedule", "--sequence-parallel", "--shard-group", "--tp", "--virtual-stages", "--zero",
}  # fmt: skip
EXPECTED_PLAN_FLAGS = _PLAN_MODEL_FLAGS | {
    "--checkpoint-s", "--goodput", "--method", "--mtbf-gpu-hours", "--no-simulate", "--restart-s", "--simulate", "--top",
}  # fmt: skip


def test_command_set_is_pinned() -> None:
    assert set(COMMANDS) == EXPECTED, "a command was added, removed or renamed: update docs and this test on purpose"
    from trainsim.cli.validate import VALIDATE_COMMANDS

    assert set(VALIDATE_COMMANDS) == EXPECTED_VALIDATE


def test_whatif_flags_are_pinned() -> None:
    from trainsim.cli.core import whatif

    flags = {o for p in whatif.params for o in p.opts if o.startswith("--")}
    assert flags == EXPECTED_WHATIF_FLAGS


def test_replay_flags_are_pinned() -> None:
    from trainsim.cli.core import replay

    assert {o for p in replay.params for o in p.opts if o.startswith("--")} == EXPECTED_REPLAY_FLAGS


def test_planner_flags_are_pinned() -> None:
    from trainsim.cli.plan import estimate, plan

    for cmd, expected in ((estimate, EXPECTED_ESTIMATE_FLAGS), (plan, EXPECTED_PLAN_FLAGS)):
        assert {o for p in cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")} == expected


@pytest.mark.parametrize("name", sorted(EXPECTED_VALIDATE))
def test_every_validate_subcommand_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", name, "--help"]) == 0
    assert "--json" in capsys.readouterr().out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([name, "--help"]) == 0
    assert "Usage:" in capsys.readouterr().out


def test_renamed_flags_still_work_for_one_release() -> None:
    from trainsim.cli.main import RENAMED, rename_flags

    said: list[str] = []
    assert rename_flags(["ooo", "pipeline", "--ranks", "4", "--json"], said.append) == [
        "ooo", "pipeline", "--world", "4", "--json"]  # fmt: skip
    assert rename_flags(["bench-sim", "--repeat=2"], said.append) == ["bench-sim", "--repeats=2"]
    assert rename_flags(["replay", "--ranks", "4"], said.append) == ["replay", "--ranks", "4"]  # not renamed there
    assert len(said) == 2 and "--ranks is now --world" in said[0]
    for path, table in RENAMED.items():  # every new name exists on its command
        from trainsim.cli.main import COMMANDS, cli

        assert path[0] in COMMANDS
        cmd = cli.get_command(None, path[0])  # type: ignore[arg-type]
        for sub in path[1:]:
            cmd = cmd.get_command(None, sub)  # type: ignore[union-attr]
        flags = {o for p in cmd.params for o in p.opts}  # type: ignore[union-attr]
        assert {new for new, _ in table.values()} <= flags and not set(table) & flags
