"""Parallel random initialisation on toy models: the selection rule, the step accounting, bad input."""

from __future__ import annotations

import doctest
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

import trainsim.run.parinit as parinit_module
from trainsim.run.parinit import (
    ParInitConfig,
    Probe,
    StepBudget,
    parallel_init,
    perturb_parameters,
    perturbed_copy,
    plan_steps,
    rank,
)


# --------------------------------------------------------------------------- the rule
def test_rank_lowest_loss_wins_outside_the_tolerance() -> None:
    probes = [Probe(2.0, 0.1), Probe(1.0, 5.0), Probe(1.5, 0.0)]
    assert rank(probes, loss_tol=0.02) == [1, 2, 0]


def test_rank_gradient_norm_breaks_near_ties() -> None:
    # 1.01 is within 2 % of 1.0: the smaller gradient norm (index 0) wins; 1.1 is not.
    probes = [Probe(1.01, 0.5), Probe(1.0, 3.0), Probe(0.0 + 1.1, 0.1)]
    assert rank(probes, loss_tol=0.02)[0] == 0
    assert rank(probes, loss_tol=0.0)[0] == 1  # no tolerance: loss alone
    assert rank(probes, loss_tol=0.2)[0] == 2  # everything near: gradient norm alone


def test_rank_ties_go_to_the_earlier_and_non_finite_rank_last() -> None:
    probes = [Probe(math.nan, 0.0), Probe(1.0, 1.0), Probe(1.0, 1.0), Probe(0.5, math.inf)]
    assert rank(probes, loss_tol=0.0) == [1, 2, 0, 3]


# --------------------------------------------------------------------------- a toy problem
@dataclass
class Toy:
    """A 'model' that is one number x, loss x**2, trained by x <- 0.5 x; records every call."""

    name: str
    x: float
    log: list[str] = field(default_factory=list)


@dataclass
class Calls:
    train: int = 0
    probe: int = 0
    made: list[int] = field(default_factory=list)


def toy_run(cfg: ParInitConfig, starts: list[float], grad: dict[str, float] | None = None):  # type: ignore[no-untyped-def]
    calls = Calls()

    def make(i: int) -> Toy:
        calls.made.append(i)
        return Toy(f"r{i}", starts[i])

    def step(m: Toy) -> None:
        calls.train += 1
        m.x *= 0.5

    def probe(m: Toy) -> Probe:
        calls.probe += 1
        g = (grad or {}).get(m.name, abs(2 * m.x))
        return Probe(loss=m.x**2, grad_norm=g)

    def perturb(m: Toy, j: int) -> Toy:
        return Toy(f"{m.name}.p{j}", m.x + (0.001 if j % 2 else -0.001))

    return parallel_init(make, step, probe, perturb, cfg), calls


def test_picks_the_best_first_round_candidate() -> None:
    cfg = ParInitConfig(k=4, budget_steps=3, total_steps=40)
    out, calls = toy_run(cfg, [3.0, -0.5, 2.0, 1.0])
    assert out.winner == "r1"
    assert calls.made == [0, 1, 2, 3]
    assert out.model.x == pytest.approx(-0.5 * 0.5 ** out.winner_train_steps)
    assert [c.name for c in out.candidates] == ["r0", "r1", "r2", "r3"]


def test_gradient_norm_decides_between_near_equal_losses() -> None:
    cfg = ParInitConfig(k=3, budget_steps=1, total_steps=10, loss_tol=0.05)
    # r0 and r2 end with the same loss; r2 reports a smaller gradient norm
    out, _ = toy_run(cfg, [1.0, 5.0, -1.0], grad={"r0": 2.0, "r2": 1.0})
    assert out.winner == "r2"


def test_refine_round_keeps_parents_and_their_copies() -> None:
    cfg = ParInitConfig(k=4, budget_steps=2, keep=2, refine=3, refine_steps=2, total_steps=60)
    out, _ = toy_run(cfg, [4.0, 1.0, 2.0, 8.0])
    round2 = [c.name for c in out.candidates if c.round == 2]
    # kept r1, r2 (rank order), copies round-robin over them
    assert round2 == ["r1", "r2", "r1.p0", "r2.p1", "r1.p2"]
    assert out.winner == "r1.p0"  # 1.0 - 0.001: the smallest |x|
    assert all(c.steps_trained == 4 for c in out.candidates if c.round == 2)


