"""What-if: gradient compression on a data-parallel job, as a transformation of the task graph.

    >>> from trainsim.transform.compression import CompressConfig, CodecCost, compression
    >>> cfg = CompressConfig(algorithm="onebit", world=2)                               # doctest: +SKIP
    >>> cost = CodecCost.calibrate("onebit")              # encode/decode fits, this machine  # doctest: +SKIP
    >>> g2 = compression(g, params, layers, shapes, cfg, cost, link)                      # doctest: +SKIP
    >>> simulate(g2).step_ms                                                              # doctest: +SKIP

It adds, per step of a single-process trace and per DDP bucket (``dataparallel.ddp_buckets``), the
tasks that ``trainsim.run.hooks.compress_hook`` really runs (see that module's numbered steps):

1. gradients left uncompressed (1-D, < ``min_numel``, or "no" in a SeCoPa plan): one all-reduce on
   the communication channel, after the bucket's gradients are ready;
2. **encode** on the main (autograd) thread right after the ready point, so it delays the rest of
   backward as the synchronous hook does: ``sum enc(n_i)``;
3. the compressed **transfer**: an all-gather of ``world x wire bytes`` (ring model of the link), or
   an all-reduce of the wire for summable codecs (fp16, bf16, random-k);
4. **decode** (decode-and-merge of every rank's part) on the thread that completes the future:
   ``sum (dec(n_i) + (world - 1) dec_add(n_i))``, a decode and then a decode that adds into the sum
   per other rank (``CodecCost.sum_us``; summable: one decode);
5. the optimizer waits for every bucket's decode and uncompressed all-reduce.

Where the process group runs collectives at once (``CompressConfig.lanes`` > 1: gloo's two worker
threads), the transfers of steps 1 and 3 and those of the next buckets overlap as they do there, the
all-gather (the hook's point-to-point exchange) on no worker thread: each takes its share of their
chain (``dataparallel.chained_bucket_us`` with per-transfer costs), from when the graph issues it;
so do the PS scheme's gathers and broadcasts (collectives, beside the bucket's plain all-reduce).

PowerSGD: P = MQ on the main thread, a blocking all-reduce of [P, uncompressed], Q = M^T P, then an
all-reduce of Q and the P Q^T decode. The PS and ring schemes (``scheme="ps" | "ring"``) run inside the
hook and block the main thread: per bucket, half the codec work of ``casync_parts`` on the main thread,
the transfers on the communication channel (so they queue behind the bucket's uncompressed all-reduce,
which shares the link; for PS the part of them that its partition pipeline does not hide behind the
codec), then the other half of the codec work.

Why one module: the graph transformation charges each bucket with the cost formulas below it
(``casync_parts``, ``ps_phases_us``, ``ps_pipeline_us``, ``CodecCost``), and ``codec_us_per_step`` and
``predict`` reuse the same ones; apart, the formulas would be a module that only this one imports.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainsim.cluster.catalog import Link
from trainsim.cluster.collectives import allgather_us, ring_allreduce_us
from trainsim.errors import UserError
from trainsim.graph.ir import EdgeKind, ResourceKind, TaskGraph, TaskKind
from trainsim.transform.dataparallel import ParamInfo, ddp_buckets, step_anchors, with_host_overhead
from trainsim.transform.primitives import add_edges, insert

SCHEMES = ("allgather", "ps", "ring")


@dataclass(frozen=True, kw_only=True, slots=True)
class CompressConfig:
    """Which algorithm, how it synchronises, which gradients."""

    algorithm: str
    """registry name (``trainsim.compress.names()``)"""
    options: Mapping[str, Any] = field(default_factory=dict)
    """algorithm options (ratio, bits, rank ...)"""
    world: int = 2
    """data-parallel ranks"""
    scheme: str = "allgather"
    """allgather | ps | ring (CaSync)"""
    min_numel: int = 1024
    """smaller gradients are all-reduced uncompressed (the hook's default)"""
    host_overhead_us: float = 0.0
    """DDP's own host work per step (``DPConfig.host_overhead_us``); the hook's own is ``hook_us``"""
    finalize_us: float = 0.0
    """the part of ``host_overhead_us`` after the last bucket's synchronisation (``DPConfig.finalize_us``)"""
    hook_us: float = 0.0
    """the hook's own host work per step beyond its codec (scaling, non-finite markers, layouts): on the
    main thread inside each hook that compresses, before its transfer, shared by the buckets in
    proportion to their compressed elements"""
    plan: Any = None
    """a ``trainsim.compress.secopa.Plan`` (compress / partitions per gradient), or None"""
    bucket_cap_mb: float = 25.0
    """DDP bucket cap"""
    channel: str = "comm:dp"
    """communication resource"""
    lanes: int = 1
    """collectives the process group runs at once (``dataparallel.BACKEND_LANES``): 1 as on NCCL, every
    transfer after the one before; gloo's runs 2, and its point-to-point all-gather (the hook's
    ``gather="exchange"``) runs beside them; so do PS's gathers and broadcasts. The ring scheme keeps one queue"""

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise UserError(
                f"compression what-if: scheme={self.scheme!r}; expected one of {', '.join(SCHEMES)}"
            )
        if self.world < 2:
            raise UserError(f"compression what-if: world={self.world}; expected >= 2 ranks")
        if not self.hook_us >= 0:
            raise UserError(f"compression what-if: hook_us={self.hook_us!r}; expected >= 0")
        if not isinstance(self.lanes, int) or self.lanes < 1:
            raise UserError(f"compression what-if: lanes={self.lanes!r}; expected a positive number of collectives at once")
        if not 0 <= self.finalize_us <= max(0.0, self.host_overhead_us):
            raise UserError(
                f"compression what-if: finalize_us={self.finalize_us!r}; expected 0 to host_overhead_us "
                f"({self.host_overhead_us!r}), of which it is a part"
            )


@dataclass(frozen=True, slots=True)
class CodecCost:
    """Encode/decode time (microseconds) of an algorithm as a function of elements, and its wire size."""

    enc_us: Callable[[int], float]
    dec_us: Callable[[int], float]
    wire_bytes: Callable[[int], int]
    summable: bool
    low_rank: bool
    fits: Mapping[str, Any] = field(default_factory=dict)
    acc_us: Callable[[int], float] | None = None
    """a decode that adds into its output (the other ranks' parts of a sum); None: ``dec_us``"""

    def dec_add_us(self, n: int) -> float:
        """Decode a wire of ``n`` elements and add it into a sum (``decompress_into(..., accumulate=True)``)."""
        return (self.acc_us if self.acc_us is not None else self.dec_us)(n)

    def sum_us(self, n: int, parts: int) -> float:
        """Decode ``parts`` wires of ``n`` elements into one sum, as the schemes do: the first part
        decoded, each other one decoded and added (``dec_add_us``)."""
        return self.dec_us(n) + max(0, parts - 1) * self.dec_add_us(n)

    @staticmethod
    def calibrate(
        algorithm: str,
        *,
        sizes: Sequence[int] | None = None,
        threads: int | None = 1,
        concurrent: int = 1,
        **options: Any,
    ) -> CodecCost:
        """Measure this machine (``secopa.calibrate_codec``) with ``threads`` intra-op threads.

        ``concurrent`` > 1 runs that many calibrating processes at once and averages them: when the
        ranks of the run share this machine's cores (an emulated cluster), each rank encodes while
        the others do, and a lone process would measure a machine that is not there.
        """
        from trainsim.compress.secopa import CAL_SIZES

        size_list = list(sizes or CAL_SIZES)
        if concurrent > 1:
            import torch.multiprocessing as mp

            ctx = mp.get_context("spawn")
            start_at = time.time() + 6.0  # after every process has imported torch: they measure together
            with ctx.Pool(concurrent) as pool:
                args = [(algorithm, size_list, threads, options, start_at)] * concurrent
                samples = pool.starmap(codec_samples, args)
        else:
            samples = [codec_samples(algorithm, size_list, threads, options)]
        return CodecCost.from_samples(algorithm, size_list, samples, options)

    @staticmethod
    def from_samples(
        algorithm: str, size_list: list[int], samples: list[dict[str, list[float]]], options: dict[str, Any]
    ) -> CodecCost:
        """Linear fits of the mean over ``samples`` (``codec_samples`` of one or more processes) of the
        per-size times."""
        from trainsim.compress import make
        from trainsim.compress.secopa import Linear

        keys = ["enc_ms", "dec_ms", "add_ms"] + (["acc_ms"] if all("acc_ms" in s for s in samples) else [])
        mean = {k: [sum(s[k][i] for s in samples) / len(samples) for i in range(len(size_list))] for k in keys}
        enc, dec = Linear.fit(size_list, mean["enc_ms"]), Linear.fit(size_list, mean["dec_ms"])
        acc = Linear.fit(size_list, mean["acc_ms"]) if "acc_ms" in mean else None
        comp = make(algorithm, **options)
        codec = comp.codec
        n_max = max(size_list)
        return CodecCost(
            enc_us=lambda n: 1e3 * enc(n),
            dec_us=lambda n: 1e3 * dec(n),
            wire_bytes=comp.wire_bytes,
            summable=bool(codec.summable),
            low_rank=bool(getattr(codec, "low_rank", False)),
            fits={
                "enc": enc,
                "dec": dec,
                "aggr": Linear.fit(size_list, mean["add_ms"]),
                **({"acc": acc} if acc is not None else {}),
                "ratio": comp.wire_bytes(n_max) / (4 * n_max),
                "samples": mean,
            },  # fmt: skip
            acc_us=(lambda n: 1e3 * acc(n)) if acc is not None else None,
        )


def codec_samples(
    algorithm: str, sizes: list[int], threads: int | None, options: dict[str, Any], start_at: float = 0.0
) -> dict[str, list[float]]:
    """Encode, decode, add and decode-and-add times (ms) of ``algorithm`` at each of ``sizes`` elements in this process
    (``secopa.calibrate_codec``) with ``threads`` intra-op threads, starting at ``start_at`` (epoch s)."""
    import torch

    time.sleep(max(0.0, start_at - time.time()))
    from trainsim.compress.secopa import calibrate_codec

    old = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        cal = calibrate_codec(algorithm, sizes=sizes, **options)
    finally:
        torch.set_num_threads(old)
    samples = cal["samples"]
    return {k: samples[k] for k in ("enc_ms", "dec_ms", "add_ms", "acc_ms")}


def _compressed(name: str, shape: Sequence[int], numel: int, cfg: CompressConfig) -> tuple[bool, int]:
    decision = cfg.plan.decision(name) if cfg.plan is not None else None
    yes = decision[0] if decision is not None else len(shape) >= 2 and numel >= cfg.min_numel
    return yes, (decision[1] if decision is not None else 1)


def _hooked(q: ParamInfo, shape: Sequence[int], cfg: CompressConfig, cost: CodecCost) -> tuple[bool, int]:
    """``_compressed``, less the matrices PowerSGD sends whole (min_compression_rate 2 at rank 1)."""
    yes, parts = _compressed(q.name, shape, q.numel, cfg)
    if yes and cost.low_rank:
        n_rows, n_cols = int(shape[0]), q.numel // int(shape[0])
        yes = (n_rows + n_cols) * 2 < n_rows * n_cols
    return yes, parts


def codec_us_per_step(
    params: Sequence[ParamInfo], shapes: Mapping[str, Sequence[int]], cfg: CompressConfig, cost: CodecCost,
    link: Link, world: int,
) -> float:  # fmt: skip
    """The codec's CPU time (us) in one training step on one of ``world`` ranks, as ``compression``
    charges it: encode plus the sum of ``world`` decoded parts per compressed gradient (``CodecCost.sum_us``;
    one decode for summable codecs), or the
    compute part of ``casync_parts`` for PS / ring. With ``world=1`` it is what a one-rank run of the
    hook spends in the codec (``trainsim.validate.compress`` subtracts it to find the hook's own cost).
    PowerSGD: its encode (both halves) and decode."""
    total = 0.0
    for q in params:
        yes, parts = _hooked(q, shapes[q.name], cfg, cost)
        if not yes:
            continue
        if cfg.scheme != "allgather" and not cost.low_rank:
            total += casync_parts(q.numel, parts, world, cost, link, cfg.scheme)[0]
        else:
            n_dec = 1 if cost.summable or cost.low_rank else world
            total += cost.enc_us(q.numel) + cost.sum_us(q.numel, n_dec)
    return total


def compression(
    g: TaskGraph,
    params: Sequence[ParamInfo],
    layers: Sequence[str],
    shapes: Mapping[str, Sequence[int]],
    cfg: CompressConfig,
    cost: CodecCost,
    link: Link,
    *,
    allreduce_time: Callable[[float], float] | None = None,
    allgather_time: Callable[[float], float] | None = None,
    p2p: tuple[float, float] | None = None,
    duplex: float = 1.0,
    ps_lines: tuple[tuple[float, float], tuple[float, float]] | None = None,
    xfer_cpu: tuple[float, float] | None = None,
) -> TaskGraph:
    """``g`` as one rank of a ``cfg.world``-rank DDP job whose buckets go through the compression hook.

    Collective times come from the ring model of ``link`` unless measured ones are given:
    ``allreduce_time(bytes)`` and ``allgather_time(bytes per rank)`` (e.g. a ``Calibration``'s
    ``predict_us`` and ``allgather_us``). The PS and ring schemes take ``p2p`` and ``duplex`` (see
    ``casync_parts``; e.g. ``cal.p2p_line()`` and ``cal.duplex_factor()``), PS also ``ps_lines``
    (``cal.ps_lines()``) and ``xfer_cpu`` (``cal.cpu_line(p2p=True)``, for ranks that fill their host's
    cores)."""
    if not params:
        raise UserError(
            f"{g.source}: the trace records no parameters; a compression what-if needs their sizes"
        )
    missing = [q.name for q in params if q.name not in shapes]
    if missing:
        raise UserError(f"compression what-if: no shape for parameter(s) {missing[:4]}")
    p = cfg.world

    def ar_us(nbytes: float) -> float:
        return allreduce_time(nbytes) if allreduce_time is not None else ring_allreduce_us(nbytes, p, link)

    def ag_us(per_rank: float) -> float:
        return allgather_time(per_rank) if allgather_time is not None else allgather_us(p * per_rank, p, link)

    # for the chains of concurrent transfers (``lanes``): sizes in bytes each rank puts on the wire
    ar_share = 2 * (p - 1) / p

    def ar_chain(nbytes: float) -> tuple[Callable[[float], float], float, bool]:
        return (lambda w: ar_us(w / ar_share)), ar_share * nbytes, True  # on one of the worker threads

    def ag_chain(per_rank: float) -> tuple[Callable[[float], float], float, bool]:
        return (lambda w: ag_us(w / (p - 1))), (p - 1) * per_rank, False  # point-to-point: no worker thread

    def ps_chain(xfer: float, wire: float) -> tuple[Callable[[float], float], float, bool]:
        # the PS scheme's gathers and broadcasts (gloo collectives): its time alone, and beside the others
        # its wire at the link's rate
        per_byte = p2p[1] if p2p is not None else 1.0 / link.bytes_per_us
        return (lambda w: xfer + (w - wire) * per_byte), wire, True

    anchors = step_anchors(g, layers)
    main_res = g.resources[int(g.resource[anchors[0].first])].name
    buckets = ddp_buckets([q.size_bytes for q in params], cap_bytes=int(cfg.bucket_cap_mb * 1024 * 1024))
    rows = _Rows(cfg.channel, main_res)
    hooked = {q.name: _hooked(q, shapes[q.name], cfg, cost) for q in params}  # (compressed?, partitions)
    n_comp = sum(q.numel for q in params if hooked[q.name][0])
    for a in anchors:
        base = float(a.step) * 1e6
        for b, idx in enumerate(buckets):
            ready = sorted({a.ready[params[i].layer] for i in idx})
            rows.main_order = float(g.order[max(ready, key=lambda t: g.order[t])])
            rows.comm_order = base + 1 + b
            rows.step = a.step
            plain_bytes, comp_items = 0, []
            for i in idx:
                q = params[i]
                yes, parts = hooked[q.name]
                if yes:
                    comp_items.append((q, parts))
                else:
                    plain_bytes += q.size_bytes
            opt_wait = [a.opt_start] if a.opt_start >= 0 else []
            if plain_bytes:  # 1. uncompressed gradients: one all-reduce after the ready point
                ar = ar_us(plain_bytes)
                rows.comm(f"allreduce:bucket{b}", ar, plain_bytes, deps=ready, waits=opt_wait,
                          chain=ar_chain(plain_bytes))  # fmt: skip
            if not comp_items:
                continue
            # the hook's own work before it posts (``hook_us``), this bucket's share of it
            own = cfg.hook_us * sum(q.numel for q, _ in comp_items) / n_comp if n_comp else 0.0
            start: dict[str, list[int]] = {"deps": ready}
            if own > 0:
                start = {"after": [rows.main(f"hook:bucket{b}", own, deps=ready)]}
            if cfg.scheme != "allgather":  # PS / ring: synchronous inside the hook
                pieces = [casync_parts(q.numel, k, p, cost, link, cfg.scheme, p2p=p2p, duplex=duplex,
                                       ps_lines=ps_lines, xfer_cpu=xfer_cpu)
                          for q, k in comp_items]  # fmt: skip
                comp_us, xfer_us = sum(c for c, _ in pieces), sum(x for _, x in pieces)
                # the codec work on the main thread, the transfers on the network (after the bucket's
                # uncompressed all-reduce, which shares the link); the main thread is blocked until
                # the sync is done: its next task in queue order is the second half of the codec work
                t_a = rows.main(f"casync-{cfg.scheme}-codec:bucket{b}", comp_us / 2, **start)
                size = sum(cost.wire_bytes(q.numel) for q, _ in comp_items)
                t_x = rows.comm(f"casync-{cfg.scheme}:bucket{b}", xfer_us, size, after=[t_a],
                                chain=ps_chain(xfer_us, size) if cfg.scheme == "ps" else None)  # fmt: skip
                rows.main(f"casync-{cfg.scheme}-codec:bucket{b}.2", comp_us / 2, after=[t_x], waits=opt_wait)
                continue
            enc = sum(cost.enc_us(q.numel) for q, _ in comp_items)
            dec = sum(cost.dec_us(q.numel) for q, _ in comp_items)
            dec_sum = sum(cost.sum_us(q.numel, p) for q, _ in comp_items)  # all-gather: every rank's part
            if cost.low_rank:
                rk = int(cfg.options.get("rank", 1))
                p_bytes = sum(4 * rk * int(shapes[q.name][0]) for q, _ in comp_items)
                q_bytes = sum(4 * rk * (q.numel // int(shapes[q.name][0])) for q, _ in comp_items)
                t_p = rows.main(f"powersgd-P:bucket{b}", enc / 2, **start)
                ar1 = rows.comm(f"allreduce:P:bucket{b}", ar_us(p_bytes), p_bytes, after=[t_p], chain=ar_chain(p_bytes))
                t_q = rows.main(f"powersgd-Q:bucket{b}", enc / 2, after=[ar1])  # blocks: the hook waits
                ar2 = rows.comm(f"allreduce:Q:bucket{b}", ar_us(q_bytes), q_bytes, after=[t_q], chain=ar_chain(q_bytes))
                rows.callback(f"decode:bucket{b}", dec, after=[ar2], waits=opt_wait)
                continue
            wire = sum(cost.wire_bytes(q.numel) + 8 for q, _ in comp_items)  # + the hook's non-finite marker
            t_enc = rows.main(f"encode:bucket{b}", enc, **start)  # 2.
            if cost.summable:  # 3.
                comm, decode, what, chain = ar_us(wire), dec, "allreduce", ar_chain(wire)
            else:
                comm, decode, what, chain = ag_us(wire), dec_sum, "allgather", ag_chain(wire)
            t_comm = rows.comm(f"{what}:compressed{b}", comm, wire, after=[t_enc], chain=chain)
            rows.callback(f"decode:bucket{b}", decode, after=[t_comm], waits=opt_wait)  # 4., 5.

    def build() -> tuple[TaskGraph, np.ndarray]:
        out, ids = _apply(g, rows, cfg, p) if rows.rows else (g, np.empty(0, np.int64))
        if cfg.host_overhead_us > 0:  # after the new tasks: DDP's finalize waits for what the optimizer waits for
            out = with_host_overhead(out, anchors, cfg.host_overhead_us, finalize_us=cfg.finalize_us)
        return out, ids  # ``with_host_overhead`` appends: the new rows keep their ids

    if cfg.lanes > 1 and cfg.scheme != "ring":
        _chain_transfers(rows, build, cfg.lanes)
    return build()[0]


CHAIN_PASSES = 4
"""at most this many simulations to settle the concurrent transfers' shares (``_chain_transfers``): one
settles them where no task on the main thread waits for a transfer; PowerSGD's waits need more"""


def _chain_transfers(rows: _Rows, build: Callable[[], tuple[TaskGraph, np.ndarray]], lanes: int) -> None:
    """Give the transfers of each step their shares of the chains they form when the process group
    runs ``lanes`` collectives at once (``dataparallel.chained_bucket_us``), in place: simulate the
    graph, read when each transfer's inputs are done (when the hook issues it), and re-time them, until
    the durations stop changing (the first pass issues them at their times alone)."""
    from trainsim.simulate.engine import simulate
    from trainsim.transform.dataparallel import chained_bucket_us

    chained = [i for i, r in enumerate(rows.rows) if r["chain"] is not None]
    if not chained:
        return
    by_step: dict[int, list[int]] = {}
    for i in sorted(chained, key=lambda i: rows.rows[i]["order"]):
        by_step.setdefault(rows.rows[i]["step"], []).append(i)
    for _ in range(CHAIN_PASSES):
        out, ids = build()
        res = simulate(out)
        ready = _ready_us(out, res.end_us, ids[chained])
        ready_of = dict(zip(chained, ready, strict=True))
        changed = False
        for members in by_step.values():
            costs, wires, marks = zip(*(rows.rows[i]["chain"] for i in members), strict=True)
            durs = chained_bucket_us([ready_of[i] for i in members], wires, costs, lanes=lanes, collective=marks)
            for i, d in zip(members, durs, strict=True):
                changed |= abs(rows.rows[i]["dur"] - d) > 1e-6
                rows.rows[i]["dur"] = d
        if not changed:
            return


def _ready_us(g: TaskGraph, end_us: np.ndarray, tasks: np.ndarray) -> np.ndarray:
    """When each of ``tasks`` could start by its explicit predecessors (their end plus the edge's lag)."""
    ready = np.full(g.n_tasks, -np.inf)
    np.maximum.at(ready, g.edge_dst, end_us[g.edge_src] + g.edge_lag_us)  # one pass over the edges
    out = ready[tasks]
    return np.where(np.isfinite(out), out, 0.0)  # no predecessor: 0


CALLBACK_THREAD = "cpu:hook-callback"
"""the resource of the work done on the thread that completes a collective's future (decode-and-merge)"""


class _Rows:
    """New tasks as plain rows; ``deps``/``waits`` are old task ids, ``after`` indices of new rows."""

    def __init__(self, channel: str, main_res: str) -> None:
        self.rows: list[dict[str, Any]] = []
        self.channel, self.main_res = channel, main_res
        self.main_order = self.comm_order = 0.0
        self.step = 0
        self._bump = 0

    def _add(self, res: str, name: str, dur: float, order: float, size: int, deps: list[int] | None,
             after: list[int] | None, waits: list[int] | None, chain: Any = None) -> int:  # fmt: skip
        kind = TaskKind.COMM if res == self.channel else TaskKind.CPU
        self.rows.append({"name": name, "res": res, "kind": kind, "dur": dur, "order": order, "step": self.step,
                          "size": size, "deps": deps or [], "after": after or [], "waits": waits or [],
                          "chain": chain})  # fmt: skip
        return len(self.rows) - 1

    def main(self, name: str, dur: float, *, deps: list[int] | None = None, after: list[int] | None = None,
             waits: list[int] | None = None) -> int:  # fmt: skip
        """On the main thread right after the ready point: it delays the rest of backward."""
        self._bump += 1
        return self._add(
            self.main_res, name, dur, self.main_order + 1e-3 * self._bump, -1, deps, after, waits
        )

    def comm(self, name: str, dur: float, size: int, *, deps: list[int] | None = None, after: list[int] | None = None,
             waits: list[int] | None = None, chain: tuple[Callable[[float], float], float, bool] | None = None) -> int:  # fmt: skip
        """A transfer on the channel; ``chain``: its cost by the bytes a rank puts on the wire, those bytes, and
        whether it takes one of the process group's worker threads (``_chain_transfers``)."""
        return self._add(
            self.channel, name, dur, self.comm_order + 1e-3 * len(self.rows), size, deps, after, waits, chain
        )

    def callback(
        self, name: str, dur: float, *, after: list[int] | None = None, waits: list[int] | None = None
    ) -> int:
        """On the thread that completes the collective's future (decode-and-merge)."""
        order = self.comm_order + 1e-3 * len(self.rows)
        return self._add(CALLBACK_THREAD, name, dur, order, -1, None, after, waits)


def _apply(g: TaskGraph, table: _Rows, cfg: CompressConfig, p: int) -> tuple[TaskGraph, np.ndarray]:
    """``g`` with ``table``'s rows and their edges, and the rows' task ids."""
    rows = table.rows
    res_kinds = {r["res"] for r in rows}
    out = g
    new_ids = np.empty(len(rows), np.int64)
    for res in sorted(res_kinds):  # insert per resource so each gets the right kind when created
        sel = [i for i, r in enumerate(rows) if r["res"] == res]
        kind = ResourceKind.COMM_CHANNEL if res == cfg.channel else ResourceKind.CPU_THREAD
        out, ids = insert(
            out, name=[rows[i]["name"] for i in sel], kind=[rows[i]["kind"] for i in sel], resource=res,
            dur_us=np.array([max(0.0, rows[i]["dur"]) for i in sel]), order=np.array([rows[i]["order"] for i in sel]),
            resource_kind=kind, step=np.array([rows[i]["step"] for i in sel], np.int32),
            size_bytes=np.array([rows[i]["size"] for i in sel], np.int64), group=f"dp{p}-compress",
        )  # fmt: skip
        new_ids[sel] = ids
    src: list[int] = []
    dst: list[int] = []
    for i, r in enumerate(rows):
        t = int(new_ids[i])
        for d in r["deps"]:
            src.append(int(d))
            dst.append(t)
        for j in r["after"]:
            src.append(int(new_ids[j]))
            dst.append(t)
        for w in r["waits"]:
            src.append(t)
            dst.append(int(w))
    return add_edges(out, src, dst, EdgeKind.COMM), new_ids


def casync_us(numel: int, parts: int, world: int, cost: CodecCost, link: Link, scheme: str) -> float:
    """Time (us) of ``trainsim.run.casync`` PS or ring on one gradient: ``sum(casync_parts(...))``."""
    return sum(casync_parts(numel, parts, world, cost, link, scheme))


def casync_parts(
    numel: int,
    parts: int,
    world: int,
    cost: CodecCost,
    link: Link,
    scheme: str,
    *,
    p2p: tuple[float, float] | None = None,
    duplex: float = 1.0,
    ps_lines: tuple[tuple[float, float], tuple[float, float]] | None = None,
    xfer_cpu: tuple[float, float] | None = None,
) -> tuple[float, float]:
    """``(compute_us, transfer_us)`` of ``trainsim.run.casync`` PS or ring on one gradient, as that
    code runs it, on the busiest rank.

    Unlike SeCoPa's planning formulas (HiPress's, which assume the K owners work fully in
    parallel), this counts what each rank of our implementation does: PS: encode all K partitions;
    the gathers (an owner takes N-1 wires per partition it owns); the owners decode N parts and
    re-encode; the broadcasts; decode all K. Ring: N-1 hops of K (encode, send, decode-add) on
    chunks of m/(K N), then a compressed all-gather and N K decodes. The transfers use the network,
    the rest the rank's CPU.

    Transfers cost ``latency + bytes * per_byte`` (``p2p``: a measured point-to-point line, else the
    link's), times ``duplex`` (``Calibration.duplex_factor``) while the rank sends and receives at once:
    in a PS phase with K >= 2 partitions each rank owns some and sends the others', and every ring hop.
    ``ps_lines``: the measured lines of the PS scheme's own primitives, gather and broadcast
    (``Calibration.ps_lines``), used for its two phases instead of ``p2p``.

    PS runs its K partitions as a pipeline (``casync.ps_sync``: every gather issued as its partition is
    encoded, each broadcast as its partition is summed), so its codec work overlaps the transfers of
    the other partitions: ``transfer_us`` is then what the pipeline (``ps_pipeline_us``) takes beyond
    ``compute_us``, less than the network's busy time (``ps_phases_us``) for K >= 2. ``xfer_cpu``:
    ``(c0 us, c1 us/byte)``, the host CPU of one send or receive of S bytes on a rank with one core
    (``Calibration.cpu_line(p2p=True)``), which that overlap cannot hide (``ps_pipeline_us``).
    """
    k = max(1, min(parts, numel))
    n = world
    latency, per_byte = p2p if p2p is not None else (link.latency_us, 1.0 / link.bytes_per_us)
    if scheme == "ps":
        part = int(numel / k)
        enc, dec, summed = cost.enc_us(part), cost.dec_us(part), cost.sum_us(part, n)
        owned = -(-k // n)  # partitions of the busiest owner
        compute = k * enc + owned * (summed + enc) + k * dec
        gather, bcast = ps_phases_us(numel, k, n, cost, lines=ps_lines or ((latency, per_byte), (latency, per_byte)),
                                     duplex=duplex)  # fmt: skip
        c0, c1 = xfer_cpu or (0.0, 0.0)
        span = ps_pipeline_us(k, n, enc, dec, gather, bcast, sum_us=summed,
                              xfer_cpu_us=c0 + c1 * cost.wire_bytes(max(1, part)))  # fmt: skip
        return compute, span - compute
    if scheme == "ring":
        chunk = max(1, -(-numel // (k * n)))
        wire = cost.wire_bytes(chunk)
        hop_compute = k * (cost.enc_us(chunk) + cost.dec_add_us(chunk))
        hop_transfer = k * wire * per_byte * duplex + latency
        compute = (n - 1) * hop_compute + k * cost.enc_us(chunk) + k * n * cost.dec_us(chunk)
        return compute, (n - 1) * hop_transfer + allgather_us(n * wire * k, n, link)
    raise UserError(f"casync: unknown scheme {scheme!r}; expected ps or ring")


def ps_phases_us(
    numel: int, parts: int, world: int, cost: CodecCost, *, lines: tuple[tuple[float, float], tuple[float, float]],
    duplex: float = 1.0,
) -> tuple[float, float]:  # fmt: skip
    """Network time (us) of the PS scheme's gather and broadcast phases on the busiest owner: per phase
    it takes (N-1) wires per partition it owns and sends one wire for each partition it does not own,
    ``max(in, out) * us_per_byte * duplex`` (duplex while both directions are in use) plus a latency
    per partition; ``lines``: ``(latency_us, us_per_byte)`` of a gather and of a broadcast."""
    k, n = max(1, min(parts, numel)), world
    wire = cost.wire_bytes(max(1, int(numel / k)))
    owned = -(-k // n)
    inbound, outbound = owned * (n - 1) * wire, (k - owned) * wire
    both = duplex if inbound > 0 and outbound > 0 else 1.0
    gather, bcast = (max(inbound, outbound) * b * both + k * a for a, b in lines)
    return gather, bcast


def ps_pipeline_us(
    parts: int, world: int, enc_us: float, dec_us: float, gather_us: float, bcast_us: float,
    sum_us: float | None = None, xfer_cpu_us: float = 0.0,
) -> float:  # fmt: skip
    """Span (us) of ``casync.ps_sync`` on one gradient of ``parts`` partitions on the busiest owner
    (which owns partitions 0, N, 2N ...), its codec on the rank's one thread and the transfers in
    issue order on the network, each partition's transfer ``1/parts`` of its phase's time: encode every
    partition, each gather issued as its encode ends; for each partition in turn, wait for its gather,
    and if owned decode and sum N parts (``sum_us``, default ``N dec``) and re-encode (a partition of the other owners is
    summed by them at the same time) before its broadcast is issued; then wait for each broadcast and
    decode it. One partition: the serial sum of the five.

    ``xfer_cpu_us``: the host CPU of one partition's transfer on this rank (a send or receive of one
    wire, ``Calibration.cpu_line(p2p=True)``) where the rank has one core to itself and its codec: a
    transfer that runs while the codec works takes up to that much of the core, and the codec's
    chain ends that much later (the overlap's CPU, at most ``xfer_cpu_us`` per transfer, added once
    to the span). Where the rank waits for the transfer, its CPU hides in the wait: one partition
    is unchanged."""
    k = max(1, parts)
    t_g, t_b = gather_us / k, bcast_us / k
    serve = (world * dec_us if sum_us is None else sum_us) + enc_us
    cpu = net = 0.0
    busy: list[tuple[float, float]] = []  # the codec's intervals on the rank's thread
    moving: list[tuple[float, float]] = []  # the transfers' intervals
    gathered = []
    for _ in range(k):
        busy.append((cpu, cpu + enc_us))
        cpu += enc_us
        start = max(cpu, net)
        net = start + t_g
        moving.append((start, net))
        gathered.append(net)
    ready = []
    for p in range(k):
        if p % world == 0:
            start = max(cpu, gathered[p])
            cpu = start + serve
            busy.append((start, cpu))
            ready.append(cpu)
        else:
            ready.append(gathered[p] + serve)
    for p in range(k):
        start = max(net, ready[p])
        net = start + t_b
        moving.append((start, net))
        cpu = max(cpu, net) + dec_us
        busy.append((cpu - dec_us, cpu))
    if xfer_cpu_us <= 0:
        return cpu
    stolen = sum(min(xfer_cpu_us, sum(max(0.0, min(b1, m1) - max(b0, m0)) for b0, b1 in busy)) for m0, m1 in moving)
    return cpu + stolen


def _secopa_constants(cost: CodecCost, link: Link, world: int) -> Any:
    from trainsim.compress.secopa import Constants, Linear

    per_byte_ms = 1e-3 / link.bytes_per_us
    lat_ms = 1e-3 * link.latency_us
    many = Linear((world - 1) * per_byte_ms, lat_ms, lat_ms)
    return Constants(enc=cost.fits["enc"], dec=cost.fits["dec"], aggr=cost.fits["aggr"], gather=many, bcast=many,
                     send=Linear(per_byte_ms, lat_ms, lat_ms))  # fmt: skip


def predict(
    trace: str,
    *,
    algorithm: str,
    options: Mapping[str, Any] | None = None,
    world: int = 2,
    bw_gbyte_s: float = 1.25,
    latency_us: float = 50.0,
    scheme: str = "allgather",
    plan: str | None = None,
) -> dict[str, Any]:
    """Plain vs compressed DDP step time (ms) of a profiled trace: the entry point for ``whatif --compress``.

    ``trace`` was written by ``trainsim profile`` (its ``<trace>.trainsim.json`` sidecar gives the
    parameters and shapes); the link is ``bw_gbyte_s`` GB/s per direction with ``latency_us``; ``plan``
    is a SeCoPa plan file. The codec is calibrated on this machine (one thread).
    """
    import json
    from pathlib import Path

    from trainsim.capture.profile import sidecar_path
    from trainsim.compress.secopa import Plan
    from trainsim.graph.build import load_trace
    from trainsim.simulate.engine import simulate
    from trainsim.transform.dataparallel import DPConfig, data_parallel, dp_step_ms, read_params

    side = sidecar_path(trace)
    params, layers = read_params(side)
    try:
        shapes = {str(p["name"]): tuple(p["shape"]) for p in json.loads(Path(side).read_text())["params"]}
    except (KeyError, TypeError, ValueError, OSError):
        raise UserError(f"{side}: params need a 'shape' for the compression what-if") from None
    g = load_trace(trace)
    link = Link(name="whatif", bw_gbyte_s=bw_gbyte_s, latency_us=latency_us)
    loaded = Plan.load(plan) if plan else None
    if loaded is not None:
        loaded.check_names(shapes)
        # the hooks take the algorithm, the topology and the world size from the plan
        # (``run.hooks.state_from_plan``): a what-if with other ones would not be the run it predicts
        for what, given, planned in (("algorithm", algorithm, loaded.algorithm), ("scheme", scheme, loaded.topology),
                                     ("world", world, loaded.world_size)):  # fmt: skip
            if given != planned:
                raise UserError(f"{loaded.source}: the plan is for {what} {planned!r}; got {what} {given!r}")
        if options is None:
            options = loaded.options
    cfg = CompressConfig(
        algorithm=algorithm, options=dict(options or {}), world=world, scheme=scheme, plan=loaded
    )
    cost = CodecCost.calibrate(algorithm, **dict(options or {}))
    plain = data_parallel(
        g, params, layers, DPConfig(world=world), comm_us=lambda b: ring_allreduce_us(b, world, link)
    )
    comp = compression(g, params, layers, shapes, cfg, cost, link)
    return {
        "algorithm": algorithm,
        "world": world,
        "bw_gbyte_s": bw_gbyte_s,
        "latency_us": latency_us,
        "scheme": scheme,
        "plain_ddp_ms": dp_step_ms(simulate(plain).step_ms, "ddp"),
        "compressed_ms": dp_step_ms(simulate(comp).step_ms, "ddp"),
        "wire_ratio": cost.fits["ratio"],
    }
