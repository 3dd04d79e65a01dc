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
over the NIC, both at once (``all_to_all_s``).
"""

from __future__ import annotations

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


def collective_s(moved_bytes: float, bw_gbps: float, eff: Efficiency, *, on_nvlink: bool, n: int) -> float:
    """Time of a ring all-gather or reduce-scatter in which each GPU moves ``moved_bytes``: bandwidth term,
    a fixed launch latency, and ``ring_hop_us`` for each of the ``n - 1`` ring steps (so a ring over
    thousands of ranks pays milliseconds however small its buffer)."""
    if moved_bytes <= 0 or n <= 1:
        return 0.0
    e = eff.nvlink if on_nvlink else eff.network
    return moved_bytes / (bw_gbps * 1e9 * e) + (eff.comm_latency_us * 0.5 * math.log2(2 * n) + eff.ring_hop_us * (n - 1)) * 1e-6


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
    kv_chunk_bytes: Seconds, attn_fwd_s: Seconds, cp: int, bw_gbps: float, eff: Efficiency, *, on_nvlink: bool,
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
    send_f = np.asarray(kv_chunk_bytes) / (bw_gbps * 1e9 * e) + lat
    send_b = 2 * np.asarray(kv_chunk_bytes) / (bw_gbps * 1e9 * e) + lat
    step_f = np.asarray(attn_fwd_s) / cp
    n = cp - 1
    fwd = n * np.maximum(0.0, send_f - eff.overlap * step_f)
    bwd = n * np.maximum(0.0, send_b - eff.overlap * step_f * attn_bwd_ratio)
    return CpTime(fwd, bwd, n * (send_f + send_b), n)


def allgather_attention_s(kv_chunk_bytes: Seconds, cp: int, bw_gbps: float, eff: Efficiency, *, on_nvlink: bool) -> CpTime:
    """All-gather K/V before attention, reduce-scatter dK/dV after it: both exposed."""
    if cp <= 1:
        return CpTime(0.0, 0.0, 0.0, 0)
    e = eff.nvlink if on_nvlink else eff.network
    lat = (eff.comm_latency_us * 0.5 * math.log2(2 * cp) + eff.ring_hop_us * (cp - 1)) * 1e-6
    t = np.asarray(kv_chunk_bytes) * (cp - 1) / (bw_gbps * 1e9 * e) + lat
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
