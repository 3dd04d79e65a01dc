"""``trainsim estimate`` and ``trainsim plan``: predict one parallelisation, or search for the best.

    $ trainsim estimate --model gpt3-175b --gpu a100-80gb --gpus 1024 --tp 8 --pp 8 --global-batch 1536 \
        --schedule interleaved --virtual-stages 3 --recompute full --json
    $ trainsim estimate --arch llama --layers 32 --hidden 4096 --heads 32 --ffn-hidden 11008 --seq 4096 \
        --vocab 32000 --global-batch 512 --gpu h100 --gpus 64 --tp 2 --pp 1
    $ trainsim plan --model gpt3-175b --gpu a100-80gb --gpus 1024 --global-batch 1536
    $ trainsim plan --model gpt3-1.3b --gpu-group a100-80gb:8 --gpu-group v100-32gb:16 --global-batch 64 --method dp

Without ``--micro-batch`` the estimate tries 1, 2, 4, ... and keeps the fastest that fits (and, for the
interleaved schedule without ``--virtual-stages``, the fastest number of virtual stages).
"""

from __future__ import annotations

import json
from typing import Any

import click

from trainsim.errors import UserError

JSON_OPT = click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout.")


def _model_options(f: Any) -> Any:
    opts = [
        click.option("--model", "preset", default=None, help="A preset (gpt3-175b, llama2-7b, llama2-70b, bert-large, resnet50, vgg19, ...)."),
        click.option("--arch", type=click.Choice(["gpt", "llama", "bert"]), default="gpt", show_default=True),
        click.option("--layers", type=click.IntRange(min=1)),
        click.option("--hidden", type=click.IntRange(min=1)),
        click.option("--heads", type=click.IntRange(min=1)),
        click.option("--kv-heads", type=click.IntRange(min=0), default=0, help="Grouped-query attention (default: = heads)."),
        click.option("--ffn-hidden", type=click.IntRange(min=0), default=0, help="MLP width (default 4h; Llama 8h/3 rounded)."),
        click.option("--seq", type=click.IntRange(min=1)),
        click.option("--vocab", type=click.IntRange(min=1)),
        click.option("--flash-attention", is_flag=True, help="Attention core as one fused kernel."),
        click.option("--experts", type=click.IntRange(min=0), default=None, help="Routed experts per MoE layer (0: dense)."),
        click.option("--top-k", type=click.IntRange(min=1), default=None, help="Experts per token (MoE; default 2)."),
        click.option("--moe-ffn-hidden", type=click.IntRange(min=0), default=None, help="Width of one expert (default: ffn)."),
        click.option("--shared-experts", type=click.IntRange(min=0), default=None, help="Always-on experts per MoE layer."),
        click.option("--capacity-factor", type=click.FloatRange(min=0), default=None,
                     help="Expert capacity / mean load (0: dropless, no padding)."),
        click.option("--dense-layers", type=click.IntRange(min=0), default=None, help="Leading dense layers of an MoE model."),
        click.option("--expert-groups", type=click.IntRange(min=0), default=None,
                     help="Group-limited routing: expert groups (DeepSeek-V3: 8); 0 = none."),
        click.option("--group-top-k", type=click.IntRange(min=0), default=None,
                     help="Group-limited routing: groups a token may use (DeepSeek-V3: 4)."),
        click.option("--ep-dispatch", type=click.Choice(["flat", "node"]), default="flat", show_default=True,
                     help="Expert all-to-all: flat (NCCL all-to-all of every routed copy) or node (one network "
                          "copy per destination node, then NVLink: DeepEP)."),
        click.option("--ep-overlap", is_flag=True,
                     help="Expert all-to-alls run while another micro-batch computes (Megatron-Core moe_a2a_overlap)."),
        click.option("--attn-flops", type=click.Choice(["full", "causal"]), default="full", show_default=True,
                     help="Model-FLOP convention for the attention core: full s x s square (Megatron, PaLM) or the causal half."),
        click.option("--global-batch", type=click.IntRange(min=1), required=True, help="Sequences (or images) per step."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _cluster_options(f: Any) -> Any:
    opts = [
        click.option("--gpu", default=None, help="GPU kind (a100-80gb, a100-40gb, h100, h200, v100-32gb, rtx2080ti ...)."),
        click.option("--gpus", type=click.IntRange(min=1), default=None, help="Number of GPUs."),
        click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True),
        click.option("--cluster", "cluster_file", default=None, help="YAML/TOML file: groups: [{gpu, count, gpus_per_node}]."),
        click.option("--gpu-group", "gpu_groups", multiple=True, help="NAME:COUNT, repeatable (heterogeneous cluster)."),
        click.option("--nic-gbps", type=float, default=None,
                     help="Inter-node bandwidth per GPU per direction, GB/s (400 Gbit/s = 50); default: the GPU's usual node."),
        click.option("--nvlink-gbps", type=float, default=None,
                     help="NVLink bandwidth per GPU per direction, GB/s; default: the GPU's datasheet."),
        click.option("--rail-optimized/--no-rail-optimized", default=True, show_default=True,
                     help="Rail-optimised fabric (GPU i of each node on leaf i) or one top-of-rack switch per node."),
        click.option("--oversubscription", type=float, default=1.0, show_default=True,
                     help="Leaf down-link / up-link bandwidth; traffic crossing the spine gets 1/this of the NIC."),
        click.option("--leaf-nodes", type=click.IntRange(min=1), default=32, show_default=True,
                     help="Nodes under one rail's leaf switch (a DGX SuperPOD scalable unit: 32)."),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def build_model(kw: dict[str, Any]) -> Any:
    from trainsim.plan.workload import Transformer, preset

    if kw.get("preset"):
        from dataclasses import replace

        m = preset(kw["preset"])
        dims = {k: kw[k] for k in ("layers", "hidden", "heads", "seq", "vocab", "kv_heads", "ffn_hidden") if kw.get(k)}
        if dims and not isinstance(m, Transformer):  # they would be ignored
            raise UserError(f"--model {kw['preset']} is not a transformer; "
                            f"{', '.join('--' + k.replace('_', '-') for k in dims)} do not apply to it")  # fmt: skip
        moe = {k: kw[k] for k in _MOE_KEYS if kw.get(k) is not None}
        if moe and not isinstance(m, Transformer):
            raise UserError(f"--model {kw['preset']} is not a transformer; --experts and friends do not apply to it")
        dims |= moe
        if isinstance(m, Transformer):  # the preset with the dimensions given on the command line
            m = replace(m, **dims, name=m.name if not dims else f"{m.name}-custom")
            if kw.get("flash_attention"):
                m = replace(m, flash_attention=True)
        return m
    missing = [f"--{k}" for k in ("layers", "hidden", "heads", "seq", "vocab") if kw.get(k) is None]
    if missing:
        raise UserError(f"missing {', '.join(missing)}; give them or --model PRESET")
    return Transformer(
        arch=kw["arch"], layers=kw["layers"], hidden=kw["hidden"], heads=kw["heads"], kv_heads=kw["kv_heads"] or 0,
        ffn_hidden=kw["ffn_hidden"] or 0, seq=kw["seq"], vocab=kw["vocab"], flash_attention=kw["flash_attention"],
        name=f"{kw['arch']}-custom", **{k: kw[k] for k in _MOE_KEYS if kw.get(k) is not None},
    )


_MOE_KEYS = ("experts", "top_k", "moe_ffn_hidden", "shared_experts", "capacity_factor", "dense_layers", "expert_groups",
             "group_top_k")


def build_cluster(kw: dict[str, Any]) -> Any:
    from trainsim.plan.devices import homogeneous, load_cluster, parse_groups

    given = [f for f, on in (("--cluster", kw.get("cluster_file")), ("--gpu-group", kw.get("gpu_groups")),
                             ("--gpu/--gpus", kw.get("gpu") or kw.get("gpus") is not None)) if on]  # fmt: skip
    if len(given) > 1:  # one would be used and the other dropped unseen
        raise UserError(f"{' and '.join(given)} both describe the cluster; give one of --gpu NAME --gpus N, "
                        "--gpu-group NAME:COUNT, or --cluster FILE")  # fmt: skip
    fabric = {k: kw[k] for k, default in (("rail_optimized", True), ("oversubscription", 1.0), ("leaf_nodes", 32))
              if kw.get(k, default) != default}  # fmt: skip
    if (kw.get("nic_gbps") or kw.get("nvlink_gbps") or fabric) and (kw.get("cluster_file") or kw.get("gpu_groups")):
        raise UserError("--nic-gbps/--nvlink-gbps and the fabric flags apply to --gpu NAME --gpus N only")
    if kw.get("cluster_file"):
        return load_cluster(kw["cluster_file"])
    if kw.get("gpu_groups"):
        return parse_groups(list(kw["gpu_groups"]), kw["gpus_per_node"])
    if not kw.get("gpu") or kw.get("gpus") is None:
        raise UserError("no cluster: give --gpu NAME --gpus N, --gpu-group NAME:COUNT, or --cluster FILE")
    return homogeneous(kw["gpu"], kw["gpus"], kw["gpus_per_node"], nic_gbps=kw.get("nic_gbps"),
                       nvlink_gbps=kw.get("nvlink_gbps"), **fabric)


@click.command("estimate")
@_model_options
@_cluster_options
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--cp", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--micro-batch", type=click.IntRange(min=1), default=None, help="Default: the fastest that fits.")
@click.option("--virtual-stages", type=click.IntRange(min=1), default=None, help="Interleaved schedule chunks per rank.")
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b", "interleaved", "zb"]), default="1f1b", show_default=True)
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default="none", show_default=True)
@click.option("--sequence-parallel", is_flag=True)
@click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True)
@click.option("--placement", type=click.Choice(["tp-cp-dp-pp", "tp-cp-pp-dp"]), default="tp-cp-dp-pp", show_default=True)
@click.option("--ep", type=click.IntRange(min=1), default=1, show_default=True, help="Expert-parallel degree (divides dp).")
@click.option("--reshard-after-forward/--no-reshard-after-forward", default=True, show_default=True,
              help="ZeRO-3: free gathered weights after forward (FSDP FULL_SHARD) or keep them (SHARD_GRAD_OP).")
