"""Per-layer split profile: forward (F), backward-for-input (B) and backward-for-weights (W) times.

    >>> from trainsim.capture.layerprofile import profile_layers
    >>> prof = profile_layers("mlp", batch_sizes=(32, 8), reps=10)          # doctest: +SKIP
    >>> prof.table(8)[0]                                                   # doctest: +SKIP
    {'name': 'fc0', 'fwd_us': 61.0, 'bwd_input_us': 0.0, 'bwd_weight_us': 70.2, ...}
    $ python -m trainsim.capture.layerprofile mlp --batch-sizes 32,8 --out mlp.layers.json

One process, on the CPU, with the threads a training rank uses (1 by default). Each layer of a zoo
model (an ``nn.Sequential``) runs through ``trainsim.models.splitgrad.LayerTape``: the very calls the
out-of-order runtimes make, so B and W are timed as they are run. The median over ``reps`` steps
(after ``warmup``) is kept. The what-ifs in ``trainsim.transform.ooo`` / ``.pipeline`` build their
graphs from this file; pipelines need it at the microbatch size, hence several ``batch_sizes``.

JSON layout (``LayerProfile.to_json``)::

    {"model": str, "threads": int, "reps": int, "machine": str,
     "by_batch": {"<batch size>": {"loss_us": float,
        "layers": [{"name": str, "fwd_us": float, "bwd_us": float, "bwd_input_us": float, "bwd_weight_us": float,
                    "opt_us": float, "pack_us": float, "unpack_us": float,
                    "param_bytes": int, "out_bytes": int}, ...]}}}

``bwd_us`` is the fused backward (B and W in one autograd pass, what plain backprop and a pipeline's
full-backward action run); ``opt_us`` is that layer's SGD-with-momentum update; ``pack_us`` / ``unpack_us`` flatten the layer's
gradients into one buffer (and divide by 2 ranks) before its all-reduce, and copy them back after
(what ``OooDataParallel`` does per layer); ``out_bytes`` is the layer's output activation (what a
pipeline stage boundary after this layer sends).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainsim.errors import UserError

FIELDS = ("fwd_us", "bwd_us", "bwd_input_us", "bwd_weight_us", "opt_us", "pack_us", "unpack_us")


@dataclass(frozen=True, slots=True)
class LayerProfile:
    """Per-layer times of one model at one or more batch sizes."""

    model: str
    threads: int
    reps: int
    machine: str
    by_batch: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def layer_names(self) -> list[str]:
        first = next(iter(self.by_batch.values()))
        return [r["name"] for r in first["layers"]]

    def table(self, batch_size: int) -> list[dict[str, Any]]:
        """The per-layer rows at ``batch_size``."""
        if batch_size not in self.by_batch:
            raise UserError(
                f"layer profile of {self.model!r} has no batch size {batch_size}; "
                f"it has {sorted(self.by_batch)} (profile again with --batch-sizes)"
            )
        return list(self.by_batch[batch_size]["layers"])

    def loss_us(self, batch_size: int) -> float:
        self.table(batch_size)
        return float(self.by_batch[batch_size]["loss_us"])

    def scaled(self, factor: float) -> LayerProfile:
        """The same profile on a host ``factor`` times slower (every time field and the loss times
        ``factor``; sizes unchanged): a profile taken minutes ago, brought to the host's speed now."""
        if not factor > 0:
            raise UserError(f"layer profile: scale factor {factor}; expected > 0")
        by_batch = {
            b: {**v, "loss_us": float(v["loss_us"]) * factor,
                "layers": [{**r, **{f: float(r[f]) * factor for f in FIELDS}} for r in v["layers"]]}
            for b, v in self.by_batch.items()
        }  # fmt: skip
        return LayerProfile(self.model, self.threads, self.reps, self.machine, by_batch)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "threads": self.threads,
            "reps": self.reps,
            "machine": self.machine,
            "by_batch": {str(b): v for b, v in sorted(self.by_batch.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "<json>") -> LayerProfile:
        try:
            by_batch = {int(b): v for b, v in data["by_batch"].items()}
            for b, v in by_batch.items():
                if not v["layers"]:
                    raise UserError(f"{source}: by_batch[{b}] has no layers")
                for i, row in enumerate(v["layers"]):
                    for f in (*FIELDS, "param_bytes", "out_bytes"):
                        x = row[f]
                        # a time or size that is not a finite number >= 0 would replay as nonsense
                        if isinstance(x, bool) or not isinstance(x, int | float) or not 0 <= x < float("inf"):
                            raise UserError(
                                f"{source}: by_batch[{b}].layers[{i}].{f} = {x!r}; expected a finite number >= 0"
                            )
                    str(row["name"])
            if not by_batch:
                raise UserError(f"{source}: by_batch is empty; expected the profile at one batch size or more")
            return cls(
                str(data["model"]), int(data["threads"]), int(data["reps"]), str(data["machine"]), by_batch
            )
        except UserError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UserError(
                f"{source}: not a trainsim layer profile ({exc!r}); expected the layout in "
                "trainsim.capture.layerprofile"
            ) from exc

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_json(), indent=1))
        return p

    @classmethod
    def load(cls, path: str | Path) -> LayerProfile:
        p = Path(path)
        if not p.exists():
            raise UserError(f"{p}: no such layer profile")
        try:
            data = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserError(f"{p}: cannot read a layer profile ({exc})") from None
        return cls.from_json(data, str(p))


