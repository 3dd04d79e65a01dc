#!/usr/bin/env python3
"""Set up a virtual environment and run trainsim's main job or its tests; needs only Python 3.10+.

    python3 dev.py demo          # set up, profile a built-in model on the CPU, replay it, show what-ifs
    python3 dev.py test          # set up, run the default test suite (one process, CPU, < 10 min)
    python3 dev.py test --all    # also the slow, multi-process and network-namespace tests (and gpu with CUDA)
    python3 dev.py lint          # ruff and mypy
    python3 dev.py results       # render docs/benchmarks.md from the result records in docs/benchmarks/*.json

The environment lives in .venv beside this file. torch is installed as the CPU build of 2.13.0
when no torch is present (a bare ``torch`` requirement can pull a multi-GB CUDA build).
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
TORCH = "torch==2.13.0"
STAMP = VENV / ".trainsim-installed"


def _run(*args: str | Path, check: bool = True) -> int:
    print("+", " ".join(str(a) for a in args), flush=True)
    return subprocess.run([str(a) for a in args], cwd=ROOT, check=check).returncode


def setup() -> None:
    if sys.version_info < (3, 10):  # noqa: UP036 - dev.py runs on whatever python3 the user has
        sys.exit(f"dev.py: Python 3.10 or newer is needed, this is {sys.version.split()[0]}")
    if not PY.exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    pyproject = ROOT / "pyproject.toml"
    if STAMP.exists() and STAMP.stat().st_mtime >= pyproject.stat().st_mtime:
        return
    pip = (PY, "-m", "pip", "install", "--disable-pip-version-check", "-q")
    have_torch = subprocess.run([str(PY), "-c", "import torch"], capture_output=True).returncode == 0
    if not have_torch:
        # The CPU build: on this kind of machine pip finds the 2.13.0 CPU wheel locally.
        _run(*pip, TORCH)
    _run(*pip, "-e", ".[dev,torch]")
    STAMP.touch()


def _has_cuda() -> bool:
    """Whether the venv's torch sees a CUDA device: then ``test --all`` runs the ``gpu`` tests too."""
    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([str(PY), "-c", probe], capture_output=True).returncode == 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"demo", "test", "lint", "setup", "results"}:
        print(__doc__)
        return 2
    if argv[0] == "results":  # standard library only: no venv needed
        return _run(sys.executable, ROOT / "benchmarks" / "results.py", *argv[1:], check=False)
    setup()
    cmd, rest = argv[0], argv[1:]
    if cmd == "setup":
        return 0
    if cmd == "demo":
        return _run(PY, "-m", "trainsim", "demo", *rest, check=False)
    if cmd == "lint":
        rc = _run(PY, "-m", "ruff", "check", "src", "tests", "benchmarks", "dev.py", check=False)
        return rc or _run(PY, "-m", "mypy", check=False)
    if "--all" in rest:
        rest = [a for a in rest if a != "--all"]
        rc = _run(PY, "-m", "pytest", "-q", *rest, check=False)
        markers = "slow or multiproc or netns" + (" or gpu" if _has_cuda() else "")
        marked = _run(PY, "-m", "pytest", "-q", "-m", markers, *rest, check=False)
        return rc or (0 if marked == 5 else marked)
    return _run(PY, "-m", "pytest", "-q", *rest, check=False)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
