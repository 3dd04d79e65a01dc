"""Small built-in models that run on a CPU in milliseconds, for profiling, validation and tests.

    >>> from trainsim.models.zoo import build
    >>> model, batch = build("mlp", seed=0)          # doctest: +SKIP
    >>> loss = model(batch[0]).sum()                 # doctest: +SKIP

Every model is an ``nn.Sequential`` of named layers, so that per-layer profiling, stage splitting
(pipeline parallelism) and per-layer reordering (out-of-order backprop) see the same layer list.
``build`` returns ``(model, (inputs, targets))``; the loss is cross-entropy on ``targets``.

| name | what | parameters | balance |
|---|---|---|---|
| ``mlp`` | wide MLP, 4 linear layers of width 1024 | ~2.4 M | communication-heavy |
| ``cnn`` | small CNN on 3x32x32 images | ~0.13 M | compute-heavy |
| ``transformer`` | 2-layer pre-norm encoder, d=128, 4 heads, on token ids | ~0.5 M | mixed |
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainsim.errors import UserError

if TYPE_CHECKING:
    import torch
    from torch import nn


@dataclass(frozen=True, kw_only=True, slots=True)
class ZooSpec:
    """Hyper-parameters of a zoo model; every field has a CPU-friendly default."""

    batch_size: int = 32
    """samples per step (per process)"""
    width: int = 1024
    """hidden width of the MLP"""
    depth: int = 4
    """linear layers of the MLP"""
    blocks: int = 2
    """encoder blocks of the transformer"""
    seq_len: int = 32
    """tokens per sample for the transformer"""
    classes: int = 10
    """output classes"""
    hollow: bool = False
    """transformer only: each encoder block replaced by a bias add (same activations and layer count,
    almost no compute): for timing a runtime's own costs (``trainsim.validate.pipeline``)"""

    def __post_init__(self) -> None:
        for f in ("batch_size", "width", "depth", "blocks", "seq_len", "classes"):
            v = getattr(self, f)
            if not isinstance(v, int) or v < 1:
                raise UserError(f"zoo model: {f}={v!r}; expected a positive integer")


def _mlp(spec: ZooSpec) -> tuple[nn.Module, Callable[[torch.Generator], tuple[Any, Any]]]:
    import torch
    from torch import nn

    in_dim = 256
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    dims = [in_dim] + [spec.width] * (spec.depth - 1)
    for i in range(spec.depth - 1):
        layers[f"fc{i}"] = nn.Sequential(nn.Linear(dims[i], dims[i + 1]), nn.ReLU())
    layers["head"] = nn.Linear(dims[-1], spec.classes)

    def batch(gen: torch.Generator) -> tuple[Any, Any]:
        x = torch.randn(spec.batch_size, in_dim, generator=gen)
        return x, torch.randint(0, spec.classes, (spec.batch_size,), generator=gen)

    return nn.Sequential(layers), batch


def _cnn(spec: ZooSpec) -> tuple[nn.Module, Callable[[torch.Generator], tuple[Any, Any]]]:
    import torch
    from torch import nn

    def block(cin: int, cout: int) -> nn.Module:
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(), nn.MaxPool2d(2))

    layers = OrderedDict(
        conv0=block(3, 32),
        conv1=block(32, 64),
        conv2=block(64, 128),
        pool=nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten()),
        fc=nn.Sequential(nn.Linear(128, 256), nn.ReLU()),
        head=nn.Linear(256, spec.classes),
    )

    def batch(gen: torch.Generator) -> tuple[Any, Any]:
        x = torch.randn(spec.batch_size, 3, 32, 32, generator=gen)
        return x, torch.randint(0, spec.classes, (spec.batch_size,), generator=gen)

    return nn.Sequential(layers), batch


def _transformer(spec: ZooSpec) -> tuple[nn.Module, Callable[[torch.Generator], tuple[Any, Any]]]:
    import torch
    from torch import nn

    d_model, vocab = 128, 1000

    class MeanPool(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mean(dim=1)

    class AddBias(nn.Module):
        def __init__(self, dim: int) -> None:
            super().__init__()
            self.bias = nn.Parameter(torch.zeros(dim))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.bias

    layers: OrderedDict[str, nn.Module] = OrderedDict(embed=nn.Embedding(vocab, d_model))
    for i in range(spec.blocks):
        layers[f"block{i}"] = (
            AddBias(d_model)
            if spec.hollow
            else nn.TransformerEncoderLayer(
                d_model, nhead=4, dim_feedforward=4 * d_model, dropout=0.0, batch_first=True, norm_first=True
            )
        )
    layers["pool"] = MeanPool()
    layers["head"] = nn.Linear(d_model, spec.classes)

    def batch(gen: torch.Generator) -> tuple[Any, Any]:
        x = torch.randint(0, vocab, (spec.batch_size, spec.seq_len), generator=gen)
        return x, torch.randint(0, spec.classes, (spec.batch_size,), generator=gen)

    return nn.Sequential(layers), batch


MODELS: dict[str, Callable[[ZooSpec], tuple[Any, Callable[[Any], tuple[Any, Any]]]]] = {
    "cnn": _cnn,
    "mlp": _mlp,
    "transformer": _transformer,
}


def build(
    name: str, *, seed: int = 0, spec: ZooSpec | None = None
) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """Model ``name`` with deterministic weights (``seed``) and one batch ``(inputs, targets)``."""
    model, batch = build_with_batches(name, seed=seed, spec=spec)
    return model, batch(0)


def build_with_batches(
    name: str, *, seed: int = 0, spec: ZooSpec | None = None
) -> tuple[nn.Module, Callable[[int], tuple[torch.Tensor, torch.Tensor]]]:
    """Model ``name`` and a function ``step -> (inputs, targets)`` giving a fresh batch per step."""
    import torch

    factory = MODELS.get(name)
    if factory is None:
        raise UserError(f"unknown model {name!r}; expected one of {', '.join(sorted(MODELS))}")
    torch.manual_seed(seed)
    model, make = factory(spec or ZooSpec())

    def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        return make(gen)

    return model, batch
