"""Search for the fastest strategy that fits: exhaustive, Alpa-style DP, differentiable relaxation.

    >>> from trainsim.plan.devices import homogeneous
    >>> from trainsim.plan.search import plan
    >>> from trainsim.plan.workload import preset
    >>> res = plan(preset("gpt3-1.3b"), homogeneous("a100-80gb", 16), global_batch=64, method="exhaustive")
    >>> res.plans[0].fits
    True

Three methods, one cost model (``estimate.estimate``), so their plans compare like for like:

- ``exhaustive``: every (tp, cp, pp, dp, ep, micro-batch, schedule, virtual stages, recomputation,
  sequence parallelism, ZeRO, placement) with Megatron's uniform stages, of the non-interleaved schedules
  only the dominant one (``_dominant_schedules``); pruned by (1) a compute (+ expert all-to-all) lower
  bound against the k-th best so far, (2) recomputation tried from none to full and stopped at the
  first that fits (more recomputation only adds time), (3) ZeRO stages likewise. On a heterogeneous
  cluster it also enumerates every stage cut and GPU-kind assignment (small cases only): the reference
  that ``dp`` is tested against.
- ``dp``: for each outer choice (tp, cp, dp, micro-batch, schedule, recomputation, ZeRO) a dynamic
  program picks the number of stages, where to cut the layers and which GPU kind runs each stage. It
  follows Alpa's stage construction (Zheng et al. OSDI'22, Eq. 3-4: enumerate the bottleneck stage time
  ``t_max``, minimise the sum of stage times under it, total ``beta*sum + (m-beta)*t_max``) but, unlike
  Alpa, (a) charges point-to-point transfers between stages at the bandwidth of the two stages' GPU
  kinds (the state carries the kinds of the previous and current stage), (b) lets stages run on GPU
  kinds of different speed and memory (the state counts stages per kind, at most two kinds), and (c)
  checks memory with the in-flight micro-batches of each stage's position. The inner loop is numba.
- ``diff``: a continuous relaxation of the same stage problem: layer shares (softmax) and GPU kinds
  (softmax per stage) optimised by Adam in torch on a smooth-max objective with memory and capacity
  penalties, then rounded and scored exactly. pipeDejavu proposed this and never showed it beating DP
  (research/planner_groundtruth.md §1b); docs/benchmarks/plan.md reports what it does here.

Why one module: the three methods share the outer enumeration (``_outer``), the stage tables, the lower
bounds and the scoring, which is what keeps their plans comparable; split per method, each would import
those private pieces from a fourth module.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numba
import numpy as np

from trainsim.errors import UserError
from trainsim.plan.devices import Cluster, NodeGroup
from trainsim.plan.estimate import (
    PLACEMENTS,
    SCHEDULES,
    Estimate,
    Stages,
    Strategy,
    UnitTable,
    a2a_stage_s,
    estimate,
    group_bw,
    ring_allreduce_s,
    uniform_stages,
    unit_table,
)
from trainsim.plan.memory import GIB, in_flight, static_bytes
from trainsim.plan.optime import DEFAULT_EFFICIENCY, Efficiency, p2p_s
from trainsim.plan.workload import Model, Recompute, Transformer

if TYPE_CHECKING:
    import torch

Progress = Callable[[int, int], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class Space:
    """The factorised search space; ``None`` means the default range."""

    tp: tuple[int, ...] | None = None
    """default: powers of two up to GPUs per node that divide heads"""
    cp: tuple[int, ...] | None = None
    """default: 1, plus 2..8 for sequences >= 16k"""
    micro_batch: tuple[int, ...] = (1, 2, 4, 8, 16)
    schedules: tuple[str, ...] = SCHEDULES
    max_virtual: int = 4
    recompute: tuple[Recompute, ...] = (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    zero: tuple[int, ...] = (0, 1, 2, 3)
    placements: tuple[str, ...] = PLACEMENTS
    ep: tuple[int, ...] | None = None
    """expert-parallel degrees (MoE); default: powers of two dividing dp and the expert count"""
    fsdp_reshard: tuple[bool, ...] = (True, False)
    """ZeRO-3 with and without resharding after forward (with pipelining only without)"""
    sequence_parallel: tuple[bool, ...] = (True,)
    """with tp > 1; the estimate counts the same communication volume with or without SP and less
    memory and norm/dropout time with it, so SP dominates and the default tries only SP"""
    ep_dispatch: str = "flat"
    """expert all-to-all of every strategy (``Strategy.ep_dispatch``): an implementation the user has, not searched"""
    ep_overlap: bool = False
    """expert all-to-alls overlapped with another micro-batch's compute in every strategy with ``ep > 1``
    (``Strategy.ep_overlap``): like ``ep_dispatch``, what the user's framework does, not searched"""
    use_all_gpus: bool = True
    """exhaustive only: dp*tp*pp*cp must equal the GPU count (else any divisor count of GPUs is tried)"""


@dataclass(slots=True)
class Result:
    method: str
    plans: list[Estimate]
    evaluated: int = 0
    pruned: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


def _pow2_upto(n: int) -> list[int]:
    out, v = [], 1
    while v <= n:
        out.append(v)
        v *= 2
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_choices(model: Model, space: Space, gpn: int) -> list[int]:
    if space.tp is not None:
        return list(space.tp)
    if not isinstance(model, Transformer):
        return [1]
    return [t for t in _pow2_upto(gpn) if model.heads % t == 0 and (model.kvh % t == 0 or t % model.kvh == 0)]


