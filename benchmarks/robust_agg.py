"""Robust aggregation on 4 real gloo ranks: accuracy under bad ranks, and the step-time overhead, predicted first.

    realrun .venv/bin/python benchmarks/robust_agg.py                 # 1 Gbit/s namespaces, ~18 min
    realrun .venv/bin/python benchmarks/robust_agg.py --rate-mbit 0   # unshaped link
    realrun .venv/bin/python benchmarks/robust_agg.py --skip timing --steps 1500 --seeds 3 \
        --cases allreduce:0:sign_flip median:1:sign_flip krum:1:sign_flip zeno:1:sign_flip allreduce:1:scale:0 \
        --out docs/benchmarks/robust_budget.json                        # accuracy against the budget, ~7 min

1. Predictions for the timed model (``--timing-hidden``: 768 by default, 648,202 fp32, 2.6 MB of gradient,
   so that the overhead stands well above the host's step-to-step noise), from generic calibrations only,
   written to the JSON before any run of the model: the link (``trainsim.testbed.calibrate`` on 4 ranks
   over the same kind of link: all-reduce at powers of 4 bytes, all-gather at 16 KiB .. 4 MiB per rank),
   the two primitives' CPU time per rank (``robust_cost.time_collectives``, 4 ranks on the same link, the
   same generic sizes), the rules' CPU time with every core busy and cold caches (``robust_cost.time_rules``
   on random rows at powers of 2 elements), Zeno's parts (``robust_cost.zeno_parts``: forward passes and
   per-row arithmetic from GEMMs and adds timed as the rules are, ``robust_cost.time_ops``; the rows'
   first pass at the streaming bandwidth of a busy host, the kept rows' average as the mean rule, and its Python machinery,
   ``robust_cost.time_skeleton``: the model with every Linear made 1 x 1, one process per core, caches
   flushed); ``robust_cost.predict_overhead`` per rule: the larger of the link-bound and the core-bound
   estimate.
2. Timing: ``--launches`` launches of 4 ranks (``robust_worker.run_robust``), each ``--rounds`` rounds of
   every aggregator's step time with no bad rank, the order rotated each round. Measured overhead per
   round: the aggregator's time per step minus DDP's all-reduce mean's in the same round; the median over
   all rounds of all launches against the prediction, with the rounds' spread and each launch's median.
3. Accuracy: per seed (``--seeds``: data split, initial weights, batch order), one launch trains the
   accuracy model (``--hidden``, 256: 85,002 parameters) on scikit-learn's digits for ``--steps`` steps per
   case: every aggregator (DDP's all-reduce mean included) with 0, 1 and 2 bad ranks sending ``-10 g``,
   and with 1 bad rank sending ``10 g`` and noise 10x the gradient's RMS; the test accuracy every
   ``--eval-every`` steps and at the end; mean and sample standard deviation over the seeds.

Writes docs/benchmarks/robust.json (every figure, command, machine, date, git revision) and, when run in
full with the default cases and output, a record of its tables, docs/benchmarks/robust.aggregation.json
(``python3 dev.py results`` shows it; it names robust_budget.json beside it when that exists).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RULES = ["mean", "median", "trimmed_mean", "krum", "zeno"]
AG_SIZES = [16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20, 4 << 20]  # per-rank all-gather sizes of the calibration


def _git_rev() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
        return rev.stdout.strip() + ("+dirty" if dirty.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@contextlib.contextmanager
def _network(rate_mbit: float | None, notes: list[str]) -> Iterator[tuple[Any, Any, str]]:
    """(the Netns or None, a popen for the ranks, the master address)."""
    from trainsim.run.ranks import local_popen
    from trainsim.testbed.netns import Netns, netns_unavailable

    reason = netns_unavailable()
    if reason is not None:
        notes.append(f"network namespaces unavailable ({reason}); ran on unshaped loopback")
        yield None, local_popen, "127.0.0.1"
        return
    with Netns(4, rate_mbit=rate_mbit) as net:

        def popen(rank: int, argv: list[str], **kw: Any) -> Any:
            env = dict(os.environ, GLOO_SOCKET_IFNAME=net.ifname, OMP_NUM_THREADS="1")
            return net.popen(rank, argv, env=env, **kw)

        yield net, popen, net.addr(0)


def predict(cfg: Any, net: Any, popen: Any, master: str, rate_mbit: float | None) -> dict[str, Any]:
    """Step 1: the predictions and the calibrations they came from."""
    import torch

    from trainsim.cluster.calibrate_fit import default_sizes
    from trainsim.run.robust_cost import (
        predict_overhead,
        time_collectives,
        time_rules,
        time_skeleton,
        zeno_parts,
    )
    from trainsim.run.robust_worker import _model
    from trainsim.testbed.calibrate import calibrate
    from trainsim.transform import opcost

    cal = calibrate(world=cfg.world_size, rate_mbit=rate_mbit, net=net, sizes=default_sizes(4 << 20),
                    allgather_sizes=AG_SIZES)  # fmt: skip
    coll = time_collectives(cfg.world_size, AG_SIZES, popen=popen, master=master)
    rules = time_rules(cfg.world_size, ops=True)
    table = opcost.load_or_calibrate()
    torch.set_num_threads(1)
    model = _model(cfg)
    skeleton_us = time_skeleton(model, cfg.world_size, cfg.val_batch)
    numel = sum(p.numel() for p in model.parameters())
    z_parts = zeno_parts(model, cfg.val_batch, cfg.world_size, table, skeleton_us, classes=10, rules=rules)
    z_alone = zeno_parts(model, cfg.val_batch, cfg.world_size, table, skeleton_us, classes=10,
                         rules=dataclasses.replace(rules, ops=None))  # fmt: skip
    z_us = sum(z_parts.values())
    preds = {}
    for rule in RULES:
        p = predict_overhead(rule, numel, cal, rules, coll=coll, zeno_compute_us=z_us)
        preds[rule] = {"total_ms": p.total_us / 1e3, "link_ms": p.link_us / 1e3, "allgather_ms": p.allgather_us / 1e3,
                       "allreduce_ms": p.allreduce_us / 1e3, "compute_ms": p.compute_us / 1e3,
                       "contention": p.contention, "wire_ms": p.wire_us / 1e3, "cpu_ms": p.cpu_us / 1e3,
                       "cpu_link_ms": (p.allgather_cpu_us - p.allreduce_cpu_us) / 1e3}  # fmt: skip
    return {"numel": numel, "size_bytes": 4 * numel, "rules": preds, "link_calibration": cal.to_json(),
            "collective_cpu": coll.to_json(), "rule_times": {"sizes": list(rules.sizes), "us": rules.us,
            "corun": rules.corun, "stream_gbps": rules.stream_gbps}, "skeleton_us": skeleton_us,
            "zeno_compute_us": z_us, "zeno_parts_us": z_parts, "zeno_parts_alone_us": z_alone,
            "ops_corun": rules.ops.to_json() if rules.ops is not None else None}  # fmt: skip


def overheads(timings: list[dict[str, list[dict[str, float]]]]) -> dict[str, dict[str, Any]]:
    """Per aggregator: per round (all launches) its step time minus the baseline's in that round."""
    from trainsim.run.robust_worker import BASELINE

    out = {}
    for rule in RULES:
        per = [r["step_ms"] - b["step_ms"] for t in timings for r, b in zip(t[rule], t[BASELINE], strict=True)]
        comp = [r["compute_ms"] for t in timings for r in t[rule]]
        launch_medians = [statistics.median(r["step_ms"] - b["step_ms"] for r, b in zip(t[rule], t[BASELINE], strict=True))
                          for t in timings]  # fmt: skip
        out[rule] = {"overhead_ms": statistics.median(per), "rounds_ms": per, "min_ms": min(per), "max_ms": max(per),
                     "launch_medians_ms": launch_medians, "hook_compute_ms": statistics.median(comp)}  # fmt: skip
    base = [b["step_ms"] for t in timings for b in t[BASELINE]]
    out[BASELINE] = {"step_ms": statistics.median(base), "min_ms": min(base), "max_ms": max(base)}
    return out


