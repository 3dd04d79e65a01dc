"""Shared by the plan_* benchmarks: write one section of docs/benchmarks/plan.md (others are kept)."""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "plan.md"
HEADER = """# Planner benchmarks (trainsim estimate / plan)

Each section is written by the benchmark script named in it; re-run a script to refresh its section.
Machine notes: the development machine has 2 shared CPU cores, so timings there are noisy.
"""


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
        m = re.search(r"Model name:\s*(.+)", out)
        if m:
            cpu = m.group(1).strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return f"{platform.node()}: {cpu}, {os.cpu_count()} logical CPUs, Python {platform.python_version()}"


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section ``name`` of docs/benchmarks/plan.md."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = "python " + " ".join([f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    block = (
        f"<!-- {name}:start -->\n## {name}\n\nCommand: `{cmd}`  \nMachine: {machine()}  \nDate: {now}\n\n"
        f"{body.strip()}\n<!-- {name}:end -->"
    )
    text = DOC.read_text() if DOC.exists() else HEADER
    pat = re.compile(rf"<!-- {re.escape(name)}:start -->.*?<!-- {re.escape(name)}:end -->", re.S)
    text = pat.sub(lambda _: block, text) if pat.search(text) else text.rstrip() + "\n\n" + block + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
    print(block)