def test_step_accounting_adds_up() -> None:
    cfg = ParInitConfig(k=5, budget_steps=3, keep=2, refine=2, refine_steps=4, probe_cost_steps=2, total_steps=100)
    b = plan_steps(cfg)
    assert b == StepBudget(explore_train=15, explore_probe=10, refine_train=16, refine_probe=8, final_train=51)
    assert b.total == cfg.total_steps
    out, calls = toy_run(cfg, [1.0, 2.0, 3.0, 4.0, 5.0])
    assert out.steps == b
    assert calls.train == b.explore_train + b.refine_train + b.final_train
    assert calls.probe * cfg.probe_cost_steps == b.explore_probe + b.refine_probe
    assert out.winner_train_steps == cfg.budget_steps + cfg.refine_steps + b.final_train


def test_one_candidate_probes_nothing_and_matches_the_baseline() -> None:
    cfg = ParInitConfig(k=1, budget_steps=5, total_steps=20)
    out, calls = toy_run(cfg, [1.0])
    assert calls.probe == 0 and calls.train == 20 and out.winner_train_steps == 20
    assert out.candidates[0].probe is None


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"k": 0}, "k=0"),
        ({"budget_steps": 0}, "budget_steps=0"),
        ({"refine": -1}, "refine=-1"),
        ({"keep": 5}, "keep=5 > k=4"),
        ({"refine": 2, "refine_steps": 0}, "refine_steps >= 1"),
        ({"loss_tol": -0.1}, "loss_tol"),
        ({"budget_steps": 30}, "total_steps=100"),  # 4 * (30 + 1) = 124 > 100
        ({"refine": 3, "refine_steps": 50}, "explore + refine <= total_steps"),
    ],
)
def test_bad_config_names_the_constraint(kwargs: dict[str, float], names: str) -> None:
    base: dict[str, float] = {"k": 4, "budget_steps": 2, "total_steps": 100}
    with pytest.raises(ValueError, match=names.replace("+", r"\+").replace("*", r"\*")):
        ParInitConfig(**{**base, **kwargs})  # type: ignore[arg-type]


def test_budget_exactly_spent_is_allowed() -> None:
    cfg = ParInitConfig(k=4, budget_steps=24, total_steps=100)  # 4 * (24 + 1) = 100
    assert plan_steps(cfg).final_train == 0


# --------------------------------------------------------------------------- torch helper, docstring
def test_perturb_parameters_scales_with_each_tensor() -> None:
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(64, 64)
    with torch.no_grad():
        lin.weight.fill_(2.0)
        lin.bias.zero_()
    before = lin.weight.detach().clone()
    perturb_parameters(lin, seed=0, rel_std=0.1)
    delta = lin.weight.detach() - before
    assert delta.std().item() == pytest.approx(0.2, rel=0.1)  # 0.1 x RMS 2.0
    assert torch.count_nonzero(lin.bias).item() == 0
    with pytest.raises(ValueError, match="rel_std"):
        perturb_parameters(lin, seed=0, rel_std=-1.0)


def test_perturbed_copy_is_independent_and_keeps_optimizer_state() -> None:
    # A stand-in with an optimizer's shape (parameter lists, state keyed by parameter): constructing a
    # real torch.optim optimizer costs seconds of imports; the benchmark uses SGD and Adam for real.
    torch = pytest.importorskip("torch")
    lin = torch.nn.Linear(4, 2)
    opt = SimpleNamespace(param_groups=[{"params": list(lin.parameters())}],
                          state={lin.weight: {"momentum_buffer": torch.full((2, 4), 3.0)}})  # fmt: skip
    before = [p.detach().clone() for p in lin.parameters()]
    m2, opt2 = perturbed_copy(lin, opt, seed=1, rel_std=0.1)  # type: ignore[arg-type]
    assert all(torch.equal(a, p) for a, p in zip(before, lin.parameters(), strict=True))
    copied = list(m2.parameters())
    assert [id(p) for p in opt2.param_groups[0]["params"]] == [id(p) for p in copied]
    assert not torch.equal(copied[0], lin.weight)
    assert torch.equal(opt2.state[copied[0]]["momentum_buffer"], torch.full((2, 4), 3.0))


def test_module_docstring_example_runs() -> None:
    assert doctest.testmod(parinit_module, raise_on_error=True).attempted > 0
