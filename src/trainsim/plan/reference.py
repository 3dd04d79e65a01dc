"""A small Megatron-style GPT in torch, to check the memory model against what PyTorch really keeps.

    >>> from trainsim.plan.reference import measure
    >>> from trainsim.plan.workload import Transformer
    >>> m = Transformer(arch="gpt", layers=2, hidden=64, heads=4, seq=32, vocab=128)
    >>> got = measure(m, micro_batch=2, recompute="none")            # doctest: +SKIP
    >>> got["activations"] > 0                                         # doctest: +SKIP
    True

What is measured (CPU, no CUDA allocator here): one forward pass in bf16 under
``torch.autograd.graph.saved_tensors_hooks``; every tensor autograd saves for backward is recorded by
its storage, parameters are excluded, and the bytes of the *distinct storages* are summed (a view of
a saved tensor costs nothing extra; a saved tensor keeps its whole storage alive). That is the
activation memory held at the end of the forward, the term the model predicts per micro-batch. Static
memory is the bytes of the real tensors of mixed-precision Adam after one step: bf16 weights and
gradients, fp32 master weights and the two fp32 Adam moments. Allocator peaks (temporaries, caching,
fragmentation) are not measured here; the model's allowance for them is left out of the comparison.

The layer follows Megatron-LM's operator order (pre-LN, fused QKV, scaled causal softmax, attention
dropout, output projection with bias-dropout-add, GELU MLP with dropout), so the saved tensors are
those of Korthikanti et al. §4. Recomputation uses reentrant ``torch.utils.checkpoint`` (its inputs are
saved with ``save_for_backward`` and so are seen by the hooks): ``full`` checkpoints each block,
``selective`` the attention core (QK^T, softmax, dropout, AV).
"""

from __future__ import annotations

from typing import Any

from trainsim.errors import UserError
from trainsim.plan.workload import Transformer


def build(m: Transformer, recompute: str = "none", dropout: float = 0.1, seed: int = 0) -> Any:
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    if m.arch != "gpt":
        raise UserError("the reference model implements arch=gpt only")
    h, a, s = m.hidden, m.heads, m.seq
    hd = h // a

    class Dropout(torch.autograd.Function):
        """Dropout that keeps a 1-byte mask, as CUDA's fused kernel does (CPU's composite keeps 2 bytes)."""

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, p: float) -> torch.Tensor:
            mask = torch.rand(x.shape) >= p
            ctx.save_for_backward(mask)
            ctx.scale = 1.0 / (1.0 - p)
            return x * mask * ctx.scale

        @staticmethod
        def backward(ctx: Any, g: torch.Tensor) -> tuple[torch.Tensor, None]:
            (mask,) = ctx.saved_tensors
            return g * mask * ctx.scale, None

    def drop(x: torch.Tensor, p: float, train: bool) -> torch.Tensor:
        return Dropout.apply(x, p) if train and p > 0 else x

    def core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, p: float, train: bool) -> torch.Tensor:
        # baddbmm with alpha scales without copying q (Megatron-LM does the same); the mask add saves nothing
        empty = torch.empty(q.shape[0], q.shape[1], k.shape[1], dtype=q.dtype)
        scores = torch.baddbmm(empty, q, k.transpose(1, 2), beta=0.0, alpha=hd**-0.5) + bias
        probs = drop(torch.softmax(scores, -1), p, train)
        return torch.bmm(probs, v)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.fc1, self.fc2 = nn.Linear(h, m.ffn), nn.Linear(m.ffn, h)
            self.register_buffer("bias", torch.full((s, s), float("-inf")).triu(1), persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (s, b, h)
            b = x.shape[1]
            qkv = self.qkv(self.ln1(x)).view(s, b, a, 3, hd)
            q, k, v = (qkv[:, :, :, i].permute(1, 2, 0, 3).reshape(b * a, s, hd) for i in range(3))
            bias = self.get_buffer("bias").to(x.dtype)
            if recompute == "selective":
                ctx = checkpoint(core, q, k, v, bias, dropout, self.training, use_reentrant=True)
            else:
                ctx = core(q, k, v, bias, dropout, self.training)
            ctx = ctx.view(b, a, s, hd).permute(2, 0, 1, 3).reshape(s, b, h)
            x = x + drop(self.proj(ctx), dropout, self.training)
            y = self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))
            return x + drop(y, dropout, self.training)

    class Gpt(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(m.vocab, h), nn.Embedding(s, h)
            self.blocks = nn.ModuleList(Block() for _ in range(m.layers))
            self.ln_f = nn.LayerNorm(h)

        def forward(self, ids: torch.Tensor, target: torch.Tensor) -> torch.Tensor:  # ids: (b, s)
            x = self.tok(ids.t()) + self.pos.weight[:, None, :]
            x = drop(x, dropout, self.training)
            for blk in self.blocks:
                x = checkpoint(blk, x, use_reentrant=True) if recompute == "full" else blk(x)
            logits = nn.functional.linear(self.ln_f(x), self.tok.weight)  # tied head
            return nn.functional.cross_entropy(logits.float().view(-1, m.vocab), target.t().reshape(-1))

    torch.manual_seed(seed)
    return Gpt().to(torch.bfloat16).train()


def measure(m: Transformer, micro_batch: int, recompute: str = "none") -> dict[str, float]:
    """Bytes: saved activations of one forward, and the static terms of mixed-precision Adam."""
    import torch

    model = build(m, recompute)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in params and st.nbytes() > 0:
            seen[st.data_ptr()] = st.nbytes()
        return t

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, m.vocab, (micro_batch, m.seq), generator=g)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(ids, ids)
    act = float(sum(seen.values()))
    loss.backward()
    master = [p.detach().float().requires_grad_() for p in model.parameters()]
    for mp, p in zip(master, model.parameters(), strict=True):
        mp.grad = p.grad.float()
    opt = torch.optim.Adam(master, lr=1e-4)
    opt.step()
    for mp in master:
        mp.grad = None
    weights = float(sum(p.numel() * p.element_size() for p in model.parameters()))
    grads = float(sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None))
    optim = float(sum(p.numel() * 4 for p in master))
    optim += float(sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if v.dim() > 0))
    n = sum(p.numel() for p in model.parameters())
    return {"activations": act, "weights": weights, "grads": grads, "optimizer": optim, "params": float(n)}
