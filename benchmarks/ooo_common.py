"""Shared by the ooo_* benchmarks: running a ``trainsim validate`` command of the out-of-sample protocol
(``trainsim.validate.protocol``) several times and recording the runs (the report's header: ``results.stamp``).

Each script writes one record, ``docs/benchmarks/ooo.<name>.json`` (``results.record_report`` or
``results.record``: its first table is the headline), so they run in any order; ``python3 dev.py
results`` renders them.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from typing import Any

from results import DIR, command_line, git_rev, record


# --------------------------------------------------------------------------- protocol validations
def run_validations(subcommand: str, extra: list[str], runs: int, seed: int | None) -> list[dict[str, Any]]:
    """``trainsim validate <subcommand> <extra>`` ``runs`` times in a row (seeds ``seed``, ``seed + 1`` ...,
    or fresh ones); the documents, each with its wall time (``validate_common.run_validation_cli``)."""
    from validate_common import run_validation_cli

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
    from results import machine, machine_detail

    raw = {"command": command_line(), "machine": machine(), "machine_detail": machine_detail(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "git_rev": git_rev(),
           "validations": docs}  # fmt: skip
    (DIR / f"{name}.json").write_text(json.dumps(raw, indent=1) + "\n")
    record("ooo", name.removeprefix("ooo_"), command=raw["command"], title=title, headline=headline_rows(docs),
           summary=summary, raw=[f"{name}.json"], data={"per_run": [_per_run(d) for d in docs]})  # fmt: skip


def _per_run(doc: dict[str, Any]) -> list[list[Any]]:
    return [[r["label"], r["held_out"], r["predicted_ms"], r["measured_ms"], r["spread_pct"], r["error_pct"],
             r["within"]] for r in doc["runs"]]  # fmt: skip
