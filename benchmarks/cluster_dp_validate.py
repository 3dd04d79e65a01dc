"""Data-parallel step-time prediction vs real 2-process DDP / P3 runs on shaped links.

    python benchmarks/cluster_dp_validate.py            # the full set (14 configurations x 3 passes, ~20 min)
    python benchmarks/cluster_dp_validate.py --quick    # 2 configurations, < 1 min

Runs ``trainsim.validate.dp.run_harness`` (what ``trainsim validate dp`` runs), writes the table to the
``dp_validate`` section of docs/benchmarks/cluster.md, the raw JSON to docs/benchmarks/cluster_dp.json
and the predicted-vs-measured plot to docs/benchmarks/cluster_dp.png. Targets (issue 3): mean |error|
<= 5 %, worst <= 10 %.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_common import DOC, command_line, stamp, write_section


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 5.0), dpi=120)
    meas = [r["measured_ms"] for r in rows]
    pred = [r["predicted_ms"] for r in rows]
    lo, hi = min(meas + pred) * 0.7, max(meas + pred) * 1.4
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="exact")
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.85", label="±10 %")
    marks = {"mlp": "o", "cnn": "s", "transformer": "^"}
    for r in rows:
        c = r["config"]
        color = "tab:blue" if c["mode"] == "ddp" else "tab:orange"
        ax.scatter(r["measured_ms"], r["predicted_ms"], marker=marks.get(c["model"], "x"), color=color, s=30)
    for m, k in marks.items():
        ax.scatter([], [], marker=k, color="0.3", label=m)
    ax.scatter([], [], marker="o", color="tab:blue", label="DDP")
    ax.scatter([], [], marker="o", color="tab:orange", label="P3 runtime")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (ms)")
    ax.set_ylabel("predicted step time (ms)")
    ax.set_title("2-process data parallel on shaped links")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--passes", type=int, default=3, help="runs per configuration (median); 1 with --quick")
    args = ap.parse_args()
    from trainsim.validate.dp import FULL, QUICK, run_harness, summary

    configs = QUICK if args.quick else FULL
    head = stamp(command_line())
    t0 = time.monotonic()
    results, notes = run_harness(
        configs, steps=4 if args.quick else args.steps, warmup=2 if args.quick else 3, reps=3 if args.quick else 5,
        log=lambda s: print(f"{time.monotonic() - t0:7.1f}s {s}", flush=True),
        passes=1 if args.quick else args.passes,
    )  # fmt: skip
    out = summary(results)
    rows = out["runs"]
    tag = "cluster_dp_quick" if args.quick else "cluster_dp"
    (DOC.parent / f"{tag}.json").write_text(json.dumps({**out, "notes": notes}, indent=1))
    png = DOC.parent / f"{tag}.png"
    plot(rows, png)
    lines = [
        "## Data-parallel step time: predicted from a one-process profile vs measured",
        "",
        head,
        "Per configuration: profile one process alone (`trainsim profile`, 1 thread), calibrate the gloo",
        "all-reduce on the emulated link, predict with `data_parallel` + `simulate`, then run real 2-process",
        "training (torch DDP over gloo, or the P3-style runtime of `trainsim.validate.dp_worker`), each process",
        "in its own network namespace, links shaped with tc tbf (+ the delay line for latency; this kernel has",
        "no netem). A run's measurement is its median step time over the measured steps (after warm-up).",
        "*Predicted* includes the co-run factor (the plain loop's step time with 2 copies at once / alone, no",
        "communication), measured during each run (its measured steps alternate with the plain loop on both",
        "ranks, `dp_worker.interleaved`) because the shared host's speed drifts within a minute; *profile",
        "alone* is the prediction from the one-process profile only. Each configuration is",
        "predicted and run once per pass, every configuration of a link once per pass, the passes one after",
        "the other; the table gives the median over the passes of the predictions and of the measurements",
        "(*passes*: each pass's predicted / measured ms).",
        "",
        "| model | link | added latency | mode | predicted ms | measured ms | error | profile alone ms | error | passes (predicted / measured ms) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        c = r["config"]
        rate = "unshaped" if c["rate_mbit"] is None else f"{c['rate_mbit']:g} Mbit/s"
        alone_err = 100 * (r["predicted_alone_ms"] - r["measured_ms"]) / r["measured_ms"]
        lines.append(
            f"| {c['model']} | {rate} | {c['delay_ms']:g} ms | {c['mode']} | {r['predicted_ms']:.1f} | "
            f"{r['measured_ms']:.1f} | {r['error_pct']:+.1f}% | {r['predicted_alone_ms']:.1f} | {alone_err:+.1f}% | "
            + ", ".join(f"{p['predicted_ms']:.1f} / {p['measured_ms']:.1f}" for p in r.get("passes", [])) + " |"
        )
    alone = [abs(100 * (r["predicted_alone_ms"] - r["measured_ms"]) / r["measured_ms"]) for r in rows]
    lines += [
        "",
        f"Profile alone: mean |error| {sum(alone) / len(alone):.2f}%, worst {max(alone):.2f}%.",
        "",
        f"**{len(rows)} configurations: mean |error| {out['mean_abs_error_pct']}%, worst {out['max_abs_error_pct']}%**"
        f" (targets: mean <= 5 %, worst <= 10 %). Plot: `{tag}.png`; raw: `{tag}.json`.",
        f"Wall time {time.monotonic() - t0:.0f} s.",
    ]
    if notes:
        lines += ["", *[f"Note: {n}" for n in notes]]
    lines += ["", f"![predicted vs measured]({tag}.png)"]
    write_section("dp_validate" + ("_quick" if args.quick else ""), "\n".join(lines))
    print(f"mean |error| {out['mean_abs_error_pct']}%, max {out['max_abs_error_pct']}% -> {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
