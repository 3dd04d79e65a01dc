"""One device, weight gradients on a second stream (OOO BackProp §4), for real.

    >>> from trainsim.models.zoo import ZooSpec, build_with_batches
    >>> from trainsim.run.multistream import TwoStreamTrainer
    >>> net, batches = build_with_batches("cnn", spec=ZooSpec(batch_size=64))
    >>> tr = TwoStreamTrainer(net.cuda(), [("BWD", i) for i in range(6)])   # doctest: +SKIP
    >>> x, y = batches(0)
    >>> loss = tr.step(x.cuda(), y.cuda())                                   # doctest: +SKIP

Out-of-order backprop (Oh et al., EuroSys'22) on one GPU: the output-gradient chain (B) stays on the
main stream, and each layer's weight gradients (W) and its optimizer update run on a second stream,
started after B of a chosen layer in the same step (``("BWD", j)``) or deferred into the next step,
issued with the forward of layer ``j`` (``("FWD", j)``). The next forward of a layer waits, on the
device, for that layer's update. ``schedule_map=None`` is plain backprop on one stream (fused B+W
per layer, then the updates), the baseline the map is compared with.

Why W is computed here by explicit formulas: PyTorch runs every backward kernel on the stream of its
forward op ("stream semantics of backward passes" in the CUDA notes), so an autograd call for the
weight gradients issued on another stream would still run on the main stream. The split mode
therefore builds the forward graph for the input path only (parameters do not require grad), captures
the input and the output gradient of every parameterised leaf module (hooks), and computes W from
them with ordinary tensor ops on the side stream: ``nn.Linear``, ``nn.Conv2d``, ``nn.BatchNorm2d``
(training mode), ``nn.LayerNorm`` and ``nn.Embedding``. Any other module with parameters is refused
with a ``UserError``. On a CPU the same code runs in the same issue order without streams; that is how
the tests check that it trains exactly like plain backprop.

``profile_streams`` times every phase (F, loss, B, W, fused BW, update) of this very code on the
device and on the host: the host time of issuing it and the device time of running it alone. The
simulator (``trainsim.transform.ooo.multistream_graph``) replays both, a host thread issuing
phases in the runner's order and two streams executing them.

Why one module: ``profile_streams``, ``two_stream_host_us``, ``corun_factor`` and ``measure_step_ms``
time the trainer by running ``TwoStreamTrainer`` itself with its private capture and timer classes
(``_Capture``, ``_PhaseTimer``), so that what is measured is the code path that trains.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainsim.errors import UserError
from trainsim.transform.ooo import ScheduleMap, check_schedule_map

PHASE_FIELDS = {
    "fused": (("fwd_us", "F"), ("bwd_us", "BW"), ("opt_us", "U")),
    "split": (("fwd_split_us", "F"), ("bwd_input_us", "B"), ("bwd_weight_us", "W"), ("opt_split_us", "U")),
}
"""per mode of ``profile_streams``: each row field (device µs; ``host_`` + it, host µs) and its phase"""

BURST = 3
"""steps run back to back per profiled repetition (the first is not kept)"""

if TYPE_CHECKING:
    import torch
    from torch import nn

    from trainsim.capture.layerprofile import LayerProfile

SUPPORTED = ("Linear", "Conv2d", "BatchNorm2d", "LayerNorm", "Embedding")


def weight_grads(mod: nn.Module, x: torch.Tensor, g: torch.Tensor) -> dict[str, torch.Tensor]:
    """The gradients of ``mod``'s own parameters from its input ``x`` and output gradient ``g``."""
    import torch
    import torch.nn.functional as fn
    from torch import nn

    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        if isinstance(mod, nn.Linear):
            g2 = g.reshape(-1, g.shape[-1])
            out["weight"] = g2.t() @ x.reshape(-1, x.shape[-1])
            if mod.bias is not None:
                out["bias"] = g2.sum(0)
        elif isinstance(mod, nn.Conv2d):
            from torch.nn.grad import conv2d_weight

            out["weight"] = conv2d_weight(
                x, mod.weight.shape, g, mod.stride, mod.padding, mod.dilation, mod.groups
            )
            if mod.bias is not None:
                out["bias"] = g.sum((0, 2, 3))
        elif isinstance(mod, nn.BatchNorm2d):
            # training mode normalises with the batch's own mean and biased variance
            var, mean = torch.var_mean(x, dim=(0, 2, 3), correction=0, keepdim=True)
            xhat = (x - mean) * torch.rsqrt(var + mod.eps)
            if mod.weight is not None:
                out["weight"] = (g * xhat).sum((0, 2, 3))
            if mod.bias is not None:
                out["bias"] = g.sum((0, 2, 3))
        elif isinstance(mod, nn.LayerNorm):
            lead = tuple(range(x.dim() - len(mod.normalized_shape)))
            xhat = fn.layer_norm(x, mod.normalized_shape, None, None, mod.eps)
            if mod.weight is not None:
                out["weight"] = (g * xhat).sum(lead)
            if mod.bias is not None:
                out["bias"] = g.sum(lead)
        elif isinstance(mod, nn.Embedding):
            w = torch.zeros_like(mod.weight)
            idx = x.reshape(-1)
            rows = g.reshape(-1, w.shape[1])
            if mod.padding_idx is not None:
                rows = rows * (idx != mod.padding_idx).unsqueeze(1).to(rows.dtype)
            out["weight"] = w.index_add_(0, idx, rows)
        else:  # pragma: no cover - refused in TwoStreamTrainer.__init__
            raise UserError(f"{type(mod).__name__}: no explicit weight gradient")
    return out


