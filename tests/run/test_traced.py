"""traced_run's handling of a rank that torch aborts (no real processes: run_workers is replaced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainsim.run import ranks, traced
from trainsim.run.ranks import RankFailed


def _fake(failures: list[RankFailed]) -> Any:
    def run_workers(*args: Any, **kw: Any) -> list[dict[str, Any]]:
        if failures:
            raise failures.pop(0)
        return [{"step_ms": [10.0, 11.0], "trace": "rank0.json.gz"}, {"step_ms": [12.0, 12.0], "trace": "rank1.json.gz"}]

    return run_workers


def test_a_rank_killed_by_a_signal_is_run_again_once_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranks, "run_workers", _fake([RankFailed(1, "rank 1 exited with code -6: malloc()", -6)]))
    res = traced.traced_run(traced.TracedRunConfig(model="mlp", world=2), tmp_path / "t")
    assert res["retried"] == ["rank 1 exited with code -6: malloc()"] and res["step_ms"] == 12.0


@pytest.mark.parametrize("code", [1, None])
def test_a_rank_that_fails_by_itself_is_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    code: int | None) -> None:  # fmt: skip
    monkeypatch.setattr(ranks, "run_workers", _fake([RankFailed(0, "boom", code), RankFailed(0, "again", code)]))
    with pytest.raises(RankFailed, match="boom"):
        traced.traced_run(traced.TracedRunConfig(model="mlp", world=2), tmp_path / "t")


def test_two_aborts_in_a_row_end_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fails = [RankFailed(1, "first", -6), RankFailed(1, "second", -11)]
    monkeypatch.setattr(ranks, "run_workers", _fake(fails))
    with pytest.raises(RankFailed, match="second"):
        traced.traced_run(traced.TracedRunConfig(model="mlp", world=2), tmp_path / "t")
