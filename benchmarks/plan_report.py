"""Shared by the plan_* benchmarks: record one section as docs/benchmarks/plan.<name>.json."""

from __future__ import annotations

import sys
from pathlib import Path


def write_section(name: str, body: str) -> Path:
    """Record the section ``name`` as ``docs/benchmarks/plan.<name>.json`` (``python3 dev.py results``
    renders it into docs/benchmarks.md)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results import record_report, stamp

    report = f"## {name}\n\n{stamp()}\n{body.strip()}\n"
    print(report)
    return record_report("plan", name, report)
