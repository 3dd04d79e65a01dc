"""DDP communication hooks for every trainsim compression algorithm.

    >>> from torch.nn.parallel import DistributedDataParallel as DDP       # doctest: +SKIP
    >>> from trainsim.run.hooks import CompressionState, compress_hook    # doctest: +SKIP
    >>> ddp = DDP(model)                                                   # doctest: +SKIP
    >>> state = CompressionState("topk", ratio=0.01, model=model)          # doctest: +SKIP
    >>> ddp.register_comm_hook(state, compress_hook)                       # doctest: +SKIP

``hook(state, bucket) -> Future[Tensor]`` exactly as PyTorch's (``DistributedDataParallel.
register_comm_hook``); the future holds the bucket's buffer with the *average* over the world.

Algorithm of ``compress_hook``, per bucket:
  1. Split the bucket into its parameters' gradients. Gradients of 1-D parameters (biases, norms),
     tiny ones (< ``min_numel``) and those a SeCoPa plan says not to compress are all-reduced
     uncompressed, batched into one contiguous tensor (as PyTorch's PowerSGD hook does).
  2. Divide by the world size first (``_allreduce_fut`` does the same, to avoid fp16 overflow).
  3. Encode each remaining gradient (fp32; fp16/bf16 buffers are widened) into one wire buffer
     behind a 4-byte non-finite marker (0.0, or NaN when the gradient holds NaN/Inf), with error
     feedback if on.
  4. Summable codecs (fp16, bf16, random-k) all-reduce the wire; the others all-gather it and
     decode-sum every rank's part (CaSync's all-gather scheme); ``scheme="ps"/"ring"`` uses
     ``trainsim.run.casync`` instead. On gloo the all-gather posts every receive before any send
     (``gather="exchange"``, ``casync.all_gather_bytes``); ``gather="collective"`` uses gloo's own.
  5. Markers are added to the decoded gradients, so a NaN/Inf on any rank shows in the result
     (AMP's scaler sees it) instead of being hidden by a quantiser.

Devices: everything a bucket needs (error-feedback memory, scratch, wires, the decoded result) lives
on the bucket's device, ``bucket.buffer().device``. gloo groups take CPU and CUDA buckets (gloo
stages CUDA tensors through the host; see ``trainsim.run.casync``), NCCL groups CUDA buckets; any
other pairing is a ``UserError`` naming the backend and the device. Random draws (dither, sampled
indices, random-k) come from seeded CPU generators and are copied to the device, so a CUDA bucket
gets what a CPU bucket would. On CUDA the returned future is CUDA-aware: it completes with an event
recorded after the decode, on the stream the decode ran on, and DDP's wait orders its stream behind it.

Collectives are issued only from the hook itself (the autograd thread, in bucket order, the same
on every rank), never from a future's callback, so ranks cannot disagree on collective order.
Per-gradient state (error feedback, warm-start Q, scratch) is keyed by the parameters, not the
bucket index, so DDP's bucket rebuild after the first iteration needs no special start iteration.
A failure inside the hook is raised on the failing rank; its peers then fail in their next
collective after the process group's ``timeout`` (set one in ``init_process_group``).

Why one module: every hook shares the per-gradient state (``CompressionState``), the bucket layout and
the chaining of futures (``_finish``, ``_then``), whose order of collectives must be the same on every
rank; one file keeps that order in view.
"""

# no "from __future__ import annotations": DDP checks the hook annotations as real objects

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from trainsim.compress.base import Compressor, make
from trainsim.compress.powersgd import orthonormalize, worth_compressing
from trainsim.errors import UserError
from trainsim.run.casync import (
    BACKEND_DEVICES,
    GATHER_METHODS,
    SCHEMES,
    all_gather_bytes,
    backends_by_device,
    sync,
)

_SUPPORTED_BACKENDS = tuple(BACKEND_DEVICES)  # gloo (CPU and CUDA buckets), nccl (CUDA buckets)
_MARKER = 8  # bytes reserved before each gradient's wire: a fp32 marker, padded to keep 8-byte alignment


