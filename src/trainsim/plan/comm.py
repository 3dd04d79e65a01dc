"""Communication terms the estimate adds up: sharded data parallel, context parallel, expert all-to-all.

    >>> from trainsim.plan.comm import sharded_bytes
    >>> t = sharded_bytes(params=1_000_000, shard=4, zero=3, reshard=True)
    >>> t.ag_fwd, t.ag_bwd, t.rs      # bytes one GPU receives per micro-batch (16-bit weights, grads)
    (1500000.0, 1500000.0, 1500000.0)

Every function is for **one GPU**, and a collective over ``n`` ranks of a full buffer of ``S`` bytes
moves ``(n-1)/n * S`` bytes in and out of each GPU (ring all-gather / reduce-scatter; NCCL's bus-bandwidth
convention). A group's bandwidth is the slower of its links: NVLink when all members share a node, else
``min(nvlink, nic * members_per_node)`` (``estimate.group_bw``: one NIC per GPU, one ring per NIC).

**Sharded data parallel** (Rajbhandari et al., "ZeRO", SC'20 §5; Zhao et al., "PyTorch FSDP", VLDB'23 §3-4),
per layer and micro-batch, with 16-bit weights and gradients:

====================  ===========================  ===========================  =======================
variant               forward                      backward                     once per step
====================  ===========================  ===========================  =======================
ZeRO-1                -                            -                            RS grads + AG weights
ZeRO-2                -                            RS grads                     AG weights
ZeRO-3 / FSDP full    AG weights                   AG weights + RS grads        -
FSDP no reshard       AG weights                   RS grads                     -
====================  ===========================  ===========================  =======================

ZeRO-2 and -3 cannot accumulate whole gradients (they hold only a shard), so under gradient
accumulation they reduce-scatter every micro-batch, and ZeRO-3 re-gathers every layer every
micro-batch. Gathers are prefetched one layer ahead (``overlapped_s``): layer ``l+1``'s all-gather runs
while layer ``l`` computes, and only what does not fit behind ``overlap`` x the layer's compute is
exposed, plus the first gather of a pass and the last reduce-scatter.

**Context parallel** (``cp`` ranks, sequence split ``cp`` ways): *ring* attention (Liu et al., "Ring
Attention", 2023) passes K/V chunks around the ring in ``cp - 1`` steps, each overlapped with the
attention of the chunk in hand; backward passes K/V and their gradients (twice the bytes).
*all-gather* attention (Llama 3, Grattafiori et al. 2024 §3.3.2) gathers all K/V before attention and
reduce-scatters their gradients after it, exposed.

**Expert all-to-all**: each GPU sends each routed token's hidden vector to the GPU holding its expert
(dispatch) and gets it back (combine); peers on the same node are reached over NVLink and the rest
over the NIC, both at once (``all_to_all_s``). A node-deduplicating dispatch (DeepEP; DeepSeek-V3
technical report §3.2.2) sends a token over the network once per other node that hosts one of its
experts and forwards it over NVLink inside that node (``node_dispatch_copies``, ``node_all_to_all_s``);
group-limited routing (DeepSeek-V3: top 4 of 8 expert groups) bounds how many nodes that is.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

from trainsim.plan.optime import Efficiency

PARAM_BYTES = 2  # 16-bit weights gathered and 16-bit gradients reduce-scattered (FSDP mixed precision)


class Term(NamedTuple):
    """One time term of a step on the slowest stage, with the inputs of its formula (``--explain``)."""

    name: str
    seconds: float  # what it adds to the step (exposed), per step
    busy_s: float  # how long the operation runs, hidden or not, per step
    times: float  # occurrences per step
    size_bytes: float  # bytes per GPU per occurrence (0 for compute)
    link: str  # tensor cores | hbm | nvlink | network | -
    bw_gbps: float  # datasheet bandwidth used (GB/s), or peak TFLOP/s for compute
    eff: float  # fraction of it reached
    flops: float  # FLOPs per GPU per step (compute terms)
    note: str = ""


# =============================================================================== sharded data parallel
class ShardedBytes(NamedTuple):
    """Bytes one GPU receives for one layer: per micro-batch (``ag_fwd``, ``ag_bwd``, ``rs``), per step (``step``)."""

    ag_fwd: float
    ag_bwd: float
    rs: float
    step: float  # ZeRO-1/2: gradient reduce-scatter and/or weight all-gather once per step


def sharded_bytes(*, params: float, shard: int, zero: int, reshard: bool = True) -> ShardedBytes:
    """The table in the module docstring, for a layer of ``params`` parameters sharded ``shard`` ways."""
    if shard <= 1 or zero == 0:
        return ShardedBytes(0.0, 0.0, 0.0, 0.0)
    full = PARAM_BYTES * params * (shard - 1) / shard
    if zero == 1:
        return ShardedBytes(0.0, 0.0, 0.0, 2 * full)
    if zero == 2:
        return ShardedBytes(0.0, 0.0, full, full)
    return ShardedBytes(full, full if reshard else 0.0, full, 0.0)


def collective_s(moved_bytes: float, bw_gbyte_s: float, eff: Efficiency, *, on_nvlink: bool, n: int) -> float:
    """Time of a ring all-gather or reduce-scatter in which each GPU moves ``moved_bytes``: bandwidth term,
    a fixed launch latency, and ``ring_hop_us`` for each of the ``n - 1`` ring steps (so a ring over
    thousands of ranks pays milliseconds however small its buffer)."""
    if moved_bytes <= 0 or n <= 1:
        return 0.0
    e = eff.nvlink if on_nvlink else eff.network
    return moved_bytes / (bw_gbyte_s * 1e9 * e) + (eff.comm_latency_us * 0.5 * math.log2(2 * n) + eff.ring_hop_us * (n - 1)) * 1e-6


def overlapped_s(compute: np.ndarray, during: np.ndarray, *, first: float, last: float, overlap: float) -> float:
    """Exposed communication of a pass over layers with one-layer prefetch.

    1. ``first`` (the gather of the first layer) cannot be prefetched: exposed.
    2. While layer ``l`` computes for ``compute[l]`` s, ``during[l]`` s of communication run on their own
       stream; ``overlap * compute[l]`` of it is hidden, the rest exposed.
    3. ``last`` (the reduce-scatter of the last layer) follows the pass: exposed.
    """
    hidden = np.maximum(0.0, during - overlap * compute)
    return float(first + hidden.sum() + last)


def fsdp_pass_s(
    f: np.ndarray, b: np.ndarray, ag: np.ndarray, rs: np.ndarray, *, zero: int, reshard: bool, overlap: float
) -> tuple[float, float]:
    """(forward, backward) exposed seconds per micro-batch of sharded DP over a stage's layers.

    ``ag``, ``rs``: per-layer all-gather and reduce-scatter seconds (0 where the variant has none).
    Forward runs layers 0..L-1 prefetching ``ag[l+1]``; backward runs L-1..0, prefetching ``ag[l-1]``
    (when resharded) while reduce-scattering ``rs[l+1]``, the gradients of the layer just finished.
    """
    if len(f) == 0:
        return 0.0, 0.0
    fwd = 0.0
    during = np.zeros(len(f) + 1)
    if zero == 3:
        during[:-2] = ag[1:]  # ag[l+1], prefetched during layer l's forward
        fwd = overlapped_s(f, during[:-1], first=float(ag[0]), last=0.0, overlap=overlap)
    bwd = 0.0
    if zero >= 2:
        during[:] = 0.0
        during[:-2] = rs[1:]  # rs[l+1], reduce-scattered during layer l's backward
        first = 0.0
        if zero == 3 and reshard:
            during[1:-1] += ag[:-1]  # ag[l-1], gathered during layer l's backward
            first = float(ag[-1])
        bwd = overlapped_s(b, during[:-1], first=first, last=float(rs[0]), overlap=overlap)
    return fwd, bwd


# =============================================================================== context parallel
Seconds = float | np.ndarray  # a scalar, or one value per layer


class CpTime(NamedTuple):
    fwd: Seconds  # exposed seconds per micro-batch, forward
    bwd: Seconds  # exposed seconds per micro-batch, backward
    busy: Seconds  # seconds the transfers run, forward + backward
    steps: int  # transfer steps per pass (ring: cp - 1; all-gather: 1)


def ring_attention_s(
    kv_chunk_bytes: Seconds, attn_fwd_s: Seconds, cp: int, bw_gbyte_s: float, eff: Efficiency, *, on_nvlink: bool,
    attn_bwd_ratio: float = 2.5,
) -> CpTime:
    """Ring attention over ``cp`` ranks for one layer and micro-batch (scalars, or arrays over layers).

    ``kv_chunk_bytes``: this rank's K and V (what it sends each step); ``attn_fwd_s``: forward attention
    time of the local query block against all keys, ``cp`` chunks of equal work (the causal load
    balance of Megatron-LM's ``2 cp`` split). Step ``i`` sends a chunk while computing one chunk's
    attention; ``cp - 1`` steps in forward; backward sends K/V and dK/dV (``2 x`` the bytes) against
    ``attn_bwd_ratio x`` the compute.
    """
    if cp <= 1:
        return CpTime(0.0, 0.0, 0.0, 0)
    e = eff.nvlink if on_nvlink else eff.network
    lat = eff.comm_latency_us * 1e-6
    send_f = np.asarray(kv_chunk_bytes) / (bw_gbyte_s * 1e9 * e) + lat
    send_b = 2 * np.asarray(kv_chunk_bytes) / (bw_gbyte_s * 1e9 * e) + lat
    step_f = np.asarray(attn_fwd_s) / cp
    n = cp - 1
    fwd = n * np.maximum(0.0, send_f - eff.overlap * step_f)
    bwd = n * np.maximum(0.0, send_b - eff.overlap * step_f * attn_bwd_ratio)
    return CpTime(fwd, bwd, n * (send_f + send_b), n)


def allgather_attention_s(kv_chunk_bytes: Seconds, cp: int, bw_gbyte_s: float, eff: Efficiency, *, on_nvlink: bool) -> CpTime:
    """All-gather K/V before attention, reduce-scatter dK/dV after it: both exposed."""
    if cp <= 1:
        return CpTime(0.0, 0.0, 0.0, 0)
    e = eff.nvlink if on_nvlink else eff.network
    lat = (eff.comm_latency_us * 0.5 * math.log2(2 * cp) + eff.ring_hop_us * (cp - 1)) * 1e-6
    t = np.asarray(kv_chunk_bytes) * (cp - 1) / (bw_gbyte_s * 1e9 * e) + lat
    return CpTime(t, t, 2 * t, 1)


# =============================================================================== expert all-to-all
def all_to_all_s(
    sent_bytes: float, ep: int, per_node: int, nvlink_gbps: float, nic_gbps: float, eff: Efficiency
) -> float:
    """One all-to-all in which each GPU sends ``sent_bytes`` spread evenly over its ``ep - 1`` peers.

    ``per_node`` of the ``ep`` ranks share a node: ``(per_node - 1)/(ep - 1)`` of the bytes go over
    NVLink, the rest over this GPU's NIC, concurrently; the slower side sets the time.
    """
    if ep <= 1 or sent_bytes <= 0:
        return 0.0
    k = max(1, min(per_node, ep))
    on = sent_bytes * (k - 1) / (ep - 1)
    off = sent_bytes - on
    t_on = on / (nvlink_gbps * 1e9 * eff.nvlink)
    t_off = off / (nic_gbps * 1e9 * eff.network)
    return max(t_on, t_off) + eff.comm_latency_us * 1e-6


class Dispatch(NamedTuple):
    """Copies of one routed token a node-deduplicating dispatch moves (``node_dispatch_copies``)."""

    top_k: int
    nic: float  # over the network: one per other node hosting one of the token's experts
    nvlink: float  # inside nodes: to the other GPUs of the token's node, and forwarded on arrival


@functools.lru_cache(maxsize=256)
def node_dispatch_copies(
    experts: int, top_k: int, ep: int, per_node: int, groups: int = 0, group_top_k: int = 0, samples: int = 4096
) -> Dispatch:
    """Expected copies per token of one node-deduplicating dispatch (the combine mirrors it).

    Expert ``e`` lives on EP rank ``e // (experts / ep)``, rank ``r`` on node ``r // per_node``; the token
    starts on rank 0 (every rank is alike). Routing is uniform, as in the force-balanced benchmarks that
    publish MoE throughput, and limited to ``group_top_k`` of ``groups`` consecutive expert groups when
    ``groups`` is set. The network copy lands on the GPU with the sender's local index, which forwards it
    to the other GPUs of that node that hold its experts. Averaged over ``samples`` tokens drawn with a
    fixed seed, so the result is deterministic.

        >>> d = node_dispatch_copies(8, 2, 8, 8)          # one node: nothing crosses the network
        >>> d.nic
        0.0
    """
    if ep <= 1:
        return Dispatch(top_k, 0.0, 0.0)
    if experts % ep:
        raise ValueError(f"ep={ep} does not divide experts={experts}")
    k = max(1, min(per_node, ep))
    nodes = -(-ep // k)
    rng = np.random.default_rng(0)
    if groups:
        per_group = experts // groups
        chosen = np.argsort(rng.random((samples, groups)), axis=1)[:, :group_top_k]
        pool = (chosen[:, :, None] * per_group + np.arange(per_group)).reshape(samples, -1)
    else:
        pool = np.broadcast_to(np.arange(experts), (samples, experts))
    pick = np.argsort(rng.random(pool.shape), axis=1)[:, :top_k]
    rank = np.take_along_axis(pool, pick, axis=1) // (experts // ep)
    hit = np.zeros((samples, nodes * k), bool)
    np.put_along_axis(hit, rank, True, axis=1)
    by_node = hit.reshape(samples, nodes, k)
    remote = by_node[:, 1:].any(axis=2).sum(axis=1)
    local = by_node[:, 0, 1:].sum(axis=1)
    forwarded = by_node[:, 1:, 1:].sum(axis=(1, 2))  # arrivals land on local index 0 of each node
    return Dispatch(top_k, float(remote.mean()), float((local + forwarded).mean()))


def node_all_to_all_s(sent_bytes: float, ep: int, d: Dispatch, nvlink_gbps: float, nic_gbps: float, eff: Efficiency) -> float:
    """One node-deduplicating dispatch (or combine) in which the flat all-to-all would send ``sent_bytes``
    (``top_k`` copies of each token, ``(ep - 1)/ep`` of them leaving the GPU): the network carries
    ``d.nic`` copies per token and NVLink ``d.nvlink``, both at once."""
    if ep <= 1 or sent_bytes <= 0:
        return 0.0
    token = sent_bytes / (d.top_k * (ep - 1) / ep)
    t_off = token * d.nic / (nic_gbps * 1e9 * eff.network)
    t_on = token * d.nvlink / (nvlink_gbps * 1e9 * eff.nvlink)
    return max(t_on, t_off) + eff.comm_latency_us * 1e-6
