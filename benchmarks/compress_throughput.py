"""Encode+decode throughput and compression ratio of every algorithm, beside PyTorch's hooks' steps.

    .venv/bin/python benchmarks/compress_throughput.py            # 1M, 16M, 64M elements; ~3-6 min
    .venv/bin/python benchmarks/compress_throughput.py --quick    # 1M only, no torch.compile section

Rows: every registered algorithm with its default options and error feedback, and, in the same
run on the same input, the compression steps of PyTorch's ``fp16_compress_hook`` and
``powerSGD_hook`` (rank 1; ops replayed without the collectives, see ``trainsim.compress.bench``).
GB/s counts the fp32 input bytes over encode + decode. A second table measures what
``torch.compile`` buys for an algorithm written as plain tensor code (the few-lines path).
Results go to a record docs/benchmarks/compress.<name>.json.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compress_convergence import OUT_MD, write_section
from trainsim.compress.bench import bench_all


def _compile_rows(numel: int, repeats: int) -> list[str]:
    """Eager vs torch.compile of a user-written (FunctionCodec) scaled-sign and 8-bit quantiser."""
    from trainsim.compress.base import Compressor, FunctionCodec

    def sign_enc(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x >= 0), x.abs().mean().reshape(1)

    def sign_dec(parts: tuple[torch.Tensor, ...] | list[torch.Tensor], n: int) -> torch.Tensor:
        pos, scale = parts
        return torch.where(pos, scale, -scale)

    def q8_enc(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        scale = x.abs().amax().clamp(min=1e-30) / 127
        return torch.round(x / scale).to(torch.int8), scale.reshape(1)

    def q8_dec(parts: tuple[torch.Tensor, ...] | list[torch.Tensor], n: int) -> torch.Tensor:
        q, scale = parts
        return q.float() * scale

    out = []
    x = torch.randn(numel)
    for label, enc, dec in (
        ("scaled sign (bool + fp32)", sign_enc, sign_dec),
        ("int8 max-scaled", q8_enc, q8_dec),
    ):
        times = {}
        for compiled in (False, True):
            comp = Compressor(FunctionCodec(label, enc, dec, compile=compiled), error_feedback=False)
            wire = comp.new_wire(numel)
            y = torch.empty(numel)
            t_first = time.perf_counter()
            comp.compress_into(x, wire, 0)
            comp.decompress_into(wire, y, 0)
            first = time.perf_counter() - t_first
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                comp.compress_into(x, wire, 0)
                comp.decompress_into(wire, y, 0)
                ts.append(time.perf_counter() - t0)
            ts.sort()
            times[compiled] = (ts[len(ts) // 2] * 1e3, first)
        eager, comp_ms = times[False][0], times[True][0]
        auto = FunctionCodec(label, enc, dec, compile="auto")
        auto.wire_bytes(numel)
        picked = "compiled" if auto._fns(numel) is auto._compiled else "eager"
        out.append(f"| {label} | {numel:,} | {eager:.2f} | {comp_ms:.2f} | {eager / comp_ms:.2f}x | "
                   f"{times[True][1]:.1f} | {picked} |")  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    sizes = [1 << 20] if args.quick else [1 << 20, 1 << 24, 1 << 26]
    t0 = time.perf_counter()
    rows = bench_all(sizes=sizes, progress=lambda what: print(what, file=sys.stderr, flush=True))
    lines = [
        "## Encode + decode throughput",
        "",
        f"Command: `.venv/bin/python benchmarks/compress_throughput.py{' --quick' if args.quick else ''}`  ",
        f"Machine: {platform.machine()} {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; date {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC.  ",
        "GB/s = fp32 input bytes / (encode + decode time), medians. Every algorithm with its default "
        "options and error feedback (EF: the residual update is inside encode). The two `torch` rows are "
        "PyTorch's own hooks' compression steps on the same input (powerSGD: the 4096^2-style square matrix).",
        "",
        "| algorithm | elements | EF | encode ms | decode ms | GB/s | wire bytes | ratio |",
        "|---|---:|:-:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['algorithm']} | {r['numel']:,} | {'y' if r['error_feedback'] else 'n'} | {r['encode_ms']:.2f} | "
            f"{r['decode_ms']:.2f} | {r['gbps']:.2f} | {r['wire_bytes']:,} | 1/{1 / r['ratio']:.1f} |"
        )
    if not args.quick:
        lines += [
            "",
            "### torch.compile of user-written codecs (`FunctionCodec(compile=True)`), 16M elements",
            "",
            "| codec | elements | eager ms | compiled ms | speed-up | first call (compile) s | compile='auto' picks |",
            "|---|---:|---:|---:|---:|---:|---|",
            *_compile_rows(1 << 24, 5),
        ]
    lines.append(f"\nTotal benchmark time {time.perf_counter() - t0:.0f} s.")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(OUT_MD, "throughput", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
