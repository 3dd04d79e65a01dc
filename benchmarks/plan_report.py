"""Shared by the plan_* benchmarks: record one section as docs/benchmarks/plan.<name>.json."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path


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


def write_section(name: str, body: str) -> Path:
    """Record the section ``name`` as ``docs/benchmarks/plan.<name>.json`` (``python3 dev.py results``
    renders it into docs/benchmarks.md)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results import record_report

    cmd = "python " + " ".join([f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    report = f"## {name}\n\nCommand: `{cmd}`  \nMachine: {machine()}\n\n{body.strip()}\n"
    print(report)
    return record_report("plan", name, report)
