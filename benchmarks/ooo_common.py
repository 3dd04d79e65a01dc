"""Shared by the ooo_* benchmarks: machine stamp and rewriting one section of docs/benchmarks/ooo.md.

Each script owns the block between ``<!-- NAME:begin -->`` and ``<!-- NAME:end -->``, so they can run
in any order and re-running one leaves the others' results alone.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks" / "ooo.md"
HEADER = """# Out-of-order backprop and pipeline schedules: measured vs predicted

Each section is written by one script (`python benchmarks/ooo_*.py`), with its command, machine and
date. All runs are CPU processes (gloo) on machines without a GPU, except the section "two CUDA
streams", which ran on one H100. Numbers
from a 2-core machine shared with other jobs are noisy: the load average at the start is recorded.
"""


def machine() -> str:
    cpu = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    load = os.getloadavg()[0]
    return (
        f"{cpu}, {os.cpu_count()} CPUs, Linux {platform.release()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}, no GPU; load average {load:.2f} at start"
    )


def stamp() -> str:
    cmd = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    return (
        f"Command: `{cmd}`  \nMachine: {machine()}  \n"
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
