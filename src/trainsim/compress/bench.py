"""Encode + decode throughput of every algorithm, beside PyTorch's own hooks' compression steps.

    >>> from trainsim.compress.bench import bench_all
    >>> rows = bench_all(sizes=[1 << 16], repeats=2, algorithms=["onebit"], baselines=False)
    >>> rows[0]["algorithm"], rows[0]["ratio"] > 0
    ('onebit', True)

Throughput counts the fp32 input bytes (4 n) over the time of one encode plus one decode, in
GB/s (1e9 bytes), as ``research/measured_peers.md`` does. Every algorithm runs with its default
options and its default error feedback (whose residual update is part of the timed encode). The
baselines replay, op for op, the compression step of PyTorch's ``fp16_compress_hook``
(``buffer.to(fp16).div_(world)``, then ``buffer.copy_(result)``) and of ``powerSGD_hook``
(error feedback add and clone, ``bmm(M, Q)``, ``_orthogonalize``, ``bmm(M^T, P)``,
``bmm(P, Q^T)``, ``error = copy - M``), without the collectives, on the same input.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from trainsim.compress.base import make, names

DEFAULT_SIZES = [1 << 20, 1 << 24, 1 << 26]  # 1M, 16M, 64M fp32 elements
# options used in the table (defaults of each algorithm unless listed)
DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {"powersgd": {"rank": 1}}


def median_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``fn`` in ms, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench_algorithm(name: str, numel: int, repeats: int, **options: Any) -> dict[str, Any]:
    comp = make(name, **options)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    wire = comp.new_wire(numel)
    out = torch.empty(numel)
    enc_ms = median_ms(lambda: comp.compress_into(x, wire, "g"), repeats)
    dec_ms = median_ms(lambda: comp.decompress_into(wire, out, "g"), repeats)
    total = enc_ms + dec_ms
    return {
        "algorithm": comp.codec.describe() if options else name,
        "numel": numel,
        "error_feedback": comp.error_feedback,
        "encode_ms": enc_ms,
        "decode_ms": dec_ms,
        "gbps": 4 * numel / (total * 1e6),
        "wire_bytes": comp.wire_bytes(numel),
        "ratio": comp.wire_bytes(numel) / (4 * numel),
    }


def bench_torch_fp16(numel: int, repeats: int) -> dict[str, Any]:
    buf = torch.randn(numel, generator=torch.Generator().manual_seed(0))

    def step() -> None:
        compressed = buf.to(torch.float16).div_(1)  # default_hooks._compress_hook, world size 1
        buf.copy_(compressed)  # its decompress callback

    ms = median_ms(step, repeats)
    return {"algorithm": "torch fp16_compress_hook step", "numel": numel, "error_feedback": False,
            "encode_ms": ms, "decode_ms": 0.0, "gbps": 4 * numel / (ms * 1e6),
            "wire_bytes": 2 * numel, "ratio": 0.5}  # fmt: skip


def bench_torch_powersgd(numel: int, repeats: int, rank: int = 1) -> dict[str, Any]:
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _orthogonalize

    side = math.isqrt(numel)
    m = torch.randn(1, side, side, generator=torch.Generator().manual_seed(0))
    error = torch.zeros_like(m)
    p = torch.empty(1, side, rank)
    q = torch.randn(1, side, rank)
    state: dict[str, torch.Tensor] = {"error": error}

    def step() -> None:  # powerSGD_hook.py, one matrix, use_error_feedback=True, warm_start=True
        m.add_(state["error"])
        cp = m.detach().clone()
        torch.bmm(m, q, out=p)
        _orthogonalize(p, 0)
        torch.bmm(m.transpose(1, 2), p, out=q)
        torch.bmm(p, q.transpose(1, 2), out=m)
        state["error"] = cp - m

    ms = median_ms(step, repeats)
    wire = 4 * rank * 2 * side
    return {"algorithm": f"torch powerSGD_hook step (rank {rank})", "numel": side * side,
            "error_feedback": True, "encode_ms": ms, "decode_ms": 0.0,
            "gbps": 4 * side * side / (ms * 1e6), "wire_bytes": wire, "ratio": wire / (4 * side * side)}  # fmt: skip


def bench_all(
    *,
    sizes: Iterable[int] = DEFAULT_SIZES,
    repeats: int | None = None,
    algorithms: Iterable[str] | None = None,
    baselines: bool = True,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per (algorithm, size); PyTorch's steps first when ``baselines``."""
    rows: list[dict[str, Any]] = []
    algos = list(algorithms) if algorithms is not None else [n for n in names() if not n.startswith("test_")]
    for numel in sizes:
        reps = repeats if repeats is not None else (15 if numel <= 1 << 20 else 5 if numel <= 1 << 24 else 3)
        if baselines:
            rows.append(bench_torch_fp16(numel, reps))
            rows.append(bench_torch_powersgd(numel, reps, rank=1))
        for name in algos:
            if progress:
                progress(f"{name} @ {numel}")
            rows.append(bench_algorithm(name, numel, reps, **DEFAULT_OPTIONS.get(name, {})))
    return rows
