"""Pins the CLI surface: the command names and that each answers --help (torchtitan's frozen-options idea)."""

from __future__ import annotations

import pytest

from trainsim.cli.main import COMMANDS, main

EXPECTED = {"bench-sim", "calibrate", "demo", "estimate", "plan", "profile", "replay", "validate", "whatif"}


def test_command_set_is_pinned() -> None:
    assert set(COMMANDS) >= EXPECTED, "a command was removed or renamed: update docs and this test on purpose"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([name, "--help"]) == 0
    assert "Usage:" in capsys.readouterr().out
