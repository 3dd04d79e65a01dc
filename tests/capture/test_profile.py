"""End to end: profile a tiny built-in model on the CPU, then replay and what-if its trace."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainsim.capture.profile import ProfileConfig, profile, sidecar_path
from trainsim.errors import UserError
from trainsim.graph.build import load_trace
from trainsim.simulate.engine import simulate
from trainsim.transform import whatifs
from trainsim.transform.primitives import select


def test_profile_then_replay(tmp_path: Path) -> None:
    out = profile(ProfileConfig(model="mlp", steps=3, warmup=1, batch_size=8, out=str(tmp_path / "mlp.json.gz")))
    side = json.loads(sidecar_path(out).read_text())
    assert side["layers"] == ["fc0", "fc1", "fc2", "head"]
    assert sum(p["numel"] for p in side["params"]) == 2_372_618
    assert [p["name"] for p in side["params"]][:2] == ["fc0.0.weight", "fc0.0.bias"]
    g = load_trace(out)
    assert g.steps.ids.size == 3
    res = simulate(g)
    measured = g.steps.measured_us / 1e3
    err = np.abs(res.step_ms - measured) / measured
    assert err.max() < 0.05 and np.median(err) < 0.02
    # layer attribution reaches forward ops and, through sequence numbers, backward ops
    assert select(g, layer="^layer:fc1$", name="addmm").any()
    assert select(g, layer="^layer:fc1$", name="Backward").any()
    # the fused-optimizer what-if finds the optimizer's per-parameter ops and drops the Python loop's time
    fused = whatifs.fused_optimizer(g)
    assert fused.n_tasks < g.n_tasks
    assert simulate(fused).mean_step_ms < res.mean_step_ms


def test_profile_config_rejects_bad_values() -> None:
    with pytest.raises(UserError):
        ProfileConfig(steps=0)
    with pytest.raises(UserError, match="json"):
        ProfileConfig(out="trace.txt")
    with pytest.raises(UserError, match="optimizer"):
        ProfileConfig(optimizer="lion")


def test_unknown_model(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown model"):
        profile(ProfileConfig(model="resnet9000", out=str(tmp_path / "x.json")))


def test_a_user_model_from_the_current_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--model module:function`` finds a module in the current folder, as ``python -m`` would (the
    console script's path lacks it), and says what is wrong with a bad one."""
    (tmp_path / "my_models.py").write_text(
        "import torch\n"
        "def small():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 4)), (torch.randn(16, 8), torch.randint(0, 4, (16,)))\n"
        "def not_a_model():\n"
        "    return 'x', (1, 2)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path))])
    out = profile(ProfileConfig(model="my_models:small", steps=2, warmup=1, out=str(tmp_path / "t.json")))
    assert load_trace(str(out)).n_tasks > 0
    for spec, message in (("my_models:not_a_model", "expected a torch.nn.Module"), (":small", "expected 'package"),
                          ("my_models:missing", "has no attribute 'missing'")):  # fmt: skip
        with pytest.raises(UserError, match=message):
            profile(ProfileConfig(model=spec, out=str(tmp_path / "u.json")))
