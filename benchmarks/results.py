"""Benchmark results as data: one JSON record per benchmark, and docs/benchmarks.md rendered from them.

    from results import record                      # in a benchmark script (benchmarks/ is on sys.path)
    record("core", "replay", command="python benchmarks/core_bench.py",
           title="Replay fidelity", headline={"columns": ["trace", "error %"], "rows": [["v100", 0.2]]},
           data={...every figure...})
    python3 dev.py results                          # rewrite docs/benchmarks.md from docs/benchmarks/*.json

A record is ``docs/benchmarks/<area>.<name>.json``: ``{"trainsim_result": 1, "area", "name", "title",
"command", "machine", "date", "git_rev", "headline": {"columns", "rows"}, "summary": [lines],
"raw": [files beside it], "data": {...}}``. ``record`` fills the machine (the processor's model name, the
core count, and the GPU when torch sees one), the UTC date and ``git rev-parse --short HEAD``.
The headline is the short table people read; ``data`` holds everything else. Files in
docs/benchmarks/ that are not records (another writer's JSON, a plot) get a link line in their area.
Rendering needs only the standard library, so ``dev.py`` can run it before the venv exists.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DIR = ROOT / "docs" / "benchmarks"
PAGE = ROOT / "docs" / "benchmarks.md"
SCHEMA = 1  # the value of "trainsim_result" in every record; bump when the envelope changes
AREAS = ["validate", "core", "whatif", "cluster", "compress", "ooo", "plan", "goodput"]  # page order; others follow
MAX_ROWS = 12  # rows of a headline shown on the page; the record keeps them all
FIELDS = ("area", "name", "title", "command", "machine", "date", "git_rev", "headline")  # required


def machine() -> str:
    """The processor's name and core count, plus the GPU when torch sees one (imports torch only if loaded)."""
    sys.path.insert(0, str(ROOT / "src"))
    from trainsim.transform.opcost import cpu_model

    text = f"{cpu_model()}, {os.cpu_count()} cores"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name(0)}"
    return text


def machine_detail() -> str:
    """``machine()`` with the kernel, Python, torch and the load average at start: the header of a report."""
    import platform

    import torch

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (
        f"{machine()}, Linux {platform.release()}, Python {platform.python_version()}, torch {torch.__version__}, "
        f"{gpu}; load average {load:.2f} at start"
    )


def stamp(command: str | None = None) -> str:
    """A report's header: the command (default ``command_line()``), the machine and the date (UTC)."""
    return (
        f"Command: `{command or command_line()}`  \nMachine: {machine_detail()}  \n"
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n"
    )


def git_rev() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def command_line() -> str:
    """How this script was started, relative to the repository: ``python benchmarks/x.py --quick``."""
    script = Path(sys.argv[0])
    if script.is_absolute() and script.is_relative_to(ROOT):
        script = script.relative_to(ROOT)
    return " ".join(["python", str(script), *sys.argv[1:]])


def record(area: str, name: str, *, command: str, headline: dict[str, list[Any]], data: Any = None,
           title: str = "", summary: list[str] | None = None, raw: list[str] | None = None,
           machine_text: str | None = None, date: str | None = None, rev: str | None = None,
           directory: Path | None = None) -> Path:  # fmt: skip
    """Write ``<directory>/<area>.<name>.json`` (default docs/benchmarks/) and return its path.

    ``headline``: ``{"columns": [...], "rows": [[...], ...]}``, a few rows; numbers stay numbers (round
    them first). ``raw``: names of files beside the record that hold its full data (linked, not listed
    apart). ``machine_text``, ``date`` and ``rev`` default to this machine, now and HEAD.
    """
    if not re.fullmatch(r"[a-z0-9_]+", area) or not re.fullmatch(r"[a-z0-9_]+", name):
        raise ValueError(f"area and name must be lower-case words, got {area!r}, {name!r}")
    cols, rows = headline.get("columns"), headline.get("rows")
    if not isinstance(cols, list) or not isinstance(rows, list) or any(len(r) != len(cols) for r in rows):
        raise ValueError(f"headline needs columns and rows of that many cells, got {headline!r}")
    doc = {
        "trainsim_result": SCHEMA, "area": area, "name": name, "title": title or name.replace("_", " "),
        "command": command, "machine": machine_text or machine(),
        "date": date or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "git_rev": rev or git_rev(),
        "headline": {"columns": cols, "rows": rows}, "summary": summary or [], "raw": raw or [], "data": data,
    }  # fmt: skip
    path = (directory or DIR) / f"{area}.{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=_plain) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return path


def _plain(o: Any) -> Any:
    """numpy scalars and arrays as Python numbers and lists; anything else as its text."""
    return o.tolist() if hasattr(o, "tolist") else str(o)