def _leaves(layer: nn.Module, name: str) -> list[nn.Module]:
    from torch import nn

    found = []
    for sub_name, m in layer.named_modules():
        if not any(True for _ in m.parameters(recurse=False)):
            continue
        kind = type(m).__name__
        if kind not in SUPPORTED or (isinstance(m, nn.Embedding) and (m.max_norm is not None or m.sparse)):
            where = f"{name}.{sub_name}" if sub_name else name
            raise UserError(
                f"layer {where}: {kind} has no explicit weight gradient; the two-stream runner supports "
                f"{', '.join(SUPPORTED)} (Embedding without max_norm or sparse)"
            )
        if isinstance(m, nn.Conv2d) and m.padding_mode != "zeros":
            raise UserError(f"layer {name}.{sub_name}: Conv2d padding_mode {m.padding_mode!r}; expected 'zeros'")
        found.append(m)
    return found


def check_splittable(model: str, spec: Any) -> None:
    """Refuse, before any timing, a zoo model that the two-stream runner cannot split (``UserError``)."""
    from trainsim.models.zoo import build_with_batches

    net, _ = build_with_batches(model, spec=spec)
    for name, layer in net.named_children():
        _leaves(layer, name)


class _Capture:
    """One parameterised leaf module's input and output gradient in one step."""

    __slots__ = ("g", "mod", "root", "x")

    def __init__(self, mod: nn.Module, x: torch.Tensor, root: torch.Tensor | None) -> None:
        self.mod = mod
        self.x = x
        self.root = root  # the leaf's output made a graph root (nothing upstream needs a gradient)
        self.g: torch.Tensor | None = None


