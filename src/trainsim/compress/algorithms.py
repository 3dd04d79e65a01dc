"""The built-in algorithms: HiPress's five, the usual peers, and plain casts.

    >>> import torch
    >>> from trainsim.compress import make
    >>> c = make("topk", ratio=0.01)
    >>> c.wire_bytes(1_000_000)                 # 10,000 fp32 values + 10,000 int32 indices
    80000

Every codec writes into a caller-owned wire buffer and decodes into a caller-owned output; scratch
lives in the per-gradient ``Workspace`` so that a training step allocates (almost) nothing.
Wire layouts (little-endian, offsets in bytes; n elements, k kept, b bits):

=================  =========================================  ==================================
name               wire                                        bytes
=================  =========================================  ==================================
none               fp32 values                                 4n
fp16 / bf16        16-bit values                               2n
onebit             mean(x>=0), mean(x<0) fp32; 1 bit/elem      8 + ceil(n/8)
signsgd            1 bit/elem                                  ceil(n/8)
efsignsgd          scale = mean|x| fp32; 1 bit/elem            4 + ceil(n/8)
tbq                threshold fp32; 2 bits/elem                 4 + ceil(n/4)
terngrad           max|x| fp32; 2 bits/elem                    4 + ceil(n/4)
terngrad_minmax    min, max fp32; b bits/elem                  8 + ceil(n*b/8)
qsgd               ||v||_2 fp32 per bucket of d; b bits/elem   4 ceil(n/d) + ceil(n*b/8)
topk, dgc,         k fp32 values, then k int32 indices         8k
graddrop
randomk            k fp32 values (indices from a shared seed)  4k
powersgd           P (r x rows) and Q (r x cols) fp32          4r(rows + cols)
=================  =========================================  ==================================

Why one module: it is a table of small codecs (20-80 lines each) whose wire layouts are documented
together above and which share the private helpers and bases (``_pad``, ``_header``, ``_dither``,
``_Sign``, ``_Quant``, ``_Sparse``); ``_register_builtins`` registers them as one set.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from trainsim.compress.base import Codec, Workspace, register
from trainsim.compress.bits import pack_codes, packed_bytes, per_byte, unpack_table
from trainsim.errors import UserError


def _pad(n: int, bits: int) -> int:
    """n rounded up to whole bytes of b-bit codes (what ``pack_codes`` reads)."""
    per = per_byte(bits)
    return (n + per - 1) // per * per


def _check_ratio(name: str, ratio: float) -> float:
    if not (isinstance(ratio, int | float) and 0.0 < float(ratio) <= 1.0):
        raise UserError(f"{name}: ratio={ratio!r} is out of range; expected 0 < ratio <= 1")
    return float(ratio)


def _check_bits(name: str, bits: int, allowed: tuple[int, ...]) -> int:
    if bits not in allowed:
        raise UserError(f"{name}: bits={bits!r} is not supported; expected one of {allowed}")
    return int(bits)


def _kept(numel: int, ratio: float) -> int:
    return max(1, min(numel, math.ceil(numel * ratio)))


def _l1(x: Tensor, ws: Workspace) -> Tensor:
    """sum |x| (abs into a reused buffer, then sum: ~2x faster here than vector_norm(x, 1))."""
    a = ws.get("abs", x.numel())
    torch.abs(x, out=a)
    return a.sum()


def _dither(ws: Workspace, n: int, gen: torch.Generator) -> Tensor:
    """n uniform random bytes (8-bit dither for stochastic rounding).

    Drawing 64 random bits per 8 elements is ~6x faster than ``uniform_`` on this CPU; 8 bits of
    dither bias each rounding by at most 1/512 of a level. ``gen`` is a CPU generator: for a
    gradient on another device the bits are drawn on the host and copied (the same dither as on CPU).
    """
    words = ws.get("dither", (n + 7) // 8, torch.int64)
    if words.device.type == "cpu":
        words.random_(-(1 << 63), (1 << 63) - 1, generator=gen)
    else:  # an asynchronous copy from pageable memory is staged before it returns: host may go
        host = torch.empty(words.numel(), dtype=torch.int64)
        words.copy_(host.random_(-(1 << 63), (1 << 63) - 1, generator=gen), non_blocking=True)
    return words.view(torch.uint8)[:n]


def _randint(high: int, count: int, gen: torch.Generator, device: torch.device) -> Tensor:
    """``count`` int64 draws in [0, high) from the CPU generator ``gen``, on ``device``."""
    return torch.randint(high, (count,), generator=gen).to(device, non_blocking=True)


def _header(wire: Tensor, count: int) -> Tensor:
    return wire[: 4 * count].view(torch.float32)


# ---- dense casts -------------------------------------------------------------------------------


class _Cast(Codec):
    summable = True
    propagates_nonfinite = True
    target: torch.dtype = torch.float32

    def wire_bytes(self, numel: int) -> int:
        return numel * torch.empty((), dtype=self.target).element_size()

    def encode(self, x: Tensor, wire: Tensor, ws: Workspace, key: int) -> None:
        wire.copy_(x)

    def decode(self, wire: Tensor, out: Tensor, ws: Workspace, key: int, *, accumulate: bool = False) -> None:
        if accumulate:
            out.add_(wire)
        else:
            out.copy_(wire)


class NoCompression(_Cast):
    """fp32 as is: the uncompressed baseline."""

    name = "none"
    wire_dtype = torch.float32
    target = torch.float32


class Fp16(_Cast):
    """Cast to IEEE half (like ``fp16_compress_hook``); overflow beyond 65504 becomes inf (propagated)."""

    name = "fp16"
    wire_dtype = torch.float16
    target = torch.float16


class Bf16(_Cast):
    """Cast to bfloat16 (like ``bf16_compress_hook``): fp32's range, 8 bits of mantissa."""

    name = "bf16"
    wire_dtype = torch.bfloat16
    target = torch.bfloat16