@click.option("--shard-group", type=click.IntRange(min=0), default=0, show_default=True,
              help="ZeRO-3: shard over this many ranks, replicate across groups (hybrid sharding; 0 = all).")
@click.option("--cp-mode", type=click.Choice(["ring", "allgather"]), default="ring", show_default=True,
              help="Context parallel attention: ring (overlapped) or all-gather of K/V (exposed).")
@click.option("--precision", type=click.Choice(["bf16", "fp8"]), default="bf16", show_default=True,
              help="fp8: linear layers on FP8 tensor cores (Hopper), a what-if with its own efficiency.")
@click.option("--comm-overlap", is_flag=True, help="TP collectives and pipeline sends overlapped with GEMMs (Megatron-Core/NeMo).")
@click.option("--attn-kernel", type=click.Choice(["auto", "fa2", "fa3"]), default="auto", show_default=True,
              help="Fused attention kernel: fa2 (FlashAttention-2, torch SDPA), fa3 (FlashAttention-3 or cuDNN, "
                   "Hopper); auto = the best the GPU has.")
@click.option("--kernels", type=click.Choice(["fused", "eager"]), default="fused", show_default=True,
              help="Elementwise kernels: fused (Megatron-LM, Transformer Engine, torch.compile) or eager (PyTorch's "
                   "reference modules step by step, FP8 casts apart): the what-if of torch.compile.")
