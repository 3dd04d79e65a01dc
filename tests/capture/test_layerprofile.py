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


def test_a_scaled_profile_scales_every_time_and_no_size() -> None:
    row = {"name": "fc0", **{f: 10.0 for f in FIELDS}, "param_bytes": 400, "out_bytes": 64}
    prof = LayerProfile("mlp", 1, 5, "here", {8: {"loss_us": 4.0, "layers": [row]}})
    s = prof.scaled(1.5)
    assert s.loss_us(8) == 6.0 and all(s.table(8)[0][f] == 15.0 for f in FIELDS)
    assert s.table(8)[0]["param_bytes"] == 400 and s.table(8)[0]["out_bytes"] == 64
    assert prof.table(8)[0]["fwd_us"] == 10.0  # the original is untouched
    with pytest.raises(UserError, match="scale factor 0"):
        prof.scaled(0)
