"""Weight-gradient cost by position: right after each layer's input gradient, or after the whole chain.

    python benchmarks/ooo_w_order.py      # ~30 s, one process

Why it matters: the reordered runtimes (``OooDataParallel`` with k > 0, a zero-bubble stage's deferred
W) compute the weight gradients after the input-gradient chain, input-first, and the per-layer
profile (``trainsim.capture.layerprofile``) is what the what-ifs charge for them. For each zoo model,
steps alternate between the two positions (same process, same data; the first 4 steps are warm-up),
and each layer's W time is the median over its steps. Writes the ``ooo_w_order`` section of
a record docs/benchmarks/ooo.<name>.json.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import record_report, stamp

STEPS = 24
WARMUP = 4


def w_times(model: str, zoo: dict[str, int], batch: int = 32) -> dict[str, list[float]]:
    """Per position ("inline", "after the chain"), each layer's median W time in ms."""
    import torch
    from torch import nn

    from trainsim.models.splitgrad import LayerTape
    from trainsim.models.zoo import ZooSpec, build_with_batches

    torch.set_num_threads(1)
    net, batches = build_with_batches(model, seed=0, spec=ZooSpec(batch_size=batch, **zoo))
    layers = list(net.children())
    loss_fn = nn.CrossEntropyLoss()
    samples: dict[str, list[list[float]]] = {"inline": [], "after the chain": []}
    for step in range(STEPS):
        x, y = batches(step)
        tapes: list[LayerTape] = []
        h = x
        for i, layer in enumerate(layers):
            tapes.append(LayerTape.forward(layer, h, input_grad=i > 0))
            h = tapes[-1].out
        logits = h.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(loss_fn(logits, y), logits)
        mode = "inline" if step % 2 else "after the chain"
        w = [0.0] * len(layers)
        for i in range(len(layers) - 1, -1, -1):
            g_in = tapes[i].backward_input(g)
            if mode == "inline":
                t0 = time.perf_counter()
                tapes[i].backward_weight()
                w[i] = time.perf_counter() - t0
            if g_in is not None:
                g = g_in
        if mode == "after the chain":
            for i in range(len(layers)):
                t0 = time.perf_counter()
                tapes[i].backward_weight()
                w[i] = time.perf_counter() - t0
        for layer in layers:
            layer.zero_grad(set_to_none=True)
        if step >= WARMUP:
            samples[mode].append(w)
    return {m: [1e3 * statistics.median(col) for col in zip(*ws, strict=True)] for m, ws in samples.items()}


def main() -> int:
    head = stamp()
    lines = [
        "## Weight gradients: timed right after their input gradient, or after the whole chain",
        "",
        head,
        f"One process, one thread, batch 32; {STEPS - WARMUP} steps alternating between the two positions, the",
        "median per layer. *After the chain* is the order of the reordered runtimes and, since 2026-11-24,",
        "of the per-layer profile's split steps.",
        "",
        "| model | W inline ms (per layer) | W after the chain ms (per layer) | sum inline ms | sum after ms | ratio |",
        "|---|---|---|---|---|---|",
    ]
    for name, zoo in (("mlp", {}), ("cnn", {}), ("transformer", {"blocks": 4})):
        t = w_times(name, zoo)
        a, b = t["inline"], t["after the chain"]
        lines.append(
            f"| {name} | {' '.join(f'{v:.2f}' for v in a)} | {' '.join(f'{v:.2f}' for v in b)} | "
            f"{sum(a):.2f} | {sum(b):.2f} | {sum(b) / sum(a):.3f}x |"
        )
        print(lines[-1], file=sys.stderr)
    print(record_report("ooo", "w_order", "\n".join(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
