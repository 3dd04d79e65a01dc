"""Planner benchmarks: plan vs published configs, planning time at scale, the three search methods on
homogeneous and heterogeneous clusters, and a heterogeneous case checked in simulation.

    python benchmarks/plan_search.py           # ~5-10 min on 2 shared cores
    python benchmarks/plan_search.py --quick   # skips the Megatron-row sweep

Writes the "search" section of the plan records (docs/benchmarks/plan.<name>.json).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from trainsim.errors import UserError
from trainsim.plan.calibrate import MEGATRON_TABLE1, predict_row
from trainsim.plan.devices import Cluster, homogeneous, parse_groups
from trainsim.plan.estimate import Estimate, Stages, estimate
from trainsim.plan.search import Result, diff_search, dp_search, exhaustive, plan
from trainsim.plan.simcheck import simulate_plan
from trainsim.plan.workload import Model, Transformer, preset


def timed(fn, *a, **k):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    r = fn(*a, **k)
    return r, time.perf_counter() - t0


def best_line(r: Result) -> str:
    if not r.plans:
        return "no plan"
    e = r.plans[0]
    return f"{e.step_s:.4f} s ({e.strategy.text()}; stages {list(e.stages.bounds)} on groups {list(e.stages.groups)})"


def homogeneous_assumption(model: Model, cluster: Cluster, gb: int) -> tuple[Estimate, str]:
    """Best plan of a planner that assumes every GPU is of one kind (each kind tried, the best kept), then
    placed on the real cluster: stages filled onto the groups in order when a stage fits in one group,
    otherwise every GPU runs at the pace of the slowest kind (synchronous data/tensor parallelism)."""
    best: tuple[Estimate, str] | None = None
    slow = min(cluster.groups, key=lambda g: g.gpu.peak_tflops).gpu
    for grp in cluster.groups:
        assumed = homogeneous(grp.gpu.name, cluster.n_gpus, grp.gpus_per_node)
        try:
            res = plan(model, assumed, global_batch=gb, top_k=10)
        except UserError:
            continue
        for cand in res.plans:
            s = cand.strategy
            per = s.dp * s.tp * s.cp
            left = [g.count for g in cluster.groups]
            groups = []
            for _ in range(s.pp):
                k = next((k for k, c in enumerate(left) if c >= per), None)
                if k is None:
                    break
                left[k] -= per
                groups.append(k)
            if len(groups) == s.pp:
                e = estimate(model, s, cluster, global_batch=gb, stages=Stages(cand.stages.bounds, tuple(groups)))
                how = f"planned for {assumed.describe()}, stages placed in order"
            else:
                e = estimate(model, s, homogeneous(slow.name, cluster.n_gpus, grp.gpus_per_node), global_batch=gb)
                how = f"planned for {assumed.describe()}, a stage spans both kinds: runs at {slow.name} pace"
            if e.fits and (best is None or e.step_s < best[0].step_s):
                best = (e, how)
    assert best is not None
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    from plan_report import write_section

    out: list[str] = []
    # 1. planner vs published configurations -------------------------------------------------------
    if not args.quick:
        out += ["### Best plan vs the published configuration (Megatron-LM Table 1 model/cluster pairs)", "",
                "Both predicted by the same estimate; the published one with micro-batch and virtual stages chosen by",
                "the estimator (see the accuracy section). Search: `exhaustive`, default space.", "",
                "| params (B) | GPUs | published config, samples/s | best plan | samples/s | ratio | search s |",
                "|---|---|---|---|---|---|---|"]
        for r in MEGATRON_TABLE1:
            pub = predict_row(r)
            res, dt = timed(plan, r.model(), homogeneous("a100-80gb", r.gpus), global_batch=r.global_batch)
            b = res.plans[0]
            out.append(f"| {r.params_billion:g} | {r.gpus} | {pub.samples_per_s:.2f} | {b.strategy.text()} | "
                       f"{b.samples_per_s:.2f} | {b.samples_per_s / pub.samples_per_s:.3f} | {dt:.2f} |")
        out.append("")
    # 2. 175B on 1024 GPUs -------------------------------------------------------------------------
    gpt3 = preset("gpt3-175b")
    cl = homogeneous("a100-80gb", 1024)
    from trainsim.plan.calibrate import Row

    # the paper's text: GPT-3 175B on 1,024 GPUs, batch 1,536, tp 8, pp 8 (its Table 1 rows use V=51,200)
    pub175 = predict_row(Row(175.0, 96, 12288, 96, 8, 8, 1024, 1536, 140.0))
    ex, t_ex = timed(exhaustive, gpt3, cl, global_batch=1536)
    dpr, t_dp = timed(dp_search, gpt3, cl, global_batch=1536, max_outer=64)
    out += ["### GPT-3 175B on 1,024 A100-80GB, global batch 1,536", "",
            f"- exhaustive: {t_ex:.2f} s, {ex.evaluated} estimates, {ex.pruned} pruned; best {best_line(ex)}",
            f"- dp (64 most promising outer choices by lower bound; numba JIT compile included on a cold cache): "
            f"{t_dp:.2f} s; best {best_line(dpr)}",
            f"- exhaustive best predicted {ex.plans[0].hardware_tflops_per_gpu:.1f} hardware TFLOP/s/GPU. The paper's "
            f"text reports 140 for its own configuration (tp 8, pp 8, interleaved, full recomputation); the estimate of "
            f"that configuration is {pub175.hardware_tflops_per_gpu:.1f} ({100 * (pub175.hardware_tflops_per_gpu / 140 - 1):+.1f}%; "
            f"{pub175.strategy.text()}), step {pub175.step_s:.2f} s vs the best plan's {ex.plans[0].step_s:.2f} s.", "",
            "Caveat on the planner's gains over published configurations (table above and here): the best plans",
            "often use ZeRO/FSDP or little tensor parallelism, regions Table 1 (TP+PP with full recomputation) does",
            "not cover; FSDP gathers are charged per layer and micro-batch with one-layer prefetch, but how well they",
            "hide is an assumption (`overlap`), so the predicted gains are extrapolations, not validated speed-ups.", ""]
    # 2b. the issue-48 scale cases ------------------------------------------------------------------
    out += ["### Planning time at today's scale", "", "| case | time s | estimates | best plan | step s | model TF/GPU |",
            "|---|---|---|---|---|---|"]
    for name, model, cluster, gb in (
        ("llama3-405b on 16,384 H100, batch 2,048 x 8k", preset("llama3-405b"), homogeneous("h100", 16384), 2048),
        ("deepseek-v3-like (671B MoE) on 2,048 H800, batch 4,096 x 4k", preset("deepseek-v3-like"),
         homogeneous("h800", 2048), 4096),
    ):
        r, dt = timed(plan, model, cluster, global_batch=gb)
        b = r.plans[0]
        out.append(f"| {name} | {dt:.1f} | {r.evaluated} | {b.strategy.text()} | {b.step_s:.2f} | "
                   f"{b.model_tflops_per_gpu:.0f} |")
    out.append("")
    # 3. methods on homogeneous and heterogeneous clusters ----------------------------------------
    small = Transformer(arch="gpt", layers=6, hidden=1024, heads=16, seq=1024, vocab=32000, name="gpt-6L-1024")
    cases = [
        ("gpt-6L-1024 on 4xA100-80GB (2 per node), batch 8", small, parse_groups(["a100-80gb:4"], 2), 8),
        ("gpt-6L-1024 on 2xH100 + 4xA100-40GB (2 per node), batch 8", small,
         parse_groups(["h100:2", "a100-40gb:4"], 2), 8),
        ("gpt3-1.3b on 16xA100-80GB, batch 64", preset("gpt3-1.3b"), homogeneous("a100-80gb", 16), 64),
        ("gpt3-1.3b on 8xH100 + 16xA100-80GB, batch 64", preset("gpt3-1.3b"),
         parse_groups(["h100:8", "a100-80gb:16"]), 64),
    ]
    out += ["### The three methods", "",
            "Same cost model; `exhaustive` on a heterogeneous cluster enumerates every stage cut and GPU-kind",
            "assignment (refused above 400k layouts per outer choice); `diff` relaxes only its 8 outer choices",
            "with the best lower bound (80 Adam steps, 4 restarts, stage counts 1,2,4,8,16,32,max).", "",
            "| case | method | best step s | time s | evaluated | note |", "|---|---|---|---|---|---|"]
    for name, model, cluster, gb in cases:
        for meth, fn, kw in (("exhaustive", exhaustive, {}), ("dp", dp_search, {}), ("diff", diff_search, {"max_outer": 8})):
            try:
                r, dt = timed(fn, model, cluster, global_batch=gb, **kw)
                note = "" if r.plans else "no plan"
                step = f"{r.plans[0].step_s:.4f}" if r.plans else "-"
                out.append(f"| {name} | {meth} | {step} | {dt:.2f} | {r.evaluated} | {note} |")
            except UserError as exc:
                out.append(f"| {name} | {meth} | - | - | - | {str(exc)[:90]} |")
    out.append("")
    # 4. heterogeneous-aware vs homogeneous-assumption, in simulation -----------------------------
    model = preset("gpt3-1.3b")
    cluster = parse_groups(["h100:8", "a100-80gb:16"])
    gb = 64
    het = plan(model, cluster, global_batch=gb, method="dp").plans[0]
    base, how = homogeneous_assumption(model, cluster, gb)
    sim_het = simulate_plan(model, cluster, het, global_batch=gb)
    base_cluster = cluster if len(base.stages.groups) and base.strategy.world <= cluster.n_gpus and "pace" not in how else \
        homogeneous(min(cluster.groups, key=lambda g: g.gpu.peak_tflops).gpu.name, cluster.n_gpus)
    sim_base = simulate_plan(model, base_cluster, base, global_batch=gb)
    out += ["### Heterogeneous case: gpt3-1.3b on 8xH100 + 16xA100-80GB (two 8-GPU node kinds), global batch 64", "",
            f"- heterogeneity-aware (`plan --method dp`): {het.strategy.text()}, stages {list(het.stages.bounds)} on groups "
            f"{list(het.stages.groups)} (0 = H100, 1 = A100): estimate {het.step_s:.4f} s, simulated {sim_het.step_s:.4f} s",
            f"- best plan assuming identical GPUs ({how}): {base.strategy.text()}: estimate {base.step_s:.4f} s, "
            f"simulated {sim_base.step_s:.4f} s",
            f"- margin in simulation: the heterogeneity-aware plan is {100 * (sim_base.step_s / sim_het.step_s - 1):.1f}% "
            f"faster (step time ratio {sim_base.step_s / sim_het.step_s:.3f}).", ""]
    _ = replace
    write_section("search", "\n".join(out))


if __name__ == "__main__":
    main()