class TwoStreamTrainer:
    """Train an ``nn.Sequential`` with SGD (momentum) on one device, W on a second stream per the map.

    With a schedule map the trainer owns the gradients: it turns ``requires_grad`` off on every
    parameter of ``model`` and adds forward hooks to its parameterised modules."""

    def __init__(
        self,
        model: nn.Module,
        schedule_map: ScheduleMap | None,
        *,
        lr: float = 0.01,
        momentum: float = 0.9,
        loss_fn: Callable[[Any, Any], Any] | None = None,
        one_stream: bool = False,
    ) -> None:
        """``one_stream=True`` issues the split mode's W and updates on the main stream (profiling)."""
        import torch
        from torch import nn

        self.layers = list(model.children())
        self.names = [n for n, _ in model.named_children()]
        n = len(self.layers)
        if n == 0:
            raise UserError("two-stream runner: the model has no layers (expected an nn.Sequential)")
        self.smap = check_schedule_map(schedule_map, n) if schedule_map is not None else None
        self.lr, self.momentum = lr, momentum
        self.loss_fn = loss_fn or nn.CrossEntropyLoss()
        params = list(model.parameters())
        self.device = params[0].device if params else torch.device("cpu")
        cuda = self.device.type == "cuda"
        self.main = torch.cuda.current_stream(self.device) if cuda else None
        self.side = torch.cuda.Stream(self.device) if cuda and self.smap is not None and not one_stream else None
        self.params: list[list[torch.Tensor]] = [list(layer.parameters()) for layer in self.layers]
        self.bufs: list[list[torch.Tensor] | None] = [None] * n
        self._caps: list[list[_Capture]] = [[] for _ in range(n)]
        self._recording: list[_Capture] | None = None
        self._deferred: dict[int, list[int]] = {}  # forward layer j -> layers whose W is issued before F(j)
        self._held: dict[int, list[_Capture]] = {}  # a deferred layer's captures from the last step
        self.b_ev = [torch.cuda.Event() for _ in range(n)] if self.side is not None else []
        self.u_ev = [torch.cuda.Event() for _ in range(n)] if self.side is not None else []
        self.timer: Callable[[str, int], Any] | None = None  # profile_streams' per-phase probe
        if self.smap is not None:
            for i, layer in enumerate(self.layers):
                for m in _leaves(layer, self.names[i]):
                    m.register_forward_hook(self._hook)
            for p in params:
                p.requires_grad_(False)
            self.by_trigger: dict[int, list[int]] = {}
            for i, (when, j) in enumerate(self.smap):
                if when == "BWD":
                    self.by_trigger.setdefault(min(i, j), []).append(i)

    # ------------------------------------------------------------------ pieces of a step
    def _hook(self, mod: nn.Module, args: tuple[Any, ...], out: torch.Tensor) -> torch.Tensor | None:
        if self._recording is None:
            return None
        x = args[0]
        if out.requires_grad:
            cap = _Capture(mod, x, None)

            def keep(g: torch.Tensor, c: _Capture = cap) -> None:
                c.g = g

            out.register_hook(keep)
            self._recording.append(cap)
            return None
        root = out.detach().requires_grad_(True)
        self._recording.append(_Capture(mod, x, root))
        return root

    def _probe(self, phase: str, i: int) -> Any:
        return self.timer(phase, i) if self.timer is not None else _NULL

    def _sgd(self, i: int, grads: list[torch.Tensor]) -> None:
        """Layer ``i``'s SGD-with-momentum update, as ``torch.optim.SGD`` (no dampening) makes it."""
        import torch

        params = self.params[i]
        if not params:
            return
        with torch.no_grad():
            bufs = self.bufs[i]
            if bufs is None:  # torch.optim.SGD's first step: the buffer is the gradient itself
                bufs = self.bufs[i] = [g.clone() for g in grads]
            else:
                torch._foreach_mul_(bufs, self.momentum)
                torch._foreach_add_(bufs, grads)
            torch._foreach_add_(params, bufs, alpha=-self.lr)

    def _weight_and_update(self, i: int, caps: list[_Capture]) -> None:
        """W(i) and update(i); on the side stream after B of its trigger (recorded in ``b_ev``)."""
        import torch

        if self.side is None:
            self._weight_and_update_here(i, caps)
            return
        assert self.smap is not None
        when, j = self.smap[i]
        self.side.wait_event(self.b_ev[i if when == "FWD" else min(i, j)])
        with torch.cuda.stream(self.side):
            for c in caps:  # made on the main stream, used here: keep the allocator off them
                c.x.record_stream(self.side)
                assert c.g is not None
                c.g.record_stream(self.side)
            self._weight_and_update_here(i, caps)
            self.u_ev[i].record(self.side)

    def _weight_and_update_here(self, i: int, caps: list[_Capture]) -> None:
        with self._probe("W", i):
            grads: dict[int, Any] = {}
            for c in caps:
                assert c.g is not None, f"layer {self.names[i]}: no output gradient captured"
                for pname, gr in weight_grads(c.mod, c.x, c.g).items():
                    grads[id(getattr(c.mod, pname))] = gr
            ordered = [grads[id(p)] for p in self.params[i]]
        with self._probe("U", i):
            self._sgd(i, ordered)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One training step; returns the loss (a device tensor: reading it synchronises)."""
        return self._step_fused(x, y) if self.smap is None else self._step_split(x, y)

    def _step_fused(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        import torch

        from trainsim.models.splitgrad import LayerTape

        tapes = []
        h = x
        for i, layer in enumerate(self.layers):
            with self._probe("F", i):
                tapes.append(LayerTape.forward(layer, h, input_grad=i > 0))
            h = tapes[-1].out
        with self._probe("loss", -1):
            logits = h.detach().requires_grad_(True)
            loss = self.loss_fn(logits, y)
            (g,) = torch.autograd.grad(loss, logits)
        for i in range(len(self.layers) - 1, -1, -1):
            with self._probe("BW", i):
                g_in = tapes[i].backward(g)
            g = g if g_in is None else g_in
        for i in range(len(self.layers)):
            with self._probe("U", i):
                grads = [p.grad for p in self.params[i]]
                if any(gr is None for gr in grads):
                    raise UserError(f"layer {self.names[i]}: a parameter got no gradient (unused in forward?)")
                self._sgd(i, [gr for gr in grads if gr is not None])
                for p in self.params[i]:
                    p.grad = None
        return loss.detach()

    def _step_split(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        import torch

        assert self.smap is not None
        n = len(self.layers)
        ins: list[torch.Tensor] = []
        outs: list[torch.Tensor] = []
        h = x
        for i, layer in enumerate(self.layers):
            for d in self._deferred.get(i, []):
                if d in self._held:
                    self._weight_and_update(d, self._held.pop(d))
            with self._probe("F", i):
                if self.side is not None and self.main is not None:
                    self.main.wait_event(self.u_ev[i])  # this layer's last update (no-op before the first)
                inp = h.detach()
                if i > 0 and inp.is_floating_point():
                    inp.requires_grad_(True)
                self._recording = self._caps[i] = []
                try:
                    h = layer(inp)
                finally:
                    self._recording = None
            ins.append(inp)
            outs.append(h)
        with self._probe("loss", -1):
            logits = h.detach().requires_grad_(True)
            loss = self.loss_fn(logits, y)
            (g,) = torch.autograd.grad(loss, logits)
        self._deferred = {}
        for i in range(n - 1, -1, -1):
            with self._probe("B", i):
                g = self._backward_input(i, ins[i], outs[i], g)
                if self.side is not None:
                    self.b_ev[i].record(self.main)
            for k in self.by_trigger.get(i, []):
                self._weight_and_update(k, self._caps[k])
        for i, (when, j) in enumerate(self.smap):
            if when == "FWD":
                self._held[i] = self._caps[i]
                self._caps[i] = []
                self._deferred.setdefault(j, []).append(i)
        return loss.detach()

    def _backward_input(self, i: int, inp: torch.Tensor, out: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        import torch

        caps = self._caps[i]
        roots = [c for c in caps if c.root is not None]
        wants = ([inp] if inp.requires_grad else []) + [c.root for c in roots if c.root is not None]
        if not wants or not out.requires_grad:
            return g
        grads = torch.autograd.grad(out, wants, g, allow_unused=True)
        for c, gr in zip(roots, grads[len(wants) - len(roots) :], strict=True):
            c.g = gr
        return grads[0] if inp.requires_grad and grads[0] is not None else g

    def flush(self) -> None:
        """Apply the updates still deferred to a next step (call after the last step)."""
        for i in sorted(self._held):
            self._weight_and_update(i, self._held.pop(i))
        self._deferred = {}


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NULL = _Null()


# ---------------------------------------------------------------------- profiling and measuring
def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(device)


class _PhaseTimer:
    """Per-phase host time (wall clock around the call) and device time (CUDA events on the main
    stream, with the device held back by a sleep kernel so that the host is never waited for).
    Events come from a pool made once, so that the probe itself costs little host time."""

    def __init__(self, cuda: bool) -> None:
        import torch

        self.cuda = cuda
        self.pool = [torch.cuda.Event(enable_timing=True) for _ in range(2048)] if cuda else []
        self.rows: list[tuple[str, int, float, int, int]] = []  # phase, layer, host s, first event, step
        self._open: list[tuple[str, int, float, int]] = []
        self._used = 0
        self.step = 0

    def reset(self) -> None:
        self.rows, self._open, self._used = [], [], 0

    def __call__(self, phase: str, i: int) -> _PhaseTimer:
        self._open.append((phase, i, 0.0, self._used))
        return self

    def __enter__(self) -> None:
        phase, i, _, ev = self._open[-1]
        if self.cuda:
            self.pool[ev].record()
            self._used += 2
        self._open[-1] = (phase, i, time.perf_counter(), ev)

    def __exit__(self, *exc: object) -> None:
        t1 = time.perf_counter()
        phase, i, t0, ev = self._open.pop()
        if self.cuda:
            self.pool[ev + 1].record()
        self.rows.append((phase, i, t1 - t0, ev, self.step))

    def device_s(self, ev: int) -> float:
        return self.pool[ev].elapsed_time(self.pool[ev + 1]) / 1e3 if self.cuda else 0.0


def profile_streams(
    model: str,
    batch_size: int,
    *,
    device: str = "cuda",
    reps: int = 20,
    warmup: int = 5,
    zoo: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
) -> LayerProfile:
    """Host and device time of every phase of ``TwoStreamTrainer`` for zoo ``model``, one stream.

    Row fields (µs, medians over ``reps`` steps per mode): device ``fwd_us``, ``bwd_us`` (fused
    B+W), ``opt_us`` from the single-stream mode; ``fwd_split_us``, ``bwd_input_us``,
    ``bwd_weight_us``, ``opt_split_us`` from the split mode (W issued on the main stream here); each
    with a ``host_`` twin. The batch entry has ``loss_us`` / ``host_loss_us`` and
    ``host_other_us`` / ``host_other_split_us``, the step's host time outside the phases; on a GPU also
    ``host_two_streams_extra_us``, what the runner's second stream adds to a split step's host time
    (``two_stream_host_us``), and ``stream_corun_factor`` (``corun_factor``).

    Each repetition runs bursts of ``BURST`` steps back to back, probed and plain (no probes), the
    first step of a burst not kept. Device times come from bursts behind a sleep kernel (events on
    the main stream; the host has issued everything before the device starts); host times from
    free-running bursts, as in training (behind the sleep kernel an H100 machine's host issued the
    same steps about 7 % slower). The plain steps give the step's host time, hence ``host_other``,
    and its device time; the per-phase device times are scaled so that they add up to it (the probes'
    own events cost device time too). On a CPU the device and host times are the same wall-clock time.
    """
    import platform

    import torch

    from trainsim.capture.layerprofile import LayerProfile
    from trainsim.models.zoo import ZooSpec, build_with_batches

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    if cuda and not torch.cuda.is_available():
        raise UserError("profile_streams: device 'cuda' asked for, but torch sees no CUDA device")
    spec = ZooSpec(batch_size=batch_size, **(zoo or {}))
    samples: dict[str, dict[tuple[str, int], list[tuple[float, float]]]] = {}
    whole: dict[str, tuple[float, float]] = {}  # mode -> (host µs, device µs) of a plain step
    held_step: dict[str, float] = {}  # mode -> host µs of a plain step issued behind the sleep kernel
    n = 0
    for mode in ("fused", "split"):
        net, batches = build_with_batches(model, seed=0, spec=spec)
        net = net.to(dev)
        n = len(list(net.children()))
        smap = None if mode == "fused" else [("BWD", i) for i in range(n)]
        tr = TwoStreamTrainer(net, smap, one_stream=True)
        timer = _PhaseTimer(cuda)  # device times, behind a sleep kernel
        ends = _PhaseTimer(cuda)
        host_timer = _PhaseTimer(False)  # host times, free running as in training
        got_host: dict[tuple[str, int], list[float]] = {}
        got_dev: dict[tuple[str, int], list[float]] = {}
        plain_host: list[float] = []
        plain_dev: list[float] = []
        held_host: list[float] = []  # for the record: the host time of a plain step behind the sleep
        data = [tuple(t.to(dev) for t in batches(s)) for s in range(4)]
        for rep in range(warmup + reps):
            for held, probed in itertools.product((True, False) if cuda else (False,), (True, False)):
                _sync(dev)
                if held:  # hold the device back: the host never waits for it during these steps
                    torch.cuda._sleep(400_000_000)
                probe = timer if held else host_timer
                probe.reset()
                ends.reset()
                tr.timer = probe if probed else None
                # back to back, as in training: a step issued right after a wait ran up to 1.7x slower
                # on the host (the mlp on an H100 machine), so the first one is not kept
                for k in range(BURST):
                    x, y = data[(rep * BURST + k) % len(data)]
                    probe.step = k
                    with (ends if held else host_timer)("step", k):
                        tr.step(x, y)
                _sync(dev)
                if rep < warmup:
                    continue
                if probed:
                    for phase, i, host, ev, k in probe.rows:
                        if k > 0 and (phase, i) != ("step", k):
                            at = got_dev if held else got_host
                            at.setdefault((phase, i), []).append(1e6 * (probe.device_s(ev) if held else host))
                else:
                    step_rows = ends.rows if held else host_timer.rows
                    for _, k, host, ev, _ in step_rows:
                        if k > 0:
                            (plain_dev if held else plain_host).append(1e6 * (ends.device_s(ev) if held else host))
                            if held:
                                held_host.append(1e6 * host)
        if not cuda:  # one pass: the CPU's device time is its host time
            got_dev, plain_dev = got_host, plain_host
        got = {key: list(zip(got_host[key], got_dev[key], strict=False)) for key in got_host}
        plain = list(zip(plain_host, plain_dev, strict=False))
        tr.timer = None
        samples[mode] = got
        whole[mode] = (statistics.median(h for h, _ in plain), statistics.median(d for _, d in plain))
        if held_host:
            held_step[mode] = statistics.median(held_host)
        if progress is not None:
            progress(f"{model} batch {batch_size}: {mode} mode profiled")
    names = [nm for nm, _ in build_with_batches(model, seed=0, spec=spec)[0].named_children()]

    def med(mode: str, phase: str, i: int, which: int) -> float:
        vals = samples[mode].get((phase, i))
        return float(statistics.median(v[which] for v in vals)) if vals else 0.0

    rows: list[dict[str, Any]] = [
        {"name": names[i], "pack_us": 0.0, "unpack_us": 0.0, "param_bytes": 0, "out_bytes": 0} for i in range(n)
    ]
    entry: dict[str, Any] = {"layers": rows}
    for mode, keys in PHASE_FIELDS.items():
        loss = (med(mode, "loss", -1, 0), med(mode, "loss", -1, 1))
        host_sum = loss[0] + sum(med(mode, ph, i, 0) for _, ph in keys for i in range(n))
        dev_sum = loss[1] + sum(med(mode, ph, i, 1) for _, ph in keys for i in range(n))
        host_step, dev_step = whole[mode]
        scale = dev_step / dev_sum if cuda and dev_sum > 0 else 1.0
        for key, ph in keys:
            for i in range(n):
                rows[i]["host_" + key] = round(med(mode, ph, i, 0), 2)
                rows[i][key] = round(med(mode, ph, i, 1) * scale, 2)
        suffix = "" if mode == "fused" else "_split"
        entry["host_other" + suffix + "_us"] = round(max(0.0, host_step - host_sum), 2)
        entry["device_scale" + suffix] = round(scale, 4)
        entry["host_step" + suffix + "_us"] = round(host_step, 2)
        if mode in held_step:
            entry["host_step_held" + suffix + "_us"] = round(held_step[mode], 2)
        if mode == "fused":
            entry["loss_us"], entry["host_loss_us"] = round(loss[1] * scale, 2), round(loss[0], 2)
    if cuda:
        # the split mode above ran on one stream (per-phase device times need it); on two streams the
        # runner also records and waits on events and marks tensors for the side stream, per layer
        two = two_stream_host_us(model, spec, dev, reps=reps, warmup=warmup)
        entry["host_step_two_streams_us"] = round(two, 2)
        entry["host_two_streams_extra_us"] = round(max(0.0, two - whole["split"][0]), 2)
        entry["stream_corun_factor"] = round(corun_factor(model, spec, dev, reps=max(3, reps // 3)), 4)
        if progress is not None:
            progress(f"{model} batch {batch_size}: co-run factor {entry['stream_corun_factor']}")
    where = torch.cuda.get_device_name(dev) if cuda else f"{platform.machine()} CPU"
    return LayerProfile(model, torch.get_num_threads(), reps, where, {batch_size: entry})


def two_stream_host_us(model: str, spec: Any, device: Any, *, reps: int = 20, warmup: int = 5) -> float:
    """Host time (µs) of one step of the two-stream runner (every W right after its B), the median of
    free-running steps as ``profile_streams`` reads the other modes' (bursts of ``BURST``, the first of
    each not kept). On a GPU the side stream costs host work of its own that the one-stream split
    profile does not see: events recorded and waited on per layer, ``record_stream`` on each captured
    tensor, the stream switch (on an H100, 2026-11-26: the two-stream order was measured 13-22 % above
    a prediction without it on the host-bound cases, docs/ooo.md)."""
    import torch

    from trainsim.models.zoo import build_with_batches

    net, batches = build_with_batches(model, seed=0, spec=spec)
    net = net.to(device)
    n = len(list(net.children()))
    tr = TwoStreamTrainer(net, [("BWD", i) for i in range(n)])
    data = [tuple(t.to(device) for t in batches(s)) for s in range(4)]
    host: list[float] = []
    for rep in range(warmup + reps):
        _sync(device)
        starts = []
        for k in range(BURST):
            x, y = data[(rep * BURST + k) % len(data)]
            starts.append(time.perf_counter())
            tr.step(x, y)
        starts.append(time.perf_counter())
        _sync(device)
        if rep >= warmup:
            host += [1e6 * (b - a) for a, b in itertools.pairwise(starts)][1:]
    del tr, net
    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.empty_cache()
    return float(statistics.median(host))


def corun_factor(model: str, spec: Any, device: Any, *, reps: int = 5, steps: int = 2) -> float:
    """How much slower kernels run while another stream's run: two copies of the model each train
    ``steps`` one-stream steps, on two streams at once, against one copy alone (device time, both
    behind one sleep kernel so that the host has issued everything before the device starts). Each
    copy runs ``f`` times slower while the other runs, so ``f`` = together / alone, between 1 (the
    kernels leave enough of the GPU idle to overlap fully) and 2 (they share it, nothing gained)."""
    import torch

    from trainsim.models.zoo import build_with_batches

    first = torch.cuda.current_stream(device)
    copies = []
    for stream in (first, torch.cuda.Stream(device)):
        with torch.cuda.stream(stream):
            net, batches = build_with_batches(model, seed=0, spec=spec)
            tr = TwoStreamTrainer(net.to(device), None)
            data = [tuple(t.to(device) for t in batches(k)) for k in range(steps)]
        copies.append((stream, tr, data))
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
    times: dict[bool, list[float]] = {False: [], True: []}
    for rep in range(reps + 1):
        for together in (False, True):
            torch.cuda.synchronize(device)
            torch.cuda._sleep(400_000_000)
            ev[0].record(first)
            for stream, tr, data in copies if together else copies[:1]:
                stream.wait_event(ev[0])
                with torch.cuda.stream(stream):
                    for x, y in data:
                        tr.step(x, y)
            ev[1].record(copies[1][0])
            first.wait_event(ev[1])
            ev[2].record(first)
            torch.cuda.synchronize(device)
            if rep > 0:
                times[together].append(ev[0].elapsed_time(ev[2]))
    ratio = statistics.median(times[True]) / statistics.median(times[False])
    return min(2.0, max(1.0, ratio))


def measure_step_ms(
    model: str,
    batch_size: int,
    schedule_map: ScheduleMap | None,
    *,
    device: str = "cuda",
    steps: int = 50,
    warmup: int = 10,
    zoo: dict[str, Any] | None = None,
    native: bool = False,
) -> float:
    """Mean step time (ms) of ``steps`` back-to-back steps, synchronised only at both ends.

    ``native=True`` times the plain PyTorch loop instead (``loss.backward()``, one SGD optimizer).
    """
    import torch
    from torch import nn

    from trainsim.models.zoo import ZooSpec, build_with_batches

    dev = torch.device(device)
    net, batches = build_with_batches(model, seed=0, spec=ZooSpec(batch_size=batch_size, **(zoo or {})))
    net = net.to(dev)
    data = [tuple(t.to(dev) for t in batches(s)) for s in range(4)]
    if native:
        opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()

        def one(x: torch.Tensor, y: torch.Tensor) -> None:
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    else:
        tr = TwoStreamTrainer(net, schedule_map)

        def one(x: torch.Tensor, y: torch.Tensor) -> None:
            tr.step(x, y)

    for s in range(warmup):
        one(*data[s % len(data)])
    _sync(dev)
    t0 = time.perf_counter()
    for s in range(steps):
        one(*data[s % len(data)])
    _sync(dev)
    return 1e3 * (time.perf_counter() - t0) / steps
