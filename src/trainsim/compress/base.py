"""The codec interface, the registry, error feedback, and the few-lines way to add an algorithm.

    >>> import torch
    >>> from trainsim.compress import make
    >>> c = make("onebit")                      # error feedback on: onebit's default
    >>> g = torch.randn(1000)
    >>> wire = c.compress(g, key=0)             # uint8, exactly c.wire_bytes(1000) = 8 + 125 bytes
    >>> approx = c.decompress(wire, 1000)
    >>> wire.numel(), approx.shape
    (133, torch.Size([1000]))

A *codec* turns a flat fp32 gradient into a fixed-size wire buffer and back. Its size depends
only on the number of elements (and, for DGC's warm-up, on the step), so every rank knows every
other rank's wire size without a size exchange: all-gather, gather and broadcast work on plain
buffers. A *compressor* (``Compressor``) wraps a codec with the per-gradient state that training
needs: error-feedback memory, scratch buffers reused across steps (allocating fresh output every
step costs several times the arithmetic on a CPU, see ``research/measured_peers.md``), the step
counter and the seeds.

Adding an algorithm takes a few lines of tensor code (CompLL's promise, HiPress SOSP'21 §5)::

    @register_function("halfsign")
    def halfsign(x):                              # encode: any tuple of tensors
        return (x > 0), x.abs().mean().reshape(1)
    @halfsign.decoder
    def _(parts, numel):                          # decode: back to numel fp32 values
        pos, scale = parts
        return (pos.float() * 2 - 1) * scale

and ``make("halfsign")`` then works in the DDP hooks, CaSync, ``compress-bench``, SeCoPa's
calibration and the what-if, with its wire bytes counted from the parts it returns.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from trainsim.errors import UserError


class Workspace:
    """Named scratch buffers of one gradient, reused across steps (grown, never shrunk).

    Buffers live on ``device``, the device of the gradient (the compressor sets it on every call);
    a buffer made on another device is moved there with its contents (error-feedback memory
    survives ``model.to(device)``).
    """

    __slots__ = ("_bufs", "device")

    def __init__(self, device: torch.device | str | None = None) -> None:
        self._bufs: dict[str, Tensor] = {}
        self.device = torch.device("cpu") if device is None else torch.device(device)

    def get(self, name: str, numel: int, dtype: torch.dtype = torch.float32, *, zero: bool = False) -> Tensor:
        """A 1-D buffer of ``numel`` elements; ``zero`` zeroes it when it is first made."""
        buf = self._bufs.get(name)
        if buf is not None and buf.device != self.device:
            buf = self._bufs[name] = buf.to(self.device)
        if buf is None or buf.numel() < numel or buf.dtype != dtype:
            if zero:
                buf = torch.zeros(numel, dtype=dtype, device=self.device)
            else:
                buf = torch.empty(numel, dtype=dtype, device=self.device)
            self._bufs[name] = buf
        return buf[:numel]

    def drop(self, name: str) -> None:
        self._bufs.pop(name, None)


class Codec:
    """Base of every algorithm: encode into a preallocated wire buffer, decode from it.

    Subclasses set ``name`` and implement ``wire_bytes``, ``encode`` and ``decode``. ``x`` is a
    contiguous 1-D fp32 tensor; ``wire`` is a 1-D tensor of ``wire_dtype`` holding exactly
    ``wire_bytes(numel)`` bytes. ``decode(accumulate=True)`` adds into ``out`` (decode-and-merge,
    HiPress's ``is_add_to``), which is how all-gather / PS / ring sum the ranks' parts.
    """

    name: ClassVar[str] = ""
    # wire buffers of several ranks may be summed elementwise by all-reduce (fp16/bf16, random-k)
    summable: ClassVar[bool] = False
    # the codec keeps its own residual (TBQ, GradDrop, DGC): the generic error feedback is skipped
    own_memory: ClassVar[bool] = False
    # default for Compressor(error_feedback=None)
    default_error_feedback: ClassVar[bool] = False
    wire_dtype: ClassVar[torch.dtype] = torch.uint8
    # a NaN/Inf in the input reaches the decoded output by itself (through a scale or a cast); if
    # False the hooks send a 4-byte non-finite marker beside the wire (quantisers can hide NaN)
    propagates_nonfinite: ClassVar[bool] = False

    def __init__(self) -> None:
        self.step = 0  # set by the compressor before each call (DGC warm-up, random-k seeds)
        self.seed = 0
        self.rank = 0
        self.error_feedback = self.default_error_feedback  # set by the compressor

    def wire_bytes(self, numel: int) -> int:
        raise NotImplementedError

    def wire_numel(self, numel: int) -> int:
        return self.wire_bytes(numel) // torch.empty((), dtype=self.wire_dtype).element_size()

    def encode(self, x: Tensor, wire: Tensor, ws: Workspace, key: int) -> None:
        raise NotImplementedError

    def decode(self, wire: Tensor, out: Tensor, ws: Workspace, key: int, *, accumulate: bool = False) -> None:
        raise NotImplementedError

    def remove_sent(self, acc: Tensor, wire: Tensor, ws: Workspace, key: int) -> bool:
        """Error feedback shortcut: make ``acc`` the residual ``acc - D(wire)`` in place and return
        True, or return False to let the compressor decode and subtract (the default)."""
        return False

    def describe(self) -> str:
        return self.name

    def generator(self, key: int, *, shared: bool) -> torch.Generator:
        """A generator for this step and gradient: ``shared`` ones agree on every rank.

        Always a CPU generator: codecs draw on the host and copy the draws to the gradient's
        device, so a CUDA gradient gets the same random numbers as a CPU one (the same results,
        and every rank the same shared draws whatever its device)."""
        salt = 0 if shared else self.rank + 1
        seed = zlib.crc32(f"{self.seed}:{self.step}:{key}:{salt}".encode())
        return torch.Generator().manual_seed(seed)


Factory = Callable[..., Codec]
_REGISTRY: dict[str, Factory] = {}


def register(name: str, factory: Factory) -> None:
    """Register ``factory(**options) -> Codec`` under ``name`` (replacing one of the same name)."""
    _REGISTRY[name] = factory


def names() -> list[str]:
    """Registered algorithm names, sorted (the package's ``__init__`` registers the built-ins)."""
    return sorted(_REGISTRY)


def registered(name: str) -> Factory:
    """The factory registered as ``name``; ``UserError`` listing the known names on a miss."""
    known = names()
    factory = _REGISTRY.get(name)
    if factory is None:
        raise UserError(f"unknown compression algorithm {name!r}; expected one of: {', '.join(known)}")
    return factory


def make_codec(name: str, **options: Any) -> Codec:
    """The codec registered as ``name``; ``UserError`` listing the known names on a miss."""
    factory = registered(name)
    try:
        return factory(**options)
    except TypeError as exc:
        raise UserError(f"compression algorithm {name!r}: bad options {options}: {exc}") from None


class Compressor:
    """A codec plus per-gradient state: error feedback, scratch buffers, step, seeds.

    Error feedback (Seide et al. 2014; Karimireddy et al. 2019, "EF-SGD"): the part of the
    gradient that the codec did not send is remembered and added to the next step's gradient,
    ``acc = g + e; send C(acc); e = acc - D(C(acc))``, so that over steps the sum of what is sent
    tracks the sum of the true gradients. ``key`` names the gradient (any hashable that is the same
    on every rank and every step, e.g. its index in ``model.parameters()``).
    """

    def __init__(
        self, codec: Codec, *, error_feedback: bool | None = None, seed: int = 0, rank: int = 0
    ) -> None:
        self.codec = codec
        self.error_feedback = codec.default_error_feedback if error_feedback is None else error_feedback
        codec.seed = seed
        codec.rank = rank
        codec.error_feedback = self.error_feedback
        self.seed = seed
        self._ws: dict[Hashable, Workspace] = {}
        self._ids: dict[Hashable, int] = {}

    @property
    def name(self) -> str:
        return self.codec.name

    @property
    def step(self) -> int:
        return self.codec.step

    @step.setter
    def step(self, value: int) -> None:
        self.codec.step = value

    def workspace(self, key: Hashable, device: torch.device | None = None) -> Workspace:
        """The scratch of gradient ``key``; ``device`` (the gradient's) is where its buffers live."""
        ws = self._ws.get(key)
        if ws is None:
            ws = self._ws[key] = Workspace(device)
        elif device is not None:
            ws.device = device
        return ws

    def key_id(self, key: Hashable) -> int:
        """A 32-bit id of ``key``, the same in every process (seeds shared randomness)."""
        kid = self._ids.get(key)
        if kid is None:
            kid = self._ids[key] = zlib.crc32(repr(key).encode())
        return kid

    def wire_bytes(self, numel: int) -> int:
        return self.codec.wire_bytes(numel)

    def wire_numel(self, numel: int) -> int:
        return self.codec.wire_numel(numel)

    def new_wire(self, numel: int, device: torch.device | None = None) -> Tensor:
        return torch.empty(self.codec.wire_numel(numel), dtype=self.codec.wire_dtype, device=device)

    def reset(self, key: Hashable | None = None) -> None:
        """Forget error-feedback memory (of one gradient, or of all)."""
        if key is None:
            self._ws.clear()
        else:
            self._ws.pop(key, None)

    def compress_into(self, x: Tensor, wire: Tensor, key: Hashable = 0) -> None:
        """Encode fp32 1-D ``x`` (with error feedback if on) into ``wire``."""
        ws = self.workspace(key, x.device)
        kid = self.key_id(key)
        codec = self.codec
        if not self.error_feedback or codec.own_memory:
            codec.encode(x, wire, ws, kid)
            return
        n = x.numel()
        err = ws.get("ef", n, zero=True)
        err.add_(x)  # acc = g + e, kept in the memory buffer itself
        codec.encode(err, wire, ws, kid)
        if codec.remove_sent(err, wire, ws, kid):
            return  # a sparsifier zeroed what it sent: no decode needed
        dec = ws.get("ef_dec", n)
        codec.decode(wire, dec, ws, kid)
        err.sub_(dec)  # e = acc - D(C(acc))

    def compress(self, x: Tensor, key: Hashable = 0) -> Tensor:
        wire = self.new_wire(x.numel(), x.device)
        self.compress_into(x.reshape(-1).float().contiguous(), wire, key)
        return wire

    def decompress_into(
        self, wire: Tensor, out: Tensor, key: Hashable = 0, *, accumulate: bool = False
    ) -> None:
        ws = self.workspace(("dec", key), out.device)
        if (wire.storage_offset() * wire.element_size()) % 8:
            wire = wire.clone()  # a rank's part of a gathered buffer: realign for typed header views
        self.codec.decode(wire, out, ws, self.key_id(key), accumulate=accumulate)

    def decompress(self, wire: Tensor, numel: int, key: Hashable = 0) -> Tensor:
        out = torch.empty(numel, device=wire.device)
        self.decompress_into(wire, out, key)
        return out


def make(
    name: str, *, error_feedback: bool | None = None, seed: int = 0, process_rank: int = 0, **options: Any
) -> Compressor:
    """A ``Compressor`` for the algorithm ``name`` with its ``options`` (ratio, bits, rank ...).

    ``process_rank`` seeds the per-rank randomness (stochastic rounding, samples); ``seed`` the rest.
    """
    return Compressor(
        make_codec(name, **options), error_feedback=error_feedback, seed=seed, rank=process_rank
    )


# ---- the few-lines path: encode/decode as plain functions ------------------------------------


@dataclass(frozen=True, slots=True)
class _Part:
    offset: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


def _align(n: int, to: int = 8) -> int:
    return (n + to - 1) // to * to


class FunctionCodec(Codec):
    """A codec from ``encode(x) -> tuple[Tensor, ...]`` and ``decode(parts, numel) -> Tensor``.

    The parts' shapes must depend only on ``numel``; they are laid out one after another in the
    wire buffer (each at an 8-byte aligned offset; the padding is counted as wire bytes).
    ``compile``: False (eager), True (``torch.compile`` both functions), or ``"auto"``: for each
    gradient size of at least ``AUTO_MIN_NUMEL`` elements, time eager and compiled encode+decode
    once and keep the faster (``compile_choices`` shows the picks). On this CPU compiling paid off
    for an int8 quantiser (3.6x) and lost for a bool-mask sign codec (0.7x): measure, don't assume.
    """

    AUTO_MIN_NUMEL = 1 << 16  # below this, compile time and call overhead cannot pay back

    def __init__(
        self,
        name: str,
        encode: Callable[[Tensor], Sequence[Tensor]],
        decode: Callable[[Sequence[Tensor], int], Tensor],
        *,
        error_feedback: bool = False,
        compile: bool | str = False,
    ) -> None:
        super().__init__()
        if compile not in (True, False, "auto"):
            raise UserError(f"algorithm {name!r}: compile={compile!r}; expected True, False or 'auto'")
        self.name = name  # type: ignore[misc]
        self.default_error_feedback = error_feedback  # type: ignore[misc]
        self._eager = (encode, decode)
        self._compiled = (
            (torch.compile(encode, dynamic=False), torch.compile(decode, dynamic=False)) if compile else None
        )
        self._mode = compile
        self.compile_choices: dict[int, bool] = {}  # numel -> compiled is used
        self._layouts: dict[int, list[_Part]] = {}

    def _fns(self, numel: int) -> tuple[Any, Any]:
        if self._compiled is None:
            return self._eager
        if self._mode is True:
            return self._compiled
        use = self.compile_choices.get(numel)
        if use is None:
            use = self.compile_choices[numel] = self._faster_compiled(numel)
        return self._compiled if use else self._eager

    def _faster_compiled(self, numel: int) -> bool:
        import time

        if numel < self.AUTO_MIN_NUMEL or self._compiled is None:
            return False
        x = torch.randn(numel, generator=torch.Generator().manual_seed(0))

        def best(enc: Any, dec: Any) -> float:
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                dec(enc(x), numel)
                times.append(time.perf_counter() - t0)
            return min(times)

        try:
            eager = best(*self._eager)
            enc_c, dec_c = self._compiled
            dec_c(enc_c(x), numel)  # compile outside the timing
            compiled = best(enc_c, dec_c)
        except Exception:  # a function torch.compile cannot handle stays eager
            return False
        return compiled < 0.9 * eager

    def layout(self, numel: int) -> list[_Part]:
        parts = self._layouts.get(numel)
        if parts is None:
            sample = self._eager[0](torch.zeros(numel))
            parts, offset = [], 0
            for t in sample:
                nbytes = t.numel() * t.element_size()
                parts.append(_Part(offset, tuple(t.shape), t.dtype, nbytes))
                offset = _align(offset + nbytes)
            self._layouts[numel] = parts
        return parts

    def wire_bytes(self, numel: int) -> int:
        parts = self.layout(numel)
        last = parts[-1]
        return last.offset + last.nbytes

    def encode(self, x: Tensor, wire: Tensor, ws: Workspace, key: int) -> None:
        parts = self.layout(x.numel())
        out = self._fns(x.numel())[0](x)
        if len(out) != len(parts):
            raise UserError(
                f"algorithm {self.name!r}: encode returned {len(out)} parts, expected {len(parts)}"
            )
        for spec, t in zip(parts, out, strict=True):
            if tuple(t.shape) != spec.shape or t.dtype != spec.dtype:
                raise UserError(
                    f"algorithm {self.name!r}: encode part shapes must depend only on numel; "
                    f"got {tuple(t.shape)} {t.dtype}, expected {spec.shape} {spec.dtype}"
                )
            raw = (
                t.contiguous().reshape(-1).view(torch.uint8)
                if t.dtype != torch.bool
                else t.reshape(-1).view(torch.uint8)
            )
            wire[spec.offset : spec.offset + spec.nbytes].copy_(raw)

    def decode(self, wire: Tensor, out: Tensor, ws: Workspace, key: int, *, accumulate: bool = False) -> None:
        parts = []
        for spec in self.layout(out.numel()):
            raw = wire[spec.offset : spec.offset + spec.nbytes]
            parts.append(raw.view(spec.dtype).reshape(spec.shape))
        value = self._fns(out.numel())[1](parts, out.numel()).reshape(-1)
        if accumulate:
            out.add_(value)
        else:
            out.copy_(value)


class _FunctionRegistration:
    def __init__(self, name: str, encode: Callable[[Tensor], Sequence[Tensor]], error_feedback: bool) -> None:
        self.name = name
        self.encode = encode
        self.error_feedback = error_feedback

    def __call__(self, x: Tensor) -> Sequence[Tensor]:
        return self.encode(x)

    def decoder(
        self, decode: Callable[[Sequence[Tensor], int], Tensor]
    ) -> Callable[[Sequence[Tensor], int], Tensor]:
        enc, ef, name = self.encode, self.error_feedback, self.name

        def factory(*, compile: bool | str = False) -> Codec:
            return FunctionCodec(name, enc, decode, error_feedback=ef, compile=compile)

        register(name, factory)
        return decode


def register_function(name: str, *, error_feedback: bool = False) -> Callable[..., _FunctionRegistration]:
    """Decorator: register an encode function; then decorate its decoder with ``.decoder``."""

    def wrap(encode: Callable[[Tensor], Sequence[Tensor]]) -> _FunctionRegistration:
        return _FunctionRegistration(name, encode, error_feedback)

    return wrap
