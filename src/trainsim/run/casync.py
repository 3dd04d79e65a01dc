"""CaSync: compression-aware synchronisation of one flat gradient on torch.distributed.

    >>> # in each of N processes, after init_process_group("gloo", ...):
    >>> from trainsim.compress import make                        # doctest: +SKIP
    >>> from trainsim.run.casync import sync                      # doctest: +SKIP
    >>> c = make("tbq")                                           # doctest: +SKIP
    >>> sync(grad.div_(world), c, key="fc.weight", scheme="ps", partitions=2)  # doctest: +SKIP

Compressed gradients cannot be summed by all-reduce (a sum of bit masks means nothing), so HiPress
(SOSP'21, §3) composes synchronisation from communication primitives (gather, broadcast,
all-gather, send/recv) and compute primitives (encode, decode, decode-and-merge). Three schemes:

* ``allgather``: every rank encodes its gradient, all-gathers the compressed parts, and decodes
  and sums them locally. One round; the traffic per rank is (N-1) compressed copies.
* ``ps``: the gradient is split into K partitions, partition p owned by rank p mod N (co-located
  parameter servers). 1. every rank encodes partition p and gathers it to the owner; 2. the owner
  decodes and sums the N parts, re-encodes the sum and 3. broadcasts it; 4. all ranks decode it.
  The K gathers are issued before any partition is decoded, so the owners' decode overlaps the
  transfers of later partitions (the pipeline of §3.3).
* ``ring``: a reduce-scatter ring in which every hop decodes the incoming partial sum, adds its own
  chunk and re-encodes (N-1 hops), then an all-gather of the compressed final chunks. With K
  partitions each hop posts all K transfers first and then decodes them in order.

All ranks end with the *same* values (every rank, owners included, takes the decoded compressed
sum), so replicas never drift. Collectives are issued only from the calling thread, in the same
order on every rank; nothing is issued from a future's callback (issuing from callbacks, which run
on whichever thread completes a future, is how hooks end up with mismatched collectives on gloo).

Devices: ``x`` may be on the CPU or a CUDA device; wires and scratch live on ``x``'s device. NCCL
takes CUDA tensors; gloo takes CPU tensors, and CUDA tensors for all-reduce, broadcast, gather and
all-gather (it stages them through the host itself). gloo's point-to-point ops read and write host
memory only (a CUDA tensor aborts the process: "writev ... Bad address", torch 2.11), so the ring's
hops and the all-gather by exchange copy CUDA wires to the host around them (``_p2p_staged``).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from trainsim.compress.base import Compressor
from trainsim.errors import UserError

SCHEMES = ("allgather", "ps", "ring")


GATHER_METHODS = ("exchange", "collective")

# the tensor device types that each supported backend's collectives take
BACKEND_DEVICES: dict[str, tuple[str, ...]] = {"gloo": ("cpu", "cuda"), "nccl": ("cuda",)}


def backends_by_device(backend: str) -> dict[str, str]:
    """Device type -> backend of a process group's backend string: ``"gloo"`` gives
    ``{"cpu": "gloo", "cuda": "gloo"}``, ``"nccl"`` ``{"cuda": "nccl"}``, and a per-device string
    such as ``"cpu:gloo,cuda:nccl"`` (``init_process_group`` with no backend on a GPU host) its own
    pairs. A backend not in ``BACKEND_DEVICES`` maps no device."""
    if ":" not in backend:
        return dict.fromkeys(BACKEND_DEVICES.get(backend, ()), backend)
    pairs = (part.split(":", 1) for part in backend.split(","))
    return {dev.strip(): name.strip() for dev, name in pairs}


def _p2p_staged(t: Tensor, group: Any) -> bool:
    """True if ``t``'s point-to-point transfers must go through host memory (gloo, non-CPU tensor)."""
    if t.device.type == "cpu":
        return False
    return backends_by_device(str(dist.get_backend(group))).get(t.device.type) == "gloo"


def all_gather_bytes(out: Tensor, inp: Tensor, group: Any, method: str = "exchange") -> Any:
    """``out`` <- every rank's ``inp``, in rank order, asynchronously: a handle with ``wait()`` and
    ``get_future()`` (done once ``out`` is filled).

    ``method="exchange"`` on gloo: every receive is posted before any send (``_Exchange``). gloo's own
    all-gather sends first; a gloo sender waits for the receiver's "ready" message, and a ready message
    posted after the rank's own payload queues behind it in the socket, so the two directions of a
    link ran one after the other in a share of the calls (2 ranks, 20 Mbit/s: 132 KB per rank in 56 ms
    or in 83-109 ms; two all-gathers back to back 127-198 ms, the exchange 126-142 ms; see
    docs/compress.md). Other backends, or ``method="collective"``: the backend's all-gather. CUDA
    tensors on gloo: the exchange stages them through host memory, the collective is gloo's own."""
    if method not in GATHER_METHODS:
        raise UserError(f"all-gather method {method!r}; expected one of {', '.join(GATHER_METHODS)}")
    backend = backends_by_device(str(dist.get_backend(group))).get(out.device.type)
    if method == "collective" or backend != "gloo":
        gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return gather_single(out, inp, group=group, async_op=True)
    return _Exchange(out, inp, group)


