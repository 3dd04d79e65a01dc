"""Parallel random initialisation: try K initialisations briefly, refine around the best, train one.

    >>> from trainsim.run.parinit import ParInitConfig, Probe, parallel_init
    >>> cfg = ParInitConfig(k=4, budget_steps=2, keep=1, refine=1, refine_steps=2, total_steps=20)
    >>> out = parallel_init(lambda i: [float(i + 1)], lambda m: m.__setitem__(0, 0.9 * m[0]),
    ...                     lambda m: Probe(loss=m[0] ** 2, grad_norm=2 * m[0]),
    ...                     lambda m, j: [m[0] * 1.01], cfg)
    >>> out.winner, out.steps.total == cfg.total_steps
    ('r0', True)

The K workers run one after another in this process (no extra processes or devices): the method is
judged by the compute it spends, counted in *steps*, not by wall time. One step is one forward and
backward pass on one batch (a training step also updates the weights). With K real devices the first
round would take ``budget_steps`` of wall time instead of ``k * budget_steps``, and all but one device
would sit idle afterwards.

Algorithm of ``parallel_init``:
  1. Explore: ``make_model(i)`` for ``i`` in ``0..k-1``; train each for ``budget_steps`` steps.
  2. Probe each (``eval_fn``: loss and gradient norm on a batch the caller keeps fixed) and rank them by
     ``rank``'s rule; keep the best ``keep``.
  3. Refine: the kept models continue, and ``refine`` perturbed copies of them (``perturb(parent, j)``,
     parents taken round-robin in rank order) join them; each trains ``refine_steps`` steps, then all
     are probed and ranked again. Skipped when only one model would take part (``keep + refine == 1``).
  4. Train the winner for the steps left of ``total_steps`` (``StepBudget.final_train``).

Selection rule (``rank``): among the probes whose loss is within ``loss_tol`` (relative) of the lowest
loss, the one with the smallest gradient norm wins; ties go to the earlier candidate. Repeating on the
rest gives the full order. Loss and gradient norm are in different units, so they are never summed:
the gradient norm only breaks near-ties in loss (a smaller one means the model sits nearer a flat
region rather than on a slope that happened to be low on this batch). Non-finite probes rank last.

Compute accounting (``plan_steps``), in steps: explore ``k * budget_steps`` plus ``k * probe_cost_steps``
when ``k > 1``; refine ``(keep + refine) * refine_steps`` plus ``(keep + refine) * probe_cost_steps``;
the rest, ``total_steps`` minus those, trains the winner. A one-initialisation baseline with the same
compute trains for ``total_steps`` steps. Probes are counted as full steps: they run a backward pass.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    import torch
    from torch import nn

M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class Probe:
    """What ``eval_fn`` measures on one candidate: loss and gradient norm on the caller's probe batch."""

    loss: float
    grad_norm: float


@dataclass(frozen=True, kw_only=True, slots=True)
class ParInitConfig:
    """Sizes of the two selection rounds and the total compute, in steps (one forward+backward batch)."""

    k: int
    """random initialisations tried in the first round"""
    budget_steps: int
    """training steps each initialisation gets in the first round"""
    total_steps: int
    """compute of the whole method, in steps; the winner trains for whatever the rounds leave"""
    keep: int = 1
    """best first-round models that go on to the refine round"""
    refine: int = 0
    """perturbed copies of the kept models added in the refine round"""
    refine_steps: int = 0
    """training steps each model gets in the refine round (>= 1 when that round runs)"""
    probe_cost_steps: int = 1
    """cost of one ``eval_fn`` call in steps (a probe batch of 4 training batches costs 4)"""
    loss_tol: float = 0.02
    """relative loss margin inside which the smaller gradient norm decides"""

    def __post_init__(self) -> None:
        for f in ("k", "budget_steps", "total_steps", "keep", "probe_cost_steps"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"parallel_init: {f}={v!r}; expected an integer >= 1")
        for f in ("refine", "refine_steps"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"parallel_init: {f}={v!r}; expected an integer >= 0")
        if self.keep > self.k:
            raise ValueError(f"parallel_init: keep={self.keep} > k={self.k}; cannot keep more models than were tried")
        if self.keep + self.refine > 1 and self.refine_steps < 1:
            raise ValueError(
                f"parallel_init: refine_steps={self.refine_steps} with keep + refine = {self.keep + self.refine}"
                " models in the refine round; expected refine_steps >= 1 (or keep=1, refine=0 to skip it)"
            )
        if not (math.isfinite(self.loss_tol) and self.loss_tol >= 0):
            raise ValueError(f"parallel_init: loss_tol={self.loss_tol!r}; expected a finite number >= 0")
        b = plan_steps(self, check=False)
        if b.final_train < 0:
            raise ValueError(
                f"parallel_init: the rounds cost {b.explore + b.refine} steps > total_steps={self.total_steps}"
                f" (explore {b.explore} = k*(budget_steps + probe) = {self.k}*({self.budget_steps} +"
                f" {self.probe_cost_steps if self.k > 1 else 0}), refine {b.refine}); expected"
                " explore + refine <= total_steps"
            )


@dataclass(frozen=True, slots=True)
class StepBudget:
    """Where the steps go; ``total`` equals the config's ``total_steps``."""

    explore_train: int
    explore_probe: int
    refine_train: int
    refine_probe: int
    final_train: int

    @property
    def explore(self) -> int:
        return self.explore_train + self.explore_probe

    @property
    def refine(self) -> int:
        return self.refine_train + self.refine_probe

    @property
    def total(self) -> int:
        return self.explore + self.refine + self.final_train