def _cp_choices(model: Model, space: Space) -> list[int]:
    if space.cp is not None:
        return list(space.cp)
    if isinstance(model, Transformer) and model.seq >= 16384:
        return [c for c in (1, 2, 4, 8) if model.seq % (2 * c) == 0]
    return [1]


def _schedules(model: Model, space: Space, pp: int) -> list[tuple[str, int]]:
    if pp == 1:
        return [("1f1b", 1)]
    blocks = model.layers if isinstance(model, Transformer) else model.n_units
    out = [(sch, 1) for sch in _dominant_schedules([s for s in space.schedules if s != "interleaved"])]
    if "interleaved" in space.schedules:
        out += [("interleaved", v) for v in range(2, space.max_virtual + 1) if blocks >= pp * v]
    return out


def _a2a_bound(
    tab: UnitTable, a: int, b: int, ep: int, stride: int, grp: NodeGroup, eff: Efficiency, dispatch: str = "flat"
) -> float:
    """Expert all-to-all seconds per micro-batch of units a..b (forward and backward, never overlapped):
    part of any strategy's step with this ``ep``, so it tightens the compute lower bound."""
    if ep <= 1:
        return 0.0
    per_node = min(ep, max(1, grp.gpus_per_node // stride)) if stride < grp.gpus_per_node else 1
    return a2a_stage_s(tab.a2a_bytes[a:b], 2 * tab.a2a_count[a:b], ep, per_node, grp, eff, dispatch, tab.routing)


def _ep_choices(model: Model, space: Space, dp: int) -> list[int]:
    """Expert-parallel degrees: powers of two dividing both dp and the expert count (1 for dense models)."""
    if not isinstance(model, Transformer) or not model.experts:
        return [1]
    if space.ep is not None:
        return [e for e in space.ep if dp % e == 0 and model.experts % e == 0]
    return [e for e in _pow2_upto(min(dp, model.experts)) if dp % e == 0 and model.experts % e == 0]


def _sharding_variants(space: Space, dpc: int, pp: int) -> list[tuple[int, bool]]:
    """(ZeRO stage, reshard after forward) pairs to try: ZeRO-3 without resharding too, and only that with pp > 1."""
    if dpc == 1:
        return [(0, True)]
    out = []
    for z in space.zero:
        if z < 3:
            out.append((z, True))
            continue
        out += [(3, r) for r in space.fsdp_reshard if pp == 1 or not r]
    return out


class _TopK:
    def __init__(self, k: int) -> None:
        self.k = k
        self.items: list[Estimate] = []

    def add(self, e: Estimate) -> None:
        self.items.append(e)
        self.items.sort(key=lambda x: (not x.fits, x.step_s))
        del self.items[self.k :]

    def bound(self) -> float:
        fitting = [e for e in self.items if e.fits]
        return fitting[-1].step_s if len(fitting) >= self.k else math.inf


# =============================================================================== exhaustive
def exhaustive(
    model: Model,
    cluster: Cluster,
    *,
    global_batch: int,
    space: Space = Space(),
    top_k: int = 5,
    eff: Efficiency = DEFAULT_EFFICIENCY,
    progress: Progress | None = None,
) -> Result:
    t0 = time.perf_counter()
    if not cluster.homogeneous or len(cluster.groups) > 1:
        return _exhaustive_hetero(model, cluster, global_batch=global_batch, space=space, top_k=top_k, eff=eff,
                                  progress=progress, t0=t0)
    grp = cluster.groups[0]
    n = grp.count
    top = _TopK(top_k)
    res = Result("exhaustive", [])
    worlds = [n] if space.use_all_gpus else [w for w in _divisors(n)]
    outer = []
    for w in worlds:
        for tp in _tp_choices(model, space, grp.gpus_per_node):
            for cp in _cp_choices(model, space):
                if w % (tp * cp):
                    continue
                for pp in _divisors(w // (tp * cp)):
                    if pp > (model.layers if isinstance(model, Transformer) else model.n_units):
                        continue
                    outer.append((tp, cp, pp, w // (tp * cp * pp)))
    min_static = math.inf
    flash = isinstance(model, Transformer) and model.flash_attention
    for idx, (tp, cp, pp, dp) in enumerate(outer):
        if progress:
            progress(idx, len(outer))
        if global_batch % dp:
            continue
        sub = Cluster(groups=(replace(grp, count=tp * cp * pp * dp) if tp * cp * pp * dp < n else grp,))
        for mb, ep in itertools.product(space.micro_batch, _ep_choices(model, space, dp)):
            if (global_batch // dp) % mb:
                continue
            m = global_batch // (dp * mb)
            try:
                tab = unit_table(model, mb, tp, tp > 1, cp, grp.gpu, eff, ep)
            except UserError:
                continue
            st = uniform_stages(model, pp)
            # lower bound: compute of the slowest stage for m micro-batches, no communication, no bubble
            # (an overlapped all-to-all may hide entirely: then it adds nothing to the bound)
            a2a_ep = 1 if space.ep_overlap else ep
            lb = m * max(float(tab.fwd[a:b].sum() + tab.bwd[a:b].sum()) + _a2a_bound(tab, a, b, a2a_ep, tp * cp, grp, eff, space.ep_dispatch)
                         for a, b in zip(st.bounds, st.bounds[1:], strict=False))  # fmt: skip
            if lb >= top.bound():
                res.pruned += 1
                continue
            # static-memory lower bound with the strongest sharding
            p_stage = max(float(tab.params[a:b].sum()) for a, b in zip(st.bounds, st.bounds[1:], strict=False))
            e_stage = max(float(tab.expert_params[a:b].sum()) for a, b in zip(st.bounds, st.bounds[1:], strict=False))
            need = sum(static_bytes(p_stage, zero=max(space.zero), dp=dp * cp, expert_params=e_stage, ep=ep))
            min_static = min(min_static, need)
            if need > grp.gpu.mem_gib * GIB:
                res.pruned += 1
                continue
            for sch, v in _schedules(model, space, pp):
                for place in space.placements if pp > 1 and dp > 1 else space.placements[:1]:
                    for sp in space.sequence_parallel if tp > 1 else (False,):
                        first_fit: dict[int, int] = {}  # zero stage -> recompute level that first fitted
                        for zero, reshard in _sharding_variants(space, dp * cp, pp):
                            # ZeRO-2 is never faster than ZeRO-1 (it adds a reduce-scatter per micro-batch) and
                            # saves memory: only try recomputation levels below the one at which ZeRO-1 fitted
                            rc_limit = first_fit.get(1, 99) if zero == 2 else 99
                            for rc in space.recompute:
                                if int(rc) >= rc_limit:
                                    res.pruned += 1
                                    break
                                if rc == Recompute.SELECTIVE and flash:
                                    continue  # a fused attention core keeps nothing to recompute: same as none
                                try:
                                    s = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, micro_batch=mb, schedule=sch,
                                                 virtual_stages=v, recompute=rc, sequence_parallel=sp, zero=zero,
                                                 placement=place, ep=ep, reshard_after_forward=reshard,
                                                 ep_dispatch=space.ep_dispatch, ep_overlap=space.ep_overlap and ep > 1)  # fmt: skip
                                    e = estimate(model, s, sub, global_batch=global_batch, eff=eff)
                                except UserError:
                                    res.pruned += 1
                                    break
                                res.evaluated += 1
                                top.add(e)
                                if e.fits:
                                    first_fit[zero] = int(rc)
                                    break  # more recomputation only adds time
    if progress:
        progress(len(outer), len(outer))
    if not top.items and math.isfinite(min_static):
        res.notes.append(
            f"weights, gradients and optimizer states alone need {min_static / GIB:.1f} GiB per GPU at best "
            f"(ZeRO-{max(space.zero)}, deepest pipeline) > {grp.gpu.mem_gib:g} GiB on {grp.gpu.name}"
        )
    return _finish(res, top, t0)


# =============================================================================== stage tables
@dataclass(frozen=True, slots=True)
class _StageTables:
    """Per GPU kind k and unit range [i, j): stage time per micro-batch and memory terms."""

    t: np.ndarray  # (K, U+1, U+1) seconds per micro-batch (compute + recompute + TP/CP comm)
    mem_static: np.ndarray  # (K, U+1, U+1) bytes
    mem_act: np.ndarray  # (K, U+1, U+1) bytes per in-flight micro-batch
    mem_trans: np.ndarray  # (K, U+1, U+1) bytes
    p2p: np.ndarray  # (K, K, U+1) seconds, both directions, of a cut before unit j
    cap: np.ndarray  # (K,) bytes
    slots: np.ndarray  # (K,) stages of ``dp*tp*cp`` GPUs each kind can host


def _stage_tables(model: Model, cluster: Cluster, s: Strategy, m: int, eff: Efficiency) -> _StageTables:
    from trainsim.plan.memory import FRAG, WORKSPACE_GIB

    K = len(cluster.groups)
    U = model.n_units
    t = np.full((K, U + 1, U + 1), np.inf)
    ms = np.zeros((K, U + 1, U + 1))
    ma = np.zeros((K, U + 1, U + 1))
    mt = np.zeros((K, U + 1, U + 1))
    p2p = np.zeros((K, K, U + 1))
    rc = int(s.recompute)
    per = s.dp * s.tp * s.cp
    for k, grp in enumerate(cluster.groups):
        tab = unit_table(model, s.micro_batch, s.tp, s.sequence_parallel, s.cp, grp.gpu, eff)
        tp_bw, tp_nv = group_bw(s.tp, 1, grp)
        ar = ring_allreduce_s(tab.tp_bytes, s.tp, tp_bw, eff, on_nvlink=tp_nv)
        rct = tab.rc_full if s.recompute == Recompute.FULL else (tab.rc_sel if s.recompute == Recompute.SELECTIVE else 0 * tab.fwd)
        ncoll = tab.tp_coll * 2 + (tab.tp_coll * (tab.rc_full > 0) if s.recompute == Recompute.FULL else 0)
        unit_t = tab.fwd + tab.bwd + rct + ncoll * ar
        pre = np.concatenate(([0.0], np.cumsum(unit_t)))
        prm = np.concatenate(([0.0], np.cumsum(tab.params)))
        act = np.array([c.act_bytes[rc] for c in tab.costs])
        pra = np.concatenate(([0.0], np.cumsum(act)))
        if s.recompute == Recompute.FULL:
            trans = np.array([c.transient_bytes if c.name != "head" else 0.0 for c in tab.costs])
        elif s.recompute == Recompute.SELECTIVE:
            trans = np.array([c.act_bytes[0] - c.act_bytes[1] for c in tab.costs])
        else:
            trans = np.zeros(U)
        head = np.array([c.transient_bytes if c.name == "head" else 0.0 for c in tab.costs])
        largest = np.array(tab.params)
        for i in range(U):
            tmax_tr = 0.0
            hsum = 0.0
            big = 0.0
            for j in range(i + 1, U + 1):
                tmax_tr = max(tmax_tr, trans[j - 1])
                hsum += head[j - 1]
                big = max(big, largest[j - 1])
                t[k, i, j] = pre[j] - pre[i]
                shared = tab.costs[-1].tied_params if (i == 0 and j == U) else 0
                w, g, o = static_bytes(prm[j] - prm[i] - shared, zero=s.zero, dp=s.dp, largest_layer_params=big)
                ms[k, i, j] = w + g + o + WORKSPACE_GIB * GIB
                ma[k, i, j] = (pra[j] - pra[i]) * (1 + FRAG)
                mt[k, i, j] = tmax_tr + hsum
        for k2, grp2 in enumerate(cluster.groups):
            for j in range(1, U):
                size = float(tab.out_bytes[j - 1]) / (1 if s.sequence_parallel else s.tp)
                if k2 == k:
                    same_node = per * 2 <= grp.gpus_per_node
                    bw, nv = (grp.gpu.nvlink_gbps, True) if same_node else (grp.inter_node_gbps(2), False)
                else:
                    bw, nv = min(grp.inter_node_gbps(2), grp2.inter_node_gbps(2)), False
                p2p[k, k2, j] = 2 * p2p_s(size, bw, eff, on_nvlink=nv)
    cap = np.array([g.gpu.mem_gib * GIB for g in cluster.groups])
    slots = np.array([g.count // per for g in cluster.groups], np.int64)
    return _StageTables(t, ms, ma, mt, p2p, cap, slots)


def _inflight_table(schedule: str, smax: int, m: int) -> np.ndarray:
    """in-flight micro-batches of a stage with ``a`` stages after it, a = 0..smax."""
    return np.array([in_flight(schedule, stage=0, pp=a + 1, m=m, v=1) for a in range(smax + 1)])


@numba.njit(cache=True)
def _dp_kernel(t, ms, ma, mt, p2p, cap, slots, inflight, tmax, smax):
    """F[i, s, a, kp, kf]: min sum of stage times of units i..U-1 cut into s stages, a of them kind 0,
    first stage kind kf, previous stage kind kp (K = none). Returns F and the argmin choice (j, kn)."""
    K = t.shape[0]
    U = t.shape[1] - 1
    n0 = slots[0]
    n1 = slots[1] if K > 1 else 0
    INF = np.inf
    F = np.full((U + 1, smax + 1, n0 + 1, K + 1, K), INF)
    CJ = np.full((U + 1, smax + 1, n0 + 1, K + 1, K), -1, np.int64)
    CK = np.full((U + 1, smax + 1, n0 + 1, K + 1, K), -1, np.int64)
    for i in range(U - 1, -1, -1):
        for kp in range(K + 1):
            if (i == 0) != (kp == K):
                continue
            for kf in range(K):
                start = p2p[kp, kf, i] if kp < K else 0.0
                for j in range(i + 1, U + 1):
                    base = t[kf, i, j] + start
                    if base > tmax:
                        break
                    if j == U:
                        # last stage: nothing after it
                        a = 1 if kf == 0 else 0
                        if a > n0 or (1 - a) > n1:
                            continue
                        if ms[kf, i, j] + ma[kf, i, j] * inflight[0] + mt[kf, i, j] > cap[kf]:
                            continue
                        if base < F[i, 1, a, kp, kf]:
                            F[i, 1, a, kp, kf] = base
                            CJ[i, 1, a, kp, kf] = U
                            CK[i, 1, a, kp, kf] = -1
                        continue
                    for s in range(2, min(smax, U - i) + 1):
                        if s - 1 > U - j:
                            break
                        if ms[kf, i, j] + ma[kf, i, j] * inflight[s - 1] + mt[kf, i, j] > cap[kf]:
                            continue
                        for kn in range(K):
                            tt = base + p2p[kf, kn, j]
                            if tt > tmax:
                                continue
                            da = 1 if kf == 0 else 0
                            lo = max(0, s - n1)
                            hi = min(s, n0)
                            for a in range(lo, hi + 1):
                                if a - da < 0:
                                    continue
                                rest = F[j, s - 1, a - da, kf, kn]
                                if rest == INF:
                                    continue
                                if tt + rest < F[i, s, a, kp, kf]:
                                    F[i, s, a, kp, kf] = tt + rest
                                    CJ[i, s, a, kp, kf] = j
                                    CK[i, s, a, kp, kf] = kn
    return F, CJ, CK


def _dp_stages(tabs: _StageTables, m: int, beta: float, schedule: str, max_candidates: int = 400) -> list[tuple[float, Stages]]:
    """Best stage layouts (objective, stages) over t_max candidates."""
    K, U = tabs.t.shape[0], tabs.t.shape[1] - 1
    slots = tabs.slots.copy()
    if K == 1:
        slots = np.array([slots[0], 0], np.int64)
    smax = int(min(U, slots.sum()))
    if smax < 1:
        return []
    inflight = _inflight_table(schedule, smax, m)
    # t_max candidates: every possible stage time (compute + both boundary transfers), as Alpa enumerates
    # its distinct stage costs; thinned to ``max_candidates`` quantiles above the lower bound when large
    vals = []
    for k in range(K):
        tt = tabs.t[k]
        ii, jj = np.nonzero(np.isfinite(tt))
        base = tt[ii, jj]
        for kp in range(K + 1):
            start = np.where(ii > 0, tabs.p2p[min(kp, K - 1), k, ii], 0.0) if kp < K else np.where(ii == 0, 0.0, np.inf)
            for kn in range(K):
                end = np.where(jj < U, tabs.p2p[k, kn, np.minimum(jj, U)], 0.0)
                vals.append(base + start + end)
    allv = np.concatenate(vals) if vals else np.zeros(0)
    allv = allv[np.isfinite(allv)]
    if allv.size == 0:
        return []
    lb = max(float(tabs.t[:, 0, U].min()) / smax, float(np.min([tabs.t[k, u, u + 1] for k in range(K) for u in range(U)], axis=0).max()))
    cands = np.unique(allv[allv >= lb * (1 - 1e-9)])
    if cands.size > max_candidates:
        cands = np.unique(np.quantile(cands, np.linspace(0, 1, max_candidates), method="nearest"))
    out: list[tuple[float, Stages]] = []
    best = math.inf

    def run(tmax: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return _dp_kernel(tabs.t, tabs.mem_static, tabs.mem_act, tabs.mem_trans, tabs.p2p, tabs.cap, slots,
                          inflight, float(tmax), smax)

    # feasibility is monotone in t_max: binary-search the smallest feasible candidate, then scan upwards
    lo_i, hi_i = 0, len(cands) - 1
    if not np.isfinite(run(cands[hi_i])[0][0, :, :, K, :]).any():
        return []
    while lo_i < hi_i:
        mid = (lo_i + hi_i) // 2
        if np.isfinite(run(cands[mid])[0][0, :, :, K, :]).any():
            hi_i = mid
        else:
            lo_i = mid + 1
    for tmax in cands[lo_i:]:
        if (m - beta) * tmax >= best:
            break
        F, CJ, CK = run(tmax)
        root = F[0, :, :, K, :]
        if not np.isfinite(root).any():
            continue
        for s in range(1, smax + 1):
            for a in range(root.shape[1]):
                for kf in range(K):
                    val = root[s, a, kf]
                    if not np.isfinite(val):
                        continue
                    # reconstruct
                    bounds, groups = [0], []
                    i, ss, aa, kp, k = 0, s, a, K, kf
                    while True:
                        j = int(CJ[i, ss, aa, kp, k])
                        kn = int(CK[i, ss, aa, kp, k])
                        bounds.append(j)
                        groups.append(k)
                        if j == U:
                            break
                        aa -= 1 if k == 0 else 0
                        i, ss, kp, k = j, ss - 1, k, kn
                    st = Stages(tuple(bounds), tuple(groups))
                    obj = beta * val + (m - beta) * _actual_max(tabs, st)
                    out.append((obj, st))
                    best = min(best, obj)
    out.sort(key=lambda x: x[0])
    uniq: list[tuple[float, Stages]] = []
    seen = set()
    for o, st in out:
        if st not in seen:
            seen.add(st)
            uniq.append((o, st))
    return uniq


def _actual_max(tabs: _StageTables, st: Stages) -> float:
    n = len(st.groups)
    worst = 0.0
    for i in range(n):
        a, b, k = st.bounds[i], st.bounds[i + 1], st.groups[i]
        t = tabs.t[k, a, b]
        if i > 0:
            t += tabs.p2p[st.groups[i - 1], k, a]
        if i + 1 < n:
            t += tabs.p2p[k, st.groups[i + 1], b]
        worst = max(worst, float(t))
    return worst


def _beta(schedule: str, v: int) -> float:
    return {"gpipe": 1.0, "1f1b": 1.0, "zb": 1.0 / 3.0, "interleaved": 1.0 / max(1, v)}[schedule]


def _dominant_schedules(schedules: Sequence[str]) -> list[str]:
    """Schedules the stage DP considers. Interleaving is left to ``exhaustive`` (uniform stages only).

    Under this cost model ZB-H1 has 1F1B's memory and a smaller bubble, and GPipe has 1F1B's time with
    more memory, so when ``zb`` is allowed it dominates the other two; without it 1F1B dominates GPipe.
    """
    if "zb" in schedules:
        return ["zb"]
    if "1f1b" in schedules:
        return ["1f1b"]
    return [s for s in schedules if s == "gpipe"]


def _outer(model: Model, cluster: Cluster, global_batch: int, space: Space) -> list[Strategy]:
    """Outer choices for the stage DP: tp, cp, dp, micro-batch, schedule, recomputation, ZeRO (pp = 1 here)."""
    gpn = min(g.gpus_per_node for g in cluster.groups)
    n_max = max(g.count for g in cluster.groups)
    out = []
    for tp in _tp_choices(model, space, gpn):
        for cp in _cp_choices(model, space):
            for dp in _divisors(global_batch):
                if dp * tp * cp > n_max:
                    break
                for mb in space.micro_batch:
                    if (global_batch // dp) % mb:
                        continue
                    for sch in _dominant_schedules(space.schedules):
                        zeros = {z for z in space.zero if dp > 1 or z == 0} or {0}
                        for zero in sorted(zeros):
                            for rc in space.recompute:
                                out.append(Strategy(dp=dp, tp=tp, cp=cp, micro_batch=mb, schedule=sch,
                                                    recompute=rc, sequence_parallel=tp > 1, zero=zero))
    return out


def dp_search(
    model: Model,
    cluster: Cluster,
    *,
    global_batch: int,
    space: Space = Space(),
    top_k: int = 5,
    eff: Efficiency = DEFAULT_EFFICIENCY,
    progress: Progress | None = None,
    outer: Sequence[Strategy] | None = None,
    max_outer: int | None = None,
) -> Result:
    """Alpa-style stage DP with inter-stage communication and heterogeneous GPU kinds (<= 2).

    ``max_outer`` keeps only that many outer choices, those with the smallest compute lower bound.
    """
    t0 = time.perf_counter()
    if len(cluster.groups) > 2:
        raise UserError(f"--method dp handles at most 2 GPU groups; the cluster has {len(cluster.groups)}")
    res = Result("dp", [])
    top = _TopK(top_k)
    fitted: set[tuple] = set()
    cands = _candidates(model, cluster, global_batch, space, outer)
    for s, m, tabs in _ranked_tables(model, cluster, global_batch, cands, eff, max_outer, fitted, progress):
        if _outer_bound(model, cluster, global_batch, s, eff) >= top.bound():
            res.pruned += 1
            continue
        layouts = _dp_stages(tabs, m, _beta(s.schedule, 1), s.schedule)
        res.evaluated += 1
        if layouts:
            fitted.add(_recompute_key(s))
        for _obj, st in layouts[:5]:
            e = _score(model, s, st, cluster, global_batch, eff)
            if e is not None:
                top.add(e)
    return _finish(res, top, t0)


def _candidates(model: Model, cluster: Cluster, global_batch: int, space: Space, outer: Sequence[Strategy] | None) -> list[Strategy]:
    """The outer choices given by the caller, else the enumeration of ``space`` (``_outer``)."""
    return list(outer) if outer is not None else _outer(model, cluster, global_batch, space)


def _recompute_key(s: Strategy) -> tuple:
    """An outer choice less its recomputation level: once one level yields a fitting layout, more only adds time."""
    return (s.dp, s.tp, s.cp, s.micro_batch, s.schedule, s.zero)


def _ranked_tables(
    model: Model, cluster: Cluster, global_batch: int, cands: Sequence[Strategy], eff: Efficiency,
    max_outer: int | None, fitted: set[tuple], progress: Progress | None,
) -> Iterator[tuple[Strategy, int, _StageTables]]:
    """The ``max_outer`` most promising outer choices (``_rank_outer``) with their micro-batch count and
    stage tables, reporting progress; skips a choice whose ``_recompute_key`` the caller added to ``fitted``
    (a cheaper recomputation already fitted) and one whose tables cannot be built."""
    ranked = _rank_outer(model, cluster, global_batch, cands, eff)[:max_outer]
    for idx, s in enumerate(ranked):
        if progress:
            progress(idx, len(ranked))
        if _recompute_key(s) in fitted:
            continue
        m = global_batch // (s.dp * s.micro_batch)
        try:
            tabs = _stage_tables(model, cluster, s, m, eff)
        except UserError:
            continue
        yield s, m, tabs
    if progress:
        progress(len(ranked), len(ranked))


def _finish(res: Result, top: _TopK, t0: float) -> Result:
    """``res`` with the best plans found and the seconds since ``t0``."""
    res.plans = top.items
    res.seconds = time.perf_counter() - t0
    return res


def _score(model: Model, s: Strategy, st: Stages, cluster: Cluster, global_batch: int, eff: Efficiency) -> Estimate | None:
    try:
        s2 = replace(s, pp=len(st.groups))
        return estimate(model, s2, cluster, global_batch=global_batch, stages=st, eff=eff)
    except UserError:
        return None


# =============================================================================== exhaustive, heterogeneous
def _compositions(U: int, S: int) -> list[tuple[int, ...]]:
    return [(0, *c, U) for c in itertools.combinations(range(1, U), S - 1)]


def _exhaustive_hetero(
    model: Model, cluster: Cluster, *, global_batch: int, space: Space, top_k: int, eff: Efficiency,
    progress: Progress | None, t0: float, limit: int = 400_000, outer: Sequence[Strategy] | None = None,
) -> Result:
    res = Result("exhaustive", [])
    top = _TopK(top_k)
    cands = _candidates(model, cluster, global_batch, space, outer)
    U = model.n_units
    K = len(cluster.groups)
    for idx, s in enumerate(cands):
        if progress:
            progress(idx, len(cands))
        per = s.dp * s.tp * s.cp
        slots = [g.count // per for g in cluster.groups]
        smax = min(U, sum(slots))
        total = sum(math.comb(U - 1, S - 1) * K**S for S in range(1, smax + 1))
        if total > limit:
            raise UserError(
                f"exhaustive search over {total} stage layouts is too large for this heterogeneous case; "
                "use --method dp"
            )
        for S in range(1, smax + 1):
            for bounds in _compositions(U, S):
                for kinds in itertools.product(range(K), repeat=S):
                    if any(kinds.count(k) > slots[k] for k in range(K)):
                        continue
                    e = _score(model, s, Stages(bounds, kinds), cluster, global_batch, eff)
                    res.evaluated += 1
                    if e is not None:
                        top.add(e)
    return _finish(res, top, t0)


# =============================================================================== differentiable
class _Adam:
    """Adam (Kingma & Ba 2015) on a few leaf tensors; torch.optim would import torch._dynamo (~5 s)."""

    def __init__(self, params: list[torch.Tensor], lr: float, b1: float = 0.9, b2: float = 0.999) -> None:
        import torch

        self.params, self.lr, self.b1, self.b2, self.t = params, lr, b1, b2, 0
        self.m = [torch.zeros_like(p) for p in params]
        self.v = [torch.zeros_like(p) for p in params]

    def step(self, loss: torch.Tensor) -> None:
        import torch

        grads = torch.autograd.grad(loss, self.params)
        self.t += 1
        with torch.no_grad():
            for p, g, m, v in zip(self.params, grads, self.m, self.v, strict=True):
                m.mul_(self.b1).add_(g, alpha=1 - self.b1)
                v.mul_(self.b2).addcmul_(g, g, value=1 - self.b2)
                mh = m / (1 - self.b1**self.t)
                vh = v / (1 - self.b2**self.t)
                p.sub_(self.lr * mh / (vh.sqrt() + 1e-8))


def _interp(pre: torch.Tensor, x: torch.Tensor, U: int) -> torch.Tensor:
    """Piecewise-linear prefix sums ``pre`` (K, U+1) at continuous positions ``x`` (R, S) -> (R, S, K)."""
    x = x.clamp(0, U)
    lo = x.floor().clamp(max=U - 1).long()
    w = x - lo
    a = pre[:, lo].permute(1, 2, 0)
    b = pre[:, lo + 1].permute(1, 2, 0)
    return a + (b - a) * w.unsqueeze(-1)


def diff_search(
    model: Model,
    cluster: Cluster,
    *,
    global_batch: int,
    space: Space = Space(),
    top_k: int = 5,
    eff: Efficiency = DEFAULT_EFFICIENCY,
    progress: Progress | None = None,
    steps: int = 80,
    restarts: int = 4,
    seed: int = 0,
    outer: Sequence[Strategy] | None = None,
    max_outer: int = 16,
) -> Result:
    """Relaxed stage cutting + kind assignment by gradient descent (torch), rounded and scored exactly.

    Gradient descent costs far more per outer choice than the DP, so only the ``max_outer`` outer
    choices with the smallest compute lower bound are relaxed.
    """
    import torch

    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only add synchronisation
    try:
        return _diff_search(model, cluster, global_batch, space, top_k, eff, progress, steps, restarts, seed,
                            outer, max_outer, t0)
    finally:
        torch.set_num_threads(threads)


def _diff_search(
    model: Model, cluster: Cluster, global_batch: int, space: Space, top_k: int, eff: Efficiency,
    progress: Progress | None, steps: int, restarts: int, seed: int, outer: Sequence[Strategy] | None,
    max_outer: int, t0: float,
) -> Result:
    import torch

    res = Result("diff", [])
    top = _TopK(top_k)
    gen = torch.Generator().manual_seed(seed)
    fitted: set[tuple] = set()
    cands = _candidates(model, cluster, global_batch, space, outer)
    for s, m, tabs in _ranked_tables(model, cluster, global_batch, cands, eff, max_outer, fitted, progress):
        K, U = tabs.t.shape[0], tabs.t.shape[1] - 1
        smax = int(min(U, tabs.slots.sum()))
        beta = _beta(s.schedule, 1)
        unit_min = tabs.t[:, 0, -1].min() / max(1, smax)
        if m * unit_min >= top.bound():
            res.pruned += 1
            continue
        # prefix sums per kind of unit time / static memory / activations (for the continuous cut positions)
        pre_t = torch.tensor(np.concatenate([[tabs.t[k, 0, 1:]] for k in range(K)]), dtype=torch.float64)
        pre_t = torch.cat([torch.zeros(K, 1, dtype=torch.float64), pre_t], 1)
        pre_ms = torch.tensor(np.stack([np.concatenate(([0.0], tabs.mem_static[k, 0, 1:] - tabs.mem_static[k, 0, 1].min() * 0)) for k in range(K)]))
        pre_ma = torch.tensor(np.stack([np.concatenate(([0.0], tabs.mem_act[k, 0, 1:])) for k in range(K)]))
        cap = torch.tensor(tabs.cap)
        slots = torch.tensor(tabs.slots, dtype=torch.float64)
        p2p_mean = float(tabs.p2p[np.isfinite(tabs.p2p)].mean()) if tabs.p2p.size else 0.0
        inflight = torch.tensor(_inflight_table(s.schedule, smax, m), dtype=torch.float64)
        any_fit = False
        for S in sorted({1, 2, 4, 8, 16, 32, smax} & set(range(1, smax + 1))):
            th = torch.randn(restarts, S, generator=gen, dtype=torch.float64) * 0.1
            ph = torch.randn(restarts, S, K, generator=gen, dtype=torch.float64) * 0.1
            th.requires_grad_(True)
            ph.requires_grad_(True)
            adam = _Adam([th, ph], lr=0.1)
            xs = torch.arange(U + 1, dtype=torch.float64)
            after = inflight[torch.arange(S - 1, -1, -1)]  # stages after stage i: S-1-i
            for _ in range(steps):
                share = torch.softmax(th, -1)
                cut = torch.cumsum(share, -1) * U  # (R, S) right edges
                left = torch.cat([torch.zeros(restarts, 1, dtype=torch.float64), cut[:, :-1]], 1)
                p = torch.softmax(ph, -1)  # (R, S, K)

                tk = _interp(pre_t, cut, U) - _interp(pre_t, left, U)  # (R, S, K)
                stage_t = (p * tk).sum(-1) + (p2p_mean if S > 1 else 0.0)
                mem = _interp(pre_ms, cut, U) - _interp(pre_ms, left, U) + (
                    _interp(pre_ma, cut, U) - _interp(pre_ma, left, U)
                ) * after.view(1, S, 1)
                over = torch.relu(mem / cap - 1.0)
                cap_over = torch.relu(p.sum(1) - slots)  # (R, K)
                tau = 0.02 * stage_t.detach().mean()
                smooth_max = tau * torch.logsumexp(stage_t / tau, -1)
                obj = beta * stage_t.sum(-1) + (m - beta) * smooth_max
                scale = obj.detach().mean()
                loss = obj / scale + 10.0 * (p * over**2).sum((-1, -2)) + 10.0 * (cap_over**2).sum(-1)
                adam.step(loss.sum())
            del xs
            with torch.no_grad():
                cut = (torch.cumsum(torch.softmax(th, -1), -1) * U).numpy()
                kinds = torch.argmax(ph, -1).numpy()
            for r in range(restarts):
                bounds = [0]
                for i in range(S - 1):
                    c = round(float(cut[r, i]))
                    c = min(max(c, bounds[-1] + 1), U - (S - 1 - i))
                    bounds.append(c)
                bounds.append(U)
                ks = [int(k) for k in kinds[r]]
                for k in range(K):  # repair capacity: move surplus stages to a kind with room
                    while ks.count(k) > int(tabs.slots[k]):
                        room = [k2 for k2 in range(K) if ks.count(k2) < int(tabs.slots[k2])]
                        if not room:
                            break
                        ks[ks.index(k)] = room[0]
                if any(ks.count(k) > int(tabs.slots[k]) for k in range(K)):
                    continue
                e = _score(model, s, Stages(tuple(bounds), tuple(ks)), cluster, global_batch, eff)
                res.evaluated += 1
                if e is not None:
                    top.add(e)
                    any_fit = any_fit or e.fits
        if any_fit:
            fitted.add(_recompute_key(s))
    return _finish(res, top, t0)


def _outer_bound(model: Model, cluster: Cluster, global_batch: int, s: Strategy, eff: Efficiency) -> float:
    """Lower bound of the step time of any stage layout for outer choice ``s``.

    With ``S`` stages of the fastest kind and compute ``C`` (forward, backward, recomputation) split
    evenly, the pipeline takes at least ``(m + beta (S - 1)) C / S``; ``S`` ranges from the fewest stages
    whose weights, gradients and optimizer states fit to the most the cluster can host.
    """
    m = global_batch // (s.dp * s.micro_batch)
    per = s.dp * s.tp * s.cp
    slots = sum(g.count // per for g in cluster.groups)
    smax = min(slots, model.n_units)
    if smax < 1:
        return math.inf
    beta = _beta(s.schedule, 1)
    best = math.inf
    for grp in cluster.groups:
        try:
            tab = unit_table(model, s.micro_batch, s.tp, s.sequence_parallel, s.cp, grp.gpu, eff)
        except UserError:
            return math.inf
        rc = tab.rc_full if s.recompute == Recompute.FULL else tab.rc_sel if s.recompute == Recompute.SELECTIVE else 0.0
        c = float((tab.fwd + tab.bwd + rc).sum())
        static = sum(static_bytes(float(tab.params.sum()), zero=s.zero, dp=s.dp))
        smin = max(1, math.ceil(static / (max(g.gpu.mem_gib for g in cluster.groups) * GIB)))
        for n_st in range(smin, smax + 1):
            best = min(best, (m + beta * (n_st - 1)) * c / n_st)
    return best


def _rank_outer(model: Model, cluster: Cluster, global_batch: int, cands: Sequence[Strategy], eff: Efficiency) -> list[Strategy]:
    """Outer choices sorted by ``_outer_bound`` (then less recomputation, lower ZeRO stage)."""
    scored = []
    for s in cands:
        lb = _outer_bound(model, cluster, global_batch, s, eff)
        if math.isfinite(lb):
            scored.append((lb, int(s.recompute), s.zero, s))
    scored.sort(key=lambda x: x[:3])
    return [x[3] for x in scored]


# =============================================================================== entry point
METHODS = ("exhaustive", "dp", "diff")


def plan(
    model: Model,
    cluster: Cluster,
    *,
    global_batch: int,
    method: str = "exhaustive",
    space: Space = Space(),
    top_k: int = 5,
    eff: Efficiency = DEFAULT_EFFICIENCY,
    progress: Progress | None = None,
) -> Result:
    """Search; the best plans first (fitting ones before non-fitting). ``UserError`` if nothing fits."""
    if method not in METHODS:
        raise UserError(f"--method {method!r}; expected one of {', '.join(METHODS)}")
    fn = {"exhaustive": exhaustive, "dp": dp_search, "diff": diff_search}[method]
    res = fn(model, cluster, global_batch=global_batch, space=space, top_k=top_k, eff=eff, progress=progress)
    if not res.plans or not res.plans[0].fits:
        why = res.plans[0].overflow if res.plans else (
            res.notes[0] if res.notes else "no strategy is valid for this model and cluster"
        )
        raise UserError(f"{getattr(model, 'name', '') or 'model'} cannot fit on {cluster.describe()}: {why}")
    res.plans = [e for e in res.plans if e.fits]
    return res
