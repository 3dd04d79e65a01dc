"""Byzantine-robust gradient aggregation as DDP communication hooks, and a harness that injects bad gradients.

    >>> from trainsim.run.robust import Fault, FaultState, RobustState, fault_hook, robust_hook  # doctest: +SKIP
    >>> state = RobustState("median")                                  # doctest: +SKIP
    >>> ddp.register_comm_hook(state, robust_hook)                      # doctest: +SKIP
    >>> bad = FaultState(robust_hook, state, Fault(kind="sign_flip", ranks=(3,), factor=10.0))  # doctest: +SKIP
    >>> ddp.register_comm_hook(bad, fault_hook)      # rank 3 now sends -10 x its gradient  # doctest: +SKIP

``hook(state, bucket) -> Future[Tensor]`` exactly as PyTorch's (``DistributedDataParallel.
register_comm_hook``). Plain DDP all-reduces the mean, which one rank can move anywhere; these hooks
gather every rank's gradient instead and combine them with a rule that a minority cannot steer.

Algorithm of ``robust_hook``, per bucket:
  1. All-gather every rank's local gradient of the bucket (fp32) into a ``world x numel`` matrix,
     one row per rank (``casync.all_gather_bytes``: on gloo every receive is posted before any send,
     the primitive that ``trainsim.testbed.calibrate`` times as the all-gather).
  2. When it arrives, combine the rows with the state's aggregator (``AGGREGATORS``):
     - ``mean``: the plain average (the gather's cost without any robustness; the baseline's result);
     - ``median``: coordinate-wise median, the mean of the two middle values for an even world
       (Yin et al., "Byzantine-Robust Distributed Learning: Towards Optimal Statistical Rates", ICML 2018);
     - ``trimmed_mean``: per coordinate, drop the ``floor(trim * world)`` largest and smallest values
       and average the rest (same paper);
     - ``krum``: the one row whose squared distances to its ``world - f - 2`` nearest other rows sum
       least (Blanchard et al., "Machine Learning with Adversaries: Byzantine Tolerant Gradient
       Descent", NeurIPS 2017; it needs ``world >= 2f + 3``);
     - ``zeno``: score each row u by ``L(w) - L(w - lr u) - rho |u|^2`` on a small validation batch
       (the loss it removes, less a size penalty), drop the ``drop`` lowest and average the rest (Xie,
       Koyejo & Gupta, "Zeno: Distributed Stochastic Gradient Descent with Suspicion-based
       Fault-tolerance", ICML 2019). Only the bucket's parameters move in ``w - lr u``: with one bucket
       (a small model) that is the paper's score, with several each bucket is judged on its own.
  3. Write the result into the bucket's buffer and complete the future with it.

Every rank gathers the same matrix and runs the same deterministic rule, so every rank gets the same
result (Zeno's validation batch must be the same on every rank). Collectives are issued only from the
hook (the autograd thread, in bucket order), never from a future's callback. ``RobustState.dropped``
counts, per rank, how often its row was left out (Krum: not chosen; Zeno, trimmed mean, median: not
counted, the rule mixes coordinates of every row for the last two).

The fault harness: ``FaultState`` wraps any hook and its state (this module's, or PyTorch's
``default_hooks.allreduce_hook`` for the plain mean) and, on the ranks its ``Fault`` names, replaces
the local gradient in the bucket before the wrapped hook sends it: ``scale`` (x factor),
``sign_flip`` (x -factor) or ``random`` (Gaussian noise ``factor`` times the gradient's RMS).
"""

# no "from __future__ import annotations": DDP checks the hook annotations as real objects

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "zeno")
FAULT_KINDS = ("scale", "sign_flip", "random")


# --------------------------------------------------------------------------- the rules, on rows
def _check_rows(rows: Tensor, what: str) -> int:
    if rows.dim() != 2 or rows.shape[0] < 1:
        raise ValueError(f"{what}: expected a (ranks x numel) matrix with >= 1 row, got shape {tuple(rows.shape)}")
    return int(rows.shape[0])