def _update(layer: Any, opt: Any) -> tuple[float, float, float]:
    """After a layer's weight gradients: pack them into one flat buffer (as for its all-reduce, halved
    as by 2 ranks), unpack, and step its optimizer; the three times in µs."""
    import torch

    grads = [p.grad for p in layer.parameters() if p.grad is not None]
    t0 = time.perf_counter()
    flat = torch.cat([gr.reshape(-1) for gr in grads]).div_(2) if grads else None
    t1 = time.perf_counter()
    off = 0
    for gr in grads:
        assert flat is not None
        gr.copy_(flat[off : off + gr.numel()].view_as(gr))
        off += gr.numel()
    t2 = time.perf_counter()
    if opt is not None:
        opt.step()
        opt.zero_grad(set_to_none=True)
    t3 = time.perf_counter()
    return 1e6 * (t1 - t0), 1e6 * (t2 - t1), 1e6 * (t3 - t2)


def profile_layers(
    model: str,
    *,
    batch_sizes: tuple[int, ...] = (32,),
    reps: int = 20,
    warmup: int = 5,
    threads: int = 1,
    seed: int = 0,
    zoo: dict[str, Any] | None = None,
    between: Callable[[int], None] | None = None,
) -> LayerProfile:
    """Time F, B, W and the optimizer update of every layer of zoo ``model`` at each batch size.

    ``reps`` steps with the fused backward and ``reps`` with the split one, alternating.

    ``zoo`` holds extra ``ZooSpec`` fields (e.g. ``{"blocks": 4}``). ``between(batch_size)`` runs before
    each timed step, on the profile's thread count: to time something else in step with the profile
    (e.g. a reference loop).
    """
    import torch
    from torch import nn

    from trainsim.models.splitgrad import LayerTape
    from trainsim.models.zoo import ZooSpec, build_with_batches

    if reps < 1 or warmup < 0 or threads < 1 or not batch_sizes or min(batch_sizes) < 1:
        raise UserError(
            f"reps={reps}, warmup={warmup}, threads={threads}, batch_sizes={batch_sizes}; "
            "expected positive values"
        )
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    by_batch: dict[int, dict[str, Any]] = {}
    try:
        for bs in batch_sizes:
            net, batches = build_with_batches(model, seed=seed, spec=ZooSpec(batch_size=bs, **(zoo or {})))
            layers = list(net.children())
            names = [n for n, _ in net.named_children()]
            opts = [
                torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9)
                if any(True for _ in m.parameters())
                else None
                for m in layers
            ]
            loss_fn = nn.CrossEntropyLoss()
            samples: dict[str, list[list[float]]] = {f: [[] for _ in layers] for f in FIELDS}
            loss_samples: list[float] = []
            out_bytes = [0] * len(layers)
            for rep in range(warmup + 2 * reps):
                keep = rep >= warmup
                if keep and between is not None:
                    between(bs)
                x, y = batches(rep)
                tapes: list[LayerTape] = []
                h = x
                for i, layer in enumerate(layers):
                    t0 = time.perf_counter()
                    tape = LayerTape.forward(layer, h, input_grad=i > 0)
                    t1 = time.perf_counter()
                    tapes.append(tape)
                    h = tape.out
                    out_bytes[i] = h.numel() * h.element_size()
                    if keep:
                        samples["fwd_us"][i].append(1e6 * (t1 - t0))
                t0 = time.perf_counter()
                logits = h.detach().requires_grad_(True)
                (g,) = torch.autograd.grad(loss_fn(logits, y), logits)
                if keep:
                    loss_samples.append(1e6 * (time.perf_counter() - t0))
                fused = rep % 2 == 1  # alternate steps: fused backward, split backward
                if fused:
                    for i in range(len(layers) - 1, -1, -1):
                        t0 = time.perf_counter()
                        g_in = tapes[i].backward(g)
                        if keep:
                            samples["bwd_us"][i].append(1e6 * (time.perf_counter() - t0))
                        _update(layers[i], opts[i])
                        if g_in is not None:
                            g = g_in
                    continue
                # split: the input-gradient chain first, then the weight gradients input-first, the
                # order in which OooDataParallel (and a zero-bubble stage's deferred W) runs them. Timed
                # right after each B instead, W read 19-30 % low on the cnn (benchmarks/ooo_w_order.py),
                # and reverse-first-k was predicted too fast
                for i in range(len(layers) - 1, -1, -1):
                    t0 = time.perf_counter()
                    g_in = tapes[i].backward_input(g)
                    if keep:
                        samples["bwd_input_us"][i].append(1e6 * (time.perf_counter() - t0))
                    if g_in is not None:
                        g = g_in
                for i in range(len(layers)):
                    t0 = time.perf_counter()
                    tapes[i].backward_weight()
                    t1 = time.perf_counter()
                    pack, unpack, opt_us = _update(layers[i], opts[i])
                    if keep:
                        samples["bwd_weight_us"][i].append(1e6 * (t1 - t0))
                        samples["pack_us"][i].append(pack)
                        samples["unpack_us"][i].append(unpack)
                        samples["opt_us"][i].append(opt_us)
            rows = []
            for i, layer in enumerate(layers):
                row: dict[str, Any] = {"name": names[i]}
                for f in FIELDS:
                    row[f] = round(statistics.median(samples[f][i]), 2)
                row["param_bytes"] = sum(p.numel() * p.element_size() for p in layer.parameters())
                row["out_bytes"] = out_bytes[i]
                rows.append(row)
            by_batch[bs] = {"loss_us": round(statistics.median(loss_samples), 2), "layers": rows}
    finally:
        torch.set_num_threads(old_threads)
    machine = f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip()
    return LayerProfile(model, threads, reps, machine, by_batch)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="per-layer F/B/W profile of a zoo model on the CPU")
    ap.add_argument("model")
    ap.add_argument("--batch-sizes", default="32", help="comma-separated, e.g. 32,8,4")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    sizes = tuple(int(s) for s in a.batch_sizes.split(",") if s)
    profile_layers(a.model, batch_sizes=sizes, reps=a.reps, threads=a.threads).save(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