@dataclass(frozen=True, slots=True)
class _Entry:
    """One compressed gradient of a bucket."""

    offset: int  # elements into the bucket buffer
    numel: int
    shape: tuple[int, ...]
    key: str  # the parameter's name (or its index), the same on every rank
    partitions: int
    wire_offset: int  # bytes (elements for summable codecs) into the bucket's wire
    wire_size: int


@dataclass(frozen=True, slots=True)
class _Layout:
    plain: list[tuple[int, int]]  # (offset, numel) of gradients sent uncompressed
    plain_numel: int
    every: list[tuple[int, int, str]]  # (offset, numel, name) of every gradient in the bucket
    entries: list[_Entry]
    wire_size: int


class CompressionState:
    """State of ``compress_hook``: what to compress, how, and the per-gradient memories."""

    __slots__ = (
        "_layouts",
        "_pending_advance",
        "backend",
        "backends",
        "compressor",
        "gather",
        "iteration",
        "min_numel",
        "momentum",
        "names",
        "plan",
        "process_group",
        "rank",
        "scheme",
        "start_iter",
        "world_size",
    )

    def __init__(
        self,
        algorithm: str | Compressor,
        process_group: Any = None,
        *,
        model: nn.Module | None = None,
        scheme: str = "allgather",
        gather: str = "exchange",
        plan: Any = None,
        min_numel: int = 1024,
        start_iter: int = 0,
        momentum: float = 0.0,
        error_feedback: bool | None = None,
        seed: int = 0,
        **options: Any,
    ) -> None:
        # where: the group and this process's place in it
        if not dist.is_available() or not dist.is_initialized():
            raise UserError(
                "compression hook: torch.distributed is not initialised; call init_process_group first"
            )
        backend = str(dist.get_backend(process_group))
        backends = backends_by_device(backend)
        if not backends or any(name not in _SUPPORTED_BACKENDS for name in backends.values()):
            raise UserError(
                f"compression hook: process group backend {backend!r} is not supported; "
                f"expected one of {', '.join(_SUPPORTED_BACKENDS)}"
            )
        self.backend = backend
        self.backends = backends  # device type -> the backend that takes its tensors
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        # what: the algorithm (a registry name or a ready Compressor) and the synchronisation scheme
        if isinstance(algorithm, Compressor):
            self.compressor = algorithm
        else:
            self.compressor = make(
                algorithm, error_feedback=error_feedback, seed=seed, process_rank=self.rank, **options
            )
        if scheme not in SCHEMES:
            raise UserError(
                f"compression hook: unknown scheme {scheme!r}; expected one of {', '.join(SCHEMES)}"
            )
        if getattr(self.compressor.codec, "low_rank", False) and scheme != "allgather":
            raise UserError("compression hook: powersgd all-reduces P and Q; scheme must be 'allgather'")
        self.scheme = scheme
        if gather not in GATHER_METHODS:
            raise UserError(
                f"compression hook: gather={gather!r}; expected one of {', '.join(GATHER_METHODS)}"
            )
        self.gather = gather
        # which gradients: names (for plans and stable keys), the size floor, an optional SeCoPa plan
        self.names: dict[int, str] = {}
        if isinstance(model, DistributedDataParallel):
            model = model.module  # names without DDP's "module." prefix, as plans write them
        if model is not None:
            self.names = {id(p): name for name, p in model.named_parameters()}
        if min_numel < 0:
            raise UserError(f"compression hook: min_numel={min_numel} must be >= 0")
        self.min_numel = min_numel
        self.plan = plan
        if plan is not None:
            if model is None:
                raise UserError("compression hook: a plan needs model= to match gradient names")
            plan.check_names(list(self.names.values()))
        # progress: iterations seen by the hook (no_sync steps are not seen)
        if start_iter < 0:
            raise UserError(f"compression hook: start_iter={start_iter} must be >= 0")
        # momentum correction: the hook keeps the velocity (the optimizer then runs without momentum)
        if not 0.0 <= momentum < 1.0:
            raise UserError(f"compression hook: momentum={momentum!r}; expected 0 <= momentum < 1")
        if momentum and getattr(self.compressor.codec, "momentum", 0.0):
            raise UserError("compression hook: dgc corrects momentum itself; leave the hook's momentum at 0")
        self.momentum = float(momentum)
        self.start_iter = start_iter
        self.iteration = 0
        self._pending_advance = False
        self._layouts: dict[tuple[int, ...], _Layout] = {}  # by parameters (and wire size)


