"""Network what-ifs of a real DDP trace against real runs at other link rates (issue 46).

    python benchmarks/whatif_network.py                   # mlp, 2 ranks, 100 Mbit/s, ~6 min
    python benchmarks/whatif_network.py --model cnn --factors 0.5 --repeat 0 --no-random

1. One traced run at ``--base-mbit`` (``trainsim.run.traced``: gloo DDP ranks in shaped network
   namespaces, each writing its Kineto trace).
2. Predictions from rank 0's trace alone, for each link rate ``factor * base``: the command line's
   ``trainsim whatif TRACE --network-bw-factor F`` and ``--network-cluster new.toml --from-cluster old.toml``
   (cluster files with the two link rates). They are written to the output JSON before any other run
   starts, and never changed after.
3. Real runs at those rates (0.25x, 0.5x, 2x, 5x and one factor drawn in [0.25, 5] from a printed
   seed), each measured as the median of its timed steps (rank 0's, the traced rank; the slowest
   rank's window is recorded beside it); the error per rate. A prediction is the median of the
   what-if's simulated steps (the mean, the command's ``whatif_ms``, is recorded beside it). Each
   run's own trace is also replayed without a what-if: its error is the floor that the profiler's
   overhead and the host's load put under any prediction.
4. ``--repeat N`` runs the base configuration N more times: the run-to-run spread of this host.

Writes docs/benchmarks/whatif_network.json (or ``--out``: every figure, with the date, machine and
command) and the result record beside it, ``whatif.network.json`` (``results.record``: the headline table).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRAINSIM = str(Path(sys.executable).parent / "trainsim")


def _cluster_file(folder: Path, mbit: float, name: str) -> Path:
    """A 2-node cluster file whose inter-node link runs at ``mbit`` Mbit/s (GB/s = Mbit/s / 8000)."""
    p = folder / f"{name}.toml"
    p.write_text(f'nodes = 2\ndevices_per_node = 1\ndevice = "this-cpu"\n'
                 f"inter_link = {{ bw_gbyte_s = {mbit / 8000:.9g}, latency_us = 50 }}\n")  # fmt: skip
    return p


def _dump(doc: dict[str, Any], work: Path) -> str:
    """The result as JSON, each trace named relative to the run's folder (which may be temporary)."""

    def rel(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: (str(Path(v).relative_to(work)) if k == "trace" and isinstance(v, str) and v.startswith(str(work))
                        else rel(v)) for k, v in x.items()}  # fmt: skip
        return [rel(v) for v in x] if isinstance(x, list) else x

    return json.dumps(rel(doc), indent=1)