def markdown(doc: dict[str, Any]) -> str:
    from trainsim.run.robust_worker import BASELINE

    acc, pred, meas = doc.get("accuracy", {}), doc.get("prediction"), doc.get("measured")
    cfg, tcfg = doc.get("config") or {}, doc["timing_config"]
    lines = ["# Robust aggregation: accuracy under bad ranks, overhead predicted and measured", "",
             f"Command: `{doc['command']}`  ", f"Machine: {doc['machine']}; {doc['network']}  ",
             f"Date: {doc['date']}; git {doc['git']}"
             + (f"; predictions frozen at {doc['predictions_frozen_at']}, before any run of the model" if pred else ""),
             *(["", f"Overhead from a later timing-only run: `{doc['timing_run']['command']}`, "
                f"{doc['timing_run']['date']}; git {doc['timing_run']['git']} ({doc['timing_run']['file']})"]
               if "timing_run" in doc else []),
             "", f"## Final test accuracy (%, mean ± sd over {doc['seeds']} seeds; in brackets the paired difference "
             f"from clean all-reduce on the same seed; {cfg.get('steps')} steps, hidden {cfg.get('hidden')}) and "
             f"overhead (ms per step over DDP's all-reduce, hidden {tcfg['hidden']})", ""]  # fmt: skip
    keys = sorted({(int(b), k) for _, b, k in (key.split("|") for key in acc)}, key=lambda t: (t[1] != "sign_flip", t))
    lines.append("| aggregator | " + "".join(f"{b} bad, {k} | " if b else "clean | " for b, k in keys)
                 + "overhead predicted / measured |")  # fmt: skip
    lines.append("|---|" + "---:|" * (len(keys) + 1))
    for agg in [BASELINE, *RULES]:
        row = []
        for b, k in keys:
            c = acc.get(f"{agg}|{b}|{k}")
            gap = "" if c is None or "gap" not in c or (agg == BASELINE and not b) else f" ({c['gap_mean']:+.1f} ± {c['gap_sd']:.1f})"
            row.append("" if c is None else f"{c['mean']:.1f} ± {c['sd']:.1f}" + gap
                       + (f" (NaN {c['nan']}/{len(c['acc'])})" if c["nan"] else ""))  # fmt: skip
        if pred and meas and agg in RULES:
            p, m = pred["rules"][agg]["total_ms"], meas[agg]["overhead_ms"]
            row.append(f"{p:.1f} / {m:.1f} ({100 * (p - m) / m:+.0f} %)")
        else:
            row.append("-")
        if any(row[:-1]) or row[-1] != "-":
            lines.append(f"| {agg} | " + " | ".join(row) + " |")
    curves = {key: c["curve"] for key, c in acc.items() if c["curve"] and key.split("|")[1] in "01"}
    if curves:
        steps = [n for n, _ in next(iter(curves.values()))]
        lines += ["", "## Test accuracy (%) by step, mean over the seeds (0 or 1 bad rank)", "",
                  "| case | " + " | ".join(str(n) for n in steps) + " |", "|---|" + "---:|" * len(steps)]  # fmt: skip
        for key, cv in curves.items():
            agg, b, kind = key.split("|")
            lines.append(f"| {agg}, {b} bad{', ' + kind if b != '0' else ''} | " + " | ".join(f"{a:.1f}" for _, a in cv) + " |")
    if pred and meas:
        lines += ["", "## Step-time overhead over DDP's all-reduce mean (ms per step, no bad rank)", "",
                  f"Baseline step: {meas[BASELINE]['step_ms']:.2f} ms (rounds {meas[BASELINE]['min_ms']:.2f}-"
                  f"{meas[BASELINE]['max_ms']:.2f}). Bucket: {pred['numel']} fp32 gradients "
                  f"({pred['size_bytes'] / 1024:.0f} KiB) per rank.", "",
                  "Predicted: max(wire, share x cpu); wire = all-gather - all-reduce wall + share x rule; cpu = one rank's "
                  "extra CPU: all-gather - all-reduce CPU + rule (CPU with every core busy); share = ranks / cores.",
                  "", "| aggregator | predicted | wire | share x (cpu link + rule) | measured median | rounds min-max | "
                  "launch medians | error | hook compute measured / predicted |",
                  "|---|---:|---:|---|---:|---|---|---:|---|"]  # fmt: skip
        for rule in RULES:
            p, m = pred["rules"][rule], meas[rule]
            err = 100 * (p["total_ms"] - m["overhead_ms"]) / m["overhead_ms"] if m["overhead_ms"] else float("nan")
            launches = ", ".join(f"{x:.2f}" for x in m["launch_medians_ms"])
            lines.append(f"| {rule} | {p['total_ms']:.2f} | {p['wire_ms']:.2f} | {p['contention']:.0f} x "
                         f"({p['cpu_link_ms']:.2f} + {p['compute_ms']:.2f}) | {m['overhead_ms']:.2f} | "
                         f"{m['min_ms']:.2f} to {m['max_ms']:.2f} | {launches} | {err:+.0f} % | "
                         f"{m['hook_compute_ms']:.2f} / {p['compute_ms']:.2f} |")  # fmt: skip
    lines += ["", *[f"- {n}" for n in doc["notes"]], ""]
    return "\n".join(lines)


