"""PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019): rank-r approximation by one power iteration.

    >>> import torch
    >>> from trainsim.compress import make
    >>> c = make("powersgd", rank=2)
    >>> c.wire_bytes(4096 * 4096)                # P (4096 x 2) + Q (4096 x 2), fp32
    65536

As a codec (all-gather, PS and ring schemes; ``compress-bench``) a flat gradient is viewed as a
near-square matrix (like PyTorch's ``batched_powerSGD_hook``) and each rank sends its own P and Q.
The DDP hook (``trainsim.run.hooks``) runs the real two-round algorithm per parameter matrix,
all-reducing P and then Q, with the helpers below.

Algorithm, per matrix M (rows x cols), warm-started Q (cols x r):
  1. P = M Q
  2. P = orthonormal(P)               (r = 1: P / ||P||; else a reduced QR)
  3. Q = M^T P, computed as (P^T M)^T: on this CPU ``M.T @ P`` takes a slow path, 55-60 ms against
     7.5-9 ms for the same product at 4096^2 (``research/measured_peers.md``)
  4. M ~ P Q^T
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from trainsim.compress.base import Codec, Workspace
from trainsim.errors import UserError

# Gram-Schmidt guard of PyTorch's hook (powerSGD_hook.py, orthogonalization_epsilon): avoids 0/0
_EPS = 1e-8


def matrix_shape(numel: int) -> tuple[int, int]:
    """The near-square (rows, cols) a flat gradient is viewed as; rows*cols >= numel."""
    cols = max(1, math.isqrt(numel))
    if cols * cols < numel:
        cols += 1
    rows = (numel + cols - 1) // cols
    return rows, cols


def orthonormalize(p: Tensor) -> None:
    """Orthonormalise the columns of ``p`` (rows x r) in place."""
    if p.shape[1] == 1:
        p.div_(torch.linalg.vector_norm(p) + _EPS)
    else:
        q, _ = torch.linalg.qr(p, mode="reduced")
        p.copy_(q)


def worth_compressing(rows: int, cols: int, rank: int, min_compression_rate: float) -> bool:
    """PyTorch's rule: compress iff (rows + cols) * r * min_compression_rate < rows * cols."""
    r = min(rows, cols, rank)
    return (rows + cols) * r * min_compression_rate < rows * cols


class PowerSGD(Codec):
    """PowerSGD codec: P and Q of a rank-``rank`` approximation; error feedback and warm start on."""

    name = "powersgd"
    default_error_feedback = True
    propagates_nonfinite = True  # P = MQ spreads a NaN/Inf to whole columns
    low_rank = True

    def __init__(self, rank: int = 1, warm_start: bool = True, min_compression_rate: float = 2.0) -> None:
        super().__init__()
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise UserError(f"powersgd: rank={rank!r} is out of range; expected an integer >= 1")
        if not min_compression_rate > 0:
            raise UserError(f"powersgd: min_compression_rate={min_compression_rate!r}; expected > 0")
        self.matrix_rank = rank
        self.warm_start = warm_start
        self.min_compression_rate = min_compression_rate

    def describe(self) -> str:
        return f"powersgd(rank={self.matrix_rank})"

    def _r(self, rows: int, cols: int) -> int:
        return min(rows, cols, self.matrix_rank)

    def wire_bytes(self, numel: int) -> int:
        rows, cols = matrix_shape(numel)
        return 4 * self._r(rows, cols) * (rows + cols)

    def initial_q(self, ws: Workspace, cols: int, r: int, key: int) -> Tensor:
        """Q (cols x r): the same on every rank (shared seed), kept across steps under warm start."""
        q = ws.get("q", cols * r).view(cols, r)
        fresh = "q_ready" not in ws._bufs or not self.warm_start
        if fresh:
            gen = torch.Generator().manual_seed(self.seed * 7919 + key)
            q.copy_(torch.randn(cols, r, generator=gen))
            ws.get("q_ready", 1, torch.bool)
        return q

    def _matrix(self, x: Tensor, ws: Workspace) -> Tensor:
        rows, cols = matrix_shape(x.numel())
        if rows * cols == x.numel():
            return x.view(rows, cols)
        m = ws.get("m", rows * cols, zero=True)
        m[: x.numel()].copy_(x)
        return m.view(rows, cols)

    def encode(self, x: Tensor, wire: Tensor, ws: Workspace, key: int) -> None:
        m = self._matrix(x, ws)
        rows, cols = m.shape
        r = self._r(rows, cols)
        flat = wire.view(torch.float32)
        p = flat[: rows * r].view(rows, r)
        qt = flat[rows * r : (rows + cols) * r].view(r, cols)
        q = self.initial_q(ws, cols, r, key)
        torch.mm(m, q, out=p)
        orthonormalize(p)
        torch.mm(p.t(), m, out=qt)  # (P^T M) = (M^T P)^T: the fast path
        if self.warm_start:
            q.copy_(qt.t())

    def decode(self, wire: Tensor, out: Tensor, ws: Workspace, key: int, *, accumulate: bool = False) -> None:
        rows, cols = matrix_shape(out.numel())
        r = self._r(rows, cols)
        flat = wire.view(torch.float32)
        p = flat[: rows * r].view(rows, r)
        qt = flat[rows * r : (rows + cols) * r].view(r, cols)
        if rows * cols == out.numel():
            dst = out.view(rows, cols)
            if accumulate:
                dst.addmm_(p, qt)
            else:
                torch.mm(p, qt, out=dst)
            return
        full = ws.get("full", rows * cols).view(rows, cols)
        torch.mm(p, qt, out=full)
        if accumulate:
            out.add_(full.view(-1)[: out.numel()])
        else:
            out.copy_(full.view(-1)[: out.numel()])
