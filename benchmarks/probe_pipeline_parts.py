"""Where a real pipeline step's time goes, against what the model charges for each part.

    realrun .venv/bin/python benchmarks/probe_pipeline_parts.py --schedule GPipe --microbatches 4 --blocks 6 --rate 1000

A diagnosis, not a validation: it profiles the model as ``validate pipeline`` does (step 1), takes the
frozen prediction's split and model terms, then runs the configuration ``--runs`` times
(``run.pipeline`` on the emulated link of ``validate.ooo.emulated_links``) and prints per rank, per
step (ms): the step, the runtime's ``step`` call, the stages' F / B / W calls (wall and the thread's
CPU), posting and waiting for transfers, the rest of the runtime's call (its Python per action), the
optimizer, and beside them the profile's sums for the same actions; page faults and involuntary
context switches per step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def profile_sums(prof: Any, schedule: str, spr: int, m: int, batch: int, split: list[int]) -> dict[int, dict[str, float]]:
    """Per rank, the profile's F, B (B and I), W and optimizer time per step (ms) for its actions."""
    from trainsim.transform.pipeline import PipeSpec, check_split, lowered_order, stage_costs

    spec = PipeSpec(schedule=schedule, stages_per_rank=spr, microbatches=m)
    layers = check_split(split, len(prof.layer_names), spec.n_stages)
    c = stage_costs(prof, layers, batch // m)
    s2r = spec.stage_to_rank()
    out: dict[int, dict[str, float]] = {}
    for r, acts in lowered_order(spec).items():
        acc = {"F": 0.0, "B": 0.0, "W": 0.0, "actions": 0.0}
        for a in acts:
            for sub in a.sub_actions or (a,):
                k, s = sub.computation_type.value, sub.stage_index
                if k == "F":
                    acc["F"] += c.fwd_us[s] / 1e3
                elif k == "B":
                    acc["B"] += c.bwd_us[s] / 1e3
                elif k == "I":
                    acc["B"] += c.bwd_input_us[s] / 1e3
                elif k == "W":
                    acc["W"] += c.bwd_weight_us[s] / 1e3
                acc["actions"] += 1
        acc["optimizer"] = sum(c.opt_us[s] for s in range(spec.n_stages) if s2r[s] == r) / 1e3
        out[r] = acc
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedule", default="GPipe")
    ap.add_argument("--spr", type=int, default=0, help="stages per rank (default: the schedule's least)")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--rate", type=float, default=1000.0, help="Mbit/s; 0: unshaped loopback")
    ap.add_argument("--delay", type=float, default=0.0, help="ms one way")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pin", action="store_true", help="one core per rank (run.ranks.pin_to_core)")
    ap.add_argument("--json", type=Path, help="write every run's per-rank record here")
    a = ap.parse_args()

    from trainsim.run.pipeline import PipeRunConfig, run_pipeline
    from trainsim.run.ranks import free_port
    from trainsim.testbed.machine import load_machine
    from trainsim.testbed.netns import netns_unavailable
    from trainsim.transform.pipeline import SCHEDULES
    from trainsim.validate.ooo import emulated_links
    from trainsim.validate.pipeline import PipeCase, predict_config, profile_case

    spr = a.spr or SCHEDULES[a.schedule].min_spr
    rate = a.rate or None
    case = PipeCase(blocks=a.blocks, pairs=((a.schedule, spr, a.microbatches),), rate_mbit=rate, delay_ms=a.delay)
    mc, _ = load_machine()
    cp = profile_case(case)
    pred = predict_config(case, cp, mc, a.schedule, spr, a.microbatches)
    print(f"{a.schedule}/{spr} M={a.microbatches} x{a.blocks} rate {rate} delay {a.delay}: predicted "
          f"{pred['predicted_ms']:.2f} ms, split {pred['split']}, terms {json.dumps(pred['model_terms'])}")  # fmt: skip
    sums = profile_sums(cp.prof, a.schedule, spr, a.microbatches, case.batch_size, pred["split"])
    shaped = netns_unavailable() is None and rate is not None
    records = []
    with emulated_links(shaped) as link:
        for i in range(a.runs):
            popen, master = link(rate, a.delay)
            cfg = PipeRunConfig(schedule=a.schedule, stages_per_rank=spr, microbatches=a.microbatches, blocks=a.blocks,
                                split=tuple(pred["split"]), steps=a.steps, warmup=a.warmup, pin=a.pin)  # fmt: skip
            got = run_pipeline(cfg, popen=popen, master=master, port=free_port())
            print(f"run {i}: window {got['step_ms']:.2f} ms, median {got['step_median_ms']:.2f}, min {got['step_min_ms']:.2f}")
            for r in got["ranks"]:
                c, p, u = r["compute_ms_per_step"], r["p2p_ms_per_step"], r.get("rusage_per_step", {})
                c = {**c, **r.get("step_parts_ms_per_step", {})}
                fbw = sum(c.get(k, 0.0) for k in "FBW")
                rest = c.get("runtime", 0.0) - fbw - p.get("post", 0.0) - p.get("wait", 0.0)
                ps = sums[r["rank"]]
                print(f"  rank {r['rank']}: step {statistics.fmean(r['step_ms']):.2f} runtime {c.get('runtime', 0):.2f} "
                      f"F {c.get('F', 0):.2f}/{c.get('cpu:F', 0):.2f} (prof {ps['F']:.2f}) "
                      f"B {c.get('B', 0):.2f}/{c.get('cpu:B', 0):.2f} (prof {ps['B']:.2f}) "
                      f"W {c.get('W', 0):.2f}/{c.get('cpu:W', 0):.2f} (prof {ps['W']:.2f}) "
                      f"post {p.get('post', 0):.2f} wait {p.get('wait', 0):.2f} rest {rest:.2f} ({ps['actions']:.0f} actions) "
                      f"opt {c.get('optimizer', 0):.2f} (prof {ps['optimizer']:.2f}) "
                      f"minflt {u.get('minor_faults', 0):.0f} nivcsw {u.get('involuntary_switches', 0):.0f}")  # fmt: skip
            records.append({"run": i, "step_ms": got["step_ms"], "ranks": got["ranks"]})
    if a.json:
        a.json.write_text(json.dumps({"prediction": pred, "profile_sums": sums, "runs": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
