"""Probe: where the batch what-if's change differs from the real one, operator by operator.

    realrun .venv/bin/python benchmarks/probe_batch_ops.py --model cnn --batch 32 --new 96

Runs the configuration for real at both batch sizes (one process, traced, Adam's loop, as
``trainsim validate whatif``'s batch pairs do), predicts the second from the first one's trace with
``whatifs.batch_scale``, and prints per innermost operator the time per step in the first trace, the
what-if, and the second trace, with the ratios. The second trace is read only to compare here; it never
feeds a prediction.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from trainsim.graph.ir import TaskGraph


def per_op_ms(g: TaskGraph) -> dict[str, float]:
    """ms per step of each task name (CPU and runtime tasks, over the graph's traced steps)."""
    from trainsim.graph.ir import TaskKind

    host = np.isin(g.kind, [TaskKind.CPU, TaskKind.RUNTIME]) & (g.step >= 0)
    steps = max(1, len(np.unique(g.step[host])))
    out: dict[str, float] = defaultdict(float)
    for t in np.flatnonzero(host):
        out[g.symbols[int(g.name[t])]] += float(g.dur_us[t]) / 1e3 / steps
    return dict(out)


def main() -> None:
    from trainsim.capture.kineto import read_trace
    from trainsim.graph.build import build_graph
    from trainsim.run.traced import TracedRunConfig, traced_run
    from trainsim.simulate.engine import simulate
    from trainsim.transform import whatifs

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--keep", default=None, help="folder to keep the traces in (default: a temporary one)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tmp = a.keep or scratch
        res = {}
        for b in (a.batch, a.new):
            cfg = TracedRunConfig(model=a.model, world=1, batch_size=b, optimizer="adam-loop", steps=10,
                                  profiled=4, warmup=3, min_timed_s=2.0)  # fmt: skip
            res[b] = traced_run(cfg, Path(tmp) / f"b{b}")
        t1, t2 = res[a.batch]["traces"][0], res[a.new]["traces"][0]
        tr1 = read_trace(t1)
        g1, g2 = build_graph(tr1), build_graph(read_trace(t2))
        _, batch, shapes = whatifs.batch_context(t1, tr1)
        gw = whatifs.batch_scale(g1, a.new / batch, trace=tr1, batch_size=batch, param_shapes=shapes)
        s1, sw, s2 = (float(np.median(simulate(g).step_ms)) for g in (g1, gw, g2))
        m1, m2 = (float(np.median(res[b]["rank_step_ms"][0])) for b in (a.batch, a.new))
    print(f"timed steps: b{a.batch} {m1:.2f} ms, b{a.new} {m2:.2f} ms, ratio {m2 / m1:.3f}")
    print(f"simulated: first {s1:.2f}, what-if {sw:.2f} (ratio {sw / s1:.3f}), second trace {s2:.2f} "
          f"(ratio {s2 / s1:.3f})")  # fmt: skip
    o1, ow, o2 = per_op_ms(g1), per_op_ms(gw), per_op_ms(g2)
    rows = sorted(set(o1) | set(o2), key=lambda k: -max(o2.get(k, 0.0), ow.get(k, 0.0)))
    print(f"{'operator':44s} {'first':>8s} {'what-if':>8s} {'second':>8s} {'r model':>8s} {'r real':>7s} {'diff':>7s}")
    for k in rows[: a.top]:
        x, w, y = o1.get(k, 0.0), ow.get(k, 0.0), o2.get(k, 0.0)
        print(f"{k[:44]:44s} {x:8.2f} {w:8.2f} {y:8.2f} {w / x if x else 0:8.2f} {y / x if x else 0:7.2f} "
              f"{w - y:+7.2f}")  # fmt: skip
    print(f"{'total host':44s} {sum(o1.values()):8.2f} {sum(ow.values()):8.2f} {sum(o2.values()):8.2f}")


if __name__ == "__main__":
    main()
