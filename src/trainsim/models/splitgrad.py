"""Per-layer split backward: output gradient (B) and weight gradients (W) as two separate calls.

    >>> import torch
    >>> from trainsim.models.splitgrad import LayerTape
    >>> layer = torch.nn.Linear(4, 3)
    >>> x = torch.randn(2, 4, requires_grad=True)
    >>> tape = LayerTape.forward(layer, x)               # runs the layer, keeps its graph
    >>> gx = tape.backward_input(torch.ones(2, 3))       # B: d loss / d x only
    >>> tape.backward_weight()                           # W: accumulates layer.weight.grad, .bias.grad
    >>> gx.shape, layer.weight.grad is not None
    (torch.Size([2, 4]), True)

Out-of-order backprop (Oh et al., EuroSys'22) and zero-bubble pipelines (Qi et al., arXiv 2401.10241)
both rest on one observation: a layer's weight gradient is needed by nobody until its optimizer
update, while its input gradient is on the critical path to the layer below. This module gives the
two halves of a layer's backward as separate calls so that a runtime can order them freely.

How (the algorithm of ``torch.distributed.pipelining._backward``, which this module calls):

1. ``forward`` runs the layer on a detached copy of its input, so each layer owns its own graph.
2. ``backward_input`` runs ``torch.autograd.grad`` from the output to the input only; on the way,
   hooks capture the gradient flowing into every autograd node the input path shares with a
   weight path (e.g. ``AddmmBackward`` of a linear layer), so that nothing is computed twice.
3. ``backward_weight`` starts from those captured gradients and finishes the weight paths,
   accumulating into ``param.grad`` as ``loss.backward()`` would.

``backward`` is the fused alternative (one autograd pass for both): the split costs more than the
fused pass when the two paths share much of the graph (about 1.4x for a transformer block on a CPU,
about 1.0x for a linear layer), so runtimes split only the layers they reorder.

A layer whose input needs no gradient (the first layer, an embedding on token ids) has an empty B;
its W is then a plain ``torch.autograd.grad`` from the output to the parameters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn


class LayerTape:
    """One layer's forward, kept so that its backward can run as B then W (in that order)."""

    __slots__ = ("_grad_out", "_groups", "_stage", "inp", "layer", "out")

    def __init__(self, layer: nn.Module, inp: torch.Tensor, out: torch.Tensor) -> None:
        # --- the forward
        self.layer = layer  # the module
        self.inp = inp  # the detached input the layer saw (requires grad iff floating point)
        self.out = out  # the layer's output, still attached to the layer's graph
        # --- state between B and W
        self._stage = "forward"  # forward -> input_done -> weight_done
        self._groups: list[dict[str, Any]] | None = None  # captured intermediates (torch's param groups)
        self._grad_out: torch.Tensor | None = None  # kept only when B was empty

    @classmethod
    def forward(cls, layer: nn.Module, x: torch.Tensor, *, input_grad: bool = True) -> LayerTape:
        """Run ``layer`` on a detached copy of ``x``; the output is ``tape.out``.

        ``input_grad=False`` (the first layer) skips the input gradient: B is then empty.
        """
        inp = x.detach()
        if input_grad and inp.is_floating_point():
            inp.requires_grad_(True)
        return cls(layer, inp, layer(inp))

    def _params(self) -> list[nn.Parameter]:
        return [p for p in self.layer.parameters() if p.requires_grad]

    def backward_input(self, grad_out: torch.Tensor) -> torch.Tensor | None:
        """B: the gradient of the loss w.r.t. the layer's input (None when the input needs none)."""
        import torch
        from torch.distributed.pipelining._backward import stage_backward_input

        assert self._stage == "forward", f"backward_input after {self._stage}"
        self._stage = "input_done"
        if not self.inp.requires_grad:
            self._grad_out = grad_out
            return None
        if not self.out.requires_grad:  # a layer without parameters on a constant: nothing flows
            return None
        params = self._params()
        if not params:  # nothing to split: a plain input gradient
            (plain,) = torch.autograd.grad(self.out, self.inp, grad_out)
            return plain
        grads_in, self._groups = stage_backward_input([self.out], [grad_out], [self.inp], iter(params))
        self.inp.grad = None  # stage_backward_input also accumulated it there; the caller owns it
        return grads_in[0]

    def backward_weight(self) -> None:
        """W: accumulate the weight gradients into ``param.grad``; frees the layer's graph."""
        import torch
        from torch.distributed.pipelining._backward import stage_backward_weight

        assert self._stage == "input_done", f"backward_weight after {self._stage}"
        self._stage = "weight_done"
        params = self._params()
        if not params:
            return
        if self._grad_out is not None:
            grads = torch.autograd.grad(self.out, params, self._grad_out, allow_unused=True)
            for p, g in zip(params, grads, strict=True):
                if g is not None:
                    p.grad = g if p.grad is None else p.grad + g
            self._grad_out = None
        elif self._groups is not None:
            stage_backward_weight(iter(params), self._groups)
            self._groups = None

    def backward(self, grad_out: torch.Tensor) -> torch.Tensor | None:
        """B and W fused in one autograd pass (the plain order; cheaper than the split when the
        layer's input and weight paths share much of the graph, e.g. attention)."""
        import torch

        assert self._stage == "forward", f"backward after {self._stage}"
        self._stage = "weight_done"
        params = self._params()
        wants = ([self.inp] if self.inp.requires_grad else []) + params
        if not wants or not self.out.requires_grad:
            return None
        grads = torch.autograd.grad(self.out, wants, grad_out, allow_unused=True)
        for p, g in zip(params, grads[len(wants) - len(params) :], strict=True):
            if g is not None:
                p.grad = g if p.grad is None else p.grad + g
        return grads[0] if self.inp.requires_grad else None