@click.option("--explain", is_flag=True, help="Print each time term with its inputs (bytes, links, FLOPs, efficiency).")
@JSON_OPT
def estimate_cmd(as_json: bool, explain: bool, **kw: Any) -> None:
    """Predict step time, throughput and memory of one configuration."""
    from trainsim.plan.estimate import Stages, Strategy, best_micro_batch, estimate, resolve_world
    from trainsim.plan.workload import AttnFlops, Recompute, Transformer

    model = build_model(kw)
    cluster = build_cluster(kw)
    conv = AttnFlops(kw["attn_flops"])
    n = cluster.n_gpus
    dp = resolve_world(n, kw["tp"], kw["pp"], kw["cp"])
    sched = kw["schedule"]
    v = kw["virtual_stages"]
    if v is not None and v > 1 and sched != "interleaved":
        raise UserError(f"--virtual-stages {v} needs --schedule interleaved")
    base = Strategy(
        dp=dp, tp=kw["tp"], pp=kw["pp"], cp=kw["cp"], micro_batch=kw["micro_batch"] or 1, schedule=sched,
        virtual_stages=v or 1, recompute=Recompute[kw["recompute"].upper()],
        sequence_parallel=kw["sequence_parallel"], zero=kw["zero"], placement=kw["placement"], ep=kw["ep"],
        reshard_after_forward=kw["reshard_after_forward"], shard_group=kw["shard_group"], cp_mode=kw["cp_mode"],
        precision=kw["precision"], comm_overlap=kw["comm_overlap"], attn_kernel=kw["attn_kernel"],
        kernels=kw["kernels"], ep_dispatch=kw["ep_dispatch"], ep_overlap=kw["ep_overlap"],
    )
    gb = kw["global_batch"]
    stages = None
    if len(cluster.groups) > 1:
        stages = _fill_stages(model, base, cluster)
    if kw["micro_batch"] is None or (sched == "interleaved" and v is None):
        blocks = model.layers if isinstance(model, Transformer) else model.n_units
        vs = [x for x in range(1, 9) if blocks >= base.pp * x] if sched == "interleaved" and v is None else None
        mbs = (kw["micro_batch"],) if kw["micro_batch"] else (1, 2, 4, 8, 16, 32)
        if stages is None:
            e = best_micro_batch(model, base, cluster, global_batch=gb, candidates=mbs, virtual=vs, attn_flops=conv)
        else:
            e = _best_hetero(model, base, cluster, gb, mbs, vs, stages, conv)
    else:
        e = estimate(model, base, cluster, global_batch=gb, stages=stages, attn_flops=conv)
    _ = Stages
    out = e.to_json()
    out["model"] = getattr(model, "name", "") or "custom"
    out["params"] = model.total_params()
    out["cluster"] = cluster.describe()
    if as_json:
        click.echo(json.dumps(out, separators=(",", ":")))
        return
    _print_estimates([e], title=f"{out['model']} on {cluster.describe()}, global batch {gb}")
    if not e.fits:
        click.echo(f"does not fit: {e.overflow}")
    if explain:
        _print_terms(e)


