"""Where the pipeline prediction falls short: the stage computations in a real 2-rank run vs the profile.

    python benchmarks/ooo_pipeline_compute.py      # ~6 min: 2 shaped namespaces, then one process

Part 1, real runs (transformer, 6 blocks, batch 32, 1 Gbit/s): GPipe/1, 1F1B/1, Interleaved1F1B/2 and
ZBVZeroBubble/2 at M = 4 and 16, each run once with two readings of the host's speed
(``PipeRunConfig.host_rounds``). Per rank: the per-layer profile's sum over the rank's compute
actions, scaled to the host's speed read in the run (against the plain loop timed in step with the
profile, ``validate.pipeline.profile_with_reference``) and by the run's co-run factor, against the wall
time and the compute thread's CPU time inside the stages' compute calls
(``compute_ms_per_step``); beside them the step and the time the runtime spends posting its sends and
receives and waiting for them (``p2p_ms_per_step``).

Part 2, one process: each rank's compute order of the same schedules replayed on the same stage
modules (stand-in tensors for the received activations and gradients), paired with the same actions
in microbatch order (F then B, or F, I, W, per microbatch and stage); the ratio of the two, median of
5 pairs. It asks whether the order of the actions (working set, deferred W) changes their cost.

Writes the ``ooo_pipeline_compute`` section of docs/benchmarks/ooo.md.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ooo_common import stamp, write_section

SCHEDULES = (("GPipe", 1), ("1F1B", 1), ("Interleaved1F1B", 2), ("ZBVZeroBubble", 2))
MICROBATCHES = (4, 16)
PAIRS = 5


def _layers(prof: Any, spec: Any, micro: int) -> list[list[int]]:
    """The split ``validate pipeline`` plans (at the profile's speed, on a 1 Gbit/s link)."""
    from trainsim.transform.pipeline import Link, predict_pipeline

    return predict_pipeline(prof, spec, batch_size=micro * spec.microbatches, link=Link(bw_gbps=1.0)).split


def _profile_ms(prof: Any, spec: Any, layers: list[list[int]], micro: int, rank: int) -> float:
    """The per-layer profile's sum over ``rank``'s compute actions (ms)."""
    from trainsim.transform.pipeline import compute_order, stage_costs

    costs = stage_costs(prof, layers, micro)
    by_kind = {"F": costs.fwd_us, "B": costs.bwd_us, "I": costs.bwd_input_us, "W": costs.bwd_weight_us}
    total = 0.0
    for a in compute_order(spec)[rank]:
        for sub in a.sub_actions or (a,):
            total += by_kind[sub.computation_type.value][sub.stage_index]
    return total / 1e3


def real_runs(prof: Any, ref: dict[int, float], case: Any, log: Any) -> list[str]:
    """``ref``: the plain loop's step (ms) per microbatch size at profile time (``main``)."""
    from trainsim.run.pipeline import PipeRunConfig, run_pipeline
    from trainsim.run.ranks import free_port
    from trainsim.transform.pipeline import PipeSpec
    from trainsim.validate.ooo import emulated_link
    from trainsim.validate.pipeline import HOST_ROUNDS, host_reading

    rows = ["| schedule | M | rank | step ms | profile x speed x co-run ms | inside the calls: wall ms | CPU ms | "
            "CPU / profile | posting transfers: wall ms | CPU ms | waiting for transfers ms |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    notes: list[str] = []
    with emulated_link(1000.0, 0.0, notes) as (_net, popen, master):
        for m in MICROBATCHES:
            mb = case.batch_size // m
            for name, spr in SCHEDULES:
                spec = PipeSpec(schedule=name, stages_per_rank=spr, microbatches=m)
                layers = _layers(prof, spec, mb)
                cfg = PipeRunConfig(model=case.model, schedule=name, stages_per_rank=spr, microbatches=m,
                                    batch_size=case.batch_size, split=tuple(len(s) for s in layers),
                                    blocks=case.blocks, steps=8, warmup=2, host_rounds=HOST_ROUNDS)  # fmt: skip
                res = run_pipeline(cfg, popen=popen, master=master, port=free_port())
                alone, together = host_reading([res["ranks"]])
                scale = alone / ref[mb] * max(1.0, together / alone)
                for r in res["ranks"]:
                    inside = r["compute_ms_per_step"]
                    wall = sum(v for k, v in inside.items() if not k.startswith("cpu:"))
                    cpu = sum(v for k, v in inside.items() if k.startswith("cpu:"))
                    pred = _profile_ms(prof, spec, layers, mb, r["rank"]) * scale
                    p2p = r.get("p2p_ms_per_step", {})
                    step = statistics.fmean(r["step_ms"])
                    rows.append(f"| {name}/{spr} | {m} | {r['rank']} | {step:.1f} | {pred:.1f} | {wall:.1f} | {cpu:.1f} | "
                                f"{cpu / pred:.2f}x | {p2p.get('post', 0.0):.1f} | {p2p.get('cpu:post', 0.0):.1f} | "
                                f"{p2p.get('wait', 0.0):.1f} |")  # fmt: skip
                    log(rows[-1])
    return rows + [f"Note: {n}" for n in notes]


def _replay_ms(model: Any, mods: list[Any], ins: list[Any], y: Any, actions: list[Any]) -> float:
    """Run ``actions`` (torch ``_Action``s of one rank) on the stage modules; seconds in them."""
    import torch
    from torch import nn
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    loss_fn = nn.CrossEntropyLoss()
    last = len(mods) - 1
    held: dict[tuple[int, int], tuple[Any, Any]] = {}  # (stage, microbatch) -> (input, output)
    later: dict[tuple[int, int], Any] = {}  # what W needs after I
    t0 = time.perf_counter()
    for a in actions:
        for sub in a.sub_actions or (a,):
            kind, s, m = sub.computation_type.value, sub.stage_index, sub.microbatch_index
            if kind == "F":
                inp = ins[s].detach().clone().requires_grad_(s > 0)
                out = mods[s](inp)
                held[(s, m)] = (inp, loss_fn(out, y) if s == last else out)
                continue
            inp, out = held[(s, m)]
            grad = torch.ones_like(out) if s == last else torch.randn_like(out)
            if kind == "B":
                torch.autograd.backward(out, grad)
            elif kind == "I" and s == 0:  # as in torch's stage: no input gradient; W is the whole backward
                later[(s, m)] = grad
            elif kind == "I":
                _, later[(s, m)] = stage_backward_input([out], [grad], [inp], iter(list(mods[s].parameters())))
            elif kind == "W" and s == 0:
                torch.autograd.backward(out, later.pop((s, m)))
            elif kind == "W":
                stage_backward_weight(iter(list(mods[s].parameters())), later.pop((s, m)))
    took = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    return took


def order_replay(prof: Any, case: Any, log: Any) -> list[str]:
    import torch
    from torch import nn
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    from trainsim.models.zoo import build_with_batches
    from trainsim.run.ooo_dp import zoo_spec
    from trainsim.transform.pipeline import PipeSpec, compute_order

    torch.set_num_threads(1)
    rows = ["| schedule | M | rank | schedule's order / microbatch order (median of 5 pairs) | the pairs |",
            "|---|---|---|---|---|"]  # fmt: skip
    for m in MICROBATCHES:
        mb = case.batch_size // m
        model, batches = build_with_batches(case.model, seed=1, spec=zoo_spec(case.model, mb, case.blocks))
        children = list(model.children())
        x, y = batches(0)
        for name, spr in SCHEDULES:
            spec = PipeSpec(schedule=name, stages_per_rank=spr, microbatches=m)
            layers = _layers(prof, spec, mb)
            mods = [nn.Sequential(*[children[i] for i in ls]) for ls in layers]
            ins = [x]
            with torch.no_grad():
                for mod in mods[:-1]:
                    ins.append(mod(ins[-1]))
            order = compute_order(spec)
            s2r = spec.stage_to_rank()
            for rank, acts in order.items():
                split = any(sub.computation_type.value in ("I", "W") for a in acts for sub in a.sub_actions or (a,))
                kinds = ([_ComputationType.FORWARD, _ComputationType.BACKWARD_INPUT, _ComputationType.BACKWARD_WEIGHT]
                         if split else [_ComputationType.FORWARD, _ComputationType.FULL_BACKWARD])  # fmt: skip
                plain = [_Action(s, k, j) for j in range(m) for s in range(spec.n_stages) if s2r[s] == rank
                         for k in kinds]  # fmt: skip
                _replay_ms(model, mods, ins, y, acts)  # warm-up
                pairs = [_replay_ms(model, mods, ins, y, acts) / _replay_ms(model, mods, ins, y, plain)
                         for _ in range(PAIRS)]  # fmt: skip
                rows.append(f"| {name}/{spr} | {m} | {rank} | {statistics.median(pairs):.3f} | "
                            + " ".join(f"{p:.2f}" for p in pairs) + " |")  # fmt: skip
                log(rows[-1])
    return rows


def main() -> int:
    from trainsim.validate.pipeline import FULL, profile_with_reference

    head = stamp()
    t0 = time.monotonic()

    def log(s: str) -> None:
        print(f"{time.monotonic() - t0:6.1f}s {s}", file=sys.stderr)

    case = FULL
    micro = tuple(sorted({case.batch_size // m for m in MICROBATCHES}))
    # the loop's speed at profile time, timed in step with the profile (as ``validate pipeline``)
    prof, loops = profile_with_reference(case.model, case.blocks, micro, reps=20, zoo=case.zoo())
    ref = {b: statistics.median(v) for b, v in loops.items()}
    lines = [
        "## Pipeline stage computations: real 2-rank runs and one-process replays vs the profile",
        "",
        head,
        "Real runs (1 Gbit/s, one run each, 8 measured steps): the per-layer profile's sum over the rank's",
        "compute actions, scaled to the host's speed read in the run (against the plain loop timed in step",
        "with the profile) and by its co-run factor, against the",
        "wall time and the compute thread's CPU time inside the stages' compute calls, per step; then the",
        "wall and CPU time of the runtime's calls that post its sends and receives (`_batch_p2p`), and the wall",
        "time of its waits for them (`_wait_batch_p2p`), per step (`p2p_ms_per_step` of the runner).",
        "",
        *real_runs(prof, ref, case, log),
        "",
        "One process: each rank's compute order replayed on the same stage modules, against the same",
        "actions in microbatch order, alternating.",
        "",
        *order_replay(prof, case, log),
    ]
    print(write_section("ooo_pipeline_compute", "\n".join(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
