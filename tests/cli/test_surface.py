"""Pins the CLI surface: the command names and that each answers --help (torchtitan's frozen-options idea)."""

from __future__ import annotations

from typing import Any

import pytest

from trainsim.cli.main import COMMANDS, main

EXPECTED = {
    "bench-sim", "calibrate", "compress-bench", "demo", "estimate", "goodput", "ooo", "plan", "profile", "replay", "scaleout",
    "secopa", "validate", "whatif",
}  # fmt: skip
EXPECTED_VALIDATE = {"calibrate", "compress", "dp", "multistream", "ooo-dp", "pipeline", "whatif"}
EXPECTED_WHATIF_FLAGS = {
    "--amp", "--fused-optimizer", "--fused-gbps", "--batch-scale", "--scale", "--ooo-dp", "--pipeline", "--stages", "--microbatches", "--compress",
    "--plan", "--scheme", "--world", "--rate", "--json", "--timeline", "--force", "--device", "--from-device",
    "--dtype", "--network-cluster", "--from-cluster", "--network-bw-factor", "--network-latency-us",
}  # fmt: skip

EXPECTED_REPLAY_FLAGS = {"--json", "--timeline", "--no-straggler", "--force"}

# planner: model and cluster flags shared by estimate and plan, then each command's own
_PLAN_MODEL_FLAGS = {
    "--arch", "--attn-flops", "--capacity-factor", "--cluster", "--dense-layers", "--experts", "--ffn-hidden",
    "--flash-attention", "--global-batch", "--gpu", "--gpu-group", "--gpus", "--gpus-per-node", "--heads", "--hidden",
    "--json", "--kv-heads", "--layers", "--model", "--moe-ffn-hidden", "--nic-gbps", "--nvlink-gbps", "--seq",
    "--shared-experts", "--top-k", "--vocab", "--explain", "--rail-optimized", "--no-rail-optimized",
    "--oversubscription", "--leaf-nodes", "--expert-groups", "--group-top-k", "--ep-dispatch", "--ep-overlap",
}  # fmt: skip
EXPECTED_ESTIMATE_FLAGS = _PLAN_MODEL_FLAGS | {
    "--attn-kernel", "--comm-overlap", "--kernels", "--cp", "--cp-mode", "--ep", "--micro-batch", "--precision", "--no-reshard-after-forward",
    "--placement", "--pp", "--recompute", "--reshard-after-forward", "--schedule", "--sequence-parallel", "--shard-group", "--tp", "--virtual-stages", "--zero",
}  # fmt: skip
EXPECTED_PLAN_FLAGS = _PLAN_MODEL_FLAGS | {
    "--checkpoint-s", "--goodput", "--method", "--mtbf-gpu-hours", "--no-simulate", "--restart-s", "--simulate", "--top",
}  # fmt: skip