# ---- 1-bit -------------------------------------------------------------------------------------


class _Sign(Codec):
    header = 0

    def wire_bytes(self, numel: int) -> int:
        return 4 * self.header + packed_bytes(numel, 1)

    def _signs(self, x: Tensor, wire: Tensor, ws: Workspace) -> Tensor:
        n = x.numel()
        neg = ws.get("neg", _pad(n, 1), torch.bool, zero=True)  # the tail stays False
        torch.lt(x, 0, out=neg[:n])
        pack_codes(
            neg.view(torch.uint8),
            1,
            wire[4 * self.header :],
            scratch=ws.get("pack", neg.numel(), torch.uint8),
        )
        return neg[:n]

    def _values(self, wire: Tensor) -> Tensor:
        raise NotImplementedError

    def decode(self, wire: Tensor, out: Tensor, ws: Workspace, key: int, *, accumulate: bool = False) -> None:
        scratch = ws.get("dec", _pad(out.numel(), 1)) if accumulate else None
        packed = wire[4 * self.header :]
        index = ws.get("index", packed.numel(), torch.int64)
        unpack_table(packed, self._values(wire), 1, out, scratch=scratch, index=index, accumulate=accumulate)


class OneBit(_Sign):
    """1-bit SGD (Seide et al., Interspeech 2014): sign plus the mean of each sign's values.

    Decode gives ``mean(x[x>=0])`` where x>=0 and ``mean(x[x<0])`` elsewhere (GRACE's form; the
    public HiPress code has no onebit kernel). Error feedback is on by default, as in the paper.
    """

    name = "onebit"
    header = 2
    default_error_feedback = True
    propagates_nonfinite = True  # the means are NaN/Inf, and so is every decoded value

    def encode(self, x: Tensor, wire: Tensor, ws: Workspace, key: int) -> None:
        neg = self._signs(x, wire, ws)
        n = x.numel()
        total = x.sum()
        l1 = _l1(x, ws)
        n_neg = torch.count_nonzero(neg)  # ~10x faster than neg.sum() on bools here
        mean_pos = (total + l1) * 0.5 / (n - n_neg).clamp(min=1)
        mean_neg = (total - l1) * 0.5 / n_neg.clamp(min=1)
        _header(wire, 2).copy_(torch.stack([mean_pos, mean_neg]))

    def _values(self, wire: Tensor) -> Tensor:
        return _header(wire, 2)  # code 0 -> mean_pos, code 1 -> mean_neg


_PLUS_MINUS_ONE: dict[torch.device, Tensor] = {}  # signSGD's decode table, by device


