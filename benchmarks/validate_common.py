"""Shared by the validation benchmarks: run one ``trainsim validate`` command, stamp and record it.

    doc = run_validation_cli(["dp", "--quick"], result=None)     # or an existing result file
    write_result(doc, "cluster_dp.json", area="cluster", name="dp_validate", title=...)

The validation's own result document (``trainsim.validate.protocol``: frozen predictions, measured
passes, spreads) is written to ``docs/benchmarks/<raw>`` with the benchmark's command, the machine, the
date and the git revision added; its headline (one row per configuration) becomes the record
``docs/benchmarks/<area>.<name>.json`` (``results.record``). ``run_validations`` and
``record_validations`` do the same for several runs of one command in a row (the ooo_* and whatif
benchmarks: one headline row per run).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from results import DIR, ROOT, command_line, git_rev, machine, machine_detail, record


def run_validation_cli(args: list[str], result: str | None) -> dict[str, Any]:
    """``trainsim validate ARGS --out TMP`` in a child process (progress on stderr), or the finished
    result file ``result`` of such a run; the document, with ``wall_s`` where it ran here."""
    if result:
        return dict(json.loads(Path(result).read_text()))
    with tempfile.TemporaryDirectory(prefix="trainsim-bench-") as tmp:
        out = Path(tmp) / "result.json"
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "trainsim", "validate", *args, "--out", str(out)], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)  # fmt: skip
        doc = dict(json.loads(out.read_text()))
        doc["wall_s"] = round(time.monotonic() - t0, 1)
        return doc


def write_result(doc: dict[str, Any], raw: str, *, area: str, name: str, title: str) -> Path:
    """Stamp ``doc`` and write it to docs/benchmarks/``raw``; record its headline; return the raw path."""
    if doc.get("partial") or doc.get("finished_at") is None:
        raise SystemExit(f"the validation did not finish ({doc.get('partial_reason')}); nothing recorded")
    stamp = {"benchmark_command": command_line(), "machine": machine(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "git_rev": git_rev()}  # fmt: skip
    path = DIR / raw
    path.write_text(json.dumps({**stamp, **doc}, indent=1) + "\n")
    rows = [[r["label"], r["held_out"], r["predicted_ms"], r["measured_ms"], r["spread_pct"], r["error_pct"],
             r["within"] or "no"] for r in doc["runs"]]  # fmt: skip
    n = doc["measured"]
    rk = doc["ranking"]
    summary = [
        f"**Out-of-sample (predictions frozen before any run, seed {doc['seed']}, {sum(r['held_out'] for r in doc['runs'])} "
        f"drawn configurations counted): mean |error| {doc['mean_abs_error_pct']} %, worst {doc['max_abs_error_pct']} %; "
        f"{doc['within_10pct']}/{n} within 10 %, {doc['within_spread']} more within their run-to-run spread, "
        f"{doc['outside']} outside both; ranking right where the gap exceeds the spreads: {rk['right']} "
        f"({rk['pairs_checked']} pairs).**",
        f"Validation: `{doc['command']}`; calibration {doc['calibration']['file']} ({doc['calibration']['created_at']}).",
    ]  # fmt: skip
    record(area, name, command=stamp["benchmark_command"], title=title, summary=summary, raw=[raw],
           headline={"columns": ["configuration (* drawn)", "held out", "predicted ms", "measured ms", "spread %",
                                 "error %", "within"], "rows": rows},
           data={k: doc[k] for k in ("seed", "command", "calibration", "predictions_frozen_at", "runs_started_at",
                                     "mean_abs_error_pct", "max_abs_error_pct", "within_10pct", "within_spread",
                                     "outside", "ranking") if k in doc})  # fmt: skip
    print("\n".join(summary))
    return path


# --------------------------------------------------------------------------- several runs in a row
def run_validations(subcommand: str, extra: list[str], runs: int, seed: int | None) -> list[dict[str, Any]]:
    """``trainsim validate <subcommand> <extra>`` ``runs`` times in a row (seeds ``seed``, ``seed + 1`` ...,
    or fresh ones); the documents, each with its wall time (``run_validation_cli``)."""
    docs = []
    for i in range(runs):
        args = [subcommand, *extra, *(["--seed", str(seed + i)] if seed is not None else [])]
        print("$ trainsim validate " + " ".join(shlex.quote(c) for c in args), file=sys.stderr)
        docs.append(run_validation_cli(args, None))
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
    raw = {"command": command_line(), "machine": machine(), "machine_detail": machine_detail(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "git_rev": git_rev(),
           "validations": docs}  # fmt: skip
    (DIR / f"{name}.json").write_text(json.dumps(raw, indent=1) + "\n")
    record("ooo", name.removeprefix("ooo_"), command=raw["command"], title=title, headline=headline_rows(docs),
           summary=summary, raw=[f"{name}.json"], data={"per_run": [_per_run(d) for d in docs]})  # fmt: skip


def _per_run(doc: dict[str, Any]) -> list[list[Any]]:
    return [[r["label"], r["held_out"], r["predicted_ms"], r["measured_ms"], r["spread_pct"], r["error_pct"],
             r["within"]] for r in doc["runs"]]  # fmt: skip
