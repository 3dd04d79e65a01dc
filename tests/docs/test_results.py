"""docs/benchmarks.md is rendered from the result records in docs/benchmarks/: the committed page must
equal what ``python3 dev.py results`` writes, so that the prose can never drift from the numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import results  # noqa: E402


def test_committed_page_is_rendered_from_the_records() -> None:
    assert (ROOT / "docs" / "benchmarks.md").read_text() == results.render(), "run: python3 dev.py results"


def test_every_record_has_its_envelope() -> None:
    for p in sorted((ROOT / "docs" / "benchmarks").glob("*.*.json")):
        doc = json.loads(p.read_text())
        assert results.is_record(doc), p.name
        assert p.name == f"{doc['area']}.{doc['name']}.json"
        assert doc["command"] and doc["machine"] and doc["date"] and doc["git_rev"], p.name
        assert all((p.parent / r).is_file() for r in doc["raw"]), p.name


def test_record_then_render(tmp_path: Path) -> None:
    results.record("core", "demo", command="python x.py", title="Demo", machine_text="a CPU", date="2026-01-01 00:00 UTC",
                   rev="abc1234", headline={"columns": ["n", "ms"], "rows": [[1, 2.5], [2, None]]},
                   summary=["Target met."], raw=["demo_raw.json"], directory=tmp_path)  # fmt: skip
    (tmp_path / "demo_raw.json").write_text("[]")
    (tmp_path / "plan_x.json").write_text("{}")  # another writer's file: a link line in its area
    page = results.render(tmp_path)
    assert "### Demo" in page and "| 1 | 2.5 |" in page and "| 2 | - |" in page and "Target met." in page
    assert "[core.demo.json](" in page and "[demo_raw.json](" in page
    assert "## plan" in page and "Other results: [plan_x.json](" in page
    assert page.index("## core") < page.index("## plan")


def test_the_page_names_a_cache_by_tilde_on_any_machine(tmp_path: Path) -> None:
    for user, home in (("a", "/root"), ("b", "/home/ci")):
        results.record("core", user, command="c", title=user, machine_text="m", date="2026-01-01 00:00 UTC", rev="r",
                       headline={"columns": ["n"], "rows": [[1]]}, directory=tmp_path,
                       summary=[f"calibration: {home}/.cache/trainsim/machine.json"])  # fmt: skip
    page = results.render(tmp_path)
    assert page.count("calibration: ~/.cache/trainsim/machine.json") == 2 and "/root" not in page and "/home" not in page


def test_record_refuses_a_ragged_headline(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="headline"):
        results.record("core", "bad", command="c", machine_text="m", rev="r", directory=tmp_path,
                       headline={"columns": ["a", "b"], "rows": [[1]]})  # fmt: skip


def test_markdown_report_becomes_a_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "DIR", tmp_path)
    monkeypatch.setattr(results, "machine", lambda: "a CPU")
    monkeypatch.setattr(results, "git_rev", lambda: "abc1234")
    report = "## Step time\n\nCommand: `python b.py`  \n\n| a | b |\n|---|---:|\n| x | 1 |\n\n**mean 1 %**\n"
    doc = json.loads(results.record_report("ooo", "demo", report).read_text())
    assert doc["title"] == "Step time" and doc["command"] == "python b.py"
    assert doc["headline"] == {"columns": ["a", "b"], "rows": [["x", "1"]]} and doc["summary"] == ["**mean 1 %**"]