def state_from_plan(
    plan: Any, model: nn.Module, process_group: Any = None, *, seed: int = 0, min_numel: int = 1024
) -> CompressionState:
    """A ``CompressionState`` for a SeCoPa plan (a ``Plan`` or the path of its YAML file).

    The plan's algorithm and options pick the codec; its topology (ps | ring) the CaSync scheme.
    Example: ``ddp.register_comm_hook(state_from_plan("plan.yaml", model), compress_hook)``.
    """
    from trainsim.compress.secopa import Plan

    if not isinstance(plan, Plan):
        plan = Plan.load(plan)
    if dist.is_initialized() and plan.world_size != dist.get_world_size(process_group):
        raise UserError(
            f"{plan.source}: the plan is for world_size={plan.world_size}, "
            f"the process group has {dist.get_world_size(process_group)} ranks"
        )
    return CompressionState(
        plan.algorithm, process_group, model=model, scheme=plan.topology, plan=plan, min_numel=min_numel,
        seed=seed, **plan.options,
    )  # fmt: skip


def _advance(state: CompressionState, bucket: dist.GradBucket) -> None:
    """Count iterations; the step moves when the next iteration's first bucket arrives (all decodes done)."""
    if state._pending_advance:
        state.iteration += 1
        state._pending_advance = False
    state.compressor.step = state.iteration
    if bucket.is_last():
        state._pending_advance = True


def _check_device(state: CompressionState, buf: Tensor) -> None:
    """A bucket on a device that the group's backend cannot take is a user error (NCCL and a CPU model)."""
    if buf.device.type in state.backends:
        return
    takes = " and ".join(sorted(state.backends))
    raise UserError(
        f"compression hook: process group backend {state.backend!r} takes {takes} tensors, but this "
        f"DDP bucket is on {buf.device}; move the model to a CUDA device before wrapping it in DDP "
        f"(NCCL), or use a gloo process group for CPU training"
    )


