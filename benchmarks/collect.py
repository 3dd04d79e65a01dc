"""Gather every area's benchmark results into docs/benchmarks.md: ``python benchmarks/collect.py``.

Each benchmark script writes its own ``docs/benchmarks/<area>.md`` (command, machine, date, figures);
this joins them under one index so that the latest results sit in one file.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["core", "cluster", "compress", "ooo", "plan"]


def main() -> None:
    parts = sorted((ROOT / "docs" / "benchmarks").glob("*.md"), key=lambda p: (p.stem not in ORDER,
                   ORDER.index(p.stem) if p.stem in ORDER else 0, p.stem))  # fmt: skip
    lines = [
        "# Benchmarks",
        "",
        "Latest results of the benchmark scripts in `benchmarks/`, each with the command that produced it, the",
        "machine and the date. The machine is shared and noisy: compare ratios measured side by side in one run.",
        "Regenerate a section with its command, then this file with `python benchmarks/collect.py`.",
        "",
    ]
    lines += [f"- [{p.stem}](#{p.read_text().splitlines()[0].lstrip('# ').lower().replace(' ', '-')})" for p in parts]
    for p in parts:
        text = p.read_text().rstrip()
        lines += ["", _demote(text)]
    (ROOT / "docs" / "benchmarks.md").write_text("\n".join(lines) + "\n")
    print(f"wrote docs/benchmarks.md from {len(parts)} files")


def _demote(text: str) -> str:
    """Push every heading one level down so each file becomes a section."""
    out = []
    for line in text.splitlines():
        out.append("#" + line if line.startswith("#") else line)
    return "\n".join(out).replace("](", "](benchmarks/").replace("](benchmarks/http", "](http")


if __name__ == "__main__":
    main()