def _case(text: str) -> list[Any]:
    """``AGG:BAD:KIND[:FACTOR]`` as a case of ``RobustRunConfig.cases``; a UserError naming a bad one."""
    from trainsim.errors import UserError
    from trainsim.run.robust import AGGREGATORS, FAULT_KINDS
    from trainsim.run.robust_worker import BASELINE

    parts = text.split(":")
    try:
        agg, bad, kind = parts[0], int(parts[1]), parts[2]
        factor = [float(parts[3])] if len(parts) == 4 else []
        ok = len(parts) in (3, 4) and agg in (BASELINE, *AGGREGATORS) and kind in FAULT_KINDS and 0 <= bad < 4
    except (IndexError, ValueError):
        ok = False
    if not ok:
        raise UserError(f"--cases: {text!r}; expected AGG:BAD:KIND[:FACTOR] with AGG one of {BASELINE}, "
                        f"{', '.join(AGGREGATORS)}, BAD 0-3 and KIND one of {', '.join(FAULT_KINDS)}")  # fmt: skip
    return [agg, bad, kind, *factor]


def accuracy_table(cases: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per ``aggregator|bad|kind`` over the seeds: the final test accuracies (%), their mean, sample
    standard deviation, range and the runs that ended in NaN; the mean curve (step, accuracy %)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in cases:
        kind = c["kind"] if c.get("factor", 10.0) == 10.0 else f"{c['kind']} x{c['factor']:g}"
        groups.setdefault(f"{c['aggregator']}|{c['bad']}|{kind}", []).append(c)
    out = {}
    for key, cs in groups.items():
        acc = [100 * c["test_acc"] for c in cs]
        steps = sorted({int(n) for c in cs for n, *_ in c.get("curve", [])})
        curve = [[n, statistics.fmean(100 * a for c in cs for m, a, _ in c["curve"] if int(m) == n)] for n in steps]
        out[key] = {"acc": acc, "mean": statistics.fmean(acc), "sd": statistics.stdev(acc) if len(acc) > 1 else 0.0,
                    "min": min(acc), "max": max(acc), "nan": sum(not c["finite"] for c in cs),
                    "seeds": [c.get("seed", 0) for c in cs], "curve": curve}  # fmt: skip
    clean = out.get("allreduce|0|sign_flip")
    for c in out.values():  # paired by seed: the case's accuracy minus clean all-reduce's on the same seed
        if clean is not None:
            ref = dict(zip(clean["seeds"], clean["acc"], strict=True))
            gap = [a - ref[s] for s, a in zip(c["seeds"], c["acc"], strict=True) if s in ref]
            c["gap"] = gap
            c["gap_mean"] = statistics.fmean(gap) if gap else float("nan")
            c["gap_sd"] = statistics.stdev(gap) if len(gap) > 1 else 0.0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate-mbit", type=float, default=1000.0, help="link rate of the namespaces (0: unshaped)")
    ap.add_argument("--steps", type=int, default=300, help="training steps of every accuracy case")
    ap.add_argument("--seeds", type=int, default=3, help="accuracy launches, seeds 0 .. N-1 (data split, init, order)")
    ap.add_argument("--eval-every", type=int, default=100, help="test accuracy recorded every N steps of each case")
    ap.add_argument("--hidden", type=int, default=256, help="hidden width of the accuracy model")
    ap.add_argument("--timing-hidden", type=int, default=768,
                    help="hidden width of the timed model (768: 648,202 fp32, 2.6 MB of gradient)")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--launches", type=int, default=2, help="launches that time the aggregators")
    ap.add_argument("--skip", action="append", choices=["accuracy", "timing"], default=[], help="leave a part out")
    ap.add_argument("--cases", nargs="+", metavar="AGG:BAD:KIND[:FACTOR]",
                    help="accuracy cases instead of the default grid, e.g. median:1:sign_flip allreduce:1:scale:0")  # fmt: skip
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "robust.json")
    ap.add_argument("--rerecord", action="store_true",
                    help="only rewrite the record from the full run already in --out (e.g. after robust_budget.json)")  # fmt: skip
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    if a.rerecord:
        doc = json.loads(a.out.read_text())
        doc["accuracy"] = accuracy_table(doc["cases"])  # derived figures, recomputed with this file's code
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
        write_record(doc, a.out)
        return 0
    from trainsim.run.robust_worker import BASELINE, RobustRunConfig, run_robust
    from trainsim.transform.opcost import cpu_model

    rate = a.rate_mbit or None
    timing = [BASELINE, *RULES]
    cases = [[agg, bad, "sign_flip"] for bad in (0, 1, 2) for agg in timing]
    cases += [[agg, 1, kind] for kind in ("scale", "random") for agg in timing]
    if a.cases:
        cases = [_case(c) for c in a.cases]
    tcfg = RobustRunConfig(hidden=a.timing_hidden, cases=[], timing=timing, timing_rounds=a.rounds)
    acfgs = [RobustRunConfig(hidden=a.hidden, steps=a.steps, cases=cases, timing=[], timing_rounds=0, seed=seed,
                             eval_every=a.eval_every) for seed in range(a.seeds)]  # fmt: skip
    notes: list[str] = []
    doc: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "machine": f"{cpu_model()}, {os.cpu_count()} vCPUs",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git": _git_rev(),
        "network": f"4 network namespaces, {rate:g} Mbit/s links" if rate else "4 network namespaces, unshaped links",
        "config": asdict(acfgs[0]) if acfgs else None, "timing_config": asdict(tcfg), "notes": notes,
        "seeds": a.seeds, "cases": [], "timing": [],
    }  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with _network(rate, notes) as (net, popen, master):
        if net is None:
            doc["network"] = "loopback"
        if "timing" not in a.skip:
            doc["prediction"] = predict(tcfg, net, popen, master, rate)
            doc["predictions_frozen_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
            a.out.write_text(json.dumps(doc, indent=1) + "\n")  # the predictions, before any run of the model
            doc["timing"] = [run_robust(tcfg, popen=popen, master=master)["timing"] for _ in range(a.launches)]
            doc["measured"] = overheads(doc["timing"])
        if "accuracy" not in a.skip:
            for cfg in acfgs:
                got = run_robust(cfg, popen=popen, master=master, timeout_s=600 + 0.2 * cfg.steps * len(cases))
                doc["cases"] += [{**c, "seed": cfg.seed} for c in got["cases"]]
                a.out.write_text(json.dumps(doc, indent=1) + "\n")
            doc["accuracy"] = accuracy_table(doc["cases"])
    notes += [
        "Krum runs with f = 0, the largest 4 ranks allow (world >= 2f + 3): it keeps the one gradient closest "
        "to its 2 nearest others, with no guarantee for f >= 1.",
        "trimmed_mean with trim = 0.25 on 4 ranks drops one value at each end and averages the two middle "
        "ones: the same numbers as the median (mean of the two middle values); the two differ in code only.",
        "zeno drops 2 of 4 rows every step (it tolerates up to 2 bad ranks), so clean training averages "
        "two gradients; its validation batch is 32 training digits, the same on every rank.",
    ]
    if any(c.get("factor") == 0.0 for c in doc["cases"]):
        notes.append("a case `scale x0` has the bad ranks send zeros: with all-reduce, the mean of the honest "
                     "ranks' gradients times 3/4 (one bad rank): training on the data a robust rule keeps.")  # fmt: skip
    if "prediction" in doc:
        zparts, stream = doc["prediction"]["zeno_parts_us"], doc["prediction"]["rule_times"]["stream_gbps"]
        notes += [
            "4 ranks share this host's 2 vCPUs and saturate them: each CPU millisecond a rank adds (the gather's "
            "socket work over the all-reduce's, the rule) lengthens the step by world / cores = 2 ms; the "
            "prediction is the larger of that and the link-bound estimate.",
            "zeno's predicted compute per step: " + " + ".join(f"{k} {v / 1e3:.2f}" for k, v in zparts.items())
            + f" ms (a row's first pass at {stream:.1f} GB/s: one core's share while every core streams)"
            + ("; forward and rows from GEMMs and adds timed one process per core at once, caches flushed "
               f"(priced alone: forward {alone['forward'] / 1e3:.2f} + rows {alone['rows'] / 1e3:.2f} ms)"
               if (alone := doc["prediction"].get("zeno_parts_alone_us")) else ""),
        ]
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    in_docs = a.out.parent.resolve() == (ROOT / "docs" / "benchmarks").resolve()
    if not a.skip and not a.cases and in_docs:
        write_record(doc, a.out)  # then: python3 dev.py results
    elif a.skip == ["accuracy"] and in_docs and a.out.name != "robust.json" and (a.out.parent / "robust.json").is_file():
        write_record(_with_timing(json.loads((a.out.parent / "robust.json").read_text()), doc, a.out.name),
                     a.out.parent / "robust.json")  # fmt: skip
    print(markdown(doc))
    return 0


TIMING_KEYS = ("prediction", "predictions_frozen_at", "timing", "measured", "timing_config")


def _with_timing(full: dict[str, Any], timing: dict[str, Any], name: str) -> dict[str, Any]:
    """The full run ``full`` (robust.json) with the overhead part of a later timing-only run ``timing``
    (written to ``name``): the record keeps the accuracy of the one and shows the overhead of the other."""
    out = {**full, **{k: timing[k] for k in TIMING_KEYS if k in timing}}
    out["timing_run"] = {"command": timing["command"], "date": timing["date"], "git": timing["git"], "file": name}
    own = ("zeno's predicted compute", "4 ranks share")
    out["notes"] = [n for n in full["notes"] if not n.startswith(own) and n not in timing["notes"]] + timing["notes"]
    return out


def write_record(doc: dict[str, Any], out: Path) -> None:
    """docs/benchmarks/robust.aggregation.json from a full run's ``doc`` (written to ``out``), with the run's
    own date and revision (those of its later timing-only run, ``_with_timing``, when it has one); it names
    robust_budget.json beside ``out`` when that exists."""
    from results import markdown_table, record

    report = markdown(doc)
    last = doc.get("timing_run") or doc
    date = datetime.datetime.fromisoformat(last["date"]).strftime("%Y-%m-%d %H:%M UTC")
    raw = [out.name, *([last["file"]] if "file" in last else []),
           *(["robust_budget.json"] if (out.parent / "robust_budget.json").is_file() else [])]
    command = doc["command"] if last is doc else f"{doc['command']} (accuracy, {doc['date'][:16]}); {last['command']}"
    record("robust", "aggregation", command=command, title=report.splitlines()[0].lstrip("# "),
           headline=markdown_table(report), raw=raw, date=date, rev=last["git"][:7], data={"report": report})  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