class SignSGD(_Sign):
    """signSGD (Bernstein et al., ICML 2018): one bit, decoded as +1 / -1 (scale by the learning rate)."""

    name = "signsgd"

    def encode(self, x: Tensor, wire: Tensor, ws: Workspace, key: int) -> None:
        self._signs(x, wire, ws)

    def _values(self, wire: Tensor) -> Tensor:
        values = _PLUS_MINUS_ONE.get(wire.device)
        if values is None:  # made once per device (a tensor from a list is a blocking copy on CUDA)
            values = _PLUS_MINUS_ONE[wire.device] = torch.tensor([1.0, -1.0], device=wire.device)
        return values


class EFSignSGD(_Sign):
    """EF-signSGD (Karimireddy et al., ICML 2019): ``mean|x| * sign(x)`` with error feedback."""

    name = "efsignsgd"
    header = 1
    default_error_feedback = True
    propagates_nonfinite = True  # the scale is NaN/Inf

    def encode(self, x: Tensor, wire: Tensor, ws: Workspace, key: int) -> None:
        self._signs(x, wire, ws)
        _header(wire, 1).copy_(_l1(x, ws).reshape(1) / x.numel())

    def _values(self, wire: Tensor) -> Tensor:
        scale = _header(wire, 1)
        return torch.cat([scale, -scale])


# ---- b-bit quantisers --------------------------------------------------------------------------


class _Quant(Codec):
    bits = 2
    header = 1

    def wire_bytes(self, numel: int) -> int:
        return 4 * self.header + packed_bytes(numel, self.bits)

    def _codes(self, ws: Workspace, n: int) -> Tensor:
        return ws.get("codes", _pad(n, self.bits), torch.uint8, zero=True)

    def _pack(self, codes: Tensor, wire: Tensor, ws: Workspace) -> None:
        pack_codes(
            codes, self.bits, wire[4 * self.header :], scratch=ws.get("pack", codes.numel(), torch.uint8)
        )

    def _values(self, wire: Tensor) -> Tensor:
        raise NotImplementedError

    def decode(self, wire: Tensor, out: Tensor, ws: Workspace, key: int, *, accumulate: bool = False) -> None:
        scratch = ws.get("dec", _pad(out.numel(), self.bits)) if accumulate else None
        packed = wire[4 * self.header :]
        unpack_table(
            packed,
            self._values(wire),
            self.bits,
            out,
            index=ws.get("index", packed.numel(), torch.int64),
            scratch=scratch,
            accumulate=accumulate,
        )

    def _stochastic_codes(
        self, x: Tensor, ws: Workspace, key: int, offset: Tensor, scale: Tensor, top: int, random: bool
    ) -> Tensor:
        """codes = clamp(floor((x - offset) * scale + U[0,1)), 0, top) as uint8 (unbiased rounding)."""
        n = x.numel()
        f = ws.get("f", n)
        torch.sub(x, offset, out=f)
        f.mul_(scale)
        if random:
            f.add_(_dither(ws, n, self.generator(key, shared=False)), alpha=1 / 256)
            f.add_(1 / 512).floor_()
        else:
            f.round_()
        f.clamp_(0, top)
        f.nan_to_num_(0.0)  # NaN/Inf show in the header (offset/scale), never as garbage codes
        codes = self._codes(ws, n)
        codes[:n].copy_(f)
        return codes


class _Ternary(_Quant):
    """2-bit codes of ``{-s, 0, +s}``; the scale ``s`` is the one header value."""

    def _pack_ternary(self, up: Tensor, down: Tensor, wire: Tensor, ws: Workspace, n: int) -> None:
        """Code 2 (+s) where ``up``, 0 (-s) where ``down``, else 1 (0), for ``n`` elements, packed into ``wire``."""
        codes = self._codes(ws, n)
        torch.sub(up.view(torch.uint8), down.view(torch.uint8), out=codes[:n])
        codes[:n].add_(1)
        self._pack(codes, wire, ws)

    def _values(self, wire: Tensor) -> Tensor:
        s = _header(wire, 1)
        z = torch.zeros(1, device=wire.device)
        return torch.cat([-s, z, s, z])


