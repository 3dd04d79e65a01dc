"""Reordered training (reverse first-k, deferred updates) gives the losses of plain training.

One process, no communication: what remains is the reordered computation itself - the output-gradient
chain first, weight gradients input-first, each layer's update deferred to just before its next
forward. This is also the CPU correctness test of the single-device multi-stream order (W after the
B chain, update before the next forward).

Tolerance: the split backward runs the same kernels as ``loss.backward()`` (torch's
``stage_backward_input`` / ``stage_backward_weight`` reuse the captured intermediate gradients), and a
per-layer SGD applies the same element-wise update as one SGD over all parameters, so the results are
expected to agree to float32 rounding; the only freedom is the order in which autograd accumulates a
parameter used on several paths. We allow rtol 1e-5 on every loss over 100 steps (a few ulps of a
loss near 2.3, compounded over 100 updates) and in practice see exact equality.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from trainsim.models.zoo import ZooSpec, build_with_batches  # noqa: E402
from trainsim.run.ooo_dp import OooDataParallel  # noqa: E402


def _train(model_name: str, k: int | None, steps: int) -> list[float]:
    model, batches = build_with_batches(model_name, seed=0, spec=ZooSpec(batch_size=8, blocks=1, width=64))
    loss_fn = nn.CrossEntropyLoss()
    losses = []
    if k is None:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for s in range(steps):
            x, y = batches(s)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        return losses
    ooo = OooDataParallel(model, k, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9))
    for s in range(steps):
        x, y = batches(s)
        losses.append(ooo.step(x, y, loss_fn))
    return losses


def _check(model_name: str, steps: int) -> None:
    plain = _train(model_name, None, steps)
    for k in (2, 4):
        got = _train(model_name, k, steps)
        torch.testing.assert_close(torch.tensor(got), torch.tensor(plain), rtol=1e-5, atol=0)


def test_reordered_mlp_equals_plain_short() -> None:
    _check("mlp", 20)


def test_reordered_transformer_equals_plain_short() -> None:
    _check("transformer", 5)


@pytest.mark.slow
@pytest.mark.parametrize("model_name", ["mlp", "transformer", "cnn"])
def test_reordered_equals_plain_over_100_steps(model_name: str) -> None:
    _check(model_name, 100)
