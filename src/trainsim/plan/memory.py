"""Peak memory of one GPU of one pipeline stage.

    >>> from trainsim.plan.memory import in_flight
    >>> in_flight("1f1b", stage=0, pp=4, m=8, v=1), in_flight("gpipe", stage=0, pp=4, m=8, v=1)
    (4.0, 8.0)

Terms (bytes, one GPU):

- **weights** 2 B/param (16-bit), **gradients** 2 B/param, **optimizer** 12 B/param (fp32 master copy,
  Adam m and v): the 16 B/param of mixed-precision Adam in ZeRO (Rajbhandari et al., SC'20, §3.1, K=12).
- **ZeRO** stage 1 shards the optimizer states over data parallelism (``dp * cp`` ranks, or the hybrid
  shard group), stage 2 also the gradients, stage 3 (= FSDP full sharding) also the weights, plus an
  unsharded working copy of the two largest layers (the one running and the one prefetched); without
  resharding after forward, the whole stage's weights stay gathered. Expert weights are sharded over
  the ``dp / ep`` ranks that hold the same experts.
- **activations**: the bytes each layer saves per micro-batch (``workload``; Korthikanti et al. §4)
  times the micro-batches in flight on this stage (``in_flight``), plus the transient bytes of the
  layer running backward (the recomputed layer under full recomputation, the attention core under
  selective, the fp32 logits gradient on the last stage).
- **allowance** for the caching allocator's fragmentation and for cuBLAS / NCCL workspaces:
  ``frag`` (10%) of activations plus ``workspace_gib`` (1 GiB). Both are assumptions, stated here and in
  docs/plan.md; measured comparisons in docs/benchmarks/plan.md leave them out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainsim.plan.workload import LayerCost, Recompute

GIB = 2**30
WEIGHT_BYTES = 2
GRAD_BYTES = 2
OPTIM_BYTES = 12
FRAG = 0.10
WORKSPACE_GIB = 1.0


def in_flight(schedule: str, *, stage: int, pp: int, m: int, v: int) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak (in units of whole-stage layers).

    GPipe keeps all ``m``; 1F1B and ZB-H1 keep ``pp - stage`` (Narayanan et al. SC'21 §2.2; Qi et al.
    ICLR'24 ZB-H1 keeps 1F1B's memory); interleaved with ``v`` chunks keeps ``((pp-stage-1)*2 +
    (v-1)*pp + 1)`` chunk activations (Megatron-LM's warm-up count), i.e. ``pp(1 + (pp-1)/(pp v))`` stage
    equivalents on the first stage (Korthikanti et al. §4.2.3).
    """
    if schedule == "gpipe":
        return float(m)
    if schedule == "interleaved" and v > 1:
        chunks = (pp - stage - 1) * 2 + (v - 1) * pp + 1
        return min(float(m), chunks / v)
    return float(min(pp - stage, m))


@dataclass(frozen=True, slots=True)
class Memory:
    """Bytes per GPU by term."""

    weights: float
    grads: float
    optimizer: float
    activations: float
    transient: float
    allowance: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.transient + self.allowance

    def as_gib(self) -> dict[str, float]:
        d = {k: getattr(self, k) / GIB for k in ("weights", "grads", "optimizer", "activations", "transient", "allowance")}
        d["total"] = self.total / GIB
        return d

    def largest(self) -> str:
        d = self.as_gib()
        d.pop("total")
        return max(d, key=lambda k: d[k])


def static_bytes(
    params: float, *, zero: int, dp: int, largest_layer_params: float = 0.0, expert_params: float = 0.0, ep: int = 1,
    reshard: bool = True,
) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes for ``params`` parameters on this GPU.

    ``dp`` is the number of ranks a ZeRO shard is split over; ``expert_params`` of the ``params`` are
    experts, replicated on only ``dp / ep`` of those ranks and so sharded ``dp / ep`` ways. ZeRO-3 keeps
    two layers unsharded (the one running and the one prefetched) when it reshards after forward, and
    every layer of the stage from forward to backward when it does not (FSDP SHARD_GRAD_OP).
    """
    dense = params - expert_params
    d_e = max(1, dp // ep)

    def sharded(per_param: float) -> float:
        return per_param * (dense / dp + expert_params / d_e)

    w = WEIGHT_BYTES * params
    g = GRAD_BYTES * params
    o = OPTIM_BYTES * params
    if zero >= 1:
        o = sharded(OPTIM_BYTES)
    if zero >= 2:
        g = sharded(GRAD_BYTES)
    if zero >= 3:
        w = sharded(WEIGHT_BYTES) + 2 * WEIGHT_BYTES * largest_layer_params if reshard else WEIGHT_BYTES * params
    return w, g, o


def shared_params(units: Sequence[LayerCost]) -> int:
    """Parameters counted twice when one stage holds both the embedding and the tied head."""
    if units and units[0].name == "embedding" and units[-1].name == "head":
        return units[-1].tied_params
    return 0


def stage_memory(
    units: Sequence[LayerCost],
    *,
    recompute: Recompute,
    schedule: str,
    stage: int,
    pp: int,
    m: int,
    v: int,
    zero: int,
    dp: int,
    allowance: bool = True,
) -> Memory:
    """Peak memory of a GPU holding ``units`` (one whole stage; interleaved chunks counted together)."""
    params = float(sum(u.params for u in units) - shared_params(units))
    largest = float(max((u.params for u in units), default=0))
    w, g, o = static_bytes(params, zero=zero, dp=dp, largest_layer_params=largest)
    rc = int(recompute)
    per_mb = sum(u.act_bytes[rc] for u in units)
    act = per_mb * in_flight(schedule, stage=stage, pp=pp, m=m, v=v)
    if recompute == Recompute.FULL:
        transient = max((u.transient_bytes for u in units if u.name != "head"), default=0.0)
    elif recompute == Recompute.SELECTIVE:
        transient = max((u.act_bytes[0] - u.act_bytes[1] for u in units), default=0.0)
    else:
        transient = 0.0
    transient += sum(u.transient_bytes for u in units if u.name == "head")
    extra = FRAG * act + WORKSPACE_GIB * GIB if allowance else 0.0
    return Memory(w, g, o, act, transient, extra)