def _markdown(doc: dict[str, Any]) -> str:
    """The docs table of one benchmark run."""
    b = doc["base"]
    lines = [
        "# Network what-if on a real DDP trace vs real runs at other link rates",
        "",
        f"Command: `{doc['command']}`  ",
        f"Machine: {doc['machine']['cpus']} cores, {doc['machine']['platform']}, Python {doc['machine']['python']}  ",
        f"Date: {doc['date']}; predictions frozen at {doc['predictions_frozen_at']}, before the first other run",
        "",
        f"{doc['model']}, {doc['world']} ranks of gloo DDP in network namespaces, traced at {doc['base_mbit']:g} Mbit/s "
        f"(median step {b['median_step_ms']:.1f} ms, its trace simulated {doc['simulated_base_ms']:.1f} ms). Each other "
        "rate is predicted from rank 0's trace alone with `trainsim whatif TRACE --network-bw-factor F` "
        "(`--network-cluster` agrees within 0.5 %), then run; measured: the median of the timed steps (no profiler).",
        "",
        "*trace only*: the what-if's simulated step; *anchored*: the base run's timed step plus the simulated "
        "change (what-if minus replay of the same trace), the protocol of `trainsim validate whatif`, which "
        "cancels the profiler's overhead in the traced steps.",
        "",
        "| factor | Mbit/s | measured ms | trace only ms | error % | anchored ms | error % | run's own trace replayed, error % |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r, p in zip(doc["runs"], doc["predictions"], strict=True):
        lines.append(f"| {p['factor']:g} | {p['rate_mbit']:g} | {r['median_step_ms']:.1f} | "
                     f"{p['predicted_ms_network_bw']:.1f} | {r['error_pct_network_bw']:+.1f} | "
                     f"{p['predicted_ms_anchored']:.1f} | {r['error_pct_anchored']:+.1f} | "
                     f"{r['own_trace_error_pct']:+.1f} |")  # fmt: skip
    errs = [abs(r["error_pct_network_bw"]) for r in doc["runs"]]
    an = [abs(r["error_pct_anchored"]) for r in doc["runs"]]
    sp = doc["spread"]
    lines += [
        "",
        f"Trace only: worst error {max(errs):.1f} %, mean {statistics.mean(errs):.1f} %; anchored: worst "
        f"{max(an):.1f} %, mean {statistics.mean(an):.1f} % (target: each rate from 0.25x to 5x within 10 %: "
        f"{'met' if max(an) <= 10 else 'not met'} anchored, {'met' if max(errs) <= 10 else 'not met'} trace only). "
        "The last column is the floor the profiler and the host's load put under any prediction. "
        "Base configuration run again: "
        f"{', '.join(f'{x:.1f}' for x in sp['base_median_step_ms'])} ms (spread {sp['max_minus_min_pct']:.1f} %). "
        f"Collectives: {doc['predictions'][0]['split']}.",
    ]
    return "\n".join(lines) + "\n"


def _quiet(max_wait_s: float, below: float) -> None:
    """Wait (at most ``max_wait_s``) until the host's 1-minute load is below ``below``: other users' work
    on the 2 cores slows the compute of a run (and of the traced steps) by up to 2.5x."""
    t0 = time.monotonic()
    while os.getloadavg()[0] >= below and time.monotonic() - t0 < max_wait_s:
        time.sleep(5)


def _median_step(doc: dict[str, Any]) -> float:
    """Median over the trace's steps of the simulated step (the statistic the runs are measured by)."""
    return statistics.median(s["simulated_ms"] for s in doc["steps"] if s["simulated_ms"] is not None)


def _whatif(trace: str, *args: str) -> dict[str, Any]:
    out = subprocess.run([TRAINSIM, "whatif", trace, *args, "--json"], capture_output=True, text=True, check=True)
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def _run(cfg: Any, folder: Path) -> dict[str, Any]:
    from trainsim.run.traced import traced_run
    from trainsim.testbed.netns import shaped_ranks

    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    res = traced_run(cfg, folder, network=shaped_ranks)
    rank0 = res["rank_step_ms"][0]
    # the host's 1-minute load before and after: other users' work on the 2 cores slows the compute
    return {"rate_mbit": cfg.rate_mbit, "median_step_ms": statistics.median(rank0), "window_step_ms": res["step_ms"],
            "rank_step_ms": res["rank_step_ms"], "trace": res["traces"][0], "wall_s": time.perf_counter() - t0,
            "load_1min": [load0, os.getloadavg()[0]]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--base-mbit", type=float, default=100.0)
    ap.add_argument("--factors", default="0.25,0.5,2,5", help="link rate factors to predict and run")
    ap.add_argument("--seed", type=int, default=None, help="seed of the random factor (default: from the clock)")
    ap.add_argument("--no-random", action="store_true", help="no random factor")
    ap.add_argument("--repeat", type=int, default=1, help="extra runs of the base configuration (the spread)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "whatif_network.json"))
    ap.add_argument("--keep", default=None, help="folder for the runs' traces (default: a temporary one)")
    ap.add_argument("--quiet-load", type=float, default=0.7, help="before each run, wait for a 1-minute load below this")
    ap.add_argument("--quiet-wait-s", type=float, default=90.0, help="...but at most this long")
    a = ap.parse_args()

    from trainsim.run.traced import TracedRunConfig

    factors = [float(f) for f in a.factors.split(",") if f]
    seed = a.seed if a.seed is not None else int(time.time()) % 100000
    if not a.no_random:
        f = math.exp(random.Random(seed).uniform(math.log(0.25), math.log(5.0)))
        factors.append(round(f, 3))
        print(f"random factor {f:.3f} from seed {seed}", flush=True)
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="whatif_network_"))
    work.mkdir(parents=True, exist_ok=True)

    def cfg(rate: float) -> TracedRunConfig:
        _quiet(a.quiet_wait_s, a.quiet_load)
        return TracedRunConfig(model=a.model, world=a.world, rate_mbit=rate)

    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},  # fmt: skip
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "model": a.model, "world": a.world, "base_mbit": a.base_mbit, "seed": None if a.no_random else seed,
    }  # fmt: skip
    # ---- 1. the base run
    base = _run(cfg(a.base_mbit), work / "base")
    doc["base"] = base
    print(f"base {a.base_mbit:g} Mbit/s: median step {base['median_step_ms']:.1f} ms", flush=True)
    # ---- 2. predictions, frozen before the other runs
    old = _cluster_file(work, a.base_mbit, "old")
    replayed = _median_step(json.loads(subprocess.run([TRAINSIM, "replay", base["trace"], "--json"], capture_output=True,
                                                      text=True, check=True).stdout))  # fmt: skip
    doc["replayed_base_ms"] = replayed
    preds: list[dict[str, Any]] = []
    for f in factors:
        bw = _whatif(base["trace"], "--network-bw-factor", f"{f:g}")
        new = _cluster_file(work, a.base_mbit * f, f"new{f:g}")
        cl = _whatif(base["trace"], "--network-cluster", str(new), "--from-cluster", str(old))
        preds.append({"factor": f, "rate_mbit": a.base_mbit * f, "predicted_ms_network_bw": _median_step(bw),
                      "predicted_ms_network_cluster": _median_step(cl), "mean_ms_network_bw": bw["whatif_ms"],
                      "mean_ms_network_cluster": cl["whatif_ms"], "split": bw.get("comm_split"),
                      # the base run's timed steps plus the simulated change (validate whatif's protocol):
                      # the profiler's overhead in the traced steps cancels
                      "predicted_ms_anchored": base["median_step_ms"] + _median_step(bw) - replayed})  # fmt: skip
    doc["simulated_base_ms"] = bw["baseline_ms"]
    doc["predictions"] = preds
    doc["predictions_frozen_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_dump(doc, work))
    print(f"predictions written to {out} ({preds[0]['split']})", flush=True)
    # ---- 3. the real runs
    runs = []
    for p in preds:
        r = _run(cfg(p["rate_mbit"]), work / f"x{p['factor']:g}")
        err_bw = (p["predicted_ms_network_bw"] - r["median_step_ms"]) / r["median_step_ms"] * 100
        err_cl = (p["predicted_ms_network_cluster"] - r["median_step_ms"]) / r["median_step_ms"] * 100
        err_an = (p["predicted_ms_anchored"] - r["median_step_ms"]) / r["median_step_ms"] * 100
        runs.append({**r, "factor": p["factor"], "error_pct_network_bw": err_bw, "error_pct_network_cluster": err_cl,
                     "error_pct_anchored": err_an})  # fmt: skip
        print(f"x{p['factor']:g} ({p['rate_mbit']:g} Mbit/s): measured {r['median_step_ms']:.1f} ms, predicted "
              f"{p['predicted_ms_network_bw']:.1f} ({err_bw:+.1f} %) / {p['predicted_ms_network_cluster']:.1f} "
              f"({err_cl:+.1f} %)", flush=True)  # fmt: skip
        doc["runs"] = runs
        out.write_text(_dump(doc, work))
    # ---- the noise floor: each run's own trace replayed (no what-if) against its timed steps
    for r in runs:
        own = json.loads(subprocess.run([TRAINSIM, "replay", r["trace"], "--json"], capture_output=True, text=True,
                                        check=True).stdout)  # fmt: skip
        r["own_trace_replay_ms"] = _median_step(own)
        r["own_trace_error_pct"] = (r["own_trace_replay_ms"] - r["median_step_ms"]) / r["median_step_ms"] * 100
    # ---- 4. the spread of the base configuration
    reps = [base["median_step_ms"]]
    for i in range(a.repeat):
        reps.append(_run(cfg(a.base_mbit), work / f"repeat{i}")["median_step_ms"])
    doc["spread"] = {"base_median_step_ms": reps,
                     "max_minus_min_pct": (max(reps) - min(reps)) / statistics.median(reps) * 100}  # fmt: skip
    out.write_text(_dump(doc, work))
    # ---- the table
    print(f"\n{a.model}, {a.world} ranks, traced at {a.base_mbit:g} Mbit/s (median step {base['median_step_ms']:.1f} ms, "
          f"simulated {doc['simulated_base_ms']:.1f} ms); predictions from rank 0's trace only")  # fmt: skip
    print(f"{'factor':>7} {'Mbit/s':>8} {'measured':>9} {'--network-bw-factor':>20} {'err %':>6} {'--network-cluster':>18} "
          f"{'err %':>6} {'own trace':>10} {'err %':>6}")  # fmt: skip
    for r, p in zip(runs, preds, strict=True):
        print(f"{p['factor']:>7g} {p['rate_mbit']:>8g} {r['median_step_ms']:>9.1f} {p['predicted_ms_network_bw']:>13.1f} "
              f"{r['error_pct_network_bw']:>+6.1f} {p['predicted_ms_network_cluster']:>18.1f} "
              f"{r['error_pct_network_cluster']:>+6.1f} {r['own_trace_replay_ms']:>10.1f} {r['own_trace_error_pct']:>+6.1f}")  # fmt: skip
    print("(own trace: the run's own trace replayed without a what-if, the median of its simulated steps: the floor "
          "the profiler and the host's load put under any prediction)")
    print(f"base configuration repeated: {', '.join(f'{x:.1f}' for x in reps)} ms "
          f"(spread {doc['spread']['max_minus_min_pct']:.1f} %)")  # fmt: skip
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from results import markdown_table, record

    md = _markdown(doc)
    record("whatif", "network", command=doc["command"], directory=out.parent, headline=markdown_table(md),
           title=f"Network what-if of a real {a.model} DDP trace vs real runs at other link rates",
           summary=[md.rstrip().splitlines()[-1]], raw=[out.name])  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
