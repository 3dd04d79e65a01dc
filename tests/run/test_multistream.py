"""The two-stream runner (``trainsim.run.multistream``) on the CPU: same training as plain backprop.

On a CPU the runner issues the same phases in the same order without streams, so what is checked
here is the split computation itself: W from explicit formulas (Linear, Conv2d, BatchNorm2d,
LayerNorm, Embedding) after an input-only autograd pass, updates deferred per the schedule map.

Tolerance: the explicit weight gradients run the same kind of kernels as autograd's (a matrix
product for Linear, ``convolution_backward`` for Conv2d) but BatchNorm's and LayerNorm's are
recomputed from the saved input, so the sums are ordered differently; over 20 SGD steps the losses
(about 2.3) may differ by float32 rounding compounded: we allow 1e-5 absolute and see at most 5e-7.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from trainsim.errors import UserError  # noqa: E402
from trainsim.models.zoo import ZooSpec, build_with_batches  # noqa: E402
from trainsim.run.multistream import TwoStreamTrainer, profile_streams, weight_grads  # noqa: E402
from trainsim.transform.ooo import predict_multistream, search_schedule_map  # noqa: E402


def _native(net: nn.Module, batches: Any, steps: int) -> list[float]:
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    out = []
    for s in range(steps):
        x, y = batches(s)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        out.append(float(loss.detach()))
    return out


def _runner(net: nn.Module, batches: Any, steps: int, smap: Sequence[tuple[str, int]] | None) -> list[float]:
    tr = TwoStreamTrainer(net, smap)
    out = [float(tr.step(*batches(s))) for s in range(steps)]
    tr.flush()
    return out


def _maps(n: int) -> list[list[tuple[str, int]] | None]:
    bwd = [("BWD", i) for i in range(n)]
    late = [("BWD", 0)] * n  # every W after the whole B chain
    deferred = [("FWD", 0)] + [("FWD", i - 1) if i % 2 else ("BWD", i) for i in range(1, n)]
    return [None, bwd, late, deferred]


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_runner_trains_like_plain_backprop(name: str) -> None:
    spec = ZooSpec(batch_size=8, width=64)
    ref = _native(*build_with_batches(name, seed=0, spec=spec), 20)
    for smap in _maps(len(list(build_with_batches(name, spec=spec)[0].children()))):
        net, batches = build_with_batches(name, seed=0, spec=spec)
        got = _runner(net, batches, 20, smap)
        assert got == pytest.approx(ref, abs=1e-5), smap


def test_deferred_updates_are_applied_by_flush() -> None:
    spec = ZooSpec(batch_size=8, width=32)
    ref, batches = build_with_batches("mlp", seed=0, spec=spec)
    _native(ref, batches, 3)
    net, batches = build_with_batches("mlp", seed=0, spec=spec)
    _runner(net, batches, 3, [("FWD", 0), ("FWD", 1), ("BWD", 2), ("FWD", 3)])
    for a, b in zip(ref.parameters(), net.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize(
    "mod, x",
    [
        (nn.Linear(6, 4), torch.randn(3, 5, 6)),
        (nn.Conv2d(3, 4, 3, stride=2, padding=1, groups=1), torch.randn(2, 3, 9, 9)),
        (nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=2, bias=False), torch.randn(2, 4, 7, 7)),
        (nn.BatchNorm2d(3), torch.randn(4, 3, 5, 5)),
        (nn.LayerNorm(6), torch.randn(3, 5, 6)),
        (nn.Embedding(10, 4, padding_idx=1), torch.tensor([[1, 2, 2], [0, 9, 1]])),
    ],
)
def test_weight_grads_equal_autograd(mod: nn.Module, x: torch.Tensor) -> None:
    out = mod(x)
    g = torch.randn_like(out)
    out.backward(g)
    got = weight_grads(mod, x, g)
    for pname, p in mod.named_parameters():
        assert p.grad is not None
        assert torch.allclose(got[pname], p.grad, atol=1e-5, rtol=1e-4), pname


def test_unsupported_layer_and_bad_maps_are_refused() -> None:
    net, _ = build_with_batches("transformer", spec=ZooSpec(batch_size=2, blocks=1))
    with pytest.raises(UserError, match="MultiheadAttention has no explicit weight gradient"):
        TwoStreamTrainer(net, [("BWD", i) for i in range(4)])
    mlp, _ = build_with_batches("mlp", spec=ZooSpec(batch_size=2, width=8))
    with pytest.raises(UserError, match="schedule map has 2 entries; the model has 4 layers"):
        TwoStreamTrainer(mlp, [("BWD", 0), ("BWD", 1)])
    with pytest.raises(UserError, match=r"entry 1: \('FWD', 2\) defers W of layer 1 past its own forward"):
        TwoStreamTrainer(mlp, [("BWD", 0), ("FWD", 2), ("BWD", 2), ("BWD", 3)])


def test_profile_feeds_the_host_and_device_model() -> None:
    prof = profile_streams("mlp", 8, device="cpu", reps=3, warmup=1, zoo={"width": 32})
    row = prof.table(8)[1]
    for key in ("fwd_us", "bwd_us", "opt_us", "fwd_split_us", "bwd_input_us", "bwd_weight_us", "opt_split_us"):
        assert row[key] > 0 and row["host_" + key] == row[key]
    one = predict_multistream(prof, 8, None)
    # on a CPU the host issues and runs every phase itself: the step is the sum of the phases
    host = sum(r["host_fwd_us"] + r["host_bwd_us"] + r["host_opt_us"] for r in prof.table(8))
    entry = prof.by_batch[8]
    assert one == pytest.approx((host + entry["host_loss_us"] + entry["host_other_us"]) / 1e3, rel=1e-6)
    smap, best = search_schedule_map(prof, 8)
    assert len(smap) == 4 and best > 0


def _fake(dev: float, host: float, weight: float | None = None) -> Any:
    from trainsim.capture.layerprofile import LayerProfile

    keys = ("fwd_us", "bwd_us", "opt_us", "fwd_split_us", "bwd_input_us", "bwd_weight_us", "opt_split_us")
    rows = []
    for i in range(3):
        r: dict[str, Any] = {"name": f"l{i}", "pack_us": 0.0, "unpack_us": 0.0, "param_bytes": 0, "out_bytes": 0}
        for k in keys:
            r[k] = dev
            r["host_" + k] = host
        if weight is not None:  # the fused backward is B + W
            r["bwd_weight_us"] = r["opt_split_us"] = r["opt_us"] = weight
            r["bwd_us"] = dev + weight
        rows.append(r)
    entry = {"loss_us": dev, "host_loss_us": host, "host_other_us": 0.0, "layers": rows}
    return LayerProfile("fake", 1, 1, "test", {4: entry})


def test_host_bound_and_device_bound_steps() -> None:
    # host-bound (issuing takes 10x the device work): the step is the host's issue time, both orders
    prof = _fake(dev=10.0, host=100.0)
    phases_one = 3 * 3 + 1  # F, BW, update per layer, and the loss
    phases_two = 3 * 4 + 1  # F, B, W, update per layer, and the loss
    assert predict_multistream(prof, 4, None) == pytest.approx(phases_one * 100.0 / 1e3)
    assert predict_multistream(prof, 4, [("BWD", i) for i in range(3)]) == pytest.approx(phases_two * 100.0 / 1e3)
    # device-bound: W and updates leave the main stream's critical path
    prof = _fake(dev=100.0, host=1.0, weight=40.0)
    one = predict_multistream(prof, 4, None)
    assert one == pytest.approx((3 * (100 + 140 + 40) + 100) / 1e3, rel=0.02)
    # W right after its B: only layer 0's W and update stay on the critical path (F0 waits for them)
    two = predict_multistream(prof, 4, [("BWD", i) for i in range(3)])
    assert two == pytest.approx((7 * 100 + 80) / 1e3, rel=0.02)
    _, best = search_schedule_map(prof, 4)
    assert best <= two
    # kernels that share the GPU (co-run factor 2: each runs at half speed beside the other stream's)
    # gain almost nothing from the second stream: the step is about all the device work, 940 µs
    prof.by_batch[4]["stream_corun_factor"] = 2.0
    shared = predict_multistream(prof, 4, [("BWD", i) for i in range(3)])
    assert two < shared <= 0.94 * 1.01
    assert predict_multistream(prof, 4, None) == pytest.approx(one)  # one stream: nothing co-runs


def test_the_second_stream_s_host_work_is_added_to_two_stream_steps_only() -> None:
    """``host_two_streams_extra_us`` (the runner's events and stream bookkeeping, ``profile_streams`` on a
    GPU) lengthens a host-bound two-stream step by that much per step; one stream is untouched."""
    prof = _fake(dev=10.0, host=100.0)
    smap = [("BWD", i) for i in range(3)]
    one, two = predict_multistream(prof, 4, None), predict_multistream(prof, 4, smap)
    prof.by_batch[4]["host_two_streams_extra_us"] = 250.0
    assert predict_multistream(prof, 4, None) == pytest.approx(one)
    assert predict_multistream(prof, 4, smap) == pytest.approx(two + 0.25)


def test_two_stream_host_time_runs_on_the_cpu() -> None:
    """The runner's two-stream host timing is the median of free-running steps (on a CPU: no streams,
    the split order's plain host time)."""
    from trainsim.models.zoo import ZooSpec
    from trainsim.run.multistream import two_stream_host_us

    us = two_stream_host_us("mlp", ZooSpec(batch_size=8, width=32), torch.device("cpu"), reps=3, warmup=1)
    assert 0.0 < us < 1e6


def test_predictions_from_the_recorded_h100_profiles() -> None:
    """The H100 profiles that ``benchmarks/ooo_multistream_gpu.py`` recorded (docs/benchmarks/
    multistream_h100.json) still give the predictions recorded beside them: the simulator's side of
    the GPU comparison, checked on a machine without a GPU."""
    import json
    from pathlib import Path

    from trainsim.capture.layerprofile import LayerProfile

    data = json.loads((Path(__file__).parents[2] / "docs" / "benchmarks" / "multistream_h100.json").read_text())
    assert len(data["cases"]) == 6
    for i, case in enumerate(data["cases"]):
        prof = LayerProfile.from_json(case["profile"])
        assert "H100" in prof.machine
        runs = data["runs"][3 * i : 3 * i + 3]
        for r in runs:
            m = r["config"]["map"]
            got = predict_multistream(prof, case["batch"], [tuple(e) for e in m] if m is not None else None)
            assert got == pytest.approx(r["predicted_ms"], abs=2e-3), r["config"]