def _print_terms(e: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    from trainsim.plan.explain import HEADER, term_rows

    t = Table(title=f"where the {e.step_s:.4g} s step goes ({e.strategy.text()}); model FLOPs count attention "
                    f"'{e.attn_flops}': {e.model_flops:.4g} / {e.step_s:.4g} s / {e.gpus_used} GPUs = "
                    f"{e.model_tflops_per_gpu:.1f} TFLOP/s per GPU")  # fmt: skip
    for c in HEADER:
        t.add_column(c, justify="left" if c in ("term", "link", "formula inputs") else "right")
    for r in term_rows(e):
        t.add_row(*r)
    Console(highlight=False, width=220).print(t)


def _fill_stages(model: Any, s: Any, cluster: Any) -> Any:
    """Uniform stages placed on the groups in order (the first group first)."""
    from trainsim.plan.estimate import Stages, uniform_stages

    st = uniform_stages(model, s.pp)
    per = s.dp * s.tp * s.cp
    groups, left = [], [g.count for g in cluster.groups]
    for _ in range(s.pp):
        k = next((k for k, c in enumerate(left) if c >= per), None)
        if k is None:
            raise UserError(f"pp={s.pp} stages of dp*tp*cp = {per} GPUs do not fit in {cluster.describe()}")
        left[k] -= per
        groups.append(k)
    return Stages(st.bounds, tuple(groups))


def _best_hetero(model: Any, base: Any, cluster: Any, gb: int, mbs: Any, vs: Any, stages: Any, conv: Any) -> Any:
    from dataclasses import replace

    from trainsim.plan.estimate import estimate

    best = None
    for mb in mbs:
        if (gb // base.dp) % mb or gb % base.dp:
            continue
        for v in vs or (base.virtual_stages,):
            try:
                e = estimate(model, replace(base, micro_batch=mb, virtual_stages=v), cluster, global_batch=gb, stages=stages,
                             attn_flops=conv)
            except UserError:
                continue
            if best is None or (e.fits, -e.step_s) > (best.fits, -best.step_s):
                best = e
    if best is None:
        return estimate(model, base, cluster, global_batch=gb, stages=stages, attn_flops=conv)
    return best


def _print_estimates(es: list[Any], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for c in ("#", "plan", "step s", "model TF/GPU", "hw TF/GPU", "MFU", "mem GiB", "fits", "bottleneck"):
        t.add_column(c, justify="right" if c not in ("plan", "bottleneck", "fits") else "left")
    for i, e in enumerate(es):
        stages = ""
        if len(set(e.stages.groups)) > 1 or (len(e.stages.groups) and max(e.stages.groups) > 0):
            stages = f" stages={list(e.stages.bounds)} groups={list(e.stages.groups)}"
        t.add_row(
            str(i + 1), e.strategy.text() + stages, f"{e.step_s:.3f}", f"{e.model_tflops_per_gpu:.1f}",
            f"{e.hardware_tflops_per_gpu:.1f}", f"{100 * e.mfu:.1f}%", f"{e.memory_gib_per_gpu:.1f}",
            "yes" if e.fits else "NO", e.bottleneck,
        )
    Console(highlight=False, width=200).print(t)


@click.command("plan")
@_model_options
@_cluster_options
@click.option("--method", type=click.Choice(["exhaustive", "dp", "diff"]), default=None,
              help="Default: exhaustive on one GPU kind, dp on several.")
@click.option("--top", "top_k", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--simulate/--no-simulate", "do_sim", default=True, show_default=True,
              help="Re-check the top plans by simulating their task graph.")
@click.option("--goodput", "by_goodput", is_flag=True,
              help="Rank by samples/s x goodput under failures, trying 1, 1/2, 1/4, 1/8 of the GPUs.")
@click.option("--mtbf-gpu-hours", type=float, default=None, help="With --goodput: one GPU's MTBF, hours.")
@click.option("--checkpoint-s", type=float, default=None, help="With --goodput: seconds to write a checkpoint.")
@click.option("--restart-s", type=float, default=0.0, show_default=True, help="With --goodput: seconds per restart.")
@click.option("--explain", is_flag=True, help="Show the winner's time terms and why it beats the runner-up.")
@JSON_OPT
def plan_cmd(as_json: bool, method: str | None, top_k: int, do_sim: bool, by_goodput: bool, mtbf_gpu_hours: float | None,
             checkpoint_s: float | None, restart_s: float, explain: bool, **kw: Any) -> None:
    """Search for the fastest parallelisation that fits, and rank the top plans."""
    from rich.progress import Progress

    from trainsim.plan.search import Space, plan

    model = build_model(kw)
    cluster = build_cluster(kw)
    if top_k < 1:
        raise UserError(f"--top {top_k}; expected >= 1")
    method = method or ("exhaustive" if len(cluster.groups) == 1 else "dp")
    space = Space(ep_dispatch=kw["ep_dispatch"], ep_overlap=kw["ep_overlap"])
    if as_json:
        res = plan(model, cluster, global_batch=kw["global_batch"], method=method, top_k=top_k, space=space)
    else:
        with Progress(transient=True) as prog:
            task = prog.add_task(f"searching ({method})", total=1)

            def cb(i: int, n: int) -> None:
                prog.update(task, completed=i, total=max(n, 1))

            res = plan(model, cluster, global_batch=kw["global_batch"], method=method, top_k=top_k, space=space,
                       progress=cb)
    gps: list[float] | None = None
    if by_goodput or mtbf_gpu_hours is not None or checkpoint_s is not None:
        gps = _rank_by_goodput(model, cluster, res, kw["global_batch"], method, top_k, by_goodput, mtbf_gpu_hours,
                               checkpoint_s, restart_s, space)  # fmt: skip
    from trainsim.plan.estimate import with_attn_flops
    from trainsim.plan.workload import AttnFlops

    res.plans = [with_attn_flops(e, model, AttnFlops(kw["attn_flops"]), kw["global_batch"]) for e in res.plans]
    sims: list[float | None] = [None] * len(res.plans)
    if do_sim:
        sims = _simulate_all(model, cluster, res.plans, kw["global_batch"])
    if as_json:
        plans = []
        for e, sim in zip(res.plans, sims, strict=True):
            d = e.to_json()
            d["simulated_step_s"] = sim
            plans.append(d)
            if gps is not None:
                d["goodput"] = gps[len(plans) - 1]
                d["effective_samples_per_s"] = e.samples_per_s * gps[len(plans) - 1]
        out = {
            "model": getattr(model, "name", "") or "custom", "params": model.total_params(),
            "cluster": cluster.describe(), "method": res.method, "search_s": res.seconds,
            "evaluated": res.evaluated, "pruned": res.pruned, "plans": plans,
        }
        if explain and len(res.plans) > 1:
            from trainsim.plan.explain import compare, why_text

            out["why"] = why_text(res.plans[0], res.plans[1])
            out["term_differences"] = [{"term": n, "first_s": a, "second_s": b} for n, a, b in compare(*res.plans[:2])]
        click.echo(json.dumps(out, separators=(",", ":")))
        return
    _print_estimates(res.plans, title=f"{getattr(model, 'name', '') or 'model'} on {cluster.describe()} ({method}, {res.seconds:.2f} s, {res.evaluated} evaluated)")
    for i, sim in enumerate(sims):
        if sim is not None:
            click.echo(f"plan {i + 1}: simulated step {sim:.3f} s (analytic {res.plans[i].step_s:.3f} s)")
    for i, g in enumerate(gps or []):
        e = res.plans[i]
        click.echo(f"plan {i + 1}: {e.gpus_used} GPUs, goodput {100 * g:.1f}%, {e.samples_per_s * g:.1f} samples/s under failures")
    if explain:
        _print_terms(res.plans[0])
        if len(res.plans) > 1:
            _print_comparison(res.plans[0], res.plans[1])


def _print_comparison(a: Any, b: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    from trainsim.plan.explain import compare, why_text

    t = Table(title="plan 1 against plan 2, seconds per step")
    for c in ("term", "plan 1", "plan 2", "2 - 1"):
        t.add_column(c, justify="left" if c == "term" else "right")
    for name, sa, sb in compare(a, b):
        t.add_row(name, f"{sa:.4g}", f"{sb:.4g}", f"{sb - sa:+.4g}")
    t.add_row("step", f"{a.step_s:.4g}", f"{b.step_s:.4g}", f"{b.step_s - a.step_s:+.4g}")
    con = Console(highlight=False, width=200)
    con.print(t)
    con.print(why_text(a, b))


def _rank_by_goodput(model: Any, cluster: Any, res: Any, gb: int, method: str, top_k: int, on: bool,
                     mtbf_gpu_hours: float | None, checkpoint_s: float | None, restart_s: float,
                     space: Any) -> list[float]:
    """Re-rank ``res.plans`` (in place) by samples/s x goodput, adding the best plans on 1/2, 1/4, 1/8 of the
    GPUs (fewer GPUs fail less often); goodput from the closed form at the optimum checkpoint interval."""
    from dataclasses import replace

    from trainsim.plan.devices import Cluster
    from trainsim.plan.goodput import GoodputConfig, closed_form_goodput
    from trainsim.plan.search import plan

    if not on or mtbf_gpu_hours is None or checkpoint_s is None:
        raise UserError("--goodput, --mtbf-gpu-hours and --checkpoint-s go together; give all three")
    if len(cluster.groups) != 1:
        raise UserError(f"--goodput ranks plans on one GPU kind; {cluster.describe()} has several")
    g = cluster.groups[0]
    for k in (1, 2, 3):
        n = g.count >> k
        if g.count % (1 << k) or n % g.gpus_per_node or n < g.gpus_per_node:
            break
        try:
            more = plan(model, Cluster(groups=(replace(g, count=n),)), global_batch=gb, method=method, top_k=top_k,
                        space=space)
        except UserError:  # does not fit on fewer GPUs
            break
        res.plans += more.plans
        res.evaluated += more.evaluated
        res.seconds += more.seconds

    def gp(e: Any) -> float:
        return closed_form_goodput(GoodputConfig(step_s=e.step_s, gpus=e.gpus_used, gpus_per_node=g.gpus_per_node,
                                                 mtbf_gpu_hours=mtbf_gpu_hours, checkpoint_s=checkpoint_s,
                                                 restart_s=restart_s))  # fmt: skip

    scored = sorted(((e.samples_per_s * gp(e), i, e) for i, e in enumerate(res.plans)), key=lambda x: (-x[0], x[1]))
    res.plans = [e for _, _, e in scored[:top_k]]
    return [gp(e) for e in res.plans]


def _simulate_all(model: Any, cluster: Any, plans: list[Any], gb: int) -> list[float | None]:
    try:
        from trainsim.plan.simcheck import simulate_plan
    except ImportError:
        return [None] * len(plans)
    out: list[float | None] = []
    for e in plans:
        try:
            out.append(simulate_plan(model, cluster, e, global_batch=gb).step_s)
        except UserError:
            out.append(None)
    return out


estimate = estimate_cmd
plan = plan_cmd
