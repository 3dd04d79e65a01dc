"""Accuracy of `trainsim estimate` on Megatron-LM's Table 1, with leave-one-out calibration error.

    python benchmarks/plan_accuracy.py            # all ten rows, fit + leave-one-out (~3-5 min on 2 cores)
    python benchmarks/plan_accuracy.py --quick    # no leave-one-out

Writes the "accuracy" section of the plan records (docs/benchmarks/plan.<name>.json).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from trainsim.plan.calibrate import MEGATRON_TABLE1, errors, fit, load_csv, loo, predict_row
from trainsim.plan.optime import DEFAULT_EFFICIENCY

CSV = Path(__file__).resolve().parents[2] / "shared" / "groundtruth" / "megatron_table1.csv"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip leave-one-out")
    args = ap.parse_args()
    from plan_report import write_section

    rows = load_csv(str(CSV)) if CSV.exists() else MEGATRON_TABLE1
    src = "../shared/groundtruth/megatron_table1.csv" if CSV.exists() else "trainsim.plan.calibrate.MEGATRON_TABLE1"
    t0 = time.perf_counter()
    refit = fit(rows)
    t_fit = time.perf_counter() - t0
    lines = [
        f"Ground truth: {src} (Narayanan et al. SC'21 Table 1; 80-GB A100, Selene).",
        "",
        "Assumptions, the same for every row: GPT with V=51,200, s=2,048, fp16/bf16 mixed precision, full",
        "recomputation, interleaved schedule when pp>1 (1F1B when pp=1), TP inside a node (NVLink 300 GB/s per",
        "direction at 0.65 efficiency), 25 GB/s per GPU between nodes (0.9), scatter/gather p2p, DP all-reduce of",
        "16-bit gradients overlapped with the last backward, ZeRO off, micro-batch size (1..32) and virtual",
        "stages (divisors of layers/pp up to 8) chosen by the estimator as the fastest that fits (not published).",
        "Throughput is hardware TFLOP/s per GPU counting recomputation, i.e. the paper's eq. 3.",
        "Two constants are fitted on the rows (GEMM efficiency curve `gemm_max`, `gemm_half_gflop`); no per-row factor.",
        "",
        f"Shipped constants: gemm_max={DEFAULT_EFFICIENCY.gemm_max}, gemm_half_gflop={DEFAULT_EFFICIENCY.gemm_half_gflop}. "
        f"Refit now: gemm_max={refit.gemm_max}, gemm_half_gflop={refit.gemm_half_gflop} ({t_fit:.1f} s).",
        "",
    ]
    loo_res = loo(rows) if not args.quick else None
    err_fit = errors(rows, DEFAULT_EFFICIENCY)
    lines.append("| params (B) | tp | pp | GPUs | batch | published TF/GPU | predicted | error | chosen mb, schedule | LOO error |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(rows):
        e = predict_row(r)
        lo = f"{100 * loo_res[i][1]:+.1f}%" if loo_res else "-"
        lines.append(
            f"| {r.params_billion:g} | {r.tp} | {r.pp} | {r.gpus} | {r.global_batch} | {r.tflops_per_gpu:g} | "
            f"{e.hardware_tflops_per_gpu:.1f} | {100 * err_fit[i]:+.1f}% | mb{e.strategy.micro_batch} "
            f"{e.strategy.schedule}{'x' + str(e.strategy.virtual_stages) if e.strategy.pp > 1 else ''} | {lo} |"
        )
    lines.append("")
    lines.append(
        f"In-sample: max |error| {100 * np.abs(err_fit).max():.1f}%, mean |error| {100 * np.abs(err_fit).mean():.1f}%."
    )
    if loo_res:
        le = np.array([x[1] for x in loo_res])
        lines.append(
            f"Leave-one-out (refit both constants on the other nine rows, predict the held-out row): "
            f"max |error| {100 * np.abs(le).max():.1f}%, mean |error| {100 * np.abs(le).mean():.1f}%; "
            f"fitted gemm_max ranged {min(x[2].gemm_max for x in loo_res):.3f}-{max(x[2].gemm_max for x in loo_res):.3f}."
        )
    write_section("accuracy", "\n".join(lines))


if __name__ == "__main__":
    main()