def check_trim(trim: float, world: int) -> int:
    """Values dropped at each end by ``trimmed_mean`` (``floor(trim * world)``); a ``ValueError`` naming the
    constraint ``0 <= trim`` and ``2 floor(trim * world) < world`` when nothing would be left."""
    if not (isinstance(trim, int | float) and 0.0 <= trim < math.inf):
        raise ValueError(f"trimmed mean: trim={trim!r}; expected a fraction >= 0")
    k = math.floor(trim * world + 1e-9)  # 1e-9: 0.25 * 4 is exactly 1, not 0.999...
    if 2 * k >= world:
        raise ValueError(
            f"trimmed mean: trim={trim} drops floor(trim * world) = {k} values at each end of {world} ranks, "
            f"leaving {world - 2 * k}; the constraint is 2 floor(trim * world) < world (trim < 0.5 at least)"
        )
    return k


def check_krum(f: int, world: int) -> None:
    """A ``ValueError`` naming Krum's constraint ``world >= 2f + 3`` (and ``f >= 0``) when it fails."""
    if not isinstance(f, int) or f < 0:
        raise ValueError(f"krum: f={f!r}; expected a whole number of Byzantine ranks >= 0")
    if world < 2 * f + 3:
        raise ValueError(
            f"krum: f={f} Byzantine ranks need world >= 2f + 3 = {2 * f + 3} ranks (Blanchard et al. 2017), "
            f"got world={world}; the largest f for {world} ranks is {max(-1, (world - 3) // 2)}"
        )


def check_drop(drop: int, world: int) -> None:
    """A ``ValueError`` naming Zeno's constraint ``0 <= drop < world`` when it fails."""
    if not isinstance(drop, int) or not 0 <= drop < world:
        raise ValueError(f"zeno: drop={drop!r} of {world} ranks; the constraint is 0 <= drop < world (one row must be left)")


SORT_NETWORK_MAX = 16
"""up to this many rows, ``sorted_rows`` sorts each column with an odd-even transposition network of
``torch.minimum``/``torch.maximum`` over whole rows: 4 x 85,002 fp32 took ~0.5 ms that way against
4-5 ms for ``torch.sort(dim=0)`` on this 2-vCPU host (one thread), whose short strided columns sort slowly"""


def sorted_rows(rows: Tensor) -> Tensor:
    """Each column of ``rows`` sorted ascending (a new tensor), NaN counted as +inf: a NaN from one bad
    rank then lands at an end like any huge value, instead of poisoning the middle of the order.

    Algorithm (n <= ``SORT_NETWORK_MAX``): odd-even transposition sort, n phases; phase p compares the
    row pairs (i, i+1) with i = p mod 2, p mod 2 + 2, ... and puts each pair's minimum first. After n
    phases every column is sorted (Knuth, TAOCP vol. 3, 5.3.4, exercise 37)."""
    n = _check_rows(rows, "sort")
    s = torch.nan_to_num(rows.float(), nan=math.inf, posinf=math.inf, neginf=-math.inf)
    if n > SORT_NETWORK_MAX:
        return s.sort(dim=0).values
    for p in range(n):
        a, b = s[p % 2 : n - 1 : 2], s[p % 2 + 1 : n : 2]
        if a.shape[0]:
            lo = torch.minimum(a, b)
            b.copy_(torch.maximum(a, b))
            a.copy_(lo)
    return s


