"""Each user guide's first example runs as written: its first ```sh (or ```python) block, in an empty
folder, with this environment's ``trainsim`` and python, must exit 0."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```", re.S | re.M)

# guide -> marks; every guide but goodput profiles a model or runs real training (10 s to a few minutes)
GUIDES = {
    "goodput.md": [],
    "whatif.md": [pytest.mark.slow],
    "cluster.md": [pytest.mark.slow],
    "compress.md": [pytest.mark.slow],
    "ooo.md": [pytest.mark.slow],
    # real DDP ranks in network namespaces: over 5 min on a loaded 2-core host
    "validate.md": [pytest.mark.slow, pytest.mark.netns, pytest.mark.timeout(900)],
}
# docs/plan.md opens with a ```console block naming a cluster file of the reader's; not checked yet


def first_block(path: Path) -> tuple[str, str]:
    m = BLOCK.search(path.read_text())
    assert m, f"{path.name}: no ```sh or ```python block"
    return m.group(1), m.group(2)


@pytest.mark.parametrize("guide", [pytest.param(g, marks=m) for g, m in GUIDES.items()])
def test_first_example_runs(guide: str, tmp_path: Path) -> None:
    lang, code = first_block(DOCS / guide)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = ["bash", "-euo", "pipefail", "-c", code] if lang == "sh" else [sys.executable, "-c", code]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f"{guide}'s first {lang} block failed:\n{code}\n{out.stdout[-2000:]}{out.stderr[-3000:]}"


def test_every_guide_is_listed() -> None:
    guides = {p.name for p in DOCS.glob("*.md")} - {"architecture.md", "benchmarks.md", "plan.md"}
    assert guides == set(GUIDES)
