"""The per-layer split profile: every layer timed, JSON round trip, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from trainsim.capture.layerprofile import FIELDS, LayerProfile, profile_layers
from trainsim.errors import UserError


def test_profile_round_trip(tmp_path: Path) -> None:
    prof = profile_layers("transformer", batch_sizes=(4, 2), reps=2, warmup=1, zoo={"blocks": 1})
    assert prof.layer_names == ["embed", "block0", "pool", "head"]
    for bs in (4, 2):
        rows = prof.table(bs)
        assert all(r[f] >= 0 for r in rows for f in FIELDS)
        assert rows[1]["bwd_weight_us"] > 0 and rows[1]["param_bytes"] > 0
        assert rows[2]["param_bytes"] == 0
    assert prof.table(4)[1]["out_bytes"] == 2 * prof.table(2)[1]["out_bytes"]
    back = LayerProfile.load(prof.save(tmp_path / "p.json"))
    assert back.to_json() == prof.to_json()


def test_errors(tmp_path: Path) -> None:
    prof = LayerProfile("m", 1, 1, "x", {8: {"loss_us": 1.0, "layers": []}})
    with pytest.raises(UserError, match="no batch size 4; it has \\[8\\]"):
        prof.table(4)
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "m"}')
    with pytest.raises(UserError, match="not a trainsim layer profile"):
        LayerProfile.load(bad)
    with pytest.raises(UserError, match="no such layer profile"):
        LayerProfile.load(tmp_path / "missing.json")
    bad.write_text("not json")  # a JSONDecodeError traceback before 2026-11-26
    with pytest.raises(UserError, match=r"bad\.json: cannot read a layer profile"):
        LayerProfile.load(bad)
    row = {f: 1.0 for f in FIELDS} | {"name": "fc", "param_bytes": 4, "out_bytes": 4}
    for field, value in (("fwd_us", -5.0), ("bwd_us", float("nan")), ("out_bytes", "7"), ("opt_us", True)):
        data = {"model": "m", "threads": 1, "reps": 1, "machine": "x",
                "by_batch": {"8": {"loss_us": 1.0, "layers": [row | {field: value}]}}}  # fmt: skip
        with pytest.raises(UserError, match=rf"src: by_batch\[8\]\.layers\[0\]\.{field} = .*expected a finite"):
            LayerProfile.from_json(data, "src")
    empty = {"model": "m", "threads": 1, "reps": 1, "machine": "x", "by_batch": {}}
    with pytest.raises(UserError, match="by_batch is empty"):
        LayerProfile.from_json(empty, "src")


def test_a_scaled_profile_scales_every_time_and_no_size() -> None:
    row = {"name": "fc0", **{f: 10.0 for f in FIELDS}, "param_bytes": 400, "out_bytes": 64}
    prof = LayerProfile("mlp", 1, 5, "here", {8: {"loss_us": 4.0, "layers": [row]}})
    s = prof.scaled(1.5)
    assert s.loss_us(8) == 6.0 and all(s.table(8)[0][f] == 15.0 for f in FIELDS)
    assert s.table(8)[0]["param_bytes"] == 400 and s.table(8)[0]["out_bytes"] == 64
    assert prof.table(8)[0]["fwd_us"] == 10.0  # the original is untouched
    with pytest.raises(UserError, match="scale factor 0"):
        prof.scaled(0)


def test_split_steps_time_the_weight_gradients_after_the_whole_chain_input_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainsim.models.splitgrad import LayerTape

    calls: list[tuple[str, int]] = []
    b_in, b_w = LayerTape.backward_input, LayerTape.backward_weight

    def spy_b(self: LayerTape, grad: object) -> object:
        calls.append(("B", id(self.layer)))
        return b_in(self, grad)  # type: ignore[arg-type]

    def spy_w(self: LayerTape) -> None:
        calls.append(("W", id(self.layer)))
        b_w(self)

    monkeypatch.setattr(LayerTape, "backward_input", spy_b)
    monkeypatch.setattr(LayerTape, "backward_weight", spy_w)
    profile_layers("mlp", batch_sizes=(4,), reps=1, warmup=0, zoo={"depth": 3})
    # one split step (the fused one calls neither): every B, last layer first, then every W, first layer first
    n = len(calls) // 2
    assert [k for k, _ in calls] == ["B"] * n + ["W"] * n
    assert [layer for _, layer in calls[n:]] == [layer for _, layer in calls[:n]][::-1]


def test_between_runs_before_each_timed_step_of_each_batch_size() -> None:
    import torch

    seen: list[tuple[int, int]] = []
    profile_layers("mlp", batch_sizes=(4, 2), reps=3, warmup=2, zoo={"depth": 2},
                   between=lambda bs: seen.append((bs, torch.get_num_threads())))  # fmt: skip
    # 2 * reps timed steps per batch size (the warm-up ones untouched), on the profile's one thread
    assert seen == [(4, 1)] * 6 + [(2, 1)] * 6
