"""Profile a few training steps of a model with ``torch.profiler`` and write a Kineto trace + sidecar.

    >>> from trainsim.capture.profile import ProfileConfig, profile
    >>> out = profile(ProfileConfig(model="cnn", steps=5, out="out/cnn.json.gz"))   # doctest: +SKIP

The model is a built-in one (``trainsim.models.zoo``) or the user's ``package.module:function`` that
returns ``(model, (inputs, targets))``. Each top-level child module's forward runs inside a
``record_function("layer:<name>")`` range, so every CPU op, kernel and (through autograd's sequence
numbers) backward op is attributed to its layer. The sidecar ``<trace>.trainsim.json`` records the
parameters (name, layer, shape, numel, bytes, dtype) in ``model.parameters()`` order and the layer
order, which the data-parallel what-ifs need to build gradient buckets.
"""

from __future__ import annotations

import gzip
import importlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsim.errors import UserError


@dataclass(frozen=True, kw_only=True, slots=True)
class ProfileConfig:
    model: str = "cnn"
    """a zoo model name (mlp, cnn, transformer) or 'package.module:function'"""
    steps: int = 6
    """profiled steps (after ``warmup``)"""
    warmup: int = 2
    """steps run under the profiler but not recorded"""
    batch_size: int = 32
    """samples per step, for zoo models"""
    threads: int = 1
    """torch intra-op threads (1 makes CPU replay reproducible)"""
    lr: float = 0.01
    """learning rate"""
    optimizer: str = "sgd"
    """sgd or adam, each as a per-parameter loop (``-loop``), multi-tensor (``-foreach``) or fused
    (``-fused``) kernel: e.g. ``adam-fused``; plain ``sgd``/``adam`` use torch's default"""
    out: str = "out/trace.json.gz"
    """trace path (.json or .json.gz); the sidecar goes beside it"""
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 1 or self.warmup < 0:
            raise UserError(f"profile: steps={self.steps}, warmup={self.warmup}; expected steps >= 1, warmup >= 0")
        if self.threads < 1:
            raise UserError(f"profile: threads={self.threads}; expected >= 1")
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"profile: optimizer {self.optimizer!r}; expected one of {', '.join(OPTIMIZERS)}")
        if not (self.out.endswith(".json") or self.out.endswith(".json.gz")):
            raise UserError(f"profile: --out {self.out!r}; expected a path ending in .json or .json.gz")


OPTIMIZERS = ("sgd", "sgd-loop", "sgd-foreach", "sgd-fused", "adam", "adam-loop", "adam-foreach", "adam-fused")


def make_optimizer(name: str, params: Any, lr: float) -> Any:
    """``sgd``/``adam`` with torch's default implementation, or forced ``-loop``/``-foreach``/``-fused``."""
    import torch

    kind, _, impl = name.partition("-")
    kw: dict[str, Any] = {"foreach": False} if impl == "loop" else {"foreach": True} if impl == "foreach" else {}
    if impl == "fused":
        kw = {"fused": True}
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, **kw)
    return torch.optim.Adam(params, lr=lr, **kw)


def load_model(spec: str, batch_size: int, seed: int) -> tuple[Any, Callable[[int], tuple[Any, Any]]]:
    """A zoo model, or the user's ``module:function`` returning ``(model, (inputs, targets))``."""
    from trainsim.models import zoo

    if ":" not in spec:
        return zoo.build_with_batches(spec, seed=seed, spec=zoo.ZooSpec(batch_size=batch_size))
    import sys

    import torch

    mod_name, _, fn_name = spec.partition(":")
    if not mod_name or not fn_name:
        raise UserError(f"--model {spec!r}: expected 'package.module:function'")
    # like ``python -m``, a module in the current folder is found (a console script's path lacks it)
    added = "" not in sys.path and str(Path.cwd()) not in sys.path
    if added:
        sys.path.insert(0, str(Path.cwd()))
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as exc:
        raise UserError(f"--model {spec!r}: cannot import ({exc}); expected 'package.module:function'") from None
    finally:
        if added:
            sys.path.remove(str(Path.cwd()))
    result = fn()
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], tuple) and len(result[1]) == 2):
        raise UserError(f"--model {spec!r}: the function must return (model, (inputs, targets))")
    model, batch = result
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"--model {spec!r}: the model it returned is a {type(model).__name__}; expected a torch.nn.Module")
    return model, lambda _step: batch