EVERY_COMMAND_FLAGS: dict[str, set[str]] = {
    "bench-sim": {"--json", "--repeats", "--seed", "--tasks"},
    "calibrate": {
        "--big-launches", "--floor-launches", "--force", "--json", "--latency-us", "--launch-seconds",
        "--launches", "--max-bytes", "--min-bytes", "--out", "--pin", "--rate", "--realtime", "--reps",
        "--world"
    },
    "compress-bench": {"--algorithms", "--json", "--no-baselines", "--repeats", "--sizes"},
    "demo": {"--model", "--out-dir"},
    "estimate": {
        "--arch", "--attn-flops", "--attn-kernel", "--capacity-factor", "--cluster", "--comm-overlap", "--cp", "--cp-mode",
        "--dense-layers", "--ep", "--experts", "--explain", "--ffn-hidden", "--flash-attention", "--kernels",
        "--global-batch", "--gpu", "--gpu-group", "--gpus", "--gpus-per-node", "--heads", "--hidden", "--json",
        "--kv-heads", "--layers", "--leaf-nodes", "--micro-batch", "--model", "--moe-ffn-hidden", "--nic-gbps",
        "--nvlink-gbps", "--oversubscription", "--rail-optimized", "--placement", "--pp", "--precision", "--recompute", "--reshard-after-forward", "--schedule", "--seq",
        "--sequence-parallel", "--shard-group", "--shared-experts", "--top-k", "--tp", "--virtual-stages",
        "--vocab", "--zero", "--expert-groups", "--group-top-k", "--ep-dispatch", "--ep-overlap"
    },
    "goodput": {
        "--checkpoint-s", "--gpus", "--gpus-per-node", "--interval-s", "--json", "--mtbf-gpu-hours",
        "--mtbf-link-hours", "--mtbf-node-hours", "--repair-s", "--replace-s", "--restart-s", "--restore-s",
        "--samples", "--seed", "--spare-nodes", "--step-s", "--steps"
    },
    "ooo dp": {"--batch-size", "--json", "--k", "--latency-us", "--rate", "--search"},
    "ooo multistream": {"--batch-size", "--json"},
    "ooo order": {"--json", "--microbatches", "--schedule", "--stages-per-rank", "--world"},
    "ooo pipeline": {
        "--batch-size", "--json", "--latency-us", "--microbatches", "--rate", "--schedule", "--split",
        "--stages-per-rank", "--world"
    },
    "ooo profile": {"--batch-sizes", "--blocks", "--device", "--force", "--out", "--reps", "--streams"},
    "plan": {
        "--arch", "--attn-flops", "--capacity-factor", "--checkpoint-s", "--cluster", "--dense-layers",
        "--experts", "--explain", "--ffn-hidden", "--flash-attention", "--global-batch", "--goodput", "--gpu",
        "--gpu-group", "--gpus", "--gpus-per-node", "--heads", "--hidden", "--json", "--kv-heads", "--layers",
        "--method", "--model", "--moe-ffn-hidden", "--mtbf-gpu-hours", "--nic-gbps", "--nvlink-gbps",
        "--restart-s", "--seq", "--shared-experts", "--simulate", "--top", "--top-k", "--vocab", "--leaf-nodes",
        "--oversubscription", "--rail-optimized", "--expert-groups", "--group-top-k", "--ep-dispatch", "--ep-overlap"
    },
    "profile": {"--batch-size", "--force", "--model", "--optimizer", "--out", "--steps", "--threads", "--warmup"},
    "replay": {"--force", "--json", "--no-straggler", "--timeline"},
    "scaleout": {
        "--backend", "--bucket-mb", "--calibration", "--cluster", "--credit", "--json", "--mode",
        "--partition-mb", "--slice-kb", "--world"
    },
    "secopa": {
        "--algorithm", "--bandwidth-mbps", "--force", "--input", "--json", "--latency-ms", "--measure-comm",
        "--model", "--nnodes", "--option", "--out", "--quick", "--sidecar", "--topology"
    },
    "validate calibrate": {"--file", "--json", "--recalibrate"},
    "validate compress": {
        "--algorithm", "--calibration", "--force", "--json", "--model", "--out", "--passes", "--quick",
        "--rate", "--recalibrate", "--seed", "--steps", "--warmup"
    },
    "validate dp": {
        "--calibration", "--force", "--json", "--latency-us", "--mode", "--model", "--out", "--passes",
        "--quick", "--rate", "--recalibrate", "--seed", "--steps", "--warmup"
    },
    "validate multistream": {"--batch", "--device", "--json", "--model", "--quick", "--rounds", "--width"},
    "validate ooo-dp": {
        "--blocks", "--calibration", "--force", "--json", "--k", "--latency-us", "--model", "--out", "--passes",
        "--quick", "--rate", "--recalibrate", "--seed", "--steps"
    },
    "validate pipeline": {
        "--batch-size", "--blocks", "--calibration", "--force", "--json", "--latency-us", "--microbatches",
        "--out", "--passes", "--quick", "--rate", "--recalibrate", "--schedule", "--seed", "--steps"
    },
    "validate whatif": {"--force", "--json", "--out", "--pair", "--passes", "--quick", "--seed"},
    "whatif": {
        "--amp", "--batch-scale", "--compress", "--device", "--dtype", "--force", "--from-cluster",
        "--from-device", "--fused-gbps", "--fused-optimizer", "--json", "--microbatches", "--network-bw-factor",
        "--network-cluster", "--network-latency-us", "--ooo-dp", "--pipeline", "--plan", "--rate", "--scale",
        "--scheme", "--stages", "--timeline", "--world"
    },
}  # fmt: skip
"""every command's flags: a rename or removal is a decision (docs, RENAMED in cli/main.py), not an accident"""

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


def _all_flags() -> dict[str, set[str]]:
    import importlib

    import click

    out: dict[str, set[str]] = {}
    for name, spec in COMMANDS.items():
        mod, _, attr = spec.partition(":")
        cmd = getattr(importlib.import_module(mod), attr)
        subs = {f"{name} {s}": c for s, c in _subcommands(cmd).items()} if isinstance(cmd, click.Group) else {name: cmd}
        for path, c in subs.items():
            out[path] = {o for p in c.params for o in p.opts if o.startswith("--")}
    return out


def _subcommands(group: object) -> dict[str, Any]:
    import importlib

    registry = getattr(group, "registry", None)
    if registry:
        return {s: getattr(importlib.import_module(v.partition(":")[0]), v.partition(":")[2]) for s, v in registry.items()}
    return dict(getattr(group, "commands", {}))


def test_every_commands_flags_are_pinned() -> None:
    got = _all_flags()
    assert set(got) == set(EVERY_COMMAND_FLAGS), "a command or subcommand was added or removed"
    for path, flags in EVERY_COMMAND_FLAGS.items():
        assert got[path] == flags, f"{path}: added {sorted(got[path] - flags)}, removed {sorted(flags - got[path])}"