class _Exchange:
    """An all-gather by point-to-point operations: receives from every peer, then sends to every peer.

    gloo's point-to-point works have no futures; ``get_future()`` hands the waiting to one daemon
    thread per process (``_waiter``), which completes the future, so its callbacks run there (as a
    collective's run on gloo's thread). Handles are waited for in the order they were made, the order
    every rank posted them in.

    CUDA tensors (gloo's point-to-point takes host memory only): ``inp`` is copied to the host
    before the sends, the receives land in a host buffer, and ``wait()`` copies it into ``out`` and
    waits for that copy, so ``out`` is ready on the device when the handle or its future is done."""

    def __init__(self, out: Tensor, inp: Tensor, group: Any) -> None:
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        if out.numel() != world * inp.numel() or out.dtype != inp.dtype:
            raise ValueError(f"all-gather: out has {out.numel()} {out.dtype}, expected {world} x {inp.numel()} {inp.dtype}")
        self.out = out
        self._host: Tensor | None = None  # the host copy of out, for a tensor on another device
        if out.device.type != "cpu":
            inp = inp.cpu()  # waits for the kernels that wrote inp
            self._host = inp.new_empty(out.shape)
        parts = (out if self._host is None else self._host).view(world, -1)
        parts[rank].copy_(inp.view(-1))
        peers = [(rank + i) % world for i in range(1, world)]
        self.works = [_work(dist.irecv(parts[p], group=group, group_src=p)) for p in reversed(peers)]
        self.works += [_work(dist.isend(inp, group=group, group_dst=p)) for p in peers]

    def wait(self) -> bool:
        for w in self.works:
            w.wait()
        if self._host is not None:
            self.out.copy_(self._host)
            # the future's waiters may run on other streams: the copy must be over, not just queued
            torch.cuda.current_stream(self.out.device).synchronize()
            self._host = None
        return True

    def get_future(self) -> torch.futures.Future[list[Tensor]]:
        fut: torch.futures.Future[list[Tensor]] = torch.futures.Future()
        _waiter().put((self, fut))
        return fut


_WAIT_QUEUE: Any = None


def _waiter() -> Any:
    """The queue of ``(handle, future)`` that one daemon thread waits for, in order."""
    global _WAIT_QUEUE
    if _WAIT_QUEUE is None:
        import queue
        import threading

        q: queue.SimpleQueue[tuple[_Exchange, torch.futures.Future[list[Tensor]]]] = queue.SimpleQueue()

        def run() -> None:
            while True:
                handle, fut = q.get()
                try:
                    handle.wait()
                except Exception as e:  # a peer's failure or timeout reaches the future's waiter
                    fut.set_exception(e)  # type: ignore[arg-type]  # torch types the argument as T
                else:
                    fut.set_result([handle.out])

        threading.Thread(target=run, name="trainsim-allgather-wait", daemon=True).start()
        _WAIT_QUEUE = q
    return _WAIT_QUEUE


def _work(work: Any) -> Any:
    assert work is not None  # point-to-point ops return their Work in the group
    return work


