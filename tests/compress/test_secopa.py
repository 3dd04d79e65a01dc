"""SeCoPa decisions against hand-computed cases, and the plan file."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsim.compress.secopa import (
    Constants,
    Linear,
    Plan,
    calibrate_codec,
    costs,
    link_model,
    plan_gradients,
)
from trainsim.errors import UserError

# enc/dec: 1 ms flat; comm: 1e-3 ms per byte (1 MB/s), no latency; aggregation free
K = Constants(
    enc=Linear(0.0, 1.0, 1.0), dec=Linear(0.0, 1.0, 1.0),
    gather=Linear(1e-3, 0.0, 0.0), bcast=Linear(1e-3, 0.0, 0.0), send=Linear(1e-3, 0.0, 0.0),
    aggr=Linear(0.0, 0.0, 0.0),
)  # fmt: skip


def test_cost_primitive_has_a_floor() -> None:
    f = Linear(2.0, 1.0, 5.0)
    assert f(1) == 5.0 and f(10) == 21.0


def test_ps_costs_by_hand() -> None:
    # N=2, m=1000, r=1/16, K=2: orig = 2 * 1e-3 * 4000/2 = 4; comp = 2 * 1e-3 * 250/2 + 2*1 + 2*1 = 4.25
    orig, comp = costs(1000, 2, 2, 1 / 16, K, "ps")
    assert orig == pytest.approx(4.0) and comp == pytest.approx(4.25)
    # K=1: comp = 0.5 + min(2, 2) + min(2, 2) = 4.5
    assert costs(1000, 1, 2, 1 / 16, K, "ps")[1] == pytest.approx(4.5)


def test_ring_costs_by_hand() -> None:
    # N=4, m=1000, r=1/16, K=1: orig = 2*3 * 4 = 24; comp = 6 * 0.25 + 4 + 4 = 9.5
    orig, comp = costs(1000, 1, 4, 1 / 16, K, "ring")
    assert orig == pytest.approx(24.0) and comp == pytest.approx(9.5)


def test_decisions() -> None:
    plan = plan_gradients([("small", 1000), ("big", 10_000)], "tbq", 1 / 16, K, topology="ps", world_size=2)
    assert plan.decision("small") == (False, 1)  # 4.0 < 4.25: not worth it
    assert plan.decision("big") == (True, 2)  # orig 40 > comp 0.5*5/2*... = 6.5 at K=2
    assert plan.gradients["big"].comp_ms == pytest.approx(2 * 1e-3 * 2500 / 2 + 4)
    assert plan.decision("absent") is None


def test_tie_means_no_compression() -> None:
    free = Constants(enc=Linear(0, 0, 0), dec=Linear(0, 0, 0), gather=Linear(0, 1, 1), bcast=Linear(0, 1, 1),
                     send=Linear(0, 1, 1), aggr=Linear(0, 0, 0))  # fmt: skip
    plan = plan_gradients([("w", 10**6)], "onebit", 1 / 32, free, topology="ring", world_size=4)
    assert plan.decision("w") == (False, 1)


def test_plan_file_round_trip_and_edit(tmp_path: Path) -> None:
    plan = plan_gradients(
        [("a.weight", 10_000), ("a.bias", 10)], "tbq", 1 / 16, K, topology="ps", world_size=2
    )
    path = tmp_path / "plan.yaml"
    plan.save(path)
    text = path.read_text()
    assert text.startswith("# trainsim SeCoPa plan")
    edited = text.replace("compress: false", "compress: true")
    path.write_text(edited)
    back = Plan.load(path)
    assert back.decision("a.bias") == (True, 1)
    assert back.decision("a.weight") == plan.decision("a.weight")
    assert back.algorithm == "tbq" and back.world_size == 2


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[1, 2]", "expected a mapping"),
        ("algorithm: tbq\ntopology: ps\nworld_size: 2\n", "missing field 'gradients'"),
        ("algorithm: tbq\ntopology: star\nworld_size: 2\ngradients: []\n", "topology='star'"),
        ("algorithm: tbq\ntopology: ps\nworld_size: 2\ngradients: [{name: w, compress: maybe}]\n", "compress='maybe'"),
        ("algorithm: tbq\ntopology: ps\nworld_size: 2\ngradients: [{name: w, compress: true, partitions: 3}]\n",
         "partitions=3; expected 1..2"),
        ("algorithm: [unclosed\n", "not valid YAML"),
        # found 2026-11-26: taken at load, and a traceback or a wrong plan later
        ("algorithm: zip\ntopology: ps\nworld_size: 2\ngradients: []\n", "unknown compression algorithm 'zip'"),
        ("algorithm: topk\noptions: {ratio: 5}\ntopology: ps\nworld_size: 2\ngradients: []\n", "ratio=5"),
        ("algorithm: tbq\ntopology: ps\nworld_size: 2\ngradients: [{name: w, compress: true},"
         " {name: w, compress: false}]\n", "'w' is planned twice"),
        ("algorithm: tbq\ntopology: ps\nworld_size: 2\ngradients: [{name: w, compress: true, numel: -4}]\n",
         "numel=-4; expected an integer >= 0"),
        ("algorithm: tbq\ntopology: ps\nworld_size: 2\ngradients: [{name: w, compress: true, orig_ms: x}]\n",
         "orig_ms / comp_ms must be numbers"),
    ],
)  # fmt: skip
def test_malformed_plans(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=match):
        Plan.load(path)


def test_plan_naming_missing_gradients() -> None:
    plan = plan_gradients([("ghost.weight", 10_000)], "tbq", 1 / 16, K, topology="ps", world_size=2)
    with pytest.raises(UserError, match=r"ghost\.weight"):
        plan.check_names(["fc.weight", "fc.bias"])


def test_missing_plan_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="cannot read"):
        Plan.load(tmp_path / "nope.yaml")


def test_calibrate_codec_fits_positive_slopes() -> None:
    cal = calibrate_codec("onebit", sizes=[1 << 12, 1 << 14, 1 << 16], repeats=2)
    assert cal["enc"].a_ms >= 0 and cal["dec"].a_ms >= 0 and cal["acc"].a_ms >= 0
    assert len(cal["samples"]["acc_ms"]) == 3 and min(cal["samples"]["acc_ms"]) > 0
    assert cal["ratio"] == pytest.approx(1 / 32, rel=0.01)


def test_link_model() -> None:
    m = link_model(100.0, 0.5, 4)  # 100 Mbit/s: 8e-5 ms per byte
    assert m["send"](1e6) == pytest.approx(80.5)
    assert m["gather"](1e6) == pytest.approx(3 * 80 + 0.5)
    with pytest.raises(UserError):
        link_model(0, 0, 2)
