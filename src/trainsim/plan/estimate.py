"""Step time, throughput and memory of one parallelisation strategy, analytically.

    >>> from trainsim.plan.devices import homogeneous
    >>> from trainsim.plan.estimate import Strategy, estimate
    >>> from trainsim.plan.workload import Recompute, preset
    >>> s = Strategy(dp=16, tp=8, pp=8, micro_batch=1, schedule="interleaved", virtual_stages=3,
    ...              recompute=Recompute.FULL)
    >>> e = estimate(preset("gpt3-175b"), s, homogeneous("a100-80gb", 1024), global_batch=1536)
    >>> 120 < e.hardware_tflops_per_gpu < 170, e.fits
    (True, True)

Model of one training step (every stage runs ``m = global_batch / (dp * micro_batch)`` micro-batches):

1. Per stage and micro-batch, ``t_i`` = forward + backward compute of its layers (``optime``), plus
   recomputation (the whole layer under full, the attention core under selective), plus Megatron TP
   all-reduces (2 per block in forward, 2 in backward, 2 more when the forward is recomputed; under
   sequence parallelism the same volume as reduce-scatter + all-gather; hidden behind GEMMs up to
   ``overlap`` with ``comm_overlap``), plus the exposed part of context-parallel attention traffic (ring
   or all-gather, ``comm``), plus expert all-to-alls (``comm.all_to_all_s``), plus point-to-point sends
   to the neighbouring stages (activation forward, gradient backward; scatter/gather over TP ranks,
   Narayanan et al. SC'21 §4.1), plus the per-layer ZeRO-2/3 gathers and reduce-scatters not hidden by
   one-layer prefetch (``comm.fsdp_pass_s``).
2. Pipeline: ``m * max_i t_i + bubble``, ``bubble = beta * (sum_i t_i - max_i t_i)`` which is
   ``(pp-1) t`` for equal stages: beta = 1 for GPipe and 1F1B, ``1/v`` for interleaved with ``v`` virtual
   stages (Narayanan §2.2), and ``F / (F + B)`` for zero-bubble ZB-H1 (Qi et al. ICLR'24: bubble
   ``(p-1)(F+B-W)`` with ``B = W``).
3. After the pipeline drains: data-parallel gradient sync over ``dp * cp`` ranks (all-reduce; ZeRO-1
   reduce-scatter + all-gather; ZeRO-2 the all-gather; hybrid ZeRO-3 the all-reduce across replicas)
   overlapped with the last micro-batch's backward; the optimizer step (mixed-precision Adam, 32 B/param
   of memory traffic, memory-bound) on the slowest stage.
4. ``Estimate.terms`` keeps every term of the slowest stage with its inputs (``explain``); model FLOPs
   follow ``workload.AttnFlops`` and ``model_tflops_per_gpu == model_flops / step_s / GPUs``.

Placement: ranks are laid out ``tp`` innermost, then ``cp``, ``dp``, ``pp`` (``placement`` can swap
dp and pp). A group whose members share a node uses NVLink; one spanning nodes gets the bus bandwidth
``min(nvlink, nic * members_per_node)`` (each GPU has its own NIC; NCCL runs one ring per NIC).

Why one module: ``estimate`` and ``_stage_time`` are the formula above in two parts, and ``check``,
``unit_table`` and ``stage_sums`` are its inputs, which the search reuses; a split would part the terms
from the docstring that derives them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from trainsim.errors import UserError
from trainsim.plan.comm import (
    PARAM_BYTES,
    Term,
    all_to_all_s,
    allgather_attention_s,
    fsdp_pass_s,
    node_all_to_all_s,
    node_dispatch_copies,
    ring_attention_s,
)
from trainsim.plan.devices import Cluster, Gpu, NodeGroup
from trainsim.plan.memory import GIB, GRAD_BYTES, Memory, shared_params
from trainsim.plan.optime import (
    ATTN_KERNELS,
    DEFAULT_EFFICIENCY,
    Efficiency,
    layer_time,
    p2p_s,
    ring_allreduce_s,
)
from trainsim.plan.workload import AttnFlops, Model, Recompute, Transformer

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")
PLACEMENTS = ("tp-cp-dp-pp", "tp-cp-pp-dp")
CP_MODES = ("ring", "allgather")
EP_DISPATCHES = ("flat", "node")
PRECISIONS = ("bf16", "fp8")
KERNEL_MODES = ("fused", "eager")
DEEPEP_SM_SHARE = 20 / 132
"""SMs DeepEP's dispatch and combine kernels occupy while they run: Megatron-Core's ``moe_deepep_num_sms``
default (20) of an H100's 132; the compute they overlap runs on the rest"""
OPTIM_TRAFFIC_BYTES = 32  # Adam step: read grad, master, m, v; write master, m, v, 16-bit weight; + clip/unscale