def _global(group: Any, rank: int) -> int:
    return rank if group is None else dist.get_global_rank(group, rank)


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` (offset, length) chunks covering n elements, lengths differing by at most 1."""
    parts = max(1, min(parts, n))
    base, extra = divmod(n, parts)
    out, off = [], 0
    for p in range(parts):
        length = base + (1 if p < extra else 0)
        out.append((off, length))
        off += length
    return out


def allgather_sync(x: Tensor, comp: Compressor, key: Hashable, group: Any = None) -> None:
    """x <- sum over ranks of D(C(x_r)), by all-gather of the compressed parts."""
    world = dist.get_world_size(group)
    wire = comp.new_wire(x.numel(), x.device)
    comp.compress_into(x, wire, key)
    if comp.codec.summable:
        dist.all_reduce(wire, group=group)
        comp.decompress_into(wire, x, key)
        return
    gathered = torch.empty(world * wire.numel(), dtype=wire.dtype, device=x.device)
    all_gather_bytes(gathered, wire, group).wait()
    parts = gathered.view(world, -1)
    for r in range(world):
        comp.decompress_into(parts[r], x, key, accumulate=r > 0)


def ps_sync(x: Tensor, comp: Compressor, key: Hashable, group: Any = None, partitions: int = 1) -> None:
    """Parameter-server style: partition owners gather, decode-sum, re-encode and broadcast."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    chunks = split(x.numel(), partitions)
    wires, gathers, works = [], [], []
    for p, (off, length) in enumerate(chunks):  # 1. encode and gather every partition (pipelined)
        owner = p % world
        wire = comp.new_wire(length, x.device)
        comp.compress_into(x[off : off + length], wire, (key, "ps", p))
        recv = [torch.empty_like(wire) for _ in range(world)] if rank == owner else None
        works.append(dist.gather(wire, recv, dst=_global(group, owner), group=group, async_op=True))
        wires.append(wire)
        gathers.append(recv)
    bcasts = []
    for p, (off, length) in enumerate(chunks):
        owner = p % world
        works[p].wait()
        out = wires[p]
        if rank == owner:  # 2. decode and sum, re-encode (own residual for the server side)
            seg = x[off : off + length]
            recv = gathers[p]
            assert recv is not None
            for r in range(world):
                comp.decompress_into(recv[r], seg, (key, "ps", p), accumulate=r > 0)
            comp.compress_into(seg, out, (key, "ps-server", p))
        bcasts.append(dist.broadcast(out, src=_global(group, owner), group=group, async_op=True))  # 3.
    for p, (off, length) in enumerate(chunks):  # 4. everyone takes the decoded sum
        bcasts[p].wait()
        comp.decompress_into(wires[p], x[off : off + length], (key, "ps", p))


def ring_sync(x: Tensor, comp: Compressor, key: Hashable, group: Any = None, partitions: int = 1) -> None:
    """Ring reduce-scatter with decode-sum-encode at every hop, then a compressed all-gather."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if world == 1:
        wire = comp.new_wire(x.numel(), x.device)
        comp.compress_into(x, wire, key)
        comp.decompress_into(wire, x, key)
        return
    right, left = _global(group, (rank + 1) % world), _global(group, (rank - 1) % world)
    segs = split(x.numel(), partitions)
    n_chunk = [max(1, -(-length // world)) for _, length in segs]  # ceil: chunks padded to equal size
    staged = _p2p_staged(x, group)  # hops through host memory (gloo, CUDA x)
    bufs = []
    for (off, length), c in zip(segs, n_chunk, strict=True):
        buf = torch.zeros(world * c, device=x.device)
        buf[:length].copy_(x[off : off + length])
        bufs.append(buf.view(world, c))
    for s in range(world - 1):
        sends, recvs, in_wires = [], [], []
        for p, buf in enumerate(bufs):  # post every partition's hop before decoding any
            send_chunk = (rank - s) % world
            wire = comp.new_wire(n_chunk[p], x.device)
            comp.compress_into(buf[send_chunk], wire, (key, "ring", p, send_chunk))
            if staged:
                wire = wire.cpu()  # waits for the encode
            inc = torch.empty_like(wire)
            sends.append(_work(dist.isend(wire, right, group=group, tag=p)))
            recvs.append(_work(dist.irecv(inc, left, group=group, tag=p)))
            in_wires.append(inc)
        for p, buf in enumerate(bufs):
            recvs[p].wait()
            recv_chunk = (rank - s - 1) % world
            inc = in_wires[p].to(x.device)
            comp.decompress_into(inc, buf[recv_chunk], (key, "ring", p), accumulate=True)
        for w in sends:
            w.wait()
    gathers = []
    for p, buf in enumerate(bufs):  # rank holds the full sum of chunk rank+1: share it compressed
        mine = (rank + 1) % world
        wire = comp.new_wire(n_chunk[p], x.device)
        comp.compress_into(buf[mine], wire, (key, "ring-final", p))
        out = torch.empty(world * wire.numel(), dtype=wire.dtype, device=x.device)
        gathers.append((out, all_gather_bytes(out, wire, group)))
    for p, ((off, length), (out, work)) in enumerate(zip(segs, gathers, strict=True)):
        work.wait()
        parts = out.view(world, -1)
        buf = bufs[p]
        for r in range(world):
            comp.decompress_into(parts[r], buf[(r + 1) % world], (key, "ring", p))
        x[off : off + length].copy_(buf.view(-1)[:length])


def sync(
    x: Tensor,
    comp: Compressor,
    key: Hashable,
    *,
    scheme: str = "allgather",
    group: Any = None,
    partitions: int = 1,
) -> None:
    """Sum the compressed ``x`` of every rank into ``x`` (in place) by ``scheme``."""
    if x.dtype != torch.float32 or not x.is_contiguous() or x.dim() != 1:
        raise UserError(f"casync: expected a contiguous 1-D float32 tensor, got {x.dtype} {tuple(x.shape)}")
    if partitions < 1:
        raise UserError(f"casync: partitions={partitions} must be >= 1")
    if scheme == "allgather":
        allgather_sync(x, comp, key, group)
    elif scheme == "ps":
        ps_sync(x, comp, key, group, partitions)
    elif scheme == "ring":
        ring_sync(x, comp, key, group, partitions)
    else:
        raise UserError(f"casync: unknown scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
