"""Every out-of-sample validation's ``--quick`` run, several rounds in a row: the issue-47 figures.

    python benchmarks/validate_quick.py                    # 3 rounds of dp, compress, ooo-dp, pipeline, whatif
    python benchmarks/validate_quick.py --rounds 1 --only whatif   # the others keep their last rounds

Each round runs ``trainsim validate <name> --quick`` (with ``EXTRA``'s options; fresh seeds, printed and stored, so every round
has its own drawn configurations) with the machine calibration already on disk
(``trainsim validate calibrate`` first, on a quiet host). Writes every result document to
docs/benchmarks/validate_quick_runs.json and a record docs/benchmarks/validate.quick.json: per run its
seed, configurations, mean and worst error, how many fall within 10 %, within their own spread, or
outside both, whether the ranking is right, and its wall time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

NAMES = ("dp", "compress", "ooo-dp", "pipeline", "whatif")
EXTRA: dict[str, tuple[str, ...]] = {"pipeline": ("--passes", "5")}
"""options beyond ``--quick``: the pipeline runs' spread comes from whole runs of 20-40 % slower
computation, in spells of this shared host (2026-11-29: whole passes of one configuration 110 and
150 ms, each run's own steps within a few %), so five passes (still under 3 minutes) give its
median room for two such runs"""


def run_one(name: str, tmp: Path, i: int) -> dict[str, Any]:
    out = tmp / f"{name}-{i}.json"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "trainsim", "validate", name, "--quick", *EXTRA.get(name, ()),
                           "--out", str(out)],
                          cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    wall = time.monotonic() - t0
    if not out.exists():
        return {"name": name, "failed": proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"],
                "wall_s": round(wall, 1)}  # fmt: skip
    doc = json.loads(out.read_text())
    doc["name"], doc["wall_s"], doc["exit_code"] = name, round(wall, 1), proc.returncode
    return doc


def row(doc: dict[str, Any], rnd: int) -> list[Any]:
    if "failed" in doc:
        return [doc["name"], rnd, "-", 0, "-", "-", "-", "-", "-", "-", doc["wall_s"]]
    runs = [r for r in doc["runs"] if r.get("measured_ms") is not None]
    rk = doc.get("ranking") or {}
    return [doc["name"], rnd, doc["seed"], f"{len(runs)} ({sum(bool(r['held_out']) for r in runs)} drawn)",
            doc["mean_abs_error_pct"], doc["max_abs_error_pct"], doc["within_10pct"], doc["within_spread"],
            doc["outside"], f"{rk.get('pairs_checked', 0) - len(rk.get('misranked', []))}/{rk.get('pairs_checked', 0)}",
            doc["wall_s"]]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", action="append", choices=NAMES, help="only these validations (repeatable)")
    args = ap.parse_args()
    names = args.only or list(NAMES)
    docs: list[dict[str, Any]] = []
    rows: list[list[Any]] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(1, args.rounds + 1):
            for name in names:
                print(f"round {rnd}/{args.rounds}: validate {name} --quick", flush=True)
                doc = run_one(name, Path(tmp), rnd)
                doc["round"] = rnd
                docs.append(doc)
                rows.append(row(doc, rnd))
                print("  ", rows[-1], flush=True)
    raw = ROOT / "docs" / "benchmarks" / "validate_quick_runs.json"
    if args.only and raw.exists():  # the validations not re-run keep their last rounds
        kept = [d for d in json.loads(raw.read_text()) if d.get("name") not in names]
        if kept:
            first = min(str(d.get("started_at", "?")) for d in kept)
            notes.append(f"{', '.join(dict.fromkeys(d['name'] for d in kept))}: rounds of an earlier invocation "
                         f"(from {first}), not re-run by this command")  # fmt: skip
        docs = kept + docs
        rows = [row(d, d["round"]) for d in docs]
        names = list(dict.fromkeys(d["name"] for d in docs))
    raw.write_text(json.dumps(docs, indent=1) + "\n")
    from results import command_line, record

    # the calibration of this invocation's latest run (the kept rounds come first and may predate it)
    cal = next((d.get("calibration") for d in reversed(docs) if d.get("calibration")), None)
    summary = []
    for name in names:
        ok = [d for d in docs if d["name"] == name and "failed" not in d and d.get("mean_abs_error_pct") is not None]
        if not ok:
            summary.append(f"**{name}**: no finished run")
            continue
        n = sum(d["measured"] for d in ok)
        summary.append(
            f"**{name}**: {len(ok)} runs, {n} configurations: mean |error| per run "
            f"{', '.join(str(d['mean_abs_error_pct']) for d in ok)} %, worst {max(d['max_abs_error_pct'] for d in ok)} %; "
            f"within 10 % {sum(d['within_10pct'] for d in ok)}, within their spread {sum(d['within_spread'] for d in ok)}, "
            f"outside both {sum(d['outside'] for d in ok)}")  # fmt: skip
    record("validate", "quick", command=command_line(), title="Out-of-sample validations, --quick, rounds in a row",
           headline={"columns": ["validation", "round", "seed", "configs", "mean |err| %", "worst %", "within 10 %",
                                 "within spread", "outside both", "ranking right", "wall s"], "rows": rows},
           summary=[*summary, *notes, f"calibration: {json.dumps(cal)}" if cal else "calibration: -"],
           raw=[raw.name], data={"rounds": args.rounds})  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