def coordinate_median(rows: Tensor) -> Tensor:
    """Per column, the median of the rows: the middle value, or the mean of the two middle values for an
    even number of rows (``torch.median`` would return the lower one)."""
    n = _check_rows(rows, "median")
    s = sorted_rows(rows)
    if n % 2:
        return s[n // 2].clone()
    return (s[n // 2 - 1] + s[n // 2]) * 0.5


def trimmed_mean(rows: Tensor, trim: float) -> Tensor:
    """Per column, the mean after dropping the ``floor(trim * n)`` largest and smallest values."""
    n = _check_rows(rows, "trimmed mean")
    k = check_trim(trim, n)
    if k == 0:
        return rows.mean(dim=0)
    return sorted_rows(rows)[k : n - k].mean(dim=0)


def krum_scores(rows: Tensor, f: int) -> Tensor:
    """Krum's score of each row: the sum of its squared distances to its ``n - f - 2`` nearest other rows."""
    n = _check_rows(rows, "krum")
    check_krum(f, n)
    sq = rows.pow(2).sum(dim=1)
    d2 = (sq[:, None] + sq[None, :] - 2.0 * rows @ rows.T).clamp_min_(0.0)  # |a-b|^2 = |a|^2 + |b|^2 - 2ab
    d2 = torch.nan_to_num(d2, nan=math.inf)  # a row with NaN/Inf is infinitely far from every other
    d2.fill_diagonal_(math.inf)  # a row is not its own neighbour
    return d2.topk(n - f - 2, dim=1, largest=False).values.sum(dim=1)


def krum(rows: Tensor, f: int) -> tuple[Tensor, int]:
    """The row Krum chooses (a copy) and its index: the least score (``krum_scores``), the lowest index on a tie."""
    i = int(torch.argmin(krum_scores(rows, f)))
    return rows[i].clone(), i


def zeno_keep(scores: Tensor, drop: int) -> list[int]:
    """Indices (ascending) of the ``n - drop`` highest Zeno scores; a tie drops the higher index."""
    n = int(scores.numel())
    check_drop(drop, n)
    value = [float(v) if math.isfinite(float(v)) else -math.inf for v in scores]  # NaN: most suspect
    order = sorted(range(n), key=lambda i: (-value[i], i))
    return sorted(order[: n - drop])


# --------------------------------------------------------------------------- the hook's state
class RobustState:
    """State of ``robust_hook``: the rule, its parameters, Zeno's validation batch, and what was dropped.

    ``trim``: fraction dropped at each end by ``trimmed_mean``; ``f``: Byzantine ranks Krum tolerates;
    ``drop``: rows Zeno leaves out; ``lr`` and ``rho``: Zeno's step and size penalty (the paper's
    gamma and rho; lr should be the optimiser's); ``model``, ``validation`` ((inputs, targets), the same
    on every rank) and ``loss_fn``: what Zeno scores with. Impossible settings raise ``ValueError``
    naming the constraint.
    """

    __slots__ = (
        "aggregator",
        "compute_s",
        "drop",
        "dropped",
        "f",
        "loss_fn",
        "lr",
        "model",
        "names",
        "process_group",
        "rank",
        "rho",
        "trim",
        "validation",
        "world_size",
    )

    def __init__(
        self,
        aggregator: str,
        process_group: Any = None,
        *,
        trim: float = 0.25,
        f: int = 0,
        drop: int = 1,
        lr: float = 0.1,
        rho: float = 5e-4,
        model: nn.Module | None = None,
        validation: tuple[Tensor, Tensor] | None = None,
        loss_fn: Callable[[Tensor, Tensor], Tensor] | None = None,
        world_size: int | None = None,
        rank: int | None = None,
    ) -> None:
        # where: the group and this process's place in it (world_size/rank given: no group needed)
        if world_size is None or rank is None:
            if not dist.is_available() or not dist.is_initialized():
                raise ValueError("robust hook: torch.distributed is not initialised; call init_process_group first")
            world_size = dist.get_world_size(process_group)
            rank = dist.get_rank(process_group)
        self.process_group = process_group
        self.world_size = int(world_size)
        self.rank = int(rank)
        # what: the rule and its parameters, checked against the world size
        if aggregator not in AGGREGATORS:
            raise ValueError(f"robust hook: unknown aggregator {aggregator!r}; expected one of {', '.join(AGGREGATORS)}")
        self.aggregator = aggregator
        self.trim = float(trim)
        self.f = f
        self.drop = drop
        if aggregator == "trimmed_mean":
            check_trim(self.trim, self.world_size)
        elif aggregator == "krum":
            check_krum(f, self.world_size)
        elif aggregator == "zeno":
            check_drop(drop, self.world_size)
            if not (lr > 0 and rho >= 0 and math.isfinite(lr) and math.isfinite(rho)):
                raise ValueError(f"zeno: lr={lr!r}, rho={rho!r}; expected lr > 0 and rho >= 0")
            if model is None or validation is None or loss_fn is None:
                raise ValueError("zeno: needs model=, validation=(inputs, targets) and loss_fn= to score gradients")
        # zeno: the model (unwrapped from DDP, names without "module."), its validation batch, the loss
        self.lr, self.rho = float(lr), float(rho)
        if isinstance(model, nn.parallel.DistributedDataParallel):
            model = model.module
        self.model = model
        self.names: dict[int, str] = {id(p): n for n, p in model.named_parameters()} if model is not None else {}
        self.validation = validation
        self.loss_fn = loss_fn
        # what happened: rows left out per rank (Krum, Zeno), seconds spent combining rows
        self.dropped = [0] * self.world_size
        self.compute_s = 0.0


def zeno_scores(state: RobustState, rows: Tensor, params: list[Tensor]) -> Tensor:
    """Zeno's score of each row for the bucket's ``params`` (laid out in the row in that order)."""
    assert state.model is not None and state.validation is not None and state.loss_fn is not None
    x, y = state.validation
    names = []
    for p in params:
        name = state.names.get(id(p))
        if name is None:
            raise ValueError("zeno: a bucket parameter is not in state.model; pass the model wrapped in DDP")
        names.append(name)
    with torch.no_grad():
        base = float(state.loss_fn(state.model(x), y))
        out = torch.empty(rows.shape[0], dtype=torch.float64)
        for i, row in enumerate(rows):
            moved, at = {}, 0
            for name, p in zip(names, params, strict=True):
                g = row[at : at + p.numel()].view_as(p)
                moved[name] = p.detach() - state.lr * g.to(p.dtype)
                at += p.numel()
            loss = float(state.loss_fn(torch.func.functional_call(state.model, moved, (x,)), y))
            out[i] = base - loss - state.rho * float(row.pow(2).sum())
    return out


def aggregate(state: RobustState, rows: Tensor, params: list[Tensor] | None = None) -> Tensor:
    """Combine the gathered ``rows`` (world x numel, rank order) with ``state``'s rule."""
    rule = state.aggregator
    if rule == "mean":
        return rows.mean(dim=0)
    if rule == "median":
        return coordinate_median(rows)
    if rule == "trimmed_mean":
        return trimmed_mean(rows, state.trim)
    if rule == "krum":
        row, chosen = krum(rows, state.f)
        for r in range(rows.shape[0]):
            state.dropped[r] += r != chosen
        return row
    assert rule == "zeno", rule
    keep = zeno_keep(zeno_scores(state, rows, params or []), state.drop)
    for r in set(range(rows.shape[0])) - set(keep):
        state.dropped[r] += 1
    return rows[keep].mean(dim=0)


def robust_hook(state: RobustState, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """All-gather the bucket's gradients and return their robust combination (see the module docstring).

    Example: ``ddp.register_comm_hook(RobustState("trimmed_mean", trim=0.25), robust_hook)``.
    """
    from trainsim.run.casync import all_gather_bytes

    buf = bucket.buffer()
    mine = buf.detach().float().contiguous()  # a copy for fp16/bf16 buffers; fp32 is sent as it is
    gathered = torch.empty(state.world_size * mine.numel(), dtype=torch.float32, device=mine.device)
    params = list(bucket.parameters()) if state.aggregator == "zeno" else None
    work = all_gather_bytes(gathered, mine, state.process_group)

    def combine(fut: torch.futures.Future[Any]) -> Tensor:
        fut.wait()  # raises the gather's error, if any
        t0 = time.perf_counter()
        out = aggregate(state, gathered.view(state.world_size, -1), params)
        buf.copy_(out)
        state.compute_s += time.perf_counter() - t0
        return buf

    return work.get_future().then(combine)


# --------------------------------------------------------------------------- fault injection
@dataclass(frozen=True, kw_only=True, slots=True)
class Fault:
    """Which ranks send bad gradients, and how."""

    kind: str
    """``scale`` (g x factor), ``sign_flip`` (g x -factor) or ``random`` (N(0, (factor rms(g))^2) per element)"""
    ranks: tuple[int, ...]
    """the bad ranks (distinct, >= 0); empty: none"""
    factor: float = 10.0
    """the scale, the flipped scale, or the noise's size relative to the gradient's RMS"""
    seed: int = 0
    """seed of the ``random`` kind's noise (each bad rank adds its rank to it)"""

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault: unknown kind {self.kind!r}; expected one of {', '.join(FAULT_KINDS)}")
        if len(set(self.ranks)) != len(self.ranks) or any(not isinstance(r, int) or r < 0 for r in self.ranks):
            raise ValueError(f"fault: ranks={self.ranks!r}; expected distinct ranks >= 0")
        if not math.isfinite(self.factor):
            raise ValueError(f"fault: factor={self.factor!r}; expected a finite number")

    def text(self) -> str:
        """Compact form: ``sign_flip x10 @ 2,3``."""
        return f"{self.kind} x{self.factor:g} @ {','.join(map(str, self.ranks)) or '-'}"


def corrupt(grad: Tensor, fault: Fault, generator: torch.Generator | None = None) -> Tensor:
    """Replace ``grad`` in place by the bad rank's version of it (see ``Fault.kind``); returns ``grad``."""
    if fault.kind == "scale":
        return grad.mul_(fault.factor)
    if fault.kind == "sign_flip":
        return grad.mul_(-fault.factor)
    rms = float(grad.float().pow(2).mean().sqrt()) if grad.numel() else 0.0
    noise = torch.randn(grad.shape, generator=generator, dtype=torch.float32)  # CPU draws, then to the device
    return grad.copy_(noise.mul_(fault.factor * rms).to(grad.device, grad.dtype))


class FaultState:
    """State of ``fault_hook``: the wrapped hook and its state, the fault, and this rank's noise source."""

    __slots__ = ("bad", "fault", "generator", "hook", "rank", "state")

    def __init__(self, hook: Callable[[Any, Any], Any], state: Any, fault: Fault, *, rank: int | None = None) -> None:
        # the hook that sends (robust_hook, or PyTorch's allreduce_hook with its process group as state)
        self.hook = hook
        self.state = state
        # the fault and whether it is this rank's
        if rank is None:
            if not dist.is_available() or not dist.is_initialized():
                raise ValueError("fault hook: torch.distributed is not initialised; call init_process_group first")
            rank = dist.get_rank()
            world = dist.get_world_size()
            if any(r >= world for r in fault.ranks):
                raise ValueError(f"fault: ranks={fault.ranks} but the world has {world} ranks (0..{world - 1})")
        self.rank = rank
        self.fault = fault
        self.bad = rank in fault.ranks
        self.generator = torch.Generator().manual_seed(fault.seed + rank)


def fault_hook(state: FaultState, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """On a bad rank, corrupt the bucket's gradients in place; then run the wrapped hook.

    Example: ``ddp.register_comm_hook(FaultState(allreduce_hook, None, Fault(kind="scale", ranks=(0,))), fault_hook)``.
    """
    if state.bad:
        corrupt(bucket.buffer(), state.fault, state.generator)
    return state.hook(state.state, bucket)
