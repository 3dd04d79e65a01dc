"""Shared by the cluster benchmarks: machine description and writing one section of docs/benchmarks/cluster.md.

Each benchmark owns a section between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` and rewrites only
that section, so the scripts can run in any order.
"""

from __future__ import annotations

import os
import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks" / "cluster.md"
HEADER = """# Cluster benchmarks: collectives, data-parallel prediction vs real runs, priority scheduling

Each section is written by one script (`python benchmarks/cluster_*.py`); the command, the machine
and the date are in the section. Numbers from a 2-core machine shared with other jobs are noisy: the
load average at the start of each run is recorded beside it.
"""


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    import torch

    return (
        f"{cpu}, {os.cpu_count()} CPUs, Linux {platform.release()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}; load average {load:.2f} at start"
    )


def stamp(command: str) -> str:
    return (
        f"Command: `{command}`  \nMachine: {machine()}  \n"
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
    )


def write_section(name: str, body: str) -> Path:
    DOC.parent.mkdir(parents=True, exist_ok=True)
    text = DOC.read_text() if DOC.exists() else HEADER
    block = f"<!-- {name}:begin -->\n{body.rstrip()}\n<!-- {name}:end -->"
    rx = re.compile(rf"<!-- {re.escape(name)}:begin -->.*?<!-- {re.escape(name)}:end -->", re.S)
    text = rx.sub(lambda _m: block, text) if rx.search(text) else text.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(text)
    return DOC


def command_line() -> str:
    return " ".join(["python", str(Path(sys.argv[0]).relative_to(ROOT)) if Path(sys.argv[0]).is_absolute() else sys.argv[0], *sys.argv[1:]])
