"""Memory model vs memory measured with torch on this CPU (see trainsim.plan.reference for what is measured).

    python benchmarks/plan_memory.py     # ~1-2 min

Writes the "memory" section of the plan records (docs/benchmarks/plan.<name>.json).
"""

from __future__ import annotations

import time

from trainsim.plan.memory import stage_memory
from trainsim.plan.reference import measure
from trainsim.plan.workload import Recompute, Transformer

CASES = [
    # (layers, hidden, heads, seq, vocab, micro_batch)
    (2, 128, 4, 64, 512, 2),
    (4, 256, 8, 128, 1024, 2),
    (4, 384, 6, 256, 2048, 1),
    (6, 512, 8, 128, 4096, 4),
    (2, 768, 12, 512, 8192, 1),
]


def main() -> None:
    from plan_report import write_section

    lines = [
        "What is measured: one training step of a Megatron-style GPT in bf16 on the CPU",
        "(`trainsim.plan.reference`). Activations = bytes of the distinct storages autograd saves for backward",
        "(`torch.autograd.graph.saved_tensors_hooks`, parameters excluded), i.e. what the forward leaves",
        "alive for backward; static = bytes of the real bf16 weights and gradients and the fp32 master",
        "weights and Adam moments after one optimizer step. Predicted = `memory.stage_memory` with pp=1,",
        "tp=1, no ZeRO and no fragmentation/workspace allowance. Not measured: allocator peaks and",
        "temporaries (no CUDA allocator here), pipeline in-flight micro-batches (pp=1 only), TP/SP/ZeRO",
        "sharding (checked against hand-computed cases in tests/plan/test_memory.py instead).",
        "",
        "| model (l, h, a, s, V, mb) | recompute | act. measured MiB | act. predicted MiB | act. error | total measured MiB | total predicted MiB | total error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    worst_act = worst_tot = 0.0
    t0 = time.perf_counter()
    for layers, h, a, s, v, mb in CASES:
        m = Transformer(arch="gpt", layers=layers, hidden=h, heads=a, seq=s, vocab=v)
        costs = m.layer_costs(mb=mb, tp=1, sp=False, cp=1)
        for rc in ("none", "selective", "full"):
            got = measure(m, micro_batch=mb, recompute=rc)
            pred = stage_memory(costs, recompute=Recompute[rc.upper()], schedule="1f1b", stage=0, pp=1, m=1, v=1,
                                zero=0, dp=1, allowance=False)
            tot_m = got["activations"] + got["weights"] + got["grads"] + got["optimizer"]
            tot_p = pred.activations + pred.weights + pred.grads + pred.optimizer
            ea = pred.activations / got["activations"] - 1
            et = tot_p / tot_m - 1
            worst_act, worst_tot = max(worst_act, abs(ea)), max(worst_tot, abs(et))
            mib = 2**20
            lines.append(
                f"| {layers}, {h}, {a}, {s}, {v}, {mb} | {rc} | {got['activations'] / mib:.3f} | "
                f"{pred.activations / mib:.3f} | {100 * ea:+.1f}% | {tot_m / mib:.2f} | {tot_p / mib:.2f} | {100 * et:+.1f}% |"
            )
    lines += [
        "",
        f"Worst |error|: activations {100 * worst_act:.1f}%, total {100 * worst_tot:.1f}% ({time.perf_counter() - t0:.0f} s).",
        "The remaining activation differences are what the model leaves out on purpose: LayerNorm mean/rstd,",
        "token ids and targets, and (selective) the checkpoint's saved block inputs it shares with the Q/K/V term.",
    ]
    write_section("memory", "\n".join(lines))


if __name__ == "__main__":
    main()