def _layout(state: CompressionState, bucket: dist.GradBucket) -> _Layout:
    params = bucket.parameters()
    # the wire size of a probe size joins the key: DGC's sparsity warm-up changes sizes over steps
    cache_key = (*(id(p) for p in params), state.compressor.wire_bytes(1 << 20))
    layout = state._layouts.get(cache_key)
    if layout is not None:
        return layout
    comp = state.compressor
    low_rank = getattr(comp.codec, "low_rank", False)
    codec: Any = comp.codec
    natural = codec.propagates_nonfinite  # NaN/Inf already reach every decoded value: no marker
    plain: list[tuple[int, int]] = []
    every: list[tuple[int, int, str]] = []
    entries: list[_Entry] = []
    offset = wire = 0
    for i, p in enumerate(params):
        n = p.numel()
        # without model= the key follows the bucket: memories restart when DDP rebuilds buckets
        name = state.names.get(id(p), f"bucket{bucket.index()}.{i}")
        decision = state.plan.decision(name) if state.plan is not None else None
        # a plan's decision wins (the user may have edited it); else 2-D+ and not tiny, like PowerSGD
        compress = decision[0] if decision is not None else p.dim() >= 2 and n >= state.min_numel
        rows = p.shape[0] if p.dim() else 1
        if compress and low_rank:
            compress = worth_compressing(
                rows, n // max(1, rows), codec.matrix_rank, codec.min_compression_rate
            )
        every.append((offset, n, name))
        if not compress:
            plain.append((offset, n))
        else:
            parts = decision[1] if decision is not None else 1
            if low_rank:
                r = min(rows, n // rows, codec.matrix_rank)
                size = r * (rows + n // rows)  # elements of P and Q^T
            elif comp.codec.summable:
                size = comp.wire_numel(n) + (0 if natural else 1)  # + the marker, in the wire's dtype
            else:
                size = (0 if natural else _MARKER) + (comp.wire_bytes(n) + 7) // 8 * 8
            entries.append(_Entry(offset, n, tuple(p.shape), name, parts, wire, size))
            wire += size
        offset += n
    layout = _Layout(plain, sum(n for _, n in plain), every, entries, wire)
    state._layouts[cache_key] = layout
    return layout


def _gather_plain(buf: Tensor, layout: _Layout) -> Tensor:
    if len(layout.plain) == 1:
        off, n = layout.plain[0]
        return buf[off : off + n].clone()
    return torch.cat([buf[off : off + n] for off, n in layout.plain])


def _scatter_plain(buf: Tensor, layout: _Layout, flat: Tensor) -> None:
    at = 0
    for off, n in layout.plain:
        buf[off : off + n].copy_(flat[at : at + n])
        at += n


def _as_fp32(buf: Tensor, e: _Entry) -> Tensor:
    seg = buf[e.offset : e.offset + e.numel]
    return seg if seg.dtype == torch.float32 else seg.float()


def _marker(x: Tensor) -> Tensor:
    """0.0 if x is all finite, NaN otherwise (one reduction: a sum is NaN/Inf iff some element is)."""
    return x.sum().reshape(1) * 0.0


def _allreduce_fut(state: CompressionState, tensor: Tensor) -> torch.futures.Future[Tensor]:
    tensor.div_(state.world_size)
    work = dist.all_reduce(tensor, group=state.process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def _done(value: Tensor) -> torch.futures.Future[Tensor]:
    """A completed future of ``value``; CUDA-aware for a CUDA tensor (an event after its kernels)."""
    fut: torch.futures.Future[Tensor] = torch.futures.Future(devices=[value.device] if value.is_cuda else None)
    fut.set_result(value)
    return fut


def compress_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """Compress the bucket's gradients with ``state``'s algorithm and return their average.

    Example: ``ddp.register_comm_hook(CompressionState("onebit", model=model), compress_hook)``.
    """
    _advance(state, bucket)
    buf = bucket.buffer()
    _check_device(state, buf)
    layout = _layout(state, bucket)
    if state.momentum:
        _momentum_correction(state, buf, layout)
    if state.iteration < state.start_iter:
        return _allreduce_fut(state, buf)
    if not layout.entries:
        return _allreduce_fut(state, buf)
    if getattr(state.compressor.codec, "low_rank", False):
        return _powersgd(state, buf, layout)
    return _compressed(state, buf, layout)


def _momentum_correction(state: CompressionState, buf: Tensor, layout: _Layout) -> None:
    """u = m u + g per gradient, sent instead of g (DGC's momentum correction, Lin et al. ICLR 2018).

    Compressing the velocity rather than the gradient keeps error feedback stable under momentum;
    the optimizer must then run without momentum. All-reduce is linear, so uncompressed gradients
    get the same update and the result is the global velocity.
    """
    m = state.momentum
    for off, n, name in layout.every:
        u = state.compressor.workspace(("momentum", name), buf.device).get("u", n, zero=True)
        seg = buf[off : off + n]
        u.mul_(m).add_(seg)
        seg.copy_(u)


def _compressed(state: CompressionState, buf: Tensor, layout: _Layout) -> torch.futures.Future[Tensor]:
    comp, world, group = state.compressor, state.world_size, state.process_group
    natural = comp.codec.propagates_nonfinite
    buf.div_(world)
    futures: list[torch.futures.Future[Any]] = []
    plain = None
    if layout.plain:
        plain = _gather_plain(buf, layout)
        futures.append(dist.all_reduce(plain, group=group, async_op=True).get_future())
    if state.scheme != "allgather":
        for e in layout.entries:
            x = _as_fp32(buf, e).contiguous()
            flag = None if natural else _marker(x)
            sync(x, comp, e.key, scheme=state.scheme, group=group, partitions=e.partitions)
            if flag is not None:
                dist.all_reduce(flag, group=group)
                x.add_(flag)
            buf[e.offset : e.offset + e.numel].copy_(x)
        return _finish(buf, layout, plain, futures)
    codec = comp.codec
    head = 0 if natural else _MARKER  # bytes before each gradient's wire (non-summable codecs)
    device = buf.device
    wire = torch.empty(layout.wire_size, dtype=codec.wire_dtype, device=device)
    for e in layout.entries:
        x = _as_fp32(buf, e)
        w = wire[e.wire_offset : e.wire_offset + e.wire_size]
        if codec.summable:
            comp.compress_into(x, w[: comp.wire_numel(e.numel)], e.key)
            if not natural:
                w[-1:].copy_(_marker(x))
        else:
            if not natural:
                w[:4].view(torch.float32).copy_(_marker(x))
            comp.compress_into(x, w[head : head + comp.wire_bytes(e.numel)], e.key)
    if codec.summable:
        futures.append(dist.all_reduce(wire, group=group, async_op=True).get_future())

        def decode(_: Any) -> None:
            _in_use(wire)
            for e in layout.entries:
                w = wire[e.wire_offset : e.wire_offset + e.wire_size]
                out = (
                    torch.empty(e.numel, device=device)
                    if buf.dtype != torch.float32
                    else buf[e.offset : e.offset + e.numel]
                )
                comp.decompress_into(w[: comp.wire_numel(e.numel)], out, e.key)
                if not natural:
                    out.add_(w[-1:].float())
                if buf.dtype != torch.float32:
                    buf[e.offset : e.offset + e.numel].copy_(out)

    else:
        gathered = torch.empty(world * wire.numel(), dtype=wire.dtype, device=device)
        futures.append(all_gather_bytes(gathered, wire, group, state.gather).get_future())

        def decode(_: Any) -> None:
            _in_use(wire, gathered)
            parts = gathered.view(world, -1)
            for e in layout.entries:
                out = (
                    torch.empty(e.numel, device=device)
                    if buf.dtype != torch.float32
                    else buf[e.offset : e.offset + e.numel]
                )
                flags = torch.zeros(1, device=device)
                for r in range(world):
                    w = parts[r, e.wire_offset : e.wire_offset + e.wire_size]
                    comp.decompress_into(
                        w[head : head + comp.wire_bytes(e.numel)], out, e.key, accumulate=r > 0
                    )
                    if not natural:
                        flags += w[:4].view(torch.float32)
                if not natural:
                    out.add_(flags)
                if buf.dtype != torch.float32:
                    buf[e.offset : e.offset + e.numel].copy_(out)

    return _finish(buf, layout, plain, futures, decode)


def _finish(
    buf: Tensor,
    layout: _Layout,
    plain: Tensor | None,
    futures: list[torch.futures.Future[Any]],
    decode: Callable[[Any], None] | None = None,
) -> torch.futures.Future[Tensor]:
    def finish(fut: Any) -> Tensor:
        for f in fut.value():
            f.wait()  # re-raises a collective's error here; on CUDA, orders this stream after it
        if decode is not None:
            decode(None)
        if plain is not None:
            _in_use(plain)
            _scatter_plain(buf, layout, plain)
        return buf

    if not futures:
        return _done(buf)
    return _then(torch.futures.collect_all(futures), finish, buf.device)


def _then(
    fut: torch.futures.Future[Any], fn: Callable[[Any], Tensor], device: torch.device
) -> torch.futures.Future[Tensor]:
    """``fut.then(fn)``; for a non-CPU ``device`` the result is a CUDA-aware future.

    A future's ``then`` is CUDA-aware only if the future is; ``collect_all``'s need not be, and
    gloo's futures are not. A future made with ``devices=[device]`` records an event on the current
    stream (the one ``fn`` queued its kernels on) when ``fn``'s result is set, and ``wait()``
    (DDP's) makes the waiter's stream wait for it.
    """
    if device.type == "cpu":
        return fut.then(fn)
    out: torch.futures.Future[Tensor] = torch.futures.Future(devices=[device])

    def run(done: Any) -> None:
        try:
            value = fn(done)
        except Exception as exc:  # the hook's waiter sees the error, as with then()
            out.set_exception(exc)  # type: ignore[arg-type]  # torch types the argument as T
        else:
            out.set_result(value)

    fut.then(run)
    return out


def _in_use(*tensors: Tensor) -> None:
    """Mark CUDA tensors made on another stream as used on the current one (a callback's stream),
    so that the caching allocator does not hand their memory out before the queued kernels ran."""
    for t in tensors:
        if t.is_cuda:
            t.record_stream(torch.cuda.current_stream(t.device))


def _powersgd(state: CompressionState, buf: Tensor, layout: _Layout) -> torch.futures.Future[Tensor]:
    """PowerSGD (Vogels et al., NeurIPS 2019) per matrix, P and Q all-reduced over the group.

    1. M += error (error feedback); keep M.  2. P = M Q (Q warm-started, the same on all ranks).
    3. all-reduce [P..., uncompressed gradients] in one batch (waited here, in the hook's thread).
    4. orthonormalise P; Q^T = P^T M; all-reduce Q^T (async).  5. M ~ P Q^T; error = M - P Q^T / N.
    """
    comp, group = state.compressor, state.process_group
    codec: Any = comp.codec
    buf.div_(state.world_size)
    device = buf.device
    p_total = sum(e.shape[0] * _rank(codec, e) for e in layout.entries)
    batch = torch.empty(p_total + layout.plain_numel, device=device)
    mats, ps, qts = [], [], []
    at = 0
    for e in layout.entries:
        rows, r = e.shape[0], _rank(codec, e)
        cols = e.numel // rows
        ws = comp.workspace(e.key, device)
        x = _as_fp32(buf, e)
        if comp.error_feedback:
            err = ws.get("ef", e.numel, zero=True)
            err.add_(x)
            m = err.view(rows, cols)
        else:
            m = x.view(rows, cols) if x.is_contiguous() else x.contiguous().view(rows, cols)
        q = codec.initial_q(ws, cols, r, comp.key_id(e.key))
        p = batch[at : at + rows * r].view(rows, r)
        torch.mm(m, q, out=p)
        at += rows * r
        mats.append(m)
        ps.append(p)
    for off, n in layout.plain:
        batch[at : at + n].copy_(buf[off : off + n])
        at += n
    dist.all_reduce(batch, group=group, async_op=True).wait()  # round 1 (in this thread: ordered)
    qt_numel = sum(_rank(codec, e) * (e.numel // e.shape[0]) for e in layout.entries)
    qt_all = torch.empty(qt_numel, device=device)
    at = 0
    for e, p, m in zip(layout.entries, ps, mats, strict=True):
        r, cols = _rank(codec, e), e.numel // e.shape[0]
        orthonormalize(p)
        qt = qt_all[at : at + r * cols].view(r, cols)
        torch.mm(p.t(), m, out=qt)
        qts.append(qt)
        at += r * cols
    work = dist.all_reduce(qt_all, group=group, async_op=True)  # round 2

    def finish(fut: Any) -> Tensor:
        fut.wait()
        _in_use(batch, qt_all)
        for e, p, m, qt in zip(layout.entries, ps, mats, qts, strict=True):
            ws = comp.workspace(e.key, device)
            if codec.warm_start:
                ws.get("q", qt.numel()).view(qt.shape[1], qt.shape[0]).copy_(qt.t())
            approx = torch.mm(p, qt)
            if comp.error_feedback:
                # m is this rank's g/N + e; P Q^T approximates the sum over ranks of those, so this
                # rank's share of what was not sent is (g/N + e) - P Q^T / N (sums to the total residual)
                m.sub_(approx, alpha=1.0 / state.world_size)
            buf[e.offset : e.offset + e.numel].copy_(approx.view(-1))
        at = batch.numel() - layout.plain_numel
        for off, n in layout.plain:
            buf[off : off + n].copy_(batch[at : at + n])
            at += n
        return buf

    return _then(work.get_future(), finish, device)


def _rank(codec: Any, e: _Entry) -> int:
    rows = e.shape[0]
    return int(min(rows, e.numel // rows, codec.matrix_rank))


def powersgd_hook(state: CompressionState, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """PowerSGD hook: ``CompressionState("powersgd", rank=r, model=model)`` + this (same as ``compress_hook``)."""
    return compress_hook(state, bucket)


def hook_for(algorithm: str) -> Callable[[CompressionState, dist.GradBucket], torch.futures.Future[Tensor]]:
    """The hook to register for ``algorithm`` (all algorithms share ``compress_hook``); UserError for a
    name that is not registered."""
    from trainsim.compress.base import registered

    registered(algorithm)  # the name is checked here, not at the first bucket
    return powersgd_hook if algorithm == "powersgd" else compress_hook
