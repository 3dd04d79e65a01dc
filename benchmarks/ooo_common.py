"""Shared by the ooo_* benchmarks: the machine stamp of a report, recording it as a result, and running
a ``trainsim validate`` command of the out-of-sample protocol (``trainsim.validate.protocol``).

Each script writes one record, ``docs/benchmarks/ooo.<name>.json`` (``results.record_report`` or
``results.record``: its first table is the headline), so they run in any order; ``python3 dev.py
results`` renders them.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from results import DIR, command_line, git_rev, record, record_report

ROOT = Path(__file__).resolve().parents[1]
DOC = DIR / "ooo.md"  # only its folder is used: raw files go beside the records


def machine() -> str:
    import torch

    from trainsim.transform.opcost import cpu_model

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{cpu_model()}, {os.cpu_count()} CPUs, Linux {platform.release()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}, {gpu}; load average {os.getloadavg()[0]:.2f} at start"
    )


def stamp() -> str:
    cmd = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    return (
        f"Command: `{cmd}`  \nMachine: {machine()}  \n"
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
    )


def write_section(name: str, body: str) -> Path:
    """Record one benchmark's report as ``docs/benchmarks/ooo.<name>.json`` (``ooo_dp`` -> ``ooo.dp.json``)."""
    return record_report("ooo", name.removeprefix("ooo_"), body)


# --------------------------------------------------------------------------- protocol validations
def run_validations(subcommand: str, extra: list[str], runs: int, seed: int | None) -> list[dict[str, Any]]:
    """``trainsim validate <subcommand> <extra>`` ``runs`` times in a row (seeds ``seed``, ``seed + 1`` ...,
    or fresh ones), each into a temporary result file; the documents, each with its wall time."""
    docs = []
    tmp = DIR / f"ooo_{subcommand}.partial.json"
    for i in range(runs):
        tmp.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "trainsim", "validate", subcommand, *extra, "--out", str(tmp)]
        if seed is not None:
            cmd += ["--seed", str(seed + i)]
        print("$ " + " ".join(shlex.quote(c) for c in cmd), file=sys.stderr)
        t0 = time.monotonic()
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        doc = json.loads(tmp.read_text())
        doc["wall_s"] = round(time.monotonic() - t0, 1)
        docs.append(doc)
    tmp.unlink(missing_ok=True)
    return docs


def headline_rows(docs: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """One headline row per validation: the protocol's figures (``protocol.summary``)."""
    cols = ["run", "seed", "configurations (drawn)", "mean |error| %", "worst |error| %", "within 10 %",
            "within own spread", "outside both", "ranking pairs checked", "misranked", "wall s"]  # fmt: skip
    rows = []
    for i, d in enumerate(docs):
        rk = d["ranking"]
        rows.append([i + 1, d["seed"], f"{d['measured']} ({sum(r['held_out'] for r in d['runs'])})",
                     d["mean_abs_error_pct"], d["max_abs_error_pct"], d["within_10pct"], d["within_spread"],
                     d["outside"], rk["pairs_checked"], len(rk["misranked"]), d["wall_s"]])  # fmt: skip
    return {"columns": cols, "rows": rows}


def record_validations(name: str, title: str, docs: list[dict[str, Any]], summary: list[str]) -> None:
    """Write ``docs/benchmarks/<name>.json`` (the result documents with the command, machine, date and
    git revision) and the record ``docs/benchmarks/ooo.<name without ooo_>.json``."""
    from results import machine as machine_text

    raw = {"command": command_line(), "machine": machine_text(), "machine_detail": machine(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "git_rev": git_rev(),
           "validations": docs}  # fmt: skip
    (DIR / f"{name}.json").write_text(json.dumps(raw, indent=1) + "\n")
    record("ooo", name.removeprefix("ooo_"), command=raw["command"], title=title, headline=headline_rows(docs),
           summary=summary, raw=[f"{name}.json"], data={"per_run": [_per_run(d) for d in docs]})  # fmt: skip


def _per_run(doc: dict[str, Any]) -> list[list[Any]]:
    return [[r["label"], r["held_out"], r["predicted_ms"], r["measured_ms"], r["spread_pct"], r["error_pct"],
             r["within"]] for r in doc["runs"]]  # fmt: skip
