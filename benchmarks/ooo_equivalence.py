"""Reordered training gives the losses of plain training over 100 steps (single process, DP and pipeline).

    python benchmarks/ooo_equivalence.py           # ~3 min on 2 cores
    python benchmarks/ooo_equivalence.py --steps 20

1. one process: ``OooDataParallel`` without a process group (reverse first-k order, deferred updates:
   the reordered computation alone) vs ``loss.backward(); opt.step()``, for k = 2 and k = all layers;
2. two gloo processes: ``OooDataParallel(k=3)`` vs torch DDP on the same per-rank data;
3. two processes, ZBVZeroBubble (B/W split, 4 microbatches) vs one process on the same global batches.

Writes the ``ooo_equivalence`` section of a record docs/benchmarks/ooo.<name>.json: the largest absolute and relative
loss difference over the run, against the stated tolerance (relative 1e-5; see the section text).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import record_report, stamp

TOL = 1e-5


def _diff(a: list[float], b: list[float]) -> tuple[float, float]:
    ab = max(abs(x - y) for x, y in zip(a, b, strict=True))
    rel = max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))
    return ab, rel


def single_process(model_name: str, k: int | None, steps: int, zoo: dict[str, int]) -> list[float]:
    import torch
    from torch import nn

    from trainsim.models.zoo import ZooSpec, build_with_batches
    from trainsim.run.ooo_dp import OooDataParallel

    torch.set_num_threads(1)
    model, batches = build_with_batches(model_name, seed=0, spec=ZooSpec(batch_size=32, **zoo))
    loss_fn = nn.CrossEntropyLoss()
    out = []
    if k is None:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        for s in range(steps):
            x, y = batches(s)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            out.append(float(loss.detach()))
        return out
    ooo = OooDataParallel(model, k, lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9))
    return [ooo.step(*batches(s), loss_fn) for s in range(steps)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    from trainsim.run.ooo_dp import DpRunConfig, run_dp
    from trainsim.run.pipeline import PipeRunConfig, run_pipeline

    head = stamp()
    steps = args.steps
    rows: list[tuple[str, str, float, float]] = []
    t0 = time.monotonic()
    for name, zoo, n_layers in (("mlp", {}, 4), ("transformer", {"blocks": 2}, 5), ("cnn", {}, 6)):
        plain = single_process(name, None, steps, zoo)
        for k in (2, n_layers):
            ab, rel = _diff(single_process(name, k, steps, zoo), plain)
            rows.append((f"one process, {name}", f"reverse first-{k} (deferred updates) vs plain", ab, rel))
            print(f"{time.monotonic() - t0:6.1f}s {rows[-1]}", file=sys.stderr)
    common = dict(model="transformer", zoo_blocks=2, steps=steps, warmup=0, batch_size=16)
    ddp = run_dp(DpRunConfig(mode="ddp", **common))  # type: ignore[arg-type]
    ooo = run_dp(DpRunConfig(mode="ooo", k=3, **common))  # type: ignore[arg-type]
    for r in range(2):
        ab, rel = _diff(ooo["ranks"][r]["losses"], ddp["ranks"][r]["losses"])
        rows.append((f"2 gloo processes, transformer, rank {r}", "reverse first-3 vs torch DDP", ab, rel))
    print(f"{time.monotonic() - t0:6.1f}s {rows[-1]}", file=sys.stderr)
    cfg = PipeRunConfig(
        model="transformer",
        blocks=2,
        schedule="ZBVZeroBubble",
        stages_per_rank=2,
        microbatches=4,
        batch_size=32,
        split=(2, 1, 1, 1),
        steps=steps,
        warmup=0,
    )
    pp = run_pipeline(cfg)
    plain = single_process("transformer", None, steps, {"blocks": 2})
    ab, rel = _diff(pp["losses"], plain)
    rows.append(("2 gloo processes, transformer", "ZBVZeroBubble, 4 microbatches, vs one process", ab, rel))
    lines = [
        f"## Equivalence: reordered vs plain training over {steps} steps",
        "",
        head,
        "| setting | comparison | max abs loss diff | max rel loss diff | within 1e-5 |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {a} | {b} | {ab:.3g} | {rel:.3g} | {'yes' if rel <= TOL else 'NO'} |" for a, b, ab, rel in rows
    ]
    lines += [
        "",
        "Tolerance: relative 1e-5 on every step's loss. The split backward runs the same kernels as "
        "`loss.backward()` and per-layer SGD applies the same element-wise update, so only the order of "
        "float32 additions can differ (autograd accumulating a parameter used on several paths; the mean "
        "of 4 microbatch means vs one mean over the batch in the pipeline). A few float32 ulps "
        "(~1e-7 relative) per step, compounded through 100 momentum-SGD updates, stays well below 1e-5; a "
        "real ordering bug (a stale weight, a missing gradient) shows up at 1e-3 or more within a few steps.",
    ]
    print(record_report("ooo", "equivalence", "\n".join(lines)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
