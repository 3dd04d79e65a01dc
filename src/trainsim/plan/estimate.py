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
   sequence parallelism the same volume as reduce-scatter + all-gather), plus context-parallel K/V
   exchange not hidden behind attention, plus blocking point-to-point sends to the neighbouring stages
   (activation forward, gradient backward; scatter/gather over TP ranks, Narayanan et al. SC'21 §4.1),
   plus FSDP/ZeRO-3 parameter gathers not hidden behind the stage's compute.
2. Pipeline: ``m * max_i t_i + bubble``, ``bubble = beta * (sum_i t_i - max_i t_i)`` which is
   ``(pp-1) t`` for equal stages: beta = 1 for GPipe and 1F1B, ``1/v`` for interleaved with ``v`` virtual
   stages (Narayanan §2.2), and ``F / (F + B)`` for zero-bubble ZB-H1 (Qi et al. ICLR'24: bubble
   ``(p-1)(F+B-W)`` with ``B = W``).
3. After the pipeline drains: data-parallel gradient sync (all-reduce, or reduce-scatter + all-gather
   under ZeRO-1/2) overlapped with the last micro-batch's backward; the optimizer step
   (mixed-precision Adam, 32 B/param of memory traffic, memory-bound) on the slowest stage.

Placement: ranks are laid out ``tp`` innermost, then ``cp``, ``dp``, ``pp`` (``placement`` can swap
dp and pp). A group whose members share a node uses NVLink; one spanning nodes gets the bus bandwidth
``min(nvlink, nic * members_per_node)`` (each GPU has its own NIC; NCCL runs one ring per NIC).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from trainsim.errors import UserError
from trainsim.plan.devices import Cluster, Gpu, NodeGroup
from trainsim.plan.memory import GIB, Memory, shared_params
from trainsim.plan.optime import (
    DEFAULT_EFFICIENCY,
    Efficiency,
    gather_s,
    layer_time,
    p2p_s,
    ring_allreduce_s,
)
from trainsim.plan.workload import Model, Recompute, Transformer

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb")
PLACEMENTS = ("tp-cp-dp-pp", "tp-cp-pp-dp")
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

    def __post_init__(self) -> None:
        for f in ("dp", "tp", "pp", "cp", "micro_batch", "virtual_stages"):
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

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def text(self) -> str:
        v = f"x{self.virtual_stages}" if self.schedule == "interleaved" else ""
        sp = "+sp" if self.sequence_parallel else ""
        return (
            f"dp{self.dp} tp{self.tp}{sp} pp{self.pp} cp{self.cp} mb{self.micro_batch} {self.schedule}{v} "
            f"rc={self.recompute.name.lower()} zero{self.zero}"
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
        }


# =============================================================================== per-unit tables
@dataclass(frozen=True, slots=True)
class UnitTable:
    """Per-unit (pipeline-cuttable layer) times on one GPU kind, as arrays (plus prefix sums)."""

    fwd: np.ndarray
    bwd: np.ndarray
    rc_full: np.ndarray  # forward time repeated under full recomputation (blocks only)
    rc_sel: np.ndarray  # attention core time repeated under selective recomputation
    tp_coll: np.ndarray  # TP collectives per forward
    tp_bytes: float
    cp_bytes: np.ndarray
    out_bytes: np.ndarray
    params: np.ndarray
    model_flops: np.ndarray
    core_flops: np.ndarray
    costs: tuple
    cache: dict = field(default_factory=dict, compare=False, hash=False, repr=False)


@functools.lru_cache(maxsize=8192)
def unit_table(model: Model, mb: int, tp: int, sp: bool, cp: int, gpu: Gpu, eff: Efficiency) -> UnitTable:
    costs = model.layer_costs(mb=mb, tp=tp, sp=sp, cp=cp)
    times = [layer_time(c, gpu, eff) for c in costs]
    is_block = np.array([c.act_bytes[2] < c.act_bytes[0] for c in costs])
    flash = isinstance(model, Transformer) and model.flash_attention
    return UnitTable(
        fwd=np.array([t.fwd for t in times]),
        bwd=np.array([t.bwd for t in times]),
        rc_full=np.array([t.fwd for t in times]) * is_block,
        rc_sel=np.array([0.0 if flash else t.core_fwd for t in times]),
        tp_coll=np.array([c.tp_collectives for c in costs], np.float64),
        tp_bytes=max((c.tp_allreduce_bytes for c in costs), default=0.0),
        cp_bytes=np.array([c.cp_kv_bytes for c in costs]),
        out_bytes=np.array([c.out_bytes for c in costs]),
        params=np.array([c.params for c in costs], np.float64),
        model_flops=np.array([c.model_flops for c in costs]),
        core_flops=np.array([c.core_flops for c in costs]),
        costs=costs,
    )


@dataclass(frozen=True, slots=True)
class StageSums:
    """Sums over a unit range of one ``UnitTable`` (cached: stages repeat across a search)."""

    f: float
    b: float
    rc_full: float
    rc_sel: float
    n_coll: float
    n_coll_rc: float
    cp_kv: float
    params: float
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
        f=float(tab.fwd[a:b].sum()),
        b=float(tab.bwd[a:b].sum()),
        rc_full=float(tab.rc_full[a:b].sum()),
        rc_sel=float(tab.rc_sel[a:b].sum()),
        n_coll=float(tab.tp_coll[a:b].sum()),
        n_coll_rc=float((tab.tp_coll[a:b] * blk).sum()),
        cp_kv=float(tab.cp_bytes[a:b].sum()),
        params=float(tab.params[a:b].sum()) - shared_params(c),
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
    """``memory.stage_memory`` from cached sums (the same terms; tests check they agree)."""
    from trainsim.plan.memory import FRAG, WORKSPACE_GIB, in_flight, static_bytes

    w, g, o = static_bytes(u.params, zero=s.zero, dp=s.dp, largest_layer_params=u.largest)
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
    return min(g.gpu.nvlink_gbps, g.gpu.nic_gbps * per_node), False


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
) -> Estimate:
    """Estimate one strategy. ``stages`` defaults to ``uniform_stages`` on the first group."""
    check(model, s, cluster, global_batch, stages)
    m = global_batch // (s.dp * s.micro_batch)
    st = stages or uniform_stages(model, s.pp)
    pp, v = s.pp, s.virtual_stages
    dims = _dims(s)
    rc = s.recompute
    per_stage: list[dict[str, float]] = []
    mem_tot: list[float] = []
    sums: list[StageSums] = []
    tails: list[float] = []
    hw_flops = 0.0
    mf = 0.0
    peak = 0.0
    seen: dict[tuple, dict[str, float]] = {}
    for i in range(pp):
        gi = st.groups[i]
        grp = cluster.groups[gi]
        tab = unit_table(model, s.micro_batch, s.tp, s.sequence_parallel, s.cp, grp.gpu, eff)
        a, b = st.bounds[i], st.bounds[i + 1]
        u = stage_sums(tab, a, b)
        prev = (st.groups[i - 1], float(tab.out_bytes[a - 1])) if i > 0 else None
        nxt = st.groups[i + 1] if i + 1 < pp else None
        key = (u, gi, prev, nxt)
        d = seen.get(key)
        if d is None:
            d = seen[key] = _stage_time(s, dims, cluster, st, i, grp, tab, u, eff, overlap_grad_sync)
        per_stage.append(d)
        tails.append(d["dp"] + d["opt"])
        sums.append(u)
        mem_tot.append(_memory_total(u, s, i, m))
        mf_i = u.model_flops * 3
        extra = u.rc_flops_full if rc == Recompute.FULL else (u.core_flops if rc == Recompute.SELECTIVE and u.rc_sel > 0 else 0.0)
        mf += mf_i * m * s.dp
        hw_flops += (mf_i + extra) * m * s.dp
        peak += grp.gpu.peak_tflops * s.dp * s.tp * s.cp
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
    breakdown = {
        "compute": m * d["compute"],
        "recompute": m * d["recompute"],
        "tp_comm": m * d["tp_comm"],
        "cp_comm": m * d["cp_comm"],
        "pp_p2p": m * d["pp_p2p"],
        "fsdp_comm": m * d["fsdp_comm"],
        "pipeline_bubble": bubble,
        "dp_sync_exposed": per_stage[tail_i]["dp"],
        "optimizer": per_stage[tail_i]["opt"],
    }
    n = s.world
    caps = [cluster.groups[g].gpu.mem_gib * GIB for g in st.groups]
    worst = max(range(pp), key=lambda k: mem_tot[k] / caps[k])
    mem_w = _memory(sums[worst], s, worst, m)
    overflow = ""
    for k in range(pp):
        if mem_tot[k] > caps[k]:
            mk = _memory(sums[k], s, k, m)
            overflow = (
                f"stage {k} needs {mk.total / GIB:.1f} GiB > {caps[k] / GIB:g} GiB on "
                f"{cluster.groups[st.groups[k]].gpu.name} (largest: {mk.largest()} "
                f"{mk.as_gib()[mk.largest()]:.1f} GiB)"
            )
            break
    model_tf = mf / step / n / 1e12
    return Estimate(
        strategy=s,
        stages=st,
        step_s=step,
        model_tflops_per_gpu=model_tf,
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
    )