class TBQ(_Ternary):
    """Threshold binary quantisation (Strom, Interspeech 2015), HiPress's 2-bit form.

    Elements with ``x >= t`` send ``+t``, ``x <= -t`` send ``-t``, the rest 0; what is not sent
    stays in the residual (error feedback, on by default). ``threshold=None`` (our default) uses
    ``t = mean|x|`` of each tensor, sent in the header; HiPress's CaSync default is ``t = 1``.
    """

    name = "tbq"
    default_error_feedback = True

    def __init__(self, threshold: float | None = None) -> None:
        super().__init__()
        if threshold is not None and not threshold > 0:
            raise UserError(f"tbq: threshold={threshold!r} is out of range; expected > 0")
        self.threshold = threshold

    def encode(self, x: Tensor, wire: Tensor, ws: Workspace, key: int) -> None:
        n = x.numel()
        head = _header(wire, 1)
        if self.threshold is None:
            head.copy_(_l1(x, ws).reshape(1) / n)
        else:
            head.fill_(self.threshold)
        t = head[0]
        ge = ws.get("ge", n, torch.bool)
        le = ws.get("le", n, torch.bool)
        torch.ge(x, t, out=ge)
        torch.le(x, -t, out=le)
        self._pack_ternary(ge, le, wire, ws, n)


class TernGrad(_Ternary):
    """TernGrad (Wen et al., NeurIPS 2017): stochastic ternary ``s * sign(x) * Bernoulli(|x|/s)``, s = max|x|.

    Unbiased; no error feedback by default. (The 2.5 sigma gradient clipping of the paper is left
    to the user's own clipping.)
    """

    name = "terngrad"

    def encode(self, x: Tensor, wire: Tensor, ws: Workspace, key: int) -> None:
        n = x.numel()
        head = _header(wire, 1)
        lo, hi = torch.aminmax(x)  # max|x|: ~6x faster here than vector_norm(x, inf)
        head.copy_(torch.maximum(-lo, hi).reshape(1))
        u = ws.get("u", n)
        torch.mul(_dither(ws, n, self.generator(key, shared=False)), head[0] / 256, out=u)
        u.add_(head[0] / 512)  # u = s (b + 1/2) / 256: P(x > u) = x/s for x > 0, to 1/512
        gt = ws.get("ge", n, torch.bool)
        lt = ws.get("le", n, torch.bool)
        torch.gt(x, u, out=gt)
        u.neg_()
        torch.lt(x, u, out=lt)
        self._pack_ternary(gt, lt, wire, ws, n)


class TernGradMinMax(_Quant):
    """HiPress's TernGrad: b-bit stochastic quantisation between min and max.

    ``gap = (max - min) / (2^b - 1)``, ``q = floor((x - min)/gap + U(0,1))``, decoded ``min + q*gap``
    (HiPress ``terngrad_body.h``; its 10-byte header also carries b and the tail, which both sides
    know here, so ours is 8 bytes). ``random=False`` rounds to nearest.
    """

    name = "terngrad_minmax"
    header = 2
    propagates_nonfinite = True  # min/max, hence the gap, are NaN/Inf

    def __init__(self, bits: int = 2, random: bool = True) -> None:
        super().__init__()
        self.bits = _check_bits(self.name, bits, (1, 2, 4, 8))
        self.random = random

    def encode(self, x: Tensor, wire: Tensor, ws: Workspace, key: int) -> None:
        head = _header(wire, 2)
        head.copy_(torch.stack(torch.aminmax(x)))
        lo, hi = head[0], head[1]
        levels = (1 << self.bits) - 1
        gap = (hi - lo) / levels
        inv = torch.where(gap > 0, 1.0 / gap, gap.new_zeros(()))
        codes = self._stochastic_codes(x, ws, key, lo, inv, levels, self.random)
        self._pack(codes, wire, ws)

    def _values(self, wire: Tensor) -> Tensor:
        head = _header(wire, 2)
        gap = (head[1] - head[0]) / ((1 << self.bits) - 1)
        return head[0] + gap * torch.arange(1 << self.bits, dtype=torch.float32, device=wire.device)