@dataclass(frozen=True, kw_only=True, slots=True)
class Strategy:
    """How one model is split over the GPUs; ``dp * tp * pp * cp`` GPUs in all."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    micro_batch: int = 1
    """samples per micro-batch per data-parallel rank"""
    schedule: str = "1f1b"
    """gpipe | 1f1b | interleaved | zb (ZB-H1)"""
    virtual_stages: int = 1
    """model chunks per pipeline rank (interleaved only)"""
    recompute: Recompute = Recompute.NONE
    sequence_parallel: bool = False
    zero: int = 0
    """0 none, 1 optimizer states, 2 + gradients, 3 + weights (FSDP full sharding)"""
    placement: str = "tp-cp-dp-pp"
    """rank order, innermost first"""
    ep: int = 1
    """expert-parallel degree: experts split over ``ep`` of the data-parallel ranks (MoE only)"""
    reshard_after_forward: bool = True
    """ZeRO-3 only: free gathered weights after forward and gather again in backward (FSDP FULL_SHARD);
    False keeps them until backward (FSDP SHARD_GRAD_OP / torchtitan with pipelining)"""
    shard_group: int = 0
    """ZeRO-3 only: shard over this many data-parallel ranks and replicate across the groups
    (hybrid sharding, FSDP HYBRID_SHARD / HSDP); 0 shards over all ``dp * cp`` ranks"""
    cp_mode: str = "ring"
    """ring (K/V passed around, overlapped with attention) | allgather (K/V gathered up front, exposed)"""
    ep_dispatch: str = "flat"
    """expert all-to-all: flat (every routed copy sent to its expert's GPU: NCCL all-to-all) | node (each
    token crosses the network once per node hosting its experts, then NVLink: DeepEP)"""
    ep_overlap: bool = False
    """expert all-to-alls of one micro-batch run while another computes (Megatron-Core ``moe_a2a_overlap``,
    DeepSeek-V3's DualPipe): hidden up to ``Efficiency.overlap`` of the compute, and under the node dispatch
    DeepEP's kernels hold ``DEEPEP_SM_SHARE`` of the GPU's SMs while they run"""
    precision: str = "bf16"
    """bf16 | fp8 (linear layers on FP8 tensor cores, a what-if with its own efficiency; Hopper only)"""
    kernels: str = "fused"
    """fused (one kernel per norm, activation, rotary embedding; FP8 casts fused into them: Megatron-LM,
    Transformer Engine, torch.compile) | eager (PyTorch's reference modules step by step; FP8 casts apart)"""
    attn_kernel: str = "auto"
    """fused attention kernel: auto (fa3 on Hopper, else fa2) | fa2 | fa3 (FlashAttention-3 or cuDNN; Hopper)"""
    comm_overlap: bool = False
    """TP collectives and pipeline sends overlapped with GEMMs (Megatron-Core / NeMo ``tp_comm_overlap`` and
    ``overlap_p2p_comm``); off reproduces Megatron-LM 2021, which blocked on them"""

    def __post_init__(self) -> None:
        for f in ("dp", "tp", "pp", "cp", "micro_batch", "virtual_stages", "ep"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise UserError(f"{f}={v!r}; expected a positive integer")
        if self.schedule not in SCHEDULES:
            raise UserError(f"schedule {self.schedule!r}; expected one of {', '.join(SCHEDULES)}")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise UserError(f"virtual_stages={self.virtual_stages} needs the interleaved schedule")
        if self.zero not in (0, 1, 2, 3):
            raise UserError(f"zero={self.zero!r}; expected 0, 1, 2 or 3")
        if self.placement not in PLACEMENTS:
            raise UserError(f"placement {self.placement!r}; expected one of {', '.join(PLACEMENTS)}")
        if self.sequence_parallel and self.tp == 1:
            object.__setattr__(self, "sequence_parallel", False)
        if self.precision not in PRECISIONS:
            raise UserError(f"--precision {self.precision!r}; expected one of {', '.join(PRECISIONS)}")
        if self.kernels not in KERNEL_MODES:
            raise UserError(f"--kernels {self.kernels!r}; expected one of {', '.join(KERNEL_MODES)}")
        if self.attn_kernel not in ATTN_KERNELS:
            raise UserError(f"--attn-kernel {self.attn_kernel!r}; expected one of {', '.join(ATTN_KERNELS)}")
        if self.cp_mode not in CP_MODES:
            raise UserError(f"--cp-mode {self.cp_mode!r}; expected one of {', '.join(CP_MODES)}")
        if self.ep_dispatch not in EP_DISPATCHES:
            raise UserError(f"--ep-dispatch {self.ep_dispatch!r}; expected one of {', '.join(EP_DISPATCHES)}")
        if self.ep_overlap and self.ep == 1:
            raise UserError("--ep-overlap needs expert parallelism (--ep > 1)")
        if self.shard_group < 0:
            raise UserError(f"--shard-group {self.shard_group}; expected 0 (all data-parallel ranks) or a positive size")
        if (self.shard_group or not self.reshard_after_forward) and self.zero != 3:
            flag = "--shard-group" if self.shard_group else "--no-reshard-after-forward"
            raise UserError(f"{flag} applies to ZeRO-3 / FSDP only; got --zero {self.zero}")
        if self.shard_group and self.dpc % self.shard_group:
            raise UserError(f"--shard-group {self.shard_group} does not divide dp*cp = {self.dpc}")
        if self.ep > 1 and self.dp % self.ep:
            raise UserError(f"--ep {self.ep} does not divide dp={self.dp}; experts are split over data-parallel ranks")
        if self.zero == 3 and self.reshard_after_forward and self.pp > 1:
            raise UserError(
                f"--zero 3 with --pp {self.pp}: re-gathering weights every micro-batch is unsupported with pipeline "
                "stages (DeepSpeed, Megatron-LM); use --zero 1/2, or --no-reshard-after-forward (torchtitan FSDP+PP)"
            )

    @property
    def dpc(self) -> int:
        """Ranks holding the same weights: gradients are reduced and ZeRO shards over ``dp * cp``."""
        return self.dp * self.cp

    @property
    def shard(self) -> int:
        """Ranks a ZeRO/FSDP shard is split over."""
        return self.shard_group or self.dpc

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def text(self) -> str:
        v = f"x{self.virtual_stages}" if self.schedule == "interleaved" else ""
        sp = "+sp" if self.sequence_parallel else ""
        z = f"zero{self.zero}"
        if self.zero == 3:
            z += ("" if self.reshard_after_forward else "-noreshard") + (f"-hsdp{self.shard_group}" if self.shard_group else "")
        return (
            f"dp{self.dp} tp{self.tp}{sp} pp{self.pp} cp{self.cp}{'-ag' if self.cp > 1 and self.cp_mode != 'ring' else ''}"
            + (f" ep{self.ep}" + ("-node" if self.ep_dispatch == "node" else "") + ("-ov" if self.ep_overlap else "")
               if self.ep > 1 else "")
            + f" mb{self.micro_batch} {self.schedule}{v} rc={self.recompute.name.lower()} {z}"
            + (" fp8" if self.precision == "fp8" else "")
            + ("" if self.attn_kernel == "auto" else f" {self.attn_kernel}")
            + (" eager" if self.kernels == "eager" else "")
            + (" overlap" if self.comm_overlap else "")
            + ("" if self.placement == PLACEMENTS[0] else f" {self.placement}")
        )


@dataclass(frozen=True, slots=True)
class Stages:
    """Pipeline layout: stage ``i`` holds units ``bounds[i]:bounds[i+1]`` on cluster group ``groups[i]``."""

    bounds: tuple[int, ...]
    groups: tuple[int, ...]

    def __post_init__(self) -> None:
        assert len(self.bounds) == len(self.groups) + 1, (self.bounds, self.groups)
        assert all(a < b for a, b in zip(self.bounds, self.bounds[1:], strict=False)), self.bounds


@dataclass(frozen=True, slots=True)
class Estimate:
    """What ``trainsim estimate`` prints."""

    strategy: Strategy
    stages: Stages
    step_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    memory_gib_per_gpu: float
    fits: bool
    overflow: str
    breakdown: dict[str, float]
    memory: dict[str, float]
    bottleneck: str
    samples_per_s: float
    gpus_used: int
    stage_step_s: tuple[float, ...] = field(default=())
    stage_terms: tuple[dict[str, float], ...] = field(default=(), repr=False)
    """per stage and micro-batch: the terms of ``stage_step_s`` (seconds), for the simulation check"""
    terms: tuple[Term, ...] = field(default=(), repr=False)
    """per step on the slowest stage, each time term with its formula's inputs (``--explain``)"""
    model_flops: float = 0.0
    """model FLOPs of one step (the MFU numerator), counted under ``attn_flops``"""
    attn_flops: str = "full"

    def to_json(self) -> dict[str, object]:
        s = asdict(self.strategy)
        s["recompute"] = self.strategy.recompute.name.lower()
        return {
            "strategy": s,
            "plan": self.strategy.text(),
            "stages": {"bounds": list(self.stages.bounds), "groups": list(self.stages.groups)},
            "step_s": self.step_s,
            "samples_per_s": self.samples_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "mfu": self.mfu,
            "memory_gib_per_gpu": self.memory_gib_per_gpu,
            "memory_breakdown_gib": self.memory,
            "fits": self.fits,
            "overflow": self.overflow,
            "breakdown": self.breakdown,
            "bottleneck": self.bottleneck,
            "gpus_used": self.gpus_used,
            "model_flops_per_step": self.model_flops,
            "attn_flops_convention": self.attn_flops,
            "terms": [t._asdict() for t in self.terms],
        }


# =============================================================================== per-unit tables
@dataclass(frozen=True, slots=True)
class UnitTable:
    """Per-unit (pipeline-cuttable layer) times on one GPU kind, as arrays (plus prefix sums)."""

    fwd: np.ndarray
    bwd: np.ndarray
    rc_full: np.ndarray  # forward time repeated under full recomputation (blocks only)
    rc_sel: np.ndarray  # attention core time repeated under selective recomputation
    attn_fwd: np.ndarray  # forward time of the attention core (what ring attention overlaps with)
    tp_coll: np.ndarray  # TP collectives per forward
    tp_bytes: float
    cp_bytes: np.ndarray
    out_bytes: np.ndarray
    params: np.ndarray
    expert_params: np.ndarray
    a2a_bytes: np.ndarray  # bytes sent per expert all-to-all
    a2a_count: np.ndarray  # expert all-to-alls per forward
    model_flops: np.ndarray
    core_flops: np.ndarray
    costs: tuple
    routing: tuple[int, int, int, int] = (0, 0, 0, 0)  # experts, top_k, expert groups, groups per token
    cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)


@functools.lru_cache(maxsize=8192)
def unit_table(
    model: Model, mb: int, tp: int, sp: bool, cp: int, gpu: Gpu, eff: Efficiency, ep: int = 1, fp8: bool = False,
    attn: str = "auto", eager: bool = False,
) -> UnitTable:
    if fp8 and not gpu.fp8_tflops:
        raise UserError(f"--precision fp8: {gpu.name} has no FP8 tensor cores (Hopper: h100, h800, h200)")
    costs = model.layer_costs(mb=mb, tp=tp, sp=sp, cp=cp, ep=ep, eager=eager)
    times = [layer_time(c, gpu, eff, fp8, attn) for c in costs]
    is_block = np.array([c.act_bytes[2] < c.act_bytes[0] for c in costs])
    flash = isinstance(model, Transformer) and model.flash_attention
    return UnitTable(
        fwd=np.array([t.fwd for t in times]),
        bwd=np.array([t.bwd for t in times]),
        rc_full=np.array([t.fwd for t in times]) * is_block,
        rc_sel=np.array([0.0 if flash else t.core_fwd for t in times]),
        attn_fwd=np.array([t.core_fwd for t in times]),
        tp_coll=np.array([c.tp_collectives for c in costs], np.float64),
        tp_bytes=max((c.tp_allreduce_bytes for c in costs), default=0.0),
        cp_bytes=np.array([c.cp_kv_bytes for c in costs]),
        out_bytes=np.array([c.out_bytes for c in costs]),
        params=np.array([c.params for c in costs], np.float64),
        expert_params=np.array([c.expert_params for c in costs], np.float64),
        a2a_bytes=np.array([c.a2a_bytes for c in costs]),
        a2a_count=np.array([c.a2a_count for c in costs], np.float64),
        model_flops=np.array([c.model_flops for c in costs]),
        core_flops=np.array([c.core_flops for c in costs]),
        costs=costs,
        routing=(model.experts, model.top_k, model.expert_groups, model.group_top_k) if isinstance(model, Transformer) else (0, 0, 0, 0),
    )


@dataclass(frozen=True, slots=True)
class StageSums:
    """Sums over a unit range of one ``UnitTable`` (cached: stages repeat across a search)."""

    lo: int  # first unit
    hi: int  # one past the last unit
    f: float
    b: float
    rc_full: float
    rc_sel: float
    n_coll: float
    n_coll_rc: float
    cp_kv: float
    params: float
    expert_params: float
    largest: float
    act: tuple[float, float, float]
    trans_full: float
    trans_sel: float
    trans_head: float
    model_flops: float
    rc_flops_full: float
    core_flops: float
    out_last: float


def stage_sums(tab: UnitTable, a: int, b: int) -> StageSums:
    hit = tab.cache.get((a, b))
    if hit is not None:
        return hit
    c = tab.costs[a:b]
    blk = tab.rc_full[a:b] > 0
    u = StageSums(
        lo=a,
        hi=b,
        f=float(tab.fwd[a:b].sum()),
        b=float(tab.bwd[a:b].sum()),
        rc_full=float(tab.rc_full[a:b].sum()),
        rc_sel=float(tab.rc_sel[a:b].sum()),
        n_coll=float(tab.tp_coll[a:b].sum()),
        n_coll_rc=float((tab.tp_coll[a:b] * blk).sum()),
        cp_kv=float(tab.cp_bytes[a:b].sum()),
        params=float(tab.params[a:b].sum()) - shared_params(c),
        expert_params=float(tab.expert_params[a:b].sum()),
        largest=float(tab.params[a:b].max()),
        act=(sum(x.act_bytes[0] for x in c), sum(x.act_bytes[1] for x in c), sum(x.act_bytes[2] for x in c)),
        trans_full=max((x.transient_bytes for x in c if x.name != "head"), default=0.0),
        trans_sel=max((x.act_bytes[0] - x.act_bytes[1] for x in c), default=0.0),
        trans_head=sum(x.transient_bytes for x in c if x.name == "head"),
        model_flops=float(tab.model_flops[a:b].sum()),
        rc_flops_full=float(tab.model_flops[a:b][blk].sum()),
        core_flops=float(tab.core_flops[a:b].sum()),
        out_last=float(tab.out_bytes[b - 1]),
    )
    tab.cache[(a, b)] = u
    return u


def _memory(u: StageSums, s: Strategy, stage: int, m: int) -> Memory:
    """Peak memory of one GPU of stage ``stage`` by term (``memory.stage_memory``'s terms from cached sums)."""
    from trainsim.plan.memory import FRAG, WORKSPACE_GIB, in_flight, static_bytes

    w, g, o = static_bytes(u.params, zero=s.zero, dp=s.shard, largest_layer_params=u.largest,
                           expert_params=u.expert_params, ep=s.ep, reshard=s.reshard_after_forward)  # fmt: skip
    rc = s.recompute
    act = u.act[int(rc)] * in_flight(s.schedule, stage=stage, pp=s.pp, m=m, v=s.virtual_stages)
    trans = (u.trans_full if rc == Recompute.FULL else u.trans_sel if rc == Recompute.SELECTIVE else 0.0) + u.trans_head
    return Memory(w, g, o, act, trans, FRAG * act + WORKSPACE_GIB * GIB)


# =============================================================================== placement
def _dims(s: Strategy) -> dict[str, tuple[int, int]]:
    """Size and rank stride of every parallel dimension."""
    order = s.placement.split("-")
    sizes = {"tp": s.tp, "cp": s.cp, "dp": s.dp, "pp": s.pp}
    out, stride = {}, 1
    for d in order:
        out[d] = (sizes[d], stride)
        stride *= sizes[d]
    return out


def group_bw(size: int, stride: int, g: NodeGroup) -> tuple[float, bool]:
    """(bus bandwidth GB/s, all on NVLink) of a group of ``size`` ranks ``stride`` apart."""
    gpn = g.gpus_per_node
    if size * stride <= gpn or (stride < gpn and size <= gpn // stride and (size * stride) <= gpn):
        return g.gpu.nvlink_gbps, True
    per_node = max(1, gpn // stride) if stride < gpn else 1
    return min(g.gpu.nvlink_gbps, g.inter_node_gbps(-(-size // per_node)) * per_node), False


def uniform_stages(model: Model, pp: int) -> Stages:
    """Megatron's layout: equal blocks per stage, embedding on the first, head on the last."""
    n = model.n_units
    if isinstance(model, Transformer):
        if model.layers < pp:
            raise UserError(f"pp={pp} exceeds the number of layers ({model.layers})")
        blocks = model.layers
        cuts = [1 + (i * blocks) // pp for i in range(pp + 1)]
        cuts[0], cuts[-1] = 0, n
    else:
        if n < pp:
            raise UserError(f"pp={pp} exceeds the number of layers ({n})")
        w = np.array([c.model_flops + 1.0 for c in model.layer_costs(mb=1, tp=1, sp=False, cp=1)])
        cum = np.cumsum(w) / w.sum()
        cuts = [0]
        for i in range(1, pp):
            c = int(np.searchsorted(cum, i / pp)) + 1
            c = max(cuts[-1] + 1, min(c, n - (pp - i)))
            cuts.append(c)
        cuts.append(n)
    return Stages(tuple(cuts), (0,) * pp)


# =============================================================================== the estimate
def estimate(
    model: Model,
    s: Strategy,
    cluster: Cluster,
    *,
    global_batch: int,
    stages: Stages | None = None,
    eff: Efficiency = DEFAULT_EFFICIENCY,
    overlap_grad_sync: bool = True,
    attn_flops: AttnFlops = AttnFlops.FULL,
) -> Estimate:
    """Estimate one strategy. ``stages`` defaults to ``uniform_stages`` on the first group.

    ``attn_flops`` is the convention of the *model* FLOPs (MFU, model TFLOP/s; ``workload.AttnFlops``);
    hardware TFLOP/s count what the kernels execute (recomputation included; a causal flash kernel
    does half the square, an unfused one all of it)."""
    check(model, s, cluster, global_batch, stages)
    m = global_batch // (s.dp * s.micro_batch)
    st = stages or uniform_stages(model, s.pp)
    pp, v = s.pp, s.virtual_stages
    dims = _dims(s)
    rc = s.recompute
    per_stage: list[dict[str, float]] = []
    stage_args: list[tuple[int, NodeGroup, UnitTable, StageSums]] = []
    mem_tot: list[float] = []
    sums: list[StageSums] = []
    tails: list[float] = []
    hw_flops = 0.0
    peak = 0.0
    for i in range(pp):
        gi = st.groups[i]
        grp = cluster.groups[gi]
        tab = unit_table(model, s.micro_batch, s.tp, s.sequence_parallel, s.cp, grp.gpu, eff, s.ep, s.precision == "fp8",
                         s.attn_kernel, s.kernels == "eager")
        a, b = st.bounds[i], st.bounds[i + 1]
        u = stage_sums(tab, a, b)
        prev = (st.groups[i - 1], float(tab.out_bytes[a - 1])) if i > 0 else None
        nxt = st.groups[i + 1] if i + 1 < pp else None
        # a stage's terms do not depend on the schedule beyond v: cache them on the table across estimates
        key = ("stage", u.f, u.b, u.params, u.largest, u.out_last, a == 0, gi, prev, nxt, s.dp, s.tp, s.pp, s.cp, s.recompute, s.sequence_parallel, s.zero, s.placement,
               s.ep, s.ep_dispatch, s.ep_overlap, s.reshard_after_forward, s.shard_group, s.cp_mode, s.comm_overlap, v, overlap_grad_sync, cluster)  # fmt: skip
        hit = tab.cache.get(key)
        if hit is None:
            hit = tab.cache[key] = _stage_time(s, dims, cluster, st, i, grp, tab, u, eff, overlap_grad_sync)
        d = hit[0]
        per_stage.append(d)
        stage_args.append((i, grp, tab, u))
        tails.append(d["dp"] + d["opt"])
        sums.append(u)
        mkey = ("mem", u.params, u.expert_params, u.largest, u.act, u.trans_full, u.trans_head, i, pp, m, v, s.schedule,
                s.recompute, s.zero, s.shard, s.ep, s.reshard_after_forward)  # fmt: skip
        mt = tab.cache.get(mkey)
        if mt is None:
            mt = tab.cache[mkey] = _memory(u, s, i, m).total
        mem_tot.append(mt)
        extra = u.rc_flops_full if rc == Recompute.FULL else (u.core_flops if rc == Recompute.SELECTIVE and u.rc_sel > 0 else 0.0)
        # u.model_flops: one micro-batch of one cp rank's sequence share, whole over tp; x cp x dp replicas
        hw_flops += (3 * u.model_flops + extra) * m * s.dp * s.cp
        peak += grp.gpu.peak_tflops * s.dp * s.tp * s.cp
    mf = (model.model_flops_per_sample(attn_flops) if isinstance(model, Transformer) else model.model_flops_per_sample())
    mf *= global_batch
    ts = np.array([d["t"] for d in per_stage])
    tmax = float(ts.max())
    slow = int(ts.argmax())
    if pp == 1:
        beta = 0.0
    elif s.schedule == "interleaved":
        beta = 1.0 / v
    elif s.schedule == "zb":
        fsum = sum(d["f"] + d["recompute"] for d in per_stage)
        beta = fsum / max(1e-12, sum(d["f"] + d["b"] + d["recompute"] for d in per_stage))
    else:
        beta = 1.0
    bubble = beta * (float(ts.sum()) - tmax)
    tail_i = int(np.argmax(tails))
    step = m * tmax + bubble + tails[tail_i]
    d = per_stage[slow]
    breakdown = {k: m * d[k] for k in ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_p2p", "fsdp_comm")}
    breakdown |= {"pipeline_bubble": bubble, "dp_sync_exposed": per_stage[tail_i]["dp"],
                  "optimizer": per_stage[tail_i]["opt"]}  # fmt: skip
    once = ("dp_sync_exposed", "optimizer")  # per step; the others per micro-batch

    def terms_of(k: int) -> tuple[Term, ...]:
        return _stage_time(s, dims, cluster, st, *stage_args[k], eff, overlap_grad_sync, want=True)[1]

    terms = [t._replace(seconds=t.seconds * m, busy_s=t.busy_s * m, times=t.times * m, flops=t.flops * m)
             for t in terms_of(slow) if t.name not in once]  # fmt: skip
    note = f"beta={beta:.3g} x (sum of stage times {float(ts.sum()):.4g} s - slowest {tmax:.4g} s)"
    terms.append(Term("pipeline_bubble", bubble, bubble, pp - 1, 0.0, "-", 0.0, 1.0, 0.0, note))
    terms += [t for t in terms_of(tail_i) if t.name in once]
    n = s.world
    caps = [cluster.groups[g].gpu.mem_gib * GIB for g in st.groups]
    worst = max(range(pp), key=lambda k: mem_tot[k] / caps[k])
    mem_w = _memory(sums[worst], s, worst, m)
    overflow = ""
    for k in range(pp):
        if mem_tot[k] > caps[k]:
            mk = _memory(sums[k], s, k, m)
            big = mk.largest()
            overflow = (
                f"stage {k} needs {mk.total / GIB:.1f} GiB > {caps[k] / GIB:g} GiB on "
                f"{cluster.groups[st.groups[k]].gpu.name}, {(mk.total - caps[k]) / GIB:.1f} GiB over "
                f"(largest term: {big} {mk.as_gib()[big]:.1f} GiB)"
            )
            break
    return Estimate(
        strategy=s,
        stages=st,
        step_s=step,
        model_tflops_per_gpu=mf / step / n / 1e12,
        hardware_tflops_per_gpu=hw_flops / step / n / 1e12,
        mfu=mf / step / (peak * 1e12),
        memory_gib_per_gpu=max(mem_tot) / GIB,
        fits=not overflow,
        overflow=overflow,
        breakdown=breakdown,
        memory=mem_w.as_gib(),
        bottleneck=max(breakdown, key=lambda k: breakdown[k]),
        samples_per_s=global_batch / step,
        gpus_used=n,
        stage_step_s=tuple(float(x) for x in ts),
        stage_terms=tuple(per_stage),
        terms=tuple(terms),
        model_flops=mf,
        attn_flops=attn_flops.value,
    )


def _link(bw: float, nv: bool, eff: Efficiency) -> tuple[str, float]:
    return ("nvlink", eff.nvlink) if nv else ("network", eff.network)


def _coll_vec(moved: np.ndarray, bw_gbps: float, nv: bool, n: int, eff: Efficiency) -> np.ndarray:
    """``comm.collective_s`` over an array of per-GPU byte counts."""
    if n <= 1:
        return np.zeros_like(moved)
    e = eff.nvlink if nv else eff.network
    lat = (eff.comm_latency_us * 0.5 * math.log2(2 * n) + eff.ring_hop_us * (n - 1)) * 1e-6
    return np.where(moved > 0, moved / (bw_gbps * 1e9 * e) + lat, 0.0)


def a2a_stage_s(
    sent: np.ndarray, cnt: np.ndarray, ep: int, per_node: int, grp: NodeGroup, eff: Efficiency,
    dispatch: str = "flat", routing: tuple[int, int, int, int] = (0, 0, 0, 0),
) -> float:
    """Seconds of ``cnt[l]`` all-to-alls of ``sent[l]`` bytes per layer (layers share a few sizes);
    ``dispatch`` and ``routing`` (``UnitTable.routing``) as in ``Strategy.ep_dispatch``."""
    sizes, inv = np.unique(sent, return_inverse=True)
    nic = grp.inter_node_gbps(-(-ep // per_node))
    nv = grp.gpu.nvlink_gbps
    if dispatch == "node" and routing[0]:
        experts, top_k, groups, group_top_k = routing
        d = node_dispatch_copies(experts, top_k, ep, per_node, groups, group_top_k)
        one = np.array([node_all_to_all_s(float(x), ep, d, nv, nic, eff) for x in sizes])
    else:
        one = np.array([all_to_all_s(float(x), ep, per_node, nv, nic, eff) for x in sizes])
    return float(np.dot(cnt, one[inv]))


def _overlapped(busy: float, compute: float, eff: Efficiency) -> float:
    """Exposed part of ``busy`` seconds of communication overlapped with ``compute``: at least
    ``1 - overlap`` of it (the pieces no GEMM covers), more when compute is too short to cover it."""
    return max(busy * (1 - eff.overlap), busy - eff.overlap * compute)


def _dpc_stride(s: Strategy, dims: dict[str, tuple[int, int]]) -> int:
    """Rank stride of the ``dp * cp`` group (cp and dp adjacent in the default placement)."""
    if s.cp > 1 and s.placement == PLACEMENTS[0]:
        return dims["cp"][1]
    return dims["dp"][1]


def _stage_time(
    s: Strategy, dims: dict[str, tuple[int, int]], cluster: Cluster, st: Stages, i: int, grp: NodeGroup,
    tab: UnitTable, u: StageSums, eff: Efficiency, overlap_grad_sync: bool, want: bool = False,
) -> tuple[dict[str, float], tuple[Term, ...]]:
    """Per-micro-batch time terms of stage ``i`` and its after-pipeline tail (DP sync, optimizer); with
    ``want`` also the ``Term`` records with their inputs (only the slowest and tail stages need them)."""
    rc = s.recompute
    pp, v = s.pp, s.virtual_stages
    lo, hi = u.lo, u.hi
    gpu = grp.gpu
    f, bw = u.f, u.b
    rct = u.rc_full if rc == Recompute.FULL else (u.rc_sel if rc == Recompute.SELECTIVE else 0.0)
    fwd_passes = 2 if rc == Recompute.FULL else 1  # forward-side communication repeats when recomputed
    flops = 3 * u.model_flops / s.tp
    achieved = flops / max(1e-12, f + bw) / (gpu.peak_tflops * 1e12)
    terms: list[Term] = []
    if want:
        terms.append(Term("compute", f + bw, f + bw, 1, 0.0, "tensor cores", gpu.peak_tflops, achieved, flops,
                          f"forward {f:.4g} s + backward {bw:.4g} s (roofline per operator, optime; "
                          f"{s.precision}, attention kernel {s.attn_kernel}, {s.kernels} elementwise)"))  # fmt: skip
    if rct:
        if want:
            terms.append(Term("recompute", rct, rct, 1, 0.0, "tensor cores", gpu.peak_tflops, 0.0, 0.0, rc.name.lower()))
    # tensor-parallel collectives
    t_tp = 0.0
    if s.tp > 1:
        tp_bw, tp_nv = group_bw(s.tp, dims["tp"][1], grp)
        n_coll = u.n_coll * 2 + (u.n_coll_rc if rc == Recompute.FULL else 0.0)
        busy_tp = n_coll * ring_allreduce_s(tab.tp_bytes, s.tp, tp_bw, eff, on_nvlink=tp_nv)
        t_tp = _overlapped(busy_tp, f + bw, eff) if s.comm_overlap else busy_tp
        ln, e = _link(tp_bw, tp_nv, eff)
        if want:
            how = f"overlapped with the GEMMs ({eff.overlap:g} hidden at most)" if s.comm_overlap else "not overlapped"
            terms.append(Term("tp_comm", t_tp, busy_tp, n_coll, tab.tp_bytes, ln, tp_bw, e, 0.0,
                              f"ring all-reduce (or RS+AG under SP) over tp={s.tp}, {how}"))  # fmt: skip
    # context parallel: ring (overlapped per step) or all-gather (exposed) attention
    t_cp = 0.0
    if s.cp > 1 and u.cp_kv > 0:
        cp_bw, cp_nv = group_bw(s.cp, dims["cp"][1], grp)
        if s.cp_mode == "ring" and not cp_nv:  # each step's slowest hop leaves the node on one NIC
            cp_stride = dims["cp"][1]
            cp_nodes = s.cp if cp_stride >= grp.gpus_per_node else -(-s.cp * cp_stride // grp.gpus_per_node)
            cp_bw = min(gpu.nvlink_gbps, grp.inter_node_gbps(cp_nodes))
        chunk = tab.cp_bytes[lo:hi] / (s.cp - 1)
        if s.cp_mode == "ring":
            ct = ring_attention_s(chunk, tab.attn_fwd[lo:hi], s.cp, cp_bw, eff, on_nvlink=cp_nv)
        else:
            ct = allgather_attention_s(chunk, s.cp, cp_bw, eff, on_nvlink=cp_nv)
        has = chunk > 0
        cf, cb, busy = (float(np.sum(np.where(has, x, 0.0))) for x in (ct.fwd, ct.bwd, ct.busy))
        t_cp = fwd_passes * cf + cb
        ln, e = _link(cp_bw, cp_nv, eff)
        if want:
            terms.append(Term("cp_comm", t_cp, busy + (fwd_passes - 1) * cf, float(has.sum()) * ct.steps * (fwd_passes + 1),
                              float(chunk.max()), ln, cp_bw, e, 0.0,
                              f"{s.cp_mode} attention over cp={s.cp}: {ct.steps} step(s) per pass, K/V chunk per step; "
                              f"forward exposed {cf:.4g} s, backward {cb:.4g} s per micro-batch"))  # fmt: skip
    # expert all-to-all (dispatch + combine, forward and backward), overlapped with ep_overlap
    t_ep = 0.0
    if s.ep > 1:
        stride = dims["dp"][1]
        per_node = min(s.ep, max(1, grp.gpus_per_node // stride)) if stride < grp.gpus_per_node else 1
        cnt = tab.a2a_count[lo:hi] * (fwd_passes + 1)
        sent = tab.a2a_bytes[lo:hi]
        busy_ep = t_ep = a2a_stage_s(sent, cnt, s.ep, per_node, grp, eff, s.ep_dispatch, tab.routing)
        if s.ep_overlap:
            t_ep = _overlapped(busy_ep, f + bw, eff)
            if s.ep_dispatch == "node":
                t_ep += DEEPEP_SM_SHARE * min(busy_ep, f + bw)
        sort_ep = s.ep_dispatch == "flat" and tab.routing[0] // s.ep > 1
        if sort_ep:
            # the flat dispatcher groups the tokens it receives by local expert after the dispatch and restores
            # their order before the combine (Megatron-Core's MoEAlltoAllTokenDispatcher, sort_chunks_by_idxs):
            # one read and one write of this GPU's routed tokens per all-to-all, on the compute stream
            t_ep += 2.0 * float(np.dot(cnt, sent)) * s.ep / (s.ep - 1) / (gpu.hbm_gbps * 1e9 * eff.mem)
        where = "within a node" if per_node >= s.ep else f"{per_node} per node, the rest over the NIC"
        if want:
            terms.append(Term("ep_comm", t_ep, busy_ep, float(cnt.sum()), float(sent.max()), "nvlink+network",
                              grp.inter_node_gbps(-(-s.ep // per_node)) if per_node < s.ep else gpu.nvlink_gbps,
                              eff.network if per_node < s.ep else eff.nvlink, 0.0,
                              f"{'node-deduplicated ' if s.ep_dispatch == 'node' else ''}all-to-all over "
                              f"ep={s.ep} ({where}), "
                              + ("overlapped with another micro-batch's compute" if s.ep_overlap else "not overlapped")
                              + ("; + sorting received tokens by local expert" if sort_ep else "")))  # fmt: skip
    # pipeline point-to-point (scatter/gather: 1/tp of the activation per GPU)
    t_p2p = p2p_next = 0.0
    if pp > 1:
        div = 1 if s.sequence_parallel else s.tp
        if i + 1 < pp:
            bw_g, nv = _p2p_bw(s, dims, cluster, st, i, i + 1)
            p2p_next = p2p_s(u.out_last / div, bw_g, eff, on_nvlink=nv)
            t_p2p += v * p2p_next
        if i > 0:
            bw_g, nv = _p2p_bw(s, dims, cluster, st, i, i - 1)
            t_p2p += v * p2p_s(float(tab.out_bytes[st.bounds[i] - 1]) / div, bw_g, eff, on_nvlink=nv)
        busy_p2p = t_p2p
        if s.comm_overlap:
            t_p2p = _overlapped(busy_p2p, f + bw, eff)
        ln, e = _link(bw_g, nv, eff)
        if want:
            terms.append(Term("pp_p2p", t_p2p, busy_p2p, 2 * v, u.out_last / div, ln, bw_g, e, 0.0,
                              "activation forward, gradient backward, "
                              + ("overlapped with compute" if s.comm_overlap else "blocking")))  # fmt: skip
    # data parallel: sharded gathers/reduce-scatters per micro-batch, gradient sync per step
    experts = u.expert_params
    dense = u.params - experts
    sd = s.shard
    se = max(1, sd // s.ep)
    base = _dpc_stride(s, dims)
    bw_d, nv_d = group_bw(sd, base, grp)
    bw_e, nv_e = group_bw(se, base * s.ep, grp) if experts else (bw_d, nv_d)
    t_z = 0.0
    if s.zero >= 2 and sd > 1:
        ck = ("fsdp", u.f, u.b, u.params, u.largest, lo == 0, s.zero, s.reshard_after_forward, rc == Recompute.FULL, sd, se, bw_d, nv_d, bw_e, nv_e, eff)
        hit = tab.cache.get(ck)  # the same stage recurs across schedules, placements and recomputation levels
        if hit is None:
            moved_d = PARAM_BYTES * (tab.params[lo:hi] - tab.expert_params[lo:hi]) * (sd - 1) / sd
            moved_e = PARAM_BYTES * tab.expert_params[lo:hi] * (se - 1) / se
            per_layer = _coll_vec(moved_d, bw_d, nv_d, sd, eff) + _coll_vec(moved_e, bw_e, nv_e, se, eff)
            ag = per_layer if s.zero == 3 else np.zeros_like(per_layer)
            b_u = tab.bwd[lo:hi] + (tab.rc_full[lo:hi] if rc == Recompute.FULL else 0.0)
            zf, zb = fsdp_pass_s(tab.fwd[lo:hi], b_u, ag, per_layer, zero=s.zero, reshard=s.reshard_after_forward,
                                 overlap=eff.overlap)  # fmt: skip
            hit = tab.cache[ck] = (zf, zb, float(per_layer.sum()), len(per_layer), float((moved_d + moved_e).max()))
        zf, zb, coll_sum, n_layers, biggest = hit
        t_z = zf + zb
        if want:
            n_coll = n_layers * (1 + (s.zero == 3) * (1 + s.reshard_after_forward))
            busy = coll_sum * n_coll / max(1, n_layers)
            ln, e = _link(bw_d, nv_d, eff)
            what = {2: "RS grads", 3: "AG fwd + AG bwd + RS" if s.reshard_after_forward else "AG fwd + RS"}[s.zero]
            terms.append(Term("fsdp_comm", t_z, busy, n_coll, biggest, ln, bw_d, e, 0.0,
                              f"ZeRO-{s.zero} per layer per micro-batch ({what}) over {sd} ranks (bus bandwidth "
                              f"min(NVLink, NIC x ranks per node)), one layer prefetched, hidden behind "
                              f"{eff.overlap:g} x compute; forward exposed {zf:.4g} s, backward {zb:.4g} s"))  # fmt: skip
    grad_bytes = GRAD_BYTES * dense
    t_dp = t_dp_full = 0.0
    window = bw if overlap_grad_sync else 0.0
    if s.zero < 3 and s.dpc > 1:
        t_ar = t_dp_full = ring_allreduce_s(grad_bytes, s.dpc, bw_d, eff, on_nvlink=nv_d) + ring_allreduce_s(
            GRAD_BYTES * experts, s.dpc // s.ep, bw_e, eff, on_nvlink=nv_e)
        if s.zero == 0:
            t_dp = max(0.0, t_ar - window)
        elif s.zero == 1:
            t_dp = max(0.0, t_ar / 2 - window) + t_ar / 2
        else:
            t_dp = t_ar / 2  # weight all-gather after the optimizer step; gradients went per micro-batch
        what = {0: "all-reduce behind the last backward", 1: "reduce-scatter behind the last backward + all-gather",
                2: "weight all-gather after the optimizer"}[s.zero]  # fmt: skip
    elif s.zero == 3 and s.dpc // sd > 1:  # hybrid: all-reduce the gradient shards across replicas
        r = s.dpc // sd
        bw_r, nv_r = group_bw(r, base * sd, grp)
        t_dp_full = ring_allreduce_s(grad_bytes / sd, r, bw_r, eff, on_nvlink=nv_r)
        t_dp = max(0.0, t_dp_full - window)
        what = f"all-reduce of the gradient shard across {r} replicas"
    else:
        what = "none"
    ln, e = _link(bw_d, nv_d, eff)
    if want:
        terms.append(Term("dp_sync_exposed", t_dp, t_dp_full, 1, grad_bytes, ln, bw_d, e, 0.0,
                          f"once per step over dp*cp={s.dpc}: {what}"))  # fmt: skip
    local = dense / sd + experts / se if s.zero >= 1 else dense + experts
    t_opt = OPTIM_TRAFFIC_BYTES * local / (gpu.hbm_gbps * 1e9 * eff.mem) + 20 * eff.launch_us * 1e-6
    if want:
        terms.append(Term("optimizer", t_opt, t_opt, 1, OPTIM_TRAFFIC_BYTES * local, "hbm", gpu.hbm_gbps, eff.mem, 0.0,
                          f"Adam over {local / 1e6:.1f} M local parameters"))  # fmt: skip
    n_fwd = u.n_coll
    n_all = u.n_coll * 2 + (u.n_coll_rc if rc == Recompute.FULL else 0.0)
    d = dict(t=f + bw + rct + t_tp + t_cp + t_ep + t_p2p + t_z, compute=f + bw, recompute=rct, tp_comm=t_tp,
             cp_comm=t_cp, ep_comm=t_ep, pp_p2p=t_p2p, fsdp_comm=t_z, f=f, b=bw, dp=t_dp, opt=t_opt,
             p2p_next=p2p_next, tp_fwd_frac=n_fwd / n_all if n_all else 0.5, dp_full=t_dp_full,
             fwd_frac=1.0 / (fwd_passes + 1))  # fmt: skip
    return d, tuple(terms)


def _p2p_bw(s: Strategy, dims: dict[str, tuple[int, int]], cluster: Cluster, st: Stages, i: int, j: int) -> tuple[float, bool]:
    gi, gj = cluster.groups[st.groups[i]], cluster.groups[st.groups[j]]
    if st.groups[i] != st.groups[j]:
        return min(gi.inter_node_gbps(2), gj.inter_node_gbps(2)), False
    stride = dims["pp"][1]
    if stride < gi.gpus_per_node and s.world <= gi.gpus_per_node * max(1, gi.count // gi.gpus_per_node):
        # neighbours share a node when the pp stride stays inside it
        same_node = (stride * s.pp) <= gi.gpus_per_node
        if same_node:
            return gi.gpu.nvlink_gbps, True
    return gi.inter_node_gbps(2), False


def check(model: Model, s: Strategy, cluster: Cluster, global_batch: int, stages: Stages | None) -> None:
    """Raise ``UserError`` naming the violated constraint."""
    model.check_tp(s.tp)
    if global_batch < 1:
        raise UserError(f"global batch {global_batch}; expected a positive integer")
    if global_batch % (s.dp * s.micro_batch):
        raise UserError(
            f"global batch {global_batch} is not divisible by dp*micro_batch = {s.dp}*{s.micro_batch}"
        )
    if isinstance(model, Transformer) and s.cp > 1 and model.seq % (2 * s.cp):
        raise UserError(
            f"--cp {s.cp} does not divide the sequence length {model.seq} into 2*cp chunks (load-balanced causal split)"
        )
    if s.schedule == "interleaved" and s.virtual_stages > 1:
        # uneven chunks are allowed (Llama 3 takes a layer off the first and last stage); none may be empty
        blocks = model.layers if isinstance(model, Transformer) else model.n_units
        if blocks < s.pp * s.virtual_stages:
            raise UserError(
                f"--virtual-stages {s.virtual_stages}: pp*virtual_stages = {s.pp}*{s.virtual_stages} exceeds the "
                f"{blocks} layers (every model chunk needs a layer)"
            )
    if isinstance(model, Transformer):
        model.check_ep(s.ep)
    if stages is None:
        if s.world > cluster.groups[0].count:
            raise UserError(
                f"dp*tp*pp*cp = {s.dp}*{s.tp}*{s.pp}*{s.cp} = {s.world} exceeds the {cluster.groups[0].count} GPUs"
            )
        if s.tp > cluster.groups[0].gpus_per_node:
            raise UserError(f"tp={s.tp} exceeds gpus per node ({cluster.groups[0].gpus_per_node}); TP stays in a node")
    else:
        if len(stages.groups) != s.pp:
            raise UserError(f"{len(stages.groups)} stages given for pp={s.pp}")
        used: dict[int, int] = {}
        for gi in stages.groups:
            used[gi] = used.get(gi, 0) + s.dp * s.tp * s.cp
        for gi, n in used.items():
            if n > cluster.groups[gi].count:
                raise UserError(f"stages use {n} GPUs of group {gi} ({cluster.groups[gi].gpu.name}) which has {cluster.groups[gi].count}")


def resolve_world(n_gpus: int, tp: int, pp: int, cp: int) -> int:
    """dp = gpus / (tp*pp*cp), or ``UserError`` naming the constraint."""
    denom = tp * pp * cp
    if n_gpus % denom:
        raise UserError(f"tp*pp*cp = {tp}*{pp}*{cp} = {denom} does not divide --gpus {n_gpus}")
    return n_gpus // denom


def with_attn_flops(e: Estimate, model: Model, conv: AttnFlops, global_batch: int) -> Estimate:
    """``e`` with its model FLOPs (model TFLOP/s, MFU) counted under another attention convention."""
    from dataclasses import replace

    if not isinstance(model, Transformer) or conv.value == e.attn_flops:
        return e
    mf = model.model_flops_per_sample(conv) * global_batch
    k = mf / e.model_flops if e.model_flops else 1.0
    return replace(e, model_flops=mf, model_tflops_per_gpu=e.model_tflops_per_gpu * k, mfu=e.mfu * k, attn_flops=conv.value)


def best_micro_batch(
    model: Model,
    base: Strategy,
    cluster: Cluster,
    *,
    global_batch: int,
    candidates: Sequence[int] = (1, 2, 4, 8, 16, 32),
    virtual: Sequence[int] | None = None,
    eff: Efficiency = DEFAULT_EFFICIENCY,
    attn_flops: AttnFlops = AttnFlops.FULL,
) -> Estimate:
    """The fastest fitting estimate over micro-batch sizes (and virtual stages when ``virtual``)."""
    from dataclasses import replace

    best: Estimate | None = None
    per_dp = global_batch // base.dp if global_batch % base.dp == 0 else 0
    if per_dp == 0:
        raise UserError(f"global batch {global_batch} is not divisible by dp={base.dp}")
    for mb in candidates:
        if per_dp % mb:
            continue
        for v in virtual or (base.virtual_stages,):
            s = replace(base, micro_batch=mb, virtual_stages=v)
            try:
                e = estimate(model, s, cluster, global_batch=global_batch, eff=eff, attn_flops=attn_flops)
            except UserError:
                continue
            if best is None or (e.fits, -e.step_s) > (best.fits, -best.step_s):
                best = e
    if best is None:
        return estimate(model, replace(base, micro_batch=1), cluster, global_batch=global_batch, eff=eff,
                        attn_flops=attn_flops)
    return best