def _annotate_layers(model: Any) -> list[str]:
    """Wrap each top-level child's forward in ``record_function('layer:<name>')``; return the names."""
    import torch

    names = []
    for name, child in model.named_children():
        names.append(name)
        label = f"layer:{name}"

        def pre(_m: Any, _inp: Any, label: str = label) -> None:
            _m._trainsim_rf = torch.autograd.profiler.record_function(label)
            _m._trainsim_rf.__enter__()

        def post(_m: Any, _inp: Any, _out: Any) -> None:
            _m._trainsim_rf.__exit__(None, None, None)

        child.register_forward_pre_hook(pre)
        child.register_forward_hook(post)
    return names


def sidecar(model: Any, layers: list[str], model_name: str, batch_size: int) -> dict[str, Any]:
    params = []
    for name, p in model.named_parameters():
        params.append({
            "name": name, "layer": name.split(".")[0], "shape": list(p.shape), "numel": int(p.numel()),
            "bytes": int(p.numel() * p.element_size()), "dtype": str(p.dtype).replace("torch.", ""),
        })  # fmt: skip
    return {"model": model_name, "batch_size": batch_size, "layers": layers, "params": params}


def sidecar_path(trace: str | Path) -> Path:
    p = Path(trace)
    base = p.name[: -len(".json.gz")] if p.name.endswith(".json.gz") else p.name[: -len(".json")]
    return p.with_name(base + ".trainsim.json")


def record_steps(step: Callable[[int], None], total: int, *, warmup: int, out: Path, cuda: bool = False) -> None:
    """Run ``step(0)`` .. ``step(total - 1)`` under ``torch.profiler`` (CPU activity, and CUDA with
    ``cuda``; input shapes recorded), keeping all but the first ``warmup`` steps, and write the Kineto
    trace to ``out`` (gzip-compressed when it ends in ``.gz``) atomically."""
    import torch
    from torch.profiler import ProfilerActivity, schedule

    raw = out.with_name(out.name + ".tmp.json")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(
        activities=acts,
        schedule=schedule(wait=0, warmup=warmup, active=total - warmup, repeat=1),
        on_trace_ready=lambda p: p.export_chrome_trace(str(raw)),
        record_shapes=True,
    ) as prof:
        for k in range(total):
            step(k)
            prof.step()
    data = raw.read_bytes()
    tmp = out.with_name(out.name + ".partial")
    tmp.write_bytes(gzip.compress(data, compresslevel=5) if out.name.endswith(".gz") else data)
    tmp.replace(out)
    raw.unlink(missing_ok=True)


def profile(cfg: ProfileConfig, progress: Callable[[int, int], None] | None = None) -> Path:
    """Run ``warmup + steps`` SGD steps under the profiler; return the trace path."""
    import torch

    torch.set_num_threads(cfg.threads)
    model, batch = load_model(cfg.model, cfg.batch_size, cfg.seed)
    layers = _annotate_layers(model)
    opt = make_optimizer(cfg.optimizer, model.parameters(), cfg.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    cuda = torch.cuda.is_available()
    if cuda:
        model = model.cuda()
    out = Path(cfg.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    total = cfg.warmup + cfg.steps

    def step(k: int) -> None:
        x, y = batch(k)
        if cuda:
            x, y = x.cuda(), y.cuda()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        loss.detach().item()  # the usual per-step sync point
        if progress:
            progress(k + 1, total)

    record_steps(step, total, warmup=cfg.warmup, out=out, cuda=cuda)
    side = sidecar(model, layers, cfg.model, cfg.batch_size)
    side["steps"] = cfg.steps
    side["optimizer"] = cfg.optimizer
    side["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    sidecar_path(out).write_text(json.dumps(side, indent=1))
    return out
