"""Vectorised bit packing of small integer codes into bytes, and table-driven unpacking.

    >>> import torch
    >>> from trainsim.compress.bits import pack_codes, unpack_table, packed_bytes
    >>> codes = torch.tensor([1, 0, 2, 1, 2, 0, 0, 0], dtype=torch.uint8)  # padded to whole bytes
    >>> packed = torch.empty(packed_bytes(5, 2), dtype=torch.uint8)
    >>> pack_codes(codes, 2, packed)
    >>> out = torch.empty(5)
    >>> unpack_table(packed, torch.tensor([-1.0, 0.0, 1.0, 0.0]), 2, out)
    >>> out.tolist()
    [0.0, -1.0, 1.0, 0.0, 1.0]

Codes of ``b`` bits (b in 1, 2, 4, 8) are packed little-end first: element ``i`` of a byte sits at
bits ``b*i .. b*i+b-1``. Packing uses one integer multiplication per group of elements (the classic
"multiply to gather bytes into one" trick, checked bit by bit in the tests): the group of ``8/b``
one-byte codes is read as one integer, multiplied by a constant that moves code ``i`` to bit
``base + b*i`` while every cross term lands below ``base`` without overlapping, then shifted down.
Unpacking never loops per element either: a ``256 x (8/b)`` table maps each byte to its decoded
values and ``index_select`` writes them, so decode is one gather pass over the output.

Buffers are passed in by the caller: nothing here allocates more than O(n/8) scratch per call.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor

# group dtype, multiplier, shift: for b bits per code, 8/b codes (one byte each) form one integer.
# b=1: 8 codes in an int64; 0x0102040810204080 moves byte i's low bit to bit 56+i.
# b=2: 4 codes in an int32; 2^24 + 2^18 + 2^12 + 2^6 moves code i to bit 24+2i (cross terms < 24).
# b=4: 2 codes in an int16; 2^8 + 2^4 moves code i to bit 8+4i.
_PACK: dict[int, tuple[torch.dtype, int, int]] = {
    1: (torch.int64, 0x0102040810204080, 56),
    2: (torch.int32, (1 << 24) + (1 << 18) + (1 << 12) + (1 << 6), 24),
    4: (torch.int16, (1 << 8) + (1 << 4), 8),
}
_BYTE_CODES: dict[tuple[int, torch.device], Tensor] = {}  # by bits and device


def packed_bytes(numel: int, bits: int) -> int:
    """Bytes that ``numel`` codes of ``bits`` bits take when packed."""
    return (numel * bits + 7) // 8


def per_byte(bits: int) -> int:
    """Codes per byte."""
    return 8 // bits


def pack_codes(codes: Tensor, bits: int, out: Tensor, *, scratch: Tensor | None = None) -> None:
    """Pack uint8 ``codes`` (each < 2**bits) into ``out`` (uint8, ``packed_bytes(len, bits)`` long).

    ``codes`` must be a contiguous uint8 tensor whose length is a multiple of ``8/bits``; callers
    keep their code buffer padded (with zeros) to that multiple. ``scratch``: a reusable buffer of
    at least ``len(codes) / (8/bits)`` int64 (writing into fresh memory costs page faults).
    """
    if bits == 8:
        out.copy_(codes[: out.numel()])
        return
    dtype, mult, shift = _PACK[bits]
    group = codes.view(dtype)
    if scratch is not None:  # bytes, as many as codes: reinterpreted as the group integers
        wide = torch.mul(group, mult, out=scratch[: codes.numel()].view(dtype))
    else:
        wide = torch.mul(group, mult)
    # the packed byte is bits shift..shift+7 of each integer: its most significant byte, read in
    # place (little-endian) -- 2-3x faster here than a shift, a mask and a narrowing copy
    assert shift == 8 * (wide.element_size() - 1) and sys.byteorder == "little"
    out.copy_(wide.view(torch.uint8).view(-1, wide.element_size())[:, -1])


_POPCOUNT = torch.tensor([bin(i).count("1") for i in range(256)], dtype=torch.int64)


def popcount(packed: Tensor) -> Tensor:
    """Number of set bits in a uint8 tensor (0-d int64)."""
    return _POPCOUNT.to(packed.device)[packed.to(torch.int64)].sum()


def byte_codes(bits: int, device: torch.device | None = None) -> Tensor:
    """``[256, 8/bits]`` int64 table: the codes held by each byte value (on ``device``, default CPU)."""
    where = torch.device("cpu") if device is None else device
    table = _BYTE_CODES.get((bits, where))
    if table is None:
        per = per_byte(bits)
        byte = torch.arange(256, dtype=torch.int64).unsqueeze(1)
        shifts = torch.arange(per, dtype=torch.int64) * bits
        table = ((byte >> shifts) & ((1 << bits) - 1)).to(where)
        _BYTE_CODES[(bits, where)] = table
    return table


def unpack_table(
    packed: Tensor,
    values: Tensor,
    bits: int,
    out: Tensor,
    *,
    scratch: Tensor | None = None,
    index: Tensor | None = None,
    accumulate: bool = False,
) -> None:
    """Decode ``packed`` codes into ``out`` (fp32, n elements), code c meaning ``values[c]``.

    ``values`` holds ``2**bits`` floats, on the device of ``packed`` and ``out``. With ``accumulate``
    the decoded values are added to ``out``; ``scratch`` (fp32, at least n rounded up to a whole
    byte) is then used for the decoded values (allocated if not given). ``index``: a reusable int64
    buffer of ``len(packed)``.
    """
    n = out.numel()
    per = per_byte(bits)
    if bits == 8:  # one code per byte: a 1-column table gather is ~10x slower than an affine map
        step = values[1] - values[0]
        levels = torch.arange(256, dtype=values.dtype, device=values.device)
        if torch.allclose(values, values[0] + step * levels, rtol=1e-5, atol=0.0):
            dst = torch.empty(n, dtype=out.dtype, device=out.device) if accumulate else out
            dst.copy_(packed[:n]).mul_(step).add_(values[0])
            if accumulate:
                out.add_(dst)
            return
    table = values[byte_codes(bits, values.device)]  # [256, per] fp32: tiny
    if index is None:
        index = packed.to(torch.int64)
    else:
        index = index[: packed.numel()]
        index.copy_(packed)
    full = n // per
    if accumulate:
        if scratch is not None:
            tmp = scratch
        else:
            tmp = torch.empty(packed.numel() * per, dtype=out.dtype, device=out.device)
        dst = tmp[: packed.numel() * per].view(-1, per)
        torch.index_select(table, 0, index, out=dst)
        out.add_(tmp[:n])
        return
    if full:
        torch.index_select(table, 0, index[:full], out=out[: full * per].view(full, per))
    rest = n - full * per
    if rest:
        out[full * per :].copy_(table[index[full], :rest])