def plan_steps(cfg: ParInitConfig, *, check: bool = True) -> StepBudget:
    """The step budget of ``cfg`` (see the module's accounting); ``final_train`` < 0 only if ``check=False``."""
    n2 = cfg.keep + cfg.refine if cfg.keep + cfg.refine > 1 else 0
    b = StepBudget(
        explore_train=cfg.k * cfg.budget_steps,
        explore_probe=cfg.k * cfg.probe_cost_steps if cfg.k > 1 else 0,
        refine_train=n2 * cfg.refine_steps,
        refine_probe=n2 * cfg.probe_cost_steps,
        final_train=0,
    )
    final = cfg.total_steps - b.explore - b.refine
    assert final >= 0 or not check, "ParInitConfig.__post_init__ checks the budget"
    return StepBudget(b.explore_train, b.explore_probe, b.refine_train, b.refine_probe, final)


def rank(probes: Sequence[Probe], loss_tol: float) -> list[int]:
    """Indices of ``probes``, best first, by the module's selection rule."""
    left = [i for i, p in enumerate(probes) if math.isfinite(p.loss) and math.isfinite(p.grad_norm)]
    bad = [i for i in range(len(probes)) if i not in left]
    order: list[int] = []
    while left:
        best = min(probes[i].loss for i in left)
        near = [i for i in left if probes[i].loss <= best + loss_tol * abs(best)]
        pick = min(near, key=lambda i: (probes[i].grad_norm, i))
        order.append(pick)
        left.remove(pick)
    return order + bad


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """One model that took part in a round (a row of ``ParInitResult.candidates``)."""

    name: str
    """``r<i>`` for the i-th initialisation; ``<parent>.p<j>`` for the j-th perturbed copy"""
    round: int
    """1 (explore) or 2 (refine)"""
    probe: Probe | None
    """its probe at the end of the round; None when the round had one model and probed nothing"""
    steps_trained: int
    """training steps on this model (and its ancestors) by the end of the round"""


@dataclass(frozen=True, kw_only=True, slots=True)
class ParInitResult(Generic[M]):
    """The trained winner, its name, every candidate's probe, and the steps spent."""

    model: M
    winner: str
    candidates: list[Candidate]
    steps: StepBudget
    winner_train_steps: int
    """training steps behind the returned model (explore + refine + final, without probes)"""


def parallel_init(
    make_model: Callable[[int], M],
    train_step: Callable[[M], object],
    eval_fn: Callable[[M], Probe],
    perturb: Callable[[M, int], M],
    cfg: ParInitConfig,
) -> ParInitResult[M]:
    """Run the module's algorithm; see its docstring.

    ``make_model(i)``: a fresh, independently initialised model (with its optimizer and data stream);
    ``train_step(m)``: one training step in place; ``eval_fn(m)``: its ``Probe`` (must not change ``m``);
    ``perturb(m, j)``: a new, independent copy of ``m`` with perturbed weights (``m`` unchanged).
    """
    budget = plan_steps(cfg)
    candidates: list[Candidate] = []

    def train(m: M, n: int) -> None:
        for _ in range(n):
            train_step(m)

    def select(names: list[str], models: list[M], rnd: int, trained: int) -> list[int]:
        if len(models) == 1:
            candidates.append(Candidate(name=names[0], round=rnd, probe=None, steps_trained=trained))
            return [0]
        probes = [eval_fn(m) for m in models]
        for n, p in zip(names, probes, strict=True):
            candidates.append(Candidate(name=n, round=rnd, probe=p, steps_trained=trained))
        return rank(probes, cfg.loss_tol)

    names = [f"r{i}" for i in range(cfg.k)]
    models = [make_model(i) for i in range(cfg.k)]
    for m in models:
        train(m, cfg.budget_steps)
    trained = cfg.budget_steps
    order = select(names, models, 1, trained)[: cfg.keep]
    names, models = [names[i] for i in order], [models[i] for i in order]

    if cfg.keep + cfg.refine > 1:
        n_kept = len(models)
        for j in range(cfg.refine):
            parent = j % n_kept
            names.append(f"{names[parent]}.p{j}")
            models.append(perturb(models[parent], j))
        for m in models:
            train(m, cfg.refine_steps)
        trained += cfg.refine_steps
        best = select(names, models, 2, trained)[0]
        names, models = [names[best]], [models[best]]

    train(models[0], budget.final_train)
    return ParInitResult(
        model=models[0],
        winner=names[0],
        candidates=candidates,
        steps=budget,
        winner_train_steps=trained + budget.final_train,
    )


def perturb_parameters(model: nn.Module, *, seed: int, rel_std: float) -> None:
    """Add Gaussian noise in place, per tensor ``rel_std`` times that tensor's RMS (a zero tensor stays zero)."""
    import torch

    if not (math.isfinite(rel_std) and rel_std >= 0):
        raise ValueError(f"perturb_parameters: rel_std={rel_std!r}; expected a finite number >= 0")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            rms = p.detach().float().pow(2).mean().sqrt()
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            p.add_((noise * rms * rel_std).to(p.dtype))


def perturbed_copy(
    model: nn.Module, optimizer: torch.optim.Optimizer, *, seed: int, rel_std: float
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """An independent copy of ``model`` and its ``optimizer`` (state included), the copy's weights perturbed
    by ``perturb_parameters``. One ``deepcopy`` of both keeps the copied optimizer on the copied parameters."""
    m, opt = copy.deepcopy((model, optimizer))
    perturb_parameters(m, seed=seed, rel_std=rel_std)
    return m, opt