def _stage_time(
    s: Strategy, dims: dict[str, tuple[int, int]], cluster: Cluster, st: Stages, i: int, grp: NodeGroup,
    tab: UnitTable, u: StageSums, eff: Efficiency, overlap_grad_sync: bool,
) -> dict[str, float]:
    """Per-micro-batch time terms of stage ``i`` and its after-pipeline tail (DP sync, optimizer)."""
    rc = s.recompute
    pp, v = s.pp, s.virtual_stages
    f, bw = u.f, u.b
    rct = u.rc_full if rc == Recompute.FULL else (u.rc_sel if rc == Recompute.SELECTIVE else 0.0)
    # tensor-parallel collectives
    t_tp = 0.0
    if s.tp > 1:
        tp_bw, tp_nv = group_bw(s.tp, dims["tp"][1], grp)
        n_coll = u.n_coll * 2 + (u.n_coll_rc if rc == Recompute.FULL else 0.0)
        t_tp = n_coll * ring_allreduce_s(tab.tp_bytes, s.tp, tp_bw, eff, on_nvlink=tp_nv)
    # context parallel: K/V all-gather forward, reduce-scatter of their grads backward, behind attention
    t_cp = 0.0
    if s.cp > 1:
        cp_bw, cp_nv = group_bw(s.cp, dims["cp"][1], grp)
        comm = 3 * gather_s(u.cp_kv * s.cp / (s.cp - 1), s.cp, cp_bw, eff, on_nvlink=cp_nv)
        t_cp = max(0.0, comm - 3 * u.rc_sel)
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
    # data parallel
    grad_bytes = 2.0 * u.params
    t_z3 = t_dp = t_dp_full = 0.0
    if s.dp > 1:
        dp_bw, dp_nv = group_bw(s.dp, dims["dp"][1], grp)
        if s.zero == 3:
            comm = 3 * gather_s(grad_bytes, s.dp, dp_bw, eff, on_nvlink=dp_nv)
            t_z3 = max(0.0, comm - 0.8 * (f + bw))
        else:
            t_ar = t_dp_full = ring_allreduce_s(grad_bytes, s.dp, dp_bw, eff, on_nvlink=dp_nv)
            window = bw if overlap_grad_sync else 0.0
            t_dp = max(0.0, t_ar - window) if s.zero == 0 else max(0.0, t_ar / 2 - window) + t_ar / 2
    local_params = u.params / s.dp if s.zero >= 1 else u.params
    t_opt = OPTIM_TRAFFIC_BYTES * local_params / (grp.gpu.hbm_gbps * 1e9 * eff.mem) + 20 * eff.launch_us * 1e-6
    n_fwd = u.n_coll
    n_all = u.n_coll * 2 + (u.n_coll_rc if rc == Recompute.FULL else 0.0)
    return dict(t=f + bw + rct + t_tp + t_cp + t_p2p + t_z3, compute=f + bw, recompute=rct, tp_comm=t_tp,
                cp_comm=t_cp, pp_p2p=t_p2p, fsdp_comm=t_z3, f=f, b=bw, dp=t_dp, opt=t_opt,
                p2p_next=p2p_next, tp_fwd_frac=n_fwd / n_all if n_all else 0.5, dp_full=t_dp_full)