def markdown_table(text: str) -> dict[str, list[Any]]:
    """The first markdown table in ``text`` as a headline (cells as strings); empty if there is none."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            break
    return {"columns": rows[0], "rows": rows[1:]} if rows else {"columns": [], "rows": []}


def record_report(area: str, name: str, report: str, *, data: Any = None, raw: list[str] | None = None) -> Path:
    """Record a benchmark that writes a markdown report: its first ``#`` heading is the title, its
    ``Command: `...` `` line the command (else this process's), its first table the headline, its bold
    lines the summary; the report itself is kept in ``data["report"]``."""
    title = next((ln.lstrip("#").strip() for ln in report.splitlines() if ln.startswith("#")), "")
    cmd = re.search(r"Command: `([^`]*)`", report)
    summary = [ln.strip() for ln in report.splitlines() if "**" in ln and not ln.startswith("|")][:4]
    if raw is None:  # files beside the records that the report names (a raw JSON, a plot)
        raw = sorted({f for f in re.findall(r"[\w.-]+\.(?:json|png)", report) if (DIR / f).is_file()})
    return record(area, name, command=cmd.group(1) if cmd else command_line(), title=title,
                  headline=markdown_table(report), summary=summary, raw=raw,
                  data={"report": report, **(data if isinstance(data, dict) else {"data": data} if data else {})})  # fmt: skip


def is_record(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("trainsim_result") == SCHEMA and all(k in doc for k in FIELDS)


def _cell(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    return str(v).replace("|", "\\|")


def _area_of(filename: str) -> str:
    return re.split(r"[._]", filename, maxsplit=1)[0]


def render(directory: Path | None = None) -> str:
    """docs/benchmarks.md's text from the files in ``directory`` (default docs/benchmarks/)."""
    directory = directory or DIR
    records: dict[str, list[dict[str, Any]]] = {}
    claimed: set[str] = set()
    files = sorted(p for p in directory.iterdir() if p.is_file() and ".partial." not in p.name)
    for p in files:
        if p.suffix != ".json":
            continue
        try:
            doc = json.loads(p.read_text())
        except ValueError:
            continue
        if is_record(doc):
            records.setdefault(doc["area"], []).append({**doc, "_file": p.name})
            claimed.add(p.name)
            claimed.update(doc.get("raw") or [])
    others: dict[str, list[str]] = {}
    for p in files:
        if p.name not in claimed:
            others.setdefault(_area_of(p.name), []).append(p.name)
    areas = [a for a in AREAS if a in records or a in others]
    areas += sorted((set(records) | set(others)) - set(AREAS))
    rel = directory.name
    lines = [
        "# Benchmark results",
        "",
        "Generated by `python3 dev.py results` from the JSON records in [benchmarks/](benchmarks/): do not edit.",
        "Each table is one benchmark's headline; its record holds the command, machine, date, git revision and",
        "every figure. Unless a record names a GPU, the machine is a shared 2-core VM: compare figures of one run.",
        "",
        " · ".join(f"[{a}](#{a})" for a in areas),
    ]
    for area in areas:
        lines += ["", f"## {area}"]
        for doc in sorted(records.get(area, []), key=lambda d: (not d.get("lead"), d["name"])):
            head = doc["headline"]
            lines += [
                "",
                f"### {doc['title']}",
                "",
                f"`{doc['command']}` · {doc['machine']} · {doc['date']} · rev {doc['git_rev']} · "
                f"[{doc['_file']}]({rel}/{doc['_file']})"
                + "".join(f", [{r}]({rel}/{r})" for r in doc.get("raw") or []),
            ]
            if head["columns"]:
                lines += ["", "| " + " | ".join(map(_cell, head["columns"])) + " |",
                          "|" + "---|" * len(head["columns"])]  # fmt: skip
                lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in head["rows"][:MAX_ROWS]]
                if len(head["rows"]) > MAX_ROWS:
                    lines += ["", f"({len(head['rows']) - MAX_ROWS} more rows in the record.)"]
            if doc.get("summary"):
                lines += ["", *doc["summary"]]
        if others.get(area):
            lines += ["", "Other results: " + ", ".join(f"[{n}]({rel}/{n})" for n in others[area]) + "."]
    # a record may name the user's cache by its absolute path: the page says ~ (the same on every machine)
    return re.sub(r"(?:/root|/home/[^/\s\"]+)/\.cache/", "~/.cache/", "\n".join(lines) + "\n")


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print("usage: python benchmarks/results.py [--check]", file=sys.stderr)
        return 2
    text = render()
    if argv == ["--check"]:
        same = PAGE.exists() and PAGE.read_text() == text
        print("docs/benchmarks.md is up to date" if same else "docs/benchmarks.md is stale: run python3 dev.py results")
        return 0 if same else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
