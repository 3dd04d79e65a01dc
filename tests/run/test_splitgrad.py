"""Split backward (B then W, per layer) gives the gradients of a plain ``loss.backward()``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from trainsim.models.splitgrad import LayerTape  # noqa: E402


def _layers(kind: str) -> tuple[nn.Module, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    if kind == "linear":
        return nn.Sequential(nn.Linear(16, 32), nn.ReLU()), torch.randn(4, 16, generator=g)
    if kind == "conv":
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()), torch.randn(2, 3, 8, 8, generator=g)
    if kind == "batchnorm":
        return nn.BatchNorm2d(3), torch.randn(4, 3, 5, 5, generator=g)
    if kind == "layernorm":
        return nn.LayerNorm(16), torch.randn(4, 16, generator=g)
    if kind == "attention":
        layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, norm_first=True)
        return layer, torch.randn(2, 5, 16, generator=g)
    if kind == "pool":
        return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()), torch.randn(2, 3, 4, 4, generator=g)
    if kind == "embedding":
        return nn.Embedding(50, 16), torch.randint(0, 50, (4, 7), generator=g)
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["linear", "conv", "batchnorm", "layernorm", "attention", "embedding", "pool"]
)
@pytest.mark.parametrize("first", [False, True])
def test_split_equals_plain(kind: str, first: bool) -> None:
    if kind == "pool" and first:
        pytest.skip("no parameters and no input gradient: nothing to compute")
    torch.manual_seed(0)
    layer, x = _layers(kind)
    needs_input_grad = x.is_floating_point() and not first
    # plain: one autograd pass
    xr = x.clone().requires_grad_(needs_input_grad)
    out = layer(xr)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(grad_out)
    want_w = [p.grad.clone() for p in layer.parameters()]
    want_x = xr.grad
    layer.zero_grad(set_to_none=True)
    # split: B, then (later) W
    tape = LayerTape.forward(layer, x, input_grad=not first)
    got_x = tape.backward_input(grad_out)
    assert all(p.grad is None for p in layer.parameters()), "B must not touch weight gradients"
    tape.backward_weight()
    for p, w in zip(layer.parameters(), want_w, strict=True):
        torch.testing.assert_close(p.grad, w, rtol=1e-5, atol=1e-6)
    if needs_input_grad:
        torch.testing.assert_close(got_x, want_x, rtol=1e-5, atol=1e-6)
    else:
        assert got_x is None


def test_order_is_checked() -> None:
    tape = LayerTape.forward(nn.Linear(2, 2), torch.randn(1, 2))
    with pytest.raises(AssertionError):
        tape.backward_weight()


@pytest.mark.parametrize(
    "kind", ["linear", "conv", "batchnorm", "layernorm", "attention", "embedding", "pool"]
)
def test_fused_equals_plain(kind: str) -> None:
    torch.manual_seed(0)
    layer, x = _layers(kind)
    xr = x.clone().requires_grad_(x.is_floating_point())
    out = layer(xr)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    out.backward(grad_out)
    want_w = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad(set_to_none=True)
    tape = LayerTape.forward(layer, x)
    got_x = tape.backward(grad_out)
    for p, w in zip(layer.parameters(), want_w, strict=True):
        torch.testing.assert_close(p.grad, w, rtol=1e-5, atol=1e-6)
    if x.is_floating_point():
        torch.testing.assert_close(got_x, xr.grad, rtol=1e-5, atol=1e-6)
    else:
        assert got_x is None