def _memory_total(u: StageSums, s: Strategy, stage: int, m: int) -> float:
    from trainsim.plan.memory import FRAG, WORKSPACE_GIB, in_flight

    p = u.params
    w, g, o = 2.0 * p, 2.0 * p, 12.0 * p
    if s.zero >= 1:
        o /= s.dp
    if s.zero >= 2:
        g /= s.dp
    if s.zero >= 3:
        w = w / s.dp + 4.0 * u.largest
    rc = s.recompute
    act = u.act[int(rc)] * in_flight(s.schedule, stage=stage, pp=s.pp, m=m, v=s.virtual_stages)
    trans = (u.trans_full if rc == Recompute.FULL else u.trans_sel if rc == Recompute.SELECTIVE else 0.0) + u.trans_head
    return w + g + o + act * (1 + FRAG) + trans + WORKSPACE_GIB * GIB


def _p2p_bw(s: Strategy, dims: dict[str, tuple[int, int]], cluster: Cluster, st: Stages, i: int, j: int) -> tuple[float, bool]:
    gi, gj = cluster.groups[st.groups[i]], cluster.groups[st.groups[j]]
    if st.groups[i] != st.groups[j]:
        return min(gi.gpu.nic_gbps, gj.gpu.nic_gbps), False
    stride = dims["pp"][1]
    if stride < gi.gpus_per_node and s.world <= gi.gpus_per_node * max(1, gi.count // gi.gpus_per_node):
        # neighbours share a node when the pp stride stays inside it
        same_node = (stride * s.pp) <= gi.gpus_per_node
        if same_node:
            return gi.gpu.nvlink_gbps, True
    return gi.gpu.nic_gbps, False


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
        raise UserError(f"cp={s.cp}: sequence {model.seq} must be divisible by 2*cp (load-balanced causal split)")
    if s.schedule == "interleaved" and s.virtual_stages > 1:
        blocks = model.layers if isinstance(model, Transformer) else model.n_units
        if blocks % (s.pp * s.virtual_stages):
            raise UserError(
                f"interleaved schedule: layers {blocks} not divisible by pp*virtual_stages = {s.pp}*{s.virtual_stages}"
            )
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


def best_micro_batch(
    model: Model,
    base: Strategy,
    cluster: Cluster,
    *,
    global_batch: int,
    candidates: Sequence[int] = (1, 2, 4, 8, 16, 32),
    virtual: Sequence[int] | None = None,
    eff: Efficiency = DEFAULT_EFFICIENCY,
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
                e = estimate(model, s, cluster, global_batch=global_batch, eff=eff)
            except UserError:
                continue
            if best is None or (e.fits, -e.step_s) > (best.fits, -best.step_s):
                best = e
    if best is None:
        return estimate(model, replace(base, micro_batch=1), cluster, global_batch=global_batch, eff=eff)
    return best
