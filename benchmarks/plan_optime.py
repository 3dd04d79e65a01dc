"""Operator-time models on operators they were not fitted on: roofline-with-efficiency vs learned regression.

    python benchmarks/plan_optime.py      # ~1 min: profiles ~240 torch ops on this CPU

Both models are fitted to operator times profiled here (fp32 torch on the CPU: GEMMs, attention-shaped
batched matmuls, elementwise ops) and scored on held-out operators: (a) a random 30% split, (b) the
largest 25% of operators by FLOPs/bytes held out (extrapolation in size). Writes the "optime" section of
docs/benchmarks/plan.md. The A100 constants used by `trainsim estimate` are calibrated separately
against published end-to-end measurements (the "accuracy" section); no GPU is available here.
"""

from __future__ import annotations

import time

import numpy as np

from trainsim.plan.optime import LearnedOpModel, fit_roofline, profile_ops, synthetic_ops
from trainsim.plan.workload import OpKind


def score(pred: np.ndarray, y: np.ndarray) -> str:
    ape = np.abs(pred / y - 1)
    return f"median {100 * np.median(ape):.1f}%, mean {100 * ape.mean():.1f}%, p90 {100 * np.quantile(ape, 0.9):.1f}%"


def main() -> None:
    import torch

    from plan_report import write_section

    torch.set_num_threads(1)
    ops = synthetic_ops(seed=0, n=240)
    t0 = time.perf_counter()
    y = np.array(profile_ops(ops, repeats=7))
    t_prof = time.perf_counter() - t0
    y2 = np.array(profile_ops(ops, repeats=7))  # a second pass: the measurement noise floor
    rng = np.random.default_rng(1)
    idx = rng.permutation(len(ops))
    splits = {"random 70/30": (idx[: int(0.7 * len(ops))], idx[int(0.7 * len(ops)) :])}
    size = np.array([o.flops if o.kind != OpKind.MEM else o.bytes * 10 for o in ops])
    big = np.zeros(len(ops), bool)
    for k in OpKind:
        sel = np.array([o.kind == k for o in ops])
        if sel.any():
            big |= sel & (size >= np.quantile(size[sel], 0.75))
    splits["largest 25% held out"] = (np.flatnonzero(~big), np.flatnonzero(big))
    lines = [
        f"{len(ops)} operators profiled with torch (fp32, 1 thread, fastest of 7) in {t_prof:.1f} s.",
        f"Noise floor: a second profiling pass of the same operators differs from the first by {score(y2, y)}.",
        "",
        "| split | model | held-out error |",
        "|---|---|---|",
    ]
    for name, (tr, te) in splits.items():
        tr_ops = [ops[i] for i in tr]
        te_ops = [ops[i] for i in te]
        lm = LearnedOpModel.fit(tr_ops, y[tr])
        rf = fit_roofline(tr_ops, y[tr])
        lines.append(f"| {name} | learned (ridge on log features) | {score(lm.predict_s(te_ops), y[te])} |")
        lines.append(
            f"| {name} | roofline (peak {rf.peak_flops / 1e9:.0f} GFLOP/s, {rf.bw_bytes / 1e9:.1f} GB/s, half-size "
            f"{rf.half_flops / 1e6:.1f} MFLOP) | {score(rf.predict_s(te_ops), y[te])} |"
        )
    lines += ["", "Per-operator timings on a shared 2-core VM are noisy; the lead re-runs this on a quiet machine."]
    write_section("optime", "\n".join(lines))


if __name__ == "__main__":
    main()