class QSGD(_Quant):
    """QSGD (Alistarh et al., NeurIPS 2017): ``||v||_2 * sign(x) * l/s``, l a stochastic level of s.

    ``bits`` b gives s = 2^(b-1) - 1 levels each side (b=8: 127, b=4: 7, b=2: ternary). Norms are
    taken per bucket of ``bucket`` elements (the paper's bucketing, d = 512 in its experiments):
    one norm for a whole large tensor makes the variance bound ``min(d/s^2, sqrt(d)/s)`` explode.
    Wire: ceil(n/bucket) fp32 norms, then b bits per element.
    """

    name = "qsgd"
    propagates_nonfinite = True  # the bucket's norm is NaN/Inf, so are its decoded values

    def __init__(self, bits: int = 8, bucket: int = 512) -> None:
        super().__init__()
        self.bits = _check_bits(self.name, bits, (2, 4, 8))
        self.levels = (1 << (self.bits - 1)) - 1
        if not isinstance(bucket, int) or bucket < 1:
            raise UserError(f"qsgd: bucket={bucket!r} is out of range; expected an integer >= 1")
        self.bucket = bucket

    def _nb(self, n: int) -> int:
        return -(-n // self.bucket)

    def wire_bytes(self, numel: int) -> int:
        return 4 * self._nb(numel) + packed_bytes(numel, self.bits)

    def _scale_by_bucket(self, src: Tensor, per_bucket: Tensor, dst: Tensor) -> None:
        """dst = src * per_bucket[bucket of each element]."""
        n, d = src.numel(), self.bucket
        full = n // d
        if full:
            torch.mul(
                src[: full * d].view(full, d), per_bucket[:full, None], out=dst[: full * d].view(full, d)
            )
        if n > full * d:
            torch.mul(src[full * d :], per_bucket[full], out=dst[full * d :])

    def encode(self, x: Tensor, wire: Tensor, ws: Workspace, key: int) -> None:
        n, d, s = x.numel(), self.bucket, self.levels
        nb, full = self._nb(n), n // d
        norms = wire[: 4 * nb].view(torch.float32)
        if full:
            torch.linalg.vector_norm(x[: full * d].view(full, d), dim=1, out=norms[:full])
        if n > full * d:
            norms[full:].copy_(torch.linalg.vector_norm(x[full * d :]).reshape(1))
        inv = torch.where(norms > 0, s / norms, norms.new_zeros(()))
        f = ws.get("f", n)
        self._scale_by_bucket(x, inv, f)  # x * s / norm, in [-s, s]
        f.add_(_dither(ws, n, self.generator(key, shared=False)), alpha=1 / 256)
        # floor(f + u) + s, u = (b + 1/2)/256 with s folded in before the floor (s is an integer)
        f.add_(s + 1 / 512).floor_().clamp_(0, 2 * s).nan_to_num_(float(s))  # unbiased level, as a code 0..2s
        if self.bits == 8:
            wire[4 * nb : 4 * nb + n].copy_(f)
            return
        codes = self._codes(ws, n)
        codes[:n].copy_(f)
        pack_codes(codes, self.bits, wire[4 * nb :], scratch=ws.get("pack", codes.numel(), torch.uint8))

    def decode(self, wire: Tensor, out: Tensor, ws: Workspace, key: int, *, accumulate: bool = False) -> None:
        n, s = out.numel(), self.levels
        nb = self._nb(n)
        norms = wire[: 4 * nb].view(torch.float32)
        dst = ws.get("dec", n) if accumulate else out
        if self.bits == 8:  # one byte per code: an affine map beats a 1-column table lookup by ~10x
            dst.copy_(wire[4 * nb : 4 * nb + n]).sub_(s).mul_(1 / s)
        else:
            levels = (torch.arange(1 << self.bits, dtype=torch.float32, device=wire.device) - s) / s
            packed = wire[4 * nb :]
            unpack_table(packed, levels, self.bits, dst, index=ws.get("index", packed.numel(), torch.int64))
        self._scale_by_bucket(dst, norms, dst)
        if accumulate:
            out.add_(dst)


# ---- sparsifiers -------------------------------------------------------------------------------


class _Sparse(Codec):
    """k fp32 values then k int32 indices; decode scatters (index_add, so padding (0, 0.0) is harmless)."""

    ratio = 0.01

    def kept(self, numel: int) -> int:
        return _kept(numel, self.ratio)

    def wire_bytes(self, numel: int) -> int:
        return 8 * self.kept(numel)

    def _write(self, src: Tensor, idx: Tensor, wire: Tensor, k: int) -> None:
        vals = wire[: 4 * k].view(torch.float32)
        torch.index_select(src, 0, idx, out=vals)
        wire[4 * k : 8 * k].view(torch.int32).copy_(idx)

    def remove_sent(self, acc: Tensor, wire: Tensor, ws: Workspace, key: int) -> bool:
        """The sent values are acc's own: the residual is acc with those entries zeroed (no decode)."""
        k = self.kept(acc.numel())
        acc.index_fill_(0, wire[4 * k : 8 * k].view(torch.int32).to(torch.int64), 0.0)
        return True

    def decode(self, wire: Tensor, out: Tensor, ws: Workspace, key: int, *, accumulate: bool = False) -> None:
        k = self.kept(out.numel())
        vals = wire[: 4 * k].view(torch.float32)
        idx = wire[4 * k : 8 * k].view(torch.int32)
        if not accumulate:
            out.zero_()
        out.index_add_(0, idx, vals)


class TopK(_Sparse):
    """Top-k by magnitude (Aji & Heafield 2017; Stich et al. 2018), error feedback on by default.

    Exact, with a fast path: a threshold from a random sample keeps about 2k candidates, and
    ``topk`` runs on those only; if fewer than k pass, the full ``topk`` runs instead.
    """

    name = "topk"
    default_error_feedback = True

    def __init__(self, ratio: float = 0.01) -> None:
        super().__init__()
        self.ratio = _check_ratio(self.name, ratio)

    def select(self, src: Tensor, ws: Workspace, key: int, k: int) -> Tensor:
        n = src.numel()
        a = ws.get("abs", n)
        torch.abs(src, out=a)
        if n <= 1 << 16 or k * 8 > n:
            return torch.topk(a, k, sorted=False).indices
        m = min(n, 1 << 14)  # 16k samples: the threshold's quantile is good to a few percent
        sample = a[_randint(n, m, self.generator(key, shared=False), a.device)]
        r = min(m, int(m * k / n * 2) + 16)  # about 2k expected candidates
        thr = torch.topk(sample, r, sorted=False).values.min()
        cand = torch.nonzero(a >= thr).squeeze(1)
        if cand.numel() < k:
            return torch.topk(a, k, sorted=False).indices
        sub = torch.topk(a[cand], k, sorted=False).indices
        return cand[sub]

    def encode(self, x: Tensor, wire: Tensor, ws: Workspace, key: int) -> None:
        k = self.kept(x.numel())
        self._write(x, self.select(x, ws, key, k), wire, k)


class RandomK(Codec):
    """Random-k (Stich et al. 2018): k values at indices drawn from a seed that all ranks share.

    Only the values travel (indices are regenerated), and payloads of several ranks can simply be
    all-reduced. ``scale=True`` multiplies by n/k (unbiased); with error feedback (the default) keep it off.
    """

    name = "randomk"
    summable = True
    default_error_feedback = True
    wire_dtype = torch.float32

    def __init__(self, ratio: float = 0.01, scale: bool = False) -> None:
        super().__init__()
        self.ratio = _check_ratio(self.name, ratio)
        self.scale = scale

    def wire_bytes(self, numel: int) -> int:
        return 4 * _kept(numel, self.ratio)

    def _indices(self, numel: int, key: int, device: torch.device) -> Tensor:
        k = _kept(numel, self.ratio)
        return _randint(numel, k, self.generator(key, shared=True), device)

    def encode(self, x: Tensor, wire: Tensor, ws: Workspace, key: int) -> None:
        torch.index_select(x, 0, self._indices(x.numel(), key, x.device), out=wire)
        if self.scale:
            wire.mul_(x.numel() / wire.numel())

    def remove_sent(self, acc: Tensor, wire: Tensor, ws: Workspace, key: int) -> bool:
        if self.scale:
            return False  # scaled values are not acc's own: decode and subtract
        acc.index_fill_(0, self._indices(acc.numel(), key, acc.device), 0.0)
        return True

    def decode(self, wire: Tensor, out: Tensor, ws: Workspace, key: int, *, accumulate: bool = False) -> None:
        idx = self._indices(out.numel(), key, out.device)
        if accumulate:
            out.index_put_((idx,), out[idx] + wire)  # duplicates carry equal values: no double count
        else:
            out.zero_()
            out.index_put_((idx,), wire)


class SampledThreshold(_Sparse):
    """DGC and GradDrop: a threshold from a random sample of |v|, then the entries above it.

    DGC (Lin et al., ICLR 2018): momentum correction ``u = m*u + g; v += u``, selection from v,
    factor masking (selected entries of u and v zeroed), and a warm-up of the sparsity (kept ratio
    25%, 6.25%, ... down to ``ratio`` over ``warmup_steps``, exponentially). With momentum
    correction the optimizer should run without momentum. GradDrop (Aji & Heafield, EMNLP 2017):
    the same selection on the residual ``R += g`` (momentum 0), the rest stays in R.
    HiPress (``dgc_body.h``): sample rate 0.001, and more than k entries above the threshold are
    cut to the k largest; fewer are padded with (index 0, value 0).
    """

    own_memory = True
    default_error_feedback = True

    def __init__(
        self,
        ratio: float = 0.001,
        *,
        momentum: float = 0.0,
        sample_rate: float = 0.01,
        warmup_steps: int = 0,
    ) -> None:
        super().__init__()
        self.ratio = _check_ratio(self.name, ratio)
        if not 0.0 <= momentum < 1.0:
            raise UserError(f"{self.name}: momentum={momentum!r} is out of range; expected 0 <= momentum < 1")
        self.momentum = momentum
        self.sample_rate = _check_ratio(f"{self.name} sample_rate", sample_rate)
        if warmup_steps < 0:
            raise UserError(f"{self.name}: warmup_steps={warmup_steps!r} must be >= 0")
        self.warmup_steps = warmup_steps

    def ratio_now(self) -> float:
        if self.step >= self.warmup_steps:
            return self.ratio
        return max(self.ratio, 0.25 ** (1 + 4 * self.step / max(1, self.warmup_steps)))

    def kept(self, numel: int) -> int:
        return _kept(numel, self.ratio_now())

    def encode(self, x: Tensor, wire: Tensor, ws: Workspace, key: int) -> None:
        n = x.numel()
        k = self.kept(n)
        ef = self.error_feedback
        if ef:
            v = ws.get("v", n, zero=True)
            if self.momentum > 0:
                u = ws.get("u", n, zero=True)
                u.mul_(self.momentum).add_(x)
                v.add_(u)
            else:
                v.add_(x)
            src = v
        else:
            src = x
        a = ws.get("abs", n)
        torch.abs(src, out=a)
        m = max(1, min(n, math.ceil(n * self.sample_rate)))
        gen = self.generator(key, shared=False)
        sample = a[_randint(n, m, gen, a.device)] if m < n else a
        r = max(1, min(m, math.ceil(m * k / n)))
        thr = torch.topk(sample, r, sorted=False).values.min()
        sent = torch.nonzero(a >= thr).squeeze(1)
        if sent.numel() > k:
            sent = sent[torch.topk(a[sent], k, sorted=False).indices]
        got = int(sent.numel())
        idx = sent if got == k else torch.cat([sent, sent.new_zeros(k - got)])
        self._write(src, idx, wire, k)
        if got < k:
            wire[: 4 * k].view(torch.float32)[got:].zero_()  # padding (index 0, value 0) adds nothing
        if ef:
            src.index_fill_(0, sent, 0.0)  # sent: out of the residual (factor masking)
            if self.momentum > 0:
                ws.get("u", n).index_fill_(0, sent, 0.0)


class DGC(SampledThreshold):
    name = "dgc"

    def __init__(
        self, ratio: float = 0.001, momentum: float = 0.9, sample_rate: float = 0.01, warmup_steps: int = 0
    ) -> None:
        super().__init__(ratio, momentum=momentum, sample_rate=sample_rate, warmup_steps=warmup_steps)


class GradDrop(SampledThreshold):
    name = "graddrop"

    def __init__(self, ratio: float = 0.001, sample_rate: float = 0.01) -> None:
        super().__init__(ratio, momentum=0.0, sample_rate=sample_rate)


def _register_builtins() -> None:
    from trainsim.compress.powersgd import PowerSGD

    for cls in (NoCompression, Fp16, Bf16, OneBit, SignSGD, EFSignSGD, TBQ, TernGrad, TernGradMinMax, QSGD,
                TopK, RandomK, DGC, GradDrop, PowerSGD):  # fmt: skip
        register(cls.name, cls)


_register_builtins()
