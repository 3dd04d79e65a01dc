"""GPU what-if pairs: fp32 -> AMP (bf16 autocast) and unfused -> fused Adam, predicted from the first trace.

    python benchmarks/gpu_whatif.py            # cnn and transformer, 4 pairs, < 8 min on one GPU
    python benchmarks/gpu_whatif.py --quick    # the cnn only

Per pair, in this process on ``cuda:0``: run the first configuration (median of timed steps with a
synchronisation around each, no profiler), then trace a few steps with ``torch.profiler``
(``ProfilerActivity.CPU`` and ``CUDA``); predict the second configuration's step with
``whatifs.amp`` / ``whatifs.fused_optimizer`` on that trace and the simulator (first run's median step
+ simulated change, as ``trainsim validate whatif``) and write every prediction, with its time, to
docs/benchmarks/gpu_whatif.json; only then run the second configurations and add the measurements.
Without a CUDA device it says why and exits 0 (nothing is measured, nothing is written).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "gpu_whatif.json"


@dataclass(frozen=True, kw_only=True, slots=True)
class GpuRun:
    """One GPU training configuration."""

    model: str
    """zoo model: cnn or transformer"""
    batch_size: int
    amp: bool = False
    """bf16 autocast around forward and loss"""
    optimizer: str = "adam-loop"
    """adam-loop (foreach=False) or adam-fused"""
    seq_len: int = 128
    """transformer only"""
    warmup: int = 5
    steps: int = 30
    profiled: int = 5


def pairs(quick: bool) -> list[tuple[str, GpuRun, GpuRun]]:
    """``(what-if, first, second)``: AMP and fused Adam on a CNN and a transformer."""
    firsts = [GpuRun(model="cnn", batch_size=256)] + ([] if quick else [GpuRun(model="transformer", batch_size=64)])
    out = []
    for f in firsts:
        out.append(("amp", f, replace(f, amp=True)))
        out.append(("fused_optimizer", f, replace(f, optimizer="adam-fused")))
    return out


def gpu_unavailable() -> str | None:
    """Why this benchmark cannot run here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}, cuda build {torch.version.cuda or 'none'})"
    return None


def run(cfg: GpuRun, trace: Path | None) -> list[float]:
    """Timed steps (ms) of ``cfg`` on cuda:0; with ``trace``, then a profiled window written there."""
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    from trainsim.capture.profile import _annotate_layers, make_optimizer
    from trainsim.models import zoo

    torch.manual_seed(0)
    model, batch = zoo.build_with_batches(cfg.model, spec=zoo.ZooSpec(batch_size=cfg.batch_size, seq_len=cfg.seq_len))
    _annotate_layers(model)
    model = model.cuda()
    opt = make_optimizer(cfg.optimizer, model.parameters(), 1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    data = [tuple(t.cuda() for t in batch(i)) for i in range(4)]

    def step(i: int) -> None:
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cfg.amp):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss.detach().item()  # the usual per-step sync point

    for i in range(cfg.warmup):
        step(i)
    torch.cuda.synchronize()
    ms = []
    for i in range(cfg.steps):
        t0 = time.perf_counter()
        step(i)
        torch.cuda.synchronize()
        ms.append((time.perf_counter() - t0) * 1e3)
    if trace is not None:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     schedule=schedule(wait=0, warmup=1, active=cfg.profiled, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(str(trace))) as prof:  # fmt: skip
            for i in range(cfg.profiled + 1):
                step(i)
                prof.step()
    return ms


def predict(whatif: str, trace: Path, first_ms: float) -> dict[str, Any]:
    """First run's median step + the what-if's simulated change on its trace (median over the steps)."""
    import numpy as np

    from trainsim.graph.build import load_trace
    from trainsim.simulate.engine import simulate
    from trainsim.transform import whatifs

    g = load_trace(trace)
    g2 = whatifs.amp(g) if whatif == "amp" else whatifs.fused_optimizer(g)
    s1, s2 = simulate(g).step_ms, simulate(g2).step_ms
    ok = np.isfinite(s1) & np.isfinite(s2)
    delta = float(np.median(s2[ok] - s1[ok]))
    return {"predicted_ms": round(first_ms + delta, 3), "simulated_ms": round(float(np.median(s2[ok])), 3),
            "replayed_ms": round(float(np.median(s1[ok])), 3), "simulated_change_ms": round(delta, 3)}  # fmt: skip


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_result(path: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Fill the error statistics of ``doc`` from its measured runs and write it atomically."""
    done = [r for r in doc["runs"] if r.get("measured_ms") is not None]
    for r in done:
        r["error_pct"] = round(100 * (r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"], 2)
    errs = [abs(r["error_pct"]) for r in done]
    doc["mean_abs_error_pct"] = round(sum(errs) / len(errs), 2) if errs else None
    doc["max_abs_error_pct"] = round(max(errs), 2) if errs else None
    tmp = path.with_name(path.name + ".partial")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    reason = gpu_unavailable()
    if reason is not None:
        print(f"gpu_whatif: skipped: {reason}; nothing measured, {args.out} left as it is")
        return 0
    import torch

    t0 = time.monotonic()
    log = lambda s: print(f"{time.monotonic() - t0:6.1f}s {s}", file=sys.stderr)  # noqa: E731
    doc: dict[str, Any] = {"command": f"python benchmarks/gpu_whatif.py{' --quick' if args.quick else ''}",
                           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                           "started_at": _now(), "runs": []}  # fmt: skip
    todo = pairs(args.quick)
    with tempfile.TemporaryDirectory(prefix="trainsim-gpu-whatif-") as work:
        firsts: dict[GpuRun, float] = {}
        traces: dict[GpuRun, Path] = {}
        for i, (whatif, first, second) in enumerate(todo):
            if first not in firsts:
                trace = Path(work) / f"first{i}.json"
                firsts[first] = statistics.median(run(first, trace))
                traces[first] = trace
                log(f"{first.model}: first run {firsts[first]:.2f} ms, traced")
            pred = predict(whatif, traces[first], firsts[first])
            doc["runs"].append({"config": {"whatif": whatif, "first": asdict(first), "second": asdict(second)},
                                "first_measured_ms": round(firsts[first], 3), **pred, "predicted_at": _now(),
                                "measured_ms": None, "measured_at": None})  # fmt: skip
            log(f"{first.model} {whatif}: predicted {pred['predicted_ms']:.2f} ms")
        write_result(args.out, doc)  # every prediction on disk before any second run
        for (whatif, _, second), row in zip(todo, doc["runs"], strict=True):
            row["measured_ms"] = round(statistics.median(run(second, None)), 3)
            row["measured_at"] = _now()
            write_result(args.out, doc)
            log(f"{second.model} {whatif}: measured {row['measured_ms']:.2f} ms, error {row['error_pct']:+.1f} %")
    doc["finished_at"] = _now()
    write_result(args.out, doc)
    print(json.dumps({k: doc[k] for k in ("gpu", "mean_abs_error_pct", "max_abs_error_pct")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
