"""What-ifs on the real traces move the way the hardware would: GPU twice as slow never shortens a step,
twice as fast never lengthens one, and where the GPU is the bottleneck both move the step."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from trainsim.graph.build import load_trace
from trainsim.graph.ir import ResourceKind, TaskGraph
from trainsim.simulate.engine import simulate
from trainsim.transform.primitives import scale, select

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
NAMES = sorted(p.name for p in TRACES.glob("*.json.gz")) if TRACES.is_dir() else []
TOL_MS = 0.005  # a few us: replays add floating-point sums in different orders
GPU_BOUND = 0.9  # a step is GPU-bound when the GPU was busy for at least this share of it


def _load(name: str) -> TaskGraph:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_trace(TRACES / name)


def _gpu_busy_ms(g: TaskGraph) -> np.ndarray:
    """Per step, the time some GPU stream was busy in the trace (the union of GPU task intervals)."""
    gpu = np.array([r.kind == ResourceKind.GPU_STREAM for r in g.resources], np.bool_)[g.resource]
    order = np.argsort(g.ts_us[gpu])
    s, e = g.ts_us[gpu][order], (g.ts_us[gpu] + g.dur_us[gpu])[order]
    out = []
    for a, b in zip(g.steps.start_us, g.steps.end_us, strict=True):
        busy, reach = 0.0, a
        for x, y in zip(np.clip(s, a, b), np.clip(e, a, b), strict=True):
            busy += max(0.0, y - max(x, reach))
            reach = max(reach, y)
        out.append(busy / 1e3)
    return np.array(out)


def _scaled_steps(g: TaskGraph, factor: float) -> np.ndarray:
    return simulate(scale(g, select(g, kind=("kernel", "memcpy", "memset", "comm")), factor)).step_ms


@pytest.mark.skipif(not NAMES, reason=f"{TRACES} is absent (CI has the shared traces at ../shared)")
@pytest.mark.parametrize("name", NAMES)
def test_gpu_scaling_moves_every_step_the_right_way(name: str) -> None:
    g = _load(name)
    base = simulate(g).step_ms
    slow, fast = _scaled_steps(g, 2.0), _scaled_steps(g, 0.5)
    assert (slow >= base - TOL_MS).all(), f"GPU x2 shortened a step: {base} -> {slow}"
    assert (fast <= base + TOL_MS).all(), f"GPU x0.5 lengthened a step: {base} -> {fast}"


@pytest.mark.skipif(not (TRACES / "v100_single_rank0.json.gz").exists(), reason=f"{TRACES} is absent")
def test_gpu_bound_steps_move_by_the_gpu_time() -> None:
    """V100: the CPU blocks in launches (CUDA's launch queue is full) while the GPU is busy ~99 % of a step.

    Doubling every GPU task makes a GPU-bound step's GPU work take its busy time again: the step grows
    by at least 90 % of that busy time (the rest is slack the GPU had). Halving saves at least a quarter
    of it (half of the saving if the whole step were GPU time, the CPU's own work being the floor).
    """
    g = _load("v100_single_rank0.json.gz")
    busy = _gpu_busy_ms(g)
    bound = busy >= GPU_BOUND * g.steps.measured_us / 1e3
    assert bound.sum() >= 3, f"expected GPU-bound steps; busy {busy} of {g.steps.measured_us / 1e3} ms"
    base = simulate(g).step_ms
    slow, fast = _scaled_steps(g, 2.0), _scaled_steps(g, 0.5)
    assert (slow - base)[bound].mean() >= 0.9 * busy[bound].mean()
    assert (base - fast)[bound].mean() >= 0.25 * busy[bound].mean()
