"""Shared by the cluster benchmarks: the machine stamp of a report and recording it as a result.

Each benchmark writes one record, ``docs/benchmarks/cluster.<name>.json`` (``results.record_report``:
its report's first table is the headline); ``python3 dev.py results`` renders them into docs/benchmarks.md.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from results import DIR, command_line, record_report

ROOT = Path(__file__).resolve().parents[1]
DOC = DIR / "cluster.md"  # only its folder is used: raw files and plots go beside the records


def machine() -> str:
    from trainsim.transform.opcost import cpu_model

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    import torch

    return (
        f"{cpu_model()}, {os.cpu_count()} CPUs, Linux {platform.release()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}; load average {load:.2f} at start"
    )


def stamp(command: str) -> str:
    return (
        f"Command: `{command}`  \nMachine: {machine()}  \n"
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
    )


def write_section(name: str, body: str) -> Path:
    """Record one benchmark's report as ``docs/benchmarks/cluster.<name>.json``."""
    return record_report("cluster", name, body)


__all__ = ["DOC", "ROOT", "command_line", "machine", "stamp", "write_section"]
